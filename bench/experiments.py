"""DeepSeekMath's comparisons on the embedded problem set, at fixed budgets, with several seeds each.

Every arm is a pipeline run (the `iterative-rl` flow on configs/quickstart.yaml plus overrides) in
`<runs-dir>/<arm>-s<seed>`, so a restarted command resumes where it stopped; all of them log to one MLflow
experiment (`iterative-grpo-experiments`), a parent run per arm and seed. Each seed's SFT bootstrap is
trained once (`<runs-dir>/sft-s<seed>`) and is every arm's round-0 policy, so the arms of a seed differ
only from round 1 on.

  prm       GRPO, process supervision, RMs retrained each round with 10% replay (the quickstart);
            evaluated with 64 samples per problem for Maj@K / Pass@K and best-of-N up to 64
  orm       GRPO, outcome supervision by the ORM alone
  verifier  GRPO, outcome supervision by the verifier alone
  rft       Online RFT: the verifier's 0/1 reward is the advantage, no baseline (DeepSeekMath §5.2.1)
  frozen    as prm, the round-0 RMs frozen (reward_model.retrain: false)
  noreplay  as prm, the RMs retrained without replay (reward_model.replay_fraction: 0)
  exploit   as frozen, the frozen RMs deliberately exploitable (reward_model.exploit): every score of a
            completion whose Answer line repeats the first step's result, the slip the SFT data teaches, gets +2;
            the reward-hacking monitor must fire on it
  mc        collection only: MC step labels' agreement with the gold labels against N, hard and soft

Then `docs/results.md` (tables: mean ± sample std over seeds, per-seed values at the end) and PNG plots
in `docs/img/`, the command and its wall time. Each finished unit's figures (every round's metrics, its wall time,
the commit it ran from) are also kept in `docs/experiments/<unit>.json`, committed with the report: a unit with
its figures there is done, so the comparisons can be run in parts on machines that do not keep `runs/` (a seed's
SFT bootstrap is retrained where an arm of it still has to run), and `--report-only` rebuilds the report in a
fresh clone. Run from the repository root:

  python bench/experiments.py                   # everything: 124 min on 2 idle cores (measured)
  python bench/experiments.py --smoke           # mini budgets, 1 seed, 1 round, ~2 min (runs/experiments-smoke)
  python bench/experiments.py --only rft --only frozen
  python bench/experiments.py --report-only     # rebuild the report from the finished runs
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

# The same code and seed on another CPU trains to other figures (docs/results-history.md section 8): torch and MKL pick
# their kernels by the CPU's instruction set, and a sum in another order ends elsewhere. Every x86-64 machine
# here has AVX2, so the units run on its kernels, at 2 threads, and a seed's arms run on two machines compute
# alike (seen: sft-s0's train loss 0.2598 on an AVX-512 machine pinned to AVX2, as on an AVX2 one; 0.2672 there
# unpinned). Read once, when torch loads: so the script starts itself again with them set. --native: the CPU's own.
PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "2"}


def pinned() -> bool:
    """Whether this process runs on the pinned kernels and threads."""
    return all(os.environ.get(k) == v for k, v in PINNED.items())


if __name__ == "__main__" and "--native" not in sys.argv and not pinned():
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **PINNED})

os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
import prm_study  # noqa: E402  (its table's rows, for the kept study results)
from _common import ROOT, table  # noqa: E402  (sets sys.path, quiet warnings and tqdm)

from pipeline.config import load_config  # noqa: E402
from pipeline.rundir import Manifest, read_json, round_of, write_json_atomic  # noqa: E402

EXPERIMENT = "iterative-grpo-experiments"
SUPERVISION_ARMS = ("prm", "orm", "verifier", "rft")
RM_ARMS = ("prm", "frozen", "noreplay", "exploit")
# Hybrid supervision (verifier outcome advantage + w * PRM process advantage): a grid of credit and weight run
# on the first seed only; the best of it (section 6) is then run on the other seeds with `--only <arm>`. Add
# weights here to widen it. w = 1 gave the PRM term ~75% of the variance (2026-12-01, soft targets), so min at
# w = 0.5 (~40% expected, still above the issue's 20%) tries a larger verifier share. A third entry sets
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

# Mini sizes (tests/conftest.py's mini_config): the whole smoke run in a few minutes.
SMOKE = [
    "policy.tiny.hidden_size=64", "policy.tiny.num_layers=2", "policy.tiny.num_heads=2",
    "policy.tiny.intermediate_size=128", "policy.tiny.max_position_embeddings=96",
    "problems.arithmetic.num_train=400", "problems.arithmetic.num_test=20", "problems.arithmetic.max_steps=2",
    "bootstrap.sft_args.num_train_epochs=2", "bootstrap.sft_args.learning_rate=3e-3",
    "supervision.prompts_per_round=16", "grpo.max_steps=2", "grpo.num_generations=4",
    "grpo.per_device_train_batch_size=8", "grpo.max_completion_length=32",
    "collect.prompts_per_round=6", "collect.samples_per_prompt=2", "collect.rollouts_per_step=2",
    "collect.max_new_tokens=32", "reward_model.holdout_fraction=0.34", "reward_model.train_args.num_train_epochs=1",
    "reward_model.train_args.per_device_train_batch_size=8", "eval.num_problems=8", "eval.samples_per_problem=8",
    "eval.max_new_tokens=32", "eval.best_of_n=[2,4]",
]


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

    def commits(self) -> dict[str, int]:
        """The commits the kept figures ran from, with how many units each."""
        return dict(collections.Counter(k["commit"] for k in self.kept().values()))

    def machines(self) -> dict[str, int]:
        """The machines the kept figures ran on, with how many units each (not recorded before 2026-12-03)."""
        return dict(collections.Counter(k.get("machine", "machine not recorded") for k in self.kept().values()))

    def mixed_starts(self, seeds: list[int]) -> dict[int, dict[str, list[str]]]:
        """Seeds whose kept arms started from more than one round-0 policy (a retrained SFT, or one not recorded):
        seed -> policy -> its arms. Such a seed's arms differ from round 0 on, not only by their method."""
        out = {}
        for seed in seeds:
            by = collections.defaultdict(list)
            for arm in ARMS:
                if kept := self.recorded(f"{arm}-s{seed}"):
                    by[kept.get("start", "not recorded")].append(arm)
            if len(by) > 1:
                out[seed] = dict(by)
        return out

    def pending(self, name: str) -> bool:
        return self.recorded(name) is None and self.status["units"].get(name, {}).get("status") != "done"

    def base(self, seed: int) -> list[str]:
        return (SMOKE if self.a.smoke else []) + [f"run.seed={seed}", f"run.runs_dir={self.runs_dir}",
                                                  f"tracking.experiment={self.a.experiment}"] + (
            [f"tracking.tracking_uri={self.a.tracking_uri}"] if self.a.tracking_uri else [])

    def config(self, seed: int, extra: list[str]):
        return load_config(ROOT / "configs" / "quickstart.yaml", self.base(seed) + extra)

    def arm_config(self, arm: str, seed: int):
        return self.config(seed, [
            f"run.name={arm}-s{seed}", f"run.rounds={self.a.rounds}", f"policy.model={self.sft_path(seed)}",
            "bootstrap.sft=false", "tracking.register_models=false", "tracking.register_policy=false",
            *arm_overrides(arm, self.a.smoke)])

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
    """The CPU, its cores and torch: the same code and seed on another machine ends elsewhere (docs/results-history.md §8)."""
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
    from pipeline.collect import agreement, label_exhaustive, make_request
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


