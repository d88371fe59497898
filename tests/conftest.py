"""Shared fixtures, each made once per session unless said: a saved tiny policy (and RMs on it), mini-sized models
and the steps launched on them (1 and 2 processes), one Prefect test harness, one finished mini run; a temp MLflow
per test. Plain functions and constants: tests/helpers.py."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

# Before Prefect is imported anywhere: no analytics, a private home, quiet logs.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TQDM_DISABLE", "1")

# Under pytest-xdist (the README's `-n 2`), one torch thread a worker: two workers of two OpenMP threads each on two
# cores spin against each other (the suite ran slower on 2 workers than on 1). Children (`igrpo run`, launches)
# inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"

# After the environment above, as every import of the suite.
from tests.helpers import CPU_2PROC, ROOT, SIZES, child_env, igrpo, mini_config, ray_temp  # noqa: E402

# The suite's process holds ~1M long-lived objects (torch, transformers, TRL, Prefect, MLflow and the session's
# fixtures), and every full garbage collection walks them all: ~0.45 s each on 2 cores, once per Trainer.train
# (accelerate's free_memory calls gc.collect()) and whenever Python's own thresholds trigger one. `gc.freeze()` moves
# what is alive into a generation the collector skips (CPython's own advice for long-lived objects): -m "not slow"
# went from 54 s to 38 s. Done before the first test and every REFREEZE tests after, to take in what later tests
# import; what is frozen is still freed when its last reference goes, only a reference cycle among frozen objects
# stays until the session ends.
REFREEZE = 25
_tests_begun = 0


# The README's command runs the suite on both cores (`-n 2 --dist loadgroup`, pytest-xdist): one pytest process uses
# ~1 core, most of the suite being Python and small tensors. Each worker makes its own session and module fixtures,
# so tests go to the workers in groups that make each costly one once: a file's tests together (as `--dist loadfile`),
# and across files, the tests on the finished mini run (~40 s), and those on the mini models with their 1- and
# 2-process launches and the two Ray nodes (~40 s together).
# The longest groups go first (`--no-loadscope-reorder` in pyproject keeps this order), so that no long one is left
# to run alone at the end: ~60-100 s each, from `--durations=0` on 2 workers.
SHARED = {"mini_run": "mini-run", "mini_models": "launched", "_ray_nodes": "launched"}
FIRST = ["test_stack.py", "test_recipe_gsm8k.py", "launched", "test_signals.py", "mini-run", "test_training.py"]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    group = {item: next((g for fixture, g in SHARED.items() if fixture in item.fixturenames), item.path.name)
             for item in items}
    for item, name in group.items():
        item.add_marker(pytest.mark.xdist_group(name))
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the workers' order is the run's; a plain run keeps the files' order
        rank = {name: i for i, name in enumerate(FIRST)}
        items.sort(key=lambda item: rank.get(group[item], len(FIRST)))


def pytest_runtest_setup(item):
    global _tests_begun
    if _tests_begun % REFREEZE == 0:
        gc.collect()  # the garbage of the tests before is freed, not frozen
        gc.freeze()
    _tests_begun += 1


@pytest.fixture(scope="session")
def tiny_policy_dir(tmp_path_factory):
    """A saved untrained tiny policy (SIZES["tiny"], seed 0), shared by the session: read it, never write into it."""
    from models import char_tokenizer, save_model, tiny_policy

    tok = char_tokenizer()
    path = tmp_path_factory.mktemp("tiny") / "policy"
    save_model(tiny_policy(tok, **SIZES["tiny"], seed=0), tok, path)
    return path


@pytest.fixture(scope="session")
def tiny_dirs(tiny_policy_dir):
    """The folder of the tiny policy, with an ORM and a PRM on its backbone saved beside it (`orm/`, `prm/`)."""
    from models import save_model
    from pipeline.rm_kinds.loading import reward_model_from_policy

    root = tiny_policy_dir.parent
    for kind in ("orm", "prm"):
        model, rm_tok = reward_model_from_policy(str(tiny_policy_dir), kind)
        save_model(model, rm_tok, root / kind)
    return root


@pytest.fixture(scope="session")
def mini_models(tmp_path_factory) -> Path:
    """A policy of mini_config's size (seed 0) with a PRM and an ORM on its backbone (seeded heads, head dropout
    off: deterministic steps), saved once for the launched and the in-process steps of test_launcher.py and
    test_rm_scaling.py: read them; what a test writes beside them goes under a name of its own."""
    import torch

    from models import char_tokenizer, save_model, tiny_policy
    from pipeline.rm_kinds.loading import reward_model_from_policy

    where, tok = tmp_path_factory.mktemp("mini-models"), char_tokenizer()
    policy = save_model(tiny_policy(tok, **SIZES["mini"], seed=0), tok, where / "policy")
    for kind in ("prm", "orm"):
        torch.manual_seed(1)
        model, rm_tok = reward_model_from_policy(str(policy), kind)
        model.config.classifier_dropout = 0.0  # the PRM's token-classification head defaults to dropout 0.1
        save_model(model, rm_tok, where / kind)
    return where


@pytest.fixture(scope="session")
def step_plugin_path(tmp_path_factory) -> str:
    """The PYTHONPATH of tests/launcher_step.py's processes: this checkout, and the plugin that registers hybrid mode's
    outcome reward (launcher_step.PLUGIN), installed there and on no path of this process."""
    from tests.helpers import plugin_distribution
    from tests.launcher_step import PLUGIN

    site = plugin_distribution(tmp_path_factory.mktemp("step-plugin"), "says-an-answer-plugin", PLUGIN,
                               "says_an_answer = says_an_answer_plugin")
    return os.pathsep.join([child_env()["PYTHONPATH"], str(site)])


@pytest.fixture(scope="session")
def launched_steps(mini_models, step_plugin_path, tmp_path_factory) -> dict[int, dict]:
    """tests/launcher_step.py on `mini_models`: the GRPO steps (process, hybrid modes) as 1 process x 12 rows, and
    as 2 processes x 6 rows under `accelerate launch` (configs/accelerate/cpu_2proc.yaml), which then also take one
    PRM and one ORM step of 2 rows x 2 micro-batches each: one launch, its processes' start paid once for
    test_launcher.py and test_rm_scaling.py. The figures by number of processes: {1: {...}, 2: {..., "rm": ...}}."""
    from pipeline.config import LauncherConfig
    from pipeline.launch import launch_command, run_logged

    out, env = tmp_path_factory.mktemp("launched"), child_env(PYTHONPATH=step_plugin_path)
    script, modes = str(ROOT / "tests" / "launcher_step.py"), "process,hybrid"
    # Both at once: the 1-process run is plain Python, no torch.distributed (what `launcher: local` runs).
    single = subprocess.Popen([sys.executable, script, str(mini_models), str(out / "one.json"), "12", modes],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        launcher = LauncherConfig(kind="accelerate", config_file=CPU_2PROC)
        run_logged(launch_command(launcher, [script, str(mini_models), str(out / "two.json"), "6", modes, "2x2"],
                                  log_dir=out / "torchrun"),
                   out / "two.log", env, "the 2-process steps")
        _, err = single.communicate(timeout=300)
    finally:
        if single.poll() is None:
            single.kill()
            single.wait()
    assert single.returncode == 0, err[-3000:]
    return {n: json.loads((out / f"{name}.json").read_text()) for n, name in ((1, "one"), (2, "two"))}


@pytest.fixture(scope="session")
def ray_launched_steps(mini_models, step_plugin_path, _ray_nodes, tmp_path_factory) -> dict:
    """`launched_steps`' hybrid step as 2 workers x 6 rows of a Ray Train job (`launcher.kind: ray`), started as the
    pipeline starts a launched phase (`launch_phase`, which gives the job this process's PYTHONPATH, the plugin's),
    one worker on each node of the session's Ray cluster: {"hybrid": figures}, as `launched_steps[2]`."""
    from pipeline.config import PipelineConfig
    from pipeline.launch import launch_phase, ray_phase
    from tests import launcher_step

    launcher = {"kind": "ray", "ray_address": _ray_nodes.address, "num_processes": 2}
    args = {"models_dir": str(mini_models), "per_device_batch": 6, "modes": "hybrid"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", step_plugin_path)
        return launch_phase(PipelineConfig(launcher=launcher), "policy", args, tmp_path_factory.mktemp("ray-launched"),
                            {}, launcher_step.launched, ray_phase)


@pytest.fixture(scope="session", autouse=True)
def gguf_cache(tmp_path_factory):
    """The cache of GGUF files' plain copies (models/factories.py), one for the session and nowhere in the user's
    home: SmolLM2's is converted by the first test that loads it and read by the later ones."""
    from models.factories import CACHE_ENV

    folder = tmp_path_factory.mktemp("igrpo-cache")
    with pytest.MonkeyPatch.context() as mp:  # the user's own setting is back after the session
        mp.setenv(CACHE_ENV, str(folder))
        yield folder


@pytest.fixture(scope="session", autouse=True)
def mlflow_schema_once(tmp_path_factory):
    """MLflow builds a new sqlite store's schema by running its ~100 migrations, 2-4 s a store on 2 cores, and the
    suite makes a store per test: build it once, and give each new store (in this process) a copy of its tables,
    by sqlite's backup API. The store then adds its Default experiment itself, as on a fresh one."""
    import sqlite3

    import mlflow.store.db.utils as db_utils
    import sqlalchemy

    build = db_utils._initialize_tables
    template = None  # built by the first store that needs it: a run of tests that make none pays nothing

    def from_template(engine):
        nonlocal template
        if engine.dialect.name != "sqlite" or not engine.url.database:  # another backend, or in memory
            return build(engine)
        if template is None:
            path = tmp_path_factory.mktemp("mlflow-schema") / "schema.db"
            schema = sqlalchemy.create_engine(f"sqlite:///{path}")
            build(schema)
            schema.dispose()
            template = path
        with engine.connect() as conn, sqlite3.connect(template) as source:
            source.backup(conn.connection.driver_connection)

    db_utils._initialize_tables = from_template
    yield
    db_utils._initialize_tables = build


# Each node of the test cluster: one CPU (so two shards or two training workers need both nodes), a small object
# store; the head without a dashboard, and a node found dead within ~2 s of its raylet's death (Ray's default: 30 s).
RAY_NODE = {"num_cpus": 1, "object_store_memory": 80 * 2**20}
RAY_HEAD = {**RAY_NODE, "include_dashboard": False,
            "_system_config": {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                               "health_check_failure_threshold": 3}}


@pytest.fixture(scope="session")
def _ray_nodes():
    """A Ray cluster of two nodes on this machine (Ray's own `cluster_utils.Cluster`, as Ray's tests make one: a head
    and an added node, each its own raylet), started by the first test that needs it, stopped by its pids at the end.
    All of Ray's state is in a temp dir of its own (`ray_temp`), removed at the end."""
    pytest.importorskip("prefect_ray")
    from ray.cluster_utils import Cluster

    with ray_temp() as temp:
        cluster = Cluster(initialize_head=True, head_node_args={**RAY_HEAD, "temp_dir": os.path.join(temp, "ray")})
        try:
            cluster.add_node(**RAY_NODE)
            cluster.wait_for_nodes()
            yield cluster
        finally:
            cluster.shutdown()  # each node's processes, by their pids


@pytest.fixture
def ray_cluster(_ray_nodes, monkeypatch):
    """The session's two-node Ray cluster, joined as `ray_address: auto` finds it (RAY_ADDRESS, which `ray start
    --head` leaves for the processes of its node); two nodes again after a test that removed one."""
    monkeypatch.setenv("RAY_ADDRESS", _ray_nodes.address)
    yield _ray_nodes
    if len(_ray_nodes.list_all_nodes()) < 2:
        _ray_nodes.add_node(**RAY_NODE)
        _ray_nodes.wait_for_nodes()


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    """One ephemeral Prefect server for the whole session (it costs seconds to start)."""
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-home"))
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


class FinishedRun(NamedTuple):
    cfg: object  # its PipelineConfig (mini_config, 2 rounds)
    output: str  # what `igrpo run` printed, stdout and stderr together
    root: Path  # the directory it ran in: mini.yaml, runs/mini/, mlflow.db, mlruns/


@pytest.fixture(scope="session")
def mini_run(tmp_path_factory) -> FinishedRun:
    """A finished 2-round run of mini_config, made once per session by `igrpo run` in a subprocess, as a user runs it
    (a fresh Prefect home, none of the suite's settings): what it printed, its run directory, its MLflow store.
    The tests of what a run leaves read it (the flow, the registry, the sample tables, `igrpo eval` and `compare`, the
    console, the reference of the stopped and resumed run); none writes into it."""
    import yaml

    from pipeline.loading import config_from_dict

    root = tmp_path_factory.mktemp("mini-run")
    data = mini_config(root)
    (root / "mini.yaml").write_text(yaml.safe_dump(data))
    proc = igrpo(root, "run", "mini.yaml")
    assert proc.returncode == 0, proc.stdout[-6000:]
    return FinishedRun(config_from_dict(data), proc.stdout, root)


@pytest.fixture
def finished(mini_run):
    """The session's finished mini run, with MLflow's tracking URI set to its store for the test."""
    import mlflow

    mlflow.set_tracking_uri(mini_run.cfg.tracking.tracking_uri)
    yield mini_run
    mlflow.set_tracking_uri(None)


@pytest.fixture
def mlflow_tmp(tmp_path, monkeypatch):
    """A per-test sqlite MLflow store and a temp working directory (artifacts land in ./mlruns)."""
    import mlflow

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    yield uri
    mlflow.set_tracking_uri(None) if hasattr(mlflow, "set_tracking_uri") else None


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """A temp cwd; MLflow's URI (global and env) and its HTTP settings restored after the test."""
    import mlflow

    monkeypatch.chdir(tmp_path)
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.setenv(var, "unset")  # recorded, so that teardown restores the original state
        monkeypatch.delenv(var)
    yield
    mlflow.set_tracking_uri(None)


@pytest.fixture
def seen_advantages(monkeypatch) -> list:
    """The advantages tensor of every loss computation of ProcessGRPOTrainer, in order (a spy, not a mock)."""
    from pipeline.policy import ProcessGRPOTrainer

    seen = []
    original = ProcessGRPOTrainer._compute_loss

    def spy(self, model, inputs):
        seen.append(inputs["advantages"].detach().clone())
        return original(self, model, inputs)

    monkeypatch.setattr(ProcessGRPOTrainer, "_compute_loss", spy)
    return seen


@pytest.fixture
def registries():
    """Every extension point's table restored after the test: what it registered, or a plugin it loaded, undone
    (the config's `problems:` sections too)."""
    import tempfile

    from pipeline import registry
    from tests.helpers import import_tables

    import_tables()
    tables = registry.tables()  # every table the project has (tests/test_registry.py checks the list)
    before, loaded, modules = [dict(t) for t in tables], set(registry._loaded), set(sys.modules)
    yield
    for table, old in zip(tables, before):
        if dict(table) != old:
            table.clear()
            table.update(old)
            for hook in table.on_register:
                hook()
    if registry._loaded != loaded:  # a plugin loaded: the next test that installs it registers it again
        registry._loaded.intersection_update(loaded)
        registry._scanned = None
        for name in set(sys.modules) - modules:  # its modules, imported from the test's temp dir
            if (getattr(sys.modules[name], "__file__", None) or "").startswith(tempfile.gettempdir()):
                del sys.modules[name]
