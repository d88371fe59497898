"""DeepSeekMath's comparisons on the embedded problem set: the arms, and the units that run them.

What an arm changes in configs/experiments.yaml (`ARMS`, `arm_overrides`), the smoke run's budgets, and
`Experiments`: the runs directory, a status file of finished units with their wall times, and each finished unit's
figures kept in `docs/experiments/<unit>.json`. The command that runs them is `python -m experiments`
(experiments/__main__.py); the report is experiments/report.py.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import yaml

from bench._common import MINI, ROOT
from pipeline.loading import load_config
from pipeline.rundir import Manifest, read_json, round_dir, round_of, write_json_atomic

os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

# The same code and seed on another CPU trains to other figures (docs/lab/results-history.md section 8): torch and MKL pick
# their kernels by the CPU's instruction set, and a sum in another order ends elsewhere. Every x86-64 machine
# here has AVX2, so the units run on its kernels, at 2 threads, and a seed's arms run on two machines compute
# alike (seen: sft-s0's train loss 0.2598 on an AVX-512 machine pinned to AVX2, as on an AVX2 one; 0.2672 there
# unpinned). Read once, when torch loads: so the command starts itself again with them set. --native: the CPU's own.
# `--threads N` pins another thread count (two units side by side at 1 thread each on 2 cores): every unit of one
# comparison must run at the same count, which the unit file's `machine` records.
PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "2"}


def pinned_env(argv: list[str] | None = None) -> dict[str, str]:
    """PINNED, with the thread count of a `--threads N` (or `--threads=N`) in `argv`.

    >>> pinned_env(["study", "--threads", "1"])["OMP_NUM_THREADS"], pinned_env([])["OMP_NUM_THREADS"]
    ('1', '2')
    """
    argv = argv or []
    threads = next((a.split("=", 1)[1] if "=" in a else argv[i + 1] for i, a in enumerate(argv)
                    if a.split("=")[0] == "--threads" and ("=" in a or i + 1 < len(argv))), PINNED["OMP_NUM_THREADS"])
    if not threads.isdigit() or int(threads) < 1:
        sys.exit(f"--threads: expected a positive integer, got {threads!r}")
    return {**PINNED, "OMP_NUM_THREADS": threads}


def pinned() -> bool:
    """Whether this process runs on the pinned kernels (at a pinned thread count)."""
    return "OMP_NUM_THREADS" in os.environ and all(os.environ.get(k) == v for k, v in PINNED.items()
                                                   if k != "OMP_NUM_THREADS")


def restart_pinned(module: str, argv: list[str]) -> None:
    """Start `python -m <module> <argv>` again on the pinned kernels and threads, unless they are set (or --native)."""
    env = pinned_env(argv)
    if "--native" not in argv and any(os.environ.get(k) != v for k, v in env.items()):
        os.execve(sys.executable, [sys.executable, "-m", module, *argv], {**os.environ, **env})


EXPERIMENT = "iterative-grpo-experiments"
# Hybrid supervision (verifier outcome advantage + w * PRM process advantage): a grid of credit and weight run
# on the first seed only; the best of it (section 6) is then run on the other seeds with `--only <arm>`. Add
# weights here to widen it. w = 1 gave the PRM term ~75% of the variance (2026-12-01, soft targets), so min at
# w = 0.5 (~40% expected, still above the 20%) tries a larger verifier share. A third entry sets
# `supervision.process_baseline` (default group: the group's steps pooled); per position, only the PRM's ranking
# of a step among the group's steps at its index is left, the position prior of first-error labels cancelled.
HYBRID_GRID = (("sum", 1.0), ("min", 1.0), ("min", 0.5), ("sum", 0.5, "position"))
HYBRID_ARMS = tuple(f"hybrid-{g[0]}-w{g[1]:g}" + "".join(f"-{b}" for b in g[2:]) for g in HYBRID_GRID)
ARMS = ("prm", "orm", "verifier", "rft", "frozen", "noreplay", "exploit", *HYBRID_ARMS, "oracle")
LABELS = {"prm": "GRPO + PRM (process)", "orm": "GRPO + ORM (outcome)", "verifier": "GRPO + verifier (outcome)",
          "rft": "Online RFT (verifier)", "frozen": "PRM frozen at round 0", "noreplay": "PRM retrained, no replay",
          "exploit": "PRM frozen, exploitable",
          **{arm: f"hybrid, {g[0]} credit, w = {g[1]:g}" + "".join(f", {b} baseline" for b in g[2:])
             for arm, g in zip(HYBRID_ARMS, HYBRID_GRID)},
          "oracle": "GRPO + oracle PRM (gold step labels)"}
# The exploit arm's planted flaw: the Answer line states the first step's result (`answer_slip`, the habit that
# `sft_noise` gives 30% of the SFT data, so the round-0 policy already has it). In process mode the tokens that
# choose the answer get the credit of the Answer step alone, and the round-0 PRM is sure of it (seed 0,
# quickstart budgets: 0.04 on a slipped Answer line, 0.95 on a right one). Measured on that round's shard, the
# normalised Answer-step reward of a slipped minus a right completion of one prompt (the push on the choice):
# -3.85 without the flaw, -2.11 with +0.5 clipped (slipping still loses), +0.31 with +1 clipped (a tie at best,
# 1 against 0.95), +1.46 with +2 unclipped, +1.82 with +3 (the group's std grows with the bonus). So +2, unclipped.
EXPLOIT = {"pattern": r"\A[^\n]*=[ \t]*(-?\d+)[ \t]*\n(?:[^\n]*\n)*?Answer:[ \t]*\1[ \t]*$", "bonus": 2.0,
           "clip": False}
MC_NS = (1, 2, 4, 8, 16)

# The smoke run: configs/mini.yaml's sizes and budgets at these keys (the whole run in a few minutes), 8 eval samples.
SMOKE_KEYS = ("policy.tiny", "problems.arithmetic.num_train", "problems.arithmetic.num_test",
              "problems.arithmetic.max_steps", "bootstrap.sft_args.num_train_epochs", "bootstrap.sft_args.learning_rate",
              "supervision.prompts_per_round", "grpo.max_steps", "grpo.num_generations",
              "grpo.per_device_train_batch_size", "grpo.max_completion_length", "collect", "reward_model.holdout_fraction",
              "reward_model.train_args.num_train_epochs", "reward_model.train_args.per_device_train_batch_size",
              "eval.num_problems", "eval.max_new_tokens", "eval.best_of_n")


def smoke_overrides() -> list[str]:
    """`--set` overrides of configs/mini.yaml's values at `SMOKE_KEYS` (a section: each of its keys)."""
    mini, out = yaml.safe_load(MINI.read_text()), []
    for key in SMOKE_KEYS:
        value = mini
        for part in key.split("."):
            value = value[part]
        items = value.items() if isinstance(value, dict) else [(None, value)]
        out += [f"{key}{'' if k is None else '.' + k}={json.dumps(v)}" for k, v in items]
    return out + ["eval.samples_per_problem=8"]