# --- report --------------------------------------------------------------------------------------


def rounds_of(run_dir: Path) -> dict[int, dict]:
    """round -> every metric the pipeline recorded in it (eval, reward_model, collect, policy), evaluated rounds."""
    rounds: dict[int, dict] = {}
    for key, out in Manifest.load(run_dir).data["phases"].items():
        rounds.setdefault(round_of(key.split("/")[0]), {}).update(out.get("metrics", {}))
    return {r: m for r, m in sorted(rounds.items()) if "eval/greedy" in m}


def gather(ex: Experiments, seeds: list[int]) -> dict:
    """arm -> seed -> `rounds_of` its run: the kept figures of a finished arm, else its run directory's so far."""
    data: dict = {}
    for arm in ARMS:
        for seed in seeds:
            if kept := ex.recorded(f"{arm}-s{seed}"):
                rounds = {int(r): m for r, m in kept["rounds"].items()}
            else:
                try:
                    rounds = rounds_of(ex.runs_dir / f"{arm}-s{seed}")
                except FileNotFoundError:  # not started
                    continue
            data.setdefault(arm, {})[seed] = rounds
    return data


def values(data: dict, arm: str, r: int, key: str) -> list[float]:
    return [m[r][key] for m in data.get(arm, {}).values() if r in m and key in m[r] and m[r][key] == m[r][key]]


