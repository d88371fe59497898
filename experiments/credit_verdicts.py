"""The verdicts of docs/results.md's credit-study section, written from its kept units as its tables are (issue 57,
point 5; experiments/verdicts.py does the same for sections 1-6, and its wording helpers are these'): issue 39's
arms on the two tasks (`issue39`), issue 47's study from one commit (`issue47`) and SmolLM2 beside its control
(`smollm2`); experiments/credit_study.py passes each its kept units and their figures. Every figure is computed here from the kept units; a verdict is None until every unit it reads is kept.
A string here types no figure: digits only in inline code and citations; the rule's thresholds are the report's.
"""

from __future__ import annotations

import math
import statistics

from experiments.smollm2_control import METRICS, policy
from experiments.stats import fmt_se, mean_se, pays, verdict
from experiments.verdicts import at_or_above, below, listing, seeds, seq, span
from pipeline.evaluate import paired_difference

M8 = "eval/maj@8"
# Issue 39's goals, as it set them: a learned RM at or above the verifier in the mean and in 2 of 3 seeds.
GOAL_SEEDS = (2, 3)
LEARNED_PROGRESS = {"labeltoken-progress": "the label-token PRM with progress credit",
                    "prm-progress": "the value-head PRM with progress credit"}


def machine_words(units: dict) -> str:
    """'pinned AVX2 kernels at 2 threads, AMD EPYC, 2 cores' from the units' `machine` (the runner's wording)."""
    words = set()
    for u in units.values():
        cpu, _, rest = u["machine"].partition(", torch ")
        parts = rest.split(", ")[1:]  # past the torch version: "<ISA> kernels", "<n> threads"
        native = any("native" in p for p in parts)
        words.add(f"{'native' if native else 'pinned'} {' at '.join(p.replace(' (native)', '') for p in parts)}, "
                  f"{cpu.replace('Intel(R) Xeon(R) Processor', 'Intel Xeon')}")
    return "; ".join(sorted(words))


def dates(units: dict) -> str:
    days = sorted({u["date"] for u in units.values() if "date" in u})
    return " to ".join(dict.fromkeys([days[0], days[-1]])) if days else "undated"


def gaps(data: dict, arm: str, last: int, base: str = "verifier") -> list[float]:
    """Per-seed `arm - base` in Maj@8 at round `last`, over the seeds both have."""
    return [m[last][M8] - data[base][s][last][M8] for s, m in sorted(data.get(arm, {}).items())
            if last in m and last in data.get(base, {}).get(s, {})]


def slashed(xs: list[float]) -> str:
    return seq(xs, "+.3f", " / ")


def ready(data: dict, arms: list[str], n: int, last: int) -> bool:
    return all(len(gaps(data, arm, last)) == n for arm in arms) and len(data.get("verifier", {})) == n


def share(data: dict, arm: str, last: int) -> float:
    """The arm's mean advantage mean / RMS over its seeds and RL rounds (the table's column)."""
    return statistics.mean(m[r]["policy/advantage_mean_share"] for m in data[arm].values() for r in range(1, last + 1)
                           if "policy/advantage_mean_share" in m.get(r, {}))


