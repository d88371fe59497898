"""What limits the PRM's step AUC against gold (issue 16, point 4): a small study on one run's shards.

Each variant (a few `reward_model.*` settings, or a change to the training rows) retrains the PRM round after
round exactly as the pipeline's reward-model phase does (`train_reward_model` on the round's shard minus its
held-out slice plus the replay, warm-started from the variant's own previous round unless cold), on the
shards of a finished run (`--run`: its collection does not depend on the PRM when the run's supervision is
the verifier's, so every variant sees the same data). Each PRM is judged by step AUC against the gold labels
on two sets:

  held-out  the pipeline's held-out slice of the round's shard (~150 samples, ~500 steps: the figure
            `prm/step_auc_gold` the pipeline logs, and noisy)
  test      the round's policy sampled on the held-out test problems (`--samples` each at the eval
            temperature), gold labels computed exactly: thousands of steps, the figure to decide on

Variants: default (the run's settings), hard (HE targets), lr1e-4 / lr1e-3, epochs3 / epochs12, cold (each
round from the policy, not the previous PRM), half (half the round's training rows: is it data-bound?),
balanced (samples with a step HE labels wrong oversampled to half the rows: class balance), gold (the same rows
with their exact step labels instead of the MC ones: what the MC labels' errors cost), and two pairs,
hard+lr1e-4 and hard+epochs12. `--set KEY=VALUE` runs every variant with one more override, kept apart under
the name `<variant>+KEY=VALUE`. The backbone is the round's policy unless `--set reward_model.model=DIR` gives
another, e.g. a wider and deeper tiny model SFT'd on the same data (backbone capacity):
  igrpo bootstrap configs/quickstart.yaml --set run.seed=0 --set policy.tiny.hidden_size=256 ...
      --set bootstrap.sft_args.learning_rate=1e-3 --out DIR      # ~12 min on 2 cores; 2e-3 trains it badly

  python -m experiments.prm_study --run runs/experiments/verifier-s0    # ~15 min on 2 cores
  python -m experiments.prm_study --run ... --only default --only hard  # some variants
  python -m experiments.prm_study --run ... --rounds 0                  # some rounds (warm starts chain within them)
Results: `<run>/prm_study/results.json` (resumable: finished variant-rounds are kept), a table on stdout; with
`--figures docs/experiments` also kept as docs/experiments/prm-study/<run>.json, which experiments/report.py
tabulates in docs/results.md (every kept run, by seed and by how much the run collected a round). More rows a round
is not a variant (the study cannot add samples): run the verifier arm with a larger `collect.prompts_per_round`
or `collect.samples_per_prompt` and study that run.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import time
from pathlib import Path

from bench._common import table
from pipeline.eval_phase import held_out_problems
from pipeline.loading import config_from_dict
from pipeline.rundir import Manifest, RunDir, read_json, write_json_atomic

VARIANTS: dict[str, list[str]] = {
    "default": [],
    "hard": ["reward_model.target=hard"],
    "lr1e-4": ["reward_model.train_args.learning_rate=1e-4"],
    "lr1e-3": ["reward_model.train_args.learning_rate=1e-3"],
    "epochs3": ["reward_model.train_args.num_train_epochs=3"],
    "epochs12": ["reward_model.train_args.num_train_epochs=12"],
    "cold": ["reward_model.warm_start=false"],
    "hard+lr1e-4": ["reward_model.target=hard", "reward_model.train_args.learning_rate=1e-4"],
    "hard+epochs12": ["reward_model.target=hard", "reward_model.train_args.num_train_epochs=12"],
    "half": [],
    "balanced": [],
    "gold": [],
}
ROW_CHANGES = {"half", "balanced", "gold"}  # variants that change the training rows, not the config


def training_rows(variant: str, rows: list[dict], seed: int) -> list[dict]:
    """The pipeline's training rows, or the variant's change of them."""
    rng = random.Random(seed)
    if variant == "half":
        return rng.sample(rows, len(rows) // 2)
    if variant == "balanced":
        # By the MC labels (HE), what a task without gold labels has too.
        wrong = [r for r in rows if 0 in r["he_labels"]]
        right = [r for r in rows if 0 not in r["he_labels"]]
        if wrong and len(wrong) < len(right):
            wrong = wrong + rng.choices(wrong, k=len(right) - len(wrong))
        return right + wrong
    if variant == "gold":
        # The exact step labels instead of the MC ones, on the same rows: how much do the MC labels' errors cost?
        if any(r["gold_labels"] is None for r in rows):
            raise SystemExit("variant gold: the run's problem set has no gold step labels")
        return [r | {"he_labels": r["gold_labels"], "se_labels": r["gold_labels"]} for r in rows]
    return rows


def step_auc_gold(scorer, problem_set, prompts: list[str], completions: list[str], problems: list) -> dict:
    """Step AUC of the PRM against gold labels (over all steps, and within each step position), and the solution
    AUC (min over steps) against the verifier."""
    from pipeline.rm_metrics import auc, step_label_pairs, within_position_auc

    steps = scorer.step_scores(prompts, completions)
    gold = [problem_set.gold_step_labels(t, p) for t, p in zip(completions, problems)]
    pairs = step_label_pairs(steps, gold)
    outcome = [int(problem_set.is_correct(t, p)) for t, p in zip(completions, problems)]
    return {"step_auc_gold": auc(*zip(*pairs)), "within_position": within_position_auc(steps, gold),
            "steps": len(pairs),
            "wrong_step_share": 1 - sum(g for _, g in pairs) / max(len(pairs), 1),
            "solution_auc": auc([min(s) if s else 0.0 for s in steps], outcome)}


def test_samples(cfg, run: Path, r: int, n: int, cache: Path) -> dict:
    """Round r's policy sampled n times on every held-out test problem (cached: the same set for every variant)."""
    if cache.exists():
        return read_json(cache)
    from pipeline.generation import load_sampling_model, sample
    from pipeline.problems import problem_set_from_config
    from pipeline.prompts import renderer_from_config

    ps = problem_set_from_config(cfg)
    problems = held_out_problems(cfg, ps)
    model, tok = load_sampling_model(str(RunDir(run).policy(r)), "hf", {})
    prompts = [renderer_from_config(cfg, tok).render(p) for p in problems]
    e = cfg.eval
    out = sample(model, tok, prompts, n, temperature=e.temperature, top_p=e.top_p, max_new_tokens=e.max_new_tokens,
                 batch_size=e.batch_size, seed=10_007 + r)
    data = {"problem": [i for i, texts in enumerate(out.texts) for _ in texts],
            "prompt": [prompts[i] for i, texts in enumerate(out.texts) for _ in texts],
            "completion": [t for texts in out.texts for t in texts]}
    write_json_atomic(cache, data)
    return data


