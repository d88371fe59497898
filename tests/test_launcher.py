"""`launcher: accelerate`: 2 CPU processes give what 1 process gives; the phases run and log through `accelerate launch`;
the shipped accelerate configs and the GPU check script are what they say.

The launched runs use `configs/accelerate/cpu_2proc.yaml` (torchrun, gloo). Each start of a launched
process costs seconds (Python, torch, TRL imports), so every test here starts as few as it can.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from pipeline.config import ConfigError, LauncherConfig
from pipeline.launch import LaunchError, check_launchable, launch_command, run_logged
from pipeline.loading import config_from_dict
from tests.helpers import CPU_2PROC, ROOT, child_env, mini_config, plugin_distribution

# --- config ------------------------------------------------------------------------------------------


def test_launcher_defaults_to_in_process():
    cfg = config_from_dict({}, check_trl=False)
    assert cfg.launcher.kind == "local" and cfg.launcher.config_file is None


def test_missing_accelerate_config_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"launcher\.config_file: 'nope/zero9\.yaml' does not exist"):
        config_from_dict({"launcher": {"kind": "accelerate", "config_file": "nope/zero9.yaml"}}, check_trl=False)


def test_a_yaml_that_is_not_an_accelerate_config_is_refused(tmp_path):
    path = tmp_path / "acc.yaml"
    path.write_text("run:\n  name: x\n")
    with pytest.raises(ConfigError, match=r"launcher\.config_file: .* is not an accelerate config"):
        config_from_dict({"launcher": {"kind": "accelerate", "config_file": str(path)}}, check_trl=False)


def test_a_launchers_field_under_the_other_kind_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"launcher\.config_file set, but launcher\.kind is 'ray', which does not read"):
        config_from_dict({"launcher": {"kind": "ray", "config_file": CPU_2PROC}}, check_trl=False)
    with pytest.raises(ConfigError, match=r"launcher\.ray_address set, but launcher\.kind is 'accelerate'"):
        config_from_dict({"launcher": {"kind": "accelerate", "ray_address": "auto"}}, check_trl=False)
    cfg = config_from_dict({"launcher": {"kind": "ray", "ray_address": "auto", "num_processes": 2}}, check_trl=False)
    assert (cfg.launcher.ray_address, cfg.launcher.num_processes) == ("auto", 2)


def test_relative_config_file_resolves_from_the_repo_when_not_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # configs/ is not here: the path is found beside the package
    cfg = config_from_dict({"launcher": {"kind": "accelerate", "config_file": CPU_2PROC, "num_processes": 3,
                                         "extra_args": ["--main_process_port", "0"]}}, check_trl=False)
    cmd = launch_command(cfg.launcher, ["-m", "pipeline.rounds", "WORK"])
    assert cmd[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    assert cmd[3:] == ["--config_file", str(ROOT / CPU_2PROC), "--num_processes", "3", "--main_process_port", "0",
                       "-m", "pipeline.rounds", "WORK"]
    logged = launch_command(cfg.launcher, ["t.py"], log_dir=Path("WORK/torchrun"))
    assert logged[3:] == [*cmd[3:7], "--log_dir", "WORK/torchrun", "--main_process_port", "0", "t.py"]
    own = cfg.launcher.model_copy(update={"extra_args": ["--log_dir=/srv/logs"]})  # the user's own folder wins
    assert launch_command(own, ["t.py"], log_dir=Path("WORK/torchrun"))[-2:] == ["--log_dir=/srv/logs", "t.py"]


@pytest.mark.parametrize("name", ["cpu_2proc", "multi_gpu", "zero2", "zero3"])
def test_shipped_accelerate_configs_are_what_they_say(name):
    from accelerate.commands.config.config_args import load_config_from_file

    path = ROOT / "configs" / "accelerate" / f"{name}.yaml"
    raw = yaml.safe_load(path.read_text())
    assert path.read_text().startswith("#")  # each file says how to run it
    loaded = load_config_from_file(str(path))  # accelerate's own reader accepts it
    expected = {"cpu_2proc": "MULTI_GPU", "multi_gpu": "MULTI_GPU", "zero2": "DEEPSPEED", "zero3": "DEEPSPEED"}[name]
    assert loaded.distributed_type == expected
    assert raw["main_process_port"] == 0  # a free port: runs on one machine never collide
    if name.startswith("zero"):
        assert raw["deepspeed_config"]["zero_stage"] == int(name[-1])
    if name == "zero3":
        assert raw["deepspeed_config"]["zero3_save_16bit_model"] is True  # checkpoints hold whole weights
    if name == "cpu_2proc":
        assert raw["use_cpu"] is True and raw["num_processes"] == 2


def test_deepspeed_config_without_deepspeed_is_one_clear_error():
    pytest.importorskip("accelerate")
    if __import__("importlib").util.find_spec("deepspeed") is not None:
        pytest.skip("deepspeed is installed here")
    with pytest.raises(LaunchError, match=r"launcher\.config_file: .*zero2\.yaml uses DeepSpeed.*pip install deepspeed"):
        check_launchable(LauncherConfig(kind="accelerate", config_file="configs/accelerate/zero2.yaml"))


@pytest.mark.slow  # a subprocess
def test_a_failing_launch_raises_with_the_tail_of_its_output(tmp_path):
    script = tmp_path / "fails.py"
    # One rank fails: two failing ranks interleave their output lines in the shared log.
    script.write_text("import os\nif os.environ['RANK'] == '0':\n    raise ValueError('broken on rank 0')\n")
    launcher = LauncherConfig(kind="accelerate", config_file=CPU_2PROC)
    with pytest.raises(LaunchError) as info:
        run_logged(launch_command(launcher, [str(script)], log_dir=tmp_path / "torchrun"), tmp_path / "launch.log",
                   child_env(), "the test phase")
    message = str(info.value)
    assert "the test phase failed under accelerate launch (exit code 1)" in message
    assert "ValueError: broken on rank 0" in message and str(tmp_path / "launch.log") in message


# --- the GPU check script -------------------------------------------------------------------------------


@pytest.mark.slow  # a subprocess
def test_gpu_check_script_parses_and_stops_on_a_machine_without_cuda(tmp_path):
    script = ROOT / "bench" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)  # the whole script parses
    # Run as a user would on a machine without a GPU (and without --cpu): its first step refuses, naming the
    # dry run, before it installs or measures anything, and the log still lands in $OUT.
    (temp := tmp_path / "temp").mkdir()
    env = child_env(CUDA_VISIBLE_DEVICES="", PYTHON=sys.executable, OUT=str(tmp_path), TMPDIR=str(temp))
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no CUDA device visible to torch: run with --cpu for a dry run" in done.stdout
    assert "== install" not in done.stdout
    assert (tmp_path / "gpu_check.log").read_text().startswith("== machine\n")
    assert list(temp.iterdir()) == []  # before, its own log stayed in the temp dir


# --- the key check: 2 processes == 1 process -----------------------------------------------------------


@pytest.mark.slow  # > 10 s: a subprocess, a real model, or a network timeout
@pytest.mark.parametrize("launcher", ["accelerate", "ray"])
def test_two_processes_give_the_same_advantages_loss_and_gradient_as_one(launched_steps, launcher, request):
    """One process-supervised GRPO step on the same 12 completions: 1 process x 12 rows, 2 processes x 6 rows;
    then one hybrid-mode step in the same processes (a fresh trainer from the same saved policy).

    Sampling is replaced by a fixed completion table (see tests/launcher_step.py; conftest.py's `launched_steps` runs
    both): sampled completions follow each process's random stream and cannot match. With 3 groups of 4 over 2 x 6
    rows the middle group straddles the processes, so a missing gather (normalising a group's steps per process:
    refused, a process then holds half a group) or a wrong slice (a process keeping another's rows: 18 of 18 checked
    values off by up to 1.46 when tried) changes the advantages, hence the loss and the gradient. Hybrid mode
    also adds TRL's outcome advantages, which each process holds for its own rows only; its outcome reward is a
    plugin's, installed only on the path that the launched processes are given.

    Under `launcher.kind: ray` (2 Ray Train workers, one on each node of a two-node cluster, started by
    `launch_phase`) the hybrid step alone: its advantages hold both gathered terms, and a worker that did not load
    the plugin fails the job (a job's start costs more than the step: one step, not two).
    """
    ones = launched_steps[1]
    if launcher == "accelerate":
        modes, twos = ["process", "hybrid"], launched_steps[2]
        assert set(ones) == set(modes) and set(twos) == {*modes, "rm"}  # they also took test_rm_scaling's step
    else:
        modes, twos = ["hybrid"], request.getfixturevalue("ray_launched_steps")
        assert set(twos) == set(modes)
    for mode in modes:
        _assert_same_step(ones[mode], twos[mode], mode)


def _assert_same_step(a: dict, b: dict, mode: str) -> None:
    """The 1-process step `a` and the 2-process step `b` agree (test above)."""
    assert (a["processes"], b["processes"]) == (1, 2)
    # The same global batch in the same order: RepeatSampler's seeded order, rows split by rank.
    assert a["prompts"] == b["prompts"] and len(a["prompts"]) == 12 and len(set(a["prompts"])) == 3
    assert a["completions"] == b["completions"]
    # Advantages: identical (same fp32 operations on the same gathered step scores), row by row, token by token.
    assert [len(r) for r in a["advantages"]] == [len(r) for r in b["advantages"]]
    for ra, rb in zip(a["advantages"], b["advantages"]):
        assert rb == pytest.approx(ra, abs=1e-6), mode
    assert any(abs(v) > 0.1 for r in a["advantages"] for v in r)  # not a trivial all-zero case
    if mode == "hybrid":  # both terms carry signal, and the PRM's share of the variance is the same
        assert 0.01 < a["share"] < 0.99 and b["share"] == pytest.approx(a["share"], abs=1e-6)
    # Loss: TRL's DAPO loss normalises by the global token count / processes; the logged loss is the mean
    # over processes, so it equals the 1-process loss. Measured: advantages equal exactly, loss 1.2e-7 apart
    # (2 float32 ulps at 0.66), gradient entries within 1.5e-8 (largest 0.16).
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-7), mode
    assert a["loss"] != 0
    # Gradient after DDP's all-reduce (mean over processes): the same up to float summation order.
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5), mode
    ga, gb = torch.tensor(a["grad_sample"]), torch.tensor(b["grad_sample"])
    torch.testing.assert_close(gb, ga, rtol=1e-4, atol=1e-6, msg=lambda m: f"{mode}: {m}")


# --- the phases through the pipeline ---------------------------------------------------------------------


def _run_with_round0(tmp_path, mini_models, **sections):
    """A run directory whose round 0 is recorded done with a built policy and PRM (no SFT, no collection)."""
    from pipeline.rounds import open_run

    cfg = config_from_dict(mini_config(tmp_path, launcher={"kind": "accelerate", "config_file": CPU_2PROC},
                                       **sections))
    policy, prm = mini_models / "policy", mini_models / "prm"
    manifest = open_run(cfg)
    manifest.record(0, "policy", {"path": str(policy), "metrics": {}})
    manifest.record(0, "reward_model", {"paths": {"prm": str(prm)}, "metrics": {}})
    return cfg, policy, prm


@pytest.mark.slow  # > 10 s: a subprocess, a real model, or a network timeout
def test_grpo_phase_under_accelerate_writes_the_policy_and_logs_into_the_phase_run(tmp_path, mlflow_tmp, monkeypatch,
                                                                                     mini_models):
    import mlflow

    from pipeline.rounds import run_phase
    from pipeline.rundir import Manifest

    monkeypatch.setenv("PYTHONPATH", child_env()["PYTHONPATH"])
    (temp := tmp_path / "temp").mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # the launched processes' temp dir, empty afterwards
    # 2 processes x 4 rows: one group of 4 per process, 2 steps.
    cfg, start, prm = _run_with_round0(tmp_path, mini_models, grpo={"per_device_train_batch_size": 4, "max_steps": 2},
                                       reward_model={"kinds": ["prm"]}, tracking={"tracking_uri": mlflow_tmp})
    out = run_phase(cfg, 1, "policy", policy=str(start), reward_models={"prm": str(prm)})

    policy = Path(out.path)
    assert (policy / "config.json").exists() and (policy / "igrpo.json").exists()
    assert not any(p.name.startswith(".policy.") for p in policy.parent.iterdir())  # one writer, no leftovers
    weights = lambda p: torch.cat([t.flatten() for t in __import__("safetensors.torch").torch.load_file(  # noqa: E731
        str(p / "model.safetensors")).values()])
    assert not torch.equal(weights(policy), weights(start))  # it trained
    assert out.metrics["policy/steps"] == 2.0

    manifest = Manifest.load(cfg.run_dir)
    assert manifest.done(1, "policy")
    run = mlflow.MlflowClient().get_run(manifest.mlflow_run("round-001/policy"))
    # Trainer's and TRL's own metrics, logged by the launched main process into the phase run ...
    assert {"loss", "reward", "process/step_reward_mean", "completions/mean_length"} <= set(run.data.metrics)
    history = mlflow.MlflowClient().get_metric_history(run.info.run_id, "loss")
    assert sorted(m.step for m in history) == [1, 2]  # once per step, from one process only
    # ... and the phase's summary, logged by the pipeline's process afterwards.
    assert "policy/reward_end" in run.data.metrics
    assert run.data.params.get("per_device_train_batch_size") == "4"
    # Before, torchrun left a `torchelastic_*` folder in the temp dir at every launch.
    assert [p.name for p in temp.iterdir()] == []


# An installed plugin (tests/helpers.py: plugin_distribution): its entry point's module registers the RM kind
# `tiny_orm`, the ORM's parts under a name of its own; its implementation is imported on first use.
TINY_ORM = {
    "tiny_orm_plugin/__init__.py": """from pipeline.rm_kinds import RM_KINDS

RM_KINDS.register("tiny_orm", head="AutoModelForSequenceClassification", scores_steps=False, mc_labels=False,
                  implementation="tiny_orm_plugin.kind:TINY_ORM", description="the ORM, from a plugin")
""",
    "tiny_orm_plugin/kind.py": """import dataclasses

from pipeline.rm_kinds.orm import ORM, orm_metrics


def metrics(scorer, rows):
    return {k.replace("orm/", "tiny_orm/", 1): v for k, v in orm_metrics(scorer, rows).items()}


TINY_ORM = dataclasses.replace(ORM, metrics=metrics, solution_auc="tiny_orm/auc")
""",
}


@pytest.mark.slow
def test_reward_model_phase_under_accelerate_logs_each_trainer_into_its_run(tmp_path, mlflow_tmp, monkeypatch,
                                                                          mini_models, registries):
    """Round 1's RM phase under 2 processes, training the PRM and a plugin's RM kind: the plugin is installed only on
    the processes' path (no edit of the package), and its kind is known to the config's validation here and to each
    `accelerate launch` rank, which load the plugins where they start. (Under `launcher.kind: ray` a plugin reaches
    the workers of a job started by `launch_phase` too: the [ray] case of the 2-process GRPO test above.)"""
    import mlflow

    from pipeline.replay import write_shard
    from pipeline.rounds import run_phase
    from pipeline.rundir import Manifest, RunDir, read_json

    site = plugin_distribution(tmp_path / "site", "tiny-orm-plugin", TINY_ORM, "tiny_orm = tiny_orm_plugin")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([child_env()["PYTHONPATH"], str(site)]))
    cfg, policy, prm = _run_with_round0(tmp_path, mini_models, reward_model={"kinds": ["prm", "tiny_orm"],
                                                                             "holdout_fraction": 0.25},
                                        tracking={"tracking_uri": mlflow_tmp, "register_models": False})
    rows = [
        {"round": 1, "policy": str(policy), "prompt_id": f"p{i // 2}", "prompt": f"{i}+1=?\n", "sample_index": i % 2,
         "completion": f"{i}+1={i + 1 + i % 2}\nThe answer is {i + 1 + i % 2}\n", "answer": str(i + 1 + i % 2),
         "steps": [f"{i}+1={i + 1 + i % 2}", f"The answer is {i + 1 + i % 2}"], "outcome": 1 - i % 2,
         "he_labels": [1 - i % 2] * 2, "se_labels": [1.0 - i % 2] * 2, "gold_labels": None, "rollouts": 4,
         "num_tokens": 20}
        for i in range(16)
    ]
    write_shard(rows, RunDir(cfg.run_dir).shard(1))
    manifest = Manifest.load(cfg.run_dir)
    manifest.record(1, "policy", {"path": str(policy), "metrics": {}})
    out = run_phase(cfg, 1, "reward_model", policy=str(policy), previous={"prm": str(prm)})

    assert set(out.paths) == {"prm", "tiny_orm"}
    assert all((Path(p) / "config.json").exists() for p in out.paths.values())
    assert read_json(Path(out.paths["tiny_orm"]) / "igrpo.json")["kind"] == "tiny_orm"  # trained as its kind
    assert "prm/solution_auc" in out.metrics and "tiny_orm/auc" in out.metrics
    # The main process wrote each RM's calibration, the figures it reported (the others evaluate alike).
    from pipeline.reward_model import read_calibration

    assert {k: read_calibration(p)["gap"] for k, p in out.paths.items()} == {
        k: out.metrics[f"{k}/mean_score"] - 0.5 for k in ("prm", "tiny_orm")}  # held out: 2 prompts, 1 right of 2
    manifest = Manifest.load(cfg.run_dir)
    for kind in ("prm", "tiny_orm"):
        run = mlflow.MlflowClient().get_run(manifest.mlflow_run(f"round-001/reward_model/{kind}"))
        assert "train_loss" in run.data.metrics, kind  # Trainer's metrics in the trainer's own run


@pytest.mark.slow
def test_a_launcher_registered_from_a_test_file_runs_the_phase(tmp_path, mlflow_tmp, mini_models, registries):
    """`launcher.kind` is a table (pipeline/launchers.py): a launcher registered here alone, which starts the phase's
    one process as a call in this one (what a scheduler's launcher would hand to its job), is accepted by the config
    and runs round 1's GRPO through `pipeline.rounds.launched`, its request and result files included."""
    from pipeline.launchers import LAUNCHERS, Launcher
    from pipeline.rounds import run_phase

    started = []

    def inline(cfg, phase, work_dir, env, entry):
        started.append((phase, Path(work_dir).name, set(env)))
        entry([str(work_dir)])
        return "this process"

    LAUNCHERS.register("inline", description="the phase's one process, as a call", summary=lambda launcher: "inline",
                       ignores=("config_file", "extra_args", "ray_address"), start=lambda: inline)
    cfg = config_from_dict(mini_config(tmp_path, launcher={"kind": "inline"}, grpo={"max_steps": 1},
                                       reward_model={"kinds": ["prm"]}, tracking={"tracking_uri": mlflow_tmp}))
    from pipeline.rounds import open_run

    manifest = open_run(cfg)
    manifest.record(0, "policy", {"path": str(mini_models / "policy"), "metrics": {}})
    out = run_phase(cfg, 1, "policy", policy=str(mini_models / "policy"),
                    reward_models={"prm": str(mini_models / "prm")})
    assert started == [("policy", ".launch-policy", {"MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID"})]
    assert (Path(out.path) / "config.json").exists() and out.metrics["policy/steps"] == 1.0
    with pytest.raises(ConfigError, match=r"launcher\.kind: unknown launcher 'inlined'; known: .*inline"):
        config_from_dict(mini_config(tmp_path, launcher={"kind": "inlined"}))
