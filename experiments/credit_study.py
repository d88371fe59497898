"""Do process rewards pay? The arms of issue 39 on the tiny model's two tasks, seeds apart, and their report.

Tasks: `quickstart` (configs/quickstart.yaml: 2-3-operation chains, slips on the Answer line) and `long-chains`
(configs/long-chains.yaml: 5-6 operations, half the SFT slips at the middle step). Each arm is a pipeline run on the
task's config plus its overrides (`ARMS`), in `<runs-dir>/<task>/<arm>-s<seed>`, from the seed's SFT policy,
trained once (`sft-s<seed>`) as `python -m experiments` does; each finished unit's figures are kept in
`docs/experiments/credit/<task>/<unit>.json`, and the report, the section "Process rewards that pay" of
docs/results.md, is rebuilt from them after every unit (the rest of that file is experiments/report.py's); its
verdicts are written from the same units (experiments/credit_verdicts.py), each in a region of its own (a paragraph
written by hand under the tables, opening "**What held", is kept, but docs/results.md may hold none:
tests/test_figures_kept.py).

  verifier             GRPO, outcome supervision by the verifier (the baseline every gap is taken against)
  oracle               process supervision, the gold step labels as the step values (DeepSeekMath's sum credit)
  oracle-progress      hybrid: the verifier's outcome advantage + each token's own step's progress (PAV), gold values
  mc-progress          as oracle-progress (hybrid), online Monte-Carlo values (VinePPO's: 4 rollouts of the current
                       policy from each step prefix, during GRPO; no learned RM in GRPO)
  mc-progress-wc       mc-progress at the verifier's wall-clock: GRPO steps cut to what the verifier's GRPO phase
                       does in the same time (issue 47, point 5)
  vineppo              VinePPO itself: process mode, each token its step's MC progress alone (no outcome term)
  prm-progress         as oracle-progress, the learned PRM's values (the task's PRM: a value head)
  implicit             hybrid (sum credit), the implicit PRM's step values; no Monte-Carlo rollouts at all
  implicit-prime       PRIME: the implicit PRM's token rewards and the outcome, leave-one-out baselines, returns,
                       whitened (`process_reward: prime`), the PRM updated online on every batch (issue 47's arm)
  labeltoken-progress  as prm-progress, the PRM reading P('+') from the LM head at a step tag
  <arm>-centred        the arm with supervision.process_centring=group (`--centred ARM`)
  <arm>-w<W>           the arm with supervision.process_weight=W (`--only prm-progress-w3`); -w<W>-centred both

Run from the repository root, pinned to the AVX2 kernels at 2 threads (as `python -m experiments`):

  python -m experiments.credit_study --tasks quickstart --seeds 0            # one seed's eight arms
  python -m experiments.credit_study --tasks long-chains --seeds 0 --only verifier --only oracle-progress
  python -m experiments.credit_study --report-only
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

from bench._common import ROOT, table
from experiments import credit_verdicts, quickstart_seeds, smollm2_control
from experiments.credit_arms import ARMS, MATCHED
from experiments.report import BEGIN, END, GENERATED_END, RULE, fmt_se, glance, verdict, with_study, write_region
from experiments.runner import Experiments, restart_pinned, run_figures, stoppable
from pipeline.evaluate import paired_difference
from pipeline.loading import load_config

TASKS = {"quickstart": "configs/quickstart.yaml", "long-chains": "configs/long-chains.yaml"}
CENTRED = "supervision.process_centring=group"
FROZEN = "docs/experiments/study47"  # issue 47's study: every unit of it from one commit (`--frozen`)
LEARNED = ("prm-progress", "implicit", "implicit-prime", "labeltoken-progress")  # the arms whose step values a learned RM gives
KEYS = ("eval/maj@8", "eval/greedy", "eval/pass@1")
ROOM, MIN_GAIN = (0.5, 0.8), 0.05  # a task with room (issue 47, point 4): the verifier's round-0 Maj@8, its gain


WEIGHTED = re.compile(r"(.+)-w(\d+(?:\.\d+)?)")


def base_arm(arm: str) -> str:
    """The `ARMS` entry a variant (`-w<W>`, `-centred`) is made from."""
    arm = arm.removesuffix("-centred")
    return m[1] if (m := WEIGHTED.fullmatch(arm)) else arm


def overrides(arm: str) -> list[str]:
    weighted = WEIGHTED.fullmatch(arm.removesuffix("-centred"))
    return (ARMS[base_arm(arm)] + ([f"supervision.process_weight={weighted[2]}"] if weighted else [])
            + ([CENTRED] if arm.endswith("-centred") else []))


class Study(Experiments):
    """The runner's units (experiments/runner.py) on a task's config, with this study's arms."""

    def __init__(self, a: argparse.Namespace, task: str):
        self.task = task
        super().__init__(argparse.Namespace(**{**vars(a), "runs_dir": str(Path(a.runs_dir) / task),
                                               "figures": str(Path(a.figures) / task)}))

    def config(self, seed: int, extra: list[str]):
        return load_config(ROOT / TASKS[self.task], self.base(seed) + extra)

    def arm_config(self, arm: str, seed: int):
        return self.config(seed, [*self.from_sft(seed, f"{self.task}-{arm}-s{seed}", self.a.rounds), *overrides(arm)])

    def arm(self, arm: str, seed: int) -> dict:
        from flows.iterative import iterative_rl

        iterative_rl(self.arm_config(arm, seed).model_dump(mode="json"))
        run = self.runs_dir / f"{self.task}-{arm}-s{seed}"
        # Per-problem eval figures, where eval.json has them, for the report's paired SE.
        return {**run_figures(run), "overrides": overrides(arm)}


