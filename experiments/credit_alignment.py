"""How close do a PRM's process advantages come to the gold step labels' (the oracle's), per credit setting?

Offline and cheap (a few minutes on 2 cores): a round's policy samples GRPO groups on held-out problems (the
run's `grpo.num_generations` completions each, at its temperature and length), the round's PRM scores their steps
as `ProcessGRPOTrainer` does (steps on the policy's own tokens, the eos carrying the last step's reward), and
`process_advantages` turns them into per-token advantages under every `process_baseline` x `grpo.scale_rewards`
x `process_credit`. Each is compared over the tokens in the loss with two references on the same completions:

  oracle    the gold step labels through the oracle run's credit (pooled baseline, group scale, sum): what
            `reward_model.oracle: gold` trains on, and that learns on SmolLM2 (docs/lab/smollm2-arith.md)
  verifier  TRL's outcome advantages (group scale) on every token

by cosine (a proxy for whether the update points the reference's way: the policy gradient is linear in the
advantages, though the tokens' gradients are not orthogonal), and by the RMS of the advantages (their scale). The
PRM's within-position step AUC against gold on the same samples is printed too. A setting whose cosine with the
oracle is near 0 gives the policy noise to follow, whatever its scale.

    python -m experiments.credit_alignment runs/smollm2-arith-position --round 0 --prompts 100
    python -m experiments.credit_alignment runs/smollm2-arith-position --round 1 --prm runs/other/round-001/reward_model/prm
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
from pathlib import Path

import torch

from pipeline.advantages import SCALES, extend_last_step, loss_tokens, outcome_advantages, process_advantages
from pipeline.credit import BASELINES, CREDITS
from pipeline.generation import load_sampling_model, sample
from pipeline.loading import config_from_dict
from pipeline.passthrough import grpo_config
from pipeline.grpo_trainer import completion_steps, scored_steps
from pipeline.problems import problem_set_from_config
from pipeline.prompts import renderer_from_config
from pipeline.reward_model import load_scorer
from pipeline.rm_metrics import within_position_auc
from pipeline.rundir import RunDir
from pipeline.scorers import GoldStepScorer


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()).clamp(min=1e-12))


def rms(a: torch.Tensor) -> float:
    return float(a.pow(2).mean().sqrt())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--round", type=int, default=0, help="the policy (and, unless --prm, the PRM) of this round")
    ap.add_argument("--prm", type=Path, action="append", help="PRM checkpoints instead of the round's (repeatable)")
    ap.add_argument("--prompts", type=int, default=100, help="held-out problems, one GRPO group each")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cfg = config_from_dict(json.loads((args.run_dir / "manifest.json").read_text())["config"])
    run = RunDir(args.run_dir)
    problem_set = problem_set_from_config(cfg)
    problems = problem_set.test[: args.prompts]
    with tempfile.TemporaryDirectory() as tmp:
        grpo = grpo_config(cfg, tmp)  # TRL's values where the config leaves them unset
    group, mask_truncated = grpo.num_generations, grpo.mask_truncated_completions

    model, tokenizer = load_sampling_model(str(run.policy(args.round)))
    prompts = [renderer_from_config(cfg, tokenizer).render(p) for p in problems]
    got = sample(model, tokenizer, prompts, group, temperature=grpo.temperature,
                 max_new_tokens=grpo.max_completion_length, batch_size=cfg.collect.batch_size, seed=args.seed)
    rows, row_prompts, outcomes = [], [], []
    for prompt, problem, ids_list, counts, texts in zip(prompts, problems, got.ids, got.num_tokens, got.texts):
        for ids, k, text in zip(ids_list, counts, texts):
            stopped = k > len(ids)
            ids = ids + [tokenizer.eos_token_id] * stopped  # TRL's completion keeps its eos
            # A truncated completion is out of the loss (and unscored) under grpo.mask_truncated_completions.
            rows.append(completion_steps(tokenizer, ids, len(ids) if stopped or not mask_truncated else 0))
            row_prompts.append(prompt)
            outcomes.append(float(problem_set.is_correct(text, problem)))
    lengths = [r.length for r in rows]
    width = max(lengths)

    gold = GoldStepScorer(problem_set, dict(zip(prompts, problems)))

    def steps(scorer) -> tuple[list[list[float]], list[list[int]]]:
        pairs = scored_steps(scorer, row_prompts, rows)  # as ProcessGRPOTrainer scores a batch
        return [s for s, _ in pairs], extend_last_step([e for _, e in pairs], lengths)

    gold_labels, ends = steps(gold)
    oracle = loss_tokens(process_advantages(gold_labels, ends, width, group), lengths)
    verifier = loss_tokens(outcome_advantages(torch.tensor(outcomes), group), lengths)

    print(f"{args.run_dir} round {args.round}: {len(problems)} groups of {group} at T={grpo.temperature}; "
          f"verifier accuracy {sum(outcomes) / len(outcomes):.3f}")
    print(f"{'scores':<8} {'baseline':<9} {'scale':<6} {'credit':<6} {'cos oracle':>10} {'cos verifier':>12} {'rms':>6}")
    paths = args.prm or [run.reward_model(args.round, "prm")]
    sources = {f"prm{i}": steps(load_scorer("prm", p, cfg.reward_model))[0] for i, p in enumerate(paths)}
    for (name, scores), path in zip(sources.items(), paths):
        print(f"{name} {path}: within-position step AUC against gold {within_position_auc(scores, gold_labels):.3f}")
    for name, scores in [*sources.items(), ("gold", gold_labels)]:
        for baseline, scale, credit in itertools.product(BASELINES, SCALES, CREDITS):
            a = loss_tokens(process_advantages(scores, ends, width, group, scale, credit, baseline), lengths)
            print(f"{name:<8} {baseline:<9} {scale:<6} {credit:<6} {cosine(a, oracle):>10.3f} "
                  f"{cosine(a, verifier):>12.3f} {rms(a):>6.3f}")
    print(f"{'verifier':<31} {cosine(verifier, oracle):>10.3f} {1.0:>12.3f} {rms(verifier):>6.3f}")


if __name__ == "__main__":
    main()
