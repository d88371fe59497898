"""The published PRM layouts (`reward_model.head`): each layout's formula by hand against the pipeline's scorer, one
training step of each through the RM phase, a checkpoint of each as round 0's PRM (`reward_model.init`), and every
bad input as one error before any work. Tiny untrained models built offline (the tag token added to the char
tokenizer where a layout has one)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from pipeline.config import ConfigError
from pipeline.loading import config_from_dict
from pipeline.rm_kinds import PrmLayout
from pipeline.rm_kinds.heads import (
    classification_log_probs,
    classification_probability,
    label_token_log_probs,
    label_token_probability,
    soft_cross_entropy,
    value_probability,
)
from pipeline.rm_kinds.loading import load_reward_model, reward_model_from_policy, save_reward_model
from pipeline.steps import tagged_steps
from tests.helpers import make_row, mini_config

LAYOUTS = {"value": PrmLayout(), "label_tokens": PrmLayout("label_tokens", "ки", ("+", "-")),
           "classification": PrmLayout("classification", "<extra_0>")}
PROMPTS = ["3 +1 *2\n", "What is 13 x 17?"]
COMPLETIONS = ["3+1=4\n4*2=8\nAnswer: 8", "13 x 17 = 221\nAnswer: 221"]
ONE_STEP = {"max_steps": 1, "per_device_train_batch_size": 4, "learning_rate": 1e-2}


# --- the formulas, on numbers ---------------------------------------------------------------------------------


def test_each_layouts_formula_on_worked_logits():
    # value: sigmoid(0) = 0.5, sigmoid(ln 3) = 0.75.
    assert value_probability(torch.tensor([[0.0], [math.log(3)]])).tolist() == pytest.approx([0.5, 0.75], abs=1e-7)
    # label tokens: only the two label logits count: e^2 / (e^2 + e^0) = 0.8808, whatever the third logit.
    lm = torch.tensor([[2.0, 0.0, 9.0], [0.0, 0.0, -9.0]])  # (N, V); '+' is id 0, '-' id 1
    assert label_token_probability(lm, (0, 1)).tolist() == pytest.approx([0.880797, 0.5], abs=1e-6)
    # classification: softmax(logits)[1]; ln 4 against 0 gives 0.8.
    assert classification_probability(torch.tensor([[0.0, math.log(4)]])).tolist() == pytest.approx([0.8], abs=1e-7)


def test_the_training_losses_are_the_cross_entropy_on_the_label():
    lm = torch.tensor([[2.0, 0.0, 9.0], [0.5, 1.0, -1.0]])  # (N, V)
    # A hard label is the plain cross-entropy over the whole vocabulary on the label token (Math-Shepherd).
    hard = soft_cross_entropy(label_token_log_probs(lm, (0, 1)), torch.tensor([1.0, 0.0]))
    assert hard.item() == pytest.approx(torch.nn.functional.cross_entropy(lm, torch.tensor([0, 1]), reduction="sum").item())
    # Classification: class 1 is right.
    two = torch.tensor([[0.3, -0.2], [1.0, 2.0]])
    hard = soft_cross_entropy(classification_log_probs(two), torch.tensor([1.0, 0.0]))
    assert hard.item() == pytest.approx(torch.nn.functional.cross_entropy(two, torch.tensor([1, 0]), reduction="sum").item())
    # A soft (SE) label 0.25 weighs both: 0.25 x CE(right) + 0.75 x CE(wrong).
    soft = soft_cross_entropy(classification_log_probs(two[:1]), torch.tensor([0.25]))
    ce = [torch.nn.functional.cross_entropy(two[:1], torch.tensor([c])).item() for c in (1, 0)]
    assert soft.item() == pytest.approx(0.25 * ce[0] + 0.75 * ce[1])


def test_a_tag_goes_after_each_steps_text_before_its_newline():
    assert tagged_steps("a\n\nb \nc", "#") == ("a#\n\nb #\nc#", [1, 6, 9])
    assert tagged_steps("a\n", "<t>") == ("a<t>\n", [3])


# --- models of each layout ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prms(tiny_policy_dir, tmp_path_factory):
    """A fresh PRM of each layout on the tiny policy, saved with its layout recorded, and the same models saved as a
    published PRM is (no igrpo.json: `init/<head>`)."""
    root = tmp_path_factory.mktemp("prm-heads")
    for head, layout in LAYOUTS.items():
        torch.manual_seed(0)
        model, tok = reward_model_from_policy(str(tiny_policy_dir), "prm", layout)
        save_reward_model(model, tok, root / head, "prm", layout)
        model.save_pretrained(root / "init" / head)
        tok.save_pretrained(root / "init" / head)
    return root


def by_hand(path, head: str) -> list[list[float]]:
    """Each sample's step scores computed here from the model's logits with the layout's formula, written out."""
    model, tok, _ = load_reward_model(path, expect="prm", layout=LAYOUTS[head])  # a published PRM: in `head`'s
    model.eval()
    layout, out = LAYOUTS[head], []
    for prompt, completion in zip(PROMPTS, COMPLETIONS):
        text = prompt + (tagged_steps(completion, layout.step_tag)[0] if layout.step_tag else completion)
        ids = tok(text, return_tensors="pt").input_ids  # (1, T)
        with torch.no_grad():
            logits = model(ids).logits[0].double()  # (T, C)
        if head == "value":  # at each step's closing newline in the completion, and at its last character
            start = len(tok(prompt).input_ids)
            at = [i for i in range(start, ids.shape[1]) if ids[0, i] == tok.convert_tokens_to_ids("\n")]
            out.append(torch.sigmoid(logits[at + [ids.shape[1] - 1], 0]).tolist())
            continue
        at = ids[0] == tok.convert_tokens_to_ids(layout.step_tag)
        if head == "label_tokens":  # e^l+ / (e^l+ + e^l-)
            plus, minus = (logits[at, tok.convert_tokens_to_ids(t)] for t in layout.label_tokens)
            out.append((plus.exp() / (plus.exp() + minus.exp())).tolist())
        else:  # e^l1 / (e^l0 + e^l1)
            out.append((logits[at, 1].exp() / logits[at].exp().sum(-1)).tolist())
    return out