# --- the report ------------------------------------------------------------------------------------


def figures(kept: dict[str, dict]) -> dict:
    """arm -> seed -> round -> metric, from the kept units (`Experiments.kept`); a unit that kept per-problem eval
    figures (`per_problem`: round -> metric -> one value per eval problem) has them under the round's `per_problem`."""
    data: dict = {}
    for name, kept in kept.items():
        if "rounds" in kept:
            arm, seed = name.rsplit("-s", 1)
            rounds = {int(r): dict(m) for r, m in kept["rounds"].items()}
            for r, pp in kept.get("per_problem", {}).items():
                rounds.setdefault(int(r), {})["per_problem"] = pp
            data.setdefault(arm, {})[int(seed)] = rounds
    return data


def problem_gap(arm: dict, base: dict, seeds: list[int], r: int, key: str) -> str:
    """'+mean ± paired SE SE' of arm - verifier in `key` at round r per eval problem, every seed's problems pooled
    (`paired_difference`); 'not kept' unless every seed of both kept them."""
    pp = [(arm[s][r].get("per_problem", {}).get(key), base.get(s, {}).get(r, {}).get("per_problem", {}).get(key))
          for s in seeds]
    if not pp or any(a is None or b is None for a, b in pp):
        return "not kept"
    mean, se = paired_difference([y for _, b in pp for y in b], [x for a, _ in pp for x in a])
    return f"{mean:+.3f} ± {se:.3f} SE"


def task_section(kept: dict[str, dict], last: int) -> list[str]:
    """The task's table: each arm's round-`last` figures, its per-seed gaps to the verifier's, their mean ± SE, the
    per-problem paired SE where kept, and the rule's verdict (`report.pays`)."""
    data, rows = figures(kept), []
    base = data.get("verifier", {})
    order = list(ARMS)  # the study's arms in their order, each variant after its arm
    for arm in sorted(data, key=lambda a: (order.index(base_arm(a)), a)):
        seeds = sorted(s for s, m in data[arm].items() if last in m)
        paired = [s for s in seeds if last in base.get(s, {})]
        diffs = [data[arm][s][last]["eval/maj@8"] - base[s][last]["eval/maj@8"] for s in paired]
        cell = lambda key: " / ".join(f"{data[arm][s][last][key]:.3f}" for s in seeds)  # noqa: E731
        share = [data[arm][s][r].get("policy/advantage_mean_share") for s in seeds for r in range(1, last + 1)]
        share = [x for x in share if x is not None]
        vs = arm != "verifier"
        wall = [kept[f"{arm}-s{s}"]["seconds"] for s in seeds]  # `figures` made arm and seed of these names
        rows.append([f"`{arm}`", ", ".join(map(str, seeds)), f"{data[arm][seeds[0]][0]['eval/maj@8']:.3f}"
                     if seeds else "-", cell("eval/maj@8"), cell("eval/greedy"), cell("eval/pass@1"),
                     " / ".join(f"{d:+.3f}" for d in diffs) if vs else "-", fmt_se(diffs) if vs else "-",
                     problem_gap(data[arm], base, paired, last, "maj@8") if vs else "-",
                     f"{sum(d >= 0 for d in diffs)} of {len(diffs)}" if vs else "-",
                     verdict(diffs) if vs else "-",
                     f"{statistics.mean(share):.2f}" if share else "-",
                     f"{statistics.median(wall):.0f}" if wall else "-"])
    return [table(["arm", "seeds", "Maj@8 round 0 (seed " + (str(min(base)) if base else "-") + ")",
                   f"Maj@8 round {last} (per seed)", f"greedy round {last}", f"Pass@1 round {last}",
                   f"Δ Maj@8 vs verifier, round {last} (per seed)", "Δ mean ± SE over seeds",
                   "Δ per problem, mean ± paired SE", "seeds at or above the verifier", "verdict (the rule)",
                   "advantage mean / RMS (RL rounds)", "unit wall time, median (s)"], rows)]


