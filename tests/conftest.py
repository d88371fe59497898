"""Shared fixtures: the model size table, one saved tiny policy (and RMs on it) per session, one Prefect test
harness per session, a temp MLflow per test, a mini run config."""

from __future__ import annotations

import os

import pytest

# Before Prefect is imported anywhere: no analytics, a private home, quiet logs.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TQDM_DISABLE", "1")

# Every model size of the suite, in one place: a test's cost is mostly its model's size.
SIZES = {
    # Untrained, for shapes, scores, checkpoints, sampling and one-step trainings: the smallest with every part.
    "tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64, "max_position_embeddings": 96},
    # mini_config's policy, which a 2-round run bootstraps by SFT; also the 2-process step of test_launcher.py.
    "mini": {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 128, "max_position_embeddings": 96},
    # The quickstart's width and depth: the trained policy whose accuracy test_training.py asserts.
    "trained": {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "intermediate_size": 384,
                "max_position_embeddings": 96},
}


def mini_config(tmp_path, **sections) -> dict:
    """A run config small enough for a full 2-round flow in about a minute on 2 cores."""
    cfg = {
        "run": {"name": "mini", "runs_dir": str(tmp_path / "runs"), "rounds": 2, "seed": 0},
        "policy": {"tiny": dict(SIZES["mini"])},
        "problems": {"arithmetic": {"num_train": 400, "num_test": 20, "min_steps": 2, "max_steps": 2}},
        "bootstrap": {"sft_args": {"learning_rate": 3e-3, "num_train_epochs": 2, "per_device_train_batch_size": 32}},
        "supervision": {"mode": "process", "prompts_per_round": 16},
        "grpo": {"learning_rate": 1e-5, "num_generations": 4, "per_device_train_batch_size": 8, "max_steps": 2,
                 "max_completion_length": 32, "logging_steps": 1},
        "collect": {"prompts_per_round": 6, "samples_per_prompt": 2, "rollouts_per_step": 2, "max_new_tokens": 32},
        "reward_model": {"kinds": ["prm", "orm"], "holdout_fraction": 0.34,
                         "train_args": {"learning_rate": 1e-3, "num_train_epochs": 1, "per_device_train_batch_size": 8}},
        "eval": {"num_problems": 8, "samples_per_problem": 4, "max_new_tokens": 32, "best_of_n": [2, 4]},
        "tracking": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "mini"},
    }
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    return cfg


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
    from models import reward_model_from_policy, save_model

    root = tiny_policy_dir.parent
    for kind in ("orm", "prm"):
        model, rm_tok = reward_model_from_policy(str(tiny_policy_dir), kind)
        save_model(model, rm_tok, root / kind)
    return root


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


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    """One ephemeral Prefect server for the whole session (it costs seconds to start)."""
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-home"))
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


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