@pytest.mark.parametrize("head", list(LAYOUTS))
def test_the_scorer_reads_each_layouts_formula_from_the_checkpoint(prms, head):
    from pipeline.config import RewardModelConfig
    from pipeline.reward_model import load_scorer

    # The config asks for the value head: the checkpoint's recorded layout is what is read.
    scorer = load_scorer("prm", prms / head, RewardModelConfig())
    steps = scorer.step_scores(PROMPTS, COMPLETIONS)
    assert [len(s) for s in steps] == [3, 2]  # one score per step, in every layout
    for got, want in zip(steps, by_hand(prms / head, head)):
        assert got == pytest.approx(want, abs=1e-6)


def test_a_fresh_label_token_prm_is_the_policys_causal_lm_with_the_tag_added(tiny_policy_dir, prms):
    from models import char_tokenizer, load_policy

    model, tok, kind = load_reward_model(prms / "label_tokens")
    policy, _ = load_policy(str(tiny_policy_dir))
    assert kind == "prm" and type(model).__name__ == "LlamaForCausalLM"
    assert len(tok) == len(char_tokenizer()) + 1 and tok.convert_tokens_to_ids("ки") == len(tok) - 1
    # The LM head is the policy's (its rows for the old vocabulary), not a new one.
    assert torch.equal(model.lm_head.weight[: len(char_tokenizer())], policy.lm_head.weight)
    recorded = json.loads((prms / "label_tokens" / "igrpo.json").read_text())
    assert recorded["layout"] == {"head": "label_tokens", "step_tag": "ки", "label_tokens": ["+", "-"]}


