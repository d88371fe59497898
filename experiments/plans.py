"""A study's plan the code enforces, and its rule (issue 57, point 2): pure functions and git checks.

A plan (experiments/step_credit.py `load_plan` reads one) names a study's task, arms, seeds, primary metric and rule.
Here: its commit (`plan_commit`, the commit that added the file) and the checks of the units kept against it
(`check_units`: a recorded commit that descends from the plan's, an arm and a seed the plan names); the rule
(`decide`: a one-sided paired t over seeds, Holm's step-down correction over the plan's tested arms, and at or above
the verifier on enough seeds, REFERENCE.md "Deciding among several arms"); and each arm's share of the oracle's gain
with a paired bootstrap interval (`oracle_share`).
"""
from __future__ import annotations

import math
import random
import re
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from scipy import stats

from experiments.report import holm, mean_se

CONTROL = "verifier"  # every plan's control: the arm the others are decided against



class PlanError(ValueError):
    """A plan file that cannot be used: the message names the file and the field."""


@dataclass(frozen=True)
class Plan:
    """A study's plan (`load_plan`): the task as a config and overrides, the arms, seeds, primary metric and rule."""

    path: Path
    config: str
    overrides: tuple[str, ...]
    arms: tuple[str, ...]
    seeds: tuple[int, ...]
    metric: str
    round: int
    alpha: float
    min_seeds: int
    oracle: str | None
    task: str  # as the plan wrote it, for the report

    @property
    def tested(self) -> tuple[str, ...]:
        """The arms decided against the verifier: Holm's family."""
        return tuple(a for a in self.arms if a != CONTROL)




def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def plan_commit(path: str | Path) -> str:
    """The commit that first added the plan file at `path` (full hash); an error if it is not committed, or has
    changes not committed (the plan read would not be the plan committed)."""
    path = Path(path).resolve()
    log = _git(path.parent, "log", "--diff-filter=A", "--format=%H", "--follow", "--", path.name)
    if log.returncode or not log.stdout.strip():
        raise PlanError(f"{path}: the plan is not committed: commit it before the study's first unit")
    if _git(path.parent, "status", "--porcelain", "--", path.name).stdout.strip():
        raise PlanError(f"{path}: the plan has changes not committed: a plan does not change once committed")
    return log.stdout.split()[-1]  # newest first: the last is the first add


def plan_edits(path: str | Path) -> list[str]:
    """The commits that changed the plan file after the one that added it (`plan_commit`), newest first: a plan
    does not change once committed, so the report flags each."""
    path = Path(path).resolve()
    log = _git(path.parent, "log", "--format=%H", "--follow", "--", path.name).stdout.split()
    return log[: log.index(plan_commit(path))]


def descends(commit: str, ancestor: str, repo: Path) -> bool | None:
    """Whether `commit` descends from (or is) `ancestor` in the repository at `repo`; None: not a commit there."""
    if not all(re.fullmatch(r"[0-9a-f]{4,40}|HEAD", c) for c in (commit, ancestor)):  # never a git option
        return None
    rc = _git(repo, "merge-base", "--is-ancestor", ancestor, commit).returncode
    return {0: True, 1: False}.get(rc)


def recorded_commit(commit: str) -> tuple[str, bool]:
    """The commit hash in a unit's `git describe --always --dirty` record, and whether it ran from a dirty tree.

    >>> recorded_commit("8c19673-dirty"), recorded_commit("v1.2-3-gabc1234")
    (('8c19673', True), ('abc1234', False))
    """
    dirty = commit.endswith("-dirty")
    commit = commit.removesuffix("-dirty")
    return (m[1] if (m := re.fullmatch(r".+-\d+-g([0-9a-f]+)", commit)) else commit), dirty


def check_units(plan: Plan, units: dict[str, dict], where: str | Path) -> list[str]:
    """Refuse the kept `units` (name -> unit file, kept in `where`) the plan does not allow: a recorded commit that
    does not descend from the plan's (`plan_commit`), an arm or a seed the plan does not name (a seed's `sft` unit
    is every arm's). Raises `PlanError`, one sentence per refused unit file; returns the flags, one sentence per
    unit that ran from a tree with uncommitted changes (`-dirty`: the code may not be the commit's)."""
    start, repo = plan_commit(plan.path), plan.path.resolve().parent
    refused, flags = [], []
    for unit, kept in sorted(units.items()):
        file = f"{Path(where) / unit}.json"
        arm, _, seed = unit.rpartition("-s")
        commit, dirty = recorded_commit(str(kept.get("commit", "unknown")))
        if arm != "sft" and arm not in plan.arms:
            refused.append(f"{file}: arm {arm!r} is not in the plan {plan.path} ({', '.join(plan.arms)}).")
        elif not seed.isdigit() or int(seed) not in plan.seeds:
            refused.append(f"{file}: seed {seed!r} is not in the plan {plan.path} ({', '.join(map(str, plan.seeds))}).")
        elif (ok := descends(commit, start, repo)) is not True:
            why = ("is not a commit of this repository" if ok is None
                   else f"does not descend from the plan's {start[:12]}")
            refused.append(f"{file}: its commit {kept.get('commit')!r} {why} ({plan.path}).")
        elif dirty:
            flags.append(f"{file} ran from {commit} with uncommitted changes (`-dirty`).")
    if refused:
        raise PlanError("\n".join(refused))
    return flags


