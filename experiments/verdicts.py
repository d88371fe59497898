"""The verdicts under docs/results.md's sections 1-6, written from the kept units as the tables above them are
(issue 57, point 5): each is a template whose every figure is computed here from the kept figures, so no number in
results.md is typed by hand (tests/test_figures_kept.py changes each one and checks the change is found). What
the figures mean is the template's prose; a claim that depends on them (held, every seed, below) is computed too.

`data` is experiments/report.py's `gather`: arm -> seed -> round -> metric. "Held" is the decision rule's
`pays` applied to the per-seed gaps of the comparison (mean above 0 by 2 SE, and at or above on every seed of 3).
A verdict is None until every unit it reads is kept (the report then leaves its placeholder for a hand-written one).
Figures measured outside the kept units (the monitor's bootstrap noise, the bigger backbone's SFT, the quickstart's
time) are in docs/lab/unkept-figures.md, which these verdicts link to. A string here types no figure: digits
only in inline code (a command, a setting) and in citations (issue, Fig., section numbers); goals are the
constants below.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable

from experiments.runner import LABELS
from experiments.stats import at, fmt, fmt_se, gains, mean_se, paired, pays, values

M8 = "eval/maj@8"
AUC = "eval/prm_step_auc_gold"
MONITOR = ("gap_rise", "auc_drop", "alarm")  # `monitor/prm_<key>`, each RL round
NOTES = "lab/unkept-figures.md"  # relative to docs/results.md
# Issue 16's goals, as it set them.
GOAL_SEEDS = (2, 3)  # hybrid at or above the verifier in 2 of 3 seeds (and in the mean)
GOAL_SHARE = 0.2  # the PRM term's share of the advantages' variance
GOAL_AUC = 0.85  # the PRM's step AUC against gold, every round and seed
GOAL_MONITOR_ROUNDS = 2  # the monitor fires on the exploitable RM within this many rounds
GOAL_TIME = (10, 12)  # the quickstart's minutes: no longer than 12 where it took 10
# A kept PRM-study row whose `train_seconds` are not its setting's: it ran beside another training (2026-12-03), so
# the training-time ratios leave it out (its AUCs do not depend on that).
CONTENDED = (2, (192, 8), "default")


# --- wording: numbers and counts as the verdicts write them -----------------------------------------


def seq(xs: Iterable[float], spec: str = "+.3f", sep: str = ", ") -> str:
    """'-0.010, -0.071, -0.026': each figure formatted by `spec`."""
    return sep.join(format(x, spec) for x in xs)


def listing(xs: Iterable[float], spec: str = ".3f") -> str:
    """'0.910, 0.891 and 0.896'."""
    items = [format(x, spec) for x in xs]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def span(xs: Iterable[float], spec: str = ".2f", sep: str = "-") -> str:
    """'0.69-0.74': the lowest and highest as formatted (one figure when they print alike)."""
    lo, hi = format(min(xs), spec), format(max(xs), spec)
    return lo if lo == hi else f"{lo}{sep}{hi}"


def seeds(k: int, n: int) -> str:
    """'every seed', 'no seed', or 'k of n seeds'."""
    return "every seed" if k == n else "no seed" if k == 0 else f"{k} of {n} seeds"


def below(gaps: list[float]) -> int:
    return sum(g < 0 for g in gaps)


def at_or_above(gaps: list[float]) -> int:
    return sum(g >= 0 for g in gaps)


def same_sign(gaps: list[float]) -> bool:
    return all(g > 0 for g in gaps) or all(g < 0 for g in gaps)


def held(gaps: list[float]) -> str:
    return "Held" if pays(gaps) else "Did not hold"


def z(gaps: list[float]) -> float:
    mean, se = mean_se(gaps)
    return mean / se


def when(kept: dict, names: Iterable[str], n: int) -> str:
    """'2026-12-03, pinned, 3 seeds': the kept units' (`names`) dates, whether they ran on the pinned kernels, the
    seeds."""
    units = [kept.get(name, {}) for name in names]
    dates = sorted({u.get("date", "undated") for u in units})
    pinned = all("AVX2 kernels" in u.get("machine", "") and "native" not in u.get("machine", "") for u in units)
    return f"{' to '.join(dict.fromkeys([dates[0], dates[-1]]))}, {'pinned' if pinned else 'native kernels'}, {n} seeds"


def complete(data: dict, arms: Iterable[str], seed_list: list[int], rounds: Iterable[int], *keys: str) -> bool:
    """Every arm has every key (Maj@8 when none is named) at each of `rounds` of every seed."""
    rounds = list(rounds)
    return all(at(data, arm, s, r, key) is not None for arm in arms for s in seed_list for r in rounds
               for key in keys or (M8,))


def per_seed(data: dict, arm: str, seed_list: list[int], r: int, key: str = M8) -> list[float]:
    return [at(data, arm, s, r, key) for s in seed_list]


# --- the sections' verdicts -------------------------------------------------------------------------------


def supervision(data: dict, seed_list: list[int], last: int, units: dict) -> list[str] | None:
    """1. Process against outcome supervision, and Online RFT."""
    arms = ("prm", "orm", "verifier", "rft")
    if not complete(data, arms, seed_list, range(last + 1)):
        return None
    n = len(seed_list)
    prm, orm, rft = (paired(data, arm, "verifier", last, M8) for arm in ("prm", "orm", "rft"))
    prm_orm = paired(data, "prm", "orm", last, M8)
    top = sum(max(arms, key=lambda arm: at(data, arm, s, last, M8)) == "rft" for s in seed_list)
    ver = per_seed(data, "verifier", seed_list, last)
    text = (
        f"**What held / what did not ({when(units, [f'{a}-s{s}' for a in arms for s in seed_list], n)}):** "
        f"**{held(prm)}:** process above outcome supervision (DeepSeekMath Fig. 5). GRPO with the retrained PRM ends "
        f"round {last} at Maj@8 {fmt(values(data, 'prm', last, M8), n)} against GRPO on the verifier's "
        f"{fmt(ver, n)} (SD over seeds), below it in {seeds(below(prm), n)} ({seq(prm)}). Among the learned RMs, "
        f"GRPO on the ORM ended at {listing(per_seed(data, 'orm', seed_list, last))} against the PRM arm's "
        f"{listing(per_seed(data, 'prm', seed_list, last))}: process above outcome in "
        f"{seeds(n - below(prm_orm), n)} (PRM - ORM {seq(prm_orm)}; mean {fmt_se(prm_orm)}); the ORM arm itself "
        f"ended below the verifier in {seeds(below(orm), n)} ({fmt_se(orm)}). Online RFT ended highest of the four "
        f"arms in {seeds(top, n)}, {listing(per_seed(data, 'rft', seed_list, last))} against GRPO on the verifier's "
        f"{listing(ver)} ({seq(rft)}; mean {fmt_se(rft)}): GRPO above Online RFT "
        + ("did not hold either." if not pays([-g for g in rft]) else "held.")
        + (" Each of those three gaps to the verifier is small against the spread over seeds, but its sign is the "
           "same in every seed." if all(map(same_sign, (prm, orm, rft))) else "")
        + (" A tiny learned RM does not beat the exact answer check it is trained from; the paper's outcome arm used "
           "a trained RM, not an exact verifier." if max(statistics.mean(prm), statistics.mean(orm)) < 0 else ""))
    return [text]


def reward_model(data: dict, seed_list: list[int], last: int, units: dict, threshold: float,
                 replay_fraction: float) -> list[str] | None:
    """2. The RM retrained each round, frozen, without replay; the monitor on the exploitable RM."""
    arms = ("prm", "frozen", "noreplay", "exploit")
    if not (complete(data, arms, seed_list, range(last + 1), M8, "eval/greedy")
            and complete(data, arms, seed_list, range(1, last + 1), *(f"monitor/prm_{k}" for k in MONITOR))
            and complete(data, arms[:3], seed_list, [last], AUC, "prm/step_auc_gold")
            and complete(data, ["verifier"], seed_list, [last])):
        return None
    n, later = len(seed_list), range(1, last + 1)
    frozen, replay = paired(data, "prm", "frozen", last, M8), paired(data, "noreplay", "prm", last, M8)
    rise = lambda arm, r: per_seed(data, arm, seed_list, r, "monitor/prm_gap_rise")  # noqa: E731
    drop = lambda arm, r: per_seed(data, arm, seed_list, r, "monitor/prm_auc_drop")  # noqa: E731
    fired = [(s, r) for s in seed_list for r in later if at(data, "prm", s, r, "monitor/prm_alarm") > 0.5]
    caught = [s for s in seed_list if any(at(data, "exploit", s, r, "monitor/prm_alarm") > 0.5
                                          for r in range(1, GOAL_MONITOR_ROUNDS + 1))]
    quiet = [s for s in seed_list if all((s, r) not in fired for r in later)]
    first_round = [s for s in seed_list if at(data, "exploit", s, 1, "monitor/prm_alarm") > 0.5]
    missed = sum(d <= threshold for d in drop("exploit", 1))
    same_policy = all(len({at(data, arm, s, 1, "eval/greedy") for arm in ("prm", "frozen", "noreplay")}) == 1
                      for s in seed_list)
    md = [
        f"**What held / what did not ({when(units, [f'{a}-s{s}' for a in arms for s in seed_list], n)}):** "
        f"**{held(frozen)}:** iterative RL with the PRM retrained each round keeps paying against a PRM frozen at "
        f"round 0 (DeepSeekMath Fig. 6). At round {last} the retrained PRM's arm reached Maj@8 "
        f"{listing(per_seed(data, 'prm', seed_list, last))}, the frozen PRM's "
        f"{listing(per_seed(data, 'frozen', seed_list, last))}: below in {seeds(sum(g > 0 for g in frozen), n)} "
        f"({seq(-g for g in frozen)}; mean {fmt_se([-g for g in frozen])}). What the frozen PRM loses is visible in "
        f"its judgement: its step AUC against gold on round {last}'s eval samples (`{AUC}`) is "
        f"{listing(per_seed(data, 'frozen', seed_list, last, AUC))} against the retrained PRM's "
        f"{listing(per_seed(data, 'prm', seed_list, last, AUC))} (on the RM's held-out slice, the table's column: "
        f"{seq(per_seed(data, 'frozen', seed_list, last, 'prm/step_auc_gold'), '.3f')} against "
        f"{seq(per_seed(data, 'prm', seed_list, last, 'prm/step_auc_gold'), '.3f')})."
        + (" Round 1 is the same policy in the three PRM arms of a seed (the same greedy in the three, by seed "
           f"{seq(per_seed(data, 'prm', seed_list, 1, 'eval/greedy'), '.3f')}; Maj@8 differs only because the prm "
           "arm's eval draws more samples), as it must be, since they differ only from round 1's RM phase on."
           if same_policy else "")
        + f" **{held([-g for g in replay])}:** the {replay_fraction:.0%} replay. Retrained without it, the arm ended at "
        f"{listing(per_seed(data, 'noreplay', seed_list, last))}, {listing(replay, '+.3f')} from the arm with replay "
        f"(mean {fmt_se(replay)}), and its PRM judged round {last}'s eval samples "
        f"{'as well' if statistics.mean(per_seed(data, 'noreplay', seed_list, last, AUC)) >= statistics.mean(per_seed(data, 'prm', seed_list, last, AUC)) - 0.01 else 'worse'}"  # noqa: E501
        f" ({seq(per_seed(data, 'noreplay', seed_list, last, AUC), '.3f')}). A likely reason: in {last} RL rounds "
        "there is little to forget, since each round's PRM warm-starts from the previous one's.",
        "",
        f"**The monitor** (issue 16's goal: fires on the exploitable RM within {GOAL_MONITOR_ROUNDS} rounds and "
        f"stays quiet on the retrained one). On the exploitable frozen PRM it fires in round 1 in "
        f"{seeds(len(first_round), n)} (gap rise {seq(rise('exploit', 1))} against the {threshold} threshold)"
        + "".join(f" and in round {r} in {seeds(sum(x > threshold for x in rise('exploit', r)), n)} "
                  f"({seq(rise('exploit', r))})" for r in later if r > 1)
        + ", while the policy learns the planted slip (greedy "
        + ", ".join(" -> ".join(f"{at(data, 'exploit', s, r, 'eval/greedy'):.3f}" for r in range(last + 1))
                    for s in seed_list)
        + f"); the AUC drop alone, at the same {threshold} threshold, would have missed round 1 in "
          f"{seeds(missed, n)} ({seq(drop('exploit', 1))}). On the retrained PRM it stayed quiet in "
          f"{n * len(later) - len(fired)} of {n * len(later)} RL rounds"
        + (f" (seeds {listing(quiet, 'd')}: "
           + "; ".join(seq(at(data, "prm", s, r, "monitor/prm_gap_rise") for r in later) for s in quiet) + ")"
           if quiet else "")
        + "".join(f" and **fired in round {r} of seed {s}** (gap rise "
                  f"{at(data, 'prm', s, r, 'monitor/prm_gap_rise'):+.3f}, AUC drop "
                  f"{at(data, 'prm', s, r, 'monitor/prm_auc_drop'):+.3f}), where Maj@8 went "
                  f"{at(data, 'prm', s, r - 1, M8):.3f} -> {at(data, 'prm', s, r, M8):.3f}"
                  + (" and the arm ended below the verifier" if at(data, "prm", s, last, M8)
                     < at(data, "verifier", s, last, M8) else "") for s, r in fired)
        + ("; the policy did drift toward what the previous round's PRM over-rates" if fired else "")
        + f". In round {last} it stayed "
        + ("quiet" if not any(x > threshold for arm in ("frozen", "noreplay") for x in rise(arm, last)) else "not quiet")
        + f" on the frozen PRM ({seq(rise('frozen', last))}) and on the PRM retrained without replay "
          f"({seq(rise('noreplay', last))}); their round 1 is the prm arm's, read against the same round-0 PRM. So the "
          f"goal is **{'met' if len(caught) == n else 'not met'} for the exploitable RM ({len(caught)} of {n} seeds) "
          f"and {'met' if not fired else 'not met'} for the retrained one ({len(quiet)} of {n} seeds)**."
        + (f" The threshold was not retuned on this: {len(fired)} of {n * len(later)} rounds alarmed, a reason to "
           f"look at that run, which is what a monitor is for, not evidence that {threshold} is wrong. How noisy "
           f"the held-out reference is, by a bootstrap over its prompts, and why the threshold stays (not kept as "
           f"units): [{NOTES}]({NOTES}#the-monitors-noise)." if fired else ""),
    ]
    return md


def pass_maj(data: dict, seed_list: list[int], last: int, units: dict) -> list[str] | None:
    """3. Maj@K and Pass@K, round 0 against the last round, of the prm arm."""
    ks = sorted(int(k.split("@")[1]) for k in data.get("prm", {}).get(seed_list[0], {}).get(0, {})
                if k.startswith("eval/pass@"))
    if len(ks) < 3 or not complete(data, ["prm"], seed_list, range(last + 1), *(f"eval/{m}@{k}" for m in ("maj", "pass")
                                                                               for k in ks)):
        return None
    n = len(seed_list)
    maj = {k: statistics.mean(gains(data, "prm", last, f"eval/maj@{k}")) for k in ks}
    pas = {k: gains(data, "prm", last, f"eval/pass@{k}") for k in ks}
    top, mid = ks[-1], ks[len(ks) // 2]
    fell = [(s, d) for s, d in zip(seed_list, pas[top]) if d < 0]
    sharpens = min(maj.values()) > statistics.mean(pas[top])
    return [
        f"**What held / what did not ({when(units, [f'prm-s{s}' for s in seed_list], n)}):** "
        f"**{'Held' if sharpens else 'Did not hold'}:** RL sharpens the output distribution rather than widening it "
        f"(DeepSeekMath Fig. 7). From round 0 to round {last} of the prm arm, Maj@K gains {span(maj.values(), '+.2f', ' to ')} "
        f"at every K from {ks[0]} to {top}, while Pass@K's gain shrinks as K grows: "
        f"{statistics.mean(pas[ks[0]]):+.3f} at K = {ks[0]}, {statistics.mean(pas[mid]):+.3f} at K = {mid}, "
        f"{statistics.mean(pas[top]):+.3f} ± {statistics.stdev(pas[top]):.3f} SD over seeds at K = {top}. Pass@{top} "
        + ("did not fall as in the paper" if statistics.mean(pas[top]) >= 0 else "fell as in the paper")
        + f" in the mean ({statistics.mean(per_seed(data, 'prm', seed_list, 0, f'eval/pass@{top}')):.3f} -> "
          f"{statistics.mean(per_seed(data, 'prm', seed_list, last, f'eval/pass@{top}')):.3f}"
        + "".join(f"; {d:+.3f} in seed {s}" for s, d in fell)
        + "): on this task it is at the ceiling."]


def mc_labels(mc: list[dict], units: dict, seed_list: list[int]) -> list[str] | None:
    """4. MC step labels' agreement with gold against N (the `mc-s<seed>` units' `by_n`)."""
    if len(mc) < len(seed_list):
        return None
    ns = sorted(int(k) for k in mc[0]["by_n"])
    mean = {key: {k: statistics.mean(m["by_n"][str(k)][key] for m in mc) for k in ns} for key in ("he", "se")}
    peak = max(ns, key=lambda k: mean["se"][k])
    after = [mean["se"][k] for k in ns if k > peak]
    he_rises = all(mean["he"][a] <= mean["he"][b] for a, b in zip(ns, ns[1:]))
    per_n = statistics.mean(m["by_n"][str(k)]["rollouts_per_sample"] / k for m in mc for k in ns)
    shown = [ns[0], ns[len(ns) // 2], ns[-1]]
    return [
        f"**What held / what did not ({when(units, [f'mc-s{s}' for s in seed_list], len(seed_list))}):** "
        f"**{'Did not hold' if he_rises else 'Held'}:** Math-Shepherd's pattern (hard estimation best at small N and "
        "worse as N grows, soft estimation improving). Here hard estimation's agreement with the exact gold labels "
        + ("rises with N (" if he_rises else "moves with N (")
        + ", ".join(f"{mean['he'][k]:.3f} at N = {k}" for k in shown)
        + f") and soft estimation's peaks at N = {peak} ({mean['se'][peak]:.3f})"
        + (f", then stays near {statistics.mean(after):.2f}" if after else "")
        + ". On integer arithmetic a wrong step almost never reaches the right answer by luck, so \"some completion "
          "reaches it\" (HE) is nearly the gold label once N rollouts find one, while SE's fraction marks a right "
          f"step down for the errors made after it. Cost: about {per_n:.1f} rollouts per sample per unit of N (every "
          "step but the last is probed: the last step's label is the sample's own outcome)."]


def best_of_n(data: dict, seed_list: list[int], last: int, units: dict) -> list[str] | None:
    """5. Best-of-N: the RM-weighted vote and the RM's single pick against majority."""
    n, ends = len(seed_list), sorted({0, last})
    ns = sorted(int(k.split("@")[1]) for k in data.get("prm", {}).get(seed_list[0], {}).get(0, {})
                if k.startswith("bon/prm_vote@"))
    ns = [k for k in ns if k > 1]  # at N = 1 every pick is the one sample
    picks = ("prm", "prm_vote", "orm_vote", "majority", "random")
    if not ns or not complete(data, ["prm"], seed_list, ends, *(f"bon/{w}@{k}" for w in picks for k in ns)):
        return None
    cell = lambda s, r, w, k: at(data, "prm", s, r, f"bon/{w}@{k}")  # noqa: E731
    margin = {(s, r, k): cell(s, r, "prm_vote", k) - cell(s, r, "majority", k) for s in seed_list for r in ends
              for k in ns}
    orm = {key: cell(*key[:2], "orm_vote", key[2]) - cell(*key[:2], "majority", key[2]) for key in margin}
    mean = lambda r, w, k: statistics.mean(cell(s, r, w, k) for s in seed_list)  # noqa: E731
    lows = {r: min(((s, k) for s in seed_list for k in ns), key=lambda sk: margin[(sk[0], r, sk[1])]) for r in ends}

    def prm_below(r: int) -> int | None:  # the smallest N from which the PRM's pick stays below majority, in the mean
        below_from = [k for i, k in enumerate(ns) if all(mean(r, "prm", m) < mean(r, "majority", m) for m in ns[i:])]
        return below_from[0] if below_from else None

    falls = {r: k for r in ends if (k := prm_below(r)) is not None}
    top, rlast = ns[-1], ends[-1]
    random_wins = sum(cell(s, rlast, "random", top) > cell(s, rlast, "prm", top) for s in seed_list)
    orm_misses = [key for key, d in orm.items() if d < 0]
    md = (f"**What held / what did not ({when(units, [f'prm-s{s}' for s in seed_list], n)}):** "
          f"**{'Held' if all(d >= 0 for d in margin.values()) else 'Did not hold'}: the RM-weighted vote** "
          f"(Math-Shepherd's best verifier) is at or above plain majority at every N from {ns[0]} to {top}, in round "
          f"{' and round '.join(map(str, ends))}, in every seed: {sum(d >= 0 for d in margin.values())} of "
          f"{len(margin)} comparisons (issue 16's goal). The mean margin is "
          + " and ".join(f"{span([statistics.mean(margin[(s, r, k)] for s in seed_list) for k in ns], '+.2f', ' to ')}"
                         f" in round {r}" for r in ends)
          + ", the gain shrinking as the policy's own majority nears the ceiling; per seed the smallest is "
          + " and ".join(f"{margin[(s, r, k)]:+.3f} in round {r} (seed {s}, N = {k})" for r, (s, k) in lows.items())
          + f". The ORM's vote is at or above majority in {len(orm) - len(orm_misses)} of {len(orm)}"
          + "".join(f" (seed {s}, round {r}, N = {k}: {orm[(s, r, k)]:+.3f})" for s, r, k in orm_misses) + ".")
    if falls:
        md += (" **Did not hold: best-of-N by the RM alone.** The PRM's single pick beats majority at small N, then "
               "falls with N, where Math-Shepherd's keeps gaining: below majority "
               + " and ".join(f"{'at' if k == top else 'from'} N = {k} in round {r} ({mean(r, 'prm', k):.3f} against "
                              f"{mean(r, 'majority', k):.3f})" for r, k in falls.items())
               + (f", and below a random pick at N = {top} in round {rlast} ({mean(rlast, 'prm', top):.3f} against "
                  f"{mean(rlast, 'random', top):.3f} in the mean; in {seeds(random_wins, n)})" if random_wins else "")
               + ". A small PRM's errors are confident false positives, which one pick trusts and a vote outweighs.")
    return [md]


