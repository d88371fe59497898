"""The report of `python -m experiments`: docs/results.md and its plots, from each finished unit's kept figures.

Reads `docs/experiments/<unit>.json` (what the runner keeps of each finished arm and seed, `mc-s<seed>`, `sft-s<seed>`),
or the run directories of arms still running, and `docs/experiments/prm-study/*.json` (experiments/prm_study.py
`--figures`); writes `docs/results.md` (tables: mean ± SD over seeds, gaps between arms mean ± SE and the decision
rule's verdict, per-seed values at the end; each section's generated part between `<!-- generated: NAME -->` markers,
which tests/test_results_generated.py remakes from the kept figures), README's results at a glance (`glance`), and
the PNG plots in `docs/img/`, and logs both to a `summary` run of the MLflow experiment. Each section's verdict is
written from the same figures (experiments/verdicts.py), inside its region; a section without one keeps a verdict
written by hand under it (`**What held ...`), which tests/test_figures_kept.py refuses on docs/results.md, where every
number is made from the kept units (experiments/pages.py); `docs/lab/results-history.md` is linked, never rewritten. The arms, their labels and overrides are the runner's (experiments/runner.py). A rebuild
needs no `runs/` and takes seconds:

  python -m experiments --report-only
  python -m experiments --smoke --report-only   # the smoke run's report (runs/experiments-smoke)
"""

from __future__ import annotations

import collections
import re
import statistics
from pathlib import Path

from bench._common import table
from experiments import prm_study, verdicts  # prm_study: its table's rows, for the kept study results
from experiments.runner import ARMS, EXPLOIT, HYBRID_ARMS, LABELS, MC_NS, Experiments, arm_overrides, rounds_of
from experiments.stats import (  # noqa: F401 (re-exported: the studies and tests read them here)
    MIN_SEEDS,
    at,
    fmt,
    fmt_se,
    gains,
    holm,
    mean_se,
    one_sided_p,
    paired,
    pays,
    seeds_needed,
    values,
    verdict,
)
from pipeline.rundir import read_json

SUPERVISION_ARMS = ("prm", "orm", "verifier", "rft")  # section 1
RM_ARMS = ("prm", "frozen", "noreplay", "exploit")  # section 2
SHARE = "policy/process_variance_share"


def study_markers(name: str) -> tuple[str, str]:
    """The markers a study's own section of results.md lies between; a rebuild here keeps it (`keep_study`)."""
    return f"<!-- {name}: begin -->", f"<!-- {name}: end -->"


# The studies whose sections results.md holds, in their order (experiments/credit_study.py's, passk_study.py's).
STUDIES = ("credit-study", "passk-study", "step-credit", "smollm2-budgets", "smollm2-step-credit")
BEGIN, END = study_markers("credit-study")
# A region the report writes (in docs/results.md, README.md's results): tests/test_results_generated.py remakes each.
GENERATED = re.compile(r"<!-- generated: ([\w-]+) -->\n(.*?)<!-- end generated -->", re.S)
GENERATED_END = "<!-- end generated -->"
HISTORY = "lab/results-history.md"  # superseded reports, kept by hand beside the report (relative to --out)
PLACEHOLDER = "**What held / what did not:** _to be written from the numbers above; the script does not judge them._"


# --- the decision rule: `pays` (experiments/stats.py, with the spreads and the figures' accessors, re-exported here) ---

# Issue 47's rule, fixed before the study's runs; `pays` is it, and this paragraph is the one place it is written.
RULE = ("**The decision rule** (issue 47), fixed before its study's runs: an arm *pays* when its mean gap to the verifier arm of the "
        "same seed (Maj@8 at the last round) is above 0 by at least 2 SE over seeds (SE = SD / sqrt(n)) and it is at "
        "or above the verifier in at least 4 of 5 seeds; on 3 seeds (the quickstart), in all 3. Spreads are labelled: "
        "SE is the standard error of the mean, SD the sample standard deviation over seeds, never a bare ±.")


# --- the figures: arm -> seed -> round -> metric ----------------------------------------------------


def gather(ex: Experiments, seeds: list[int]) -> dict:
    """arm -> seed -> `rounds_of` its run: the kept figures of a finished arm, else its run directory's so far."""
    data: dict = {}
    for arm in ARMS:
        for seed in seeds:
            if kept := ex.recorded(f"{arm}-s{seed}"):
                rounds = {int(r): m for r, m in kept["rounds"].items()}
            else:
                try:
                    rounds = rounds_of(ex.runs_dir / f"{arm}-s{seed}")
                except FileNotFoundError:  # not started
                    continue
            data.setdefault(arm, {})[seed] = rounds
    return data


def fired(data: dict, arm: str, r: int, key: str) -> str:
    """'k/n': in how many of the n seeds with a value of the alarm `key` in round `r` it fired; '-' when none."""
    xs = values(data, arm, r, key)
    return f"{sum(x > 0.5 for x in xs)}/{len(xs)}" if xs else "-"


def chosen_hybrid(data: dict, seed: int, last: int) -> str | None:
    """The hybrid arm of the grid with the best Maj@8 at the last round on `seed`, among those whose PRM term carries
    at least 20% of the advantages' variance in every RL round (issue 16's condition; none: the best of all)."""
    done = [arm for arm in HYBRID_ARMS if at(data, arm, seed, last, "eval/maj@8") is not None]
    eligible = [arm for arm in done if all((at(data, arm, seed, r, SHARE) or 0) >= 0.2 for r in range(1, last + 1))]
    return max(eligible or done, key=lambda arm: at(data, arm, seed, last, "eval/maj@8"), default=None)


