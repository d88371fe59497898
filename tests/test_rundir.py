"""The run directory: a write that fails (a full disk) keeps the previous file, a corrupted manifest is
named with the way out, the lock refuses a live holder and takes over a dead one, and a changed config is
refused on resume unless forced. (A SIGKILL inside a phase, then resume: test_resume.py.)
"""

from __future__ import annotations

import errno
import os
import subprocess

import pyarrow.parquet as pq
import pytest

from pipeline.loading import config_from_dict
from tests.helpers import NAME, SIZES, mini_config, run_cli

pytestmark = pytest.mark.usefixtures("isolated")


# --- atomic writes: a full disk -------------------------------------------------------------------------


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _shard_rows(round_index: int = 0) -> list[dict]:
    return [{
        "round": round_index, "policy": "p", "prompt_id": f"q{i}", "prompt": "1+1\n", "sample_index": 0,
        "completion": "1+1=2\nAnswer: 2", "answer": "2", "steps": ["1+1=2", "Answer: 2"], "outcome": 1,
        "he_labels": [1, 1], "se_labels": [1.0, 0.75], "gold_labels": None, "rollouts": 4, "num_tokens": 14,
    } for i in range(3)]


def test_full_disk_while_writing_a_shard_keeps_the_previous_one(tmp_path, monkeypatch):
    from pipeline.replay import read_shard, write_shard
    from pipeline.rundir import RunDir

    path = RunDir(tmp_path).shard(0)
    write_shard(_shard_rows(), path)
    before = path.read_bytes()
    monkeypatch.setattr(pq, "write_table", _enospc)
    new_rows = [dict(r, prompt_id="new") for r in _shard_rows()]
    with pytest.raises(OSError) as info:
        write_shard(new_rows, path)
    assert info.value.errno == errno.ENOSPC
    assert path.read_bytes() == before
    assert {r["prompt_id"] for r in read_shard(path)} == {"q0", "q1", "q2"}
    assert sorted(p.name for p in path.parent.iterdir()) == ["samples.parquet"]  # no temp file left


def test_full_disk_while_saving_a_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch):
    from models import char_tokenizer, load_policy, save_model, tiny_policy

    tok = char_tokenizer()
    path = tmp_path / "round-000" / "policy"
    save_model(tiny_policy(tok, **SIZES["tiny"], seed=1), tok, path)
    files = {p.name: p.read_bytes() for p in path.iterdir()}
    other = tiny_policy(tok, **SIZES["tiny"], seed=2)
    monkeypatch.setattr(type(other), "save_pretrained", _enospc)
    with pytest.raises(OSError) as info:
        save_model(other, tok, path)
    assert info.value.errno == errno.ENOSPC
    assert {p.name: p.read_bytes() for p in path.iterdir()} == files
    assert [p.name for p in path.parent.iterdir()] == ["policy"]  # no temp dir beside it
    load_policy(str(path))  # still loads

# --- the manifest ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"config": {}, "phases": {"000/po', "Unterminated string"),
        ("\x00\x00garbage", "Expecting value"),
        ("[]", "expected a JSON object, got list"),
        ('{"phases": {}}', "missing or malformed 'config', 'mlflow'"),
    ],
    ids=["truncated", "garbage", "list", "missing-keys"],
)
def test_corrupted_manifest_names_file_and_way_out(tmp_path, text, why):
    from pipeline.rounds import open_run
    from pipeline.rundir import Manifest, RunDirError

    cfg = config_from_dict(mini_config(tmp_path), check_trl=False)
    cfg.run_dir.mkdir(parents=True)
    manifest = cfg.run_dir / "manifest.json"
    manifest.write_text(text)
    for attempt in (lambda: Manifest.load(cfg.run_dir), lambda: open_run(cfg)):
        with pytest.raises(RunDirError) as info:
            attempt()
        message = str(info.value)
        assert message.startswith(f"{manifest} is corrupted")
        assert why in message
        assert "Move the run directory aside to start over, or restore the file" in message
    assert manifest.read_text() == text  # left as it was for the user to inspect


def test_changed_config_on_resume_is_refused_unless_forced(tmp_path):
    from pipeline.rounds import open_run
    from pipeline.rundir import RunDirError

    first = config_from_dict(mini_config(tmp_path), check_trl=False)
    manifest = open_run(first)
    parent = manifest.data["mlflow"]["parent"]
    saved = (first.run_dir / "manifest.json").read_text()

    changed = config_from_dict(mini_config(tmp_path, collect={"prompts_per_round": 7}, grpo={"learning_rate": 2e-5}),
                               check_trl=False)
    with pytest.raises(RunDirError) as info:
        open_run(changed)
    message = str(info.value)
    assert f"{first.run_dir} was started with another config; differing keys:" in message
    assert "collect.prompts_per_round: 6 -> 7" in message
    assert "grpo.learning_rate: 1e-05 -> 2e-05" in message
    assert "supervision" not in message  # only the differing keys
    assert "--force" in message
    assert (first.run_dir / "manifest.json").read_text() == saved  # refused: nothing rewritten

    forced = open_run(changed, force=True)
    assert forced.data["config"]["collect"]["prompts_per_round"] == 7
    assert forced.data["mlflow"]["parent"] == parent  # same MLflow parent run, reattached
    assert open_run(changed).data["mlflow"]["parent"] == parent  # the new config is now the recorded one

# --- the lock -------------------------------------------------------------------------------------------


@pytest.mark.slow  # the session's Prefect server: ~20 s to start, kept out of `-m "not slow"`
def test_second_run_on_a_directory_in_use_is_refused(tmp_path, capsys, prefect_harness):
    data = mini_config(tmp_path)
    run_dir = tmp_path / "runs" / NAME
    run_dir.mkdir(parents=True)
    holder = subprocess.Popen(["sleep", "300"])
    try:
        (run_dir / ".lock").write_text(str(holder.pid))
        rc, err = run_cli(tmp_path, capsys, data)
        assert rc == 2, err
        assert f"igrpo: error: {run_dir} is in use by another run (pid {holder.pid})" in err
        assert (run_dir / ".lock").read_text() == str(holder.pid)  # the holder's lock is untouched
        assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # nothing written beside it
    finally:
        holder.kill()
        holder.wait()


def test_lock_of_a_live_process_is_refused_by_run_lock(tmp_path):
    from pipeline.rundir import RunDirError, run_lock

    holder = subprocess.Popen(["sleep", "300"])
    try:
        (tmp_path / ".lock").write_text(str(holder.pid))
        with pytest.raises(RunDirError, match=rf"in use by another run \(pid {holder.pid}\)"):
            with run_lock(tmp_path):
                pass
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("content", ["dead", "", "not a pid"])
def test_stale_lock_is_taken_over(tmp_path, content):
    from pipeline.rundir import run_lock

    if content == "dead":
        gone = subprocess.Popen(["true"])
        gone.wait()
        content = str(gone.pid)
    lock = tmp_path / ".lock"
    lock.write_text(content)
    with run_lock(tmp_path):
        assert lock.read_text() == str(os.getpid())
    assert not lock.exists()
