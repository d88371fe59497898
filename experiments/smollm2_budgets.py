"""The real model's budgets (issue 58, point 5): SmolLM2 runs timed phase by phase, kept, and the learning check.

A run of configs/smollm2-arith.yaml (the verifier arm: `--set supervision.mode=outcome`) or of
configs/smollm2-gsm8k.yaml is timed by its MLflow runs (the pipeline's parent run and each phase's); `keep` writes
what is read, with the machine, the dtype the run resolved to (its MLflow params) and the commit, to
`docs/experiments/smollm2-budgets/<name>.json`; round_noise.py's file beside them (`round-noise.json`) holds the
learning check: round 2 against round 0 on 400 problems. The section of docs/results.md (`section`, written by
experiments/pages.py) is made from those files alone.

  igrpo run configs/smollm2-arith.yaml --set supervision.mode=outcome --set run.name=verifier-auto ...
  python -m experiments.round_noise RUNS/verifier-auto --rounds 0 2 --fresh 300 \\
      --out docs/experiments/smollm2-budgets/round-noise.json
  python -m experiments.smollm2_budgets RUNS/verifier-auto --name arith --config configs/smollm2-arith.yaml \\
      --tracking-uri URI --commit C [--set supervision.mode=outcome]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench._common import ROOT, table
from experiments.runner import machine, run_figures
from experiments.smollm2_control import gap
from pipeline.evaluate import paired_difference
from pipeline.rundir import Manifest, read_json, write_json_atomic

FIGURES = Path("docs/experiments/smollm2-budgets")
NOISE = "round-noise.json"
# The budgets, in minutes: the arithmetic run whole (SFT and 2 RL rounds), one GSM8K round.
GOALS = {"arith": ("the whole run (SFT and 2 RL rounds)", 12.0), "gsm8k": ("round 1 (GRPO, collection, RMs, eval)", 40.0)}
PHASES = ("policy", "collect", "reward_model", "eval")
STUDY = "smollm2-budgets"  # the section's markers in docs/results.md
MIN_SE = 2.0  # the learning check: round 2 above round 0 by at least this many paired SEs


def keep(run_dir: Path, tracking_uri: str, name: str, config: str, overrides: list[str], commit: str,
         figures: Path = FIGURES) -> Path:
    """`figures`/<name>.json: the run's wall time, each round's and each phase's (MLflow), its dtypes, its rounds'
    metrics (the run directory), the machine and the commit."""
    from mlflow import MlflowClient

    client, ids = MlflowClient(tracking_uri), Manifest.load(run_dir).data["mlflow"]
    parent = client.get_run(ids["parent"])
    if parent.info.end_time is None:
        raise SystemExit(f"{run_dir}: its MLflow run {ids['parent']} has not ended; finish the run first")

    def seconds(run_id: str) -> float:
        info = client.get_run(run_id).info
        return (info.end_time - info.start_time) / 1000

    phases: dict[str, dict[str, float]] = {}
    for key, rid in sorted(ids.items()):
        round_, _, phase = key.partition("/")
        if phase in PHASES:
            phases.setdefault(str(int(round_.removeprefix("round-"))), {})[phase] = seconds(rid)
    params = parent.data.params
    return write_json_atomic(figures / f"{name}.json", {
        "name": name, "config": config, "overrides": overrides, "commit": commit, "date": time.strftime("%Y-%m-%d"),
        "machine": machine(), "dtype": {"policy": params.get("igrpo.dtype"),
                                                   "reward_model": params.get("igrpo.reward_model.dtype")},
        "seconds": seconds(ids["parent"]), "phase_seconds": phases, **run_figures(run_dir, tracking_uri)})


def budget_rows(kept: dict[str, dict]) -> list[list[str]]:
    """One row a kept run: its time against its goal, its phases' times by round."""
    rows = []
    for name, k in kept.items():
        what, goal = GOALS[name]
        minutes = k["seconds"] / 60 if name == "arith" else sum(k["phase_seconds"]["1"].values()) / 60
        phases = "; ".join(f"round {r}: " + ", ".join(f"{p} {s:.0f} s" for p, s in by.items())
                           for r, by in sorted(k["phase_seconds"].items(), key=lambda x: int(x[0])))
        rows.append([f"`{k['config']}`", " ".join(f"`{o}`" for o in k["overrides"]) or "-", k["machine"],
                     f"{k['dtype']['policy']} / {k['dtype']['reward_model']}", what, f"{minutes:.1f} min",
                     f"<= {goal:g} min: {'met' if minutes <= goal else 'not met'}", phases, f"`{k['commit']}`"])
    return rows


def section(figures: Path = FIGURES) -> list[str]:
    """The region's lines: the kept runs' budgets, and the learning check from round_noise.py's file."""
    kept = {n: read_json(p) for n in GOALS if (p := ROOT / figures / f"{n}.json").exists()}
    if not kept:
        return ["Not measured yet."]
    lines = [table(["config", "overrides", "machine", "dtype (policy / RMs)", "timed", "time", "goal", "phases",
                    "commit"], budget_rows(kept)), ""]
    if (ROOT / figures / NOISE).exists():
        noise = read_json(ROOT / figures / NOISE)
        seed = sorted(noise["per_problem"], key=int)[0]
        by = {n: noise["per_problem"][seed][n] for n in noise["policies"]}
        checks = []
        for metric in ("greedy", "pass@1", f"maj@{noise['samples']}"):
            mean, se = paired_difference(by["round 0"][metric], by["round 2"][metric])
            checks.append(f"{metric} {gap(by['round 0'][metric], by['round 2'][metric])}: "
                          + ("met" if se and mean / se >= MIN_SE else "not met"))
        lines += [f"The learning check, `{noise['command']}`: round 2 - round 0 on {noise['problems']} problems "
                  f"({noise['fresh']} in neither split), {noise['samples']} samples at T = {noise['temperature']}, "
                  f"each per problem, mean ± paired SE; the goal, at least {MIN_SE:g} paired SE: " + "; ".join(checks)
                  + "."]
    return lines


def report(out: Path) -> None:
    """Write the section `smollm2-budgets` of the page `out` (docs/results.md) from the kept files."""
    from experiments.credit_study import region
    from experiments.report import STUDIES, study_markers, with_study

    assert STUDY in STUDIES  # the reports' in-place rebuilds keep it
    begin, end = study_markers(STUDY)
    block = [begin, "## The real model at this machine's speed (issue 58)", "",
             "SmolLM2-135M-Instruct's runs timed phase by phase (seconds of their MLflow runs), the machine and the "
             "dtype each resolved to beside them; made by experiments/smollm2_budgets.py from "
             f"[{FIGURES.as_posix()}/](experiments/smollm2-budgets/).", "", *region(STUDY, section()), end]
    text = out.read_text() if out.exists() else ""
    out.write_text(with_study(text, "\n".join(block), STUDY))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--name", choices=sorted(GOALS), required=True)
    ap.add_argument("--config", required=True, help="the config file the run was started with")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="the run's --set overrides")
    ap.add_argument("--tracking-uri", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--figures", type=Path, default=FIGURES)
    a = ap.parse_args(argv)
    print(f"kept {keep(a.run_dir, a.tracking_uri, a.name, a.config, a.overrides, a.commit, a.figures)}")
    print("\n".join(section(a.figures)))


if __name__ == "__main__":
    main()
