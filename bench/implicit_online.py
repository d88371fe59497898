"""What PRIME's credit costs a GRPO step against the verifier's (issue 58, point 3: goal <= 1.3x), and what the
online update of the implicit PRM costs on its own (`reward_model.implicit.online_lr`; PRIME reports +28%).

Arms, each a GRPO phase of `--steps` steps from the same SFT'd policy, with an implicit PRM that starts as its copy:
  outcome   the verifier's outcome advantages (supervision.mode: outcome), the baseline
  implicit  process mode from the implicit PRM's step values, no online update
  online    the same with PRIME's online update (implicit.online_lr)
  prime     PRIME's credit: process_reward: prime, with the online update
Each arm runs `--repeats` times, the arms interleaved (each repeat starts with the next arm); a run's figure is its
median step time after the first step. Prints each arm's ratio to outcome mode, and online's to implicit, repeat by
repeat: median (min-max). The reward models run in `reward_model.dtype` (`--set reward_model.dtype=auto`: bf16
where the CPU has AMX or AVX512-BF16), as the policy phase runs them.
  Run: python -m bench.implicit_online                        # configs/mini.yaml's sizes, about a minute
       python -m bench.implicit_online --config configs/quickstart.yaml --steps 8 --set reward_model.dtype=auto
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from bench._common import StepTimes, bootstrapped_policy, mini_config, mini_policy, spread
from models import load_policy
from pipeline.loading import config_from_dict, load_config
from pipeline.policy import run_policy_phase
from pipeline.problems import problem_set_from_config
from pipeline.rm_kinds.loading import save_reward_model

PROCESS = ["supervision.mode=process", "supervision.process_reward_model=implicit"]
ARMS = {  # arm -> its config overrides
    "outcome": ["supervision.mode=outcome", "reward_model.implicit.online_lr=null"],
    "implicit": [*PROCESS, "reward_model.implicit.online_lr=null"],
    "online": PROCESS,
    "prime": [*PROCESS, "supervision.process_reward=prime"],
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6, help="GRPO steps of each run (the first is left out)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each arm, interleaved (default 3)")
    ap.add_argument("--online-lr", type=float, default=1e-6, help="implicit.online_lr of the online and prime arms")
    ap.add_argument("--config", help="run config (default: configs/mini.yaml, its policy SFT'd once and cached)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        common = [f"grpo.max_steps={a.steps}", "reward_model.kinds=[implicit]", "collect.rollouts_per_step=0",
                  f"reward_model.implicit.online_lr={a.online_lr}", *a.set]

        def config(extra: list[str]):
            if a.config:
                return load_config(a.config, [*common, *extra])
            return config_from_dict(mini_config(Path(tmp)), [*common, *extra])

        cfg = config(ARMS["prime"])
        policy = bootstrapped_policy(cfg) if a.config else mini_policy(tmp)
        model, tok = load_policy(str(policy))  # the implicit PRM as it starts: a copy of its reference
        prm = save_reward_model(model, tok, Path(tmp) / "implicit", "implicit",
                                meta={"reference": str(policy.resolve()), "beta": cfg.reward_model.implicit.beta})
        times: dict[str, list[float]] = {arm: [] for arm in ARMS}
        arms = list(ARMS)
        for r in range(a.repeats):
            for arm in arms[r % len(arms):] + arms[: r % len(arms)]:  # each repeat starts with the next arm
                run_cfg, timer = config(ARMS[arm]), StepTimes()
                run_policy_phase(run_cfg, problem_set_from_config(run_cfg), policy, Path(tmp) / f"out-{arm}-{r}", 1,
                                 {"implicit": str(prm)}, callbacks=[timer])
                times[arm].append(statistics.median(timer.seconds[1:]))
                print(f"repeat {r + 1}  {arm:<8} median step {times[arm][-1] * 1000:8.1f} ms", flush=True)
    report(times, a, cfg)


def report(times: dict[str, list[float]], a, cfg) -> None:
    """Each arm's median step and its ratio to outcome mode in the same repeat, median (min-max) over repeats."""
    print(f"\n{a.repeats} runs of each arm, interleaved, each {a.steps - 1} timed steps; ratios in the same repeat")
    goals = {"prime": "  (goal <= 1.3: issue 58)"}
    for arm in ARMS:
        ratios = [t / b for t, b in zip(times[arm], times["outcome"])]
        print(f"{arm:<8}: {statistics.median(times[arm]) * 1000:8.1f} ms/step   /outcome = {spread(ratios)}"
              f"{goals.get(arm, '')}")
    ratios = [t / b for t, b in zip(times["online"], times["implicit"])]
    print(f"the online update alone: online/implicit = {spread(ratios)}  (PRIME reports 1.28)")
    print(f"model: {cfg.policy.model}, reward_model.dtype: {cfg.reward_model.dtype}, policy.dtype: "
          f"{cfg.policy.dtype}, grpo batch: {cfg.grpo.get('per_device_train_batch_size')}, "
          f"torch threads: {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
