"""The run directory: a write that fails (a full disk) keeps the previous file, what a run writes has the modes
the umask gives, a corrupted manifest is named with the way out, the lock refuses a live holder (one of two runs
started at once) and is free once its holder is killed, and a changed config is refused on resume unless forced.
(A SIGKILL inside a phase, then resume: test_resume.py.)
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from pipeline.loading import config_from_dict
from tests.helpers import NAME, SIZES, child_env, mini_config, run_cli

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

# --- modes: as the umask says ----------------------------------------------------------------------------


@pytest.fixture(params=[0o022, 0o077], ids=["umask-022", "umask-077"])
def umask(request):
    before = os.umask(request.param)
    yield request.param
    os.umask(before)


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _wrong_modes(root, mask: int) -> dict[str, str]:
    """Each path under `root` (itself included) whose mode is not what a plain create under `mask` gives: 0666 less
    the mask for a file, 0777 less it for a folder."""
    wrong = {}
    for path in [root, *root.rglob("*")]:
        mode, want = path.stat().st_mode & 0o777, (0o777 if path.is_dir() else 0o666) & ~mask
        if mode != want:
            wrong[str(path.relative_to(root))] = f"{mode:04o}, not {want:04o}"
    return wrong


def test_what_a_run_writes_gets_the_modes_of_the_umask(tmp_path, umask):
    # Before, every atomic write was owner-only (0600 files, 0700 checkpoint folders): tempfile's modes survived the
    # rename, and no one else on a shared disk could read a run.
    from models import char_tokenizer, save_model, tiny_policy
    from pipeline.evaluate import plot_pass_maj
    from pipeline.replay import write_shard
    from pipeline.rundir import RunDir, write_json_atomic

    run, tok = RunDir(tmp_path / "runs" / NAME), char_tokenizer()
    write_json_atomic(run.manifest, {"phases": {}})
    write_json_atomic(run.manifest, {"phases": {"round-000/policy": {}}})  # a file replaced keeps the umask's mode
    write_shard(_shard_rows(), run.shard(0))
    plot_pass_maj({"round 0": {"pass@1": 0.5, "maj@1": 0.5}}, run.round(0) / "pass_maj.png")
    for seed in (1, 2):  # a checkpoint saved, then replaced (the two-rename swap)
        save_model(tiny_policy(tok, **SIZES["tiny"], seed=seed), tok, run.round(0) / "policy")
    assert len(list(run.root.rglob("*"))) > 6
    assert _wrong_modes(run.root, umask) == {}


@pytest.mark.slow  # the session's finished mini run
def test_a_finished_run_directory_has_the_modes_of_the_umask(mini_run):
    # Every file and folder the quickstart's run left, under the umask the suite runs with (the run inherits it).
    assert _wrong_modes(mini_run.cfg.run_dir, _current_umask()) == {}


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

# A process holding a run directory's lock through `run_lock`, as `igrpo run` does, until it is killed.
HOLD = """
import sys, time
from pipeline.rundir import run_lock
with run_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(300)
"""

# ROUNDS times, from a lock that a killed run left (a pid no process has): both processes take the lock in one
# instant; the one that has it holds it until the other has been refused (at most 10 s: with both running, neither
# is ever refused).
AT_ONCE = """
import os, sys, time
from pathlib import Path
from pipeline.rundir import RunDirError, run_lock
run_dir, sync, rounds, first = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "0"
def meet(tag):
    (sync / f"{tag}-{os.getpid()}").touch()
    while len(list(sync.glob(f"{tag}-*"))) < 2:
        pass  # spin, not sleep: both go on within microseconds
for r in range(rounds):
    meet(f"{r}a")  # both done with the round before
    if first:
        (run_dir / ".lock").write_text("4194305")  # above Linux's largest pid_max: dead
    meet(f"{r}b")
    try:
        with run_lock(run_dir):
            deadline = time.time() + 10
            while not (sync / f"refused-{r}").exists() and time.time() < deadline:
                time.sleep(0.005)
            print(r, "ran", flush=True)
    except RunDirError as e:
        (sync / f"refused-{r}").touch()
        print(r, "refused:", e, flush=True)