def issue16_goals(data: dict, seed_list: list[int], last: int, units: dict, hybrid: str | None, grid: list[str],
                  study: list[dict]) -> list[str] | None:
    """6. Issue 16's goals: hybrid credit, the oracle, the vote, the monitor, the PRM's step AUC (and what limits it:
    experiments/prm_study.py's kept runs), the quickstart's time."""
    share = "policy/process_variance_share"
    if hybrid is None or not (complete(data, ["verifier", "prm", "oracle", hybrid], seed_list, range(last + 1))
                              and complete(data, [hybrid], seed_list, range(1, last + 1), share)
                              and complete(data, ["prm"], seed_list, range(last + 1), AUC)
                              and complete(data, ["prm"], seed_list, range(1, last + 1), "monitor/prm_alarm")
                              and complete(data, ["exploit"], seed_list, [1], "monitor/prm_alarm")):
        return None
    n, s0 = len(seed_list), seed_list[0]
    hyb, oracle = paired(data, hybrid, "verifier", last, M8), paired(data, "oracle", "verifier", last, M8)
    prm = paired(data, "prm", "verifier", last, M8)
    ver0 = at(data, "verifier", s0, last, M8)
    others = [arm for arm in grid if arm != hybrid and complete(data, [arm], [s0], range(1, last + 1), M8, share)]
    shares = lambda arm: [at(data, arm, s0, r, share) for r in range(1, last + 1)]  # noqa: E731
    ran = [arm for arm in grid if f"{arm}-s{s0}" in units and complete(data, [arm], [s0], [0])]
    commits, firsts = {units[f"{arm}-s{s0}"]["commit"] for arm in ran}, [at(data, arm, s0, 0, M8) for arm in ran]
    ns = sorted(int(k.split("@")[1]) for k in data["prm"][s0][0] if k.startswith("bon/prm_vote@"))
    vote = [at(data, "prm", s, r, f"bon/prm_vote@{k}") - at(data, "prm", s, r, f"bon/majority@{k}")
            for s in seed_list for r in sorted({0, last}) for k in ns[1:]  # at N = 1 the vote is majority's pick
            if at(data, "prm", s, r, f"bon/prm_vote@{k}") is not None]
    exploit = [s for s in seed_list if at(data, "exploit", s, 1, "monitor/prm_alarm") == 1]
    fired = [(s, r) for s in seed_list for r in range(1, last + 1) if at(data, "prm", s, r, "monitor/prm_alarm") == 1]
    auc = {s: [at(data, "prm", s, r, AUC) for r in range(last + 1)] for s in seed_list}
    reach = sum(x >= GOAL_AUC for xs in auc.values() for x in xs)
    k, of = GOAL_SEEDS
    md = [f"**What held / what did not ({when(units, [f'{a}-s{s}' for a in ('verifier', 'prm', 'oracle', hybrid) for s in seed_list], n)}; "  # noqa: E501
          "issue 16's goals):**",
          f"- *Hybrid >= the verifier at Maj@8 after {last} RL rounds, in the mean and in {k} of {of} seeds, with the "
          f"PRM term carrying >= {GOAL_SHARE:.0%} of the advantages' variance:* "
          f"**{'met' if statistics.mean(hyb) >= 0 and at_or_above(hyb) >= k * n / of else 'not met'}.** On seed {s0} "
          + ("every hybrid of the grid ended below the verifier"
             if all(at(data, arm, s0, last, M8) < ver0 for arm in [*others, hybrid])
             else "the grid's hybrids against the verifier")
          + f" ({ver0:.3f}): "
          + "; ".join(f"{_label(arm)} {at(data, arm, s0, last, M8):.3f} (PRM share {span(shares(arm))})"
                      for arm in others)
          + f"; {_label(hybrid)} {at(data, hybrid, s0, last, M8):.3f} (share {span(shares(hybrid))}), the one chosen"
          + (f" (the grid's units ran from {', '.join(f'`{c}`' for c in sorted(commits))}; its round 0, where the arms do "
             "not differ yet, is " + ("the same Maj@8 in every one of them: " if len({f"{x:.3f}" for x in firsts}) == 1 else "Maj@8 ")
             + f"{span(firsts, '.3f')})" if len(commits) > 1 else "")
          + f". On the {n} seeds the chosen one ends {seq(hyb)} from the verifier (mean {fmt_se(hyb)}), below in "
            f"{seeds(below(hyb), n)}, with the PRM term at {span(per_seed(data, hybrid, seed_list, last, share))} of "
            f"the variance in round {last} (that condition "
          + ("holds" if min(per_seed(data, hybrid, seed_list, last, share)) >= GOAL_SHARE else "fails") + "). "
          + ("The sign is the same in every seed here and in every earlier measurement ([lab/results-history.md]"
             "(lab/results-history.md), sections 6 and 8): PRM credit, at any weight tried, does not improve on the "
             "verifier on this task. " if same_sign(hyb) and statistics.mean(hyb) < 0 else "")
          + f"Mixed in at the chosen weight it costs {fmt_se(hyb)}, where process supervision alone costs "
            f"{fmt_se(prm)}.",
          f"- *The oracle PRM >= the verifier:* **{'met' if statistics.mean(oracle) >= 0 else 'not met'}**: exact gold "
          f"step labels as step rewards end {seq(oracle)} from the verifier (mean {fmt_se(oracle)}), below in "
          f"{seeds(below(oracle), n)}."
          + (" **On this task, at these budgets, process supervision does not pay**, and a better PRM would not "
             "change that. A likely reason: the policy's main error is the slip on the Answer line that its SFT data "
             "teaches, and the verifier's outcome already pins that step; per-step credit spreads the push over "
             "steps that were right anyway." if not pays(oracle) else ""),
          f"- *PRM-weighted voting >= plain majority at every N, round 0 and the last round:* "
          f"**{'met' if all(d >= 0 for d in vote) else 'not met'}**, {sum(d >= 0 for d in vote)} of {len(vote)} "
          "(section 5).",
          f"- *The monitor fires on the exploitable RM within {GOAL_MONITOR_ROUNDS} rounds and stays quiet on the "
          f"retrained one:* **{'met' if len(exploit) == n else 'not met'} for the exploitable RM** (round 1, in "
          f"{seeds(len(exploit), n)}), **{'met' if not fired else 'not met'} for the retrained one**"
          + (" (it fired in " + ", ".join(f"round {r} of seed {s}" for s, r in fired) + "; section 2)." if fired else "."),
          f"- *PRM step AUC against gold >= {GOAL_AUC} in every round of the quickstart, every seed:* "
          f"**{'met' if reach == n * (last + 1) else 'not met'}**: on the prm arm's eval samples, rounds 0-{last} by "
          "seed, " + "; ".join(f"{seq(xs, '.3f', ' / ')} (seed {s})" for s, xs in auc.items())
          + f": {reach} of {n * (last + 1)} cells reach it. Hard targets (the study's winner, now the quickstart's "
            "`reward_model.target`; the code's default stays `soft`; [lab/results-history.md](lab/results-history.md) "
            "section 6) were the largest gain found before." + prm_study_findings(study),
          f"- *The quickstart no longer than {GOAL_TIME[1]} minutes where it took {GOAL_TIME[0]}:* **met as a ratio** on "
          f"one machine (`bench/quickstart_time.py`; the ratio, not kept as a unit: [{NOTES}]({NOTES}#the-quickstarts-"
          "time))."]
    return md