@pytest.mark.parametrize(("kind", "tag"), [("bpe", "§"), ("metaspace", "ed"), ("char", "ки"), ("bpe", "<extra_0>")])
def test_a_fresh_prms_tag_stays_its_own_token_after_any_step_ending(tmp_path, kind, tag):
    """A step tag in the policy's vocabulary that merges with the text before it ('§' after a space in SmolLM2's
    byte-level BPE, 'ed' after letters) is added as a token of its own, as a missing tag is, so every step of
    every text is read at the tag. Before, only a tag missing from the vocabulary was added, and scoring stopped
    after the PRM had trained ("merges with the text around it"), at the first step ending in a space."""
    from pipeline.rm_kinds.heads import StepReader
    from tests.tokenizer_cases import PROMPT, TEXTS, save_tiny_policy, tokenizer_of

    tok = tokenizer_of(kind)
    save_tiny_policy(tok, tmp_path / "policy")
    layout = PrmLayout("classification", tag)
    model, prm_tok = reward_model_from_policy(str(tmp_path / "policy"), "prm", layout)
    reader = StepReader.build(layout, prm_tok)  # before: built, then raised in `tokens` on "Answer: 20 "
    for text in TEXTS:
        placed, reads = reader.place(PROMPT, text)
        enc = prm_tok(placed, return_offsets_mapping=True)
        idx = reader.tokens(enc["offset_mapping"], enc["input_ids"], reads)
        assert [enc["input_ids"][i] for i in idx] == [reader.tag_id] * len(reads), (kind, tag, text)
    assert model.get_input_embeddings().num_embeddings >= len(prm_tok)


def test_an_init_prm_whose_tokenizer_merges_the_tag_fails_the_preflight(tmp_path):
    """A PRM checkpoint given as `reward_model.init` whose tokenizer holds the tag but merges it with a space
    before it: one preflight error naming the tag, before any work (its scores would be read at the wrong token)."""
    from tests.tokenizer_cases import save_tiny_policy, smollm2_tokenizer

    init = tmp_path / "merging"
    save_tiny_policy(smollm2_tokenizer(), init)
    cfg = config_from_dict(mini_config(tmp_path, reward_model={"head": "label_tokens", "step_tag": "§",
                                                               "init": str(init)}), check_trl=False)
    assert re.match(rf"reward_model.init: {re.escape(str(init))}: reward_model.step_tag '§' merges with the text "
                    "before it", preflight_error(cfg)), preflight_error(cfg)


# --- through the reward-model phase ---------------------------------------------------------------------------


def shard_rows(round_: int) -> list[dict]:
    """Three prompts, a right and a wrong solution each (the wrong one's last step labelled wrong)."""
    rows = []
    for k in range(3):
        for j, ok in enumerate((1, 0)):
            answer = "221" if ok else "212"
            rows.append(make_row(round_, 2 * k + j, prompt_id=f"r{round_}-{k}", outcome=ok, answer=answer,
                                 completion=f"13 x 17 = 13 x 10 + 13 x 7\n= 130 + 91\nAnswer: {answer}",
                                 steps=["13 x 17 = 13 x 10 + 13 x 7", "= 130 + 91", f"Answer: {answer}"],
                                 he_labels=[1, 1, ok], se_labels=[1.0, 0.75, float(ok)], gold_labels=[1, 1, ok]))
    return rows


def phase_config(tmp_path, **reward_model):
    from pipeline.replay import write_shard
    from pipeline.rundir import RunDir

    for r in (0, 1):
        write_shard(shard_rows(r), RunDir(tmp_path).shard(r))
    rm = {"kinds": ["prm"], "holdout_fraction": 0.34, "train_args": ONE_STEP, **reward_model}
    return config_from_dict(mini_config(tmp_path, reward_model=rm), check_trl=False)


def weights(path, head: str | None = None) -> dict[str, torch.Tensor]:
    """A PRM's weights; `head`: the layout of one saved with none recorded."""
    return dict(load_reward_model(path, "prm", LAYOUTS[head] if head else None)[0].state_dict())


