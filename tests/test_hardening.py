"""Hardening: every bad input is one clear error raised before any work, every fault loses nothing.

User errors go through the CLI in-process (`main([...])` returns 2 and prints `igrpo: error: ...`) and
must leave no run directory behind. Faults (a full disk, a corrupted manifest, a held lock, a SIGKILL in
any phase) must leave the previous state intact, and a resume must finish with nothing lost or redone.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.cli import main
from pipeline.config import config_from_dict
from pipeline.fsutil import read_json
from tests.conftest import mini_config

ROOT = Path(__file__).resolve().parent.parent
NAME = "mini"  # run.name of mini_config
SIZES = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64, "max_position_embeddings": 96}


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """A temp cwd; MLflow's URI (global and env) and its HTTP settings restored after each test."""
    import mlflow

    monkeypatch.chdir(tmp_path)
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.setenv(var, "unset")  # recorded, so that teardown restores the original state
        monkeypatch.delenv(var)
    yield
    mlflow.set_tracking_uri(None)


def run_cli(tmp_path, capsys, data, *sets: str) -> tuple[int, str]:
    """`igrpo run` in-process on `data` (a dict dumped as YAML, or raw text); (exit code, stderr)."""
    path = tmp_path / "run.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    capsys.readouterr()
    rc = main(["run", str(path), *[a for s in sets for a in ("--set", s)]])
    return rc, capsys.readouterr().err


def assert_user_error(tmp_path, rc: int, err: str, *expected: str) -> None:
    """rc 2, one `igrpo: error:` message containing every `expected` string, and no run directory."""
    assert rc == 2, err
    assert err.startswith("igrpo: error: "), err
    assert "Traceback" not in err
    for text in expected:
        assert text in err, f"{text!r} not in {err!r}"
    assert not (tmp_path / "runs" / NAME).exists()


# --- config ---------------------------------------------------------------------------------------------


def test_malformed_yaml(tmp_path, capsys):
    rc, err = run_cli(tmp_path, capsys, "run:\n  name: [unclosed\n")
    assert_user_error(tmp_path, rc, err, str(tmp_path / "run.yaml"), "malformed YAML", "line 2")


def test_top_level_not_a_mapping(tmp_path, capsys):
    rc, err = run_cli(tmp_path, capsys, "- run\n- policy\n")
    assert_user_error(tmp_path, rc, err, str(tmp_path / "run.yaml"), "the top level must be a mapping")


@pytest.mark.parametrize(
    ("section", "values", "expected"),
    [
        # unknown keys, at every depth
        ("collect", {"promts_per_round": 4}, "collect.promts_per_round: unknown key"),
        ("policy", {"tiny": {"hiden_size": 64}}, "policy.tiny.hiden_size: unknown key"),
        ("nosuchsection", {"x": 1}, "nosuchsection: unknown key"),
        # wrong types
        ("run", {"rounds": "three"}, "run.rounds: Input should be a valid integer"),
        ("collect", {"temperature": "hot"}, "collect.temperature: Input should be a valid number"),
        ("reward_model", {"kinds": "prm"}, "reward_model.kinds: Input should be a valid list"),
        ("grpo", {"learning_rate": "fast"}, "grpo.learning_rate: expected a number, got 'fast'"),
        ("grpo", {"use_vllm": "yes"}, "grpo.use_vllm: expected true or false"),
        # out of range
        ("reward_model", {"replay_fraction": 1.5}, "reward_model.replay_fraction: must be between 0 and 1"),
        ("run", {"rounds": 0}, "run.rounds: Input should be greater than or equal to 1"),
        ("grpo", {"num_generations": 1}, "grpo.num_generations: must be at least 2"),
        ("eval", {"best_of_n": [2, 64]}, "eval.best_of_n [64] must lie in [1, eval.samples_per_problem]"),
        ("supervision", {"mode": "outcome", "verifier_weight": 0.0}, "outcome mode needs verifier_weight or orm_weight"),
        ("problems", {"prompt_format": "dialog"}, "problems.prompt_format: Input should be 'chat' or 'plain'"),
        ("problems", {"prompt_format": "plain", "system_prompt": "Be brief."},
         "problems: system_prompt: only chat prompts have a system message"),
        # a field TRL's configs reject
        ("grpo", {"bogus": 1}, "grpo.bogus: not a field of TRL's config"),
        ("bootstrap", {"sft_args": {"num_epochz": 2}}, "bootstrap.sft_args.num_epochz: not a field of TRL's config"),
    ],
)
def test_bad_config_field_names_it(tmp_path, capsys, section, values, expected):
    data = mini_config(tmp_path)
    data.setdefault(section, {}).update(values)
    rc, err = run_cli(tmp_path, capsys, data)
    assert_user_error(tmp_path, rc, err, str(tmp_path / "run.yaml"), expected)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("run.nope=1", "run.nope: unknown key"),
        ("nokey", "override 'nokey': expected dotted.key=value"),
        ("run.rounds.deep=1", "override 'run.rounds.deep=1': run.rounds is not a section"),
        ("run..rounds=1", "'run..rounds' is not a dotted key"),
        ("run.rounds=-1", "run.rounds: Input should be greater than or equal to 1"),
        ("reward_model.replay_fraction=1.5", "reward_model.replay_fraction: must be between 0 and 1"),
    ],
)
def test_bad_override_names_it(tmp_path, capsys, override, expected):
    rc, err = run_cli(tmp_path, capsys, mini_config(tmp_path), override)
    assert_user_error(tmp_path, rc, err, expected)


