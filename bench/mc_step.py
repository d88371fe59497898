"""The online Monte-Carlo arm's cost (issue 47, point 5): a GRPO step with MC step values against the verifier's.

Both arms are `ProcessGRPOTrainer` on the quickstart's SFT policy, GRPOConfig and prompts: (v) outcome mode, the
verifier's advantage; (m) hybrid mode with progress credit (step) on online MC values, `reward_model.oracle: mc`,
K = `--k` rollouts from each unsettled step prefix of every completion. Each arm runs `--repeats` times, interleaved
(each repeat starts with the other arm); a run's figure is its median step time after `--warmup` steps. Prints m/v
of the same repeat, the median over repeats (min-max): the factor by which the MC arm's step costs more, so the steps
the verifier arm takes in the MC arm's wall-clock. Then the MC valuation's own cost per GRPO completion
(`process/mc_seconds`, `process/mc_tokens`) beside the collection's labelling cost per sample on the same policy
(its sampling settings, K rollouts, exhaustive and the config's strategy), the labelling a learned PRM pays for.
  Run: OMP_NUM_THREADS=1 python -m bench.mc_step [--repeats 3 --steps 6 --k 4]   # 1.5-3 min on 2 shared cores
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import TrainerCallback

from bench._common import CACHE, StepTimes, bootstrapped_policy, quickstart, spread
from models import load_policy
from models.factories import load_tokenizer
from pipeline.mc_labels import label_exhaustive, label_first_error, make_request
from pipeline.config import SupervisionConfig
from pipeline.generation import sample
from pipeline.online_mc import McStepScorer
from pipeline.passthrough import grpo_config
from pipeline.grpo_trainer import ProcessGRPOTrainer
from pipeline.policy import build_reward_funcs, policy_peft_config, round_prompts
from pipeline.problems import problem_set_from_config
from pipeline.prompts import renderer_from_config

PROGRESS = {"mode": "hybrid", "process_reward": "progress", "process_credit": "step"}


class McCost(TrainerCallback):
    """The MC valuation's seconds and tokens of each logged step."""

    def __init__(self):
        self.seconds, self.tokens = [], []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "process/mc_seconds" in logs:
            self.seconds.append(logs["process/mc_seconds"])
            self.tokens.append(logs["process/mc_tokens"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6, help="timed steps a run (default 6)")
    ap.add_argument("--warmup", type=int, default=1, help="steps a run takes before its timed ones")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each arm, interleaved (default 3)")
    ap.add_argument("--k", type=int, default=4, help="MC rollouts a step prefix (reward_model.mc_rollouts)")
    ap.add_argument("--collect-prompts", type=int, default=16, help="prompts of the collection's labelling figure")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    a = ap.parse_args()
    cfg = quickstart(a.set)
    ps, policy = problem_set_from_config(cfg), bootstrapped_policy(cfg)
    tok = load_tokenizer(str(policy))
    data = round_prompts(ps, 10_000, cfg.run.seed, 1, renderer=renderer_from_config(cfg, tok))
    args = grpo_config(cfg, str(CACHE / "scratch-mc"), max_steps=a.steps + a.warmup, logging_steps=1)

    def run(arm: str) -> tuple[float, McCost]:
        timer, cost = StepTimes(), McCost()
        mode = "outcome" if arm == "verifier" else "hybrid"
        funcs, _ = build_reward_funcs(cfg.model_copy(update={"supervision": SupervisionConfig(mode=mode)}), ps, {})
        mc = McStepScorer.from_rows(ps, data, tok, a.k, cfg.collect.batch_size) if arm == "mc" else None
        trainer = ProcessGRPOTrainer(
            model=str(policy), reward_funcs=funcs, args=args, train_dataset=data, processing_class=tok,
            callbacks=[timer, cost], prm_scorer=mc, peft_config=policy_peft_config(cfg),
            supervision=SupervisionConfig(**PROGRESS) if arm == "mc" else mode)
        trainer.train()
        return statistics.median(timer.seconds[a.warmup:]), cost

    times, costs = {"verifier": [], "mc": []}, []
    for r in range(a.repeats):
        for arm in ("verifier", "mc") if r % 2 == 0 else ("mc", "verifier"):
            step, cost = run(arm)
            times[arm].append(step)
            if arm == "mc":
                costs.append(cost)
            print(f"repeat {r + 1}  {arm:<8} median step {step * 1000:8.1f} ms", flush=True)
    per_step = args.per_device_train_batch_size
    print(f"\n{per_step} completions a step, K = {a.k}; {a.repeats} runs of each arm, interleaved, each {a.steps} "
          f"timed steps after {a.warmup} warm-up; torch threads {torch.get_num_threads()}")
    print(f"(v) verifier (outcome mode)      : {statistics.median(times['verifier']) * 1000:8.1f} ms/step (median)")
    print(f"(m) online MC, hybrid + progress : {statistics.median(times['mc']) * 1000:8.1f} ms/step (median)   "
          f"m/v = {spread([m / v for m, v in zip(times['mc'], times['verifier'])])}")
    seconds = [s for c in costs for s in c.seconds[a.warmup:]]
    tokens = [t for c in costs for t in c.tokens[a.warmup:]]
    print(f"MC valuation a step: {statistics.median(seconds):.3f} s ({min(seconds):.3f}-{max(seconds):.3f}), "
          f"{statistics.median(tokens):.0f} tokens ({min(tokens):.0f}-{max(tokens):.0f}); per completion "
          f"{statistics.median(seconds) / per_step * 1000:.1f} ms, {statistics.median(tokens) / per_step:.1f} tokens")
    labelling_cost(cfg, ps, policy, a)


def labelling_cost(cfg, ps, policy, a) -> None:
    """The collection's MC labelling per sample on the same policy: its sampling settings, K rollouts, exhaustive
    (every unsettled prefix, as the MC arm values) and first-error; one run each after a warm-up call."""
    model, tok = load_policy(str(policy))
    c = cfg.collect
    opts = dict(temperature=c.temperature, top_p=c.top_p, max_new_tokens=c.max_new_tokens, batch_size=c.batch_size)
    problems = ps.train[: a.collect_prompts]
    fresh = sample(model, tok, [p.prompt for p in problems], c.samples_per_prompt, seed=0, **opts)
    reqs = [make_request(ps, p, tok, ids) for p, row in zip(problems, fresh.ids) for ids in row]
    sample(model, tok, [r.continuations[0] for r in reqs if r.continuations][: c.batch_size], 1, seed=0, **opts)
    for name, label in (("exhaustive", label_exhaustive), ("first_error", label_first_error)):
        made = []

        def completer(prefixes, n):
            made.append(sample(model, tok, prefixes, n, seed=len(made) + 1, **opts))
            return made[-1].texts

        start = time.perf_counter()
        label(ps, completer, reqs, a.k)
        seconds, tokens = time.perf_counter() - start, sum(m.total_tokens for m in made)
        print(f"collection labelling, {name:<11}: {seconds / len(reqs) * 1000:.1f} ms, {tokens / len(reqs):.1f} tokens "
              f"per sample ({len(reqs)} samples, {seconds:.2f} s)")


if __name__ == "__main__":
    main()