def region(name: str, lines: list[str]) -> list[str]:
    """`lines` between the markers of a generated region (tests/test_results_generated.py remakes each)."""
    return [f"<!-- generated: {name} -->", *lines, GENERATED_END]


def verdict_region(name: str, lines: list[str] | None) -> list[str]:
    """A verdict's region and the blank line after it (experiments/credit_verdicts.py; none until its units are
    kept)."""
    return [*region(name, lines), ""] if lines else []


def report(a: argparse.Namespace, out: Path) -> Path:
    """Rewrite the study's section of `out` (docs/results.md), between its markers, from the kept figures."""
    studies = {task: Study(a, task) for task in TASKS}
    kept = {task: s.kept() for task, s in studies.items()}
    dates = sorted({u["date"] for k in kept.values() for u in k.values() if "date" in u})
    md = ["## Process rewards that pay (issue 39)", "", RULE, "", *region("credit-arms", [
          "Command: `python -m experiments.credit_study` (the tasks and seeds of each unit below)"
          + (f"; units of {dates[0]}" + (f" to {dates[-1]}" if len(dates) > 1 else "") if dates else "")
          + ". Each arm starts from its seed's SFT policy and runs round 0 and "
          f"{a.rounds} RL rounds on the task's config (its budgets, `configs/<task>.yaml`) plus the arm's overrides:",
          "", table(["arm", "overrides"], [[f"`{k}`", " ".join(f"`{o}`" for o in v)
                                             + (" and the GRPO steps of its seed's costliest arm's wall-clock"
                                                if k == MATCHED else "")] for k, v in ARMS.items()]
                     + [["`<arm>-centred`", f"`{CENTRED}`"], ["`<arm>-w<W>`", "`supervision.process_weight=W`"]])]),
          "", "### The quickstart learns (issue 47)", "", *region("quickstart-learns", quickstart_seeds.section()), "",
          *frozen_section(a), "### SmolLM2 with a control (issue 47): arithmetic, not GSM8K", "",
          *region("smollm2-control", smollm2_control.section()), "",
          *verdict_region("smollm2-verdict", credit_verdicts.smollm2(*smollm2_control.kept_files()))]
    for task in TASKS:
        if not (units := kept[task]):
            md += [f"### {task}", "", "Not measured yet.", ""]
            continue
        commits = sorted({u["commit"] for u in units.values()})
        machines = sorted({u["machine"] for u in units.values()})
        per_problem = any("per_problem" in u for u in units.values())
        md += [f"### {task}", "", *region(f"credit-{task}", [
            f"Units from {', '.join(f'`{c}`' for c in commits)} on {'; '.join(machines)}; sum of their wall times "
            f"{sum(u['seconds'] for u in units.values()) / 60:.0f} min. Δ: per-seed differences to the verifier arm "
            "of the same seed; their mean ± SE over seeds. "
            + ("Per problem: the differences on each eval problem, every seed's pooled, mean ± paired SE."
               if per_problem else "Per problem: **not kept** (these units kept no per-problem eval figures, so "
               "no per-problem paired SE can be given for them)."),
            "", *task_section(units, a.rounds)]), ""]
    md += verdict_region("credit-verdict", credit_verdicts.issue39(kept, {t: figures(k) for t, k in kept.items()},
                                                                   a.rounds))
    out_text = out.read_text() if out.exists() else ""
    # The verdicts written by hand under the tables (paragraphs opening "**What held") are kept as written.
    old = out_text.partition(BEGIN)[2].partition(END)[0]
    md += [p.strip() + "\n" for p in old.split("\n\n") if p.strip().startswith("**What held")]
    out.write_text(with_study(out_text, "\n".join([BEGIN, *md, END])))
    return out


