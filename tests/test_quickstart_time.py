"""bench/quickstart_time.py's figure check: two runs of a change meant to keep behaviour hold the same figures."""

from __future__ import annotations

import json
import math

from bench.quickstart_time import same_figures


def _eval_json(run, r, **metrics):
    path = run / f"round-{r:03d}" / "eval.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"round": r, "metrics": metrics, "curve": {}}))


def test_same_figures_names_what_differs_and_ignores_the_throughput(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _eval_json(a, 0, **{"eval/greedy": 0.745, "eval/completions_per_s": 300.0, "eval/prm_step_auc_gold": math.nan})
    _eval_json(b, 0, **{"eval/greedy": 0.745, "eval/completions_per_s": 512.0, "eval/prm_step_auc_gold": math.nan})
    _eval_json(a, 1, **{"eval/greedy": 0.790, "bon/prm@4": 0.8})
    _eval_json(b, 1, **{"eval/greedy": 0.795})
    assert same_figures(a, b) == ["round-000: same",
                                  "round-001: differ: bon/prm@4 0.8 / None; eval/greedy 0.79 / 0.795"]