def study_round(cfg, variant: str, name: str, run: Path, r: int, prev: str | None, out: Path, samples: int) -> dict:
    """Train the variant's PRM of round r (checkpoint under `out / name`) and measure it; its figures and checkpoint."""
    from pipeline.problems import problem_set_from_config
    from pipeline.replay import ReplayBuffer
    from pipeline.reward_model import backbone, load_scorer, split_holdout, train_reward_model

    rm, seed = cfg.reward_model, cfg.run.seed + r
    buffer = ReplayBuffer(run)
    rows, held = split_holdout(buffer.read(r), rm.holdout_fraction, seed)
    rows = training_rows(variant, rows + buffer.sample_history(rm.replay_fraction, r, seed=seed), seed)
    init = backbone(cfg, Manifest.load(run).output(r, "policy")["path"])
    warm = bool(rm.warm_start and prev)
    start = time.perf_counter()
    folder = re.sub(r"[^\w.=+-]", "_", name)  # a --set value may hold a path: one folder per variant all the same
    path = train_reward_model(cfg, "prm", rows, prev if warm else init, out / folder / f"round-{r:03d}", warm)
    seconds = time.perf_counter() - start
    ps = problem_set_from_config(cfg)
    by_id = {p.id: p for p in [*ps.train, *ps.test]}
    scorer = load_scorer("prm", path, rm, cfg.eval.batch_size)
    test = test_samples(cfg, run, r, samples, out / f"test-samples-round-{r:03d}.json")
    tests = held_out_problems(cfg, ps)
    return {"checkpoint": str(path), "train_rows": len(rows), "train_seconds": seconds,
            "held_out": step_auc_gold(scorer, ps, [x["prompt"] for x in held], [x["completion"] for x in held],
                                      [by_id[x["prompt_id"]] for x in held]),
            "test": step_auc_gold(scorer, ps, test["prompt"], test["completion"], [tests[i] for i in test["problem"]])}