def issue39(kept: dict[str, dict], data: dict[str, dict], last: int) -> list[str] | None:
    """Issue 39's arms on the quickstart and long chains against its goals (`kept`: task -> its units; `data`: task
    -> experiments/credit_study.py's `figures` of them)."""
    q, lc = data.get("quickstart", {}), data.get("long-chains", {})
    n = len(q.get("verifier", {}))
    learned = [*LEARNED_PROGRESS, "implicit"]
    if not n or not ready(q, ["oracle", "oracle-progress", *learned, "oracle-centred", "implicit-centred"], n, last) \
            or not ready(lc, ["oracle", "oracle-progress", *learned, "prm-progress-w3"], n, last):
        return None
    units = {(task, k): u for task, us in kept.items() for k, u in us.items()}
    code = [f"{c}'s" for c in sorted({u["commit"].removesuffix("-dirty") for u in units.values()})]
    per_problem = any("per_problem" in u for u in units.values())
    return [
        f"**What held / what did not ({dates(units)}, {machine_words(units)}; the units' commits are named above, "
        f"the code they ran is {listing(code, 's')}, which differ in a network-filesystem check "
        "of the MLflow store and in bench/ code only; `-dirty`: docs were being edited beside them).** How the units "
        "were run (the commands, worktrees, pauses): [lab/credit-study.md](lab/credit-study.md). The progress arms' "
        "prover is the round's policy, with hard targets (Best-of-N of it, N = `collect.rollouts_per_step`). Every "
        f"figure here is computed from the kept units of the tables above: gaps are round {last}'s Maj@8 against the "
        f"verifier arm of the same seed, mean ± SE over {n} seeds, a rough SE from so few"
        + ("" if per_problem else "; the units kept no per-problem eval figures, so no per-problem paired SE can be "
           "given") + ". These units ran before the decision rule was fixed: their verdict column applies it after "
                     "the fact.",
        _goal1(q, lc, n, last), *_oracle(q, lc, n, last), _goal2(lc, n, last),
        "- **Goal 3 and goal 4, SmolLM2's**: their figures were not kept (its runs' directories are gone and no "
        "summary of them was written under docs/experiments/, except the first rows of the label-token study, "
        "`docs/experiments/credit/smollm2-label-prm-study.json`), so they are not reported here; they stay in the lab "
        "log, marked not kept: [lab/smollm2-arith.md](lab/smollm2-arith.md#progress-credit-and-the-implicit-prm-issue-"
        "39). SmolLM2's hybrid arm had no verifier-only control; the one run since is the section above.",
        *_why(q, last)]


def _goal1(q: dict, lc: dict, n: int, last: int) -> str:
    """Goal 1: a learned PRM at or above the verifier, on either task; the implicit PRM and the larger weight."""
    k_goal, of = GOAL_SEEDS

    def meets(d: list[float]) -> tuple[bool, bool]:  # (in the mean, in enough seeds)
        return statistics.mean(d) >= 0, at_or_above(d) >= k_goal * len(d) / of

    def arm_gap(data: dict, arm: str, spelled: bool = False) -> str:
        d = gaps(data, arm, last)
        return f"{fmt_se(d)} ({at_or_above(d)} of {len(d)}" + (f": {slashed(d)})" if spelled else ")")

    goal1 = {(t, arm): meets(gaps(d, arm, last)) for t, d in (("q", q), ("lc", lc)) for arm in LEARNED_PROGRESS}
    met1 = [key for key, m in goal1.items() if all(m)]
    weak = min(lc["verifier"], key=lambda s: lc["verifier"][s][0][M8])  # the seed whose SFT policy starts lowest
    lose = [s for s in lc["verifier"] if all(lc[a][s][last][M8] < lc["verifier"][s][last][M8] for a in LEARNED_PROGRESS)]
    other = [abs(g) for a in LEARNED_PROGRESS for s, g in zip(sorted(lc[a]), gaps(lc, a, last)) if s not in lose]
    imp, label = gaps(lc, "implicit", last), gaps(q, "labeltoken-progress", last)
    worst = min(lc["implicit"], key=lambda s: lc["implicit"][s][last][M8])
    w3, w1 = gaps(lc, "prm-progress-w3", last), gaps(lc, "prm-progress", last)
    return (
        f"- **Goal 1, a learned RM at or above the verifier on a tiny task, in the mean and in {k_goal} of {of} seeds: "
        + ("met by " + ", ".join(f"`{arm}` ({'quickstart' if t == 'q' else 'long chains'})" for t, arm in met1)
           if met1 else "not met on either task")
        + ("; each learned progress arm meets one of the two conditions, never both**"
           if all(sum(m) == 1 for m in goal1.values()) else "**")
        + (", and none pays by the rule." if not any(pays(gaps(d, a, last)) for d in (q, lc)
                                                   for a in [*LEARNED_PROGRESS, "implicit"]) else ".")
        + f" Quickstart: {LEARNED_PROGRESS['labeltoken-progress']} {fmt_se(label)} in the mean, at or above in "
          f"{at_or_above(label)} of {n} seeds ({slashed(label)}); {LEARNED_PROGRESS['prm-progress']} "
          f"{arm_gap(q, 'prm-progress')}; the implicit PRM in hybrid mode {arm_gap(q, 'implicit')}, with no "
          f"Monte-Carlo rollouts. Long chains: {LEARNED_PROGRESS['labeltoken-progress']} "
          f"{arm_gap(lc, 'labeltoken-progress', True)}; {LEARNED_PROGRESS['prm-progress']} "
          f"{arm_gap(lc, 'prm-progress', True)}"
        + (f"; both are below on seed {listing(lose, 'd')}, "
           + ("the seed whose SFT policy is weakest, " if lose == [weak] else "")
           + f"and within {max(other):.3f} of the verifier on the others" if lose and other else "")
        + f". The implicit PRM in hybrid mode takes seed {worst}'s policy down to Maj@8 "
          f"{lc['implicit'][worst][last][M8]:.3f} at round {last} (round by round in its kept unit, "
          f"`docs/experiments/credit/long-chains/implicit-s{worst}.json`) and is below on "
          f"{seeds(below(imp), n)} ({slashed(imp)}): {fmt_se(imp)}, {at_or_above(imp)} of {n}. **The lever, PAV's "
          f"larger weight, makes it {'worse' if statistics.mean(w3) < statistics.mean(w1) else 'no worse'}**: the "
          "value-head PRM with progress credit at a larger `process_weight` (`prm-progress-w3`) is below the verifier "
          f"on {seeds(below(w3), n)}, {fmt_se(w3)} ({slashed(w3)}), and below the same arm at the default weight on "
          f"{seeds(sum(a < b for a, b in zip(w3, w1)), n)}: the learned PRM's step values are not exact enough to "
          "carry more of the advantage.")