# --- the kept units: where and on what they ran ------------------------------------------------------


def commits(ex: Experiments) -> dict[str, int]:
    """The commits the kept figures ran from, with how many units each."""
    return dict(collections.Counter(k["commit"] for k in ex.kept().values()))


def machines(ex: Experiments) -> dict[str, int]:
    """The machines the kept figures ran on, with how many units each (not recorded before 2026-12-03)."""
    return dict(collections.Counter(k.get("machine", "machine not recorded") for k in ex.kept().values()))


def mixed_starts(ex: Experiments, seeds: list[int]) -> dict[int, dict[str, list[str]]]:
    """Seeds whose kept arms started from more than one round-0 policy (a retrained SFT, or one not recorded):
    seed -> policy -> its arms. Such a seed's arms differ from round 0 on, not only by their method."""
    out = {}
    for seed in seeds:
        by = collections.defaultdict(list)
        for arm in ARMS:
            if kept := ex.recorded(f"{arm}-s{seed}"):
                by[kept.get("start", "not recorded")].append(arm)
        if len(by) > 1:
            out[seed] = dict(by)
    return out


# --- plots ---------------------------------------------------------------------------------------------


def plot_lines(path: Path | None, panels: list[tuple[str, str, dict[str, tuple[list, list, list]]]], xlabel: str,
               logx: bool = False) -> Path | None:
    """One panel per (title, y label, {label: (x, mean, std)}), error bars = SD over seeds; nothing drawn when
    `path` is None."""
    if path is None:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5 * len(panels), 4))
    FigureCanvasAgg(fig)
    for ax, (title, ylabel, curves) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        for label, (x, mean, std) in curves.items():
            if x:
                ax.errorbar(x, mean, yerr=std, marker="o", capsize=3, label=label)
        if logx:
            ax.set_xscale("log", base=2)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        xs = sorted({v for _, (x, _, _) in curves.items() for v in x})
        if xs:
            ax.set_xticks(xs, [str(v) for v in xs])
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def curve(data: dict, arm: str, points: list[tuple[int, int, str]]) -> tuple[list, list, list]:
    """(x, mean, std over seeds) for each (x, round, metric) point that has values."""
    pts = [(x, v) for x, r, key in points if (v := values(data, arm, r, key))]
    return ([x for x, _ in pts], [statistics.mean(v) for _, v in pts],
            [statistics.stdev(v) if len(v) > 1 else 0.0 for _, v in pts])


def by_round(data: dict, arm: str, rounds: list[int], key: str) -> tuple[list, list, list]:
    return curve(data, arm, [(r, r, key) for r in rounds])


# --- the report, section by section; each returns its markdown lines and draws its plot ------------


