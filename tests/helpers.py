"""What the tests share, in one module (test modules never import each other): the model sizes and the mini run
config, the environment of every subprocess, builders of shard rows and of designed GRPO steps, and the drivers of
whole runs: `igrpo` in-process (a user error's exit code and message) or in a subprocess (as a user runs it, or
stopped by a signal at a chosen point), and the check of a complete run."""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import yaml
from mlflow import MlflowClient

from flows.cli import main
from pipeline.phases import PHASES
from pipeline.replay import read_shard
from pipeline.rundir import RunDir, phase_key, read_json
from pipeline.tracking import PARENT_TAG, metric_name

ROOT = Path(__file__).resolve().parent.parent
# The modules holding the project's extension tables (pipeline.registry.Registry): conftest.py's `registries`
# restores every one of them, tests/test_registry.py checks each is here and has its case.
TABLE_MODULES = ("collect_choices", "credit", "launchers", "modes", "phases", "problems", "problems.dataset", "rewards",
                 "rm_kinds", "sampling_backends", "step_rewards")


def import_tables() -> None:
    """Import every module of `TABLE_MODULES`, so that `registry.tables()` holds every table the project has."""
    import importlib

    for name in TABLE_MODULES:
        importlib.import_module(f"pipeline.{name}")
MINI = yaml.safe_load((ROOT / "configs" / "mini.yaml").read_text())  # the mini run, read by bench/ too
NAME = MINI["run"]["name"]  # "mini"
CPU_2PROC = "configs/accelerate/cpu_2proc.yaml"  # 2 CPU processes under `accelerate launch` (torchrun, gloo)

# Every model size of the suite, in one place: a test's cost is mostly its model's size.
SIZES = {
    # Untrained, for shapes, scores, checkpoints, sampling and one-step trainings: the smallest with every part.
    "tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64, "max_position_embeddings": 96},
    # mini_config's policy, which a 2-round run bootstraps by SFT; also the 2-process step of test_launcher.py.
    "mini": dict(MINI["policy"]["tiny"]),
    # The trained policy whose accuracy test_training.py asserts. Measured after its SFT (3000 chains, 5 epochs):
    # 0.53 greedy on 40 held-out problems; the quickstart's size (128 wide, 4 deep) 0.15 after 4 epochs in 2.5x the
    # time, 128 x 2 0.45.
    "trained": {"hidden_size": 96, "num_layers": 2, "num_heads": 4, "intermediate_size": 288,
                "max_position_embeddings": 96},
}


