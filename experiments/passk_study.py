"""Train for Pass@K (issue 59, point 2): the verifier against PKPO's pass@k rewards on the quickstart, three arms
from one SFT policy per seed, paired per eval problem, and their report. The plan, fixed before the first unit:
docs/experiments/passk/plan.md (arms, seeds, metrics, the decision rule); the run log: docs/lab/passk-study.md.

  verifier      outcome mode, the verifier's 0/1 reward (configs/quickstart.yaml as it is): the baseline
  passk-4       supervision.mode=passk, k = 4 throughout (PKPO's unbiased pass@4 rewards, group-mean baseline)
  passk-anneal  supervision.mode=passk, k = 7, 6, ..., 1 over each round's 80 GRPO steps (PKPO's annealing; 7, not
                8 = grpo.num_generations: at k = G every sample of a group gets the same reward and the group-mean
                baseline leaves all-zero advantages, so the config refuses it)

Every arm also sets `eval.samples_per_problem=32` (`EVAL`; the quickstart's 16 would do, see the plan). An arm is a
pipeline run on configs/quickstart.yaml plus its overrides, in `<runs-dir>/<arm>-s<seed>`, from the seed's SFT
policy, trained once as the unit `sft-s<seed>` (runner.Experiments); each finished unit's figures are kept in
`docs/experiments/passk/<unit>.json`, and the section "Training for Pass@K (issue 59)" of docs/results.md (the
region `passk`, between its study markers) is rebuilt from those files alone after every unit.

Run from the repository root, pinned to the AVX2 kernels at 2 threads (as every study here). Times on 2 cores, from
the credit study's quickstart units (round 0 and 2 RL rounds 218-235 s, SFT 88-95 s) plus ~35 s for the 32 eval
samples; passk's own work is 0.4 ms a GRPO step:

  python -m experiments.passk_study --seeds 0 --only verifier   # one unit, ~4.5 min (+ sft-s0, ~1.5 min, if absent)
  python -m experiments.passk_study                             # every pending unit: 3 SFT + 9 arm units, ~45 min
  python -m experiments.passk_study --report-only               # the section from the kept units, seconds
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import NamedTuple

from bench._common import ROOT, table
from experiments.credit_study import figures, region
from experiments.report import fmt_se, holm, one_sided_p, study_markers, with_study
from experiments.runner import Experiments, policy_id, restart_pinned, run_figures, stoppable
from pipeline.evaluate import paired_difference
from pipeline.loading import load_config

CONFIG = "configs/quickstart.yaml"
STUDY = "passk-study"  # its section's markers in docs/results.md (report.STUDIES)
PLAN = "docs/experiments/passk/plan.md"
# Pass@16 at 16 samples is each problem's "any of the 16 right", 0 or 1; from 32 it is the unbiased estimate over
# the C(32, 16) subsets, and Pass@1 and Maj@8 average more samples too (the plan, "Evaluation").
EVAL = ["eval.samples_per_problem=32"]
ARMS = {
    "verifier": ["supervision.mode=outcome"],
    "passk-4": ["supervision.mode=passk", "supervision.passk.k=4"],
    "passk-anneal": ["supervision.mode=passk", "supervision.passk.schedule=[7,6,5,4,3,2,1]",
                     "supervision.passk.over=steps"],
}
SEEDS = (0, 1, 2)
ROUND = 2  # RL rounds after round 0; every figure is round 2's
METRICS = {"pass@1": "Pass@1", "pass@16": "Pass@16", "maj@8": "Maj@8", "greedy": "greedy"}
# The rule (docs/experiments/passk/plan.md, where it is written out): one-sided tests at the level of "2 SE"
# (P(Z >= 2)), Holm's correction over the two passk arms, the annealed arm's "at or above" as non-inferiority.
ALPHA = one_sided_p(2.0)  # 0.02275
MARGIN = 0.005  # the non-inferiority margin of passk-anneal: the smallest gap a study here has called a result


def overrides(arm: str) -> list[str]:
    """What an arm sets on configs/quickstart.yaml (each unit file keeps them)."""
    return [*EVAL, *ARMS[arm]]


class PasskStudy(Experiments):
    """The runner's units (experiments/runner.py) on configs/quickstart.yaml, with this study's arms."""

    def config(self, seed: int, extra: list[str]):
        return load_config(ROOT / CONFIG, self.base(seed) + extra)

    def arm_config(self, arm: str, seed: int):
        return self.config(seed, [*self.from_sft(seed, f"{arm}-s{seed}", ROUND), *overrides(arm)])

    def arm(self, arm: str, seed: int) -> dict:
        from flows.iterative import iterative_rl

        iterative_rl(self.arm_config(arm, seed).model_dump(mode="json"))
        # `start`: the SFT policy's hash, the same for every arm of a seed (the report checks it).
        return {**run_figures(self.runs_dir / f"{arm}-s{seed}"), "overrides": overrides(arm),
                "start": policy_id(self.sft_path(seed))}


# --- the gaps and the rule: pure functions of the kept figures ------------------------------------


class Gap(NamedTuple):
    """An arm minus the verifier in one metric at round 2: per seed (the difference of the seed's means), and per
    eval problem, every seed's problems pooled (`paired_difference`: mean and paired SE)."""

    seeds: tuple[float, ...]
    mean: float
    se: float

    @property
    def z(self) -> float:
        """The per-problem gap in paired SEs (+-inf for a gap with no spread, 0 for none)."""
        return self.mean / self.se if self.se > 0 else math.copysign(math.inf, self.mean) if self.mean else 0.0


def gap(data: dict, arm: str, key: str, r: int = ROUND) -> Gap | None:
    """`arm` - verifier in per-problem metric `key` (`pass@16`) at round r, over the seeds both kept; None when no
    seed of both has round r with per-problem figures (`data`: credit_study.figures of the kept units)."""
    base, rows = data.get("verifier", {}), data.get(arm, {})
    pairs = [(rows[s][r]["per_problem"][key], base[s][r]["per_problem"][key]) for s in sorted(rows)
             if key in rows[s].get(r, {}).get("per_problem", {}) and key in base.get(s, {}).get(r, {}).get(
                 "per_problem", {})]
    if not pairs:
        return None
    mean, se = paired_difference([y for _, b in pairs for y in b], [x for a, _ in pairs for x in a])
    return Gap(tuple(statistics.mean(a) - statistics.mean(b) for a, b in pairs), mean, se)


def non_inferior_z(g: Gap, margin: float = MARGIN) -> float:
    """The gap's distance above -margin in paired SEs: the z of the test that the arm is not below by the margin."""
    return Gap(g.seeds, g.mean + margin, g.se).z


class Verdict(NamedTuple):
    """An arm's goal by the plan's rule: its one-sided p, the Holm level it was tested at, and the outcome."""

    p: float
    level: float | None  # alpha / (m - rank); None: not reached (a smaller p failed first)
    met: bool
    why: str


def decide(gaps: dict[str, dict[str, Gap | None]], alpha: float = ALPHA, margin: float = MARGIN) -> dict[str, Verdict]:
    """The plan's rule on every arm's round-2 gaps (arm -> metric -> `Gap`), Holm's correction over the two arms.

    passk-4: p = P(Z >= z) of its Pass@16 gap (superiority); met when Holm passes it and its Maj@8 gap is within 1
    paired SE of 0. passk-anneal: p = the larger of its non-inferiority p's on Pass@1 and Pass@16 (both must hold:
    no correction inside the arm); met when Holm passes it and both gaps are >= 0. An arm with a gap missing has
    p = 1: it fails, and the other is tested at alpha / 2 as when both are there.
    """
    g4, ga = gaps.get("passk-4", {}), gaps.get("passk-anneal", {})
    p = {"passk-4": one_sided_p(g4["pass@16"].z) if g4.get("pass@16") else 1.0,
         "passk-anneal": max(one_sided_p(non_inferior_z(ga[k], margin)) for k in ("pass@1", "pass@16"))
         if ga.get("pass@1") and ga.get("pass@16") else 1.0}
    arms = list(p)
    passed = dict(zip(arms, holm([p[a] for a in arms], alpha)))
    order = sorted(arms, key=lambda a: p[a])
    levels = {a: alpha / (len(arms) - i) if all(passed[b] for b in order[:i]) else None for i, a in enumerate(order)}
    # Why an arm's goal is not met: its test, then the condition beside it.
    why = {a: [] if passed[a] else [("Pass@16 " if a == "passk-4" else "non-inferiority ") + (
        f"p {p[a]:.4f} > Holm's level {levels[a]:.4f}" if levels[a] is not None else "Holm stopped at a smaller p")]
        for a in arms}
    if (maj := g4.get("maj@8")) is None or abs(maj.mean) > maj.se:
        why["passk-4"].append(f"Maj@8 moved {abs(maj.z):.2f} paired SE (more than 1)" if maj else "no Maj@8 gap")
    if below := [METRICS[k] for k in ("pass@1", "pass@16") if ga.get(k) and ga[k].mean < 0]:
        why["passk-anneal"].append(f"{' and '.join(below)} below the verifier")
    return {a: Verdict(p[a], levels[a], not why[a], "not met: " + "; ".join(why[a]) if why[a] else "met")
            for a in arms}


# --- the report: docs/results.md's section, from the kept unit files alone ---------------------------


def fmt_gap(g: Gap | None) -> str:
    """'+mean ± SE SE (z +z)' of a per-problem gap, 'not kept' without one."""
    return f"{g.mean:+.4f} ± {g.se:.4f} SE (z {g.z:+.2f})" if g else "not kept"


def section(kept: dict[str, dict], where: str = "docs/experiments/passk", seeds: tuple[int, ...] = SEEDS) -> list[str]:
    """The lines of the region `passk` from the unit files kept in `where` (`Experiments.kept`): the arms, what is
    kept, round 2's figures, the gaps to the verifier and the goals by the plan's rule (a verdict once every planned
    unit is kept; "not run yet" where none is)."""
    arms_kept = {n: u for n, u in kept.items() if not n.startswith("sft-")}
    planned = [f"{arm}-s{s}" for arm in ARMS for s in seeds]
    done = [n for n in planned if n in arms_kept]
    md = [f"Command: `python -m experiments.passk_study` (each unit one arm and seed, seeds {' '.join(map(str, seeds))}"
          f"); the plan, fixed before the first unit: [{PLAN.removeprefix('docs/')}]({PLAN.removeprefix('docs/')}). "
          f"Every arm starts from its seed's SFT policy and runs round 0 and {ROUND} RL rounds on `{CONFIG}` plus "
          f"`{' '.join(EVAL)}` and its overrides; figures at round {ROUND}, against the verifier arm of the same seed.",
          "", table(["arm", "overrides"], [[f"`{k}`", " ".join(f"`{o}`" for o in v)] for k, v in ARMS.items()]), ""]
    if not arms_kept:
        md += [f"**Not run yet**: no unit kept in `{where}/` (0 of {len(planned)} arm units).", ""]
    else:
        commits = sorted({u["commit"] for u in arms_kept.values()})
        machines = sorted({u["machine"] for u in arms_kept.values()})
        md += [f"Units kept: {len(done)} of {len(planned)} planned, from {', '.join(f'`{c}`' for c in commits)} on "
               f"{'; '.join(machines)}; sum of their wall times {sum(u['seconds'] for u in kept.values()) / 60:.0f} "
               "min (SFT units included).", ""]
        for s in seeds:  # the arms of a seed must share round 0: one SFT policy
            starts = {u.get("start", "not recorded") for n, u in arms_kept.items() if n.endswith(f"-s{s}")}
            if len(starts) > 1:
                md += [f"**Seed {s}'s arms started from {len(starts)} different SFT policies** "
                       f"({', '.join(sorted(starts))}): their gaps are not the method's alone.", ""]
        md += figure_tables(arms_kept)
    status = ("not run yet" if not arms_kept else None if len(done) == len(planned)
              else f"no verdict yet ({len(done)} of {len(planned)} units)")
    return md + goal_table(figures(kept), status, len(planned))


def figure_tables(units: dict[str, dict]) -> list[str]:
    """Round 2's figures per arm and seed, and each passk arm's gaps to the verifier, per seed and per problem."""
    data, rows = figures(units), []
    for arm in ARMS:
        ss = sorted(s for s, m in data.get(arm, {}).items() if ROUND in m)
        wall = [units[f"{arm}-s{s}"]["seconds"] for s in ss]
        rows.append([f"`{arm}`", ", ".join(map(str, ss)) or "-",
                     *(" / ".join(f"{data[arm][s][ROUND][f'eval/{k}']:.3f}" for s in ss) or "-" for k in METRICS),
                     f"{statistics.median(wall):.0f}" if wall else "-"])
    gaps = []
    for arm in list(ARMS)[1:]:
        for k, name in METRICS.items():
            if g := gap(data, arm, k):
                gaps.append([f"`{arm}`", name, " / ".join(f"{d:+.3f}" for d in g.seeds), fmt_se(list(g.seeds)),
                             f"{sum(d >= 0 for d in g.seeds)} of {len(g.seeds)}", fmt_gap(g)])
    return [f"Round {ROUND}, per seed:", "",
            table(["arm", "seeds", *METRICS.values(), "unit wall time, median (s)"], rows), "",
            f"Against the verifier at round {ROUND}: per seed, their mean ± SE over seeds (SD / sqrt(n)), and per "
            "eval problem, every seed's problems pooled, mean ± paired SE:", "",
            table(["arm", "metric", "Δ per seed", "Δ mean ± SE over seeds", "seeds at or above",
                   "Δ per problem, mean ± paired SE (z)"], gaps) if gaps else "No arm has a verifier to pair with.",
            ""]


def goal_table(data: dict, status: str | None, planned: int) -> list[str]:
    """The issue's two goals by the plan's rule (`decide`); `status` in place of the verdicts until every planned
    unit is kept (None: the verdicts), and no figures where no unit is ("not run yet")."""
    gaps = {arm: {k: gap(data, arm, k) for k in METRICS} for arm in list(ARMS)[1:]}
    verdicts, empty = decide(gaps), status == "not run yet"
    g4, ga = gaps["passk-4"], gaps["passk-anneal"]
    goals = {"passk-4": ("`passk-4` raises Pass@16 by >= 2 paired SE (Holm), Maj@8 within 1 paired SE",
                         f"Pass@16 {fmt_gap(g4['pass@16'])}; Maj@8 {fmt_gap(g4['maj@8'])}"),
             "passk-anneal": (f"`passk-anneal` at or above the verifier on Pass@1 and Pass@16 (not below by {MARGIN}, "
                              f"Holm)", f"Pass@1 {fmt_gap(ga['pass@1'])}; Pass@16 {fmt_gap(ga['pass@16'])}")}
    rows = [[goal, *(["-"] * 3 if empty else [fig, f"{v.p:.4f}", f"{v.level:.4f}" if v.level is not None
                                                else "not reached"]),
             status or ("**met**" if v.met else v.why)] for (goal, fig), v in ((goals[a], verdicts[a]) for a in goals)]
    return [f"The goals by the plan's rule: one-sided tests, Holm's correction over the 2 arms at alpha = {ALPHA:.4f} "
            f"(one test at it: z >= 2); a verdict once all {planned} arm units are kept:", "",
            table(["goal", f"figures, round {ROUND}, per problem", "p (one-sided)", "Holm level", "verdict"], rows)]


def report(a: argparse.Namespace, out: Path) -> Path:
    """Rewrite the study's section of `out` (docs/results.md), between its markers, from the kept unit files; the
    verdicts written by hand under the region (paragraphs opening "**What held") are kept."""
    text = out.read_text() if out.exists() else ""
    begin, end = study_markers(STUDY)
    held = [p.strip() for p in text.partition(begin)[2].partition(end)[0].split("\n\n")
            if p.strip().startswith("**What held")]
    block = [begin, "## Training for Pass@K (issue 59)", "", *region("passk", section(PasskStudy(a).kept(), a.figures)),
             *(x for p in held for x in ("", p)), end]
    out.write_text(with_study(text, "\n".join(block), STUDY))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--only", action="append", choices=list(ARMS), help="run only these arms (repeatable)")
    ap.add_argument("--runs-dir", default="runs/passk")
    ap.add_argument("--figures", default="docs/experiments/passk", help="where each finished unit's figures are kept")
    ap.add_argument("--out", default="docs/results.md")
    ap.add_argument("--experiment", default="iterative-grpo-passk", help="MLflow experiment")
    ap.add_argument("--tracking-uri")
    ap.add_argument("--report-only", action="store_true", help="only rebuild the section from the kept units")
    ap.add_argument("--native", action="store_true", help="the CPU's own kernels and threads, not pinned AVX2 x 2")
    a = ap.parse_args(argv)
    a.smoke, a.mc_prompts, a.rounds = False, 0, ROUND
    if not a.report_only:
        from flows.console import prefect_defaults

        prefect_defaults()
        stoppable("passk_study", lambda: run(a))
    print(f"report: {report(a, Path(a.out))}")


def run(a: argparse.Namespace) -> None:
    """Every pending unit of the asked seeds and arms, each seed's SFT first; the section rebuilt after each."""
    study = PasskStudy(a)
    study.runs_dir.mkdir(parents=True, exist_ok=True)
    study.run_arms(a.seeds, a.only or ARMS, lambda: report(a, Path(a.out)))


if __name__ == "__main__":
    restart_pinned("experiments.passk_study", sys.argv[1:])
    main()