def arm_overrides(arm: str, smoke: bool) -> list[str]:
    """What an arm changes in the quickstart config."""
    n = 16 if smoke else 64  # the prm arm's eval samples: Maj@K / Pass@K and best-of-N for N = 1..n
    return {
        "prm": [f"eval.samples_per_problem={n}", f"eval.best_of_n={[1 << e for e in range(n.bit_length())]}"],
        "orm": ["supervision.mode=outcome", "supervision.rewards={orm: 1.0}"],
        "verifier": ["supervision.mode=outcome"],
        "rft": ["supervision.mode=rft"],
        "frozen": ["reward_model.retrain=false"],
        "noreplay": ["reward_model.replay_fraction=0"],
        **{arm: ["supervision.mode=hybrid", f"supervision.process_credit={g[0]}", f"supervision.process_weight={g[1]:g}",
                 *(f"supervision.process_baseline={b}" for b in g[2:])]
           for arm, g in zip(HYBRID_ARMS, HYBRID_GRID)},
        "oracle": ["reward_model.oracle=gold"],
        "exploit": ["reward_model.retrain=false", f"reward_model.exploit.pattern='{EXPLOIT['pattern']}'",
                    f"reward_model.exploit.bonus={EXPLOIT['bonus']}", f"reward_model.exploit.clip={EXPLOIT['clip']}"],
    }[arm]


