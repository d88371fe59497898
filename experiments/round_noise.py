"""Is a later policy better than round 0's beyond the evaluation's noise?

Evaluates policies (rounds of a run directory, or checkpoints given with --policy) on the same held-out
problems, with the run's own eval settings and dtype (greedy, `eval.samples_per_problem` samples at its temperature),
and prints greedy, Pass@1 and Maj@n for each, each one's difference from the first, and the difference's
standard error from the per-problem differences (paired: every policy answers the same problems, so the
problems' difficulty cancels; the unpaired SE beside it is what two independent evaluations would give).
`--seeds` repeats the sampling with other seeds: the spread of a sampled metric's difference across seeds
is the sampling noise alone.

    python -m experiments.round_noise runs/smollm2-arith --rounds 0 1 2 --seeds 0 1
    python -m experiments.round_noise runs/smollm2-arith --rounds 0 --policy runs/other/round-002/policy
    python -m experiments.round_noise runs/smollm2-arith --rounds 0 2 --fresh 300     # 400 problems: half the SE

`--out FILE.json` keeps what was measured: every policy's per-problem values for each seed, so that any two
policies' paired difference can be remade from the file (experiments/smollm2_control.py's report reads it).

`--fresh N` adds N problems that neither of the run's splits holds (the embedded set only): its generator draws
problems in a fixed order, test first, then train, so the N drawn after the run's `num_train` training problems
are new to every policy trained on that run's problems (SFT, GRPO and collection read the train split only).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from models.factories import load_tokenizer
from pipeline.eval_phase import held_out_problems
from pipeline.evaluate import evaluate_policy, maj_at_k
from pipeline.fanout import open_sampler
from pipeline.loading import config_from_dict
from pipeline.problems import problem_set_from_config
from pipeline.prompts import renderer_from_config
from pipeline.rundir import RunDir, write_json_atomic


def per_problem(cfg, problem_set, problems: list, policy: Path, seed: int) -> dict[str, np.ndarray]:
    """Greedy correctness, Pass@1 and Maj@n of each problem (0/1 or expected values), as the eval phase samples."""
    e = cfg.eval
    render = renderer_from_config(cfg, load_tokenizer(str(policy))).render
    with open_sampler(str(policy), e, cfg.collect, cfg.policy.dtype) as sampler:  # as the run's eval phase
        ev = evaluate_policy(sampler, problem_set, problems, n=e.samples_per_problem, seed=seed,
                             prompts=[render(p) for p in problems])
    n = e.samples_per_problem
    return {
        "greedy": np.array(ev.greedy_correct, float),
        "pass@1": np.array([np.mean(c) for c in ev.correct]),
        f"maj@{n}": np.array([maj_at_k(a, c, n) for a, c in zip(ev.answers, ev.correct)]),
    }


def fresh_problems(cfg, n: int) -> list:
    """`n` embedded problems drawn after the run's train split: in neither of its splits."""
    if n == 0:
        return []
    if cfg.problems.kind != "arithmetic":
        raise SystemExit("--fresh: only the embedded arithmetic set can draw problems beyond its splits")
    arithmetic = cfg.problems.arithmetic.model_dump()
    num_train = arithmetic["num_train"]
    more = config_from_dict(cfg.model_dump() | {"problems": cfg.problems.model_dump() | {
        "arithmetic": arithmetic | {"num_train": num_train + n}}})
    return problem_set_from_config(more).train[num_train:]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path, help="the run whose config (and rounds) are evaluated")
    ap.add_argument("--rounds", type=int, nargs="+", default=[0], help="its rounds' policies, the first the baseline")
    ap.add_argument("--policy", type=Path, action="append", default=[], help="another policy checkpoint (repeatable)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="sampling seeds (the run's seed is added)")
    ap.add_argument("--fresh", type=int, default=0, help="N more problems, in neither split (embedded set only)")
    ap.add_argument("--out", type=Path, help="keep every policy's per-problem values in this JSON file")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    cfg = config_from_dict(json.loads((args.run_dir / "manifest.json").read_text())["config"])
    problem_set = problem_set_from_config(cfg)
    problems = held_out_problems(cfg, problem_set) + fresh_problems(cfg, args.fresh)
    run = RunDir(args.run_dir)
    policies = {f"round {r}": run.policy(r) for r in args.rounds} | {str(p): p for p in args.policy}
    names = list(policies)
    print(f"{args.run_dir}: {len(problems)} problems ({args.fresh} of them fresh), {cfg.eval.samples_per_problem} samples at "
          f"T={cfg.eval.temperature}; differences against {names[0]}")
    print(f"{'seed':>4} {'policy':<44} {'metric':<8} {'value':>6} {'diff':>7} {'paired SE':>9} {'unpaired SE':>11}")
    diffs: dict[tuple[str, str], list[float]] = {}
    kept: dict[str, dict] = {}
    for s in args.seeds:
        values = {name: per_problem(cfg, problem_set, problems, path, cfg.run.seed + s)
                  for name, path in policies.items()}
        kept[str(s)] = {name: {k: v.tolist() for k, v in m.items()} for name, m in values.items()}
        base = values[names[0]]
        for name in names:
            for k, y in values[name].items():
                x, d = base[k], y - base[k]
                paired = d.std(ddof=1) / np.sqrt(len(d))
                unpaired = np.sqrt(x.var(ddof=1) / len(d) + y.var(ddof=1) / len(d))
                diffs.setdefault((name, k), []).append(d.mean())
                print(f"{s:>4} {name[-44:]:<44} {k:<8} {y.mean():>6.3f} {d.mean():>+7.3f} {paired:>9.3f} "
                      f"{unpaired:>11.3f}")
    if args.out:
        write_json_atomic(args.out, {
            "command": "python -m experiments.round_noise " + " ".join(argv), "run_dir": str(args.run_dir),
            "problems": len(problems), "fresh": args.fresh, "samples": cfg.eval.samples_per_problem,
            "temperature": cfg.eval.temperature, "policies": {n: str(p) for n, p in policies.items()},
            "per_problem": kept})
    if len(args.seeds) > 1:
        for (name, k), v in diffs.items():
            if name != names[0]:
                print(f"{name[-44:]}: {k} diff over seeds {np.mean(v):+.3f} ± {np.std(v, ddof=1):.3f} (sampling alone)")


if __name__ == "__main__":
    main()
