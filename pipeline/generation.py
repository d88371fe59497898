"""Batched sampling shared by collection and evaluation (HF generate; vLLM when asked for and installed).

Prompts are sorted by length before batching so each batch pads little, then results go back in the
caller's order. Left padding, so every row continues right after its own prompt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class Samples:
    """`texts[i][j]`: the j-th completion of prompt i (special tokens dropped); `num_tokens` likewise."""

    texts: list[list[str]]
    num_tokens: list[list[int]]
    seconds: float

    @property
    def total_tokens(self) -> int:
        return sum(map(sum, self.num_tokens))


@torch.inference_mode()
def sample(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    n: int = 1,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 64,
    batch_size: int = 64,
    greedy: bool = False,
    seed: int = 0,
    desc: str | None = None,
) -> Samples:
    """Sample `n` completions for every prompt, `batch_size` sequences per `generate` call.

    Generation stops at the eos token or after `max_new_tokens`; `num_tokens` counts the generated
    tokens up to and including eos. Seeded: the same call gives the same texts.
    """
    start = time.perf_counter()
    jobs = [(i, j) for i in range(len(prompts)) for j in range(n)]
    # Longest prompts first: similar lengths share a batch, and the slowest batch shows up early.
    jobs.sort(key=lambda ij: -len(prompts[ij[0]]))
    texts = [[""] * n for _ in prompts]
    counts = [[0] * n for _ in prompts]
    was_training = model.training
    model.eval()
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    bar = tqdm(total=len(jobs), desc=desc or "sampling", unit="seq", disable=desc is None, leave=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for b in range(0, len(jobs), batch_size):
            batch = jobs[b : b + batch_size]
            enc = tokenizer(
                [prompts[i] for i, _ in batch], return_tensors="pt", padding=True, padding_side="left"
            ).to(model.device)
            out = model.generate(
                **enc,
                do_sample=not greedy,
                temperature=temperature if not greedy else None,
                top_p=top_p if not greedy else None,
                top_k=None if not greedy else None,
                max_new_tokens=max_new_tokens,
                eos_token_id=eos,
                pad_token_id=pad,
            )
            new = out[:, enc["input_ids"].shape[1] :]  # (b, T_new)
            is_eos = new == eos
            # Tokens up to and including the first eos; rows that never stop count every token.
            first_eos = torch.where(is_eos.any(1), is_eos.float().argmax(1) + 1, new.shape[1])
            decoded = tokenizer.batch_decode(new, skip_special_tokens=True)
            for (i, j), text, k in zip(batch, decoded, first_eos.tolist()):
                texts[i][j], counts[i][j] = text, int(k)
            bar.update(len(batch))
            bar.set_postfix(seq_per_s=f"{bar.n / max(time.perf_counter() - start, 1e-9):.1f}")
    bar.close()
    model.train(was_training)
    return Samples(texts, counts, time.perf_counter() - start)