def _label(arm: str) -> str:
    return LABELS[arm]


# --- what limits the PRM: experiments/prm_study.py's kept runs -------------------------------------------


def _rows(study: list[dict]) -> dict[tuple[int, tuple[int, int], str], dict]:
    """(seed, (prompts, samples), variant) -> round -> its figures."""
    return {(k["seed"], tuple(k["collect"]), v): {int(r): f for r, f in rounds.items()}
            for k in study for v, rounds in k["results"].items()}


def prm_study_findings(study: list[dict]) -> str:
    """The PRM study's reading: more rows lift the step AUC, a bigger backbone and class balance do not (mostly);
    every figure from its kept runs (the table above holds each row). Empty without the rows it reads."""
    rows = _rows(study)
    base, more, spread = (192, 8), (384, 8), (384, 4)
    seed_list = sorted({s for s, c, v in rows if (s, base, "default") in rows})
    test = lambda key: [rows[key][r]["test"]["step_auc_gold"] for r in sorted(rows[key])]  # noqa: E731
    secs = lambda key: statistics.mean(rows[key][r]["train_seconds"] for r in rows[key])  # noqa: E731
    if not seed_list or not all((s, more, "default") in rows for s in seed_list):
        return ""
    n_cells = lambda keys: sum(x >= GOAL_AUC for key in keys for x in test(key))  # noqa: E731
    cells = lambda keys: sum(len(test(key)) for key in keys)  # noqa: E731
    allmean = lambda keys: statistics.mean(x for key in keys for x in test(key))  # noqa: E731
    d = {s: (s, base, "default") for s in seed_list}
    m = {s: (s, more, "default") for s in seed_list}
    lift = {s: statistics.mean(test(m[s])) - statistics.mean(test(d[s])) for s in seed_list}
    worst = min(seed_list, key=lambda s: lift[s])
    out = (f" **What limits it now is mostly the rows** (the study table above: each seed's verifier arm run again by "
           "`igrpo run` with the arm's overrides, `reward_model.kinds=[prm]`, on the same pinned kernels, and the "
           "collection changed: `--set collect.prompts_per_round=384`, with `collect.samples_per_prompt=4` for the "
           "rows of fewer samples a prompt; its policies are the verifier arm's to the bit, since an "
           "outcome-supervised policy does not depend on what is collected, so a seed's rows score the same test "
           "samples; the study's PRMs learn from verifier-arm shards, so its figures are not the prm arm's). At "
           f"{base[0]} prompts x {base[1]} the study's PRM reaches {GOAL_AUC} in {n_cells(d.values())} of "
           f"{cells(d.values())} (seed, round) cells (mean {allmean(d.values()):.3f}); at {more[0]} x {more[1]} in "
           f"{n_cells(m.values())} of {cells(m.values())} (mean {allmean(m.values()):.3f}; per seed "
           + ", ".join(f"{lift[s]:+.3f} on seed {s}" for s in sorted(seed_list, key=lambda s: -lift[s]))
           + f", seed {worst}'s rounds 1 and later at {listing(test(m[worst])[1:])}).")
    half = "default+reward_model.train_args.num_train_epochs=3"  # half the RM's epochs
    for s in [s for s in seed_list if (s, more, half) in rows]:
        xs = test((s, more, half))
        out += (f" Twice the rows at half the epochs (seed {s}: the same training cost) keeps "
                + ("most of the gain" if statistics.mean(xs) > statistics.mean(test(d[s])) else "none of the gain")
                + (f" but not {GOAL_AUC}" if min(xs) < GOAL_AUC else "")
                + f" (mean {statistics.mean(xs):.3f}, min {min(xs):.3f}).")
    if all((s, spread, "default") in rows for s in seed_list):
        sp = {s: statistics.mean(test((s, spread, "default"))) - statistics.mean(test(d[s])) for s in seed_list}
        out += (f" The same samples spread over {spread[0]} prompts x {spread[1]} (no extra cost) are "
                + ("no steady gain: " if min(sp.values()) < 0 < max(sp.values()) else "a change of ")
                + ", ".join(f"{sp[s]:+.3f} on seed {s} (mean {statistics.mean(test((s, spread, 'default'))):.3f} "
                            f"against {statistics.mean(test(d[s])):.3f})" for s in sorted(seed_list, key=lambda s: -sp[s]))
                + f". Doubling the rows makes the quickstart longer than the goal allows (an estimate from these runs' "
                  f"phase times, not a timed quickstart: [{NOTES}]({NOTES}#more-rows-a-round)): **on this backbone "
                  "the two halves of the goal conflict**, so the default is unchanged.")
    if CONTENDED in rows:
        out += (f" The study's `train s/round` on seed {CONTENDED[0]} at {base[0]} x {base[1]} "
                f"({secs(CONTENDED):.0f}) ran beside another training; its AUCs do not depend on that.")
    return out + _backbone(rows, seed_list, d, test, secs, n_cells, cells, allmean) + _balanced(
        rows, seed_list, d, test, secs, n_cells, cells, allmean)


