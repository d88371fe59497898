"""SmolLM2 on the step-credit task (issue 57, point 6): the verifier, the oracle and a learned arm from one round-0
policy a seed, 2 seeds, each round-1 policy against round 0 and against the verifier's on the same 400 problems.

On configs/smollm2-arith.yaml with the sweep's `long-sparse` shape (experiments/step_credit.py SETTINGS: 4-5
operations, 70% of the SFT solutions slip at the middle step) and 1 RL round. For each seed, the units of
experiments/runner.py, each skipped once kept: `sft-s<seed>` SFTs the round-0 policy once; `verifier-s<seed>`,
`oracle-progress-s<seed>` and `<learned>-s<seed>` (`--learned`: a learned arm of experiments/credit_arms.py's ARMS)
each run 1 RL round from it (bootstrap.sft=false); `noise-<learned>-s<seed>` runs experiments/round_noise.py on
round 0 and the three round-1 policies, on the same 400 problems (the runs' 20 held-out ones and 380 in neither
split). Each unit's figures are kept in docs/experiments/smollm2-step-credit/ with its commit, machine and wall time
(an arm's: its rounds, per-problem eval values and GRPO `train_runtime`s; round_noise's: every policy's per-problem
values).

  python -m experiments.smollm2_step_credit --learned prm-progress   # both seeds, resumable
  python -m experiments.smollm2_step_credit --learned prm-progress --dry-run   # each unit's settings, no run
  python -m experiments.smollm2_step_credit --report-only            # the section from the kept files, seconds

Expected wall time on 2 cores in bf16, read from issue 58's kept phase times (docs/experiments/smollm2-budgets/,
scaled by a 5-step chain's ~1.4x tokens): a seed's SFT ~2 min, each arm ~6-8 min, round_noise ~15 min (4 policies x
400 problems x a greedy and 4 samples): ~37 min a seed, ~75 min for both; `--problems 200` halves round_noise's.

Its section of docs/results.md (`report`, also written by `python -m experiments.pages`) is made from the kept files
alone: per seed and pooled over the seeds, each arm's round 1 minus the verifier's and minus round 0, per problem with
the paired SE, and the verdict on the issue's goal (`verdict`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench._common import ROOT, table
from experiments import round_noise
from experiments.credit_study import LEARNED, region
from experiments.runner import stoppable
from experiments.smollm2_control import gap
from experiments.step_credit import SETTINGS, Units
from pipeline.evaluate import paired_difference
from pipeline.loading import load_config
from pipeline.rundir import RunDir, read_json

CONFIG = "configs/smollm2-arith.yaml"
FIGURES = Path("docs/experiments/smollm2-step-credit")
RUNS = "runs/smollm2-step-credit"
STUDY = "smollm2-step-credit"  # the section's markers in docs/results.md
SETTING = "long-sparse"
SEEDS = (0, 1)
ROUNDS = 1
CONTROL, ORACLE = "verifier", "oracle-progress"
PROBLEMS = 400  # round_noise's: the runs' held-out problems and the rest in neither split
NAMES = {"greedy": "greedy", "pass@1": "Pass@1"}
PRIMARY = "pass@1"  # the verdict's metric, as the sweep's (step_credit.SWEEP_PRIMARY): the least noisy of the three
Z = 2.0  # the verdict: below the verifier means a pooled gap at least this many paired SE under 0
# SmolLM2's tokenizer writes each digit as a token: the longest gold 5-step solution of seeds 0 and 1 (train, test and
# round_noise's fresh problems) is 51 tokens and <|im_end|> one more (tests/test_smollm2_step_credit.py); 64 leaves 12.
TOKENS = 64
# The task: the setting's shape (its problems.* overrides; its lengths are the tiny model's, in characters), 1 RL round,
# SmolLM2's lengths, and a small eval of the runs' own. The wall time's budget is about 20 min a seed on 2 cores: the
# runs' eval of 20 problems, not the config's 100, is ~1/5 of its time (of ~50 s a round in bf16, issue 58's kept
# phases), and round_noise's 400 problems give the figures. The eval's samples stay the config's 4 at T = 0.7, since
# round_noise samples as the run's eval does (Maj@4).
TASK = [*(o for o in SETTINGS[SETTING] if o.startswith("problems.")), f"run.rounds={ROUNDS}",
        f"grpo.max_completion_length={TOKENS}", f"collect.max_new_tokens={TOKENS}", f"eval.max_new_tokens={TOKENS}",
        "eval.num_problems=20"]

# Not pinned to runner.PINNED's AVX2 kernels (`--native` always): the config's `dtype: auto` is bf16 on a CPU with
# AVX512-BF16 or AMX, and on the AVX2 kernels torch emulates bf16. Measured on this project's AVX512-BF16 EPYC, one
# thread, a bf16 linear layer of SmolLM2's width (576 -> 1536, 256 rows): 1.4 ms native, 19.6 ms with
# ATEN_CPU_CAPABILITY=avx2 and ONEDNN_MAX_CPU_ISA=AVX2 (float32: 4.4 ms either way). Each unit file's `machine` says
# "(native)"; a seed's arms and its round_noise run in one command, on one machine.


def units(a: argparse.Namespace) -> Units:
    """The runner's units on the config with the task's overrides (`TASK`), 1 RL round each from the seed's SFT."""
    common = argparse.Namespace(smoke=False, experiment=a.experiment, tracking_uri=a.tracking_uri)
    return Units(common, Path(a.runs_dir), Path(a.figures), CONFIG, TASK, ROUNDS, {"setting": SETTING})