def test_missing_config_file(tmp_path, capsys):
    capsys.readouterr()
    rc = main(["run", str(tmp_path / "nope.yaml")])
    assert_user_error(tmp_path, rc, capsys.readouterr().err, "nope.yaml", "does not exist")


# --- data: GSM8K from local jsonl -----------------------------------------------------------------------


def row(question: str, answer: str = "Half of 10 is 5.\n#### 5") -> str:
    return json.dumps({"question": question, "answer": answer})


GOOD_TEST = "\n".join(row(f"Test question {i}?") for i in range(3)) + "\n"


@pytest.mark.parametrize(
    ("train_text", "expected"),
    [
        (None, "GSM8K file not found: {train}"),
        ("", "{train} is empty: no GSM8K rows"),
        ("\n  \n", "{train} is empty: no GSM8K rows"),
        (row("Q1?") + "\n" + json.dumps({"question": "Q2?"}) + "\n", "{train} line 2: missing or empty field 'answer'"),
        (json.dumps({"answer": "#### 3"}) + "\n", "{train} line 1: missing or empty field 'question'"),
        (row("Q1?") + "\n" + row("Q2?", "It is many.\n#### lots") + "\n", "{train} line 2: gold answer 'lots' is not a number"),
        (row("Q1?", "no marker") + "\n", "{train} line 1: answer has no '#### <number>' line"),
        (row("Q1?") + "\n" + row("Q2?") + "\n" + row("Q1?") + "\n",
         "{train} line 3: duplicate question, first seen at {train} line 1"),
        (row("Q1?") + "\n{not json\n", "{train} line 2: invalid JSON"),
        ("[1, 2]\n", "{train} line 1: expected a JSON object, got list"),
    ],
    ids=["missing", "empty", "blank", "no-answer", "no-question", "bad-gold", "no-marker", "duplicate", "bad-json",
         "not-object"],
)
def test_bad_gsm8k_data_names_file_and_line(tmp_path, capsys, train_text, expected):
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    if train_text is not None:
        train.write_text(train_text)
    test.write_text(GOOD_TEST)
    data = mini_config(tmp_path, problems={"kind": "gsm8k", "gsm8k": {"train_path": str(train), "test_path": str(test)}})
    rc, err = run_cli(tmp_path, capsys, data)
    assert_user_error(tmp_path, rc, err, expected.format(train=train))


def test_gsm8k_test_question_in_train_names_it(tmp_path, capsys):
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text(row("Shared?") + "\n" + row("Only train?") + "\n")
    test.write_text(row("Only test?") + "\n" + row("Shared?") + "\n")
    data = mini_config(tmp_path, problems={"kind": "gsm8k", "gsm8k": {"train_path": str(train), "test_path": str(test)}})
    rc, err = run_cli(tmp_path, capsys, data)
    assert_user_error(tmp_path, rc, err, "1 test question(s) also appear in train", "gsm8k-test-00001")


def test_good_gsm8k_data_passes_preflight(tmp_path):
    # The control for the rows above: the same files, well formed, load.
    from pipeline.runner import preflight

    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text(row("Q1?") + "\n\n" + row("Q2?", "$1,000 in all.\n#### 1,000") + "\n")
    test.write_text(GOOD_TEST)
    data = mini_config(tmp_path, problems={"kind": "gsm8k", "gsm8k": {"train_path": str(train), "test_path": str(test)}})
    preflight(config_from_dict(data, check_trl=False))
    assert not (tmp_path / "runs").exists()  # preflight writes nothing in the runs dir


