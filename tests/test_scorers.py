"""The batched ORM/PRM scorers (`pipeline/scorers.py`) on a tiny untrained model, and the aggregation of step
scores."""

from __future__ import annotations

import math

import pytest
import torch

from models import save_model
from pipeline.problems import EmbeddedArithmetic
from pipeline.rewards import RewardError, build_reward_func
from pipeline.rm_kinds.loading import load_reward_model, reward_model_from_policy
from pipeline.scorers import OrmScorer, PrmScorer, Scores, aggregate
from pipeline.steps import split_steps, step_char_ends

PROMPT = "7 +5 *3 -4\n"
COMPLETIONS = [
    "7+5=12\n12*3=36\n36-4=32\nAnswer: 32",  # 4 steps, the last without a newline
    "7+5=12\n\n12*3=35\n",  # a blank line between steps, a trailing newline: 2 steps
    "Answer: 32",  # one step, no newline
    "",  # blank: no steps, still one score (read at the prompt's last character)
    "   \n",  # whitespace only: no steps, one score
    "7+5=12\n12*3=36\n36-4=32\nAnswer: 32\n",
    "1\n2\n3\n4\n5\n6\n7\n8",  # 8 steps
    "12",
]


def test_aggregate():
    assert aggregate([0.9, 0.5, 0.8]) == 0.5
    assert aggregate([0.9, 0.5, 0.8], "last") == 0.8
    assert aggregate([0.5, 0.5, 0.5], "product") == pytest.approx(0.125)
    with pytest.raises(ValueError, match="^unknown aggregation 'mean'; known: min, last, product$"):
        aggregate([0.5], "mean")


# --- scorers on a tiny untrained model -----------------------------------------------------------------


@pytest.fixture(scope="module")
def prm(tiny_policy_dir):
    model, tok = reward_model_from_policy(str(tiny_policy_dir), "prm")
    torch.manual_seed(0)
    with torch.no_grad():
        model.score.weight.normal_(std=0.3)  # spread the logits (default init gives ~0.5 everywhere), not saturated
    return model.eval(), tok


def test_prm_one_score_per_step(prm):
    model, tok = prm
    scores = PrmScorer(model, tok, batch_size=8).step_scores([PROMPT] * len(COMPLETIONS), COMPLETIONS)
    assert [len(s) for s in scores] == [max(len(split_steps(c)), 1) for c in COMPLETIONS]
    assert [len(s) for s in scores] == [4, 2, 1, 1, 1, 4, 8, 1]
    assert all(0 < v < 1 for s in scores for v in s)


def test_prm_score_is_sigmoid_of_the_logit_at_the_step_end(prm):
    model, tok = prm
    scorer = PrmScorer(model, tok, batch_size=8)
    scores = scorer.step_scores([PROMPT] * len(COMPLETIONS), COMPLETIONS)
    for completion, got in zip(COMPLETIONS, scores):
        text = PROMPT + completion
        ids = tok(text, return_tensors="pt").input_ids
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :, 0]  # (T,), one token per character
        # The closing newline of each step (or its last character); for a blank completion the last
        # character of the prompt+completion text.
        positions = [len(PROMPT) + e for e in step_char_ends(completion)] or [len(text) - 1]
        for k, pos in enumerate(positions):
            if k < len(positions) - 1 or completion.endswith("\n"):
                assert text[pos] == "\n"
        expected = torch.sigmoid(logits[positions]).tolist()
        assert got == pytest.approx(expected, abs=1e-5)
    # Sanity: the scores are not all equal (the check above would be weak if the head were constant).
    flat = [v for s in scores for v in s]
    assert max(flat) - min(flat) > 0.05


def test_prm_scores_do_not_depend_on_batch_size(prm):
    model, tok = prm
    prompts = [PROMPT] * len(COMPLETIONS)
    one = PrmScorer(model, tok, batch_size=1).step_scores(prompts, COMPLETIONS)
    eight = PrmScorer(model, tok, batch_size=8).step_scores(prompts, COMPLETIONS)
    three = PrmScorer(model, tok, batch_size=3).step_scores(prompts, COMPLETIONS)
    for a, b, c in zip(one, eight, three):
        assert a == pytest.approx(b, abs=1e-5)
        assert a == pytest.approx(c, abs=1e-5)


def test_prm_call_aggregates(prm):
    model, tok = prm
    scorer = PrmScorer(model, tok)
    steps = scorer.step_scores([PROMPT] * 2, COMPLETIONS[:2])
    assert scorer([PROMPT] * 2, COMPLETIONS[:2]) == pytest.approx([min(s) for s in steps])
    assert scorer([PROMPT] * 2, COMPLETIONS[:2], aggregation="last") == pytest.approx([s[-1] for s in steps])
    # The scorer's own aggregation (what `reward_model.aggregation` sets through `load_scorer`).
    products = PrmScorer(model, tok, aggregation="product")([PROMPT] * 2, COMPLETIONS[:2])
    assert products == pytest.approx([math.prod(s) for s in steps], abs=1e-7)