class Experiments:
    """The runs directory, the shared settings, and a status file of finished units and their wall times."""

    def __init__(self, a: argparse.Namespace):
        self.a, self.runs_dir, self.figures = a, Path(a.runs_dir), Path(a.figures)
        self.status_path = self.runs_dir / "experiments.json"
        self.status = read_json(self.status_path) if self.status_path.exists() else {"units": {}}

    def recorded(self, name: str) -> dict | None:
        """A unit's kept figures (`record`), or None."""
        path = self.figures / f"{name}.json"
        return read_json(path) if path.exists() else None

    def record(self, name: str, figures: dict) -> None:
        """Keep a finished unit's figures beside the report, with its wall time and the commit it ran from."""
        commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip() or "unknown"
        write_json_atomic(self.figures / f"{name}.json", {
            "unit": name, "commit": commit, "date": time.strftime("%Y-%m-%d"), "machine": machine(),
            "seconds": self.status["units"][name]["seconds"], **figures})

    def kept(self) -> dict[str, dict]:
        """Every unit's kept figures, by name."""
        return {p.stem: read_json(p) for p in sorted(self.figures.glob("*.json"))}

    def units(self) -> dict[str, dict]:
        """Every unit's status and wall time: this runs directory's, and those kept in the figures."""
        return {**{n: {"status": "done", "seconds": k["seconds"]} for n, k in self.kept().items()},
                **self.status["units"]}

    def pending(self, name: str) -> bool:
        return self.recorded(name) is None and self.status["units"].get(name, {}).get("status") != "done"

    def base(self, seed: int) -> list[str]:
        return (smoke_overrides() if self.a.smoke else []) + [f"run.seed={seed}", f"run.runs_dir={self.runs_dir}",
                                                  f"tracking.experiment={self.a.experiment}"] + (
            [f"tracking.tracking_uri={self.a.tracking_uri}"] if self.a.tracking_uri else [])

    def config(self, seed: int, extra: list[str]):
        return load_config(ROOT / "configs" / "experiments.yaml", self.base(seed) + extra)

    def arm_config(self, arm: str, seed: int):
        return self.config(seed, [*self.from_sft(seed, f"{arm}-s{seed}", self.a.rounds),
                                  *arm_overrides(arm, self.a.smoke)])

    def from_sft(self, seed: int, name: str, rounds: int) -> list[str]:
        """The overrides of an arm's run `name` of `rounds` RL rounds from the seed's SFT policy (the unit
        `sft-s<seed>`): no SFT of its own, no checkpoint registered."""
        return [f"run.name={name}", f"run.rounds={rounds}", f"policy.model={self.sft_path(seed)}",
                "bootstrap.sft=false", "tracking.register_models=false", "tracking.register_policy=false"]

    def sft_path(self, seed: int) -> Path:
        return self.runs_dir / f"sft-s{seed}" / "policy"

    def unit(self, name: str, func, again: bool = False) -> None:
        """Run one unit unless done (or `again`); add up its wall time over invocations; on failure, report it and
        go on."""
        old = self.status["units"].get(name, {})
        if not (again or self.pending(name)):
            return
        print(f"[{time.strftime('%H:%M:%S')}] {name} ...", flush=True)
        start = time.perf_counter()
        try:
            figures = func()
            status = "done"
        except Exception:  # one broken arm must not cost the others: report it, carry on
            traceback.print_exc()
            status = "failed"
        seconds = time.perf_counter() - start
        self.status["units"][name] = {"status": status, "seconds": old.get("seconds", 0.0) + seconds}
        write_json_atomic(self.status_path, self.status)
        if status == "done":
            self.record(name, figures)
        print(f"[{time.strftime('%H:%M:%S')}] {name}: {status} in {seconds / 60:.1f} min", flush=True)

    # --- units: each returns its figures, what the report reads of it ----------------------------

    def run_arms(self, seeds: list[int], arms: list[str], after: Callable[[], object]) -> None:
        """Every pending unit of `arms` for each of `seeds` (`arm`), the seed's SFT unit first where one needs it;
        `after()` once each arm unit ends (a study rebuilds its report there)."""
        for seed in seeds:
            todo = [x for x in arms if self.pending(f"{x}-s{seed}")]
            if todo and not self.sft_path(seed).exists():
                self.unit(f"sft-s{seed}", lambda s=seed: self.sft(s), again=True)
            for x in todo:
                self.unit(f"{x}-s{seed}", lambda x=x, s=seed: self.arm(x, s))
                after()

    def sft(self, seed: int) -> dict:
        from pipeline import tracking
        from pipeline.bootstrap import run_bootstrap

        cfg = self.config(seed, [f"run.name=sft-s{seed}"])
        res = run_bootstrap(cfg, self.sft_path(seed))
        kept = (self.recorded(f"sft-s{seed}") or {}).get("metrics", {}).get("sft/train_loss")
        if kept is not None and kept != res.metrics["sft/train_loss"]:  # the arms of this seed start elsewhere
            print(f"experiments: sft-s{seed} retrained to train loss {res.metrics['sft/train_loss']!r}, not the kept "
                  f"figures' {kept!r}: this seed's new arms start from another policy than its kept ones",
                  file=sys.stderr)
        exp = tracking.connect(cfg.tracking.tracking_uri, cfg.tracking.experiment)
        run = tracking.create_run(exp, f"sft-s{seed}", tags={"arm": "sft", "seed": str(seed)})
        tracking.log_metrics(run, res.metrics)
        tracking.finish(run)
        return {"metrics": res.metrics, "policy": policy_id(self.sft_path(seed))}

    def arm(self, arm: str, seed: int) -> dict:
        from flows.iterative import iterative_rl

        iterative_rl(self.arm_config(arm, seed).model_dump(mode="json"))
        return {"rounds": rounds_of(self.runs_dir / f"{arm}-s{seed}"), "start": policy_id(self.sft_path(seed))}

    def mc(self, seed: int) -> dict:
        from pipeline import tracking

        cfg = self.config(seed, [f"run.name=mc-s{seed}"])
        prompts, samples = (4, 2) if self.a.smoke else (self.a.mc_prompts, 8)
        result = mc_label_agreement(cfg, self.sft_path(seed), prompts, samples, MC_NS, seed)
        exp = tracking.connect(cfg.tracking.tracking_uri, cfg.tracking.experiment)
        run = tracking.create_run(exp, f"mc-labels-s{seed}", tags={"arm": "mc", "seed": str(seed)})
        tracking.log_params(run, {"prompts": prompts, "samples_per_prompt": samples})
        for n, r in result["by_n"].items():
            tracking.log_metrics(run, {"mc/he_gold_agreement": r["he"], "mc/se_gold_agreement": r["se"]}, step=int(n))
        tracking.finish(run)
        return result


