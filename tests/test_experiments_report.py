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