"""


@contextlib.contextmanager
def _holder(run_dir):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], env=child_env(), stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline() == "held\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow  # the session's Prefect server: ~20 s to start, kept out of `-m "not slow"`
def test_second_run_on_a_directory_in_use_is_refused(tmp_path, capsys, prefect_harness):
    data = mini_config(tmp_path)
    run_dir = tmp_path / "runs" / NAME
    with _holder(run_dir) as holder:
        rc, err = run_cli(tmp_path, capsys, data)
        assert rc == 2, err
        assert f"igrpo: error: {run_dir} is in use by another run (pid {holder.pid})" in err
        assert (run_dir / ".lock").read_text() == str(holder.pid)  # the holder's lock is untouched
        assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # nothing written beside it


def test_lock_of_a_live_process_is_refused_by_run_lock(tmp_path):
    from pipeline.rundir import RunDirError, refuse_if_locked, run_lock

    with _holder(tmp_path) as holder:
        refused = rf"^{tmp_path} is in use by another run \(pid {holder.pid}\); wait for it or stop it$"
        with pytest.raises(RunDirError, match=refused):
            refuse_if_locked(tmp_path)
        with pytest.raises(RunDirError, match=refused), run_lock(tmp_path):
            pass
        assert (tmp_path / ".lock").read_text() == str(holder.pid)


@pytest.mark.slow  # 20 rounds of two processes (~12 s)
def test_runs_started_at_once_on_one_directory_one_runs_each_time(tmp_path):
    # Before flock, a run removed a lock that it had read as stale (a dead pid, or empty: the pid was written after
    # the file was made), by then perhaps the other run's new one: both ran in the one directory (seen in round 1).
    rounds, sync, run_dir = 20, tmp_path / "sync", tmp_path / "run"
    sync.mkdir()
    run_dir.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", AT_ONCE, str(run_dir), str(sync), str(rounds), str(i)],
                              env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outs = [proc.communicate(timeout=300)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outs
    for r, said in enumerate(zip(*(out.splitlines() for out in outs))):  # one line a round from each
        assert sorted(line.split(":")[0] for line in said) == [f"{r} ran", f"{r} refused"], (r, outs)
        winner = procs[1 - [line.startswith(f"{r} ran") for line in said].index(False)].pid
        assert f"in use by another run (pid {winner}); wait for it or stop it" in " ".join(said), (r, said)
    assert not (run_dir / ".lock").exists()


@pytest.mark.slow  # the session's Prefect server, and two real runs starting
def test_two_igrpo_runs_started_at_once_one_runs(tmp_path, prefect_harness):
    import yaml
    from prefect.settings import PREFECT_API_URL

    (tmp_path / "mini.yaml").write_text(yaml.safe_dump(mini_config(tmp_path)))
    run_dir = tmp_path / "runs" / NAME
    env = child_env(PREFECT_API_URL=PREFECT_API_URL.value(), PREFECT_HOME=str(tmp_path / "prefect-home"))
    runs = [subprocess.Popen([sys.executable, "-m", "flows.cli", "run", "mini.yaml"], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
            for _ in range(2)]
    try:
        deadline = time.monotonic() + 300
        while all(run.poll() is None for run in runs) and time.monotonic() < deadline:
            time.sleep(0.1)
        refused, running = sorted(runs, key=lambda run: run.poll() is None)
        out = refused.communicate()[0]
        assert refused.returncode == 2, out
        assert f"igrpo: error: {run_dir} is in use by another run (pid {running.pid}); wait for it or stop it" in out
        assert running.poll() is None and (run_dir / ".lock").read_text() == str(running.pid)
        running.send_signal(signal.SIGTERM)  # the one running stops cleanly, its lock released
        assert running.wait(timeout=60) == 128 + signal.SIGTERM, running.communicate()[0][-3000:]
        assert not (run_dir / ".lock").exists()
    finally:
        for run in runs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
            run.wait()


@pytest.mark.parametrize("content", ["dead", "live", "", "not a pid"])
def test_stale_lock_is_taken_over(tmp_path, content):
    # "live": a live process that holds no lock, as one that reused a dead run's pid: before flock, it was refused.
    from pipeline.rundir import refuse_if_locked, run_lock

    other = subprocess.Popen(["sleep", "300"] if content == "live" else ["true"])
    if content in ("dead", "live"):
        other.wait() if content == "dead" else None
        content = str(other.pid)
    lock = tmp_path / ".lock"
    lock.write_text(content)
    try:
        refuse_if_locked(tmp_path)
        with run_lock(tmp_path):
            assert lock.read_text() == str(os.getpid())
        assert not lock.exists()
    finally:
        other.kill()
        other.wait()


def test_lock_of_a_killed_holder_is_free_at_once(tmp_path):
    from pipeline.rundir import refuse_if_locked, run_lock

    with _holder(tmp_path) as holder:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert (tmp_path / ".lock").read_text() == str(holder.pid)  # its file stays: a SIGKILL removes nothing
        t0 = time.monotonic()
        refuse_if_locked(tmp_path)
        with run_lock(tmp_path):
            assert (tmp_path / ".lock").read_text() == str(os.getpid())
        assert time.monotonic() - t0 < 1  # no waiting, no guessing: the kernel freed it with the process