def test_scores_give_the_solution_scores_with_the_step_scores_they_aggregate(prm, tiny_policy_dir):
    # One pass for both (the eval phase keeps the step scores for MLflow's sample tables).
    model, tok = prm
    prompts = [PROMPT] * len(COMPLETIONS)
    scorer = PrmScorer(model, tok, batch_size=3, aggregation="last")
    scores = scorer.scores(prompts, COMPLETIONS)
    for got, expected in zip(scores.steps, PrmScorer(model, tok).step_scores(prompts, COMPLETIONS), strict=True):
        assert got == pytest.approx(expected, abs=1e-6)
    assert scores.solutions == pytest.approx(scorer(prompts, COMPLETIONS), abs=1e-7)
    assert scores.solutions == pytest.approx([s[-1] for s in scores.steps], abs=1e-7)
    orm, orm_tok = reward_model_from_policy(str(tiny_policy_dir), "orm")
    orm_scores = OrmScorer(orm, orm_tok).scores(prompts[:2], COMPLETIONS[:2])
    assert orm_scores.steps is None
    assert orm_scores.solutions == pytest.approx(OrmScorer(orm, orm_tok)(prompts[:2], COMPLETIONS[:2]), abs=1e-7)
    # Per problem, then one list: the eval phase's order.
    both = Scores.concat([scorer.scores(prompts[:2], COMPLETIONS[:2]), scorer.scores(prompts[2:], COMPLETIONS[2:])])
    assert both.solutions == pytest.approx(scores.solutions, abs=1e-6) and len(both.steps) == len(COMPLETIONS)
    assert Scores.concat([orm_scores, orm_scores]) == Scores(orm_scores.solutions * 2)


def test_orm_scorer_length_range_and_batching(tiny_policy_dir):
    model, tok = reward_model_from_policy(str(tiny_policy_dir), "orm")
    with torch.no_grad():
        model.score.weight.normal_(std=0.3)
    prompts = [PROMPT] * len(COMPLETIONS)
    one = OrmScorer(model, tok, batch_size=1)(prompts, COMPLETIONS)
    many = OrmScorer(model, tok, batch_size=8)(prompts, COMPLETIONS)
    assert len(one) == len(COMPLETIONS)
    assert all(0 < v < 1 for v in one)
    # Right padding in the batch: the ORM reads the last real token of each row, so batching changes nothing.
    assert one == pytest.approx(many, abs=1e-5)
    # As the registry's `orm` reward: the prompt column arrives as a keyword.
    orm = build_reward_func("orm", EmbeddedArithmetic(num_train=2, num_test=2), {"orm": OrmScorer(model, tok)})
    assert orm.__name__ == "orm"  # what TRL logs it as
    assert orm(COMPLETIONS, prompt=prompts) == pytest.approx(one, abs=1e-5)
    # As GRPOTrainer calls it: the prompts arrive as `prompts`, not as the `prompt` column.
    assert orm(COMPLETIONS, prompts=prompts) == pytest.approx(one, abs=1e-5)


def test_load_scorer_gives_one_solution_score_per_completion_for_every_kind(prm, tiny_policy_dir, tmp_path):
    # The one way phases score with a checkpoint: `load_scorer(kind, path, reward_model config)`. A PRM's
    # solution score is its steps aggregated by `reward_model.aggregation`; an ORM's is its sigmoid.
    from pipeline.config import RewardModelConfig
    from pipeline.reward_model import load_scorer
    from pipeline.rm_kinds import RM_KINDS

    assert list(RM_KINDS)[:2] == ["prm", "orm"]  # the built-in kinds, in the table's order
    model, tok = prm
    save_model(model, tok, tmp_path / "prm")
    orm, orm_tok = reward_model_from_policy(str(tiny_policy_dir), "orm")
    with torch.no_grad():
        orm.score.weight.normal_(std=0.3)
    save_model(orm, orm_tok, tmp_path / "orm")
    prompts = [PROMPT] * len(COMPLETIONS)
    steps = PrmScorer(model, tok).step_scores(prompts, COMPLETIONS)
    for how, expected in (("min", [min(s) for s in steps]), ("last", [s[-1] for s in steps])):
        scorer = load_scorer("prm", tmp_path / "prm", RewardModelConfig(aggregation=how), batch_size=3)
        assert scorer(prompts, COMPLETIONS) == pytest.approx(expected, abs=1e-6)
    scorer = load_scorer("orm", tmp_path / "orm", RewardModelConfig())
    assert scorer(prompts, COMPLETIONS) == pytest.approx(OrmScorer(orm, orm_tok)(prompts, COMPLETIONS), abs=1e-6)
    with pytest.raises(ValueError, match="is an ORM but a PRM is needed here"):
        load_scorer("prm", tmp_path / "orm", RewardModelConfig())
    with pytest.raises(ValueError, match="unknown reward model kind 'value'; known: prm, orm"):
        load_scorer("value", tmp_path / "orm", RewardModelConfig())