def _backbone(rows: dict, seed_list: list[int], d: dict, test: Callable, secs: Callable, n_cells: Callable,
              cells: Callable, allmean: Callable) -> str:
    """The PRM on a bigger backbone (`default+reward_model.model=...lr1e-3...` rows), and at a third of its rate."""
    prefix = "default+reward_model.model=runs/backbones/sft256x6-lr1e-3-s"
    big = {s: (s, (192, 8), f"{prefix}{s}/policy") for s in seed_list}
    if not all(k in rows for k in big.values()):
        return ""
    slow = {s: (s, (192, 8), f"{prefix}{s}/policy+reward_model.train_args.learning_rate=1e-4") for s in seed_list}
    slow = {s: k for s, k in slow.items() if k in rows}
    by_seed = {s: statistics.mean(test(big[s])) - statistics.mean(test(d[s])) for s in seed_list}
    timed = [k for k in d.values() if k != CONTENDED]
    ratio = statistics.mean(secs(k) for k in big.values()) / statistics.mean(secs(k) for k in timed)
    helped = max(seed_list, key=lambda s: by_seed[s])
    weakest = min(seed_list, key=lambda s: statistics.mean(test(d[s])))
    out = (" **Nor is it mostly the backbone's capacity**: the same study with the PRM on a backbone larger than the "
           "policy's (`reward_model.model`; the rows `default+reward_model.model=...`), a tiny model SFT'd on each "
           "seed's data by `igrpo bootstrap configs/quickstart.yaml --set run.seed=S --set policy.tiny.hidden_size=256 "
           "--set policy.tiny.num_layers=6 --set policy.tiny.num_heads=8 --set policy.tiny.intermediate_size=768 "
           "--set bootstrap.sft_args.learning_rate=1e-3 --out runs/backbones/sft256x6-lr1e-3-sS/policy` (its size, "
           f"SFT time and accuracy, not kept as units: [{NOTES}]({NOTES}#the-bigger-backbone); the row at the "
           "quickstart's SFT rate, `lr2e-3`, trained badly and is kept for the record), then `python -m "
           "experiments.prm_study --run runs/exp/verifier-sS --only default --set "
           "reward_model.model=runs/backbones/sft256x6-lr1e-3-sS/policy --figures docs/experiments`, on the "
           f"quickstart's rows and RM settings: {n_cells(big.values())} of {cells(big.values())} cells at {GOAL_AUC} "
           f"(mean {allmean(big.values()):.3f} against {allmean(d.values()):.3f} on the policy's backbone: "
           + ", ".join(f"{by_seed[s]:+.3f}" for s in seed_list) + " by seed). It lifts "
           + ("the weakest seed, not the others" if helped == weakest and sum(x > 0 for x in by_seed.values()) == 1
              else "some seeds")
           + f", at about {ratio:.0f}x the PRM's training time ({span([secs(k) for k in big.values()], '.0f')} s a "
             f"round against {span([secs(k) for k in timed], '.0f')}) plus a backbone SFT the quickstart does "
             "not have")
    if slow:
        out += ("; at a third of its learning rate (`learning_rate=1e-4`, seeds " + " and ".join(map(str, slow))
                + ") " + ("no better" if allmean(slow.values()) <= allmean([big[s] for s in slow]) + 0.01 else "better")
                + ": " + " and ".join(f"mean {statistics.mean(test(k)):.3f}" for k in slow.values())
                + "".join(f", seed {s}'s last round still at {test(k)[-1]:.3f}" for s, k in slow.items()
                          if test(k)[-1] == min(test(x)[-1] for x in slow.values())))
    return out + "."


