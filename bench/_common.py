"""What the benchmarks and the studies share: a markdown `table`, the quickstart config and its SFT policy bootstrapped
once and cached on disk, the mini config (configs/mini.yaml) and its SFT policy."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import yaml
from transformers import TrainerCallback

from pipeline.bootstrap import run_bootstrap
from pipeline.loading import config_from_dict, load_config

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("IGRPO_BENCH_CACHE", "/tmp/igrpo-bench"))
MINI = ROOT / "configs" / "mini.yaml"


def spread(ratios: list[float]) -> str:
    """The median of a ratio's repeats and their range: '1.012 (0.998-1.031)'."""
    return f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


class StepTimes(TrainerCallback):
    """Each training step's wall time, in `seconds`."""

    def __init__(self):
        self.seconds, self._start = [], None

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self._start)


def quickstart(overrides: list[str] | None = None):
    return load_config(ROOT / "configs" / "quickstart.yaml", overrides or [])


def mini_config(work: Path) -> dict:
    """configs/mini.yaml as a dict, its runs and MLflow store in `work` (as the tests' `mini_config`)."""
    data = yaml.safe_load(MINI.read_text())
    data["run"]["runs_dir"] = str(work / "runs")
    data["tracking"]["tracking_uri"] = f"sqlite:///{work / 'mlflow.db'}"
    return data


def bootstrapped_policy(cfg) -> Path:
    """The quickstart's SFT policy (trained once, about 4 minutes on 2 cores, then reused)."""
    import hashlib
    import json

    # Keyed by what the policy depends on, so a bench with other problems trains its own.
    key = json.dumps([cfg.run.seed, cfg.problems.model_dump(mode="json"), cfg.policy.model_dump(mode="json"),
                      cfg.bootstrap.model_dump(mode="json")], sort_keys=True)
    path = CACHE / f"policy-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if not (path / "igrpo.json").exists():
        run_bootstrap(cfg, path)
    return path


def mini_policy(tmp) -> Path:
    """A policy of the mini config's size SFT'd as that config does (about 20 s on 2 cores), cached."""
    path = CACHE / "mini-sft"
    if not (path / "igrpo.json").exists():
        run_bootstrap(config_from_dict(mini_config(Path(tmp))), path)
    return path