def report(ex: Experiments, command: str, wall: float | None, log: bool = True, plots: bool = True) -> Path:
    """Write results.md (and its plots unless `plots` is False) from whatever runs exist (and log them to MLflow);
    return the path."""
    out = Path(ex.a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.md"
    path.write_text(keep_study(keep_verdicts("\n".join(sections(ex, command, wall, out / "img" if plots else None)),
                                            path), path))
    if log:
        _log_summary(ex, path, out / "img")
    return path


def sections(ex: Experiments, command: str, wall: float | None, img: Path | None) -> list[str]:
    """The report's markdown lines, each section's generated part between the markers of its region; the plots
    drawn into `img` (none when None)."""
    seeds, last = ex.a.seeds, ex.a.rounds
    n, data, rounds = len(seeds), gather(ex, seeds), list(range(last + 1))
    parts = {
        "results-header": header_section(ex, data, command, wall),
        "results-1": supervision_section(data, n, last, img),
        "results-2": reward_model_section(data, n, last, img, ex.arm_config("prm", seeds[0]).eval.monitor_threshold),
        "results-3": pass_maj_section(data, n, last, img),
        "results-4": mc_section(ex, seeds, img),
        "results-5": best_of_n_section(data, n, last, img),
        "results-6": issue16_section(ex, data, seeds, rounds, img),
        "results-per-seed": per_seed_section(data, rounds),
    }
    made = section_verdicts(ex, data, seeds, last)
    md: list[str] = []
    for name, lines in parts.items():  # a region opens under its title; a verdict not made yet stays out, by hand
        if lines[-1] == PLACEHOLDER and made.get(name):
            lines = [*lines[:-1], *made[name]]
        i = next(k + 1 for k, line in enumerate(lines) if line.startswith("#"))
        body, verdict = (lines[i:-1], ["", lines[-1]]) if lines[-1] == PLACEHOLDER else (lines[i:], [])
        md += [*lines[:i], f"<!-- generated: {name} -->", *body, GENERATED_END, *verdict]
    return md


def section_verdicts(ex: Experiments, data: dict, seeds: list[int], last: int) -> dict[str, list[str] | None]:
    """Each section's verdict from experiments/verdicts.py (None until every unit it reads is kept, and none below the
    rule's seeds), by region."""
    if len(seeds) < MIN_SEEDS:
        return {}
    units, s0 = ex.kept(), seeds[0]
    threshold = ex.arm_config("prm", s0).eval.monitor_threshold
    study = [read_json(p) for p in sorted((ex.figures / "prm-study").glob("*.json"))]
    return {
        "results-1": verdicts.supervision(data, seeds, last, units),
        "results-2": verdicts.reward_model(data, seeds, last, units, threshold,
                                           ex.arm_config("prm", s0).reward_model.replay_fraction),
        "results-3": verdicts.pass_maj(data, seeds, last, units),
        "results-4": verdicts.mc_labels([m for s in seeds if (m := ex.recorded(f"mc-s{s}"))], units, seeds),
        "results-5": verdicts.best_of_n(data, seeds, last, units),
        "results-6": verdicts.issue16_goals(data, seeds, last, units, chosen_hybrid(data, s0, last),
                                            list(HYBRID_ARMS), study),
    }


def header_section(ex: Experiments, data: dict, command: str, wall: float | None) -> list[str]:
    """The title, the command and its time, where the units ran, the budgets and the arms."""
    a, seeds, last = ex.a, ex.a.seeds, ex.a.rounds
    units = ex.units()
    failed = sorted(k for k, v in units.items() if v["status"] == "failed")
    total = sum(v["seconds"] for v in units.values())
    dates = sorted({k["date"] for k in ex.kept().values() if "date" in k})  # the kept units', not today's
    md = [
        "# Results: DeepSeekMath's comparisons on the embedded problem set",
        "",
        f"Command: `{command}` (from the repository root); "
        + (f"wall time of this invocation {wall / 60:.0f} min, " if wall is not None else "")
        + f"sum of all units' wall times over every invocation {total / 60:.0f} min; "
        + (f"units of {dates[0]}" + (f" to {dates[-1]}" if len(dates) > 1 else "") + ". " if dates else "")
        + f"Seeds {seeds}; each seed also draws the problem set. "
        f"MLflow experiment `{a.experiment}` (a parent run per arm and seed, `<arm>-s<seed>`; `sft-s<seed>`, "
        "`mc-labels-s<seed>`; the report and plots as artifacts of a `summary` run).",
        "",
        f"Each unit's figures: `{ex.figures.as_posix()}/<unit>.json`; they ran from "
        + (", ".join(f"`{c}` ({n} units)" for c, n in commits(ex).items()) or "no commit yet (none kept)")
        + "; on " + (", ".join(f"{m} ({n} units)" for m, n in machines(ex).items()) or "no machine yet") + "."
        + "".join(f" **Seed {s}'s arms started from {len(by)} different round-0 policies** ("
                  + "; ".join(f"`{p}`: {', '.join(arms)}" for p, arms in by.items())
                  + "): its arms differ from round 0 on, not only by their method."
                  for s, by in mixed_starts(ex, seeds).items())
        # Superseded reports (other code, other machines) are kept by hand beside this one, not rewritten.
        + (f" Earlier measurements, by other code or on other machines: [{HISTORY}]({HISTORY})."
           if (Path(a.out) / HISTORY).exists() else ""),
        "",
        budgets(ex),
        "",
        table(["arm", "overrides of configs/experiments.yaml", "units finished"], [
            [f"`{arm}` {LABELS[arm]}", " ".join(f"`{o}`" for o in arm_overrides(arm, a.smoke)) or "-",
             f"{sum(last in m for m in data.get(arm, {}).values())} of {len(seeds)} seeds"] for arm in ARMS]),
        "",
        f"`± x SD` is the sample standard deviation over seeds (n = {len(seeds)} is few: read it as a rough spread); "
        "`± x SE` its standard error, SD / sqrt(n), where arms are compared. The per-seed values are at the end. "
        "Gains and gaps are per-seed differences, then averaged."
        + ("" if any("per_problem" in k for k in ex.kept().values()) else " No kept unit of these sections has "
           "per-problem eval figures, so no per-problem paired SE is given."),
    ]
    if failed:
        md += ["", f"**Failed units** (see the command's log): {', '.join(failed)}."]
    return md


def budgets(ex: Experiments) -> str:
    """The budgets every arm shares, from the prm arm's config (and the other arms' eval samples)."""
    seed, last = ex.a.seeds[0], ex.a.rounds
    cfg = ex.arm_config("prm", seed)
    g, c, e = cfg.grpo, cfg.collect, cfg.eval
    return (
        "Budgets (configs/experiments.yaml, the quickstart's before 66e9624, unless listed): "
        f"{last} RL round(s) after round 0 for every arm; per round "
        f"GRPO {g.get('max_steps')} steps of {g.get('per_device_train_batch_size')} completions "
        f"({g.get('num_generations')} per prompt, lr {g.get('learning_rate')}, beta {g.get('beta')}); collection "
        f"{c.prompts_per_round} prompts x {c.samples_per_prompt} samples, N = {c.rollouts_per_step} rollouts per step; "
        f"RMs {cfg.reward_model.train_args.get('num_train_epochs')} epochs; eval {e.num_problems} held-out problems x "
        f"{e.samples_per_problem} samples at temperature {e.temperature} for the prm arm, "
        f"{ex.arm_config('orm', seed).eval.samples_per_problem} for the others (Maj@K and Pass@K are unbiased at any n, "
        "so the arms compare; only the spread differs). "
        "The SFT policy, trained once per seed, is every arm's round-0 policy; round 0's collection, RMs and eval "
        f"are rerun in each arm with the same seeds (the prm arm's eval draws {e.samples_per_problem} samples).")


def supervision_section(data: dict, n: int, last: int, img: Path | None) -> list[str]:
    """1. Process against outcome supervision, and Online RFT (DeepSeekMath Fig. 5)."""
    rounds = list(range(last + 1))
    rows = [[LABELS[arm]] + [fmt(values(data, arm, r, "eval/maj@8"), n) for r in rounds]
            + [fmt(gains(data, arm, last, "eval/maj@8"), n), fmt(values(data, arm, last, "eval/greedy"), n),
               fmt(values(data, arm, last, "eval/pass@1"), n)]
            for arm in SUPERVISION_ARMS]
    plot_lines(img and img / "supervision.png", [
        (f"{name} per round", "accuracy", {LABELS[x]: by_round(data, x, rounds, key) for x in SUPERVISION_ARMS})
        for name, key in (("Maj@8", "eval/maj@8"), ("greedy", "eval/greedy"))
    ], "round")
    return ["", "## 1. Process against outcome supervision, and Online RFT", "",
            "Mirrors DeepSeekMath Fig. 5 (§5.2.1): on GSM8K and MATH, GRPO with process supervision ends above GRPO "
            "with outcome supervision, which ends above Online RFT (whose gradient coefficient is 1 for a correct "
            "sample and 0 otherwise). The verifier-alone arm is not in the paper (it used a trained RM); Online RFT "
            "here keeps the KL term, so only the advantage differs from the verifier arm.", "",
            table(["arm"] + [f"Maj@8 round {r}" for r in rounds] + [f"Δ Maj@8 (0→{last})", f"greedy round {last}",
                                                                     f"Pass@1 round {last}"], rows),
            "", "![Maj@8 and greedy per round by supervision](img/supervision.png)", "", PLACEHOLDER]


def reward_model_section(data: dict, n: int, last: int, img: Path | None, threshold: float) -> list[str]:
    """2. The RM retrained each round, frozen, without replay, exploitable: Maj@8 and the monitor (DeepSeekMath Fig. 6)."""
    rounds, later = list(range(last + 1)), list(range(1, last + 1))
    name = {arm: LABELS[arm] if arm != "prm" else "PRM retrained, 10% replay" for arm in RM_ARMS}
    rows = [[name[arm]] + [fmt(values(data, arm, r, "eval/maj@8"), n) for r in rounds]
            + [fmt(values(data, arm, r, "monitor/prm_gap"), n) for r in rounds]
            + [fmt(values(data, arm, last, "prm/step_auc_gold"), n)] for arm in RM_ARMS]
    # The monitor against each RM's own held-out calibration; round 0 reads its RMs on their training samples,
    # where it compares nothing.
    monitor = [[name[arm]] + [fmt(values(data, arm, r, f"monitor/prm_{key}"), n) for key in ("gap_rise", "auc_drop")
                              for r in later]
               + [fired(data, arm, r, "monitor/prm_alarm") for r in later] for arm in RM_ARMS]
    names = {"prm": "retrained, 10% replay", "frozen": "frozen at round 0", "noreplay": "retrained, no replay",
             "exploit": "frozen, exploitable"}
    plot_lines(img and img / "reward_model.png", [
        ("policy Maj@8 per round", "accuracy", {names[x]: by_round(data, x, rounds, "eval/maj@8") for x in RM_ARMS}),
        ("reward-hacking gap (PRM mean - verifier)", "gap", {names[x]: by_round(data, x, rounds, "monitor/prm_gap")
                                                             for x in RM_ARMS}),
        ("gap rise (fresh gap - held-out gap)", "gap rise", {names[x]: by_round(data, x, later, "monitor/prm_gap_rise")
                                                             for x in RM_ARMS}),
    ], "round")
    return ["", "## 2. Reward model retrained each round, frozen, or retrained without replay", "",
            "Mirrors DeepSeekMath Fig. 6 and Algorithm 1 (§4.2): iterative RL, with the RM retrained on the policy's "
            "new samples plus a 10% replay of the old ones, improves on the first RL iteration. The frozen-RM and "
            "no-replay arms are ablations of that design, not figures of the paper. The gap is `monitor/prm_gap`: "
            "the mean PRM score the policy trained against gives the round's fresh samples, minus the verifier's "
            "accuracy on them; a min-over-steps PRM's is negative by construction, so the monitor reads it against "
            "the same RM's gap on its own held-out slice when it was trained: the gap rise (fresh - held-out), the "
            "AUC drop (held-out - fresh solution AUC against the verifier), and the alarm, `monitor/prm_alarm`, when "
            f"the rise exceeds `eval.monitor_threshold` ({threshold}; k/n: seeds that fired). The exploit "
            "arm is the frozen one with a planted flaw (`reward_model.exploit`): every score of a completion whose "
            f"Answer line repeats the first step's result, the slip the SFT data teaches, gets +{EXPLOIT['bonus']} "
            "(unclipped: a clipped bonus can at most tie a PRM sure of right answers); the monitor must fire on it "
            "and stay quiet on the retrained arm.", "",
            table(["RM"] + [f"Maj@8 r{r}" for r in rounds] + [f"PRM gap r{r}" for r in rounds]
                  + [f"PRM step AUC (gold) r{last}"], rows), "",
            table(["RM"] + [f"gap rise r{r}" for r in later] + [f"AUC drop r{r}" for r in later]
                  + [f"alarm r{r}" for r in later], monitor),
            "", "![Maj@8 and reward-hacking gap per round](img/reward_model.png)", "", PLACEHOLDER]


def pass_maj_section(data: dict, n: int, last: int, img: Path | None) -> list[str]:
    """3. Maj@K and Pass@K, round 0 against the last round, of the prm arm (DeepSeekMath Fig. 7)."""
    ks = sorted({int(k.split("@")[1]) for m in data.get("prm", {}).values() for r in m.values() for k in r
                 if k.startswith("eval/pass@")})
    rows = [[str(k)] + [fmt(values(data, "prm", r, f"eval/{m}@{k}"), n) for m in ("maj", "pass") for r in (0, last)]
            + [fmt(gains(data, "prm", last, f"eval/{m}@{k}"), n) for m in ("maj", "pass")] for k in ks]
    plot_lines(img and img / "pass_maj.png", [
        (f"{m.capitalize()}@K, GRPO + PRM", "accuracy",
         {f"round {r}": curve(data, "prm", [(k, r, f"eval/{m}@{k}") for k in ks]) for r in sorted({0, last})})
        for m in ("maj", "pass")], "K: samples per problem", logx=True)
    return ["", "## 3. Maj@K and Pass@K from round 0 to the last round (GRPO + PRM)", "",
            "Mirrors DeepSeekMath Fig. 7 (§5.2.2; 7B, temperature 0.7, Instruct -> RL): GSM8K Maj@64 89.5 -> 91.0, "
            "Pass@64 99.1 -> 97.3; MATH Maj@64 59.9 -> 60.9, Pass@64 87.5 -> 86.8. RL sharpens the output "
            "distribution: Maj@K gains, Pass@K at large K does not.", "",
            table(["K", "Maj@K r0", f"Maj@K r{last}", "Pass@K r0", f"Pass@K r{last}", "Δ Maj@K", "Δ Pass@K"], rows),
            "", "![Maj@K and Pass@K against K](img/pass_maj.png)", "", PLACEHOLDER]


def mc_section(ex: Experiments, seeds: list[int], img: Path | None) -> list[str]:
    """4. MC step labels' agreement with gold against N (Math-Shepherd §5.2), from the `mc-s<seed>` units."""
    n = len(seeds)
    mc = [m for s in seeds if (m := ex.recorded(f"mc-s{s}"))]
    rows = [[str(k), fmt([m["by_n"][str(k)]["he"] for m in mc], n), fmt([m["by_n"][str(k)]["se"] for m in mc], n),
             fmt([m["by_n"][str(k)]["rollouts_per_sample"] for m in mc], n)] for k in MC_NS]
    plot_lines(img and img / "mc_labels.png", [("MC step labels against gold", "agreement", {
        name: (list(MC_NS), [statistics.mean([m["by_n"][str(k)][key] for m in mc]) for k in MC_NS],
               [statistics.stdev([m["by_n"][str(k)][key] for m in mc]) if len(mc) > 1 else 0.0 for k in MC_NS])
        for name, key in (("hard estimation", "he"), ("soft estimation (>= 0.5)", "se")) if mc})],
        "N: rollouts per step", logx=True)

    def span(key: str) -> str:  # each seed draws its own samples, so their counts differ
        lo, hi = min(m[key] for m in mc), max(m[key] for m in mc)
        return f"{lo}" if lo == hi else f"{lo}-{hi}"

    sizes = f"{span('samples')} samples, {span('steps')} steps" if mc else "no data"
    return ["", "## 4. Monte-Carlo step labels against gold labels, by the number of rollouts N", "",
            "Mirrors Math-Shepherd §5.2: hard estimation agrees best with human labels at small N (86% at N = 4) and "
            "degrades as N grows; soft estimation keeps improving with N. Here: each seed's SFT policy, "
            f"{sizes} per seed (the same samples at every N, fresh rollouts), gold labels from exact arithmetic.", "",
            table(["N", "HE agreement", "SE agreement", "rollouts per sample"], rows),
            "", "![MC label agreement against N](img/mc_labels.png)", "", PLACEHOLDER]


def best_of_n_section(data: dict, n: int, last: int, img: Path | None) -> list[str]:
    """5. Best-of-N by each RM's pick and RM-weighted vote, majority vote and a random pick, of the prm arm."""
    ns = sorted({int(k.split("@")[1]) for m in data.get("prm", {}).values() for r in m.values() for k in r
                 if k.startswith("bon/prm@")})
    picks = {"prm": "PRM", "prm_vote": "PRM vote", "orm": "ORM", "orm_vote": "ORM vote", "majority": "majority",
             "random": "random"}  # `bon/<pick>@N` -> its column and plot label
    ends = sorted({0, last})
    rows = [[str(k)] + [fmt(values(data, "prm", r, f"bon/{w}@{k}"), n) for r in ends for w in picks] for k in ns]
    plot_lines(img and img / "best_of_n.png", [
        (f"best-of-N, round {r}", "accuracy",
         {label: curve(data, "prm", [(k, r, f"bon/{w}@{k}") for k in ns]) for w, label in picks.items()})
        for r in ends], "N: candidates per problem", logx=True)
    return ["", "## 5. Best-of-N with the PRM, the ORM and majority vote", "",
            "Mirrors Math-Shepherd's verification results (best-of-N against N, the PRM against an ORM and "
            "self-consistency): the PRM ranks best, increasingly so as N grows, and its best verifier is the "
            "RM-weighted majority vote (`vote`: each sample's answer gets its RM score as its vote), above both "
            "self-consistency and best-of-N by the RM alone, the gap growing with N. Here: the prm arm's eval "
            "samples, scored once by that round's RMs (best-of-N and the vote use the same scores); a random pick "
            "is the floor.", "",
            table(["N"] + [f"{label} r{r}" for r in ends for label in picks.values()], rows),
            "", "![Best-of-N against N](img/best_of_n.png)", "", PLACEHOLDER]


def issue16_section(ex: Experiments, data: dict, seeds: list[int], rounds: list[int], img: Path | None) -> list[str]:
    """Section 6: hybrid credit (grid on the first seed, then the chosen arm on every seed), the oracle PRM, and
    what limits the PRM (experiments/prm_study.py's table when it has run)."""
    return hybrid_and_oracle(data, seeds, rounds, img) + prm_quality(data, seeds, rounds) + prm_study_table(ex) + [
        "", PLACEHOLDER]


def hybrid_and_oracle(data: dict, seeds: list[int], rounds: list[int], img: Path | None) -> list[str]:
    """Section 6's title, the hybrid grid on the first seed, and the chosen hybrid and the oracle on every seed."""
    last, s0, n = rounds[-1], seeds[0], len(seeds)
    grid = ["verifier", "prm", *HYBRID_ARMS, "oracle"]
    rows = [[LABELS[arm]] + [f"{v:.3f}" if (v := at(data, arm, s0, r, "eval/maj@8")) is not None else "-"
                             for r in rounds]
            + [f"{v:.2f}" if (v := at(data, arm, s0, r, SHARE)) is not None else "-" for r in rounds[1:]]
            for arm in grid if arm in data]
    chosen = chosen_hybrid(data, s0, last)
    compared = ["verifier", "prm", *([chosen] if chosen else []), "oracle"]
    rows3 = [[LABELS[arm]] + [fmt(values(data, arm, r, "eval/maj@8"), n) for r in rounds]
             + [fmt_se(d := paired(data, arm, "verifier", last, "eval/maj@8")) if arm != "verifier" else "-",
                f"{sum(x >= 0 for x in d)} of {len(d)}" if arm != "verifier" else "-",
                verdict(d) if arm != "verifier" else "-",
                fmt(values(data, arm, last, SHARE), n) if arm == chosen else "-"]
             for arm in compared if arm in data]
    plot_lines(img and img / "pay_their_way.png", [
        ("Maj@8 per round", "accuracy", {LABELS[x]: by_round(data, x, rounds, "eval/maj@8") for x in compared})],
        "round")
    return ["", "## 6. Do the learned reward models pay their way? Hybrid credit, an oracle PRM, the PRM's quality", "",
            "Hybrid supervision (`supervision.mode: hybrid`): each token's advantage is the verifier's group-normalised "
            "outcome advantage plus `w` times the PRM's process advantage, with DeepSeekMath's summed credit or PURE's "
            "min-form credit (arXiv 2504.15275). The oracle arm is process supervision with the exact gold step labels "
            "as step rewards (`reward_model.oracle: gold`): the upper bound of any PRM here. The PRM share is "
            f"`{SHARE}`, Var(w P) / (Var(O) + Var(w P)) over the tokens in the loss, per RL round.", "",
            f"Grid on seed {s0} (Maj@8 by round, then the PRM share of the advantages' variance by RL round):", "",
            table(["arm"] + [f"Maj@8 r{r}" for r in rounds] + [f"PRM share r{r}" for r in rounds[1:]], rows), "",
            f"Chosen on seed {s0}: {LABELS.get(chosen, 'none yet')} (best Maj@8 at round {last} among the grid arms whose "
            "PRM term carries >= 20% of the variance in every RL round). Every seed:", "",
            table(["arm"] + [f"Maj@8 r{r}" for r in rounds] + [f"Δ vs verifier r{last}, mean ± SE over seeds",
                                                              "seeds >= verifier", "verdict (the rule)",
                                                              f"PRM share r{last}"], rows3),
            "", "![Maj@8 per round: verifier, PRM, hybrid, oracle](img/pay_their_way.png)", ""]


def prm_quality(data: dict, seeds: list[int], rounds: list[int]) -> list[str]:
    """The prm arm's PRM step AUC against gold by seed and round: eval samples, the held-out slice in brackets."""
    def cell(s: int, r: int) -> str:
        ev, held = at(data, "prm", s, r, "eval/prm_step_auc_gold"), at(data, "prm", s, r, "prm/step_auc_gold")
        return (f"{ev:.3f}" if ev is not None else "-") + (f" ({held:.3f})" if held is not None else "")

    auc = [[str(s)] + [cell(s, r) for r in rounds] for s in seeds if s in data.get("prm", {})]
    return ["The prm arm's PRM step AUC against gold, by seed and round: on every eval sample "
            "(`eval/prm_step_auc_gold`: the round's PRM, held-out problems, thousands of steps) and in brackets on the "
            "RM phase's held-out slice of the shard's prompts (`prm/step_auc_gold`). Goal: >= 0.85 in every round and "
            "seed.", "",
            table(["seed"] + [f"round {r}" for r in rounds], auc)]


def prm_study_table(ex: Experiments) -> list[str]:
    """Every study experiments/prm_study.py kept (`--figures`), one row per run and variant; nothing when none ran."""
    kept = [read_json(p) for p in sorted((ex.figures / "prm-study").glob("*.json"))]
    if not kept:
        return []
    kept.sort(key=lambda k: (k["seed"], k["collect"]))
    rounds_run = sorted({int(r) for k in kept for v in k["results"].values() for r in v})
    head = ["seed", "collected a round", *prm_study.header(rounds_run)]
    lines = [[str(k["seed"]), f"{k['collect'][0]} prompts x {k['collect'][1]}", *row]
             for k in kept for row in prm_study.rows(k["results"], rounds_run)]
    return ["", "What limits the PRM (`python -m experiments.prm_study --run RUN --figures docs/experiments`, on verifier "
            "arms, whose shards do not depend on the PRM): each variant retrains the PRM round after round on RUN's "
            "shards as the RM phase does; step AUC against gold on the round's policy sampled "
            f"{kept[0].get('samples_per_test_problem')} times on every held-out test problem (in brackets: on the "
            "pipeline's held-out slice of the shard). Runs: " + "; ".join(f"`{k['run']}`" for k in kept) + ".", "",
            table(head, lines)]


def per_seed_section(data: dict, rounds: list[int]) -> list[str]:
    """Every arm's Maj@8 by seed and round."""
    rows = [[arm, str(s)] + [f"{m[r]['eval/maj@8']:.3f}" if "eval/maj@8" in m.get(r, {}) else "-" for r in rounds]
            for arm in ARMS for s, m in sorted(data.get(arm, {}).items())]
    return ["", "## Per seed: Maj@8 by round", "", table(["arm", "seed"] + [f"round {r}" for r in rounds], rows), ""]


def keep_verdicts(text: str, old: Path) -> str:
    """Put back the verdicts written by hand under each section of an earlier report, so a rebuilt one keeps them."""
    if not old.exists():
        return text
    kept = {}
    for section in old.read_text().split("\n## ")[1:]:
        title, _, body = section.partition("\n")
        for para in body.split("\n\n"):
            if para.strip().startswith("**What held") and para.strip() != PLACEHOLDER:
                kept[title] = para.strip()
    sections = text.split("\n## ")
    for i, section in enumerate(sections[1:], 1):
        title = section.partition("\n")[0]
        if title in kept:
            sections[i] = section.replace(PLACEHOLDER, kept[title])
    return "\n## ".join(sections)


def keep_study(text: str, old: Path) -> str:
    """Put back each study's section (`STUDIES`, each between its markers) that an earlier report had."""
    before = old.read_text() if old.exists() else ""
    for name in STUDIES:
        begin, end = study_markers(name)
        if begin in before:
            text = with_study(text, begin + before.partition(begin)[2].partition(end)[0] + end, name)
    return text


def with_study(text: str, block: str, name: str = "credit-study") -> str:
    """`text` with the study `name`'s `block` in place of its own; else in its place among the other studies' sections
    (`STUDIES`' order), or before the first section (the older ones after it, as history), or at the end of a text
    with none."""
    begin, end = study_markers(name)
    if begin in text:
        head, _, rest = text.partition(begin)
        return head + block + rest.partition(end)[2]
    order = STUDIES.index(name) if name in STUDIES else len(STUDIES)  # its place among the studies' sections
    ends = [text.index(e) + len(e) for other in STUDIES[:order] if (e := study_markers(other)[1]) in text]
    if ends:
        return text[:max(ends)] + "\n\n" + block + text[max(ends):]
    if starts := [text.index(b) for other in STUDIES[order + 1:] if (b := study_markers(other)[0]) in text]:
        return text[:min(starts)] + block + "\n\n" + text[min(starts):]
    head, sep, rest = text.partition("\n## ")
    return head + "\n" + block + "\n" + sep + rest if sep else text + "\n" + block + "\n"


# --- README.md's results at a glance: one region, each answer a figure of the kept units ------------------------


def glance(figures: Path, learned: tuple[str, ...]) -> str:
    """README's results table from the kept units under `figures` (docs/experiments): the main comparisons' and the
    credit study's quickstart arms (`learned`: those whose step values a learned RM gives)."""
    data = {arm: {int(k.stem.rsplit("-s", 1)[1]): {int(r): m for r, m in read_json(k)["rounds"].items()}
                  for k in sorted(figures.glob(f"{arm}-s*.json"))} for arm in ARMS}
    # Issue 47's study (every unit from one commit) once it has a learned arm; before it, issue 39's units.
    study47 = figures / "study47" / "quickstart"
    frozen = any(next(study47.glob(f"{arm}-s*.json"), None) for arm in learned)
    credit = {}
    for k in sorted((study47 if frozen else figures / "credit" / "quickstart").glob("*-s*.json")):
        arm, seed = k.stem.rsplit("-s", 1)
        if "rounds" in (kept := read_json(k)):
            credit.setdefault(arm, {})[int(seed)] = {int(r): m for r, m in kept["rounds"].items()}
    mc = [read_json(p)["by_n"] for p in sorted(figures.glob("mc-s*.json"))]
    maj = "eval/maj@8"

    def gap(arm: str, base: str = "verifier", d: dict = data) -> str:
        xs = paired(d, arm, base, 2, maj)
        return f"{fmt_se(xs)} ({sum(x >= 0 for x in xs)} of {len(xs)} seeds at or above)"

    def keys_gap(a: str, b: str, r: int) -> str:  # one arm's two metrics, per seed
        return fmt_se([m[r][a] - m[r][b] for m in data["prm"].values()])

    ran = [arm for arm in learned if paired(credit, arm, "verifier", 2, maj)]  # an arm with no kept unit yet: out
    best = max(ran, key=lambda arm: statistics.mean(paired(credit, arm, "verifier", 2, maj)))
    # Every arm put to the rule against the verifier, for Holm's correction (a one-sided paired t over seeds each).
    tried = [arm for arm in credit if arm != "verifier" and paired(credit, arm, "verifier", 2, maj)]
    held = dict(zip(tried, holm([one_sided_t(paired(credit, arm, "verifier", 2, maj)) for arm in tried], 0.05)))
    held = {arm: ok and verdict(paired(credit, arm, "verifier", 2, maj)) == "pays" for arm, ok in held.items()}
    he, se = ([statistics.mean(m[str(k)][key] for m in mc) for k in (MC_NS[0], MC_NS[-1])] for key in ("he", "se"))
    rows = [
        ["Process above outcome supervision (DeepSeekMath Fig. 5)?", f"Maj@8 - the verifier's: PRM {gap('prm')}, Online RFT {gap('rft')}",
         "§1"],
        ["The RM retrained each round above one frozen (Fig. 6)?", f"Maj@8, retrained - frozen: {gap('prm', 'frozen')}", "§2"],
        ["The monitor on an exploitable RM, quiet on the retrained one?", f"fires in round 1 in "
         f"{fired(data, 'exploit', 1, 'monitor/prm_alarm')} seeds; on the retrained RM "
         f"{fired(data, 'prm', 1, 'monitor/prm_alarm')} in round 1, {fired(data, 'prm', 2, 'monitor/prm_alarm')} in 2",
         "§2"],
        ["RL sharpens rather than widens (Fig. 7)?", "round 0 -> 2: Maj@64 "
         f"{fmt_se(gains(data, 'prm', 2, 'eval/maj@64'))}, Pass@64 {fmt_se(gains(data, 'prm', 2, 'eval/pass@64'))}",
         "§3"],
        ["MC labels: hard estimation worse with N, soft better (Math-Shepherd)?",
         f"agreement at N = {MC_NS[0]} -> {MC_NS[-1]}: hard {he[0]:.3f} -> {he[1]:.3f}, soft {se[0]:.3f} -> {se[1]:.3f}",
         "§4"],
        ["The RM-weighted vote at or above majority (Math-Shepherd)?",
         f"vote - majority at N = 64: {keys_gap('bon/prm_vote@64', 'bon/majority@64', 0)} (round 0), "
         f"{keys_gap('bon/prm_vote@64', 'bon/majority@64', 2)} (round 2)", "§5"],
        ["Hybrid credit, or the oracle PRM, above the verifier?",
         f"Maj@8 - the verifier's: hybrid {gap('hybrid-min-w0.5')}, oracle {gap('oracle')}", "§6"],
        ["A learned RM (progress credit, implicit or label-token PRM) above the verifier?",
         f"Maj@8 - the verifier's on the quickstart, the best learned arm (`{best}`) of {len(tried)} tried: "
         f"{gap(best, d=credit)}, {verdict(paired(credit, best, 'verifier', 2, maj))} by the uncorrected rule, "
         f"{'pays' if held[best] else 'does not pay'} under Holm over the {len(tried)}",
         "[issue 47](docs/results.md#issue-47s-study-on-quickstart-from-one-commit)" if frozen
         else "[issue 39](docs/results.md#process-rewards-that-pay-issue-39)"],
    ]
    return table(["question", "here: round 2, mean ± SE over seeds", ""], rows) + "\n"


def one_sided_t(gaps: list[float]) -> float:
    """The p of a one-sided paired t over seeds (mean gap > 0, n - 1 df); NaN where the gaps do not vary.

    >>> round(one_sided_t([0.01, 0.02, 0.03]), 4)   # t = 0.02 / (0.01 / sqrt(3)) = 3.46 on 2 df
    0.0371
    """
    from scipy import stats

    if len(gaps) < 2 or len(set(gaps)) < 2:
        return float("nan")
    return float(stats.ttest_1samp(gaps, 0.0, alternative="greater").pvalue)


def write_region(path: Path, name: str, body: str) -> None:
    """Put `body` in place of the generated region `name` of the page at `path` (an error naming both if absent)."""
    text = path.read_text()
    head, sep, rest = text.partition(f"<!-- generated: {name} -->\n")
    if not sep or GENERATED_END not in rest:
        raise ValueError(f"{path}: no region '<!-- generated: {name} -->' ... '{GENERATED_END}'")
    path.write_text(head + sep + body + GENERATED_END + rest.partition(GENERATED_END)[2])


def _log_summary(ex: Experiments, path: Path, img: Path) -> None:
    """The report and its plots as artifacts of one `summary` run in the experiment."""
    from mlflow import MlflowClient

    from pipeline import tracking

    exp = tracking.connect(ex.a.tracking_uri, ex.a.experiment)
    run = tracking.create_run(exp, "summary", tags={"arm": "summary"})
    MlflowClient().log_artifact(run, str(path))
    MlflowClient().log_artifacts(run, str(img), "img")
    tracking.finish(run)
