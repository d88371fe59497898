"""SmolLM2 with a control (issue 47, point 7): the credit study's best learned arm beside a verifier-only control.

On configs/smollm2-arith.yaml (SmolLM2-135M-Instruct on the embedded arithmetic, 2-3 operations: not GSM8K), the
`verifier` arm and the `implicit-prime` arm (the study's best learned arm on the quickstart; overrides as
experiments/credit_arms.py) run from one round-0 policy, then every round-2 policy is evaluated against
round 0 on the same 400 problems (experiments/round_noise.py: the 100 held-out ones and 300 in neither split).
The runs, from a frozen commit, pinned to the AVX2 kernels at 2 threads (the study's `runner.PINNED`):

  igrpo run configs/smollm2-arith.yaml --set run.runs_dir=runs/smol47 --set run.name=verifier \\
      --set supervision.mode=outcome
  igrpo run configs/smollm2-arith.yaml --set run.runs_dir=runs/smol47 --set run.name=implicit-prime \\
      --set policy.model=runs/smol47/verifier/round-000/policy --set bootstrap.sft=false <implicit-prime's overrides>
  python -m experiments.round_noise runs/smol47/verifier --rounds 0 2 --fresh 300 \\
      --policy runs/smol47/implicit-prime/round-002/policy --out docs/experiments/smollm2-control/round-noise.json

then what is kept of the two runs, and the report (docs/results.md's region `smollm2-control`, written by
`python -m experiments.credit_study --report-only` from the files alone):

  python -m experiments.smollm2_control runs/smol47 --tracking-uri sqlite:///mlflow.db --commit <the runs' commit>
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench._common import ROOT, table
from experiments.credit_arms import ARMS as STUDY_ARMS
from experiments.runner import machine, restart_pinned, run_figures
from pipeline.evaluate import paired_difference
from pipeline.rundir import Manifest, read_json, round_of, write_json_atomic

FIGURES = Path("docs/experiments/smollm2-control")
ARMS = ("verifier", "implicit-prime")
NOISE = "round-noise.json"  # round_noise.py's --out: every policy's per-problem values on the 400 problems
METRICS = ("greedy", "pass@1", "maj@4")


def keep(runs_dir: Path, tracking_uri: str, commit: str, figures: Path = FIGURES) -> list[Path]:
    """Each arm's figures in `figures`/<arm>.json: its rounds' metrics and per-problem eval values (the pipeline's
    run directory), its wall time and each RL round's GRPO `train_runtime` (its MLflow runs)."""
    from mlflow import MlflowClient

    client, records, where = MlflowClient(tracking_uri), {}, machine()
    for arm in ARMS:  # every arm read before any file is written: a missing one leaves the kept files as they were
        run = runs_dir / arm
        if not (run / "manifest.json").exists():
            raise SystemExit(f"{run}: no run directory of the `{arm}` arm (no manifest.json); run it first")
        ids = Manifest.load(run).data["mlflow"]
        parent = client.get_run(ids["parent"]).info
        if parent.end_time is None:
            raise SystemExit(f"{run}: its MLflow run {ids['parent']} has not ended; finish the arm first")
        try:
            figures_of_run = run_figures(run, tracking_uri)  # its GRPO runtimes from the same MLflow runs
        except ValueError as e:
            raise SystemExit(str(e)) from None
        records[arm] = {"arm": arm, "overrides": STUDY_ARMS[arm], "commit": commit, "date": time.strftime("%Y-%m-%d"),
                        "machine": where, "seconds": (parent.end_time - parent.start_time) / 1000,
                        "grpo_seconds": {}, **figures_of_run}
    return [write_json_atomic(figures / f"{arm}.json", record) for arm, record in records.items()]


def policy(path: str) -> tuple[str, int]:
    """(arm, round) of a policy's path, <runs>/<arm>/round-RRR/policy."""
    return Path(path).parts[-3], round_of(Path(path).parent)


def label(key: tuple[str, int]) -> str:
    """'round 0' (both arms start there), or '`<arm>` round R'."""
    return "round 0" if not key[1] else f"`{key[0]}` round {key[1]}"


def gap(before: list[float], after: list[float]) -> str:
    """'+mean ± SE SE (z SE)': a paired difference per problem."""
    mean, se = paired_difference(before, after)
    return f"{mean:+.3f} ± {se:.3f} SE" + (f" ({mean / se:+.1f} SE)" if se else "")


