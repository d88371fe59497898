"""The step convention, reward functions (the registry) and their checks, the batched ORM/PRM scorers on a tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from models import char_tokenizer, load_reward_model, reward_model_from_policy, save_model
from pipeline.policy import completion_steps, dedupe_steps
from pipeline.problems import EmbeddedArithmetic
from pipeline.rewards import (
    REWARD_FUNCS,
    RewardError,
    active_rewards,
    build_reward_func,
    checked,
    reward_spec,
    scorer_reward,
    verifier_reward,
    weighted_mix,
)
from pipeline.scorers import OrmScorer, PrmScorer, Scores, aggregate
from pipeline.steps import (
    char_to_token_ends,
    scored_step_ends,
    split_steps,
    step_char_ends,
    step_spans,
    token_char_ends,
)

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


# --- steps --------------------------------------------------------------------------------------------


def test_step_spans_edge_cases():
    assert step_spans("12*3=36") == [(0, 6)]  # no newline: one step ending at its last character
    assert step_spans("") == [] and step_spans("  \n\t\n") == []  # blank: no steps
    assert step_spans("a\n") == [(0, 1)]  # a trailing newline closes the step
    assert step_spans("a\nb") == [(0, 1), (2, 2)]  # the last step ends at its last character
    assert step_spans("\n\nab\n\ncd") == [(2, 4), (6, 7)]  # blank lines are skipped, not steps
    assert step_spans(" \nx") == [(2, 2)]  # a whitespace-only line is blank


def test_step_char_ends():
    text = "7+5=12\n\n12*3=36\nAnswer: 36"
    assert split_steps(text) == ["7+5=12", "12*3=36", "Answer: 36"]
    # Ends: the newline at 6 (the blank line at 7 is skipped), the newline at 15, the last character 25.
    assert step_char_ends(text) == [6, 15, 25]
    assert step_char_ends("") == []


def test_scored_step_ends_always_gives_one():
    assert scored_step_ends("a\nb\n") == [1, 3]
    assert scored_step_ends("") == [-1]  # the prompt's last character
    assert scored_step_ends("  ") == [1]  # the last character of a blank completion


def test_char_to_token_ends_multi_char_tokens():
    # Tokens "12" "*3=" "36\n" "Ans" "wer: 36": character spans laid end to end.
    offsets = token_char_ends(["12", "*3=", "36\n", "Ans", "wer: 36"])
    assert offsets == [(0, 2), (2, 5), (5, 8), (8, 11), (11, 18)]
    # The step ends at the newline (character 7, inside token 2) and at the last character (17, token 4).
    assert char_to_token_ends(offsets, [7, 17]) == [2, 4]
    # A token covering two step ends keeps both: "a\nb\n" as one token.
    assert char_to_token_ends([(0, 4), (4, 5)], [1, 3, 4]) == [0, 0, 1]


def test_char_to_token_ends_skips_special_tokens():
    # A BOS token with span (0, 0) must not be chosen for character 0; the real tokens follow it.
    offsets = [(0, 0), (0, 1), (1, 2), (2, 3)]
    assert char_to_token_ends(offsets, [0, 2]) == [1, 3]
    with pytest.raises(ValueError, match="no token covers"):
        char_to_token_ends([(0, 0)], [0])


def test_completion_steps_and_dedupe():
    tok = char_tokenizer()
    ids = lambda text: tok(text).input_ids  # noqa: E731
    # One char per token: ends are the character ends; the eos is counted in the length, not a step.
    assert completion_steps(tok, ids("1=1\nA\n") + [tok.eos_token_id], 7).ends == [3, 5]
    # Padding after the length is not read.
    assert completion_steps(tok, ids("12\n3") + [tok.pad_token_id] * 3, 4).ends == [2, 3]
    # Two steps ending in one token: the token repeats, and dedupe keeps the later step's score.
    assert dedupe_steps([0.2, 0.7, 0.4], [0, 0, 1]) == ([0.7, 0.4], [0, 1])
    # Blank completions are one step at their last token (so even an empty answer is judged).
    assert completion_steps(tok, [tok.eos_token_id], 1).ends == [0]
    assert completion_steps(tok, ids(" \n") + [tok.eos_token_id], 3).ends == [1]
    # A masked completion (length 0) has no steps and no text.
    assert completion_steps(tok, ids("1=1\n"), 0).ends == []


# --- reward functions ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def arithmetic():
    return EmbeddedArithmetic(num_train=20, num_test=5, seed=3)


def test_verifier_reward_on_arithmetic(arithmetic):
    verifier = verifier_reward(arithmetic)
    p = arithmetic.train[0]
    wrong = str(int(p.answer) + 1)
    completions = [p.solution, f"Answer: {wrong}", "no answer line", f"Answer: 0{p.answer}", f"Answer: {p.answer}.5"]
    rewards = verifier(completions, prompt=[p.prompt] * 5, answer=[p.answer] * 5, prompt_id=[p.id] * 5)
    # gold solution: 1; wrong answer: 0; no answer: 0; a leading zero is the same integer: 1; not an integer: 0.
    assert rewards == [1.0, 0.0, 0.0, 1.0, 0.0]
    # The last Answer line is the one judged.
    assert verifier([f"Answer: {wrong}\nAnswer: {p.answer}"], answer=[p.answer]) == [1.0]


def test_verifier_reward_across_problems(arithmetic):
    verifier = verifier_reward(arithmetic)
    probs = arithmetic.train[:4]
    # Each problem's gold solution against its own answer is right, against the next problem's is wrong
    # (unless two answers coincide, which the expected list accounts for).
    completions = [p.solution for p in probs]
    shifted = [probs[(i + 1) % 4].answer for i in range(4)]
    expected = [float(p.answer == a) for p, a in zip(probs, shifted)]
    assert verifier(completions, answer=[p.answer for p in probs]) == [1.0] * 4
    assert verifier(completions, answer=shifted) == expected


def test_checked_passes_good_values_through():
    f = checked(lambda c, **k: [1, 0.5, None], "mine")
    assert f(["a", "b", "c"]) == [1.0, 0.5, None]  # ints become floats; None (TRL: no reward) is kept
    assert f.__name__ == "mine"


def test_checked_names_a_raising_function():
    def broken(completions, **kwargs):
        raise KeyError("answer")

    with pytest.raises(RewardError, match=r"reward function 'broken' raised on a batch of 2: KeyError\('answer'\)"):
        checked(broken)(["a", "b"])


def test_checked_wrong_length():
    with pytest.raises(RewardError, match=r"reward function 'short' returned 1 rewards for 3 completions"):
        checked(lambda c, **k: [1.0], "short")(["a", "b", "c"])


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_checked_non_finite_names_the_sample(bad):
    f = checked(lambda c, **k: [0.0, bad, 1.0], "len_reward")
    with pytest.raises(RewardError, match=rf"reward function 'len_reward' returned {bad} for sample 1 \('x\\\\ny'\)"):
        f(["a", "x\ny", "c"])


def _raises(completions, **kwargs):
    raise KeyError("answer")


@pytest.mark.parametrize(
    ("func", "expected"),
    [
        (_raises, r"reward function 'f' raised on a batch of 3: KeyError\('answer'\); "
                  r"called alone, sample 0 \('a'\) raises KeyError\('answer'\)$"),
        (lambda c, **k: [1.0] * (len(c) - 1), r"reward function 'f' returned 2 rewards for 3 completions"),
        (lambda c, **k: [0.0, math.nan, 1.0], r"reward function 'f' returned nan for sample 1 \('b\\\\nc'\)"),
        (lambda c, **k: [0.0, 1.0, math.inf], r"reward function 'f' returned inf for sample 2 \('d'\)"),
        (lambda c, **k: [-math.inf, 1.0, 1.0], r"reward function 'f' returned -inf for sample 0 \('a'\)"),
    ],
    ids=["raises", "wrong-length", "nan", "inf", "-inf"],
)
def test_bad_reward_function_names_function_and_sample(func, expected):
    with pytest.raises(RewardError, match=expected):
        checked(func, "f")(["a", "b\nc", "d"])


@pytest.mark.parametrize(
    ("returned", "shown"),
    [
        (None, r"None, not a list of one reward per completion \(a missing return\?\)"),  # forgot `return`
        (0.5, r"0\.5 \(float\), not a list of one reward per completion"),  # one number for the whole batch
        ("good", r"'good' \(str\), not a list"),  # list("good") would be four characters
        ({"a": 1.0, "b": 0.0, "c": 1.0}, r"\{'a': 1\.0, .*\} \(dict\), not a list"),  # list(dict): its keys
    ],
    ids=["none", "scalar", "str", "dict"],
)
def test_checked_a_non_list_names_the_function(returned, shown):
    with pytest.raises(RewardError, match=rf"^reward function 'f' returned {shown}"):
        checked(lambda c, **k: returned, "f")(["a", "b\nc", "d"])


@pytest.mark.parametrize(
    ("bad", "shown"),
    [
        ("good", r"'good'"),
        ("0.5", r"'0\.5'"),  # float() would take it: a reward is a number, not its text
        ([1.0], r"\[1\.0\]"),  # nested lists
        ({"r": 1.0}, r"\{'r': 1\.0\}"),
        (1j, r"1j"),
        (10**400, r"1000+\.\.\.0+"),  # beyond float's range; the preview is cut
    ],
    ids=["str", "numeric-str", "nested", "dict", "complex", "huge-int"],
)
def test_checked_a_non_number_names_function_and_sample(bad, shown):
    expected = rf"reward function 'f' returned {shown} for sample 1 \('b\\\\nc'\), not a float or None: "
    with pytest.raises(RewardError, match=expected):
        checked(lambda c, **k: [0.0, bad, 1.0], "f")(["a", "b\nc", "d"])


def test_checked_takes_bools_and_numpy_as_numbers():
    np = pytest.importorskip("numpy")
    assert checked(lambda c, **k: [True, False, None], "f")(["a", "b", "c"]) == [1.0, 0.0, None]
    assert checked(lambda c, **k: np.array([0.5, 1.0]), "f")(["a", "b"]) == [0.5, 1.0]


def test_checked_names_the_sample_a_raising_function_fails_on():
    # The function fails on row 2's answer; called on each row alone (its columns sliced to that row, other
    # kwargs as they are) it raises on row 2 first, so the error names that sample, not just the batch.
    seen = []

    def parse(completions, answer, trainer_state, **kwargs):
        seen.append((list(completions), list(answer), trainer_state))
        return [float(int(a) == len(c)) for c, a in zip(completions, answer)]

    state = {"global_step": 3}
    with pytest.raises(RewardError, match=r"reward function 'parse' raised on a batch of 4: ValueError\(.*'two'.*\); "
                       r"called alone, sample 2 \('xy'\) raises ValueError\(.*'two'.*\)$"):
        checked(parse)(["a", "b", "xy", "z"], answer=["1", "1", "two", "x"], trainer_state=state)
    # The batch, then rows 0, 1, 2 alone: stops at the first that raises.
    alone = [(["a"], ["1"], state), (["b"], ["1"], state), (["xy"], ["two"], state)]
    assert seen == [(["a", "b", "xy", "z"], ["1", "1", "two", "x"], state)] + alone


def test_checked_keeps_the_batch_message_when_no_sample_raises_alone():
    # Raises on a batch of more than one only: no sample is to blame, so the batch is named.
    def pairs_only(completions, **kwargs):
        if len(completions) > 1:
            raise KeyError("no parse for row 1")
        return [0.5]

    batch_only = r"reward function 'pairs_only' raised on a batch of 3: KeyError\('no parse for row 1'\)$"
    with pytest.raises(RewardError, match=batch_only):
        checked(pairs_only)(["a", "b", "c"])


def test_weighted_mix(arithmetic):
    p = arithmetic.train[0]
    verifier = verifier_reward(arithmetic)
    length = lambda completions, **k: [len(c) / 10 for c in completions]
    mix = weighted_mix({"verifier": verifier, "length": length}, {"verifier": 1.0, "length": 0.5})
    completions = [p.solution, "Answer: x"]
    # 1 * verifier + 0.5 * length/10: the gold solution 1 + 0.05 * len, the wrong one 0 + 0.05 * 9.
    expected = [1.0 + 0.05 * len(p.solution), 0.05 * 9]
    assert mix(completions, answer=[p.answer] * 2) == pytest.approx(expected, abs=1e-12)


def test_weighted_mix_checks_each_part():
    mix = weighted_mix({"ok": lambda c, **k: [1.0] * len(c), "nan": lambda c, **k: [math.nan] * len(c)}, {"ok": 1, "nan": 1})
    with pytest.raises(RewardError, match="reward function 'nan' returned nan for sample 0"):
        mix(["a"])


# --- the registry -----------------------------------------------------------------------------------------


def test_unknown_reward_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown reward function 'length'; known: verifier, orm"):
        reward_spec("length")


def test_active_rewards_by_mode():
    # Outcome: the verifier first and always (its accuracy is logged at weight 0 too), then every other
    # reward of positive weight, in the registry's order, whatever the order of the config's mapping.
    assert active_rewards("outcome", {"verifier": 1.0}) == {"verifier": 1.0}
    assert list(active_rewards("outcome", {"orm": 0.5, "verifier": 1.0}).items()) == [("verifier", 1.0), ("orm", 0.5)]
    assert active_rewards("outcome", {"orm": 1.0}) == {"verifier": 0.0, "orm": 1.0}
    assert active_rewards("outcome", {"verifier": 1.0, "orm": 0.0}) == {"verifier": 1.0}  # weight 0: not run
    # Process and rft: the verifier alone at weight 1 (process logs it; rft's advantage is its column 0).
    assert active_rewards("process", {"verifier": 0.3, "orm": 1.0}) == {"verifier": 1.0}
    assert active_rewards("rft", {"verifier": 0.3}) == {"verifier": 1.0}
    # Hybrid: its outcome term is TRL's advantage of the weighted rewards, as in outcome mode.
    assert active_rewards("hybrid", {"orm": 0.5, "verifier": 1.0}) == {"verifier": 1.0, "orm": 0.5}
    assert active_rewards("hybrid", {"orm": 1.0}) == {"verifier": 0.0, "orm": 1.0}


def test_scorer_reward_takes_trl_prompts_or_the_prompt_column():
    joined = scorer_reward(lambda prompts, completions: [float(len(p + c)) for p, c in zip(prompts, completions)])
    assert joined(["ab", "c"], prompts=["x", "yz"]) == [3.0, 3.0]
    assert joined(["ab", "c"], prompt=["xyz", ""]) == [5.0, 1.0]


def test_a_new_reward_is_one_registry_entry(monkeypatch, arithmetic):
    # What a contributor does to add a reward: a factory and an entry. The config then accepts its name,
    # GRPO gets it after the verifier with its weight, and it is checked like every reward.
    from pipeline.loading import config_from_dict
    from pipeline.policy import build_reward_funcs
    from pipeline.rewards import RewardSpec

    def brevity(problem_set, scorers):
        return lambda completions, **kwargs: [1.0 / (1 + len(c)) for c in completions]

    monkeypatch.setitem(REWARD_FUNCS, "brevity", RewardSpec(brevity))
    cfg = config_from_dict({"supervision": {"mode": "outcome", "rewards": {"brevity": 0.5, "verifier": 1.0}}},
                           check_trl=False)
    funcs, weights = build_reward_funcs(cfg, arithmetic, scorers={})
    assert [f.__name__ for f in funcs] == ["verifier", "brevity"] and weights == [1.0, 0.5]
    p = arithmetic.train[0]
    assert funcs[1](["abc", ""], answer=[p.answer] * 2) == [0.25, 1.0]
    monkeypatch.setitem(REWARD_FUNCS, "brevity", RewardSpec(lambda ps, sc: lambda c, **k: [math.nan] * len(c)))
    funcs, _ = build_reward_funcs(cfg, arithmetic, scorers={})
    with pytest.raises(RewardError, match="reward function 'brevity' returned nan for sample 0"):
        funcs[1](["abc"])


def test_aggregate():
    assert aggregate([0.9, 0.5, 0.8]) == 0.5
    assert aggregate([0.9, 0.5, 0.8], "last") == 0.8
    assert aggregate([0.5, 0.5, 0.5], "product") == pytest.approx(0.125)
    with pytest.raises(ValueError, match="aggregation must be one of min, last, product; got 'mean'"):
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


def test_verifier_without_answer_column_is_a_reward_error():
    # The verifier needs the answer column; without it the checked wrapper turns the crash into RewardError.
    verifier = checked(verifier_reward(EmbeddedArithmetic(num_train=2, num_test=2)), "verifier")
    with pytest.raises(RewardError, match="reward function 'verifier' raised"):
        verifier(["Answer: 3"])