def _oracle(q: dict, lc: dict, n: int, last: int) -> list[str]:
    """The oracle's progress credit against its sum-of-values credit, and the centred variants."""
    sum_q, prog_q = gaps(q, "oracle", last), gaps(q, "oracle-progress", last)
    sum_lc, prog_lc = gaps(lc, "oracle", last), gaps(lc, "oracle-progress", last)
    md = [
        f"- **Progress credit moved the oracle from {'below' if statistics.mean(sum_q) < 0 else 'above'} the "
        f"verifier to {'above' if statistics.mean(prog_q) >= 0 else 'below'} it on the quickstart**: with the same "
        f"gold step values, sum-of-values credit (DeepSeekMath's) is {fmt_se(sum_q)} ({at_or_above(sum_q)} of {n} "
        f"seeds), progress credit (hybrid, step credit, the default weight) {fmt_se(prog_q)}, at or above in "
        f"{at_or_above(prog_q)} of {n} seeds: it {verdict(prog_q).replace('pays', 'pays by the rule')}, applied after "
        f"the fact. On long chains the same order holds, inside the noise: sum-of-values credit {fmt_se(sum_lc)} "
        f"({at_or_above(sum_lc)} of {n} seeds: {slashed(sum_lc)}), progress credit {fmt_se(prog_lc)}, above sum "
        f"credit on {seeds(sum(a > b for a, b in zip(prog_lc, sum_lc)), n)}."]
    centred = {arm: gaps(q, f"{arm}-centred", last) for arm in ("oracle", "implicit")}
    if all(below(d) == n for d in centred.values()):
        md.append(
            "- **Centring does not change the sign of either arm below the verifier**, so neither centred variant is "
            "an arm of the study's verdicts: `process_centring: group` takes the per-token mean of the advantages to "
            f"{span([share(q, f'{a}-centred', last) for a in centred])} of their RMS (last column), and the gap moves "
            f"only within the noise, the oracle's from {fmt_se(sum_q)} to {fmt_se(centred['oracle'])}, the implicit "
            f"PRM's from {fmt_se(gaps(q, 'implicit', last))} to {fmt_se(centred['implicit'])}, both below in "
            f"{seeds(n, n)}. The mean the issue named is not what holds sum-of-values credit below the verifier: the "
            f"credit's form is (progress credit, whose mean share is {share(q, 'oracle-progress', last):.2f}, is "
            f"{'above' if statistics.mean(prog_q) >= 0 else 'below'}).")
    return md