def _shard_rows(round_index: int = 0) -> list[dict]:
    return [{
        "round": round_index, "policy": "p", "prompt_id": f"q{i}", "prompt": "1+1\n", "sample_index": 0,
        "completion": "1+1=2\nAnswer: 2", "answer": "2", "steps": ["1+1=2", "Answer: 2"], "outcome": 1,
        "he_labels": [1, 1], "se_labels": [1.0, 0.75], "gold_labels": None, "rollouts": 4, "num_tokens": 14,
    } for i in range(3)]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda t: t.drop_columns(["se_labels"]), "column 'se_labels' is missing"),
        (lambda t: t.set_column(t.schema.get_field_index("outcome"), "outcome", pa.array([1.0, 0.0, 1.0])),
         "column 'outcome' has type double, expected int64"),
        (lambda t: t.set_column(t.schema.get_field_index("steps"), "steps", pa.array(["a", "b", "c"])),
         "column 'steps' has type string, expected list<item: string>"),
    ],
    ids=["missing-column", "wrong-dtype", "scalar-for-list"],
)
def test_bad_shard_names_shard_and_column(tmp_path, mutate, expected):
    from pipeline.replay import SHARD_SCHEMA, read_shard

    path = tmp_path / "round-000" / "samples.parquet"
    path.parent.mkdir()
    pq.write_table(mutate(pa.Table.from_pylist(_shard_rows(), schema=SHARD_SCHEMA)), path)
    with pytest.raises(ValueError) as info:
        read_shard(path)
    assert str(info.value) == f"{path}: {expected}"


def test_shard_that_is_not_parquet(tmp_path):
    from pipeline.replay import read_shard

    path = tmp_path / "samples.parquet"
    path.write_bytes(b"PAR1 but not really")
    with pytest.raises(ValueError, match=re.escape(f"{path}: not a readable parquet shard")):
        read_shard(path)


# --- models ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """A saved tiny policy and an ORM and a PRM on its backbone."""
    from models import char_tokenizer, reward_model_from_policy, save_model, tiny_policy

    root = tmp_path_factory.mktemp("tiny")
    tok = char_tokenizer()
    save_model(tiny_policy(tok, **SIZES, seed=3), tok, root / "policy")
    for kind in ("orm", "prm"):
        model, rm_tok = reward_model_from_policy(str(root / "policy"), kind)
        save_model(model, rm_tok, root / kind)
    return root


def test_missing_model_path(tmp_path, capsys):
    missing = tmp_path / "checkpoints" / "policy"
    rc, err = run_cli(tmp_path, capsys, mini_config(tmp_path, policy={"model": str(missing)}))
    assert_user_error(tmp_path, rc, err, f"model path {str(missing)!r} does not exist")


def test_model_directory_without_config(tmp_path, capsys):
    (tmp_path / "empty_ckpt").mkdir()
    rc, err = run_cli(tmp_path, capsys, mini_config(tmp_path, policy={"model": str(tmp_path / "empty_ckpt")}))
    assert_user_error(tmp_path, rc, err, "empty_ckpt", "has no config.json: not a saved checkpoint")


def test_gguf_file_that_is_not_gguf(tmp_path, capsys):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"<html>404 Not Found</html>")
    rc, err = run_cli(tmp_path, capsys, mini_config(tmp_path, policy={"model": str(fake)}))
    assert_user_error(tmp_path, rc, err, f"model file {str(fake)!r} is not a GGUF file (bad magic bytes)")


def test_package_without_gguf(tmp_path, capsys):
    rc, err = run_cli(tmp_path, capsys, mini_config(tmp_path, policy={"model": "package:yaml"}))
    assert_user_error(tmp_path, rc, err, "policy 'package:yaml': package 'yaml' ships no .gguf file")


@pytest.mark.parametrize("policy", ["tiny", "checkpoint"])
def test_chat_prompts_on_a_tokenizer_without_a_template_fail_at_preflight(tmp_path, capsys, tiny_dirs, policy):
    # The char tokenizer has no chat template: asking for chat prompts is one error naming the field, before
    # any work (left unset, such a tokenizer gets plain prompts).
    spec = "tiny" if policy == "tiny" else str(tiny_dirs / "policy")
    data = mini_config(tmp_path, policy={"model": spec}, problems={"prompt_format": "chat"})
    rc, err = run_cli(tmp_path, capsys, data)
    assert_user_error(tmp_path, rc, err, "problems.prompt_format: chat needs a tokenizer with a chat template",
                      "set problems.prompt_format: plain")


def test_tokenizer_without_eos():
    from models import char_tokenizer
    from models.factories import _prepare_tokenizer

    tok = char_tokenizer()
    tok.eos_token = None
    with pytest.raises(ValueError, match=r"tokenizer of 'some/ckpt' has no eos token: generation could never stop"):
        _prepare_tokenizer(tok, "some/ckpt")