def rows(results: dict, rounds: list[int]) -> list[list[str]]:
    """Per variant: step AUC against gold per round on the test samples (held-out slice in brackets), their mean
    and min, and the training seconds per round."""
    out = []
    for variant, by_round in results.items():
        cells, tests, secs = [], [], []
        for r in rounds:
            x = by_round.get(str(r))
            if x is None:
                cells.append("-")
                continue
            tests.append(x["test"]["step_auc_gold"])
            secs.append(x["train_seconds"])
            cells.append(f"{x['test']['step_auc_gold']:.3f} ({x['held_out']['step_auc_gold']:.3f})")
        out.append([variant, *cells, f"{statistics.mean(tests):.3f}" if tests else "-",
                    f"{min(tests):.3f}" if tests else "-", f"{statistics.mean(secs):.0f}" if secs else "-"])
    return out


def header(rounds: list[int]) -> list[str]:
    """The columns of `rows`."""
    return ["variant", *(f"round {r}" for r in rounds), "mean (test)", "min (test)", "train s/round"]


def keep(saved: dict, figures: Path, run: Path) -> Path:
    """The study's results beside the experiments' kept figures (`<figures>/prm-study/<run>.json`), so the report is
    rebuilt from them when the run directory is gone."""
    return write_json_atomic(figures / "prm-study" / f"{run.name}.json", saved)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", default="runs/experiments/verifier-s0", help="a finished run directory")
    ap.add_argument("--only", action="append", choices=list(VARIANTS), help="these variants only (repeatable)")
    ap.add_argument("--set", action="append", default=[], help="another reward_model override for every variant")
    ap.add_argument("--samples", type=int, default=8, help="samples per test problem for the test set")
    ap.add_argument("--rounds", type=int, nargs="+", help="these rounds only (default: every collected round)")
    ap.add_argument("--figures", help="also keep the results here (docs/experiments: the report's table reads them)")
    a = ap.parse_args()
    run = Path(a.run)
    out = run / "prm_study"
    manifest = Manifest.load(run)
    rounds = sorted({int(k.split("/")[0].split("-")[1]) for k in manifest.data["phases"] if k.endswith("/collect")})
    rounds = [r for r in rounds if a.rounds is None or r in a.rounds]
    path = out / "results.json"
    saved = read_json(path) if path.exists() else {"run": str(run), "results": {}}
    c = manifest.data["config"]  # what the report names the run by: its seed and how much it collected a round
    saved.update(seed=c["run"]["seed"], collect=[c["collect"]["prompts_per_round"], c["collect"]["samples_per_prompt"]])
    for variant in a.only or list(VARIANTS):
        cfg = config_from_dict(manifest.data["config"], [*VARIANTS[variant], *a.set], check_trl=False)
        name = "+".join([variant, *a.set])  # --set makes another variant: its results must not pass for this one's
        prev = None
        for r in rounds:
            done = saved["results"].setdefault(name, {}).get(str(r))
            if done is None:
                print(f"[{time.strftime('%H:%M:%S')}] {name} round {r} ...", flush=True)
                done = study_round(cfg, variant, name, run, r, prev, out, a.samples)
                saved["results"][name][str(r)] = done
                saved["samples_per_test_problem"] = a.samples
                write_json_atomic(path, saved)
            prev = done["checkpoint"]
    print(table(header(rounds), rows(saved["results"], rounds)))
    if a.figures:
        print(f"kept: {keep(saved, Path(a.figures), run)}", file=sys.stderr)
    print(f"results: {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