def _goal2(lc: dict, n: int, last: int) -> str:
    """Goal 2: the oracle with progress credit at or above the verifier on long chains, and the room they lack."""
    prog = gaps(lc, "oracle-progress", last)
    weak = min(lc["verifier"], key=lambda s: lc["verifier"][s][0][M8])
    first = min(lc["verifier"])
    low = {a: lc[a][weak][last][M8] for a in ("verifier", "oracle-progress", *LEARNED_PROGRESS)}
    return (
        "- **Goal 2, the oracle with progress credit at or above the verifier on long chains: "
        + ("met in the mean, as a tie, not a win** (it does not pay by the rule)" if statistics.mean(prog) >= 0
           and not pays(prog) else f"{'met' if statistics.mean(prog) >= 0 else 'not met'}**")
        + f": {fmt_se(prog)} over {n} seeds ({slashed(prog)}: at or above in {at_or_above(prog)} of {n}). "
          "Long chains leave little to assign (docs/supervision.md, \"A task where credit matters\"): round 0's Maj@8 "
          f"is {lc['verifier'][first][0][M8]:.3f} on seed {first}, and on seed {weak}, whose policy starts lowest "
          f"({lc['verifier'][weak][0][M8]:.3f}), {last} RL rounds of either arm leave it there "
          f"({low['verifier']:.3f}, {low['oracle-progress']:.3f}). The learned PRMs with progress credit take seed "
          f"{weak} to {low['prm-progress']:.3f} and {low['labeltoken-progress']:.3f} at round {last}"
        + (": below on the seed with room (goal 1 above)." if max(low[a] for a in LEARNED_PROGRESS) < low["verifier"]
           else "."))


def _why(q: dict, last: int) -> list[str]:
    """Why the arms rank as they do, where the two furthest below are the two with sum-of-values credit."""
    means = {a: statistics.mean(gaps(q, a, last)) for a in ("oracle", "implicit", "oracle-progress", *LEARNED_PROGRESS)}
    if sorted(means, key=means.get)[:2] != ["oracle", "implicit"]:
        return []
    return [
        "- Why the arms rank as they do: the two arms furthest below the verifier are the two whose process term is "
        "a sum over the steps after a token (the oracle's values, the implicit PRM's); on the quickstart they carry "
        f"the largest per-token advantage mean, {span([share(q, a, last) for a in ('oracle', 'implicit')], '.2f', ' to ')}"
        " of the advantages' RMS, against "
        f"{span([share(q, a, last) for a in ('oracle-progress', *LEARNED_PROGRESS)], '.2f', ' to ')} for the "
        "step-credit progress arms (last column), but removing that mean leaves them below (above). What a token "
        "is credited with, the values of every later step rather than its own step's change, is what separates "
        "them."]


def issue47(units: dict[str, dict], data: dict, long_chains: dict, last: int, steps: int,
            room_test: tuple[tuple[float, float], float]) -> list[str] | None:
    """Issue 47's study from one commit (`units`: its quickstart units, `data` their `figures`), each arm against the
    verifier by the rule; `long_chains` (the `figures` of issue 39's units there) for the room it lacks, `steps` the
    task's GRPO steps a round, `room_test` the room's bounds on round 0's Maj@8 and the least gain."""
    (lo, hi), min_gain = room_test
    base = data.get("verifier", {})
    arms = [a for a in ("oracle-progress", "prm-progress", "labeltoken-progress", "implicit-prime", "mc-progress",
                        "mc-progress-wc") if a in data]
    n = len(base)
    if n < 3 or "oracle-progress" not in arms or not all(len(gaps(data, a, last)) == n for a in arms):
        return None
    tried = sorted({name.rsplit("-s", 1)[0] for name in units} - {"verifier", "sft"})
    commits = listing(sorted({f"`{u['commit']}`" for u in units.values()}), "s")
    room = [(base[s][0][M8], base[s][last][M8] - base[s][0][M8], _z(base[s], 0, last)) for s in sorted(base)]
    wall = {a: statistics.median(units[f"{a}-s{s}"]["seconds"] for s in base) for a in ["verifier", *arms]}
    lc = long_chains.get("verifier", {})
    g = {a: gaps(data, a, last) for a in arms}
    per_problem = {a: _problem_gap(data, a, last) for a in arms}
    said = {a: _said(g[a], per_problem[a], n) for a in arms}
    paid = [a for a in arms if pays(g[a])]
    best = max(arms, key=lambda a: statistics.mean(g[a]))
    md = [
        f"**What held in issue 47's study ({dates(units)}, every unit from "
        f"{commits}, {machine_words(units)}; the rule fixed "
        "before its runs; figures from its section above).** "
        + (f"The quickstart is the task with room: on all {n} seeds round 0's Maj@8 is within "
           f"[{lo}, {hi}] and the verifier arm gains at least {min_gain} by round {last} "
           f"({span([x[1] for x in room], '+.3f', ' to ')}, each more than {math.floor(min(x[2] for x in room))} "
           f"paired SE), in about {wall['verifier'] / 60:.0f} minutes a run"
           if all(lo <= x[0] <= hi and x[1] >= min_gain for x in room)
           else "The quickstart's room, per seed, is the table above")
        + (f"; long chains, whose round 0 is already {lc[min(lc)][0][M8]:.3f} on seed {min(lc)}, is not"
           if lc and lc[min(lc)][0][M8] > hi else "")
        + f". The rule was put to {len(tried)} arms; on the quickstart:",
        f"- **The oracle with PAV progress credit (fixed anchors) {said['oracle-progress']}."
        + (" Exact values have little to add here: the quickstart's SFT slips sit on the Answer line, its last step, "
           "where the verifier's outcome already puts the blame." if "oracle-progress" not in paid else ""),
    ]
    learned = [(a, w) for a, w in (("prm-progress", "The learned PRM with the same credit"),
                                   ("labeltoken-progress", "the label-token PRM (P('+') read from the LM head)"))
               if a in arms]
    if learned:
        md.append("- " + "; ".join(f"**{w} {said[a]}" for a, w in learned) + "."
                  + (" Where their own ceiling, the oracle, does not pay: read it as a small effect to replicate on a "
                     "task whose errors are not at the last step, not as better credit assignment."
                     if "oracle-progress" not in paid and any(a in paid for a, _ in learned) else "")
                  + (f" With {len(tried)} arms put to the rule, one passing by chance is not unlikely." if paid else ""))
    if "implicit-prime" in arms:
        md.append(f"- **The implicit PRM with PRIME credit and its online update {said['implicit-prime']}"
                  + (", the largest gap of the study" if best == "implicit-prime" else "")
                  + f". Its runs took {wall['implicit-prime'] / wall['verifier']:.1f}x the verifier's wall time "
                    "(medians, the table's last column): its two LM forwards and the online update.")
    cut = next((int(o.split("=")[1]) for o in units.get(f"mc-progress-wc-s{min(base)}", {}).get("overrides", [])
                if o.startswith("grpo.max_steps=")), None)
    return md + _online_mc(g, said, per_problem, wall, paid, n, steps, cut)