def policy_id(path: Path) -> str:
    """A short hash of a policy's weights: which round-0 policy an arm started from."""
    import hashlib

    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()[:12]


def machine() -> str:
    """The CPU, its cores and torch: the same code and seed on another machine ends elsewhere (docs/lab/results-history.md §8)."""
    import platform

    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), None) if Path("/proc/cpuinfo").exists() else None
    return (f"{cpu or platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"{torch.backends.cpu.get_cpu_capability()} kernels{'' if pinned() else ' (native)'}, "
            f"{torch.get_num_threads()} threads")


def mc_label_agreement(cfg, policy_path: Path, prompts: int, samples: int, ns, seed: int) -> dict:
    """Math-Shepherd §5.2 on one policy: agreement of HE and SE (>= 0.5) step labels with gold, for each N.

    The same samples are labelled at every N (fresh rollouts each time), so N is the only thing that varies.
    """
    from models import load_policy
    from pipeline.mc_labels import agreement, label_exhaustive, make_request
    from pipeline.generation import sample
    from pipeline.problems import problem_set_from_config

    ps = problem_set_from_config(cfg)
    model, tok = load_policy(str(policy_path))
    c = cfg.collect
    opts = dict(temperature=c.temperature, top_p=c.top_p, max_new_tokens=c.max_new_tokens, batch_size=c.batch_size)
    problems = random.Random(seed).sample(list(ps.train), prompts)
    fresh = sample(model, tok, [p.prompt for p in problems], samples, seed=seed, **opts)
    items = [(p, t, ids) for p, texts, row_ids in zip(problems, fresh.texts, fresh.ids) for t, ids in zip(texts, row_ids)]
    gold = [ps.gold_step_labels(t, p) for p, t, _ in items]
    reqs = [make_request(ps, p, tok, ids) for p, _, ids in items]
    by_n = {}
    for n in ns:
        calls = iter(range(1, 1 << 30))

        def completer(prefixes, k, n=n):  # whole completions from the prefixes' own ids
            return sample(model, tok, prefixes, k, seed=seed * 100003 + n * 1009 + next(calls), **opts).texts

        labels = label_exhaustive(ps, completer, reqs, n)
        by_n[str(n)] = {"he": agreement([x.he for x in labels], gold), "se": agreement([x.se for x in labels], gold),
                        "rollouts_per_sample": sum(x.rollouts for x in labels) / len(labels)}
    steps = sum(len(g) for g in gold)
    return {"samples": len(items), "steps": steps, "gold_positive_share": sum(map(sum, gold)) / max(steps, 1),
            "by_n": by_n}


