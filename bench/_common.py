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
from pipeline.loading import load_config  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("IGRPO_BENCH_CACHE", "/tmp/igrpo-bench"))


def table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def quickstart(overrides: list[str] | None = None):
    return load_config(ROOT / "configs" / "quickstart.yaml", overrides or [])


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
    """A policy of the tests' mini size SFT'd as `tests.helpers.mini_config` does (about 20 s on 2 cores), cached."""
    from pipeline.loading import config_from_dict
    from tests.helpers import mini_config

    path = CACHE / "mini-sft"
    if not (path / "igrpo.json").exists():
        run_bootstrap(config_from_dict(mini_config(Path(tmp))), path)
    return path