def flat(d: dict, prefix: str = "") -> dict[str, object]:
    """A nested mapping's leaves by dotted key."""
    out = {}
    for k, v in d.items():
        out |= flat(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": v}
    return out


def plan(u: Units, seeds: list[int], learned: str) -> dict[str, dict[str, object]]:
    """Each unit's settings that differ from the config file's (dotted keys), as its run will be given them."""
    base = flat(load_config(ROOT / CONFIG).model_dump(mode="json"))
    out = {}
    for seed in seeds:
        configs = {f"sft-s{seed}": u.config(seed, [f"run.name=sft-s{seed}"])}  # as runner.Experiments.sft's
        configs |= {f"{arm}-s{seed}": u.arm_config(arm, seed) for arm in (CONTROL, ORACLE, learned)}
        out |= {name: {k: v for k, v in flat(c.model_dump(mode="json")).items() if base.get(k) != v}
                for name, c in configs.items()}
    return out


def noise(u: Units, seed: int, learned: str, problems: int) -> dict:
    """round_noise.py on round 0 and the three arms' round-1 policies of `seed`: its file, with each policy's arm."""
    cfg = {arm: u.arm_config(arm, seed) for arm in (CONTROL, ORACLE, learned)}
    others = {str(RunDir(cfg[arm].run_dir).policy(ROUNDS)): arm for arm in (ORACLE, learned)}
    out = u.runs_dir / f"noise-{learned}-s{seed}.json"
    round_noise.main([str(cfg[CONTROL].run_dir), "--rounds", "0", str(ROUNDS), "--out", str(out),
                      "--fresh", str(problems - cfg[CONTROL].eval.num_problems),
                      *(x for p in others for x in ("--policy", p))])
    return {**read_json(out), "seed": seed, "learned": learned,
            "arms": {"round 0": None, f"round {ROUNDS}": CONTROL, **others}}


def run(a: argparse.Namespace) -> None:
    """Every pending unit of each seed: its SFT, the three arms, then round_noise; the section after each."""
    u = units(a)
    u.runs_dir.mkdir(parents=True, exist_ok=True)
    arms = [CONTROL, ORACLE, a.learned]
    for seed in a.seeds:
        u.run_arms([seed], arms, lambda: report(a.out, a.figures))
        if failed := [arm for arm in arms if u.pending(f"{arm}-s{seed}")]:
            print(f"smollm2_step_credit: seed {seed}: {', '.join(failed)} not done; its round_noise waits for it")
            continue
        u.unit(f"noise-{a.learned}-s{seed}", lambda s=seed: noise(u, s, a.learned, a.problems))
        report(a.out, a.figures)


# --- the report: from the kept files alone ---------------------------------------------------------------------


def kept_files(figures: Path = FIGURES) -> tuple[dict[str, dict], dict[str, dict[int, dict]]]:
    """The kept units (name -> record) and round_noise's (learned arm -> seed -> record)."""
    files = {p.stem: read_json(p) for p in sorted((ROOT / figures).glob("*.json"))}
    noises: dict[str, dict[int, dict]] = {}
    for k in (k for name, k in files.items() if name.startswith("noise-")):
        noises.setdefault(k["learned"], {})[k["seed"]] = k
    return {name: k for name, k in files.items() if not name.startswith("noise-")}, noises


def values(noise: dict) -> dict[str | None, dict[str, list[float]]]:
    """A round_noise record's per-problem values by arm (None: round 0), at its first sampling seed."""
    seed = sorted(noise["per_problem"], key=int)[0]
    return {noise["arms"][name]: v for name, v in noise["per_problem"][seed].items()}


def label(arm: str | None) -> str:
    return "round 0" if arm is None else f"`{arm}` round {ROUNDS}"


def pooled(by_seed: dict[int, dict], arm: str | None, metric: str) -> list[float]:
    """An arm's per-problem values of `metric`, every seed's problems one after another (each seed draws its own)."""
    return [x for seed in sorted(by_seed) for x in values(by_seed[seed])[arm][metric]]


def gap_rows(by_seed: dict[int, dict], learned: str) -> list[list[str]]:
    """Each arm's round 1 minus the verifier's and minus round 0: a row a seed and one pooled over the seeds."""
    rows = []
    for before, after in [(CONTROL, ORACLE), (CONTROL, learned), (None, CONTROL), (None, ORACLE), (None, learned)]:
        groups = [[s] for s in sorted(by_seed)] + ([sorted(by_seed)] if len(by_seed) > 1 else [])
        for seeds in groups:
            part = {s: by_seed[s] for s in seeds}
            rows.append([f"{label(after)} - {label(before)}", ", ".join(map(str, seeds)),
                         *(gap(pooled(part, before, m), pooled(part, after, m)) for m in metrics(by_seed))])
    return rows


def verdict(by_seed: dict[int, dict], learned: str) -> str:
    """The issue's goal judged from the kept files: the learned arm's round 1 minus the verifier's on `PRIMARY`, per
    problem over every seed's problems; met unless it is `Z` paired SE or more below 0."""
    goal = (f"**Goal** (issue 57, point 6): on SmolLM2, the best learned arm is at or above the verifier (paired SE "
            f"over problems, {len(SEEDS)} seeds). ")
    if missing := [s for s in SEEDS if s not in by_seed]:
        return goal + f"Not judged yet: round_noise has not run on seed {', '.join(map(str, missing))}."
    before, after = pooled(by_seed, CONTROL, PRIMARY), pooled(by_seed, learned, PRIMARY)
    where = side(before, after)
    text = goal + (f"`{learned}` round {ROUNDS} - `{CONTROL}` round {ROUNDS}, {name(PRIMARY)} per problem over seeds "
                   f"{', '.join(map(str, sorted(by_seed)))} ({len(before)} problems): {gap(before, after)}: {where} "
                   f"the verifier (below: {Z:g} paired SE or more under 0; at: within {Z:g} SE): "
                   + ("**not met**." if where == "below" else "**met**."))
    # What the verdict on `PRIMARY` leaves out: another metric where the learned arm is below the verifier, and whether
    # this round had room for step credit at all (the verifier learned, the oracle gained over it).
    for m in (m for m in metrics(by_seed) if m != PRIMARY):
        if side(base := pooled(by_seed, CONTROL, m), arm := pooled(by_seed, learned, m)) == "below":
            text += f" On {name(m)} it is below: {gap(base, arm)}."
    start, oracle = pooled(by_seed, None, PRIMARY), pooled(by_seed, ORACLE, PRIMARY)
    if side(start, before) != "above":
        text += (f" The verifier's own round {ROUNDS} - round 0 is {gap(start, before)}: this round taught it nothing "
                 "measurable, so the comparison cannot show step credit paying.")
    elif side(before, oracle) != "above":
        text += (f" The oracle's round {ROUNDS} - the verifier's is {gap(before, oracle)}: exact step labels gain "
                 "nothing measurable here, so the comparison cannot show step credit paying.")
    return text


def metrics(by_seed: dict[int, dict]) -> list[str]:
    """round_noise's metrics, as its records name them: greedy, Pass@1 and Maj@<samples>."""
    return ["greedy", "pass@1", f"maj@{by_seed[min(by_seed)]['samples']}"]


def name(metric: str) -> str:
    return NAMES.get(metric, metric.capitalize())  # maj@4 -> Maj@4


def side(before: list[float], after: list[float]) -> str:
    """Where `after` sits against `before`, per problem: "below" or "above" when `Z` paired SE or more away, else
    "at"."""
    mean, se = paired_difference(before, after)
    return "below" if mean < 0 and mean <= -Z * se else "above" if mean > 0 and mean >= Z * se else "at"


def unit_order(item: tuple[str, dict]) -> tuple[int, int, str]:
    """A seed's units in the order they run: its SFT, the verifier, the oracle, the learned arms."""
    arm, _, seed = item[0].rpartition("-s")
    order = ["sft", CONTROL, ORACLE]
    return int(seed), order.index(arm) if arm in order else len(order), arm


def section(figures: Path = FIGURES) -> list[str]:
    """The region's lines: the kept units, then per learned arm its gaps (per seed, pooled) and the verdict."""
    units_kept, noises = kept_files(figures)
    if not units_kept and not noises:
        return ["Not run yet: no unit is kept (`python -m experiments.smollm2_step_credit --learned ARM`)."]
    machines = sorted({k["machine"] for k in units_kept.values()})
    rows = [[f"`{name}`", f"`{k['commit']}`", f"{k['seconds'] / 60:.1f}",
             " / ".join(f"{s:.0f}" for _, s in sorted(k.get("grpo_seconds", {}).items())) or "-",
             f"`{k.get('start', k.get('policy', '-'))}`"]
            for name, k in sorted(units_kept.items(), key=unit_order)]
    lines = [f"Overrides of `{CONFIG}`, every unit: " + " ".join(f"`{o}`" for o in TASK) + f"; {ROUNDS} RL round "
             f"from the seed's SFT policy, plus the arm's overrides (experiments/credit_arms.py). On "
             f"{'; '.join(machines)}:", "",
             table(["unit", "commit", "wall time (min)", "GRPO seconds", "round-0 policy (weights' hash)"], rows)]
    for learned, by_seed in sorted(noises.items()):
        first = by_seed[min(by_seed)]
        lines += ["", f"round_noise on each seed (seed {min(by_seed)}'s: `{first['command']}`): {first['problems']} "
                  "problems a seed "
                  f"({first['fresh']} in neither split), greedy and {first['samples']} samples at T = "
                  f"{first['temperature']}; each difference per problem, mean ± paired SE (pooled: every seed's "
                  "problems together):", "",
                  table(["difference", "seeds", "greedy", "Pass@1", f"Maj@{first['samples']}"],
                        gap_rows(by_seed, learned)), "", verdict(by_seed, learned)]
    if not noises:
        lines += ["", "round_noise has not run on any seed yet: no gap, no verdict."]
    return lines


def report(out: Path, figures: Path = FIGURES) -> None:
    """Write the section `smollm2-step-credit` of the page `out` (docs/results.md) from the kept files."""
    from experiments.report import STUDIES, study_markers, with_study

    assert STUDY in STUDIES  # the reports' in-place rebuilds keep it
    begin, end = study_markers(STUDY)
    folder = f"{FIGURES.as_posix()}/"  # linked once a unit is kept there (git keeps no empty folder)
    kept = f"[{folder}]({FIGURES.relative_to('docs').as_posix()}/)" if (ROOT / FIGURES).is_dir() else f"`{folder}`"
    block = [begin, "## SmolLM2 on the step-credit task (issue 57)", "",
             "SmolLM2-135M-Instruct on the sweep's `long-sparse` arithmetic (4-5 operations, SFT slips at the middle "
             "step): the verifier, the gold-label oracle and a learned arm, each one RL round from the same round-0 "
             "policy, then all of them against round 0 on the same problems; made by "
             f"experiments/smollm2_step_credit.py from {kept}.", "",
             *region(STUDY, section(figures)), end]
    out = Path(out)
    text = out.read_text() if out.exists() else ""
    out.write_text(with_study(text, "\n".join(block), STUDY))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--learned", choices=LEARNED, help="the learned arm (to run; the report reads every kept one)")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--problems", type=int, default=PROBLEMS, help="round_noise's problems a seed")
    ap.add_argument("--runs-dir", default=RUNS)
    ap.add_argument("--figures", type=Path, default=FIGURES, help="the kept unit files")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results.md", help="the page the section goes into")
    ap.add_argument("--experiment", default="iterative-grpo-smollm2-step-credit", help="MLflow experiment")
    ap.add_argument("--tracking-uri", default=None)
    ap.add_argument("--dry-run", action="store_true", help="print each unit's settings that differ from the config")
    ap.add_argument("--report-only", action="store_true", help="only rebuild the section from the kept files")
    a = ap.parse_args(argv)
    if not a.report_only and a.learned is None:
        ap.error("--learned ARM is needed to run the units (or --report-only)")
    if a.dry_run:
        for name, changed in plan(units(a), a.seeds, a.learned).items():
            print(f"{name}: " + " ".join(f"{k}={v}" for k, v in changed.items()))
        return
    if not a.report_only:
        from flows.console import prefect_defaults

        prefect_defaults()
        stoppable("smollm2_step_credit", lambda: run(a))
    report(a.out, a.figures)
    print("\n".join(section(a.figures)))


if __name__ == "__main__":
    main(sys.argv[1:])
