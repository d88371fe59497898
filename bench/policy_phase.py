"""Time a GRPO step: (a) bare TRL GRPOTrainer + verifier, (b) ours in outcome mode, (c) ours in process mode.

Same bootstrapped policy, same GRPOConfig, same prompts, and the config's `policy.lora` (if any) for all
three, as the policy phase trains. Each arm runs `--repeats` times, the arms interleaved (each repeat starts
with the next arm, so none always runs first on a drifting machine); a run's figure is its median step time
after `--warmup` steps. Prints each mode's ratio to bare TRL of the same repeat: the median over repeats and
its spread (min-max). Goals (issue 49): b/a <= 1.02, c/a <= 1.05.
  Run: python -m bench.policy_phase [--repeats 3 --steps 24]          # ~4 min on an idle 2-core machine
`--passk K` adds (d), ours in passk mode with k = K, and its ratio to outcome mode in the same repeat (issue 59:
d/b <= 1.02; passk only transforms the verifier's rewards):
  python -m bench.policy_phase --passk 4
The PRM runs as the policy phase runs it (`load_scorer`: in `reward_model.dtype`, a GRPO micro-batch a forward);
process mode under bf16 where the CPU has it (issue 58, point 4):
  python -m bench.policy_phase --set policy.dtype=auto --set reward_model.dtype=auto
Another config (a real model, on a GPU when there is one) and TRL's vLLM generation beside HF generate:
  python -m bench.policy_phase --config configs/smollm2-gsm8k.yaml --set grpo.max_completion_length=128 --vllm
The cost of checkpointing (resuming inside a phase): a whole GRPO phase of the config (its grpo.max_steps) in
process mode, without checkpoints and with them at the default save_steps, twice each, alternating; prints the
ratio (goal <= 1.05):
  python -m bench.policy_phase --checkpoint-cost              # the quickstart's phase: 100 steps, ~4 x 1-2 min
  python -m bench.policy_phase --checkpoint-cost --steps 4 --save-steps 2    # a smoke run
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time

import torch
from trl import GRPOTrainer

from bench._common import CACHE, StepTimes, bootstrapped_policy, quickstart, spread
from models import save_model
from models.factories import load_tokenizer
from pipeline.config import PasskConfig
from pipeline.dtypes import machine_dtype
from pipeline.loading import load_config
from pipeline.passthrough import grpo_config
from pipeline.grpo_trainer import ProcessGRPOTrainer
from pipeline.policy import build_reward_funcs, policy_peft_config, round_prompts, scoring_batch_size
from pipeline.problems import problem_set_from_config
from pipeline.prompts import renderer_from_config
from pipeline.reward_model import load_scorer
from pipeline.rewards import verifier_reward
from pipeline.rm_kinds.loading import reward_model_from_policy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int,
                    help="timed steps a run (default 24); with --checkpoint-cost the phase's steps")
    ap.add_argument("--warmup", type=int, default=2, help="steps a run takes before its timed ones")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each arm, interleaved (default 3)")
    ap.add_argument("--config", help="run config (default: configs/quickstart.yaml)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    ap.add_argument("--passk", type=int, metavar="K", help="also ours in passk mode with supervision.passk.k=K")
    ap.add_argument("--vllm", action="store_true", help="also bare TRL with grpo.use_vllm (colocate); needs vllm")
    ap.add_argument("--checkpoint-cost", action="store_true",
                    help="time a whole phase with and without checkpoints (--steps: default the config's max_steps)")
    ap.add_argument("--save-steps", type=int, help="with --checkpoint-cost: save_steps (default: the pipeline's)")
    a = ap.parse_args()
    cfg = load_config(a.config, a.set) if a.config else quickstart(a.set)
    ps = problem_set_from_config(cfg)
    policy = bootstrapped_policy(cfg)
    prm_path = CACHE / f"prm-untrained-{policy.name}"
    if not (prm_path / "igrpo.json").exists():
        save_model(*reward_model_from_policy(str(policy), "prm"), prm_path)
    tok = load_tokenizer(str(policy))
    data = round_prompts(ps, 10_000, cfg.run.seed, 1, renderer=renderer_from_config(cfg, tok))
    a.steps = a.steps if a.steps or a.checkpoint_cost else 24
    args = grpo_config(cfg, str(CACHE / "scratch"), max_steps=(a.steps or 0) + a.warmup, logging_steps=1000)
    peft = policy_peft_config(cfg)  # the policy phase's adapter, for bare TRL too

    def run(kind: str, args=args, resumable: bool = False) -> float:
        timer = StepTimes()
        if kind in ("bare", "bare-vllm"):
            run_args = args
            if kind == "bare-vllm":
                run_args = grpo_config(cfg, str(CACHE / "scratch"), max_steps=a.steps + a.warmup, logging_steps=1000,
                                       use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3)
            trainer = GRPOTrainer(model=str(policy), reward_funcs=[verifier_reward(ps)], args=run_args,
                                  train_dataset=data, processing_class=tok, callbacks=[timer], peft_config=peft)
        else:
            mode = kind if kind in ("outcome", "passk") else "process"
            supervision = cfg.supervision.model_copy(update={"mode": mode})
            if mode == "passk":
                supervision = supervision.model_copy(update={"passk": PasskConfig(k=a.passk)})
                mode = supervision
            funcs, _ = build_reward_funcs(cfg.model_copy(update={"supervision": supervision}), ps, {})
            prm = None
            if kind == "process":  # as the policy phase loads it: reward_model.dtype, a GRPO batch a forward
                batch = scoring_batch_size(cfg.collect.batch_size, args.per_device_train_batch_size)
                prm = load_scorer("prm", prm_path, cfg.reward_model, batch_size=batch)
                prm.model.to(args.device)  # beside the policy (a GPU when there is one)
            trainer = ProcessGRPOTrainer(model=str(policy), reward_funcs=funcs, args=args, train_dataset=data,
                                         processing_class=tok, callbacks=[timer], prm_scorer=prm, supervision=mode,
                                         peft_config=peft)
        start = time.perf_counter()
        if resumable:  # as the phase trains: checkpoints in a fresh scratch folder, removed at the end
            from pipeline.resume import train_resumable

            train_resumable(trainer, f"bench-{time.time_ns()}")
        else:
            trainer.train()
        timer.total = time.perf_counter() - start
        return timer if a.checkpoint_cost else statistics.median(timer.seconds[a.warmup:])

    if a.checkpoint_cost:
        return checkpoint_cost(cfg, a, run)
    arms = ["bare", "outcome", "process"] + ["passk"] * bool(a.passk) + ["bare-vllm"] * a.vllm
    times = {kind: [] for kind in arms}
    for r in range(a.repeats):
        for kind in arms[r % len(arms):] + arms[: r % len(arms)]:  # each repeat starts with the next arm
            times[kind].append(run(kind))
            print(f"repeat {r + 1}  {kind:<9} median step {times[kind][-1] * 1000:8.1f} ms", flush=True)
    report(times, a, args, cfg)


def report(times: dict[str, list[float]], a, args, cfg) -> None:
    """Each arm's median step time and each mode's ratio to bare TRL, repeat by repeat: median (min-max)."""
    print(f"\nbatch: {args.per_device_train_batch_size} completions/step; {a.repeats} runs of each arm, interleaved, "
          f"each {a.steps} timed steps after {a.warmup} warm-up; ratios to bare TRL in the same repeat")
    print(f"(a) bare TRL GRPOTrainer + verifier : {statistics.median(times['bare']) * 1000:8.1f} ms/step (median)")
    rows = [("(b) ours, outcome mode              ", "outcome", "b/a", "<= 1.02"),
            ("(c) ours, process mode (PRM)        ", "process", "c/a", "<= 1.05")]
    for label, kind, name, goal in rows:
        ratios = [t / b for t, b in zip(times[kind], times["bare"])]
        step = statistics.median(times[kind]) * 1000
        print(f"{label}: {step:8.1f} ms/step   {name} = {spread(ratios)}  (goal {goal})")
    if a.passk:
        ratios = [t / b for t, b in zip(times["passk"], times["outcome"])]
        print(f"(d) ours, passk mode (k = {a.passk})       : {statistics.median(times['passk']) * 1000:8.1f} ms/step   "
              f"d/b = {spread(ratios)}  (goal <= 1.02: to outcome mode)")
    if a.vllm:
        ratios = [b / v for b, v in zip(times["bare"], times["bare-vllm"])]
        print(f"(d) bare TRL, vLLM colocate         : {statistics.median(times['bare-vllm']) * 1000:8.1f} ms/step   "
              f"a/d = {spread(ratios)}  (HF generate / vLLM)")
    lo = cfg.policy.lora
    print(f"dtypes: policy {cfg.policy.dtype} -> {machine_dtype(cfg.policy.dtype)}, reward_model "
          f"{cfg.reward_model.dtype} -> {machine_dtype(cfg.reward_model.dtype)}")
    print(f"device: {args.device}, model: {cfg.policy.model}, completions up to {args.max_completion_length} tokens, "
          f"LoRA: {f'r={lo.r} on {lo.target_modules}' if lo else 'none'}, torch threads: {torch.get_num_threads()}")


def checkpoint_cost(cfg, a, run) -> None:
    """A whole GRPO phase (process mode) without checkpoints and with them (`train_resumable`, the default
    save_steps), alternating off/on twice: the ratio of the mean wall times."""
    from pipeline.passthrough import SAVE_STEPS

    steps = a.steps or cfg.grpo.get("max_steps", 100)
    save_steps = a.save_steps or SAVE_STEPS
    times = {"off": [], "on": []}
    for kind in ("off", "on", "off", "on"):
        scratch = CACHE / f"scratch-checkpoints-{kind}"
        shutil.rmtree(scratch, ignore_errors=True)
        extra = {"save_strategy": "no"} if kind == "off" else {"save_steps": save_steps}
        args = grpo_config(cfg, str(scratch), max_steps=steps, logging_steps=1000, **extra)
        timer = run("process", args, resumable=kind == "on")
        times[kind].append(timer.total)
        print(f"checkpoints {kind:<3} phase {timer.total:7.1f} s ({steps} steps)", flush=True)
    off, on = statistics.mean(times["off"]), statistics.mean(times["on"])
    print(f"\ncheckpointing's cost: {on:.1f} s / {off:.1f} s = {on / off:.3f} (goal <= 1.05) at save_steps {save_steps}"
          f", {steps} steps, {(steps - 1) // save_steps} checkpoints (none at the last step); torch threads: "
          f"{torch.get_num_threads()}")


if __name__ == "__main__":
    main()
