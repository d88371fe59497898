"""The spread over seeds, the decision rule, and the figures' accessors: pure functions of lists of numbers and of
the kept figures (`data`: arm -> seed -> round -> metric, experiments/report.py's `gather`). experiments/report.py
re-exports them, and the verdicts (experiments/verdicts.py) read them, so neither imports the other's users.
"""

from __future__ import annotations

import math
import statistics

# --- spreads and the decision rule: pure functions of lists of numbers -------------------------------


def mean_se(xs: list[float]) -> tuple[float, float]:
    """The mean of `xs` (per-seed figures) and its standard error, SD / sqrt(n) (nan for one value: no spread to
    read). Per problem, paired: `pipeline.evaluate.paired_difference`.

    >>> mean_se([0.01, 0.03, 0.02])  # SD 0.01, SE 0.01 / sqrt(3)
    (0.02, 0.005773502691896258)
    """
    n = len(xs)
    return statistics.mean(xs), statistics.stdev(xs) / n ** 0.5 if n > 1 else float("nan")


def seeds_needed(n: int) -> int:
    """At or above the verifier in how many of n seeds the rule asks: all but one from 5 seeds, every one below."""
    return n - 1 if n >= 5 else n


MIN_SEEDS = 3  # the rule is set for 3 or 5 seeds: below 3 it gives no verdict (two equal gaps have an SE of 0)


def pays(gaps: list[float]) -> bool:
    """`RULE`: the per-seed gaps to the verifier have a mean above 0 by at least 2 SE, and enough seeds are >= 0.

    >>> pays([0.02, 0.03, 0.01, 0.02, -0.001])  # mean 0.016, SE 0.005: 3.0 SE; 4 of 5 at or above
    True
    >>> pays([0.005, 0.003, 0.008])  # 3.7 SE, and all 3 seeds at or above
    True
    >>> pays([0.02, 0.03, -0.001])  # 3 seeds, one below
    False
    """
    if len(gaps) < MIN_SEEDS:
        return False
    mean, se = mean_se(gaps)
    return mean > 0 and mean >= 2 * se and sum(g >= 0 for g in gaps) >= seeds_needed(len(gaps))


def verdict(gaps: list[float]) -> str:
    """The rule's word for an arm's per-seed gaps: none below 3 seeds, where the rule is not defined.

    >>> verdict([0.003, 0.003]), verdict([0.005, 0.003, 0.008]), verdict([0.02, 0.03, -0.001])
    ('no verdict (2 seeds)', 'pays', 'does not pay')
    """
    if len(gaps) < MIN_SEEDS:
        return f"no verdict ({len(gaps)} seed{'' if len(gaps) == 1 else 's'})"
    return "pays" if pays(gaps) else "does not pay"


def one_sided_p(z: float) -> float:
    """P(Z >= z) for a standard normal Z: the one-sided p-value of a gap `z` SEs above 0 (many paired items).

    >>> round(one_sided_p(2.0), 5)  # the 2 SE of the rules here, as a level: alpha = 0.02275
    0.02275
    """
    return 0.5 * math.erfc(z / math.sqrt(2))


def holm(pvalues: list[float], alpha: float) -> list[bool]:
    """Holm's step-down procedure (REFERENCE.md, "Deciding among several arms"): which of m one-sided tests pass
    with the family's error held at `alpha`. Going up from the smallest p, the i-th (0-based) passes while
    p <= alpha / (m - i); at the first failure it and every larger p fail. Ties keep their order; a NaN p sorts last
    and fails.

    >>> holm([0.004, 0.014, 0.016, 0.034, 0.12, 0.3], 0.05)  # REFERENCE's example: 0.014 > 0.05 / 5 stops it
    [True, False, False, False, False, False]
    >>> holm([0.02, 0.001], 0.05)  # 0.001 <= 0.025 passes, then 0.02 <= 0.05
    [True, True]
    """
    passed, m = [False] * len(pvalues), len(pvalues)
    for i, j in enumerate(sorted(range(m), key=lambda j: math.inf if math.isnan(pvalues[j]) else pvalues[j])):
        if not pvalues[j] <= alpha / (m - i):
            break
        passed[j] = True
    return passed


def fmt_se(xs: list[float]) -> str:
    """'+mean ± SE SE' of per-seed gaps ('+mean' for one seed, '-' for none)."""
    if not xs:
        return "-"
    mean, se = mean_se(xs)
    return f"{mean:+.3f}" + (f" ± {se:.3f} SE" if len(xs) > 1 else "")


# --- the figures: arm -> seed -> round -> metric ----------------------------------------------------


def values(data: dict, arm: str, r: int, key: str) -> list[float]:
    return [m[r][key] for m in data.get(arm, {}).values() if r in m and key in m[r] and m[r][key] == m[r][key]]


def at(data: dict, arm: str, seed: int, r: int, key: str) -> float | None:
    return data.get(arm, {}).get(seed, {}).get(r, {}).get(key)


def fmt(xs: list[float], seeds: int) -> str:
    """'mean ± sample std SD' over seeds, '(n=k)' when fewer seeds than planned finished; '-' when none."""
    if not xs:
        return "-"
    text = f"{statistics.mean(xs):.3f}" + (f" ± {statistics.stdev(xs):.3f} SD" if len(xs) > 1 else "")
    return text + (f" (n={len(xs)})" if len(xs) < seeds else "")


def gains(data: dict, arm: str, last: int, key: str) -> list[float]:
    """Per-seed change of `key` from round 0 to round `last` (then averaged: a paired comparison)."""
    return [m[last][key] - m[0][key] for m in data.get(arm, {}).values()
            if 0 in m and last in m and key in m[0] and key in m[last]]


def paired(data: dict, arm: str, base: str, r: int, key: str) -> list[float]:
    """Per-seed differences `arm - base` of `key` at round r, over the seeds both finished."""
    return [m[r][key] - data[base][s][r][key] for s, m in data.get(arm, {}).items()
            if r in m and key in m[r] and key in data.get(base, {}).get(s, {}).get(r, {})]
