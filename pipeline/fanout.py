"""Sampling spread over workers through a Prefect task runner: threads, or Ray with the `[ray]` extra.

The one module of `pipeline/` that imports Prefect (lazily, and only when `workers > 1`): a shard of
sampling work is a Prefect task, so a Ray cluster (or a thread pool) runs it and Prefect records it.
A call's batch plan (`generation.plan_batches`) is cut into `workers` contiguous runs of whole batches;
each batch keeps its global index, hence its seed, so the merged result equals one process's for the
same seed. Each worker loads the policy from its path once and keeps it for the later calls.

Threads share torch's RNG, so their generate calls take turns (`generation._RNG_LOCK`): the thread
runner is for tests and for I/O-bound engines; Ray runs one process per worker, each with its own GPU
when `gpus_per_worker` is 1. Ray spreads the shards over the cluster's nodes, and retries a shard whose node
dies on the nodes left (Ray's task retries on a worker's or a node's death): a shard is a pure function of
its batches and seeds, so the retried one is the same.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from pipeline.collect_choices import TASK_RUNNERS
from pipeline.config import CollectConfig, SamplingConfig
from pipeline.dtypes import machine_dtype
from pipeline.generation import Batch, Samples, assemble, generate_batches, load_sampling_model, plan_batches, sample
from pipeline.registry import load_plugins

# sampler(prompts, n, seed=..., desc=...) -> Samples: what the collection phase generates with.
Sampler = Callable[..., Samples]

_LOAD_LOCK = threading.Lock()


def split_batches(batches: list[Batch], workers: int) -> list[list[Batch]]:
    """`workers` contiguous runs of whole batches, sizes differing by at most one (empty runs dropped).

    >>> [[b for b, _ in run] for run in split_batches([(b, []) for b in range(5)], 2)]
    [[0, 1, 2], [3, 4]]
    """
    q, r = divmod(len(batches), workers)
    runs, start = [], 0
    for w in range(workers):
        end = start + q + (w < r)
        runs.append(batches[start:end])
        start = end
    return [run for run in runs if run]


@functools.lru_cache(maxsize=1)
def _cached_model(path: str, backend: str, vllm_args: str, stamp: int, dtype: str):
    return load_sampling_model(path, backend, json.loads(vllm_args), dtype)


def _worker_model(path: str, backend: str, vllm_args: str, stamp: int, dtype: str = "float32"):
    # One model per worker process (Ray reuses its workers across tasks; threads share this one); the
    # checkpoint's mtime in the key, so a checkpoint rewritten in place is loaded again. One load at a
    # time: transformers patches torch globals while it builds a model, and two threads loading at once
    # leave broken weights (NaN probabilities) behind.
    with _LOAD_LOCK:
        return _cached_model(path, backend, vllm_args, stamp, dtype)


def generate_shard(
    path: str, stamp: int, backend: str, vllm_args: dict[str, Any], prompts: dict[int, str], batches: list[Batch],
    opts: dict[str, Any], dtype: str = "float32",
):
    """Generate one shard of a batch plan with the policy at `path` in `dtype` (the body of the Prefect task)."""
    load_plugins()  # a Ray worker is a process of its own
    model, tokenizer = _worker_model(path, backend, json.dumps(vllm_args, sort_keys=True), stamp, dtype)
    return generate_batches(model, tokenizer, prompts, batches, **opts)


@contextlib.contextmanager
def open_sampler(path: str, c: SamplingConfig, fanout: CollectConfig | None = None,
                 dtype: str = "float32") -> Iterator[Sampler]:
    """A sampler over the policy at `path` with `c`'s settings: in this process, or over `fanout.workers` workers.

    Args:
        c: how to sample (temperature, lengths, batch size, engine): collection's or evaluation's section.
        fanout: where (workers, task runner, Ray): collection's section, which evaluation shares; None: `c`.
        dtype: the policy's weights' dtype (`policy.dtype`), resolved here: every worker, on any node, loads in it.

    The task runner (a Ray cluster, a thread pool) lives as long as the `with` block, so the phase's
    sampling and MC rollout calls share it and its loaded models.
    """
    f, dtype = fanout or c, machine_dtype(dtype)  # resolved on the driver's machine, for every worker
    opts = dict(temperature=c.temperature, top_p=c.top_p, max_new_tokens=c.max_new_tokens)
    if f.workers == 1:
        model, tokenizer = load_sampling_model(path, c.backend, c.vllm_args, dtype)
        yield functools.partial(sample, model, tokenizer, batch_size=c.batch_size, **opts)
        return

    from prefect import task
    from prefect.cache_policies import NO_CACHE

    shard_task = task(generate_shard, name="sample-shard", cache_policy=NO_CACHE, persist_result=False)
    # Named absolutely: a worker (a Ray task on another node, or started in Ray's session folder) has its own cwd.
    path = os.path.abspath(path)
    stamp = os.stat(path).st_mtime_ns
    with TASK_RUNNERS[f.task_runner].runner(f) as runner:

        def sharded(prompts: list[str], n: int, *, seed: int, greedy: bool = False, desc: str | None = None) -> Samples:
            start = time.perf_counter()
            runs = split_batches(plan_batches(prompts, n, c.batch_size), f.workers)
            futures = []
            for run in runs:
                needed = {i: prompts[i] for _, jobs in run for i, _ in jobs}
                params = dict(path=str(path), stamp=stamp, backend=c.backend, vllm_args=c.vllm_args, prompts=needed,
                              batches=run, opts=dict(opts, greedy=greedy, seed=seed), dtype=dtype)
                futures.append(_submit(runner, shard_task, params, f))
            generated = [row for future in futures for row in future.result()]
            return assemble(len(prompts), n, generated, time.perf_counter() - start)

        try:
            yield sharded
        finally:
            _cached_model.cache_clear()  # the thread runner's models live in this process


def _submit(runner, shard_task, params: dict[str, Any], c: CollectConfig):
    submit = TASK_RUNNERS[c.task_runner].submit
    return submit(runner, shard_task, params, c) if submit else runner.submit(shard_task, params)