def fmt(xs: list[float], seeds: int) -> str:
    """'mean ± sample std' over seeds, '(n=k)' when fewer seeds than planned finished; '-' when none."""
    if not xs:
        return "-"
    text = f"{statistics.mean(xs):.3f}" + (f" ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else "")
    return text + (f" (n={len(xs)})" if len(xs) < seeds else "")


def gains(data: dict, arm: str, last: int, key: str) -> list[float]:
    """Per-seed change of `key` from round 0 to round `last` (then averaged: a paired comparison)."""
    return [m[last][key] - m[0][key] for m in data.get(arm, {}).values()
            if 0 in m and last in m and key in m[0] and key in m[last]]


def fired(data: dict, arm: str, r: int, key: str) -> str:
    """'k/n': in how many of the n seeds with a value of the alarm `key` in round `r` it fired; '-' when none."""
    xs = values(data, arm, r, key)
    return f"{sum(x > 0.5 for x in xs)}/{len(xs)}" if xs else "-"


def plot_lines(path: Path, panels: list[tuple[str, str, dict[str, tuple[list, list, list]]]], xlabel: str,
               logx: bool = False) -> Path:
    """One panel per (title, y label, {label: (x, mean, std)}), error bars = std over seeds."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5 * len(panels), 4))
    FigureCanvasAgg(fig)
    for ax, (title, ylabel, curves) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        for label, (x, mean, std) in curves.items():
            if x:
                ax.errorbar(x, mean, yerr=std, marker="o", capsize=3, label=label)
        if logx:
            ax.set_xscale("log", base=2)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        xs = sorted({v for _, (x, _, _) in curves.items() for v in x})
        if xs:
            ax.set_xticks(xs, [str(v) for v in xs])
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def curve(data: dict, arm: str, points: list[tuple[int, int, str]]) -> tuple[list, list, list]:
    """(x, mean, std over seeds) for each (x, round, metric) point that has values."""
    pts = [(x, v) for x, r, key in points if (v := values(data, arm, r, key))]
    return ([x for x, _ in pts], [statistics.mean(v) for _, v in pts],
            [statistics.stdev(v) if len(v) > 1 else 0.0 for _, v in pts])


PLACEHOLDER = "**What held / what did not:** _to be written from the numbers above; the script does not judge them._"


def by_round(data: dict, arm: str, rounds: list[int], key: str) -> tuple[list, list, list]:
    return curve(data, arm, [(r, r, key) for r in rounds])


def report(ex: Experiments, command: str, wall: float | None, log: bool = True) -> Path:
    """Write results.md and its plots from whatever runs exist (and log them to MLflow); return the path."""
    a, seeds = ex.a, ex.a.seeds
    out = Path(a.out)
    img = out / "img"
    data = gather(ex, seeds)
    last = a.rounds
    rounds = list(range(last + 1))
    cfg = ex.arm_config("prm", seeds[0])
    g, c, e = cfg.grpo, cfg.collect, cfg.eval
    units = ex.units()
    failed = sorted(k for k, v in units.items() if v["status"] == "failed")
    total = sum(v["seconds"] for v in units.values())
    md = [
        "# Results: DeepSeekMath's comparisons on the embedded problem set",
        "",
        f"Command: `{command}` (from the repository root); "
        + (f"wall time of this invocation {wall / 60:.0f} min, " if wall is not None else "")
        + f"sum of all units' wall times over every invocation {total / 60:.0f} min; {time.strftime('%Y-%m-%d')}, "
        f"{os.cpu_count()} CPU cores. Seeds {seeds}; each seed also draws the problem set. "
        f"MLflow experiment `{a.experiment}` (a parent run per arm and seed, `<arm>-s<seed>`; `sft-s<seed>`, "
        "`mc-labels-s<seed>`; the report and plots as artifacts of a `summary` run).",
        "",
        f"Each unit's figures: `{ex.figures.as_posix()}/<unit>.json`; they ran from "
        + (", ".join(f"`{c}` ({n} units)" for c, n in ex.commits().items()) or "no commit yet (none kept)")
        + "; on " + (", ".join(f"{m} ({n} units)" for m, n in ex.machines().items()) or "no machine yet") + "."
        + "".join(f" **Seed {s}'s arms started from {len(by)} different round-0 policies** ("
                  + "; ".join(f"`{p}`: {', '.join(arms)}" for p, arms in by.items())
                  + "): its arms differ from round 0 on, not only by their method."
                  for s, by in ex.mixed_starts(seeds).items())
        # Superseded reports (other code, other machines) are kept by hand beside this one, not rewritten.
        + (" Earlier measurements, by other code or on other machines: [results-history.md](results-history.md)."
           if (out / "results-history.md").exists() else ""),
        "",
        f"Budgets (configs/quickstart.yaml unless listed): {last} RL round(s) after round 0 for every arm; per round "
        f"GRPO {g.get('max_steps')} steps of {g.get('per_device_train_batch_size')} completions "
        f"({g.get('num_generations')} per prompt, lr {g.get('learning_rate')}, beta {g.get('beta')}); collection "
        f"{c.prompts_per_round} prompts x {c.samples_per_prompt} samples, N = {c.rollouts_per_step} rollouts per step; "
        f"RMs {cfg.reward_model.train_args.get('num_train_epochs')} epochs; eval {e.num_problems} held-out problems x "
        f"{e.samples_per_problem} samples at temperature {e.temperature} for the prm arm, "
        f"{ex.arm_config('orm', seeds[0]).eval.samples_per_problem} for the others (Maj@K and Pass@K are unbiased at any n, so the arms compare; only the spread differs). "
        "The SFT policy, trained once per seed, is every arm's round-0 policy; round 0's collection, RMs and eval "
        f"are rerun in each arm with the same seeds (the prm arm's eval draws {e.samples_per_problem} samples).",
        "",
        table(["arm", "overrides of the quickstart", "units finished"], [
            [f"`{arm}` {LABELS[arm]}", " ".join(f"`{o}`" for o in arm_overrides(arm, a.smoke)) or "-",
             f"{sum(last in m for m in data.get(arm, {}).values())} of {len(seeds)} seeds"] for arm in ARMS]),
        "",
        f"`±` is the sample standard deviation over seeds (n = {len(seeds)} is few: read it as a rough spread); the per-seed "
        "values are at the end. Gains are per-seed differences, then averaged.",
    ]
    if failed:
        md += ["", f"**Failed units** (see the command's log): {', '.join(failed)}."]

    # 1. Supervision.
    rows = []
    for arm in SUPERVISION_ARMS:
        rows.append([LABELS[arm]] + [fmt(values(data, arm, r, "eval/maj@8"), len(seeds)) for r in rounds]
                    + [fmt(gains(data, arm, last, "eval/maj@8"), len(seeds)),
                       fmt(values(data, arm, last, "eval/greedy"), len(seeds)),
                       fmt(values(data, arm, last, "eval/pass@1"), len(seeds))])
    plot_lines(img / "supervision.png", [
        ("Maj@8 per round", "accuracy", {LABELS[x]: by_round(data, x, rounds, "eval/maj@8") for x in SUPERVISION_ARMS}),
        ("greedy per round", "accuracy", {LABELS[x]: by_round(data, x, rounds, "eval/greedy") for x in SUPERVISION_ARMS}),
    ], "round")
    md += ["", "## 1. Process against outcome supervision, and Online RFT", "",
           "Mirrors DeepSeekMath Fig. 5 (§5.2.1): on GSM8K and MATH, GRPO with process supervision ends above GRPO "
           "with outcome supervision, which ends above Online RFT (whose gradient coefficient is 1 for a correct "
           "sample and 0 otherwise). The verifier-alone arm is not in the paper (it used a trained RM); Online RFT "
           "here keeps the KL term, so only the advantage differs from the verifier arm.", "",
           table(["arm"] + [f"Maj@8 round {r}" for r in rounds] + [f"Δ Maj@8 (0→{last})", f"greedy round {last}",
                                                                    f"Pass@1 round {last}"], rows),
           "", "![Maj@8 and greedy per round by supervision](img/supervision.png)", "", PLACEHOLDER]

    # 2. Reward model retraining.
    rows = []
    for arm in RM_ARMS:
        rows.append([LABELS[arm] if arm != "prm" else "PRM retrained, 10% replay"]
                    + [fmt(values(data, arm, r, "eval/maj@8"), len(seeds)) for r in rounds]
                    + [fmt(values(data, arm, r, "monitor/prm_gap"), len(seeds)) for r in rounds]
                    + [fmt(values(data, arm, last, "prm/step_auc_gold"), len(seeds))])
    # The monitor against each RM's own held-out calibration; round 0 reads its RMs on their training samples,
    # where it compares nothing.
    later = rounds[1:]
    monitor = [[LABELS[arm] if arm != "prm" else "PRM retrained, 10% replay"]
               + [fmt(values(data, arm, r, f"monitor/prm_{key}"), len(seeds)) for key in ("gap_rise", "auc_drop")
                  for r in later]
               + [fired(data, arm, r, "monitor/prm_alarm") for r in later] for arm in RM_ARMS]
    names = {"prm": "retrained, 10% replay", "frozen": "frozen at round 0", "noreplay": "retrained, no replay",
             "exploit": "frozen, exploitable"}
    plot_lines(img / "reward_model.png", [
        ("policy Maj@8 per round", "accuracy", {names[x]: by_round(data, x, rounds, "eval/maj@8") for x in RM_ARMS}),
        ("reward-hacking gap (PRM mean - verifier)", "gap", {names[x]: by_round(data, x, rounds, "monitor/prm_gap")
                                                             for x in RM_ARMS}),
        ("gap rise (fresh gap - held-out gap)", "gap rise", {names[x]: by_round(data, x, later, "monitor/prm_gap_rise")
                                                             for x in RM_ARMS}),
    ], "round")
    md += ["", "## 2. Reward model retrained each round, frozen, or retrained without replay", "",
           "Mirrors DeepSeekMath Fig. 6 and Algorithm 1 (§4.2): iterative RL, with the RM retrained on the policy's "
           "new samples plus a 10% replay of the old ones, improves on the first RL iteration. The frozen-RM and "
           "no-replay arms are ablations of that design, not figures of the paper. The gap is `monitor/prm_gap`: "
           "the mean PRM score the policy trained against gives the round's fresh samples, minus the verifier's "
           "accuracy on them; a min-over-steps PRM's is negative by construction, so the monitor reads it against "
           "the same RM's gap on its own held-out slice when it was trained: the gap rise (fresh - held-out), the "
           "AUC drop (held-out - fresh solution AUC against the verifier), and the alarm, `monitor/prm_alarm`, when "
           f"the rise exceeds `eval.monitor_threshold` ({e.monitor_threshold}; k/n: seeds that fired). The exploit "
           "arm is the frozen one with a planted flaw (`reward_model.exploit`): every score of a completion whose "
           f"Answer line repeats the first step's result, the slip the SFT data teaches, gets +{EXPLOIT['bonus']} "
           "(unclipped: a clipped bonus can at most tie a PRM sure of right answers); the monitor must fire on it "
           "and stay quiet on the retrained arm.", "",
           table(["RM"] + [f"Maj@8 r{r}" for r in rounds] + [f"PRM gap r{r}" for r in rounds]
                 + [f"PRM step AUC (gold) r{last}"], rows), "",
           table(["RM"] + [f"gap rise r{r}" for r in later] + [f"AUC drop r{r}" for r in later]
                 + [f"alarm r{r}" for r in later], monitor),
           "", "![Maj@8 and reward-hacking gap per round](img/reward_model.png)", "", PLACEHOLDER]

    # 3. Maj@K and Pass@K, round 0 against the last round.
    ks = sorted({int(k.split("@")[1]) for m in data.get("prm", {}).values() for r in m.values() for k in r
                 if k.startswith("eval/pass@")})
    rows = [[str(k)] + [fmt(values(data, "prm", r, f"eval/{m}@{k}"), len(seeds)) for m in ("maj", "pass")
                        for r in (0, last)]
            + [fmt(gains(data, "prm", last, f"eval/{m}@{k}"), len(seeds)) for m in ("maj", "pass")] for k in ks]
    plot_lines(img / "pass_maj.png", [
        (f"{m.capitalize()}@K, GRPO + PRM", "accuracy",
         {f"round {r}": curve(data, "prm", [(k, r, f"eval/{m}@{k}") for k in ks]) for r in sorted({0, last})})
        for m in ("maj", "pass")], "K: samples per problem", logx=True)
    md += ["", "## 3. Maj@K and Pass@K from round 0 to the last round (GRPO + PRM)", "",
           "Mirrors DeepSeekMath Fig. 7 (§5.2.2; 7B, temperature 0.7, Instruct -> RL): GSM8K Maj@64 89.5 -> 91.0, "
           "Pass@64 99.1 -> 97.3; MATH Maj@64 59.9 -> 60.9, Pass@64 87.5 -> 86.8. RL sharpens the output "
           "distribution: Maj@K gains, Pass@K at large K does not.", "",
           table(["K", "Maj@K r0", f"Maj@K r{last}", "Pass@K r0", f"Pass@K r{last}", "Δ Maj@K", "Δ Pass@K"], rows),
           "", "![Maj@K and Pass@K against K](img/pass_maj.png)", "", PLACEHOLDER]

    # 4. MC label agreement against N.
    mc = [m for s in seeds if (m := ex.recorded(f"mc-s{s}"))]
    rows = [[str(n), fmt([m["by_n"][str(n)]["he"] for m in mc], len(seeds)),
             fmt([m["by_n"][str(n)]["se"] for m in mc], len(seeds)),
             fmt([m["by_n"][str(n)]["rollouts_per_sample"] for m in mc], len(seeds))] for n in MC_NS]
    plot_lines(img / "mc_labels.png", [("MC step labels against gold", "agreement", {
        name: (list(MC_NS), [statistics.mean([m["by_n"][str(n)][key] for m in mc]) for n in MC_NS],
               [statistics.stdev([m["by_n"][str(n)][key] for m in mc]) if len(mc) > 1 else 0.0 for n in MC_NS])
        for name, key in (("hard estimation", "he"), ("soft estimation (>= 0.5)", "se")) if mc})],
        "N: rollouts per step", logx=True)
    def span(key: str) -> str:  # each seed draws its own samples, so their counts differ
        lo, hi = min(m[key] for m in mc), max(m[key] for m in mc)
        return f"{lo}" if lo == hi else f"{lo}-{hi}"

    sizes = f"{span('samples')} samples, {span('steps')} steps" if mc else "no data"
    md += ["", "## 4. Monte-Carlo step labels against gold labels, by the number of rollouts N", "",
           "Mirrors Math-Shepherd §5.2: hard estimation agrees best with human labels at small N (86% at N = 4) and "
           "degrades as N grows; soft estimation keeps improving with N. Here: each seed's SFT policy, "
           f"{sizes} per seed (the same samples at every N, fresh rollouts), gold labels from exact arithmetic.", "",
           table(["N", "HE agreement", "SE agreement", "rollouts per sample"], rows),
           "", "![MC label agreement against N](img/mc_labels.png)", "", PLACEHOLDER]

    # 5. Best-of-N.
    ns = sorted({int(k.split("@")[1]) for m in data.get("prm", {}).values() for r in m.values() for k in r
                 if k.startswith("bon/prm@")})
    picks = {"prm": "PRM", "prm_vote": "PRM vote", "orm": "ORM", "orm_vote": "ORM vote", "majority": "majority",
             "random": "random"}  # `bon/<pick>@N` -> its column and plot label
    rows = [[str(n)] + [fmt(values(data, "prm", r, f"bon/{w}@{n}"), len(seeds)) for r in sorted({0, last})
                        for w in picks] for n in ns]
    plot_lines(img / "best_of_n.png", [
        (f"best-of-N, round {r}", "accuracy",
         {label: curve(data, "prm", [(n, r, f"bon/{w}@{n}") for n in ns]) for w, label in picks.items()})
        for r in sorted({0, last})], "N: candidates per problem", logx=True)
    md += ["", "## 5. Best-of-N with the PRM, the ORM and majority vote", "",
           "Mirrors Math-Shepherd's verification results (best-of-N against N, the PRM against an ORM and "
           "self-consistency): the PRM ranks best, increasingly so as N grows, and its best verifier is the "
           "RM-weighted majority vote (`vote`: each sample's answer gets its RM score as its vote), above both "
           "self-consistency and best-of-N by the RM alone, the gap growing with N. Here: the prm arm's eval "
           "samples, scored once by that round's RMs (best-of-N and the vote use the same scores); a random pick "
           "is the floor.", "",
           table(["N"] + [f"{label} r{r}" for r in sorted({0, last}) for label in picks.values()], rows),
           "", "![Best-of-N against N](img/best_of_n.png)", "", PLACEHOLDER]

    md += issue16_section(ex, data, seeds, rounds, img)

    # Per-seed values.
    rows = [[arm, str(s)] + [f"{m[r]['eval/maj@8']:.3f}" if "eval/maj@8" in m.get(r, {}) else "-"
                             for r in rounds]
            for arm in ARMS for s, m in sorted(data.get(arm, {}).items())]
    md += ["", "## Per seed: Maj@8 by round", "", table(["arm", "seed"] + [f"round {r}" for r in rounds], rows), ""]

    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.md"
    path.write_text(keep_verdicts("\n".join(md), path))
    if log:
        _log_summary(ex, path, img)
    return path


def at(data: dict, arm: str, seed: int, r: int, key: str) -> float | None:
    return data.get(arm, {}).get(seed, {}).get(r, {}).get(key)


def paired(data: dict, arm: str, base: str, r: int, key: str) -> list[float]:
    """Per-seed differences `arm - base` of `key` at round r, over the seeds both finished."""
    return [m[r][key] - data[base][s][r][key] for s, m in data.get(arm, {}).items()
            if r in m and key in m[r] and key in data.get(base, {}).get(s, {}).get(r, {})]


SHARE = "policy/process_variance_share"


def chosen_hybrid(data: dict, seed: int, last: int) -> str | None:
    """The hybrid arm of the grid with the best Maj@8 at the last round on `seed`, among those whose PRM term carries
    at least 20% of the advantages' variance in every RL round (issue 16's condition; none: the best of all)."""
    done = [arm for arm in HYBRID_ARMS if at(data, arm, seed, last, "eval/maj@8") is not None]
    eligible = [arm for arm in done if all((at(data, arm, seed, r, SHARE) or 0) >= 0.2 for r in range(1, last + 1))]
    return max(eligible or done, key=lambda arm: at(data, arm, seed, last, "eval/maj@8"), default=None)


def issue16_section(ex: Experiments, data: dict, seeds: list[int], rounds: list[int], img: Path) -> list[str]:
    """Section 6: hybrid credit (grid on the first seed, then the chosen arm on every seed), the oracle PRM, and
    what limits the PRM (bench/prm_study.py's table when it has run)."""
    last, s0, n = rounds[-1], seeds[0], len(seeds)
    grid = ["verifier", "prm", *HYBRID_ARMS, "oracle"]
    rows = [[LABELS[arm]] + [f"{v:.3f}" if (v := at(data, arm, s0, r, "eval/maj@8")) is not None else "-" for r in rounds]
            + [f"{v:.2f}" if (v := at(data, arm, s0, r, SHARE)) is not None else "-" for r in rounds[1:]]
            for arm in grid if arm in data]
    chosen = chosen_hybrid(data, s0, last)
    compared = ["verifier", "prm", *([chosen] if chosen else []), "oracle"]
    rows3 = [[LABELS[arm]] + [fmt(values(data, arm, r, "eval/maj@8"), n) for r in rounds]
             + [fmt(d := paired(data, arm, "verifier", last, "eval/maj@8"), n) if arm != "verifier" else "-",
                f"{sum(x >= 0 for x in d)} of {len(d)}" if arm != "verifier" else "-",
                fmt(values(data, arm, last, SHARE), n) if arm == chosen else "-"]
             for arm in compared if arm in data]
    plot_lines(img / "pay_their_way.png", [
        ("Maj@8 per round", "accuracy", {LABELS[x]: by_round(data, x, rounds, "eval/maj@8") for x in compared})],
        "round")
    def cell(s: int, r: int) -> str:  # the eval samples' figure, the held-out slice's in brackets
        ev, held = at(data, "prm", s, r, "eval/prm_step_auc_gold"), at(data, "prm", s, r, "prm/step_auc_gold")
        return (f"{ev:.3f}" if ev is not None else "-") + (f" ({held:.3f})" if held is not None else "")

    auc = [[str(s)] + [cell(s, r) for r in rounds] for s in seeds if s in data.get("prm", {})]
    md = ["", "## 6. Do the learned reward models pay their way? Hybrid credit, an oracle PRM, the PRM's quality", "",
          "Hybrid supervision (`supervision.mode: hybrid`): each token's advantage is the verifier's group-normalised "
          "outcome advantage plus `w` times the PRM's process advantage, with DeepSeekMath's summed credit or PURE's "
          "min-form credit (arXiv 2504.15275). The oracle arm is process supervision with the exact gold step labels "
          "as step rewards (`reward_model.oracle: gold`): the upper bound of any PRM here. The PRM share is "
          f"`{SHARE}`, Var(w P) / (Var(O) + Var(w P)) over the tokens in the loss, per RL round.", "",
          f"Grid on seed {s0} (Maj@8 by round, then the PRM share of the advantages' variance by RL round):", "",
          table(["arm"] + [f"Maj@8 r{r}" for r in rounds] + [f"PRM share r{r}" for r in rounds[1:]], rows), "",
          f"Chosen on seed {s0}: {LABELS.get(chosen, 'none yet')} (best Maj@8 at round {last} among the grid arms whose "
          "PRM term carries >= 20% of the variance in every RL round). Every seed:", "",
          table(["arm"] + [f"Maj@8 r{r}" for r in rounds] + [f"Δ vs verifier r{last}", "seeds >= verifier",
                                                             f"PRM share r{last}"], rows3),
          "", "![Maj@8 per round: verifier, PRM, hybrid, oracle](img/pay_their_way.png)", "",
          "The prm arm's PRM step AUC against gold, by seed and round: on every eval sample "
          "(`eval/prm_step_auc_gold`: the round's PRM, held-out problems, thousands of steps) and in brackets on the "
          "RM phase's held-out slice (`prm/step_auc_gold`, ~150 samples). Goal: >= 0.85 in every round and seed.", "", table(["seed"] + [f"round {r}" for r in rounds], auc)]
    kept = [read_json(p) for p in sorted((ex.figures / "prm-study").glob("*.json"))]  # bench/prm_study.py --figures
    if kept:
        kept.sort(key=lambda k: (k["seed"], k["collect"]))
        rounds_run = sorted({int(r) for k in kept for v in k["results"].values() for r in v})
        head = ["seed", "collected a round", *prm_study.header(rounds_run)]
        lines = [[str(k["seed"]), f"{k['collect'][0]} prompts x {k['collect'][1]}", *row]
                 for k in kept for row in prm_study.rows(k["results"], rounds_run)]
        md += ["", "What limits the PRM (`python bench/prm_study.py --run RUN --figures docs/experiments`, on verifier "
               "arms, whose shards do not depend on the PRM): each variant retrains the PRM round after round on RUN's "
               "shards as the RM phase does; step AUC against gold on the round's policy sampled "
               f"{kept[0].get('samples_per_test_problem')} times on every held-out test problem (in brackets: on the "
               "pipeline's held-out slice of the shard). Runs: " + "; ".join(f"`{k['run']}`" for k in kept) + ".", "",
               table(head, lines)]
    return md + ["", PLACEHOLDER]


def keep_verdicts(text: str, old: Path) -> str:
    """Put back the verdicts written by hand under each section of an earlier report, so a rebuilt one keeps them."""
    if not old.exists():
        return text
    kept = {}
    for section in old.read_text().split("\n## ")[1:]:
        title, _, body = section.partition("\n")
        for para in body.split("\n\n"):
            if para.strip().startswith("**What held") and para.strip() != PLACEHOLDER:
                kept[title] = para.strip()
    sections = text.split("\n## ")
    for i, section in enumerate(sections[1:], 1):
        title = section.partition("\n")[0]
        if title in kept:
            sections[i] = section.replace(PLACEHOLDER, kept[title])
    return "\n## ".join(sections)


def _log_summary(ex: Experiments, path: Path, img: Path) -> None:
    """The report and its plots as artifacts of one `summary` run in the experiment."""
    from mlflow import MlflowClient

    from pipeline import tracking

    exp = tracking.connect(ex.a.tracking_uri, ex.a.experiment)
    run = tracking.create_run(exp, "summary", tags={"arm": "summary"})
    MlflowClient().log_artifact(run, str(path))
    MlflowClient().log_artifacts(run, str(img), "img")
    tracking.finish(run)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="mini budgets, 1 seed, 1 round (~2 min)")
    ap.add_argument("--only", action="append", choices=[*ARMS, "mc"], help="run only these arms (repeatable)")
    ap.add_argument("--seeds", type=int, nargs="+", help="default: 0 1 2 (smoke: 0)")
    ap.add_argument("--rounds", type=int, help="RL rounds after round 0 (default 2; smoke 1); changing it on a "
                    "resumed command needs a new --runs-dir")
    ap.add_argument("--mc-prompts", type=int, default=64, help="prompts of the MC-label experiment (8 samples each)")
    ap.add_argument("--runs-dir", help="default: runs/experiments (smoke: runs/experiments-smoke)")
    ap.add_argument("--out", help="where results.md and img/ go (default: docs; smoke: the runs dir)")
    ap.add_argument("--figures", help="where each finished unit's figures are kept (default: docs/experiments; "
                    "smoke: figures/ in the runs dir)")
    ap.add_argument("--experiment", help=f"MLflow experiment (default {EXPERIMENT}; smoke: {EXPERIMENT}-smoke)")
    ap.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLflow's, ./mlflow.db; smoke: in the runs dir)")
    ap.add_argument("--report-only", action="store_true", help="only rebuild the report from finished runs")
    ap.add_argument("--native", action="store_true", help="the CPU's own kernels and thread count, not the pinned "
                    "AVX2 ones at 2 threads (faster on some CPUs; figures then differ from another machine's)")
    a = ap.parse_args()
    from flows.console import prefect_defaults

    prefect_defaults()  # igrpo run's Prefect defaults where the user set none: analytics off (no `database is locked`)
    a.seeds = a.seeds or ([0] if a.smoke else [0, 1, 2])
    a.rounds = a.rounds or (1 if a.smoke else 2)
    a.runs_dir = a.runs_dir or ("runs/experiments-smoke" if a.smoke else "runs/experiments")
    a.out = a.out or (a.runs_dir if a.smoke else "docs")
    a.figures = a.figures or (str(Path(a.runs_dir) / "figures") if a.smoke else str(Path(a.out) / "experiments"))
    a.experiment = a.experiment or (f"{EXPERIMENT}-smoke" if a.smoke else EXPERIMENT)
    if a.smoke and not a.tracking_uri:
        a.tracking_uri = f"sqlite:///{Path(a.runs_dir).resolve() / 'mlflow.db'}"
    Path(a.runs_dir).mkdir(parents=True, exist_ok=True)
    # The command that made the runs: a rebuilt report names that one, not --report-only.
    command = " ".join(["python bench/experiments.py", *(x for x in sys.argv[1:] if x != "--report-only")])

    from flows.signals import stop_on_signals

    # igrpo run's stop handling: a SIGTERM or Ctrl-C ends the arm as `igrpo run` would (resumable), and the exit
    # unwinds, so Prefect's ephemeral server stops with us instead of outliving the command.
    with stop_on_signals() as stopper:
        try:
            run_all(a, command)
        except BaseException as e:
            if (code := stopper.exit_code(e) if stopper else None) is None:
                raise
            print(f"experiments: stopped by {signal.Signals(code - 128).name}; the same command resumes",
                  file=sys.stderr)
            sys.exit(code)