@pytest.mark.parametrize("head", list(LAYOUTS))
def test_one_training_step_of_each_layout_in_the_reward_model_phase(tmp_path, tiny_policy_dir, prms, head):
    from pipeline.reward_model import run_reward_model_phase
    from pipeline.rm_kinds.loading import reward_model_layout

    cfg = phase_config(tmp_path, head=head)
    res = run_reward_model_phase(cfg, tmp_path, 0, tiny_policy_dir)
    path = res.paths["prm"]
    assert reward_model_layout(path) == LAYOUTS[head]
    # Seeded as `prms` was (run.seed 0): the trained weights moved away from the fresh ones.
    before, after = weights(prms / head), weights(path)
    assert before.keys() == after.keys() and any(not torch.equal(before[k], after[k]) for k in before)
    # Evaluated on the held-out prompt with the layout's scorer, after the reload.
    assert math.isfinite(res.metrics["prm/mean_score"]) and 0 < res.metrics["prm/mean_score"] < 1
    for got, want in zip(load_scorer_of(path).step_scores(PROMPTS, COMPLETIONS), by_hand(path, head)):
        assert got == pytest.approx(want, abs=1e-6)


def load_scorer_of(path):
    from pipeline.config import RewardModelConfig
    from pipeline.reward_model import load_scorer

    return load_scorer("prm", path, RewardModelConfig())


@pytest.mark.parametrize("head", list(LAYOUTS))
def test_a_checkpoint_of_each_layout_is_round_0s_prm_as_it_is(tmp_path, tiny_policy_dir, prms, head):
    from pipeline.preflight import CHECKS
    from pipeline.reward_model import run_reward_model_phase
    from pipeline.rm_kinds.loading import reward_model_layout

    init = prms / "init" / head  # saved as a published PRM is: no igrpo.json, the layout is the config's
    cfg = phase_config(tmp_path, head=head, init=str(init))
    assert CHECKS["reward_model.head"](cfg).startswith(f"head {head}")
    res = run_reward_model_phase(cfg, tmp_path, 0, tiny_policy_dir)
    path = res.paths["prm"]
    assert path == tmp_path / "round-000" / "reward_model" / "prm" and reward_model_layout(path) == LAYOUTS[head]
    assert all(torch.equal(a, b) for a, b in zip(weights(init, head).values(), weights(path).values()))  # not trained
    # It scores (GRPO's process rewards, best-of-N and the vote all go through load_scorer) in its own layout.
    for got, want in zip(load_scorer_of(path).step_scores(PROMPTS, COMPLETIONS), by_hand(init, head)):
        assert got == pytest.approx(want, abs=1e-6)


def test_round_1_trains_the_init_prm_further_in_its_own_layout(tmp_path, tiny_policy_dir, prms):
    from pipeline.reward_model import run_reward_model_phase
    from pipeline.rm_kinds.loading import reward_model_layout

    cfg = phase_config(tmp_path, head="label_tokens", init=str(prms / "init" / "label_tokens"))
    r0 = run_reward_model_phase(cfg, tmp_path, 0, tiny_policy_dir)
    r1 = run_reward_model_phase(cfg, tmp_path, 1, tiny_policy_dir, {"prm": str(r0.paths["prm"])})
    assert reward_model_layout(r1.paths["prm"]) == LAYOUTS["label_tokens"]
    before, after = weights(r0.paths["prm"]), weights(r1.paths["prm"])
    assert any(not torch.equal(before[k], after[k]) for k in before)


# --- bad input: one error before any work ---------------------------------------------------------------------


@pytest.mark.parametrize("reward_model, expected", [
    ({"head": "value_tokens"}, "reward_model.head: .*unknown PRM head 'value_tokens'; known: value, label_tokens"),
    ({"kinds": ["orm"], "head": "label_tokens"}, "head: only prm has a PRM layout"),
    ({"kinds": ["orm"], "init": "./prm"}, "init: only prm has a PRM layout"),
    ({"step_tag": "ки"}, "step_tag: head 'value' puts no tag after a step"),
    ({"head": "classification", "label_tokens": ["+", "-"]}, "label_tokens: head 'classification' reads no label"),
    ({"head": "label_tokens", "label_tokens": ["+"]}, r"label_tokens: \['\+'\] must be two different tokens"),
    ({"head": "label_tokens", "step_tag": "-"}, "step_tag '-' is also a label token"),
    ({"init": "tiny"}, "init: .*'tiny' is an untrained model"),
])
def test_a_bad_layout_is_one_config_error(tmp_path, reward_model, expected):
    with pytest.raises(ConfigError, match=expected):
        config_from_dict(mini_config(tmp_path, reward_model=reward_model), check_trl=False)


