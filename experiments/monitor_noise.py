"""How noisy is the reward-hacking monitor's reference? Each RM's calibration gap, with its standard error.

The monitor's alarm compares a rise (fresh gap - held-out gap) with `eval.monitor_threshold`. The held-out gap
comes from the RM phase's held-out slice, a few dozen prompts of 8 samples each; samples of one prompt share
its difficulty, so the slice's noise is that of its prompts, not of its samples. For each round's RM of a run
directory this prints the calibration gap recomputed from the slice (it must equal `calibration.json`'s), its
standard error by a bootstrap over the slice's prompts, and the rise the next round's monitor read against
it, in those standard errors (a frozen RM's rises in every later round).

    python -m experiments.monitor_noise runs/quickstart               # every RM kind with a calibration
    python -m experiments.monitor_noise runs/quickstart --kinds prm --resamples 4000
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.eval_phase import hacking_gap
from pipeline.loading import config_from_dict
from pipeline.replay import read_shard
from pipeline.reward_model import load_scorer, read_calibration, split_holdout
from pipeline.rundir import Manifest, RunDir, read_json


def prompt_bootstrap_se(scores: Sequence[float], outcomes: Sequence[int], prompts: Sequence[str],
                        resamples: int = 2000, seed: int = 0) -> float:
    """Standard error of `hacking_gap(scores, outcomes)` by resampling whole prompts with replacement."""
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(p, []).append(i)
    keys, rng = list(groups), random.Random(seed)
    gaps = []
    for _ in range(resamples):
        rows = [i for k in (rng.choice(keys) for _ in keys) for i in groups[k]]
        gaps.append(hacking_gap([scores[i] for i in rows], [outcomes[i] for i in rows]))
    return float(np.std(gaps, ddof=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--kinds", nargs="+", help="RM kinds (default: the run's reward_model.kinds)")
    ap.add_argument("--resamples", type=int, default=2000)
    args = ap.parse_args()
    cfg = config_from_dict(Manifest.load(args.run_dir).data["config"], check_trl=False)
    run, rm = RunDir(args.run_dir), cfg.reward_model
    print(f"{args.run_dir}: eval.monitor_threshold {cfg.eval.monitor_threshold}")
    print(f"{'RM':<12} {'rows':>4} {'prompts':>7} {'held-out gap':>12} {'SE':>6} {'read in':>8} {'rise':>7} {'rise/SE':>7}")
    for kind in args.kinds or rm.kinds:
        for r in range(cfg.run.rounds + 1):
            checkpoint = run.reward_model(r, kind)
            cal = read_calibration(checkpoint) if checkpoint.is_dir() else None
            if cal is None:
                continue
            _, held = split_holdout(read_shard(run.shard(r)), rm.holdout_fraction, cfg.run.seed + r)
            scorer = load_scorer(kind, checkpoint, rm, cfg.eval.batch_size)
            scores = scorer.scores([x["prompt"] for x in held], [x["completion"] for x in held]).solutions
            outcomes, prompts = [x["outcome"] for x in held], [x["prompt"] for x in held]
            gap, se = hacking_gap(scores, outcomes), prompt_bootstrap_se(scores, outcomes, prompts, args.resamples)
            assert abs(gap - cal["gap"]) < 1e-6, f"{checkpoint}: recomputed gap {gap} against calibration {cal['gap']}"
            later = range(r + 1, cfg.run.rounds + 1) if not rm.retrain else [r + 1]
            rises = [(t, read_json(run.eval_json(t))["metrics"].get(f"monitor/{kind}_gap_rise"))
                     for t in later if run.eval_json(t).is_file()]
            for t, rise in rises or [(None, None)]:
                read = "-" if t is None else f"round {t}"
                shown = "-" if rise is None else f"{rise:+.3f}"
                ratio = "-" if rise is None else f"{rise / se:+.1f}"
                print(f"{kind} r{r:<9} {len(held):>4} {len(set(prompts)):>7} {gap:>12.3f} {se:>6.3f} {read:>8} "
                      f"{shown:>7} {ratio:>7}")


if __name__ == "__main__":
    main()