def test_orm_given_where_a_prm_is_needed(tmp_path, tiny_dirs):
    from pipeline.policy import run_policy_phase
    from pipeline.problems import EmbeddedArithmetic

    cfg = config_from_dict(mini_config(tmp_path), check_trl=False)
    assert cfg.supervision.mode == "process"
    out = tmp_path / "round-001" / "policy"
    with pytest.raises(ValueError, match=re.escape(f"{tiny_dirs / 'orm'}: is an ORM but a PRM is needed here")):
        run_policy_phase(cfg, EmbeddedArithmetic(num_train=20, num_test=5), tiny_dirs / "policy", out, 1,
                         reward_model_path=tiny_dirs / "orm")
    assert not out.parent.exists()  # refused before any training or scratch directory


def test_policy_given_where_a_reward_model_is_needed(tiny_dirs):
    from models import load_reward_model

    with pytest.raises(ValueError, match=r"not a reward model .*LlamaForCausalLM.*expected an ORM or PRM"):
        load_reward_model(tiny_dirs / "policy", expect="prm")


# --- rewards --------------------------------------------------------------------------------------------


def _raises(completions, **kwargs):
    raise KeyError("answer")


@pytest.mark.parametrize(
    ("func", "expected"),
    [
        (_raises, r"reward function 'f' raised on a batch of 3: KeyError\('answer'\)"),
        (lambda c, **k: [1.0] * (len(c) - 1), r"reward function 'f' returned 2 rewards for 3 completions"),
        (lambda c, **k: [0.0, math.nan, 1.0], r"reward function 'f' returned nan for sample 1 \('b\\\\nc'\)"),
        (lambda c, **k: [0.0, 1.0, math.inf], r"reward function 'f' returned inf for sample 2 \('d'\)"),
        (lambda c, **k: [-math.inf, 1.0, 1.0], r"reward function 'f' returned -inf for sample 0 \('a'\)"),
    ],
    ids=["raises", "wrong-length", "nan", "inf", "-inf"],
)
def test_bad_reward_function_names_function_and_sample(func, expected):
    from pipeline.rewards import RewardError, checked

    with pytest.raises(RewardError, match=expected):
        checked(func, "f")(["a", "b\nc", "d"])


def test_prm_emitting_nan_names_the_sample(tiny_dirs):
    import torch

    from models import load_reward_model
    from pipeline.rewards import PrmScorer, RewardError

    model, tok, _ = load_reward_model(tiny_dirs / "prm", expect="prm")
    with torch.no_grad():  # only '#' is poisoned: only the completion holding it goes NaN
        model.model.embed_tokens.weight[tok.convert_tokens_to_ids("#")] = math.nan
    completions = ["1+1=2\n", "Answer: 2", "1+1=#\nAnswer: 2"]
    with pytest.raises(RewardError, match=r"PRM returned nan for sample 2 \('1\+1=#\\\\nAnswer: 2'\)"):
        PrmScorer(model, tok, batch_size=2).step_scores(["1+1\n"] * 3, completions)


# --- tracking -------------------------------------------------------------------------------------------


def test_unreachable_tracking_uri(tmp_path, capsys):
    uri = "http://127.0.0.1:9"  # the discard port: nothing listens there
    start = time.monotonic()
    rc, err = run_cli(tmp_path, capsys, mini_config(tmp_path, tracking={"tracking_uri": uri}))
    assert time.monotonic() - start < 30
    assert_user_error(tmp_path, rc, err, f"MLflow tracking URI {uri!r} cannot be used")


# --- faults: full disk, corrupted manifest, locks, changed config -----------------------------------------


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_full_disk_while_writing_a_shard_keeps_the_previous_one(tmp_path, monkeypatch):
    from pipeline.replay import read_shard, shard_path, write_shard

    path = shard_path(tmp_path, 0)
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
    save_model(tiny_policy(tok, **SIZES, seed=1), tok, path)
    files = {p.name: p.read_bytes() for p in path.iterdir()}
    other = tiny_policy(tok, **SIZES, seed=2)
    monkeypatch.setattr(type(other), "save_pretrained", _enospc)
    with pytest.raises(OSError) as info:
        save_model(other, tok, path)
    assert info.value.errno == errno.ENOSPC
    assert {p.name: p.read_bytes() for p in path.iterdir()} == files
    assert [p.name for p in path.parent.iterdir()] == ["policy"]  # no temp dir beside it
    load_policy(str(path))  # still loads


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
    from pipeline.runner import Manifest, RunDirError, open_run

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
    from pipeline.runner import RunDirError, run_lock

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
    from pipeline.runner import run_lock

    if content == "dead":
        gone = subprocess.Popen(["true"])
        gone.wait()
        content = str(gone.pid)
    lock = tmp_path / ".lock"
    lock.write_text(content)
    with run_lock(tmp_path):
        assert lock.read_text() == str(os.getpid())
    assert not lock.exists()


