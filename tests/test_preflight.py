"""Bad inputs (data, models, the tracking URI) are one clear error raised before any work.

Where a user meets them, through the CLI in-process: `igrpo run` returns 2, prints one `igrpo: error: ...`
naming the file, line or field, and leaves no run directory behind.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from pipeline.loading import config_from_dict
from tests.helpers import assert_user_error, mini_config, run_cli

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.usefixtures("isolated")


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


def test_gsm8k_from_an_unreachable_hub_names_the_way_to_local_files(tmp_path, capsys, monkeypatch):
    # Offline (and a name no hub holds, should a network be there): one error in preflight, nothing written.
    # HF_HUB_OFFLINE=1 as a user's shell leaves it: the constants huggingface_hub and datasets read at import (here
    # they are imported already; left online, datasets retried the unreachable hub for 23 s).
    import datasets.config
    import huggingface_hub.constants as hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    data = mini_config(tmp_path, problems={"kind": "gsm8k", "gsm8k": {"hub_name": "nobody-xyz/no-such-gsm8k"}})
    rc, err = run_cli(tmp_path, capsys, data)
    assert_user_error(tmp_path, rc, err, "problems.gsm8k.hub_name 'nobody-xyz/no-such-gsm8k': cannot load it",
                      "--set problems.gsm8k.train_path=")


@pytest.mark.parametrize("policy", ["tiny", "checkpoint"])
def test_chat_prompts_on_a_tokenizer_without_a_template_fail_at_preflight(tmp_path, capsys, tiny_dirs, policy):
    # The char tokenizer has no chat template: asking for chat prompts is one error naming the field, before
    # any work (left unset, such a tokenizer gets plain prompts).
    spec = "tiny" if policy == "tiny" else str(tiny_dirs / "policy")
    data = mini_config(tmp_path, policy={"model": spec}, problems={"prompt_format": "chat"})
    rc, err = run_cli(tmp_path, capsys, data)
    assert_user_error(tmp_path, rc, err, "problems.prompt_format: chat needs a tokenizer with a chat template",
                      "set problems.prompt_format: plain")


@pytest.mark.parametrize("appends", [False, True], ids=["control", "appends-eos"])
def test_a_tokenizer_that_appends_its_eos_to_every_text_is_refused_before_any_work(tmp_path, capsys, appends):
    # Llama-2's layout with add_eos_token (here its post-processor): every prompt would end in </s>, in
    # GRPO's tokenization and sampling's alike, and the policy would learn to write after an end of sequence.
    from tokenizers import processors

    from pipeline.preflight import preflight
    from tests.tokenizer_cases import metaspace_tokenizer, policy_and_prm

    tok = metaspace_tokenizer()
    if appends:
        tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single="$A </s>", special_tokens=[("</s>", tok.eos_token_id)])
        assert tok("Q: 3").input_ids[-1] == tok.eos_token_id
    policy_and_prm(tok, tmp_path / "models")
    data = mini_config(tmp_path, policy={"model": str(tmp_path / "models" / "policy")})
    if not appends:
        preflight(config_from_dict(data, check_trl=False))
        return
    rc, err = run_cli(tmp_path, capsys, data)
    assert_user_error(tmp_path, rc, err, "policy.model: its tokenizer ends every prompt with its EOS token '</s>'",
                      '"add_eos_token": false')


def test_good_gsm8k_data_passes_preflight(tmp_path):
    # The control for the rows above: the same files, well formed, load.
    from pipeline.preflight import preflight

    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text(row("Q1?") + "\n\n" + row("Q2?", "$1,000 in all.\n#### 1,000") + "\n")
    test.write_text(GOOD_TEST)
    data = mini_config(tmp_path, problems={"kind": "gsm8k", "gsm8k": {"train_path": str(train), "test_path": str(test)}},
                       eval={"num_problems": 3})  # GOOD_TEST's 3 rows
    preflight(config_from_dict(data, check_trl=False))
    assert not (tmp_path / "runs").exists()  # preflight writes nothing in the runs dir

# --- models ---------------------------------------------------------------------------------------------


def test_missing_model_path(tmp_path, capsys):
    missing = tmp_path / "checkpoints" / "policy"
    rc, err = run_cli(tmp_path, capsys, mini_config(tmp_path, policy={"model": str(missing)}))
    assert_user_error(tmp_path, rc, err, f"model path {str(missing)!r} does not exist")


def test_a_missing_reward_model_backbone_is_named_before_anything_is_written(tmp_path, capsys):
    missing = tmp_path / "checkpoints" / "prm-backbone"
    rc, err = run_cli(tmp_path, capsys, mini_config(tmp_path, reward_model={"model": str(missing)}))
    assert_user_error(tmp_path, rc, err, f"reward_model.model: model path {str(missing)!r} does not exist")


def test_an_untrained_tiny_reward_model_backbone_is_refused_at_config_load(tmp_path, capsys):
    rc, err = run_cli(tmp_path, capsys, mini_config(tmp_path, reward_model={"model": "tiny"}))
    assert_user_error(tmp_path, rc, err, "reward_model.model", "untrained", "igrpo bootstrap")


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
    assert_user_error(tmp_path, rc, err, "policy.model: model 'package:yaml': package 'yaml' ships no .gguf file")


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
                         reward_models={"prm": tiny_dirs / "orm"})
    assert not out.parent.exists()  # refused before any training or scratch directory


def test_policy_given_where_a_reward_model_is_needed(tiny_dirs):
    from pipeline.rm_kinds.loading import load_reward_model

    with pytest.raises(ValueError, match=r"not a reward model .*LlamaForCausalLM.*expected a PRM or an ORM"):
        load_reward_model(tiny_dirs / "policy", expect="prm")

@pytest.mark.parametrize("damage", ["empty-config", "no-weights", "truncated-weights", "no-tokenizer", "a-prm"])
def test_a_checkpoint_directory_that_would_not_load_is_named_before_anything_is_written(tmp_path, capsys,
                                                                                         tiny_dirs, damage):
    # A directory with a config.json that still cannot serve as the policy: found at preflight, not after
    # round 0's work (a PRM's checkpoint loads as a causal LM with a warning, so that one is refused too).
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_dirs / ("prm" if damage == "a-prm" else "policy"), ckpt)
    if damage == "empty-config":
        (ckpt / "config.json").write_text("{}")
    elif damage == "no-weights":
        (ckpt / "model.safetensors").unlink()
    elif damage == "truncated-weights":
        data = (ckpt / "model.safetensors").read_bytes()
        (ckpt / "model.safetensors").write_bytes(data[:1000])
    elif damage == "no-tokenizer":
        for f in ckpt.glob("tokenizer*"):
            f.unlink()
    expected = {"empty-config": "its config.json is not a model's config", "no-weights": "has no weights",
                "truncated-weights": "weights file model.safetensors does not read",
                "no-tokenizer": "its tokenizer does not load", "a-prm": "holds a LlamaForTokenClassification"}
    rc, err = run_cli(tmp_path, capsys, mini_config(tmp_path, policy={"model": str(ckpt)}, bootstrap={"sft": False}))
    assert_user_error(tmp_path, rc, err, "policy.model", str(ckpt), expected[damage])


def test_the_intact_checkpoint_passes_the_same_checks(tiny_dirs):
    from models.factories import check_model_available

    check_model_available(str(tiny_dirs / "policy"), causal_lm=True)
    check_model_available(str(tiny_dirs / "prm"), "reward_model.model")  # a backbone need not generate


# --- reward functions: probed on gold solutions before any work ------------------------------------------


@pytest.mark.parametrize(("returns", "expected"), [
    ("raise", "raised"), ("nan", "returned nan"), ("strings", "good"), ("none", "mine"), ("short", "returned 1 rewards"),
])
def test_a_reward_function_that_misbehaves_fails_before_any_work(tmp_path, capsys, monkeypatch, returns, expected):
    from pipeline import rewards

    def build(problem_set, scorers):
        def mine(completions, answer, **kwargs):
            return {"raise": lambda: [float(a) for a in ["x", *answer[1:]]],
                    "nan": lambda: [float("nan")] * len(completions), "strings": lambda: ["good"] * len(completions),
                    "none": lambda: None, "short": lambda: [1.0]}[returns]()
        return mine

    monkeypatch.setitem(rewards.REWARD_FUNCS, "mine", rewards.RewardSpec(build))
    data = mini_config(tmp_path, supervision={"mode": "outcome", "rewards": {"verifier": 1.0, "mine": 0.5}})
    rc, err = run_cli(tmp_path, capsys, data)
    assert_user_error(tmp_path, rc, err, "supervision.rewards", "'mine'", "before any work", expected)


def test_a_reward_function_that_reads_what_only_grpo_gives_is_left_to_grpo(tmp_path, monkeypatch):
    from pipeline import rewards
    from pipeline.preflight import preflight

    def build(problem_set, scorers):
        return lambda completions, **kwargs: [float(len(ids)) for ids in kwargs["completion_ids"]]

    monkeypatch.setitem(rewards.REWARD_FUNCS, "length", rewards.RewardSpec(build))
    data = mini_config(tmp_path, supervision={"mode": "outcome", "rewards": {"verifier": 1.0, "length": 0.1}})
    preflight(config_from_dict(data, check_trl=False))  # no error: GRPO's own call checks it


def test_a_runs_dir_that_is_a_file_is_named_before_anything_is_written(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("a file where the runs should go")
    rc, err = run_cli(tmp_path, capsys, mini_config(tmp_path), f"run.runs_dir={tmp_path / 'notes.txt'}")
    assert rc == 2 and err.startswith("igrpo: error: run.runs_dir: ") and "is a file, not a folder" in err, err
    assert (tmp_path / "notes.txt").read_text() == "a file where the runs should go"


def test_more_eval_problems_than_the_held_out_set_holds_is_named_before_anything_is_written(tmp_path, capsys):
    # mini_config holds out 20 problems: asking for 21 used to evaluate 20 while MLflow logged 21.
    rc, err = run_cli(tmp_path, capsys, mini_config(tmp_path), "eval.num_problems=21")
    assert_user_error(tmp_path, rc, err, "eval.num_problems=21 but arithmetic has only 20 held-out problems")
    assert err.count("\n") == 1, err
    from pipeline.preflight import preflight

    preflight(config_from_dict(mini_config(tmp_path, eval={"num_problems": 20}), check_trl=False))  # all 20: fine


# --- tracking -------------------------------------------------------------------------------------------


def test_unreachable_tracking_uri(tmp_path, capsys):
    uri = "http://127.0.0.1:9"  # the discard port: nothing listens there
    start = time.monotonic()
    rc, err = run_cli(tmp_path, capsys, mini_config(tmp_path, tracking={"tracking_uri": uri}))
    assert time.monotonic() - start < 30
    assert_user_error(tmp_path, rc, err, f"MLflow tracking URI {uri!r} cannot be used")


# --- the policy spec ---------------------------------------------------------------------------------------


def test_a_missing_relative_model_path_offline_is_one_error_before_anything_is_written(tmp_path, capsys, monkeypatch):
    """`policy.model: my_model` (no ./, no such directory) is taken for a hub id; it used to pass preflight,
    write the run directory and then wait on the network (rc 1 with a traceback after 64 s here, offline).

    The hub switched off as HF_HUB_OFFLINE=1 in a user's shell leaves it: huggingface_hub's constant read at import.
    """
    import huggingface_hub.constants as hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    start = time.monotonic()
    rc, err = run_cli(tmp_path, capsys, mini_config(tmp_path, policy={"model": "my_model"}))
    took = time.monotonic() - start
    # One error line, no traceback.
    assert_user_error(tmp_path, rc, err, "policy.model 'my_model': ")
    assert err.count("\n") == 1, err
    assert err.startswith("igrpo: error: policy.model 'my_model': "), err
    # The path it looked for, why it is a hub id, how to write a local path, and why the hub cannot help.
    for text in (str(tmp_path / "my_model"), "taken for a Hugging Face hub id", "a local path starts with ./",
                 "write ./my_model", "HF_HUB_OFFLINE"):
        assert text in err, f"{text!r} not in {err!r}"
    # Nothing written: no run directory, no MLflow store (the tracking check comes after the policy's).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]
    assert took < 30, took  # the check itself makes no network call