def run_all(a: argparse.Namespace, command: str) -> None:
    start = time.perf_counter()
    ex = Experiments(a)
    wanted = a.only or [*ARMS, "mc"]
    if not a.report_only:
        # Seed by seed, so an interrupted command still has whole comparisons for the seeds it finished.
        for seed in a.seeds:
            # The hybrid grid is chosen on the first seed: on the others only the chosen arm, asked for by name.
            arms = [x for x in ARMS if x in wanted
                    and (x not in HYBRID_ARMS or seed == a.seeds[0] or x in (a.only or []))]
            todo = [u for u in (["mc"] if "mc" in wanted else []) + arms if ex.pending(f"{u}-s{seed}")]
            if not todo:
                continue
            if not ex.sft_path(seed).exists():  # the first time, or its figures kept from another machine's runs
                ex.unit(f"sft-s{seed}", lambda s=seed: ex.sft(s), again=True)
            if not ex.sft_path(seed).exists():
                continue
            for u in todo:
                ex.unit(f"{u}-s{seed}", lambda x=u, s=seed: ex.mc(s) if x == "mc" else ex.arm(x, s))
            report(ex, command, time.perf_counter() - start, log=False)
    path = report(ex, command, None if a.report_only else time.perf_counter() - start)
    print(f"report: {path} ({(time.perf_counter() - start) / 60:.1f} min)")


if __name__ == "__main__":
    main()