def _said(d: list[float], per_problem: str, n: int) -> str:
    """'pays by the rule**: +mean ± SE SE over n seeds (per problem ...), k of n seeds at or above'."""
    return (f"{'pays by the rule' if pays(d) else 'does not pay'}**: {fmt_se(d)} over {n} seeds ({per_problem}), "
            f"{at_or_above(d)} of {n} seeds at or above")


def _problem_gap(data: dict, arm: str, last: int) -> str:
    """'per problem +mean ± SE SE': arm - verifier per eval problem, every seed's problems pooled, paired."""
    base = data["verifier"]
    pairs = [(data[arm][s][last].get("per_problem", {}).get("maj@8"),
              base[s][last].get("per_problem", {}).get("maj@8")) for s in base]
    if any(a is None or b is None for a, b in pairs):
        return "per problem not kept"
    mean, se = paired_difference([y for _, b in pairs for y in b], [x for a, _ in pairs for x in a])
    return f"per problem {mean:+.3f} ± {se:.3f} SE"


def _online_mc(g: dict, said: dict, per_problem: dict, wall: dict, paid: list[str], n: int, steps: int,
               cut: int | None) -> list[str]:
    """Online Monte-Carlo values at equal steps (`mc-progress`) and at the verifier's wall-clock (`mc-progress-wc`)."""
    md = []
    if "mc-progress" in g:
        d = g["mc-progress"]
        md.append(
            f"- **The arm with online Monte-Carlo values (VinePPO), exact values of the current policy, "
            f"{said['mc-progress']}" + (f"; its gap is {statistics.mean(d) / mean_se(d)[1]:.1f} SE"
                                        if "mc-progress" not in paid else "")
            + f". That is at equal steps, where its runs took {wall['mc-progress'] / wall['verifier']:.1f}x the "
              f"verifier's wall time (median {wall['mc-progress']:.0f} s against {wall['verifier']:.0f} s).")
    if "mc-progress-wc" in g:
        d, w = g["mc-progress-wc"], wall["mc-progress-wc"]
        text = (f"**At the verifier's wall-clock it {'loses on every seed' if below(d) == n else 'is what follows'}"
                "** (`mc-progress-wc`: its GRPO steps cut" + (f" from {steps} to {cut}" if cut else "")
                + " a round, what the verifier's GRPO phase does in the time online MC takes for them): "
                f"{fmt_se(d)} over {n} seeds, {per_problem['mc-progress-wc']}, "
                f"{at_or_above(d)} of {n} at or above (the issue's goal, at or above the verifier at equal "
                f"wall-clock: {'met' if statistics.mean(d) >= 0 else 'not met'}). Its units' median wall time, "
                f"{w:.0f} s, is {'under' if w < wall['verifier'] else 'over'} the verifier's {wall['verifier']:.0f} s; "
                "they ran at other hours of a machine whose speed drifts, so the match is rough, but a gap of about "
                f"{abs(statistics.mean(d) / mean_se(d)[1]):.0f} SE does not hang on it.")
        md = [md[-1] + " " + text] if md else [f"- {text}"]
    return md