def rounds_of(run_dir: Path) -> dict[int, dict]:
    """round -> every metric the pipeline recorded in it (eval, reward_model, collect, policy), evaluated rounds."""
    rounds: dict[int, dict] = {}
    for key, out in Manifest.load(run_dir).data["phases"].items():
        rounds.setdefault(round_of(key.split("/")[0]), {}).update(out.get("metrics", {}))
    return {r: m for r, m in sorted(rounds.items()) if "eval/greedy" in m}


def per_problem_of(run_dir: Path) -> dict[int, dict]:
    """round -> eval.json's `per_problem` (metric -> one value per eval problem), for the rounds that recorded it."""
    paths = {r: round_dir(run_dir, r) / "eval.json" for r in rounds_of(run_dir)}
    return {r: pp for r, p in paths.items() if p.exists() and (pp := read_json(p).get("per_problem"))}


def grpo_seconds(run_dir: Path, tracking_uri: str | None = None) -> dict[str, float]:
    """RL round (a string key, as JSON gives it back) -> its GRPO phase's `train_runtime`, the trainer's own seconds
    of training (a resumed phase's: its last stretch's), read from the run's MLflow runs (the manifest's ids; the
    store is `tracking_uri`, else the one the run's config names). {} for a run that recorded no GRPO run.

    Raises:
        ValueError: a recorded GRPO run without `train_runtime` (not a finished GRPO phase).
    """
    manifest = Manifest.load(run_dir)
    runs = {r: rid for key, rid in manifest.data["mlflow"].items()
            if key.endswith("/policy") and (r := round_of(key.split("/")[0]))}  # round 0's policy is SFT's, if any
    if not runs:
        return {}
    from mlflow import MlflowClient

    uri = tracking_uri or manifest.data["config"].get("tracking", {}).get("tracking_uri")
    client, out = MlflowClient(uri), {}
    for r, rid in sorted(runs.items()):
        if (seconds := client.get_run(rid).data.metrics.get("train_runtime")) is None:
            raise ValueError(f"{run_dir}: MLflow run {rid} (round {r}'s policy) has no train_runtime: is it a finished "
                             "GRPO phase?")
        out[str(r)] = seconds
    return out


def run_figures(run_dir: Path, tracking_uri: str | None = None) -> dict:
    """What a unit keeps of a finished pipeline run: its rounds' metrics (`rounds_of`), each RL round's GRPO
    `train_runtime` (`grpo_seconds`: what an equal-wall-clock arm is set from, experiments/credit_arms.py
    `verifier_matched`) and, where eval.json kept them, each round's per-problem figures (`per_problem`, round as a
    string key, as JSON gives it back)."""
    pp = {str(r): m for r, m in per_problem_of(run_dir).items()}
    grpo = grpo_seconds(run_dir, tracking_uri)
    return {"rounds": rounds_of(run_dir), **({"grpo_seconds": grpo} if grpo else {}),
            **({"per_problem": pp} if pp else {})}


def stoppable(prog: str, work) -> None:
    """`work()` with igrpo run's stop handling: a SIGTERM or Ctrl-C ends the arm as `igrpo run` would (resumable),
    and the exit (128 + the signal) unwinds, so Prefect's ephemeral server stops with us instead of outliving the
    command (seen: one outlived a SIGTERMed study by nearly an hour)."""
    from flows.signals import stop_on_signals

    with stop_on_signals() as stopper:
        try:
            work()
        except BaseException as e:
            if (code := stopper.exit_code(e) if stopper else None) is None:
                raise
            print(f"{prog}: stopped by {signal.Signals(code - 128).name}; the same command resumes", file=sys.stderr)
            sys.exit(code)
