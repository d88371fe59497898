"""Sampling throughput of `pipeline.generation.sample`: HF generate against vLLM on the same prompts.

Same policy checkpoint (the config's round-0 policy, cached), same prompts, same settings; prints
sequences/s and generated tokens/s per backend, and vLLM / HF. vLLM needs the `[vllm]` extra and a GPU.
Run: python -m bench.sampling --config configs/smollm2-gsm8k.yaml [--backends hf,vllm] [--prompts 64]
"""

from __future__ import annotations

import argparse
import time

from bench._common import bootstrapped_policy, quickstart
from pipeline.generation import load_sampling_model, sample
from pipeline.loading import load_config
from pipeline.problems import problem_set_from_config
from pipeline.prompts import renderer_from_config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", help="run config (default: configs/quickstart.yaml)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    ap.add_argument("--backends", default="hf,vllm")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=4)
    a = ap.parse_args()
    cfg = load_config(a.config, a.set) if a.config else quickstart(a.set)
    c = cfg.collect
    policy = bootstrapped_policy(cfg)
    problems = problem_set_from_config(cfg).train[: a.prompts]
    rates = {}
    for backend in a.backends.split(","):
        t0 = time.perf_counter()
        model, tok = load_sampling_model(str(policy), backend, dict(c.vllm_args) or {"gpu_memory_utilization": 0.5})
        load_s = time.perf_counter() - t0
        prompts = [renderer_from_config(cfg, tok).render(p) for p in problems]  # chat or plain, as the pipeline
        opts = dict(temperature=c.temperature, top_p=c.top_p, max_new_tokens=c.max_new_tokens, batch_size=c.batch_size)
        sample(model, tok, prompts[:4], 1, seed=1, **opts)  # warm-up (CUDA kernels, vLLM graphs)
        out = sample(model, tok, prompts, a.samples, seed=0, **opts)
        rates[backend] = (len(prompts) * a.samples / out.seconds, out.total_tokens / out.seconds)
        print(f"{backend:<5} load {load_s:6.1f} s   {rates[backend][0]:8.1f} seq/s   {rates[backend][1]:9.0f} tokens/s",
              flush=True)
        del model
    if "hf" in rates and "vllm" in rates:
        print(f"vLLM / HF: {rates['vllm'][0] / rates['hf'][0]:.2f}x seq/s, {rates['vllm'][1] / rates['hf'][1]:.2f}x tokens/s")
    print(f"{len(problems)} prompts x {a.samples} samples, up to {c.max_new_tokens} new tokens, batch {c.batch_size}")


if __name__ == "__main__":
    main()