def _z(rounds: dict, first: int, last: int) -> float:
    """The verifier's gain in Maj@8 over its eval problems, in paired SEs (inf where not kept)."""
    pp = [rounds[r].get("per_problem", {}).get("maj@8") for r in (first, last)]
    if None in pp:
        return math.inf
    mean, se = paired_difference(*pp)
    return mean / se


def smollm2(kept: dict[str, dict], noise: dict | None) -> list[str] | None:
    """SmolLM2's implicit-prime arm beside its verifier-only control (experiments/smollm2_control.py's kept files)."""
    if noise is None or set(kept) != {"verifier", "implicit-prime"}:
        return None
    seed = sorted(noise["per_problem"], key=int)[0]
    vals = {policy(p): noise["per_problem"][seed][name] for name, p in noise["policies"].items()}
    r0 = next(k for k in vals if not k[1])
    last = max(k[1] for k in vals)
    v, p = ("verifier", last), ("implicit-prime", last)
    if v not in vals or p not in vals:
        return None
    gap = {(a, b, x): paired_difference(vals[a][x], vals[b][x]) for a, b in ((r0, v), (r0, p), (v, p)) for x in METRICS}
    fmt = lambda a, b, x: f"{gap[(a, b, x)][0]:+.3f} ± {gap[(a, b, x)][1]:.3f} SE"  # noqa: E731
    learns = all(gap[(r0, k, "maj@4")][0] >= 2 * gap[(r0, k, "maj@4")][1] for k in (v, p))
    under = all(gap[(v, p, x)][0] < 0 for x in METRICS)
    grpo = kept["verifier"]["grpo_seconds"]
    ratios = {r: kept["implicit-prime"]["grpo_seconds"][r] / grpo[r] for r in sorted(grpo, key=int)
              if r in kept["implicit-prime"]["grpo_seconds"]}
    z = lambda x: gap[(v, p, x)][0] / gap[(v, p, x)][1]  # noqa: E731
    commits = listing(sorted({f"`{k['commit']}`" for k in kept.values()}), "s")
    return [
        f"**What held on SmolLM2 with a control (issue 47; {dates(kept)}, runs from "
        f"{commits}, {machine_words(kept)}; figures from "
        "the region above).** Arithmetic (`configs/smollm2-arith.yaml`), not GSM8K. The study's best learned arm on "
        "the quickstart, the implicit PRM with PRIME credit and its online update, was put beside a verifier-only "
        f"control from the same round-0 policy, on the same {noise['problems']} problems and sampling seed. "
        + ("Both learn" if learns else "Not both learn") + f": round {last} against round 0, the verifier "
        f"{fmt(r0, v, 'maj@4')} in Maj@4 and {fmt(r0, v, 'greedy')} greedy, the implicit PRM {fmt(r0, p, 'maj@4')} and "
        f"{fmt(r0, p, 'greedy')}. **The implicit PRM "
        + ("does not add to the verifier here: it is below it**" if under else "against the verifier**")
        + f", greedy {fmt(v, p, 'greedy')} ({z('greedy'):+.1f} SE), Pass@1 {fmt(v, p, 'pass@1')}, Maj@4 "
          f"{fmt(v, p, 'maj@4')}. One training seed per arm: these SEs are the evaluation's (problems and samples), not "
          "the spread over training seeds, which the quickstart's study shows to be of the same order as these gaps. "
          "Its GRPO phase took " + " and ".join(f"{x:.2f}x" for x in ratios.values()) + " the verifier's in rounds "
        + " and ".join(ratios) + " (the online update and two LM forwards a batch)."
        + (" So on the real model the quickstart's small gain did not carry over; the run of issue 39 of its own PRM "
           "with progress credit (lab/smollm2-arith.md) has no kept source, so it was not the arm put beside the "
           "control." if under else "")]