def _balanced(rows: dict, seed_list: list[int], d: dict, test: Callable, secs: Callable, n_cells: Callable,
              cells: Callable, allmean: Callable) -> str:
    """Class balance (`balanced` rows: samples with an HE-wrong step oversampled to half the training rows)."""
    bal = {s: (s, (192, 8), "balanced") for s in seed_list}
    if not all(k in rows for k in bal.values()):
        return ""
    by_seed = [statistics.mean(test(bal[s])) - statistics.mean(test(d[s])) for s in seed_list]
    timed = [k for k in d.values() if k != CONTENDED]
    ratio = statistics.mean(secs(k) for k in bal.values()) / statistics.mean(secs(k) for k in timed)
    return (" **Nor class balance** (`python -m experiments.prm_study --run runs/exp/verifier-sS --only balanced "
            "--figures docs/experiments`, the `balanced` rows: samples with an HE-wrong step oversampled to half the "
            "training rows, the lever that lifted SmolLM2's PRM, [lab/smollm2-arith.md](lab/smollm2-arith.md#a-real-"
            f"model-on-arithmetic)): {n_cells(bal.values())} of {cells(bal.values())} cells at {GOAL_AUC} (the "
            f"default: {n_cells(d.values())} of {cells(d.values())}), mean {allmean(bal.values()):.3f} against the "
            f"default's {allmean(d.values()):.3f} ({seq(by_seed)} by seed), at {ratio:.1f}x the PRM's training time "
            f"({span([secs(k) for k in bal.values()], '.0f')} s a round against "
            f"{span([secs(k) for k in timed], '.0f')}): no default change.")