def kept_files(figures: Path = FIGURES) -> tuple[dict[str, dict], dict | None]:
    """The arms' kept files (arm -> its record) and round_noise.py's (None before it ran)."""
    arms = {arm: read_json(p) for arm in ARMS if (p := ROOT / figures / f"{arm}.json").exists()}
    return arms, read_json(ROOT / figures / NOISE) if (ROOT / figures / NOISE).exists() else None


def section(figures: Path = FIGURES) -> list[str]:
    """The region's lines: each arm's rounds on the held-out problems, and the paired gaps on round_noise.py's."""
    kept, noise = kept_files(figures)
    if not kept or noise is None:
        return ["Not measured yet."]
    commits, machines = sorted({k["commit"] for k in kept.values()}), sorted({k["machine"] for k in kept.values()})
    rows, first = [], next(iter(kept.values()))
    pp = first.get("per_problem", {}).get("0", {})
    problems = f" {len(pp['greedy'])}" if "greedy" in pp else ""  # per problem, where the arm kept them
    samples = max(int(k.split("@")[1]) for k in first["rounds"]["0"] if k.startswith("eval/maj@"))
    for arm, k in kept.items():
        for r, m in sorted(k["rounds"].items(), key=lambda x: int(x[0])):
            seconds, base = k["grpo_seconds"].get(r), kept.get("verifier", {}).get("grpo_seconds", {}).get(r)
            ratio = f" ({seconds / base:.2f}x the verifier's)" if seconds and base and arm != "verifier" else ""
            rows.append([f"`{arm}`", r, *(f"{m[f'eval/{x}']:.3f}" for x in METRICS),
                         f"{seconds:.0f}{ratio}" if seconds else ""])
    lines = [f"Runs from {', '.join(f'`{c}`' for c in commits)} on {'; '.join(machines)}; wall time "
             + ", ".join(f"`{arm}` {k['seconds'] / 60:.1f} min" for arm, k in kept.items())
             + " (the verifier's includes round 0's SFT, which the other arm reuses). Overrides of "
             "configs/smollm2-arith.yaml: " + "; ".join(f"`{arm}`: " + " ".join(f"`{o}`" for o in k["overrides"])
                                                       for arm, k in kept.items()) + ".", "",
             f"Each round on the{problems} held-out problems (the pipeline's own evaluation: greedy, and {samples} "
             "samples at the config's temperature), with the GRPO phase's `train_runtime`:", "",
             table(["arm", "round", "greedy", "Pass@1", "Maj@4", "GRPO seconds"], rows), ""]
    seed = sorted(noise["per_problem"], key=int)[0]
    values = {policy(p): noise["per_problem"][seed][n] for n, p in noise["policies"].items()}
    later = sorted((k for k in values if k[1]), key=lambda k: (k[0] != "verifier", k))
    base = next(k for k in values if not k[1])
    # Each policy against round 0, and each learned arm against the verifier at the same round: all paired.
    pairs = [(base, k) for k in later] + [(("verifier", r), (arm, r)) for arm, r in later
                                         if arm != "verifier" and ("verifier", r) in values]
    lines += [f"`{noise['command']}`: {noise['problems']} problems ({noise['fresh']} in neither split), greedy and "
              f"{noise['samples']} samples at T = {noise['temperature']}, `--seeds {seed}` (added to the run's seed); each "
              "difference per problem, mean ± paired SE:", "",
              table(["difference", "greedy", "Pass@1", "Maj@4"],
                    [[f"{label(b)} - {label(a)}", *(gap(values[a][x], values[b][x]) for x in METRICS)]
                     for a, b in pairs])]
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs_dir", type=Path, help="the runs directory holding the two arms' run directories")
    ap.add_argument("--tracking-uri", required=True, help="the MLflow store the arms logged to")
    ap.add_argument("--commit", required=True, help="the commit the arms ran from")
    ap.add_argument("--figures", type=Path, default=FIGURES)
    a = ap.parse_args(argv)
    for path in keep(a.runs_dir, a.tracking_uri, a.commit, a.figures):
        print(f"kept {path}")
    print("\n".join(section(a.figures)))


if __name__ == "__main__":
    restart_pinned("experiments.smollm2_control", sys.argv[1:])
    main()
