"""What PRIME's online update of the implicit PRM costs a GRPO step (`reward_model.implicit.online_lr`; PRIME
reports +28%): the median GRPO step time in process mode from an implicit PRM, with and without the update, on a
policy of configs/mini.yaml's size (SFT'd once, cached) and an implicit PRM that starts as its copy.
Run: python -m bench.implicit_online [--steps 6]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench._common import StepTimes, mini_config, mini_policy, table
from models import load_policy
from pipeline.loading import config_from_dict
from pipeline.policy import run_policy_phase
from pipeline.problems import problem_set_from_config
from pipeline.rm_kinds.loading import save_reward_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6, help="GRPO steps of each setting (the first is left out)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        policy = mini_policy(tmp)
        model, tok = load_policy(str(policy))  # the implicit PRM as it starts: a copy of its reference
        prm = save_reward_model(model, tok, Path(tmp) / "implicit", "implicit",
                                meta={"reference": str(policy.resolve()), "beta": 0.05})
        rows = []
        for lr in (None, 1e-6):
            cfg = config_from_dict(mini_config(Path(tmp)), [
                f"grpo.max_steps={a.steps}", "reward_model.kinds=[implicit]",
                f"reward_model.implicit.online_lr={'null' if lr is None else lr}",
                "supervision.process_reward_model=implicit", "collect.rollouts_per_step=0"])
            times = StepTimes()
            run_policy_phase(cfg, problem_set_from_config(cfg), policy, Path(tmp) / f"out-{lr}", 1,
                             {"implicit": str(prm)}, callbacks=[times])
            rows.append((lr, statistics.median(times.seconds[1:])))
        print(table(["implicit.online_lr", "median GRPO step (s)"], [[str(lr), f"{s:.3f}"] for lr, s in rows]))
        print(f"\nwith the online update / without: {rows[1][1] / rows[0][1]:.3f}")


if __name__ == "__main__":
    main()