def test_changed_config_on_resume_is_refused_unless_forced(tmp_path):
    from pipeline.runner import RunDirError, open_run

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


# --- SIGKILL inside each phase of round 1, then resume ---------------------------------------------------

# Where the run is held (then killed) inside round 1's phase: (module, function, a path the call must name).
# Deterministic, unlike a kill after a guessed delay, and each point leaves the phase half done:
# collect: every sample labelled, the shard not yet written; reward_model: the PRM trained and saved, the
# ORM trained but not saved; eval: eval.json written, the plots, artifacts and manifest record not.
KILL_POINTS = {
    "collect": ("pipeline.collect", "write_shard", "round-001/samples.parquet"),
    "reward_model": ("pipeline.reward_model", "save_model", "round-001/reward_model/orm"),
    "eval": ("pipeline.rounds", "plot_pass_maj", "round-001/pass_maj.png"),
}

HOLD_THEN_RUN = """
import importlib, os, sys, time
module, name, needle, marker, config = sys.argv[1:]
mod = importlib.import_module(module)
real = getattr(mod, name)
def held(*args, **kwargs):
    if any(needle in str(a) for a in (*args, *kwargs.values()) if isinstance(a, (str, os.PathLike))):
        open(marker, "w").close()
        time.sleep(600)  # killed here
    return real(*args, **kwargs)
setattr(mod, name, held)
from pipeline.cli import main
sys.exit(main(["run", config]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["collect", "reward_model", "eval"])
def test_sigkill_in_phase_then_resume(tmp_path, prefect_harness, mlflow_tmp, phase):
    """SIGKILL the run inside round 1's `phase`; an in-process rerun finishes with nothing lost or redone."""
    from flows.iterative import iterative_rl
    from tests.test_flow import assert_complete_run

    data = mini_config(tmp_path)
    cfg = config_from_dict(data)
    path = tmp_path / "mini.yaml"
    path.write_text(yaml.safe_dump(data))
    marker = tmp_path / "held"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-sub"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen([sys.executable, "-c", HOLD_THEN_RUN, *KILL_POINTS[phase], str(marker), str(path)],
                            env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # its Prefect server is killed with the group below
    deadline = time.time() + 400
    try:
        while time.time() < deadline and proc.poll() is None and not marker.exists():
            time.sleep(0.1)
        held = marker.exists()
        if held:
            proc.send_signal(signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert held, f"the run ended or stalled (rc {proc.returncode}) before reaching round 1's {phase} phase"
    assert proc.returncode == -signal.SIGKILL
    manifest_path = cfg.run_dir / "manifest.json"
    before = read_json(manifest_path)
    assert f"round-001/{phase}" in before["mlflow"] and f"001/{phase}" not in before["phases"]  # inside the phase
    previous = {"collect": "policy", "reward_model": "collect", "eval": "reward_model"}[phase]
    assert f"001/{previous}" in before["phases"]
    assert (cfg.run_dir / ".lock").exists()  # left by the dead process

    iterative_rl(cfg.model_dump(mode="json"))  # resumes, taking over the stale lock
    assert_complete_run(cfg, "mini")
    after = read_json(manifest_path)
    for key, output in before["phases"].items():
        assert after["phases"][key] == output  # finished phases were not redone
    assert after["mlflow"][f"round-001/{phase}"] == before["mlflow"][f"round-001/{phase}"]  # the phase run reused
    assert not (cfg.run_dir / ".lock").exists()
    leftovers = [str(p.relative_to(cfg.run_dir)) for p in cfg.run_dir.rglob(".*") if p.name != ".lock"]
    assert leftovers == []  # no temp file, temp checkpoint or trainer scratch dir left behind
    if phase == "reward_model":  # one version per round and kind: the killed attempt registered nothing
        from mlflow import MlflowClient

        for kind in ("prm", "orm"):
            versions = MlflowClient().search_model_versions(f"name='mini-{kind}'")
            assert sorted(v.tags["round"] for v in versions) == ["0", "1", "2"]


# --- security -------------------------------------------------------------------------------------------


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
    from pipeline.config import _Loader

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
