"""DeepSeekMath's comparisons on the embedded problem set, at fixed budgets, with several seeds each.

Every arm is a pipeline run (the `iterative-rl` flow on configs/experiments.yaml plus overrides) in
`<runs-dir>/<arm>-s<seed>`, so a restarted command resumes where it stopped; all of them log to one MLflow
experiment (`iterative-grpo-experiments`), a parent run per arm and seed. Each seed's SFT bootstrap is
trained once (`<runs-dir>/sft-s<seed>`) and is every arm's round-0 policy, so the arms of a seed differ
only from round 1 on. Twelve arms (`ARMS`, experiments/runner.py) and one collection-only unit:

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
  hybrid-*  four arms (`HYBRID_GRID`): the verifier's outcome advantage plus w times the PRM's process advantage,
            sum or min credit; run on the first seed only, the best of them then on the others with `--only ARM`
  oracle    as prm, the exact gold step labels as the step rewards (reward_model.oracle: gold)
  mc        collection only: MC step labels' agreement with the gold labels against N, hard and soft

Each finished unit's figures (every round's metrics, its wall time, the commit and the machine it ran on) are kept
in `docs/experiments/<unit>.json`, committed with the report: a unit with its figures there is done, so the
comparisons can be run in parts on machines that do not keep `runs/` (a seed's SFT bootstrap is retrained where an
arm of it still has to run). After each seed, and at the end, experiments/report.py rebuilds `docs/results.md`
and its plots in `docs/img/` from those figures. Run from the repository root (minutes of units on 2 cores, pinned
AVX2 kernels, from the committed units of 2026-12-03: a seed's arms and its SFT and MC units 75-80 min, the
first seed's hybrid grid about 35 min more, one arm 6-13 min):

  python -m experiments                         # everything: about 4.5 hours (docs/results.md: 292 min of units,
                                                #   the chosen hybrid arm on seeds 1 and 2 included)
  python -m experiments --smoke                 # mini budgets, 1 seed, 1 round, ~2 min (runs/experiments-smoke)
  python -m experiments --only rft --only frozen
  python -m experiments --only hybrid-min-w0.5 --seeds 1 2   # the chosen hybrid arm on the other seeds
  python -m experiments --report-only           # rebuild the report (and README's results) from the kept figures
  python -m experiments --smoke --report-only   # the smoke run's report
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench._common import ROOT
from experiments.credit_study import LEARNED
from experiments.report import glance, report, write_region
from experiments.runner import ARMS, EXPERIMENT, HYBRID_ARMS, Experiments, restart_pinned, stoppable


def main(argv: list[str] | None = None) -> None:
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
    argv = sys.argv[1:] if argv is None else argv
    a = ap.parse_args(argv)
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
    command = " ".join(["python -m experiments", *(x for x in argv if x != "--report-only")])

    stoppable("experiments", lambda: run_all(a, command))


def run_all(a: argparse.Namespace, command: str) -> None:
    """Every pending unit, seed by seed, the report rebuilt after each seed and at the end."""
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
    if Path(a.out).resolve() == ROOT / "docs":  # the README's results at a glance, from the same kept figures
        write_region(ROOT / "README.md", "results", glance(Path(a.figures), LEARNED))
    print(f"report: {path} ({(time.perf_counter() - start) / 60:.1f} min)")


if __name__ == "__main__":
    restart_pinned("experiments", sys.argv[1:])
    main()