def mini_config(tmp_path, **sections) -> dict:
    """configs/mini.yaml (a full 2-round flow in about half a minute on 2 cores), its runs and MLflow store in
    `tmp_path`, each of `sections` updating its section."""
    cfg = copy.deepcopy(MINI)
    cfg["run"]["runs_dir"] = str(tmp_path / "runs")
    cfg["tracking"]["tracking_uri"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    return cfg


def plugin_distribution(root: Path, name: str, files: dict[str, str], entry_point: str) -> Path:
    """An installed distribution `name` in `root` as pip would leave it: its code (`files`, path -> text) and a
    `NAME-0.1.dist-info` declaring `entry_point` ("NAME = module[:function]") in the group `iterative_grpo.plugins`.
    Put `root` on a process's path (sys.path, PYTHONPATH) and the distribution is installed there."""
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    info = root / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[iterative_grpo.plugins]\n{entry_point}\n")
    return root


# --- subprocesses ------------------------------------------------------------------------------------------

# The suite's own settings (conftest.py) that a user who has configured nothing does not have.
SUITE_PREFIXES = ("PREFECT_", "MLFLOW_", "TQDM_", "HF_DATASETS_")


def child_env(user_home: Path | None = None, **changes: str | None) -> dict[str, str]:
    """The environment of every subprocess the tests start: this one's, with this checkout first on PYTHONPATH
    (the child imports `pipeline`, `flows` and `models` from here, not from an installed copy).

    user_home: a user who has configured nothing: the suite's Prefect, MLflow, tqdm and datasets settings left
        out, and a fresh Prefect home in `user_home/prefect-home`.
    changes: variables set (a value) or removed (None).
    """
    env = dict(os.environ)
    if user_home is not None:
        env = {k: v for k, v in env.items() if not k.startswith(SUITE_PREFIXES)}
        env["PREFECT_HOME"] = str(Path(user_home) / "prefect-home")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def igrpo(cwd: Path, *args: str, code: str | None = None, timeout: float = 600,
          env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m flows.cli ARGS` (or `code`, which ends by calling `main()`) in `cwd` as a user who has configured
    nothing runs it (`child_env(user_home=cwd)`, plus `env`), stdout and stderr together, in a session of its own."""
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "flows.cli", *args]
    return subprocess.run(cmd, env={**child_env(user_home=cwd), **(env or {})}, cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout, start_new_session=True)


@contextlib.contextmanager
def ray_temp():
    """A temp dir for all of a test cluster's Ray state, removed afterwards, with `RAY_TMPDIR` naming it in this
    process (the user's own setting is back afterwards). Every cluster a test starts in-process needs it: the head
    writes the cluster's address file under `RAY_TMPDIR` (default `$TMPDIR/ray`), not under its `temp_dir`, and that
    folder exists on a fresh machine only if an earlier test happened to make it; another cluster on the machine
    would share it. The dir is short: Ray's socket paths are limited to ~100 characters."""
    import shutil
    import tempfile

    import pytest

    temp = tempfile.mkdtemp(prefix="igrpo-ray-", dir="/tmp")
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("RAY_TMPDIR", temp)
            yield temp
    finally:
        shutil.rmtree(temp, ignore_errors=True)


# --- builders ------------------------------------------------------------------------------------------------


def make_row(round_: int = 0, index: int = 0, **overrides) -> dict:
    """A shard row (the replay schema's every column), correct and fully labelled; `overrides` replace columns."""
    row = {
        "round": round_,
        "policy": f"runs/demo/round-{round_:03d}/policy",
        "prompt_id": f"p{index // 4}",
        "prompt": "What is 13 x 17?",
        "sample_index": index,
        "completion": "13 x 17 = 13 x 10 + 13 x 7\n= 130 + 91\nAnswer: 221",
        "answer": "221",
        "steps": ["13 x 17 = 13 x 10 + 13 x 7", "= 130 + 91", "Answer: 221"],
        "outcome": 1,
        "he_labels": [1, 1, 1],
        "se_labels": [0.75, 1.0, 1.0],
        "gold_labels": [1, 1, 1],
        "rollouts": 12,
        "num_tokens": 48,
    }
    row.update(overrides)
    return row


# --- one real GRPO step on designed completions -------------------------------------------------------------


def run_grpo(tok, policy_dir, out_dir, rows, supervision: str, scorer=None, scale: str | None = None, **kwargs):
    """One real GRPO step of `ProcessGRPOTrainer` on the designed completions `rows` (TRL's rollout hook).

    Returns what the loss saw (in `rows`' order: TRL shuffles the batch), the trainer's logs, and the
    completions TRL decoded for the reward function, which gives 1 to a completion containing "72".
    """
    from datasets import Dataset
    from trl import GRPOConfig

    from pipeline.grpo_trainer import ProcessGRPOTrainer
    from tests.tokenizer_cases import PROMPT, PROMPT_B

    def rollout(prompts, trainer):
        assert prompts == [PROMPT] * 4 + [PROMPT_B] * 4, prompts
        return {"prompt_ids": [tok(p).input_ids for p in prompts], "completion_ids": rows, "logprobs": None}

    decoded, seen = [], []

    def reward(completions, **kwargs):  # records the texts TRL decoded for the reward functions
        decoded.extend(completions)
        return [float("72" in c) for c in completions]

    extra = {} if scale is None else {"scale_rewards": scale}
    args = GRPOConfig(output_dir=str(out_dir), per_device_train_batch_size=8, num_generations=4, max_steps=1,
                      max_completion_length=128, learning_rate=1e-6, logging_steps=1, report_to="none",
                      use_cpu=True, bf16=False, save_strategy="no", shuffle_dataset=False,
                      mask_truncated_completions=True, **extra)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    trainer = ProcessGRPOTrainer(
        model=str(policy_dir), reward_funcs=[reward], args=args,
        train_dataset=Dataset.from_list([{"prompt": PROMPT}, {"prompt": PROMPT_B}]),
        processing_class=tok, prm_scorer=scorer, supervision=supervision, rollout_func=rollout, **kwargs,
    )
    original = trainer._compute_loss

    def spy(model, inputs):
        seen.append({k: inputs[k].detach().clone() for k in ("advantages", "completion_ids", "completion_mask")})
        return original(model, inputs)

    trainer._compute_loss = spy
    trainer.train()
    (inputs,) = seen
    order = rollout_order(inputs["completion_ids"], rows, tok.pad_token_id)
    return {"advantages": inputs["advantages"][order], "mask": inputs["completion_mask"][order],
            "logs": trainer.state.log_history, "decoded": decoded, "table": list(trainer._logs["advantages"])}


def rollout_order(ids, rows: list[list[int]], pad: int) -> list[int]:
    """For each rollout row, the batch row holding it (its ids, then only padding)."""
    order = []
    for row in rows:
        hits = [i for i in range(ids.shape[0]) if ids[i, : len(row)].tolist() == row
                and bool((ids[i, len(row) :] == pad).all()) and i not in order]
        order.append(hits[0])
    return order


# --- igrpo run in-process: user errors --------------------------------------------------------------------


def run_cli(tmp_path, capsys, data, *sets: str) -> tuple[int, str]:
    """`igrpo run` in-process on `data` (a dict dumped as YAML, or raw text); (exit code, stderr)."""
    path = tmp_path / "run.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    capsys.readouterr()
    rc = main(["run", str(path), *[a for s in sets for a in ("--set", s)]])
    return rc, capsys.readouterr().err


def assert_user_error(tmp_path, rc: int, err: str, *expected: str) -> None:
    """rc 2, one `igrpo: error:` message containing every `expected` string, and no run directory."""
    assert rc == 2, err
    assert err.startswith("igrpo: error: "), err
    assert "Traceback" not in err
    for text in expected:
        assert text in err, f"{text!r} not in {err!r}"
    assert not (tmp_path / "runs" / NAME).exists()


# --- igrpo run in a subprocess, stopped by a signal ------------------------------------------------------

# Run by the subprocess: `igrpo run CONFIG`. STEPS (unless empty): a file touched as each trainer step begins
# (transformers' on_step_begin, whatever the trainer). HOLD (optional): module, attribute (a function or a class's
# method), needle: the first call whose arguments name a path containing the needle touches MARKER and blocks for
# good (the run is killed there).
STOPPABLE_RUN = """
import importlib, os, sys, time
config, marker, steps, *hold = sys.argv[1:]
if steps:
    from transformers.trainer_callback import CallbackHandler
    begin = CallbackHandler.on_step_begin
    def on_step_begin(self, *args, **kwargs):
        open(steps, "w").close()
        return begin(self, *args, **kwargs)
    CallbackHandler.on_step_begin = on_step_begin
if hold:
    module, attribute, needle = hold
    owner = importlib.import_module(module)
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    real = getattr(owner, name)
    def held(*args, **kwargs):
        if any(needle in str(a) for a in (*args, *kwargs.values()) if isinstance(a, (str, os.PathLike))):
            open(marker, "w").close()
            time.sleep(600)  # killed here
        return real(*args, **kwargs)
    setattr(owner, name, held)
from flows.cli import main
sys.exit(main(["run", config]))
"""


class Stopped(NamedTuple):
    reached: bool  # the stop point was reached (False: the run ended or stalled before it)
    returncode: int | None  # -signal.SIGKILL when killed there; 128 + the signal when it stopped on its own
    log: str  # the tail of the run's stdout and stderr, for failure messages
    seconds: float | None = None  # from the signal to the process's exit


def stop_run(tmp_path, data: dict, *, hold: tuple[str, str, str] | None = None,
             ready: Callable[[], bool] | None = None, in_steps: bool = False, timeout: float = 400,
             signum: int = signal.SIGKILL, group: bool = False, prefect_api: str | None = None) -> Stopped:
    """`igrpo run` on the config `data` in a subprocess, SIGKILLed (or sent `signum`) at a chosen point.

    hold: (module, attribute, needle): the first call of `module.attribute` whose arguments name a path
        containing `needle` blocks for good, and the run is killed there: deterministic, unlike a kill
        after a guessed delay.
    ready: otherwise, a predicate polled every 0.05 s; the run is signalled as soon as it holds, or with
        `in_steps`, as soon as a trainer step begins after it holds (inside the training loop, where Python
        runs the trainers' and torch's code).
    signum, group: the signal, sent to the process or (as a terminal's Ctrl-C) to its whole process group;
        a run that has not exited 60 s after it is SIGKILLed.
    prefect_api: the URL of a running Prefect server for the run (as a user's PREFECT_API_URL); None: the run
        starts its own ephemeral server, as a first `igrpo run` does (10-20 s on a loaded 2-core machine).
    The subprocess has a session of its own; whatever it leaves (its Prefect server) is killed with its group.
    """
    path = tmp_path / "mini.yaml"
    path.write_text(yaml.safe_dump(data))
    marker, steps = tmp_path / "held", tmp_path / "step-began"
    marker.unlink(missing_ok=True)
    if hold is not None:
        ready = marker.exists
    # Prefect's default 20 s to start the run's own server is too short on a loaded machine (seen: the run
    # failed at connect, before any phase); 120 s as for the session's harness in conftest.py.
    env = child_env(PREFECT_HOME=str(tmp_path / "prefect-sub"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
                    PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120", PREFECT_API_URL=prefect_api)
    log = tmp_path / f"stopped-run-{time.monotonic_ns()}.log"  # each stop's whole log kept, for a failure's reading
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", STOPPABLE_RUN, str(path), str(marker),
                                 str(steps) if in_steps else "", *(hold or ())],
                                env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + timeout
    reached, armed, seconds = False, False, None
    try:
        while time.time() < deadline and proc.poll() is None:
            if in_steps and not armed and ready():
                steps.unlink(missing_ok=True)  # a step that began before the point does not count
                armed = True
            if (armed and steps.exists()) or (not in_steps and ready()):
                reached = True
                sent = time.monotonic()
                os.killpg(proc.pid, signum) if group else proc.send_signal(signum)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=60)
                seconds = time.monotonic() - sent
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what the dead run left behind
    return Stopped(reached, proc.returncode, log.read_text(errors="replace")[-3000:], seconds)


# --- a complete mini run ----------------------------------------------------------------------------------


def mlflow_structure(experiment: str, run_name: str | None = None) -> dict:
    """Parent, round and phase runs of an experiment, by name; of the parents named `run_name` alone if given
    (runs side by side in one experiment)."""
    exp = MlflowClient().get_experiment_by_name(experiment)
    runs = MlflowClient().search_runs([exp.experiment_id], max_results=1000)
    by_id = {r.info.run_id: r for r in runs}
    parents = [r for r in runs if PARENT_TAG not in r.data.tags and run_name in (None, r.info.run_name)]
    children = lambda pid: sorted(r.info.run_name for r in runs if r.data.tags.get(PARENT_TAG) == pid)
    rounds = {r.info.run_name: r.info.run_id for r in runs if r.data.tags.get(PARENT_TAG) in {p.info.run_id for p in parents}}
    return {"parents": parents, "rounds": rounds, "phases": {name: children(rid) for name, rid in rounds.items()},
            "all": by_id}


def assert_complete_run(cfg, experiment: str, maj_k: int = 4, run_name: str | None = None) -> None:
    """Every phase of every round done, one shard of M x G samples per round, one MLflow run per round and phase,
    and Maj@`maj_k` on the parent run once per round; `run_name`: of the parent of that name alone."""
    run_dir, rounds = cfg.run_dir, cfg.run.rounds
    manifest = read_json(run_dir / "manifest.json")
    assert set(manifest["phases"]) == {phase_key(r, p) for r in range(rounds + 1) for p in PHASES}
    # Each shard holds exactly M prompts x G samples of its own round.
    for r in range(rounds + 1):
        rows = read_shard(RunDir(run_dir).shard(r))
        assert len(rows) == cfg.collect.prompts_per_round * cfg.collect.samples_per_prompt
        assert {x["round"] for x in rows} == {r}
        assert len({(x["prompt_id"], x["sample_index"]) for x in rows}) == len(rows)
    s = mlflow_structure(experiment, run_name)
    assert len(s["parents"]) == 1
    assert sorted(s["rounds"]) == [f"round-{r:03d}" for r in range(rounds + 1)]
    for name, phases in s["phases"].items():
        assert phases == sorted(f"{name}-{p}" for p in PHASES)
    parent = s["parents"][0].info.run_id
    history = MlflowClient().get_metric_history(parent, metric_name(f"eval/maj@{maj_k}"))
    assert sorted(h.step for h in history) == list(range(rounds + 1))