def preflight_error(cfg) -> str:
    from pipeline.preflight import CHECKS

    with pytest.raises(ValueError) as info:
        CHECKS["reward_model.head"](cfg)
    return str(info.value)


def test_label_tokens_that_are_not_one_token_fail_the_preflight(tmp_path):
    cfg = config_from_dict(mini_config(tmp_path, reward_model={"head": "label_tokens", "label_tokens": ["ok", "no"]}),
                           check_trl=False)
    assert "reward_model.label_tokens" in preflight_error(cfg) and "'ok' is not one token" in preflight_error(cfg)


def test_an_init_prm_whose_tokenizer_lacks_the_tag_fails_the_preflight(tmp_path, tiny_policy_dir):
    from transformers import AutoModelForTokenClassification

    from models import char_tokenizer

    init = tmp_path / "no-tag"  # a 2-class PRM whose tokenizer has no <extra_0>
    AutoModelForTokenClassification.from_pretrained(str(tiny_policy_dir), num_labels=2).save_pretrained(init)
    char_tokenizer().save_pretrained(init)
    cfg = config_from_dict(mini_config(tmp_path, reward_model={"head": "classification", "init": str(init)}),
                           check_trl=False)
    assert preflight_error(cfg).startswith(f"reward_model.init: {init}: reward_model.step_tag '<extra_0>' is not one token")


@pytest.mark.parametrize("init, head, expected", [
    ("label_tokens", "classification", "has another layout: head 'classification' \\(its igrpo.json: 'label_tokens'\\)"),
    ("init/label_tokens", "classification", "holds a LlamaForCausalLM, but head 'classification' needs token "
                                            "classification with 2 labels"),
    ("init/value", "classification", "holds a LlamaForTokenClassification with 1 labels, but head 'classification'"),
    ("init/classification", "label_tokens", "needs a causal LM"),
])
def test_an_init_prm_of_another_layout_fails_the_preflight(tmp_path, prms, init, head, expected):
    cfg = config_from_dict(mini_config(tmp_path, reward_model={"head": head, "init": str(prms / init)}),
                           check_trl=False)
    error = preflight_error(cfg)
    assert error.startswith("reward_model.init:")
    assert re.search(expected, error), error


def test_an_orm_as_init_fails_the_preflight(tmp_path, tiny_policy_dir):
    save_reward_model(*reward_model_from_policy(str(tiny_policy_dir), "orm"), tmp_path / "orm", "orm")
    cfg = config_from_dict(mini_config(tmp_path, reward_model={"init": str(tmp_path / "orm")}), check_trl=False)
    assert preflight_error(cfg) == f"reward_model.init: {tmp_path / 'orm'} is an ORM, not a PRM (a kind that scores steps)"


def test_a_label_token_prm_gives_grpo_its_step_rewards(tmp_path, tiny_policy_dir, prms):
    """Process mode with a Math-Shepherd-layout PRM: one real GRPO step, the PRM scoring TRL's completions in its
    layout (tags put in, P('+') read), every token's advantage finite and not all alike."""
    from models import char_tokenizer
    from tests.helpers import run_grpo

    tok = char_tokenizer()
    texts = ["6*12=72\nAnswer: 72", "6*12=70\nAnswer: 70", "Answer: 72", "6+6=12\n12*6=72\nAnswer: 72"] * 2
    rows = [tok(t, add_special_tokens=False).input_ids + [tok.eos_token_id] for t in texts]
    scorer, scored = load_scorer_of(prms / "label_tokens"), []
    step_scores = scorer.step_scores

    def recording(prompts, completions):
        steps = step_scores(prompts, completions)
        scored.extend(zip(completions, steps))
        return steps

    scorer.step_scores = recording
    run = run_grpo(tok, tiny_policy_dir, tmp_path / "grpo", rows, "process", scorer)
    assert sorted(c for c, _ in scored) == sorted(texts)
    assert all(len(s) == t.count("\n") + 1 for t, s in scored)  # one P('+') per step
    advantages = run["advantages"][run["mask"].bool()]
    assert torch.isfinite(advantages).all() and advantages.std() > 0