def room(units: dict[str, dict], last: int) -> list[str]:
    """Issue 47's test of a task with room (point 4), on its verifier arm: per seed, round 0's Maj@8 within `ROOM`
    and the gain to round `last` at least `MIN_GAIN`, with the gain's paired SE per eval problem."""
    base, rows = figures(units).get("verifier", {}), []
    for seed, r in sorted(base.items()):
        if last not in r:
            continue
        first, end = r[0]["eval/maj@8"], r[last]["eval/maj@8"]
        pp = [r[x].get("per_problem", {}).get("maj@8") for x in (0, last)]
        se = f"{paired_difference(*pp)[1]:.3f}" if None not in pp else "not kept"
        rows.append([str(seed), f"{first:.3f}", "yes" if ROOM[0] <= first <= ROOM[1] else "**no**", f"{end:.3f}",
                     f"{end - first:+.3f}", se, "yes" if end - first >= MIN_GAIN else "**no**"])
    return [table(["seed", "verifier Maj@8 round 0", f"within [{ROOM[0]}, {ROOM[1]}]", f"round {last}", "gain",
                   "paired SE", f"gain >= {MIN_GAIN}"], rows)] if rows else ["No verifier unit yet."]


def frozen_section(a: argparse.Namespace) -> list[str]:
    """Issue 47's study (point 6): every unit from one commit, in `a.frozen`/<task>; the room check (point 4) and the
    arms' table, each a generated region."""
    md, frozen = [], getattr(a, "frozen", FROZEN)
    for task in TASKS:
        units = Study(argparse.Namespace(**{**vars(a), "figures": frozen}), task).kept()
        arms = {u for u in units if not u.startswith("sft-")}
        if not arms:
            continue
        commits = sorted({u["commit"] for u in units.values()})
        machines = sorted({u["machine"] for u in units.values()})
        seeds = sorted({int(u.rsplit("-s", 1)[1]) for u in arms})
        md += [f"### Issue 47's study on `{task}`, from one commit", "", *region(f"frozen-{task}", [
            f"Command: `python -m experiments.credit_study --tasks {task} --seeds {' '.join(map(str, seeds))} "
            f"--figures {frozen}` with `--only` per arm, every unit from {', '.join(f'`{c}`' for c in commits)} "
            f"on {'; '.join(machines)} (sum of wall times {sum(u['seconds'] for u in units.values()) / 60:.0f} min, "
            "the machine's load included). Every arm of a seed starts from that seed's SFT policy and is evaluated "
            "on the same problems with the same sampling seeds, so gaps pair per problem.", "",
            "Room to learn (point 4): the verifier arm per seed.", "", *room(units, a.rounds), "",
            "The arms against the verifier, by the rule above:", "", *task_section(units, a.rounds)]), ""]
        if task == "quickstart":  # its verdict, with issue 39's long chains for the room they lack
            md += verdict_region(f"frozen-{task}-verdict", credit_verdicts.issue47(
                units, figures(units), figures(Study(a, "long-chains").kept()), a.rounds,
                load_config(ROOT / TASKS[task]).grpo.get("max_steps"), (ROOM, MIN_GAIN)))
    return md


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--only", action="append", help="run only these arms (repeatable; ARM-w<W>, ARM-centred too)")
    ap.add_argument("--centred", action="append", default=[], help="also run ARM's centred variant (repeatable)")
    ap.add_argument("--rounds", type=int, default=2, help="RL rounds after round 0")
    ap.add_argument("--runs-dir", default="runs/credit")
    ap.add_argument("--figures", default="docs/experiments/credit")
    ap.add_argument("--frozen", default=FROZEN,
                    help="issue 47's study from one commit: run with --figures this; its sections read it")
    ap.add_argument("--out", default="docs/results.md")
    ap.add_argument("--experiment", default="iterative-grpo-credit")
    ap.add_argument("--tracking-uri")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--native", action="store_true", help="the CPU's own kernels and threads, not pinned AVX2 x 2")
    a = ap.parse_args(argv)
    a.smoke, a.mc_prompts = False, 0
    for arm in [*(a.only or []), *a.centred]:
        if base_arm(arm) not in ARMS:
            ap.error(f"unknown arm {arm!r}: {', '.join(ARMS)} (or ARM-w<W>, ARM-centred)")
    from flows.console import prefect_defaults

    prefect_defaults()
    stoppable("credit_study", lambda: run(a))
    print(f"report: {report(a, Path(a.out))}")
    if Path(a.out).resolve() == ROOT / "docs" / "results.md":  # README's results at a glance name the best arm
        write_region(ROOT / "README.md", "results", glance(Path(a.figures).parent, LEARNED))


def run(a: argparse.Namespace) -> None:
    """Every pending unit of the asked tasks, seeds and arms; the report rebuilt after each."""
    if not a.report_only:
        arms = a.only or [*ARMS, *(f"{x}-centred" for x in a.centred)]
        for task in a.tasks:
            study = Study(a, task)
            Path(study.runs_dir).mkdir(parents=True, exist_ok=True)
            study.run_arms(a.seeds, arms, lambda: report(a, Path(a.out)))


if __name__ == "__main__":
    restart_pinned("experiments.credit_study", sys.argv[1:])
    main()