def test_prm_with_nan_weights_names_the_sample(tiny_policy_dir):
    model, tok = reward_model_from_policy(str(tiny_policy_dir), "prm")
    # Poison only the embedding of '#': only a completion containing it (sample 2) becomes NaN,
    # so the error must point at that sample, not at the first of the batch.
    with torch.no_grad():
        model.model.embed_tokens.weight[tok.convert_tokens_to_ids("#")] = math.nan
    completions = ["7+5=12\n", "Answer: 32", "7+5=#\nAnswer: 1", "12\n"]
    with pytest.raises(RewardError, match=r"PRM returned nan for sample 2 \('7\+5=#\\\\nAnswer: 1'\)"):
        PrmScorer(model, tok, batch_size=2).step_scores([PROMPT] * 4, completions)
    # All weights NaN: the very first sample is reported.
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(math.nan)
    with pytest.raises(RewardError, match="PRM returned nan for sample 0 .*the reward model is broken"):
        PrmScorer(model, tok).step_scores([PROMPT], ["7+5=12"])


def test_prm_emitting_nan_names_the_sample(tiny_dirs):
    model, tok, _ = load_reward_model(tiny_dirs / "prm", expect="prm")
    with torch.no_grad():  # only '#' is poisoned: only the completion holding it goes NaN
        model.model.embed_tokens.weight[tok.convert_tokens_to_ids("#")] = math.nan
    completions = ["1+1=2\n", "Answer: 2", "1+1=#\nAnswer: 2"]
    with pytest.raises(RewardError, match=r"PRM returned nan for sample 2 \('1\+1=#\\\\nAnswer: 2'\)"):
        PrmScorer(model, tok, batch_size=2).step_scores(["1+1\n"] * 3, completions)


def test_blank_completion_gets_a_score_at_the_prompt_end(prm):
    model, tok = prm
    # "" has no steps: its one score is read at the prompt's last character (its closing newline), i.e. the
    # last position of a forward pass over the prompt alone.
    blank = PrmScorer(model, tok).step_scores([PROMPT], [""])[0]
    with torch.no_grad():
        logit = model(input_ids=tok(PROMPT, return_tensors="pt").input_ids).logits[0, -1, 0]
    assert blank == pytest.approx([torch.sigmoid(logit).item()], abs=1e-6)


def test_grpo_scores_a_micro_batch_in_one_padded_forward_with_the_scores_of_smaller_batches(prm):
    """Issue 58, point 4: the GRPO phase loads its reward models with `scoring_batch_size` (a GRPO micro-batch's
    completions, or collection's larger batch), so a step's 8 completions are one padded forward where
    `collect.batch_size: 3` made three; the scores are those of the smaller batches to float rounding."""
    from pipeline.policy import scoring_batch_size

    model, tok = prm
    prompts, batch = [PROMPT] * len(COMPLETIONS), scoring_batch_size(3, len(COMPLETIONS))
    calls = [0]
    hook = model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        whole = PrmScorer(model, tok, batch_size=batch).step_scores(prompts, COMPLETIONS)
        assert calls == [1]
        chunked = PrmScorer(model, tok, batch_size=3).step_scores(prompts, COMPLETIONS)
        assert calls == [4]
    finally:
        hook.remove()
    assert [v for s in whole for v in s] == pytest.approx([v for s in chunked for v in s], abs=1e-6)


def test_the_prm_scores_in_bf16_where_reward_model_dtype_resolves_to_it(prm, tmp_path):
    """`reward_model.dtype: bfloat16` (`auto` on a CPU with AMX or AVX512-BF16): the PRM GRPO loads is in bf16, its
    logits read in float32, its scores those of float32 within bf16's rounding (~3 significant digits a logit)."""
    from pipeline.config import RewardModelConfig
    from pipeline.reward_model import load_scorer

    model, tok = prm
    save_model(model, tok, tmp_path / "prm")
    prompts, scores = [PROMPT] * len(COMPLETIONS), {}
    for dtype in ("float32", "bfloat16"):
        scorer = load_scorer("prm", tmp_path / "prm", RewardModelConfig(dtype=dtype), batch_size=len(COMPLETIONS))
        assert scorer.model.dtype == getattr(torch, dtype)
        scores[dtype] = [v for s in scorer.step_scores(prompts, COMPLETIONS) for v in s]
    assert scores["bfloat16"] == pytest.approx(scores["float32"], abs=0.02)
    assert scores["bfloat16"] != scores["float32"]  # bf16 did run
