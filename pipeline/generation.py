"""Batched sampling shared by collection and evaluation: HF generate, or vLLM with the `[vllm]` extra.

Randomness depends only on the seed and the job, never on which process runs it: the (prompt, sample)
jobs are sorted by prompt length (similar lengths share a batch and pad little) and cut into batches of
`batch_size`, and batch `b` is generated under its own seed `batch_seed(seed, b)`. A run split into
shards of whole batches (`pipeline/fanout.py`) therefore gives the same texts as one process. vLLM
seeds each job instead (its scheduler forms its own batches). Left padding, so every row continues
right after its own prompt.

A prompt is a text, or a `Continuation`: token ids to go on from (a prompt's ids, then the start of a
completion in the policy's own tokens), which is how MC rollouts continue a sampled completion from a
step's end without re-tokenizing its text.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import BatchEncoding, PreTrainedModel, PreTrainedTokenizerBase

from pipeline.sampling_backends import BACKENDS

Job = tuple[int, int]  # (prompt index, sample index)
Batch = tuple[int, list[Job]]  # (global batch index, its jobs)
# One (job, text, num_tokens, completion ids) per generated sequence.
Generated = list[tuple[Job, str, int, list[int]]]


@dataclass(frozen=True)
class Continuation:
    """Generate on from token ids: the prompt's (`prompt_ids`), then the completion's first tokens.

    The sample returned for it is the whole completion: `completion_ids` and the new tokens, decoded as one.
    """

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]


Prompt = str | Continuation


def prompt_ids(tokenizer: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """The ids a text prompt is generated from (HF generate; vLLM tokenizes alike), the tokenizer's specials included."""
    return tokenizer(prompt)["input_ids"]


def _input_ids(tokenizer, prompt: Prompt) -> list[int]:
    if isinstance(prompt, Continuation):
        return [*prompt.prompt_ids, *prompt.completion_ids]
    return prompt_ids(tokenizer, prompt)


def _size(prompt: Prompt) -> int:
    # Characters of a text, tokens of a continuation: what a batch pads to, in the unit at hand.
    return len(prompt) if isinstance(prompt, str) else len(prompt.prompt_ids) + len(prompt.completion_ids)


# Threads sharing a process share torch's global RNG: seeding and sampling a batch must not interleave.
_RNG_LOCK = threading.Lock()


@dataclass
class Samples:
    """`texts[i][j]`: the j-th completion of prompt i (special tokens dropped); `num_tokens` (generated, eos
    included) and `ids` (the completion's token ids, eos excluded; a continuation's own first) likewise."""

    texts: list[list[str]]
    num_tokens: list[list[int]]
    seconds: float
    ids: list[list[list[int]]] = field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return sum(map(sum, self.num_tokens))


def plan_batches(prompts: Sequence[Prompt], n: int, batch_size: int) -> list[Batch]:
    """All `n` jobs of every prompt, longest prompts first (stable), cut into numbered batches.

    >>> plan_batches(["a", "bbb", "cc"], 2, 4)
    [(0, [(1, 0), (1, 1), (2, 0), (2, 1)]), (1, [(0, 0), (0, 1)])]
    """
    jobs = sorted(((i, j) for i in range(len(prompts)) for j in range(n)), key=lambda ij: -_size(prompts[ij[0]]))
    return [(b, jobs[s : s + batch_size]) for b, s in enumerate(range(0, len(jobs), batch_size))]


def batch_seed(seed: int, index: int) -> int:
    """The seed of batch (or vLLM job) `index` of a call seeded `seed`: distinct for distinct pairs.

    >>> batch_seed(0, 3), batch_seed(1, 0)
    (3, 1000003)
    """
    return (seed * 1_000_003 + index) % 2**63


def is_vllm(model) -> bool:
    return type(model).__module__.startswith("vllm")


