"""The quickstart's wall time against an earlier commit's, on this machine, one run after the other.

Minutes depend on the machine: the quickstart took 10 minutes where it was measured on 2026-11-30 (4f070ee, the
code issue 16 was filed against) and 13.5 on 2026-12-02's machine. Whether the code got slower is a ratio of two
runs on one machine, as the other speed goals here are: this checks the baseline commit out (a temporary git
worktree), runs each tree's own `configs/quickstart.yaml` as a user would (`igrpo run`, each in a fresh runs
directory and MLflow store), alternating the order over repeats, and prints each wall time and the ratio.
Issue 16's "no longer than 12 minutes (10 today)" is a ratio of at most 1.2 against that baseline.

  python bench/quickstart_time.py                                # HEAD against 4f070ee, the whole quickstart each
  python bench/quickstart_time.py --rounds 1 --policy PATH       # round 0 and one RL round from a trained SFT policy
  python bench/quickstart_time.py --baseline COMMIT --repeats 2  # order baseline, HEAD, HEAD, baseline
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "4f070ee"  # README of 2026-11-30: "10 of them the run"


def cli_module(tree: Path) -> str:
    """The `igrpo` command's module in a tree: flows.cli since the orchestration redesign, pipeline.cli before."""
    return "flows.cli" if (tree / "flows" / "cli.py").exists() else "pipeline.cli"


def run_quickstart(tree: Path, work: Path, label: str, overrides: list[str]) -> float:
    """Wall seconds of `igrpo run configs/quickstart.yaml` with `tree`'s code and config; its log in `work`."""
    cwd = work / label
    cwd.mkdir(parents=True)
    sets = [f"run.runs_dir={cwd / 'runs'}", f"tracking.tracking_uri=sqlite:///{cwd / 'mlflow.db'}", *overrides]
    cmd = [sys.executable, "-m", cli_module(tree), "run", str(tree / "configs" / "quickstart.yaml")]
    cmd += [x for s in sets for x in ("--set", s)]
    env = {**os.environ, "PYTHONPATH": str(tree), "TQDM_DISABLE": "1"}  # this tree's packages, not the installed ones
    start = time.perf_counter()
    with open(cwd / "log.txt", "w") as log:
        rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - start
    if rc:
        sys.exit(f"{label}: exit {rc}; see {cwd / 'log.txt'}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", default=BASELINE, help=f"commit to compare with (default {BASELINE})")
    ap.add_argument("--rounds", type=int, help="RL rounds (default: the quickstart's)")
    ap.add_argument("--policy", help="start both from this trained policy instead of SFT (bootstrap.sft=false)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per tree, the order alternating")
    ap.add_argument("--work", default="runs/quickstart-time", help="where the runs and their logs go")
    a = ap.parse_args()
    overrides = ([f"run.rounds={a.rounds}"] if a.rounds else []) + (
        [f"policy.model={Path(a.policy).resolve()}", "bootstrap.sft=false"] if a.policy else [])
    head = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    Path(a.work).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=a.work)).resolve()
    base_tree = work / "baseline-src"
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base_tree), a.baseline], cwd=ROOT, check=True)
    times: dict[str, list[float]] = {"baseline": [], "head": []}
    try:
        for i in range(a.repeats):
            order = ("baseline", "head") if i % 2 == 0 else ("head", "baseline")
            for which in order:
                tree = base_tree if which == "baseline" else ROOT
                seconds = run_quickstart(tree, work, f"{which}-{i}", overrides)
                times[which].append(seconds)
                print(f"[{time.strftime('%H:%M:%S')}] {which} ({a.baseline if which == 'baseline' else head}), "
                      f"run {i}: {seconds:.0f} s", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT)
    b, h = statistics.mean(times["baseline"]), statistics.mean(times["head"])
    print(f"\nquickstart{' ' + ' '.join(overrides) if overrides else ''}, {a.repeats} run(s) each, runs in {work}")
    print("| tree | commit | wall s (each) | mean s |\n|---|---|---|---|")
    print(f"| baseline | {a.baseline} | {' / '.join(f'{t:.0f}' for t in times['baseline'])} | {b:.0f} |")
    print(f"| HEAD | {head} | {' / '.join(f'{t:.0f}' for t in times['head'])} | {h:.0f} |")
    print(f"ratio HEAD / baseline: {h / b:.3f} (issue 16's goal: <= 1.2, 12 min where it took 10)")


if __name__ == "__main__":
    main()
