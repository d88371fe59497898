"""Sharded sampling and collection: the same texts and the same shard whatever the number of workers.

Batch b of a call is generated under seed `batch_seed(seed, b)` over a batch plan of the whole call, so
generating the plan's batches in any grouping, in threads or in Ray worker processes, gives what one
process gives.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from pipeline.fanout import split_batches
from pipeline.generation import assemble, batch_seed, generate_batches, plan_batches, sample
from pipeline.loading import config_from_dict
from pipeline.replay import read_shard
from tests.helpers import child_env, mini_config, plugin_distribution

# --- the batch plan -------------------------------------------------------------------------------------


def test_plan_covers_every_job_once_longest_prompts_first():
    prompts = ["aa", "a", "aaaa", "aaa"]
    batches = plan_batches(prompts, 3, 5)
    jobs = [job for _, js in batches for job in js]
    assert sorted(jobs) == [(i, j) for i in range(4) for j in range(3)]
    # Prompt 2 (4 chars) first, then 3, 0, 1; a prompt's samples stay in order: (2,0), (2,1), (2,2), (3,0), ...
    assert [i for i, _ in jobs] == [2] * 3 + [3] * 3 + [0] * 3 + [1] * 3
    assert [b for b, _ in batches] == [0, 1, 2] and [len(js) for _, js in batches] == [5, 5, 2]


def test_split_batches_is_contiguous_and_balanced():
    batches = [(b, []) for b in range(7)]
    runs = split_batches(batches, 3)
    assert [[b for b, _ in run] for run in runs] == [[0, 1, 2], [3, 4], [5, 6]]
    # More workers than batches: no empty shard.
    assert len(split_batches(batches[:2], 4)) == 2


def test_batch_seeds_are_distinct():
    seeds = {batch_seed(s, b) for s in range(50) for b in range(500)}
    assert len(seeds) == 50 * 500


def test_sharded_generation_equals_one_call(tiny_policy_dir):
    from models import load_policy

    model, tok = load_policy(str(tiny_policy_dir))
    prompts = ["1+2=", "10*3-4=", "7", "5+5+5+5=", "2*2="]
    opts = dict(temperature=1.0, top_p=0.9, max_new_tokens=12, greedy=False, seed=5)
    whole = sample(model, tok, prompts, 3, batch_size=4, **{k: v for k, v in opts.items() if k != "greedy"})
    # The same plan generated shard by shard, the shards in reverse order, each with only its prompts.
    rows = []
    for run in reversed(split_batches(plan_batches(prompts, 3, 4), 3)):
        needed = {i: prompts[i] for _, jobs in run for i, _ in jobs}
        rows += generate_batches(model, tok, needed, run, **opts)
    merged = assemble(len(prompts), 3, rows, 0.0)
    assert merged.texts == whole.texts and merged.num_tokens == whole.num_tokens
    # Sampling really happened: not every sample of a prompt is the same text.
    assert any(len(set(t)) > 1 for t in whole.texts)
    # Another seed gives other texts.
    assert sample(model, tok, prompts, 3, batch_size=4, temperature=1.0, top_p=0.9, max_new_tokens=12, seed=6).texts != whole.texts


# --- collection over workers ----------------------------------------------------------------------------


def _collect(tmp_path, policy_dir, name: str, **collect) -> list[dict]:
    from pipeline.collect import run_collection_phase
    from pipeline.problems import problem_set_from_config

    collect = {"prompts_per_round": 4, "samples_per_prompt": 2, "rollouts_per_step": 2, "max_new_tokens": 24,
               "batch_size": 3, **collect}
    cfg = config_from_dict(mini_config(tmp_path / name, collect=collect), check_trl=False)
    res = run_collection_phase(cfg, problem_set_from_config(cfg), policy_dir, cfg.run_dir, 1)
    assert res.metrics["collect/rollouts"] > 0  # the MC rollout stage was exercised, not only the samples
    share = res.metrics["collect/imputed_label_share"]  # logged every round; only first_error imputes
    assert share == 0.0 if cfg.collect.strategy == "exhaustive" else 0.0 <= share < 1.0
    return Path(res.shard_path)


@pytest.mark.slow  # the session's Prefect server: ~20 s to start, kept out of `-m "not slow"`
@pytest.mark.parametrize("strategy", ["exhaustive", "first_error"])
def test_two_thread_workers_write_the_single_worker_shard(prefect_harness, tmp_path, tiny_policy_dir, strategy):
    from prefect import task

    one = _collect(tmp_path, tiny_policy_dir, "one", strategy=strategy)
    # Inside a Prefect task, as the flow runs the phase: the shards are tasks submitted from that task.
    in_task = task(_collect, name="collect-phase")
    two = in_task(tmp_path, tiny_policy_dir, "two", strategy=strategy, workers=2, task_runner="thread")
    assert len(read_shard(one)) == 8 and read_shard(two) == read_shard(one)


# An installed plugin that records, in each process that loads the plugins, the Ray node it runs on: Ray's workers
# find it only on the path the pipeline's process gives them (`collect_choices.ray_init_kwargs`), and load it only if
# the sample-shard task calls `load_plugins`. One file per worker process: NODE_ID-PID.
WHERE = {"where_plugin/__init__.py": """import os
import pathlib

