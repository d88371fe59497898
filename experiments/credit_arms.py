"""The credit study's arms: each one's `--set` overrides of its task's config (experiments/credit_study.py runs them
on the tiny model's tasks, experiments/smollm2_control.py two of them on SmolLM2), and the overrides that give the
verifier arm the GRPO wall-clock of a costlier arm, from the runtimes its kept unit files record."""
from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from pathlib import Path

from pipeline.rundir import read_json

# PAV's form: the outcome advantage plus the progress of the token's own step, unnormalised (REFERENCE.md).
PROGRESS = ["supervision.mode=hybrid", "supervision.process_reward=progress", "supervision.process_credit=step"]
MC = ["reward_model.oracle=mc", "reward_model.mc_rollouts=4"]  # VinePPO's values: K rollouts of the policy a prefix
MATCHED = "verifier-matched"  # the equal-compute control (its arm below)
ARMS = {
    "verifier": ["supervision.mode=outcome"],
    "oracle": ["supervision.mode=process", "reward_model.oracle=gold"],
    "oracle-progress": ["reward_model.oracle=gold", *PROGRESS],
    # Hybrid: PAV's form with VinePPO's values, TRL's group-normalised outcome advantage plus each step's MC progress.
    "mc-progress": [*MC, *PROGRESS],
    # mc-progress at the verifier's GRPO wall-clock (issue 47, point 5). Its steps were set from GRPO phases'
    # `train_runtime`s that no kept file holds: issue 47's units (docs/experiments/study47/quickstart/) keep each
    # unit's whole wall time (`seconds`), not its GRPO phase's. Units kept since record it (`grpo_seconds`,
    # experiments/runner.py `run_figures`), and `verifier_matched` sets an equal-wall-clock arm from them.
    "mc-progress-wc": [*MC, *PROGRESS, "grpo.max_steps=22", "supervision.prompts_per_round=176"],
    # VinePPO as VinePPO defines it (arXiv 2410.01679): the MC advantage alone. Every token of step k gets
    # V_k - V_(k-1), from the prompt's value (the leave-one-out mean of the group's other outcomes: an MC estimate of
    # the empty prefix by the same policy) to the verifier's outcome after the last step; no outcome term, nothing
    # normalised (tests/test_online_mc.py's worked example).
    "vineppo": [*MC, "supervision.mode=process", "supervision.process_reward=progress",
                "supervision.process_credit=step"],
    "prm-progress": PROGRESS,
    "implicit": ["supervision.mode=hybrid", "reward_model.kinds=[implicit]", "supervision.process_reward_model=implicit",
                 "collect.rollouts_per_step=0"],
    # PRIME's online lr is 1e-6 for 7B models; the tiny RM trains offline at 3e-4: 1e-5 sits between, untuned.
    "implicit-prime": ["supervision.mode=process", "reward_model.kinds=[implicit]",
                       "supervision.process_reward_model=implicit", "supervision.process_reward=prime",
                       "reward_model.implicit.online_lr=1e-5", "collect.rollouts_per_step=0"],
    "labeltoken-progress": ["reward_model.head=label_tokens", *PROGRESS],
    # The verifier given the GRPO wall-clock of the costliest other arm of its seed: its steps are set when it runs,
    # from that seed's kept unit files (`verifier_matched`), so it runs after them.
    MATCHED: ["supervision.mode=outcome"],
}


def compute_matched(verifier_seconds: float, arm_seconds: float, steps: int, prompts_per_step: int) -> list[str]:
    """The `--set` overrides that give the verifier arm the GRPO wall-clock of another arm: its GRPO steps a round
    scaled by the ratio of the arm's GRPO `train_runtime` to the verifier's (rounded, at least 1), and the round's
    prompts with them, so that every step still draws prompts of its own.

    Worked example: the quickstart's 80 steps of 8 prompts; the verifier's GRPO phase 44.5 s a round, the arm's 165 s:
    165 / 44.5 = 3.708 the verifier's, so 80 * 3.708 = 296.6 -> 297 steps, 297 * 8 = 2376 prompts.

    >>> compute_matched(44.5, 165.0, 80, 8)
    ['grpo.max_steps=297', 'supervision.prompts_per_round=2376']

    Args:
        verifier_seconds: the verifier arm's GRPO seconds a round (`kept_grpo_seconds`).
        arm_seconds: the costlier arm's, on the same machine.
        steps: the verifier's `grpo.max_steps` a round.
        prompts_per_step: the prompts one GRPO step trains on (the batch's completions / `grpo.num_generations`).

    Raises:
        ValueError: a runtime that is not positive, or steps or prompts per step below 1.
    """
    if not (verifier_seconds > 0 and arm_seconds > 0):
        raise ValueError(f"GRPO runtimes must be positive, got the verifier's {verifier_seconds} and the arm's "
                         f"{arm_seconds}")
    if steps < 1 or prompts_per_step < 1:
        raise ValueError(f"steps and prompts_per_step must be >= 1, got {steps} and {prompts_per_step}")
    matched = max(1, round(steps * arm_seconds / verifier_seconds))
    return [f"grpo.max_steps={matched}", f"supervision.prompts_per_round={matched * prompts_per_step}"]


def unit_files(figures: Path, arm: str, seed: int | None = None) -> list[Path]:
    """An arm's kept unit files in `figures`: `<arm>-s<seed>.json` (not a longer arm's, `<arm>-wc-s0.json`), of
    every seed or of `seed`."""
    unit = re.compile(re.escape(arm) + "-s" + (str(seed) if seed is not None else r"\d+"))
    return sorted(p for p in Path(figures).glob("*.json") if unit.fullmatch(p.stem))


def kept_grpo_seconds(paths: Iterable[Path]) -> float:
    """An arm's GRPO seconds a round, from its kept unit files: each unit's mean over its RL rounds of `grpo_seconds`
    (each round's GRPO `train_runtime`, recorded by experiments/runner.py `run_figures`), the median over the units.

    Raises:
        ValueError: no file, or a file that kept no GRPO runtime (named).
    """
    means = []
    for path in paths:
        seconds = read_json(path).get("grpo_seconds")
        if not seconds:
            raise ValueError(f"{path}: no `grpo_seconds` kept (each RL round's GRPO train_runtime); units recorded "
                             "before experiments/runner.py kept them cannot set an equal-wall-clock arm")
        means.append(statistics.mean(seconds.values()))
    if not means:
        raise ValueError("no kept unit file to read GRPO runtimes from")
    return statistics.median(means)


def verifier_matched(figures: Path, arms: Iterable[str], steps: int, prompts_per_step: int,
                     seed: int | None = None) -> list[str]:
    """The verifier arm given the GRPO wall-clock of the costliest of `arms`: `ARMS["verifier"]` and
    `compute_matched`'s overrides, the runtimes read from the units kept in `figures` (`kept_grpo_seconds`), of
    every seed or of `seed` alone (a seed's arms against its own verifier: the pairs the study compares)."""
    costliest = max(kept_grpo_seconds(unit_files(figures, arm, seed)) for arm in arms)
    return [*ARMS["verifier"], *compute_matched(kept_grpo_seconds(unit_files(figures, "verifier", seed)), costliest,
                                                steps, prompts_per_step)]
