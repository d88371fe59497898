"""The whole loop on two Ray nodes against one process: every phase of round 0 and round 1 (SFT, GRPO in hybrid mode:
the outcome and the process terms, collection, the RM phase, eval), compared phase by phase (issue 56).

A two-node Ray cluster on this machine (Ray's `cluster_utils.Cluster`, one CPU a node, as the tests make it; all of
Ray's state in a temp dir of its own). The mini config, 1 RL round, `supervision.mode: hybrid`, run twice by `igrpo
run`: in one process, and with `launcher.kind: ray` (SFT, GRPO and the RM phase as 2-worker Ray Train jobs, a worker a
node) and collection and eval as Ray tasks over both nodes. The Ray run's per-device batches are halved, so both runs
take the same global batches (2 workers x half = 1 process x all).

What is compared, and how closely (stated, not assumed equal): round 0's SFT loss within 1% (each worker's loss is
the mean over its own half's tokens and DDP averages the two, where one process takes the mean over all: 0.08% apart
at 2026-12-06, Intel Xeon), so the two SFT policies differ slightly and round 0's samples are another draw; the
shard's rows are counted identical or not (same prompts, same seeds), its size must match; the RM metrics within
0.01; eval's accuracies, Pass@K, Maj@K and best-of-N exactly (its timing aside). Round 1's GRPO samples each
worker's completions from that worker's random stream (TRL seeds the ranks alike, but a rank samples its own half),
so round 1 is printed beside the one-process run, not compared (tests/test_launcher.py checks a GRPO step on fixed
completions: the same advantages, loss and gradient on 2 Ray workers as on one process).

  python -m bench.ray_loop          # about 3 minutes on 2 cores; exits 1 past a tolerance
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
NODE = {"num_cpus": 1, "object_store_memory": 80 * 2**20}
COMMON = ["--set", "run.rounds=1", "--set", "supervision.mode=hybrid"]
# The mini config's per-device batches (configs/mini.yaml), halved for 2 workers.
HALVED = ["--set", "bootstrap.sft_args.per_device_train_batch_size=16", "--set", "grpo.per_device_train_batch_size=4",
          "--set", "reward_model.train_args.per_device_train_batch_size=4"]


def run(folder: Path, extra: list[str]) -> float:
    folder.mkdir(parents=True)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(ROOT / "configs" / "mini.yaml"), *COMMON,
                           *extra], cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode:
        raise SystemExit(f"igrpo run in {folder.name} failed (exit {done.returncode}):\n{done.stdout[-4000:]}")
    return time.perf_counter() - start


def phases(folder: Path) -> dict:
    return json.loads((folder / "runs" / "mini" / "manifest.json").read_text())["phases"]


def shard(folder: Path, r: int) -> list[dict]:
    rows = pq.read_table(folder / "runs" / "mini" / f"round-{r:03d}" / "samples.parquet").to_pylist()
    return [{k: v for k, v in row.items() if k != "policy"} for row in rows]  # the policy's path differs


def main() -> None:
    from ray.cluster_utils import Cluster

    work = Path(tempfile.mkdtemp(prefix="igrpo-ray-loop-", dir="/tmp"))  # Ray's socket paths: short
    os.environ["RAY_TMPDIR"] = str(work)  # the cluster's address file too
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False,
                                                            "temp_dir": str(work / "ray")})
    try:
        cluster.add_node(**NODE)
        cluster.wait_for_nodes()
        ray = ["launcher.kind=ray", f"launcher.ray_address={cluster.address}", "collect.workers=2",
               "collect.task_runner=ray", f"collect.ray_address={cluster.address}"]
        one_s = run(work / "one", [])
        two_s = run(work / "two", [*HALVED, *[a for kv in ray for a in ("--set", kv)]])
        one, two = phases(work / "one"), phases(work / "two")
        failures = []

        def close(key: str, metric: str, tol: float) -> None:
            a, b = one[key]["metrics"][metric], two[key]["metrics"][metric]
            same = a == b or (a == a and b == b and abs(a - b) <= tol) or (a != a and b != b)  # nan == nan here
            print(f"{key:<28} {metric:<26} one {a:.6f}  two Ray nodes {b:.6f}  {'ok' if same else 'DIFFERS'}")
            if not same:
                failures.append(f"{key} {metric}")

        loss = one["round-000/policy"]["metrics"]["sft/train_loss"]
        close("round-000/policy", "sft/train_loss", 0.01 * loss)
        rows_one, rows_two = shard(work / "one", 0), shard(work / "two", 0)
        same = sum(a == b for a, b in zip(rows_one, rows_two))
        print(f"round-000/collect            the shard: {len(rows_two)} rows against {len(rows_one)}, {same} identical")
        failures += [] if len(rows_one) == len(rows_two) else ["round-000/collect shard size"]
        for metric in sorted(one["round-000/reward_model"]["metrics"]):
            close("round-000/reward_model", metric, 0.01)
        for metric in sorted(one["round-000/eval"]["metrics"]):
            if not metric.endswith("_per_s"):  # a speed, not a figure
                close("round-000/eval", metric, 0.01 if metric.startswith("monitor/") else 0.0)
        for key in ("round-001/policy", "round-001/eval"):
            shown = {m: (one[key]["metrics"][m], two[key]["metrics"].get(m)) for m in sorted(one[key]["metrics"])
                     if m.startswith(("policy/reward", "eval/maj", "eval/greedy"))}
            print(f"{key:<28} (another draw) " + "  ".join(f"{m} {a:.3f} / {b:.3f}" for m, (a, b) in shown.items()))
        print(f"wall time: one process {one_s:.0f} s, two Ray nodes {two_s:.0f} s (ratio {two_s / one_s:.1f}; one "
              f"machine's 2 cores: no speed-up is expected), load average now {os.getloadavg()[0]:.1f}")
        if failures:
            raise SystemExit(f"the two Ray nodes differ from one process: {', '.join(failures)}")
    finally:
        cluster.shutdown()  # each node's processes, by their pids
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