import ray

if ray.is_initialized():
    folder = pathlib.Path(__file__).parents[1] / "nodes"
    folder.mkdir(exist_ok=True)
    (folder / f"{ray.get_runtime_context().get_node_id()}-{os.getpid()}").touch()
"""}


@pytest.fixture
def ray_nodes_seen(tmp_path, monkeypatch):
    """The folder where Ray's workers record their node (WHERE), the plugin on the path this process gives them."""
    site = plugin_distribution(tmp_path / "site", "where-plugin", WHERE, "where = where_plugin")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([child_env()["PYTHONPATH"], str(site)]))
    return site / "nodes"


def _nodes(folder: Path) -> set[str]:
    return {p.name.rsplit("-", 1)[0] for p in folder.iterdir()} if folder.exists() else set()


RAY = {"workers": 2, "task_runner": "ray", "ray_address": "auto"}  # joins the cluster RAY_ADDRESS names


@pytest.mark.slow  # a Ray cluster of two nodes (the session's), each job's workers loading the policy; one node killed
def test_two_ray_nodes_give_the_single_worker_eval_figures_and_shard_a_killed_node_included(
        prefect_harness, ray_cluster, ray_nodes_seen, tmp_path, tiny_policy_dir, monkeypatch):
    """Evaluation, then collection, over the two Ray nodes give one worker's figures, sample table and shard.

    Evaluation spreads its greedy call and its samples over both nodes (batches of 4: the greedy call's 8 prompts and
    the 8 x 4 samples each make 2 shards or more). Collection, sampling through the same `open_sampler`, has the added
    node's raylet killed (SIGKILL, by its pid) as its worker starts a shard: Ray retries the shard's task on the head,
    the one node left, and the shard is byte-equal to one worker's. (Each phase is a Ray job that starts a worker on
    each node: an unkilled two-node collection would add one, ~11 s on 2 loaded cores, and show nothing that
    evaluation's spread and the threads' collection above do not.)"""
    import pipeline.fanout
    from pipeline.eval_phase import run_eval_phase

    loads = []
    load = pipeline.fanout.load_sampling_model
    monkeypatch.setattr(pipeline.fanout, "load_sampling_model", lambda *a: loads.append(a) or load(*a))
    head, added = ray_cluster.list_all_nodes()
    # The policy named relative to this process's working directory, which is not a Ray worker's: before, each
    # shard read the relative path in its own working directory and failed (HF took it for a hub repo id).
    monkeypatch.chdir(tmp_path)
    relative = os.path.relpath(tiny_policy_dir, tmp_path)
    evals = [run_eval_phase(config_from_dict(mini_config(tmp_path / name, collect=collect, eval={"batch_size": 4}),
                                             check_trl=False), relative, 1)
             for name, collect in (("eval-one", {}), ("eval-ray", RAY))]
    timing = "eval/completions_per_s"
    assert {k: v for k, v in evals[1].metrics.items() if k != timing} == {
        k: v for k, v in evals[0].metrics.items() if k != timing}
    assert evals[1].tables == evals[0].tables and len(evals[0].tables["eval"]) > 0
    assert _nodes(ray_nodes_seen) == {head.node_id, added.node_id}  # on both nodes, the plugins loaded there
    assert len(loads) == 1  # only the single-worker run loaded the policy in this process: Ray's workers their own

    shutil.rmtree(ray_nodes_seen)
    raylet = added.all_processes["raylet"][0].process

    def kill_when_it_works():
        deadline = time.monotonic() + 120
        while added.node_id not in _nodes(ray_nodes_seen) and time.monotonic() < deadline:
            time.sleep(0.02)  # a shard's model load alone takes longer
        os.kill(raylet.pid, signal.SIGKILL)

    one = _collect(tmp_path, tiny_policy_dir, "one", strategy="first_error")
    killer = threading.Thread(target=kill_when_it_works, daemon=True)
    killer.start()
    try:
        two = _collect(tmp_path, tiny_policy_dir, "ray", strategy="first_error", **RAY)
        killer.join()
    finally:
        ray_cluster.remove_node(added, allow_graceful=False)  # what is left of it, by pid; the fixture adds another
    assert raylet.poll() is not None  # it was killed during the collection, which finished all the same
    assert _nodes(ray_nodes_seen) == {head.node_id, added.node_id}  # a shard began on the added node, then it died
    assert two.read_bytes() == one.read_bytes() and len(read_shard(one)) == 8
    assert len(loads) == 2  # and the single-worker collection: Ray's workers loaded their own
