"""Shared setup of the benchmarks: a quickstart-sized policy bootstrapped once and cached on disk."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.bootstrap import run_bootstrap  # noqa: E402
from pipeline.config import load_config  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("IGRPO_BENCH_CACHE", "/tmp/igrpo-bench"))


def quickstart(overrides: list[str] | None = None):
    return load_config(ROOT / "configs" / "quickstart.yaml", overrides or [])


def bootstrapped_policy(cfg) -> Path:
    """The quickstart's SFT policy (trained once, about a minute, then reused)."""
    path = CACHE / f"policy-seed{cfg.run.seed}"
    if not (path / "igrpo.json").exists():
        run_bootstrap(cfg, path)
    return path
