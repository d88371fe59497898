"""The quickstart's wall time against an earlier commit's, on this machine, one run after the other; and whether
the two runs' figures are the same.

Minutes depend on the machine (and its kernels, AVX2 or AVX-512): whether the code got faster is a ratio of two
runs on one machine, as the other speed goals here are. This checks the baseline commit out (a temporary git
worktree), runs each tree's own `configs/quickstart.yaml` as a user would (`igrpo run`, each in a fresh runs
directory and MLflow store), alternating the order over repeats, and prints each wall time, the ratio, and, round
by round, whether the two runs' eval.json hold the same figures (every metric but the throughput), which a change
meant to keep behaviour must show. `--threads N` pins torch's threads (OMP_NUM_THREADS) in both: CPU training's
figures depend on the thread count. Issue 37's goal: a ratio of at most 0.45 against 15fbd1e.

  python -m bench.quickstart_time                                # HEAD against 15fbd1e, the whole quickstart each
  python -m bench.quickstart_time --threads 1                    # figures comparable bit for bit, slower
  python -m bench.quickstart_time --rounds 1 --policy PATH       # round 0 and one RL round from a trained SFT policy
  python -m bench.quickstart_time --baseline COMMIT --repeats 2  # order baseline, HEAD, HEAD, baseline
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
BASELINE = "15fbd1e"  # the code issue 37 was filed against: 23.8 min of run on an idle 2-core AVX2 machine
TIMING = ("eval/completions_per_s",)  # throughput: a time, not a figure of the policy


def cli_module(tree: Path) -> str:
    """The `igrpo` command's module in a tree: flows.cli since the orchestration redesign, pipeline.cli before."""
    return "flows.cli" if (tree / "flows" / "cli.py").exists() else "pipeline.cli"


def same_figures(run_a: Path, run_b: Path) -> list[str]:
    """One line per round of two run directories: 'same' where every eval.json metric but the throughput is equal,
    else the metrics that differ with both values."""
    import json

    lines = []
    for path in sorted(run_a.glob("round-*/eval.json")):
        other = run_b / path.parent.name / "eval.json"
        a = json.loads(path.read_text())["metrics"]
        b = json.loads(other.read_text())["metrics"] if other.exists() else {}
        keys = sorted((set(a) | set(b)) - set(TIMING))
        diff = [f"{k} {a.get(k)} / {b.get(k)}" for k in keys if a.get(k) != b.get(k)
                and not (a.get(k) != a.get(k) and b.get(k) != b.get(k))]  # NaN on both sides is the same
        lines.append(f"{path.parent.name}: " + ("same" if not diff else "differ: " + "; ".join(diff)))
    return lines


def run_quickstart(tree: Path, work: Path, label: str, overrides: list[str], threads: int | None = None) -> float:
    """Wall seconds of `igrpo run configs/quickstart.yaml` with `tree`'s code and config; its log in `work`."""
    cwd = work / label
    cwd.mkdir(parents=True)
    sets = [f"run.runs_dir={cwd / 'runs'}", f"tracking.tracking_uri=sqlite:///{cwd / 'mlflow.db'}", *overrides]
    cmd = [sys.executable, "-m", cli_module(tree), "run", str(tree / "configs" / "quickstart.yaml")]
    cmd += [x for s in sets for x in ("--set", s)]
    env = {**os.environ, "PYTHONPATH": str(tree), "TQDM_DISABLE": "1"}  # this tree's packages, not the installed ones
    if threads:
        env |= {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
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
    ap.add_argument("--threads", type=int, help="pin torch's threads in both runs (figures then compare exactly)")
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
                seconds = run_quickstart(tree, work, f"{which}-{i}", overrides, a.threads)
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
    print(f"ratio HEAD / baseline: {h / b:.3f} (issue 37's goal: <= 0.45 against 15fbd1e)")
    name = "quickstart"
    print("figures, round by round:", *same_figures(work / "baseline-0" / "runs" / name, work / "head-0" / "runs" / name),
          sep="\n  ")


if __name__ == "__main__":
    main()
