"""Shared fixtures: one Prefect test harness per session, a temp MLflow per test, a mini run config."""

from __future__ import annotations

import os

import pytest

# Before Prefect is imported anywhere: no analytics, a private home, quiet logs.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TQDM_DISABLE", "1")


def mini_config(tmp_path, **sections) -> dict:
    """A run config small enough for a full 2-round flow in about a minute on 2 cores."""
    cfg = {
        "run": {"name": "mini", "runs_dir": str(tmp_path / "runs"), "rounds": 2, "seed": 0},
        "policy": {"tiny": {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 128,
                            "max_position_embeddings": 96}},
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
def isolated(tmp_path, monkeypatch):
    """A temp cwd; MLflow's URI (global and env) and its HTTP settings restored after the test."""
    import mlflow

    monkeypatch.chdir(tmp_path)
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.setenv(var, "unset")  # recorded, so that teardown restores the original state
        monkeypatch.delenv(var)
    yield
    mlflow.set_tracking_uri(None)
