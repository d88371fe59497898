"""Where step credit matters (issue 57): a sweep of embedded-arithmetic settings, and a study its plan file enforces.

The sweep (point 1) runs the `verifier` and `oracle-progress` arms (experiments/credit_arms.py) on each setting of
`SETTINGS` (`--set` overrides of configs/quickstart.yaml, plus `SWEEP_BUDGET`: 1 RL round, ~3-4 min a unit on 2
cores), seeds 0 and 1; each (setting, seed) trains its SFT policy once, shared by its two arms. Unit files:
`docs/experiments/step-credit/sweep/<setting>/<arm>-s<seed>.json`; runs: `<runs-dir>/sweep/<setting>/`. Its plan,
docs/experiments/step-credit/sweep-plan.md: the setting with the largest mean oracle gain on Pass@1 at round 1
(`SWEEP_PRIMARY`) is the study's task, if that gain is at least `MIN_GAIN`.

The study (point 2) runs the arms x seeds of a plan file committed before its first unit: markdown with one fenced
```yaml block (`load_plan`):

    task: sparse-middle          # a SETTINGS name (its overrides + SWEEP_BUDGET), or
                                 # {config: PATH, setting: NAME, overrides: [...]} (each optional)
    arms: [verifier, oracle-progress, prm-progress]   # names of credit_arms.ARMS; `verifier` is the control
    seeds: [0, 1, 2, 3, 4]
    metric: eval/maj@8           # the primary metric
    round: 1                     # RL rounds each unit runs; every figure is this round's
    rule: {test: holm-paired-t, alpha: 0.05, min_seeds_at_or_above: 4}
    oracle: oracle-progress      # optional (this default where it is an arm): the ceiling for `oracle_share`

The rule (experiments/plans.py `decide`): per arm, its per-seed gaps to the verifier; a one-sided paired t over seeds
(n - 1 df), Holm's step-down correction over every arm of the plan but the verifier (REFERENCE.md, "Deciding among
several arms"), and at or above the verifier on >= min_seeds_at_or_above seeds. The study refuses to start unless the
plan is committed and HEAD descends from its commit (`plan_commit`); the report refuses a unit whose recorded commit
does not descend from it, or whose arm or seed the plan does not name (`check_units`). Unit files:
docs/experiments/step-credit/study/.

Run from the repository root, pinned to the AVX2 kernels at 2 threads (as `python -m experiments`):

  python -m experiments.step_credit sweep --settings sparse-middle long-sparse --seeds 0 1   # resumable
  python -m experiments.step_credit study --plan docs/experiments/step-credit/plan.md
  python -m experiments.step_credit --report-only        # both sections from the kept unit files alone, seconds

The report is the section "step-credit" of docs/results.md (`--out`): the regions `step-credit-sweep` and
`step-credit-study`; the README's glance line (`glance`) is printed.
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import re
import statistics
import sys
from pathlib import Path

import yaml

from bench._common import ROOT, table
from experiments.credit_arms import ARMS, MATCHED, verifier_matched
from experiments.credit_study import figures, region
from experiments.plans import (
    CONTROL,
    Plan,
    PlanError,
    Share,
    Verdict,
    check_units,
    decide,
    descends,
    oracle_share,
    plan_commit,
    plan_edits,
)
from experiments.report import fmt_se, study_markers, with_study
from experiments.runner import Experiments, policy_id, restart_pinned, run_figures, stoppable
from pipeline.evaluate import paired_difference
from pipeline.loading import load_config
from pipeline.rundir import read_json

CONFIG = "configs/quickstart.yaml"
FIGURES = "docs/experiments/step-credit"  # sweep/<setting>/ and study/ under it
PLAN = f"{FIGURES}/plan.md"  # the study's
SWEEP_PLAN = f"{FIGURES}/sweep-plan.md"
STUDY = "step-credit"  # the section's markers in docs/results.md

A = "problems.arithmetic."
LONG = ["grpo.max_completion_length=64", "collect.max_new_tokens=64", "eval.max_new_tokens=64"]  # 5 steps: <= 54 chars
SETTINGS = {
    # The sparse-outcome regime (PAV's): round-0 Pass@1 aimed at 0.1-0.4, many all-wrong groups.
    "sparse-middle": [f"{A}sft_noise=0.7", f"{A}sft_noise_at=[middle]", f"{A}min_steps=2", f"{A}max_steps=3"],
    # The same sparsity, the slips on the Answer line, where the outcome already puts the blame: the control.
    "sparse-answer": [f"{A}sft_noise=0.7", f"{A}sft_noise_at=[answer]", f"{A}min_steps=2", f"{A}max_steps=3"],
    "sparse-weak-sft": [f"{A}sft_noise=0.3", f"{A}sft_noise_at=[middle]", f"{A}min_steps=2", f"{A}max_steps=3",
                        "bootstrap.sft_args.num_train_epochs=2"],  # a weak SFT policy
    # Today's quickstart with the slips moved off the Answer line.
    "middle": [f"{A}sft_noise=0.3", f"{A}sft_noise_at=[middle]", f"{A}min_steps=2", f"{A}max_steps=3"],
    "long-middle": [f"{A}min_steps=4", f"{A}max_steps=5", f"{A}sft_noise=0.5", f"{A}sft_noise_at=[middle]", *LONG],
    "long-sparse": [f"{A}min_steps=4", f"{A}max_steps=5", f"{A}sft_noise=0.7", f"{A}sft_noise_at=[middle]", *LONG],
}
# One sweep unit (SFT excluded) in ~3-4 min on 2 cores: 1 RL round of 80 GRPO steps, 200 eval problems x 8.
SWEEP_BUDGET = ["run.rounds=1", "eval.num_problems=200", "eval.samples_per_problem=8", "eval.best_of_n=[4]",
                "collect.prompts_per_round=64", "grpo.max_steps=80"]
SWEEP_ARMS = (CONTROL, "oracle-progress")
SWEEP_SEEDS = (0, 1)
SWEEP_ROUND = 1
SWEEP_PRIMARY = "eval/pass@1"  # the sweep plan's: the setting where the oracle gains most on it is the study's task
MIN_GAIN = 0.01  # the sweep plan's: no setting with a mean oracle gain of at least this, no study
ALL_WRONG = "policy/all_wrong_group_share"  # GRPO's groups with no right sample, where a unit records it
NAMES = {"eval/maj@8": "Maj@8", "eval/pass@1": "Pass@1", "eval/greedy": "greedy"}


def name(metric: str) -> str:
    return NAMES.get(metric, metric)


class Units(Experiments):
    """The runner's units (experiments/runner.py) on `config` plus `task` overrides: shared SFT per seed, then arms."""

    def __init__(self, a: argparse.Namespace, runs_dir: Path, figures_dir: Path, config: str, task: list[str],
                 rounds: int, extra: dict | None = None):
        super().__init__(argparse.Namespace(**{**vars(a), "runs_dir": str(runs_dir), "figures": str(figures_dir)}))
        self.config_path, self.task, self.rounds, self.extra = config, task, rounds, extra or {}

    def config(self, seed: int, extra: list[str]):
        return load_config(ROOT / self.config_path, self.base(seed) + self.task + extra)

    def arm_overrides(self, arm: str, seed: int, others: list[str]) -> list[str]:
        """An arm's own overrides: `ARMS[arm]`, or for `verifier-matched` the verifier's with the GRPO steps that
        give it the GRPO wall-clock of the costliest of `others` on this seed (their kept unit files)."""
        if arm != MATCHED:
            return ARMS[arm]
        cfg = self.config(seed, list(ARMS[CONTROL]))
        steps = cfg.grpo["max_steps"]
        return verifier_matched(self.figures, [a for a in others if a not in (CONTROL, MATCHED)], steps,
                                cfg.supervision.prompts_per_round // steps, seed)

    def arm_config(self, arm: str, seed: int, own: list[str] | None = None):
        # After the task's: the run's rounds (over SWEEP_BUDGET's), and the arm's own (mc-progress-wc's steps).
        own = ARMS[arm] if own is None else own
        return self.config(seed, [*self.from_sft(seed, f"{self.runs_dir.name}-{arm}-s{seed}", self.rounds), *own])

    def arm(self, arm: str, seed: int, others: list[str] = ()) -> dict:
        from flows.iterative import iterative_rl

        own = self.arm_overrides(arm, seed, list(others))
        iterative_rl(self.arm_config(arm, seed, own).model_dump(mode="json"))
        return {**run_figures(self.runs_dir / f"{self.runs_dir.name}-{arm}-s{seed}"), **self.extra,
                "overrides": [*self.task, *own], "start": policy_id(self.sft_path(seed))}


# --- the plan: a committed file the code reads and enforces --------------------------------------------


FIELDS = {"task", "arms", "seeds", "metric", "round", "rule", "oracle"}
RULE_FIELDS = {"test", "alpha", "min_seeds_at_or_above"}


def load_plan(path: str | Path) -> Plan:
    """The plan in the one fenced ```yaml block of the markdown file `path`; a `PlanError` naming file and field."""
    path = Path(path)
    blocks = re.findall(r"^```ya?ml[ \t]*\n(.*?)^```", path.read_text(), flags=re.M | re.S)

    def bad(field: str, why: str) -> PlanError:
        return PlanError(f"{path}: {field}: {why}")

    if len(blocks) != 1:
        raise bad("```yaml", f"expected one fenced ```yaml block, found {len(blocks)}")
    try:
        d = yaml.safe_load(blocks[0])
    except yaml.YAMLError as e:
        raise bad("```yaml", f"not YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(d, dict):
        raise bad("```yaml", "expected a mapping of the fields " + ", ".join(sorted(FIELDS)))
    for f in sorted(FIELDS - {"oracle"} - set(d)):
        raise bad(f, "missing")
    for f in sorted(set(d) - FIELDS):
        raise bad(f, f"unknown field (the fields: {', '.join(sorted(FIELDS))})")
    config, overrides = _task(d["task"], bad)
    arms = d["arms"]
    if not (isinstance(arms, list) and all(isinstance(a, str) for a in arms) and len(set(arms)) == len(arms)):
        raise bad("arms", f"expected a list of distinct arm names, got {arms!r}")
    if unknown := [a for a in arms if a not in ARMS]:
        raise bad("arms", f"unknown arm {unknown[0]!r} (known: {', '.join(ARMS)})")
    if CONTROL not in arms or len(arms) < 2:
        raise bad("arms", f"expected {CONTROL!r}, the control, and at least one arm to test against it")
    seeds = d["seeds"]
    if not (isinstance(seeds, list) and all(type(s) is int for s in seeds) and len(set(seeds)) == len(seeds) >= 2):
        raise bad("seeds", f"expected a list of at least 2 distinct integers (a t over seeds), got {seeds!r}")
    if not (isinstance(d["metric"], str) and re.fullmatch(r"eval/[\w@]+", d["metric"])):
        raise bad("metric", f"expected an eval metric such as eval/maj@8, got {d['metric']!r}")
    if type(d["round"]) is not int or d["round"] < 1:
        raise bad("round", f"expected the RL round of the figures, an integer >= 1, got {d['round']!r}")
    rule = d["rule"]
    if not isinstance(rule, dict) or set(rule) != RULE_FIELDS:
        raise bad("rule", f"expected the fields {', '.join(sorted(RULE_FIELDS))}, got {rule!r}")
    if rule["test"] != "holm-paired-t":
        raise bad("rule.test", f"the only test is holm-paired-t, got {rule['test']!r}")
    if not (isinstance(rule["alpha"], float) and 0 < rule["alpha"] < 1):
        raise bad("rule.alpha", f"expected a level between 0 and 1, got {rule['alpha']!r}")
    k = rule["min_seeds_at_or_above"]
    if type(k) is not int or not 1 <= k <= len(seeds):
        raise bad("rule.min_seeds_at_or_above", f"expected an integer from 1 to {len(seeds)} (the seeds), got {k!r}")
    oracle = d.get("oracle", "oracle-progress" if "oracle-progress" in arms else None)
    if oracle is not None and (oracle not in arms or oracle == CONTROL):
        raise bad("oracle", f"expected one of the plan's arms other than {CONTROL!r}, got {oracle!r}")
    return Plan(path, config, tuple(overrides), tuple(arms), tuple(seeds), d["metric"], d["round"], rule["alpha"],
                k, oracle, d["task"] if isinstance(d["task"], str)
                else yaml.safe_dump(d["task"], default_flow_style=True, width=10**9).strip())


def _task(task, bad) -> tuple[str, list[str]]:
    """(config, overrides) of a plan's `task`: a SETTINGS name (its overrides and SWEEP_BUDGET), or a mapping."""
    if isinstance(task, str):
        if task not in SETTINGS:
            raise bad("task", f"unknown setting {task!r} (settings: {', '.join(SETTINGS)}; or a mapping of config, "
                              "setting, overrides)")
        return CONFIG, [*SETTINGS[task], *SWEEP_BUDGET]
    if not isinstance(task, dict) or not task or set(task) - {"config", "setting", "overrides"}:
        raise bad("task", f"expected a setting name or a mapping of config, setting, overrides, got {task!r}")
    config = task.get("config", CONFIG)
    if not (isinstance(config, str) and (ROOT / config).is_file()):
        raise bad("task.config", f"no config file {config!r} in the repository")
    if (setting := task.get("setting")) is not None and setting not in SETTINGS:
        raise bad("task.setting", f"unknown setting {setting!r} (settings: {', '.join(SETTINGS)})")
    overrides = task.get("overrides", [])
    if not (isinstance(overrides, list) and all(isinstance(o, str) and "=" in o for o in overrides)):
        raise bad("task.overrides", f"expected a list of KEY=VALUE overrides, got {overrides!r}")
    return config, [*(SETTINGS[setting] if setting else []), *overrides]


def relative(path: Path) -> str:
    """`path` from the repository root where it lies under it, else as given."""
    full = Path(path).resolve()
    return str(full.relative_to(ROOT) if full.is_relative_to(ROOT) else path)


# --- the report: pure functions of the kept unit files ---------------------------------------------------


def seed_gaps(kept: dict[str, dict], metric: str, rnd: int) -> dict[str, dict[int, float]]:
    """arm -> seed -> the arm's `metric` at round `rnd` minus the verifier's of that seed (arms but the verifier)."""
    data = figures(kept)
    base = data.get(CONTROL, {})
    return {arm: g for arm, seeds in data.items() if arm != CONTROL
            if (g := {s: r[rnd][metric] - base[s][rnd][metric] for s, r in sorted(seeds.items())
                      if metric in r.get(rnd, {}) and metric in base.get(s, {}).get(rnd, {})})}


def problem_gap(kept: dict[str, dict], arm: str, metric: str, rnd: int) -> tuple[float, float] | None:
    """`arm` - verifier in `metric` at round `rnd` per eval problem, every seed's problems pooled: (mean, paired SE)
    (`paired_difference`); None unless some seed of both kept per-problem figures (`per_problem`)."""
    data, key = figures(kept), metric.removeprefix("eval/")
    base, rows = data.get(CONTROL, {}), data.get(arm, {})
    pairs = [(pp[key], bp[key]) for s in sorted(rows) if key in (pp := rows[s].get(rnd, {}).get("per_problem", {}))
             and key in (bp := base.get(s, {}).get(rnd, {}).get("per_problem", {}))]
    if not pairs:
        return None
    return paired_difference([y for _, b in pairs for y in b], [x for a, _ in pairs for x in a])


def fmt_share(s: Share) -> str:
    if math.isnan(s.share):
        return "- (no oracle gain)"
    ci = "unbounded" if math.isinf(s.low) else f"{s.low:.2f} to {s.high:.2f}"
    return f"{s.share:.2f} [{s.level:.0%} CI {ci}]"


def rule_text(plan: Plan) -> str:
    return (f"Holm-corrected one-sided paired t over seeds at alpha {plan.alpha:g} over the {len(plan.tested)} arms, "
            f"and at or above the verifier on >= {plan.min_seeds} of {len(plan.seeds)} seeds")


def study_section(plan: Plan, kept: dict[str, dict], commit: str | None, flags: list[str], link: str) -> list[str]:
    """The study's region: the plan (its `link`, its `commit`), the rule, and per arm its per-seed gaps, mean ± SE, t,
    p, Holm's threshold, seeds at or above, the verdict and its share of the oracle's gain (`kept`: checked units)."""
    planned = [f"{a}-s{s}" for a in plan.arms for s in plan.seeds]
    done = [u for u in planned if u in kept]
    md = [f"Command: `python -m experiments.step_credit study --plan {relative(plan.path)}`; the plan, "
          f"[{link}]({link}), committed in " + (f"`{commit[:12]}`" if commit else "**not committed yet**")
          + f". Task `{plan.task}` on `{plan.config}`; metric {name(plan.metric)} at round {plan.round}; seeds "
          f"{', '.join(map(str, plan.seeds))}.", "",
          f"**{len(plan.tested)} arms tried** against the verifier ({', '.join(f'`{a}`' for a in plan.tested)}). The "
          f"rule: {rule_text(plan)}.", "", *(x for f in flags for x in (f"**Flag**: {f}", ""))]
    if not done:
        return md + [f"**Not run yet**: 0 of {len(planned)} units kept."]
    commits = sorted({u["commit"] for u in kept.values()})
    md += [f"Units kept: {len(done)} of {len(planned)} planned, from {', '.join(f'`{c}`' for c in commits)}; sum of "
           f"their wall times {sum(u['seconds'] for u in kept.values()) / 60:.0f} min (SFT units included).", ""]
    gaps = seed_gaps(kept, plan.metric, plan.round)
    verdicts = decide(plan, gaps)
    status = None if len(done) == len(planned) else f"no verdict yet ({len(done)} of {len(planned)} units)"
    shares = arm_shares(plan, verdicts, gaps)
    rows = []
    for arm, v in verdicts.items():
        share = fmt_share(shares[arm]) if arm in shares else "-"
        rows.append([f"`{arm}`", " / ".join(f"{g:+.3f}" for g in v.gaps.values()) or "-",
                     fmt_se(list(v.gaps.values())), f"{v.t:.2f} ({len(v.gaps) - 1} df)", f"{v.p:.4f}",
                     f"{v.threshold:.4f} (rank {v.rank})", f"{v.at_or_above} of {len(v.gaps)}",
                     status or ("**pays**" if v.pays else "does not pay"), share])
    md += [table(["arm", f"Δ {name(plan.metric)} per seed", "Δ mean ± SE over seeds", "t", "p (one-sided)",
                  "Holm threshold", "seeds at or above", "verdict", f"share of `{plan.oracle}`'s gain"], rows)]
    matched = matched_rows(plan, kept, gaps)
    if matched:
        md += ["", f"At equal GRPO wall-clock: each RM arm minus `{MATCHED}` (the verifier with the GRPO seconds of "
                   "its seed's costliest arm; its steps per seed in the last column), per seed, mean ± SE over "
                   "seeds, no test:", "",
               table(["arm", f"Δ {name(plan.metric)} per seed", "Δ mean ± SE over seeds", "seeds at or above",
                      f"`{MATCHED}` GRPO steps per seed"], matched)]
    return md + ([] if status else ["", *goals(plan, verdicts, gaps, shares)])


def rm_arms(plan: Plan) -> list[str]:
    """The arms whose cost the matched verifier answers: every tested arm but the oracle and the matched verifier."""
    return [a for a in plan.tested if a not in (plan.oracle, MATCHED)]


def arm_shares(plan: Plan, verdicts: dict[str, Verdict], gaps: dict[str, dict[int, float]]) -> dict[str, Share]:
    """Each RM arm's share of the oracle's gain (`oracle_share`) over the seeds both have: once, for the table and
    goal 2 (none for the oracle or the matched verifier, no RM)."""
    oracle = gaps.get(plan.oracle, {})
    out = {}
    for arm in rm_arms(plan):
        if seeds := [s for s in verdicts[arm].gaps if s in oracle]:
            out[arm] = oracle_share([verdicts[arm].gaps[s] for s in seeds], [oracle[s] for s in seeds])
    return out


def matched_rows(plan: Plan, kept: dict[str, dict], gaps: dict[str, dict[int, float]]) -> list[list[str]]:
    """Per RM arm, its per-seed gaps to `verifier-matched` (both to the verifier, so the difference), mean ± SE,
    seeds at or above, and the matched arm's GRPO steps per seed (from its kept overrides); [] before it ran."""
    if MATCHED not in plan.arms or not (base := gaps.get(MATCHED)):
        return []
    steps = " / ".join(next((o.split("=", 1)[1] for o in reversed(u.get("overrides", []))
                             if o.startswith("grpo.max_steps=")), "-")
                       for s in sorted(base) if (u := kept.get(f"{MATCHED}-s{s}")))
    rows = []
    for arm, d in matched_gaps(plan, gaps).items():
        rows.append([f"`{arm}`", " / ".join(f"{x:+.3f}" for x in d.values()) or "-",
                     fmt_se(list(d.values())) if d else "-", f"{sum(x >= 0 for x in d.values())} of {len(d)}", steps])
    return rows


def matched_gaps(plan: Plan, gaps: dict[str, dict[int, float]]) -> dict[str, dict[int, float]]:
    """Per RM arm, seed -> its gap to `verifier-matched` (both gaps to the verifier, so their difference)."""
    base = gaps.get(MATCHED, {})
    return {a: {s: g - base[s] for s, g in gaps.get(a, {}).items() if s in base} for a in rm_arms(plan)}


GOAL_GAIN = 0.03  # the plan's goal 1: the oracle's mean gain
GOAL_SHARE = 0.5  # goal 2: a co-trained PRM's share of the oracle's gain
CO_TRAINED = ("prm-progress", "implicit-prime")  # goal 2's arms: PRMs trained inside the loop


def goals(plan: Plan, verdicts: dict[str, Verdict], gaps: dict[str, dict[int, float]],
          shares: dict[str, Share]) -> list[str]:
    """The issue's three goals on the tiny model, each `met` or `not met` from the verdicts, gaps and `arm_shares`."""
    def said(ok: bool) -> str:
        return "**met**" if ok else "**not met**"

    out = []
    if (o := verdicts.get(plan.oracle)) is not None:
        out.append(f"- Goal 1, the oracle pays with a mean gain of at least {GOAL_GAIN:+.2f} {name(plan.metric)}: "
                   f"{said(o.pays and o.mean >= GOAL_GAIN)} ({'pays' if o.pays else 'does not pay'}, "
                   f"{fmt_se(list(o.gaps.values()))}).")
        parts, ok = [], False
        for arm in (a for a in CO_TRAINED if a in shares):
            v, share = verdicts[arm], shares[arm]
            ok |= v.pays and share.share >= GOAL_SHARE
            parts.append(f"`{arm}` {'pays' if v.pays else 'does not pay'}, share {fmt_share(share)}")
        if parts:
            out.append(f"- Goal 2, a co-trained PRM pays and recovers at least {GOAL_SHARE:.0%} of the oracle's gain: "
                       f"{said(ok)} ({'; '.join(parts)}).")
    if MATCHED in plan.arms and gaps.get(MATCHED):
        means = {a: statistics.mean(d.values()) for a, d in matched_gaps(plan, gaps).items() if d}
        best = max(means, key=means.get) if means else None
        out.append(f"- Goal 3, at equal compute an RM arm is at or above `{MATCHED}` (mean gap >= 0): "
                   f"{said(best is not None and means[best] >= 0)}"
                   + (f" (the best, `{best}`, {means[best]:+.3f})." if best else "."))
    return out


def glance(plan: Plan, kept: dict[str, dict]) -> str:
    """README's one line for the study: how many arms were tried, the rule, and which arms pay."""
    planned = len(plan.arms) * len(plan.seeds)
    done = sum(f"{a}-s{s}" in kept for a in plan.arms for s in plan.seeds)
    v = decide(plan, seed_gaps(kept, plan.metric, plan.round))
    pays = [a for a in plan.tested if v[a].pays]
    verdict = f"pays: {', '.join(pays) or 'none'}" if done == planned else f"no verdict yet ({done} of {planned} units)"
    return (f"{len(plan.tested)} arms vs the verifier on `{plan.task}` ({name(plan.metric)}, round {plan.round}), "
            f"Holm over the {len(plan.tested)}, >= {plan.min_seeds} of {len(plan.seeds)} seeds at or above; {verdict}")


def sweep_rows(setting: str, units: dict[str, dict], primary: str, rnd: int, wrong: bool) -> tuple[list, list]:
    """One setting's rows of the sweep's tables: per seed (round 0, both arms at round `rnd`, wall times), and its
    summary (round 0's means, the oracle's gaps per seed and mean ± SE, on `primary` per problem with its paired SE,
    seeds at or above, median wall times)."""
    data = figures(units)
    gaps = {k: seed_gaps(units, k, rnd).get("oracle-progress", {}) for k in ("eval/maj@8", "eval/pass@1", primary)}
    seeds = sorted({s for a in SWEEP_ARMS for s, r in data.get(a, {}).items() if rnd in r})
    pp = problem_gap(units, "oracle-progress", primary, rnd)

    def value(arm: str, s: int, r: int, key: str) -> float | None:
        return data.get(arm, {}).get(s, {}).get(r, {}).get(key)

    def r0(s: int, key: str) -> float | None:  # round 0: the seed's SFT policy, the same in both arms
        return next((v for a in SWEEP_ARMS if (v := value(a, s, 0, key)) is not None), None)

    def cell(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    def mean(xs: list) -> str:
        return cell(statistics.mean(xs)) if (xs := [x for x in xs if x is not None]) else "-"

    def wall(names: list[str]) -> str:
        return f"{statistics.median(x):.0f}" if (x := [units[n]["seconds"] for n in names]) else "-"

    extra = (lambda s: [cell(value(CONTROL, s, rnd, ALL_WRONG))]) if wrong else (lambda s: [])
    per_seed = [[f"`{setting}`", str(s), cell(r0(s, "eval/pass@1")), cell(r0(s, "eval/maj@8")), *extra(s),
                 *(cell(value(a, s, rnd, k)) for k in ("eval/maj@8", "eval/pass@1") for a in SWEEP_ARMS),
                 " / ".join(f"{units[u]['seconds']:.0f}" if (u := f"{a}-s{s}") in units else "-" for a in SWEEP_ARMS)]
                for s in seeds]
    summary = [f"`{setting}`", ", ".join(map(str, seeds)) or "-", mean([r0(s, "eval/pass@1") for s in seeds]),
               mean([r0(s, "eval/maj@8") for s in seeds]),
               *([mean([value(CONTROL, s, rnd, ALL_WRONG) for s in seeds])] if wrong else []),
               *(" / ".join(f"{g:+.3f}" for g in gaps[k].values()) + f"; {fmt_se(list(gaps[k].values()))}"
                 if gaps[k] else "-" for k in ("eval/maj@8", "eval/pass@1")),
               f"{pp[0]:+.3f} ± {pp[1]:.3f} SE" if pp else "not kept",
               f"{sum(g >= 0 for g in gaps[primary].values())} of {len(gaps[primary])}",
               wall([n for n in units if not n.startswith("sft-")]), wall([n for n in units if n.startswith("sft-")])]
    return per_seed, summary


def sweep_section(kept: dict[str, dict[str, dict]], primary: str = SWEEP_PRIMARY, rnd: int = SWEEP_ROUND,
                  link: str = SWEEP_PLAN) -> list[str]:
    """The sweep's region from its kept units (setting -> unit name -> unit file): the settings, per setting and
    seed round 0 and both arms at round `rnd`, per setting the oracle's gaps (per seed, mean ± SE over seeds, per
    problem mean ± paired SE) and wall times, and the setting where the oracle's gain on `primary` is largest
    (`best_setting`), with whether it reaches `MIN_GAIN` (the plan, at `link`: no study below it)."""
    wrong = any(ALL_WRONG in m for u in kept.values() for k in u.values() for m in k.get("rounds", {}).values())
    w = [f"all-wrong groups r{rnd} (verifier)"] if wrong else []
    per_seed, summary = [], []
    for setting, units in kept.items():
        rows, row = sweep_rows(setting, units, primary, rnd, wrong)
        per_seed += rows
        summary.append(row)
    top = best_setting(kept, primary, rnd)
    gap = list(seed_gaps(kept[top], primary, rnd)["oracle-progress"].values()) if top else []
    choice = "none measured yet."
    screened = sum(bool(seed_gaps(u, primary, rnd).get("oracle-progress")) for u in kept.values())
    if top and screened < len(SETTINGS):  # the choice is made over every setting of the plan, not the first ones
        choice = (f"so far `{top}`, {fmt_se(gap)} over {len(gap)} seeds; {screened} of {len(SETTINGS)} settings "
                  "screened: no choice until all are.")
    elif top:
        choice = f"`{top}`, {fmt_se(gap)} over {len(gap)} seeds: " + (
            "the study's task." if statistics.mean(gap) >= MIN_GAIN
            else f"below the plan's {MIN_GAIN:+.2f}: no study, the finding is the sweep itself.")
    return [f"Command: `python -m experiments.step_credit sweep` (seeds {', '.join(map(str, SWEEP_SEEDS))}); the "
            f"plan, fixed before the first unit: [{link}]({link}). Each "
            f"setting is `{CONFIG}` plus its overrides and `{' '.join(SWEEP_BUDGET)}`; each (setting, seed) trains "
            f"one SFT policy, round 0 of both arms (`{'`, `'.join(SWEEP_ARMS)}`), then {rnd} RL round.", "",
            table(["setting", "overrides"], [[f"`{k}`", " ".join(f"`{o}`" for o in v)] for k, v in SETTINGS.items()]),
            "", "Per setting and seed:", "",
            table(["setting", "seed", "Pass@1 r0", "Maj@8 r0", *w, f"Maj@8 r{rnd} verifier", f"Maj@8 r{rnd} oracle",
                   f"Pass@1 r{rnd} verifier", f"Pass@1 r{rnd} oracle", "unit wall time, verifier / oracle (s)"],
                  per_seed) if per_seed else "No unit kept yet.", "",
            f"The oracle's gap to the verifier at round {rnd}: per seed; mean ± SE over seeds (SE = SD / sqrt(n)):",
            "",
            table(["setting", "seeds", "Pass@1 r0 (mean)", "Maj@8 r0 (mean)", *(x + " (mean)" for x in w),
                   "Δ Maj@8, oracle - verifier", "Δ Pass@1, oracle - verifier",
                   f"Δ {name(primary)} per problem, mean ± paired SE", f"seeds oracle at or above ({name(primary)})",
                   "arm unit wall time, median (s)", "SFT unit wall time, median (s)"], summary), "",
            f"Largest oracle gain on {name(primary)} (the plan's metric): {choice}"]


def best_setting(kept: dict[str, dict[str, dict]], primary: str = SWEEP_PRIMARY, rnd: int = SWEEP_ROUND) -> str | None:
    """The setting whose mean oracle gap to the verifier on `primary` at round `rnd` is largest (None: none kept)."""
    means = {s: statistics.mean(g.values()) for s, u in kept.items()
             if (g := seed_gaps(u, primary, rnd).get("oracle-progress"))}
    return max(means, key=means.get, default=None)


def glance_row(figures: Path = Path(FIGURES), plan_path: Path = Path(PLAN)) -> list[str]:
    """README's results row for issue 57: the study's `glance` (arms tried, the rule, which pay) once its plan is
    there; before it, how far the sweep has gone and where the oracle gained most."""
    question = "Where does step credit pay?"
    link = "[issue 57](docs/results.md#where-step-credit-matters-issue-57)"
    if Path(plan_path).is_file():
        plan = load_plan(plan_path)
        return [question, glance(plan, kept_units(Path(figures) / "study")), link]
    sweep = {s: u for s in SETTINGS if (u := kept_units(Path(figures) / "sweep" / s))}
    screened = [s for s, u in sweep.items() if seed_gaps(u, SWEEP_PRIMARY, SWEEP_ROUND).get("oracle-progress")]
    best = best_setting(sweep)
    found = (f"; largest on {name(SWEEP_PRIMARY)}: `{best}`, "
             f"{fmt_se(list(seed_gaps(sweep[best], SWEEP_PRIMARY, SWEEP_ROUND)['oracle-progress'].values()))}"
             if best else "")
    return [question, f"oracle - verifier, sweep: {len(screened)} of {len(SETTINGS)} settings{found}; no study yet",
            link]


# --- the commands ----------------------------------------------------------------------------------------


def kept_units(where: Path) -> dict[str, dict]:
    """Every unit file kept in `where`, by unit name (`<arm>-s<seed>`, `sft-s<seed>`)."""
    return {p.stem: read_json(p) for p in sorted(Path(where).glob("*.json"))}


def report(a: argparse.Namespace) -> Path:
    """Rewrite the section `step-credit` of `a.out` (docs/results.md) from the kept unit files under `a.figures`: the
    sweep's region and, where the plan `a.plan` exists, the study's, its units checked (`check_units`) before
    anything is written. Nothing written by hand is kept: every figure of the section is made from the unit files."""
    out, where = Path(a.out), Path(a.figures)
    sweep = {s: u for s in SETTINGS if (u := kept_units(where / "sweep" / s))}
    plan = load_plan(a.plan) if Path(a.plan).is_file() else None
    study = [f"No plan yet (`{a.plan}`): the study runs once one is committed."]
    if plan:
        kept = kept_units(where / "study")
        flags = check_units(plan, kept, where / "study") if kept else []  # before anything is written
        try:
            commit, edits = plan_commit(plan.path), plan_edits(plan.path)
        except PlanError:  # no unit kept yet: the section says the plan is not committed
            commit, edits = None, []
        if edits:
            flags.append(f"the plan changed after its commit, in {', '.join(f'`{c[:12]}`' for c in edits)}: a plan "
                         "does not change once committed.")
        link = os.path.relpath(plan.path.resolve(), ROOT / "docs")  # the page lives in docs/ (written elsewhere too)
        study = study_section(plan, kept, commit, flags, link)
    text = out.read_text() if out.exists() else ""
    begin, end = study_markers(STUDY)
    block = [begin, "## Where step credit matters (issue 57)", "", "### The sweep", "",
             *region("step-credit-sweep", sweep_section(sweep, link=os.path.relpath(ROOT / SWEEP_PLAN, ROOT / "docs"))),
             "",
             "### The study", "", *region("step-credit-study", study), end]
    out.write_text(with_study(text, "\n".join(block), STUDY))
    if plan:
        print(f"glance: {glance(plan, kept_units(where / 'study'))}")
    return out


def run_sweep(a: argparse.Namespace) -> None:
    """Every pending unit of the asked settings and seeds, each (setting, seed)'s SFT first; the report after each.
    Refused (`PlanError`) while the sweep's plan is not committed."""
    start = plan_commit(ROOT / SWEEP_PLAN)  # the sweep's plan, committed before its first unit (refused if not)
    for setting in a.settings:
        units = Units(a, Path(a.runs_dir) / "sweep" / setting, Path(a.figures) / "sweep" / setting, CONFIG,
                      [*SETTINGS[setting], *SWEEP_BUDGET], SWEEP_ROUND,
                      {"setting": setting, "plan": SWEEP_PLAN, "plan_commit": start})
        units.runs_dir.mkdir(parents=True, exist_ok=True)
        units.run_arms(a.seeds, list(SWEEP_ARMS), lambda: report(a))


def study_units(a: argparse.Namespace, code: Path = ROOT) -> tuple[Plan, Units]:
    """The plan's units, refused (`PlanError`) unless the plan is committed, the HEAD of `code` (the checkout that
    runs them, whose commit each unit records) descends from the plan's commit, and every unit kept so far is the
    plan's (`check_units`)."""
    plan = load_plan(a.plan)
    start = plan_commit(plan.path)
    if not descends("HEAD", start, code):
        raise PlanError(f"{plan.path}: HEAD of {code} does not descend from the plan's commit {start[:12]}: check "
                        "out a descendant of it")
    where = Path(a.figures) / "study"
    check_units(plan, kept_units(where), where)
    return plan, Units(a, Path(a.runs_dir) / "study", where, plan.config, list(plan.overrides), plan.round,
                       {"plan": relative(plan.path), "plan_commit": start})


def run_study(a: argparse.Namespace, plan: Plan, units: Units) -> None:
    """The plan's units of `a.seeds` and `a.arms` (every seed, every arm of the plan if None); `verifier-matched`
    after a seed's other arms, whose GRPO runtimes set its steps."""
    seeds, arms = a.seeds or list(plan.seeds), getattr(a, "arms", None) or list(plan.arms)
    if stray := [s for s in seeds if s not in plan.seeds]:
        raise PlanError(f"{plan.path}: seed {stray[0]} is not in the plan ({', '.join(map(str, plan.seeds))})")
    if stray := [x for x in arms if x not in plan.arms]:
        raise PlanError(f"{plan.path}: arm {stray[0]!r} is not in the plan ({', '.join(plan.arms)})")
    arms = sorted(arms, key=lambda x: x == MATCHED)
    units.arm = functools.partial(units.arm, others=list(plan.arms))
    units.runs_dir.mkdir(parents=True, exist_ok=True)
    units.run_arms(seeds, arms, lambda: report(a))


def _common(p: argparse.ArgumentParser, sub: bool) -> None:
    """The options of every command (a subcommand's left unset unless given, so they do not undo the main's)."""
    d = (lambda v: argparse.SUPPRESS) if sub else (lambda v: v)
    p.add_argument("--runs-dir", default=d("runs/step-credit"), help="run folders: sweep/<setting>/, study/")
    p.add_argument("--figures", default=d(FIGURES), help="kept unit files: sweep/<setting>/, study/")
    p.add_argument("--out", default=d("docs/results.md"), help="the page the section is written into")
    p.add_argument("--experiment", default=d("iterative-grpo-step-credit"), help="MLflow experiment")
    p.add_argument("--tracking-uri", default=d(None))
    p.add_argument("--native", action="store_true", default=d(False),
                   help="the CPU's own kernels and threads, not pinned AVX2 x 2")
    p.add_argument("--threads", type=int, default=d(2), help="torch's threads, pinned (runner.pinned_env)")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _common(ap, sub=False)
    ap.add_argument("--report-only", action="store_true", help="only rebuild the section from the kept unit files")
    ap.add_argument("--plan", default=PLAN, help="the study's plan, for the report")
    cmds = ap.add_subparsers(dest="command")
    sweep = cmds.add_parser("sweep", help="the settings' verifier and oracle-progress units")
    _common(sweep, sub=True)
    sweep.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    sweep.add_argument("--seeds", type=int, nargs="+", default=list(SWEEP_SEEDS))
    study = cmds.add_parser("study", help="the committed plan's arms x seeds")
    _common(study, sub=True)
    study.add_argument("--plan", required=True, help="the plan file, committed before the first unit")
    study.add_argument("--seeds", type=int, nargs="+", default=None,
                       help="only these of the plan's seeds (two commands on disjoint seeds, their own --runs-dir "
                            "and --tracking-uri, can run side by side, --threads 1 each)")
    study.add_argument("--arms", nargs="+", default=None,
                       help="only these of the plan's arms (`verifier-matched` needs its seed's others kept)")
    return ap


def main(argv: list[str] | None = None) -> None:
    a = parser().parse_args(argv)
    a.smoke, a.mc_prompts = False, 0
    if a.report_only or not a.command:
        print(f"report: {report(a)}")
        return
    try:  # the plan's checks before anything starts
        study = study_units(a) if a.command == "study" else None
    except PlanError as e:
        sys.exit(f"step_credit: {e}")
    from flows.console import prefect_defaults

    prefect_defaults()
    stoppable("step_credit", lambda: run_study(a, *study) if study else run_sweep(a))
    print(f"report: {report(a)}")


if __name__ == "__main__":
    restart_pinned("experiments.step_credit", sys.argv[1:])
    main()
