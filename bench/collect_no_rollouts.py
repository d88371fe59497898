"""What collecting without Monte-Carlo rollouts saves (`collect.rollouts_per_step: 0`, for the implicit PRM and the
ORM, which need no step labels): the collection phase's seconds with N rollouts per step and with none, on one
SFT'd policy of configs/mini.yaml's size (SFT about 20 s on 2 cores), the same prompts and samples.
Run: python -m bench.collect_no_rollouts [--prompts 16 --samples 4 --n 4 --repeats 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench._common import mini_config, mini_policy, table
from pipeline.collect import run_collection_phase
from pipeline.loading import config_from_dict
from pipeline.problems import problem_set_from_config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--n", type=int, default=4, help="rollouts per step of the run with rollouts")
    ap.add_argument("--repeats", type=int, default=2, help="timings of each setting (the fastest is reported)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        def cfg(n: int):
            return config_from_dict(mini_config(Path(tmp)), [
                f"collect.prompts_per_round={a.prompts}", f"collect.samples_per_prompt={a.samples}",
                f"collect.rollouts_per_step={n}", "collect.max_new_tokens=32", "reward_model.kinds=[implicit]",
                "supervision.process_reward_model=implicit"])

        policy = mini_policy(tmp)
        rows = []
        for n in (a.n, 0):
            c = cfg(n)
            seconds, figures = [], {}
            for _ in range(a.repeats):
                start = time.perf_counter()
                figures = run_collection_phase(c, problem_set_from_config(c), policy, c.run_dir, 0).metrics
                seconds.append(time.perf_counter() - start)
            rows.append((n, min(seconds), figures))  # the fastest: the machine is shared
        with_n, without = rows[0][1], rows[1][1]
        print(table(["rollouts_per_step", "seconds (fastest)", "rollouts", "steps per sample"],
                    [[str(n), f"{s:.2f}", f"{f['collect/rollouts']:.0f}", f"{f['collect/steps_per_sample']:.2f}"]
                     for n, s, f in rows]))
        print(f"\nwithout rollouts / with N={a.n}: {without / with_n:.3f} of the time ({with_n / without:.1f}x faster)")


if __name__ == "__main__":
    main()
