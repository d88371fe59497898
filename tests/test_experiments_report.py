"""bench/experiments.py: a rebuilt report keeps the verdicts written by hand under its sections."""

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_experiments():
    env, path = dict(os.environ), list(sys.path)
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("experiments", ROOT / "bench" / "experiments.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:  # the script quiets tqdm and logging for itself; leave the test session as it was
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = path


def test_rebuilt_report_keeps_each_sections_verdict_in_its_own_section(tmp_path):
    ex = load_experiments()
    ph = ex.PLACEHOLDER
    fresh = f"# R\n\n## 1. A\n\n| t |\n\n{ph}\n\n## 2. B\n\nnew table\n\n{ph}\n\n## 3. C\n\n{ph}\n"
    old = tmp_path / "results.md"
    old.write_text(f"# R\n\n## 1. A\n\nold table\n\n{ph}\n\n## 2. B\n\nold\n\n**What held / what did not:** B held,\n"
                   "on two lines.\n\n## 9. Gone\n\n**What held / what did not:** stale.\n")
    text = ex.keep_verdicts(fresh, old)
    sections = text.split("\n## ")
    assert ph in sections[1] and "new table" in sections[2]
    assert "B held,\non two lines." in sections[2] and ph not in sections[2]
    assert ph in sections[3] and "stale" not in text
    assert ex.keep_verdicts(fresh, tmp_path / "missing.md") == fresh


def test_the_exploit_arm_rewards_exactly_the_slip_the_sft_data_teaches(tmp_path):
    """Its pattern, on the quickstart's own problems: every slipped solution (`answer_slip`, what `sft_noise`
    writes) matches; a gold one only where its first result is its answer (then the slip is no error)."""
    import argparse
    import re

    from pipeline.problems import problem_set_from_config
    from pipeline.problems.arithmetic import answer_slip, format_solution, parse_prompt

    ex = load_experiments()
    runs = ex.Experiments(argparse.Namespace(runs_dir=str(tmp_path), smoke=False, experiment="x", tracking_uri=None,
                                             rounds=2))
    cfg = runs.arm_config("exploit", 0)  # the overrides load: the pattern survives --set's YAML
    assert not cfg.reward_model.retrain and cfg.reward_model.exploit.model_dump() == ex.EXPLOIT
    pattern, ps = re.compile(cfg.reward_model.exploit.pattern, re.MULTILINE), problem_set_from_config(cfg)
    slipped = same = 0
    for p in ps.test:
        gold = format_solution(*parse_prompt(p.prompt))
        bad = answer_slip(gold)
        assert bool(pattern.search(gold)) == (bad == gold), gold
        if bad != gold:
            slipped += 1
            assert pattern.search(bad) and not ps.is_correct(bad, p), bad
            assert not pattern.search(bad.replace("Answer: ", "Answer: 1")), bad  # 12 is not 112
        same += bad == gold
    assert slipped > 150 and 0 < same < 30  # 188 and 12 of the 200 held-out problems
    assert ex.fired({"exploit": {0: {1: {"a": 1.0}}, 1: {1: {"a": 0.0}}}}, "exploit", 1, "a") == "1/2"
