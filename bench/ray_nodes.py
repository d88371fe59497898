"""Collection on two Ray nodes against one worker: the same shard, and the time ratio (issue 48's figure).

A two-node Ray cluster on this machine (Ray's `cluster_utils.Cluster`: a head and an added node, one CPU each, as
the tests make it), the mini config's SFT policy (bench._common, cached), and the mini collection with more prompts:
each repeat collects once in this process (`collect.workers: 1`) and once over 2 Ray workers (`workers: 2,
task_runner: ray`), interleaved; the shards must be byte-equal. Also timed: a Ray job that generates 1 sequence of
1 token on both nodes (the fixed cost of a phase's Ray workers: the job's start, a worker process per node, the
policy loaded in each). Needs the `[ray]` extra; Prefect's ephemeral server starts by itself.

  python -m bench.ray_nodes                 # 1 repeat, 16 prompts
  python -m bench.ray_nodes --repeats 3 --prompts 32
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench._common import mini_config, mini_policy, spread
from pipeline.collect import run_collection_phase
from pipeline.fanout import open_sampler
from pipeline.loading import config_from_dict
from pipeline.problems import problem_set_from_config

NODE = {"num_cpus": 1, "object_store_memory": 80 * 2**20}


def collect(work: Path, policy: Path, prompts: int, **fanout) -> tuple[float, bytes]:
    """(seconds, the shard's bytes) of round 1's collection of `prompts` prompts with the policy at `policy`."""
    data = mini_config(work)
    data["collect"].update(prompts_per_round=prompts, samples_per_prompt=4, batch_size=8, **fanout)
    cfg = config_from_dict(data, check_trl=False)
    start = time.perf_counter()
    res = run_collection_phase(cfg, problem_set_from_config(cfg), policy, cfg.run_dir, 1)
    return time.perf_counter() - start, Path(res.shard_path).read_bytes()


def fixed_cost(policy: Path, address: str) -> float:
    """Seconds of a Ray job generating one 1-token sequence on each node: start, worker processes, model loads."""
    c = config_from_dict({"collect": {"workers": 2, "task_runner": "ray", "ray_address": address, "batch_size": 1,
                                      "max_new_tokens": 1}}, check_trl=False).collect
    start = time.perf_counter()
    with open_sampler(str(policy), c) as sample:
        sample(["1+1=", "2+2="], 1, seed=0)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=16, help="collect.prompts_per_round (4 samples each)")
    args = parser.parse_args()
    from ray.cluster_utils import Cluster

    work = Path(tempfile.mkdtemp(prefix="igrpo-ray-bench-", dir="/tmp"))  # Ray's socket paths: short
    os.environ["RAY_TMPDIR"] = str(work)  # the cluster's address file too, not under a /tmp/ray that may not exist
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False,
                                                            "temp_dir": str(work / "ray")})
    try:
        cluster.add_node(**NODE)
        cluster.wait_for_nodes()
        policy = mini_policy(work)
        print(f"load average {os.getloadavg()[0]:.1f} (2 cores)")
        ray = {"workers": 2, "task_runner": "ray", "ray_address": cluster.address}
        rows = []
        for r in range(args.repeats):
            one, shard_one = collect(work / f"one-{r}", policy, args.prompts)
            two, shard_two = collect(work / f"ray-{r}", policy, args.prompts, **ray)
            if shard_two != shard_one:
                raise SystemExit(f"repeat {r}: the 2-node shard differs from the 1-worker shard")
            rows.append((one, two))
            print(f"repeat {r}: 1 worker {one:.1f} s, 2 Ray nodes {two:.1f} s, ratio {two / one:.2f}, shards identical")
        fixed = [fixed_cost(policy, cluster.address) for _ in range(args.repeats)]
        print(f"2 Ray nodes / 1 worker: {spread([two / one for one, two in rows])} (median (min-max) of "
              f"{args.repeats}); a Ray job's fixed cost (start, 2 worker processes, 2 model loads): "
              f"{spread(fixed)} s; load average now {os.getloadavg()[0]:.1f}")
    finally:
        cluster.shutdown()  # each node's processes, by their pids
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