def load_sampling_model(path: str, backend: str = "hf", vllm_args: Mapping[str, Any] | None = None,
                        dtype: str = "float32"):
    """(model, tokenizer) for `sample`, loaded by `backend`'s entry (`pipeline.sampling_backends.BACKENDS`): an HF
    causal LM, or a `vllm.LLM` on the checkpoint directory, with its weights in `dtype` (`policy.dtype`, resolved:
    `pipeline.dtypes`; a `dtype` in `vllm_args` wins for vLLM).

    `vllm_args` go to `vllm.LLM` (e.g. `gpu_memory_utilization`: vLLM reserves 0.9 of the GPU by default,
    which leaves no room for a reward model scored in the same process afterwards).
    """
    return BACKENDS[backend].load(str(path), dict(vllm_args or {}), dtype)


def sample(
    model,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Prompt],
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

    `model` is an HF causal LM or a `vllm.LLM` (see `load_sampling_model`). Generation stops at a stop token
    (`stop_ids`: the tokenizer's eos and the model's end-of-turn ids, as TRL's GRPO) or after `max_new_tokens`;
    `num_tokens` counts the generated tokens up to and including the stop.
    Seeded: the same call gives the same texts, in one process or sharded (`generate_batches`).
    """
    start = time.perf_counter()
    batches = plan_batches(prompts, n, batch_size)
    opts = dict(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, greedy=greedy, seed=seed)
    generated = generate_batches(model, tokenizer, prompts, batches, desc=desc, **opts)
    return assemble(len(prompts), n, generated, time.perf_counter() - start)


def assemble(num_prompts: int, n: int, generated: Generated, seconds: float) -> Samples:
    """Samples in the caller's order from (job, text, num_tokens, ids) rows of any order."""
    texts = [[""] * n for _ in range(num_prompts)]
    counts = [[0] * n for _ in range(num_prompts)]
    ids: list[list[list[int]]] = [[[] for _ in range(n)] for _ in range(num_prompts)]
    for (i, j), text, k, row_ids in generated:
        texts[i][j], counts[i][j], ids[i][j] = text, k, row_ids
    return Samples(texts, counts, seconds, ids)


def generate_batches(
    model,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Mapping[int, Prompt] | Sequence[Prompt],
    batches: list[Batch],
    *,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    greedy: bool,
    seed: int,
    desc: str | None = None,
) -> Generated:
    """Generate the given batches of a plan (all of it, or one shard); `prompts[i]` for each job's prompt i."""
    if is_vllm(model):
        jobs = [job for _, js in batches for job in js]
        return _generate_vllm(model, tokenizer, prompts, jobs, temperature, top_p, max_new_tokens, greedy, seed)
    return _generate_hf(model, tokenizer, prompts, batches, temperature, top_p, max_new_tokens, greedy, seed, desc)


@torch.inference_mode()
def _generate_hf(
    model: PreTrainedModel, tokenizer, prompts, batches, temperature, top_p, max_new_tokens, greedy, seed, desc
) -> Generated:
    start = time.perf_counter()
    out_rows: Generated = []
    was_training = model.training
    model.eval()
    stops = stop_ids(model.generation_config.eos_token_id, tokenizer.eos_token_id)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    is_stop = torch.tensor(stops, device=model.device)
    total = sum(len(js) for _, js in batches)
    bar = tqdm(total=total, desc=desc or "sampling", unit="seq", disable=desc is None, leave=False)
    for b, batch in batches:
        enc = _left_padded([_input_ids(tokenizer, prompts[i]) for i, _ in batch], pad).to(model.device)
        # The fork too under the lock: another thread restoring its forked state must not land between
        # this seed and this generate.
        with _RNG_LOCK, torch.random.fork_rng(devices=[]):
            torch.manual_seed(batch_seed(seed, b))
            out = model.generate(
                **enc,
                do_sample=not greedy,
                temperature=temperature if not greedy else None,
                top_p=top_p if not greedy else None,
                top_k=None,
                max_new_tokens=max_new_tokens,
                eos_token_id=stops,
                pad_token_id=pad,
            )
        new = out[:, enc["input_ids"].shape[1] :]  # (b, T_new)
        is_eos = torch.isin(new, is_stop)
        # Tokens up to and including the first stop; rows that never stop count every token.
        first_eos = torch.where(is_eos.any(1), is_eos.float().argmax(1) + 1, new.shape[1])
        for job, row, k in zip(batch, new.tolist(), first_eos.tolist()):
            out_rows.append(_finished(tokenizer, prompts[job[0]], job, row[: k - (row[k - 1] in stops)], k))
        bar.update(len(batch))
        bar.set_postfix(seq_per_s=f"{bar.n / max(time.perf_counter() - start, 1e-9):.1f}")
    bar.close()
    model.train(was_training)
    return out_rows


def stop_ids(generation_eos: int | list[int] | None, tokenizer_eos: int | None) -> list[int]:
    """The ids generation stops on, as TRL's GRPOTrainer stops: the tokenizer's eos, then every id of the model's
    `generation_config.eos_token_id` (a chat model's end of turn: Llama-3's `<|eot_id|>`, Gemma's `<end_of_turn>`).

    >>> stop_ids([128001, 128009], 128001), stop_ids(None, 2), stop_ids(7, 2)
    ([128001, 128009], [2], [2, 7])
    """
    ids = [] if generation_eos is None else [generation_eos] if isinstance(generation_eos, int) else list(generation_eos)
    if tokenizer_eos is not None and tokenizer_eos not in ids:
        ids = [tokenizer_eos, *ids]
    if not ids:
        raise ValueError("the policy has no eos token: neither its tokenizer nor its generation_config names one")
    return ids


def _left_padded(rows: list[list[int]], pad: int) -> BatchEncoding:
    """input_ids and attention_mask (b, T) of id rows padded on the left, as `tokenizer(..., padding_side="left")`."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)  # (b, T)
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # (b, T)
    for r, row in enumerate(rows):
        if row:
            ids[r, width - len(row) :] = torch.tensor(row)
            mask[r, width - len(row) :] = 1
    return BatchEncoding({"input_ids": ids, "attention_mask": mask})


def _finished(tokenizer, prompt: Prompt, job: Job, new_ids: list[int], num_tokens: int):
    """One Generated row: a continuation's text is its completion ids and the new ones decoded together."""
    ids = [*prompt.completion_ids, *new_ids] if isinstance(prompt, Continuation) else list(new_ids)
    return job, tokenizer.decode(ids, skip_special_tokens=True), int(num_tokens), ids


def _generate_vllm(
    llm, tokenizer, prompts, jobs: list[Job], temperature, top_p, max_new_tokens, greedy, seed
) -> Generated:
    """One vLLM request per job, each with its own seed (vLLM batches and schedules them itself).

    Not run in this project's CI (no GPU, no vLLM): written against vLLM's `LLM.generate(prompts,
    sampling_params=[SamplingParams, ...])`, one `RequestOutput` per prompt in order; a `Continuation`
    goes as a `{"prompt_token_ids": ...}` prompt.
    """
    from vllm import SamplingParams

    params = [
        SamplingParams(
            n=1,
            temperature=0.0 if greedy else temperature,
            top_p=1.0 if greedy else top_p,
            max_tokens=max_new_tokens,
            seed=batch_seed(seed, i * 1_000_003 + j),  # the job's identity, not its place in a shard
        )
        for i, j in jobs
    ]
    inputs = [
        {"prompt_token_ids": _input_ids(tokenizer, p)} if isinstance(p := prompts[i], Continuation) else p
        for i, _ in jobs
    ]
    outputs = llm.generate(inputs, params, use_tqdm=False)
    special = set(tokenizer.all_special_ids)
    rows = []
    for (i, j), o in zip(jobs, outputs):
        # vLLM stops on the generation config's eos ids too, and its token_ids keep the one it stopped on,
        # like `num_tokens` here; the ids drop it, as the HF path does.
        new = list(o.outputs[0].token_ids)
        stopped = o.outputs[0].finish_reason == "stop" and new and new[-1] in special
        rows.append(_finished(tokenizer, prompts[i], (i, j), new[:-1] if stopped else new, len(new)))
    return rows