# --- the rule and the share of the oracle's gain: pure functions of per-seed gaps ---------------------


class Verdict(NamedTuple):
    """One arm by the plan's rule: its per-seed gaps (seed -> arm - verifier), their mean and SE, the one-sided paired
    t over seeds and its p, Holm's threshold at the arm's rank (1 = smallest p) and whether Holm passed it, the seeds
    at or above the verifier, and the verdict."""

    gaps: dict[int, float]
    mean: float
    se: float
    t: float
    p: float
    rank: int
    threshold: float
    holm: bool
    at_or_above: int
    pays: bool


def paired_t(gaps: list[float]) -> tuple[float, float]:
    """The one-sided paired t of per-seed gaps (mean / (SD / sqrt(n))) and its p, P(T >= t) with n - 1 df; (nan, nan)
    below 2 seeds; a gap with no spread: t = +-inf (p 0 or 1), or nan for gaps all 0.

    >>> [round(x, 4) for x in paired_t([0.04, 0.03, 0.05, 0.02, 0.06])]  # mean 0.04, SE 0.00707: t = 4 sqrt 2, 4 df
    [5.6569, 0.0024]
    """
    if len(gaps) < 2:
        return math.nan, math.nan
    mean, se = mean_se(gaps)
    t = mean / se if se > 0 else math.copysign(math.inf, mean) if mean else math.nan
    return t, float(stats.t.sf(t, len(gaps) - 1)) if not math.isnan(t) else math.nan


def decide(plan: Plan, gaps: dict[str, dict[int, float]]) -> dict[str, Verdict]:
    """The plan's rule on every arm of `plan.tested` (Holm's family, an arm without gaps included: it fails):
    `gaps` arm -> seed -> the arm's primary metric minus the verifier's on that seed. An arm pays when Holm's
    step-down procedure at `plan.alpha` passes its one-sided paired t and it is at or above the verifier on at least
    `plan.min_seeds` seeds."""
    if extra := sorted(set(gaps) - set(plan.tested)):
        raise ValueError(f"gaps of arms not tested by the plan {plan.path}: {', '.join(extra)}")
    arms = list(plan.tested)
    tests = {a: paired_t([g for _, g in sorted(gaps.get(a, {}).items())]) for a in arms}
    p = [tests[a][1] for a in arms]
    passed = holm(p, plan.alpha)
    order = sorted(range(len(arms)), key=lambda j: math.inf if math.isnan(p[j]) else p[j])  # as `holm` sorts
    out = {}
    for rank, j in enumerate(order):
        a, g = arms[j], dict(sorted(gaps.get(arms[j], {}).items()))
        mean, se = mean_se(list(g.values())) if g else (math.nan, math.nan)
        up = sum(x >= 0 for x in g.values())
        out[a] = Verdict(g, mean, se, tests[a][0], p[j], rank + 1, plan.alpha / (len(arms) - rank), passed[j], up,
                         passed[j] and up >= plan.min_seeds)
    return {a: out[a] for a in arms}


class Share(NamedTuple):
    """An arm's share of the oracle's gain: mean arm gap / mean oracle gap (nan where the oracle gains nothing), and
    its percentile interval at `level` from a paired bootstrap over seeds (-inf, inf: unbounded)."""

    share: float
    low: float
    high: float
    level: float


def oracle_share(arm_gaps: list[float], oracle_gaps: list[float], level: float = 0.95, resamples: int = 10_000,
                 seed: int = 0) -> Share:
    """Mean(arm_gaps) / mean(oracle_gaps), both to the verifier, seed by seed (paired: index i is one seed), with a
    paired bootstrap: seeds drawn with replacement, the two gaps of a seed together, `resamples` times
    (`random.Random(seed)`: deterministic). A resample whose oracle gain is <= 0 has no share; when more than the
    interval's tail, (1 - level) / 2, of them have none, the interval is unbounded; else the percentiles of the rest.

    >>> oracle_share([0.01, 0.03], [0.02, 0.02])  # resamples: 0.5 (1/4), 1.0 (1/2), 1.5 (1/4)
    Share(share=1.0, low=0.5, high=1.5, level=0.95)
    """
    if len(arm_gaps) != len(oracle_gaps) or not arm_gaps:
        raise ValueError(f"paired gaps expected, got {len(arm_gaps)} arm and {len(oracle_gaps)} oracle seeds")
    n, rng = len(arm_gaps), random.Random(seed)
    o = statistics.mean(oracle_gaps)
    share = statistics.mean(arm_gaps) / o if o > 0 else math.nan
    ratios = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        if (den := sum(oracle_gaps[i] for i in idx)) > 0:
            ratios.append(sum(arm_gaps[i] for i in idx) / den)
    tail = (1 - level) / 2
    if resamples - len(ratios) > tail * resamples:
        return Share(share, -math.inf, math.inf, level)
    ratios.sort()
    lo, hi = math.floor(tail * len(ratios)), math.ceil((1 - tail) * len(ratios)) - 1
    return Share(share, ratios[lo], ratios[hi], level)
