"""Reward functions (`pipeline/rewards.py`): the verifier, the checks that name a bad function and sample, the
weighted mix, and the registry."""

from __future__ import annotations

import math

import pytest

from pipeline.problems import EmbeddedArithmetic
from pipeline.rewards import (
    REWARD_FUNCS,
    RewardError,
    active_rewards,
    checked,
    reward_spec,
    scorer_reward,
    verifier_reward,
    weighted_mix,
)

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


def test_verifier_without_answer_column_is_a_reward_error():
    # The verifier needs the answer column; without it the checked wrapper turns the crash into RewardError.
    verifier = checked(verifier_reward(EmbeddedArithmetic(num_train=2, num_test=2)), "verifier")
    with pytest.raises(RewardError, match="reward function 'verifier' raised"):
        verifier(["Answer: 3"])
