"""Security: checkpoints are safetensors only, no code runs from data (no eval/exec/pickle, a safe YAML
loader), and a run name cannot escape the runs directory."""

from __future__ import annotations

import re

import pytest
import yaml

from flows.cli import main
from tests.helpers import ROOT, mini_config

pytestmark = pytest.mark.usefixtures("isolated")


def test_checkpoints_are_safetensors_only(tiny_dirs):
    for name in ("policy", "orm", "prm"):
        files = {p.name for p in (tiny_dirs / name).iterdir()}
        assert "model.safetensors" in files, files
        assert not [f for f in files if f.endswith((".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"))], files


def test_no_code_execution_or_pickle_loading_in_source():
    pattern = re.compile(r"(?<![\w.])(eval|exec)\(|\bpickle\.loads?\(|\btorch\.load\(|\bdill\.|\bmarshal\.loads?\(")
    sources = [p for d in ("pipeline", "models", "flows") for p in (ROOT / d).rglob("*.py")]
    assert len(sources) > 15
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in sources
            for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []
    # The YAML loader is a SafeLoader (no arbitrary Python objects from a config).
    from pipeline.loading import _Loader

    assert issubclass(_Loader, yaml.SafeLoader)


@pytest.mark.parametrize("name", ["../escape", "a/b", "/abs", "..", ".hidden", "a/../../escape"])
def test_run_name_cannot_escape_runs_dir(tmp_path, capsys, name):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(mini_config(tmp_path, run={"name": name, "runs_dir": str(tmp_path / "deep" / "runs")})))
    before = sorted(tmp_path.rglob("*"))
    capsys.readouterr()
    rc = main(["run", str(path)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "run.name: must be letters, digits, '.', '_' or '-' (no '/' or '..')" in err
    assert sorted(tmp_path.rglob("*")) == before  # nothing created, inside runs_dir or out of it
