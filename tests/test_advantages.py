"""Outcome and process advantages: worked examples (DeepSeekMath §4.1.2-4.1.3), a plain-loop reference, invariants."""

from __future__ import annotations

import math
import random
import re
import statistics

import pytest
import torch

from pipeline.advantages import (
    advantage_stats,
    extend_last_step,
    hybrid_advantages,
    outcome_advantages,
    process_advantages,
    process_variance_share,
)

# ---------------------------------------------------------------------------------------------- outcome


def test_outcome_worked_example_uses_trl_unbiased_std():
    # "13 x 17", rewards [1, 0, 1]: mean 2/3; unbiased std sqrt(((1/3)^2 * 2 + (2/3)^2) / 2) = 0.5774.
    # (1 - 2/3) / (0.5774 + 1e-4) = 0.5773 and (0 - 2/3) / 0.5775 = -1.1545. The paper's population std
    # (0.471) would give [0.707, -1.414, 0.707] instead; our contract is TRL's.
    adv = outcome_advantages(torch.tensor([1.0, 0.0, 1.0]), group_size=3)
    torch.testing.assert_close(adv, torch.tensor([0.577, -1.155, 0.577]), atol=1e-3, rtol=0)


def test_outcome_matches_formula_with_eps():
    rewards = torch.tensor([1.0, 0.0, 1.0])
    expected = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
    torch.testing.assert_close(outcome_advantages(rewards, 3), expected, atol=1e-6, rtol=0)


def test_outcome_group_scale_has_zero_mean_per_group():
    rewards = torch.rand(6 * 8, generator=torch.Generator().manual_seed(0))
    adv = outcome_advantages(rewards, group_size=8)
    torch.testing.assert_close(adv.view(6, 8).sum(1), torch.zeros(6), atol=1e-5, rtol=0)


def test_outcome_equal_rewards_give_zero():
    # std 0 -> (r - mean) = 0 divided by 1e-4, exactly 0 (no NaN).
    adv = outcome_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]), group_size=3)
    assert torch.equal(adv, torch.zeros(6))


def test_outcome_batch_vs_group_scale():
    # Group 1 [1, 0] (std 0.707), group 2 [10, 0] (std 7.07). Both centre on their group mean: [0.5, -0.5]
    # and [5, -5]. Group scale divides each by its own std -> every entry +-0.707; batch scale divides
    # by the unbiased std of all four rewards: mean 2.75, squared deviations 3.0625 + 7.5625 + 52.5625
    # + 7.5625 = 70.75, / 3 -> std 4.856, giving [0.103, -0.103, 1.030, -1.030].
    rewards = torch.tensor([1.0, 0.0, 10.0, 0.0])
    group = outcome_advantages(rewards, 2, scale="group")
    batch = outcome_advantages(rewards, 2, scale="batch")
    none = outcome_advantages(rewards, 2, scale="none")
    torch.testing.assert_close(group, torch.tensor([0.707, -0.707, 0.707, -0.707]), atol=1e-3, rtol=0)
    batch_std = rewards.std().item()
    assert batch_std == pytest.approx(4.856, abs=1e-3)
    torch.testing.assert_close(batch, torch.tensor([0.103, -0.103, 1.030, -1.030]), atol=1e-3, rtol=0)
    torch.testing.assert_close(none, torch.tensor([0.5, -0.5, 5.0, -5.0]))
    # still centred per group in every scale
    torch.testing.assert_close(batch.view(2, 2).sum(1), torch.zeros(2), atol=1e-6, rtol=0)


def test_outcome_group_of_one_has_std_zero_like_trl():
    rewards = torch.tensor([0.3, 0.9])
    assert torch.equal(outcome_advantages(rewards, 1), torch.zeros(2))


def test_outcome_integer_rewards_accepted():
    adv = outcome_advantages(torch.tensor([1, 0, 1]), 3)
    assert adv.dtype == torch.float32


@pytest.mark.parametrize(
    ("rewards", "group_size", "scale", "match"),
    [
        (torch.zeros(4), 2, "bogus", "scale must be one of"),
        (torch.zeros(5), 2, "group", "not a multiple of group_size 2"),
        (torch.zeros(4), 0, "group", "group_size must be >= 1"),
        (torch.zeros(2, 2), 2, "group", r"shape \(B,\)"),
        (torch.tensor([0.0, 1.0, float("nan"), 1.0]), 2, "group", "row 2"),
    ],
)
def test_outcome_bad_input(rewards, group_size, scale, match):
    with pytest.raises(ValueError, match=match):
        outcome_advantages(rewards, group_size, scale=scale)


# ---------------------------------------------------------------------------------------------- process


def unbiased_std(values):
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def process_advantages_loop(step_rewards, step_ends, length, group_size, scale="group", credit="sum",
                            baseline="group"):
    """Plain-loop reference for `process_advantages`, written straight from DeepSeekMath §4.1.3 (TRL's
    scale_rewards carried over: the group's std, the whole batch's, or none), PURE's min form, and the
    per-position baseline (the group's steps at the same index)."""
    adv = [[0.0] * length for _ in step_rewards]
    every = [r for rs in step_rewards for r in rs]
    for start in range(0, len(step_rewards), group_size):
        group = step_rewards[start : start + group_size]
        for i in range(start, start + group_size):
            normalised = []
            for j, r in enumerate(step_rewards[i]):
                pooled = [x for rs in group for x in rs] if baseline == "group" else [rs[j] for rs in group if j < len(rs)]
                divisor = {"group": unbiased_std(pooled) + 1e-4, "batch": unbiased_std(every) + 1e-4, "none": 1.0}[scale]
                normalised.append((r - sum(pooled) / len(pooled)) / divisor)
            for t in range(length):
                ahead = [r for r, end in zip(normalised, step_ends[i]) if end >= t]
                if credit == "sum":
                    adv[i][t] = sum(ahead)
                elif ahead:  # min; no step at or after t: 0
                    adv[i][t] = min(ahead)
    return torch.tensor(adv, dtype=torch.float32)


WORKED_REWARDS = [[0.5, 1.0, 1.0, 1.0], [0.5, 0.0], [1.0]]
WORKED_ENDS = [[2, 5, 8, 11], [3, 7], [4]]


def test_process_worked_example():
    # Seven steps pooled: [0.5, 1, 1, 1, 0.5, 0, 1], mean 5/7 = 0.7143; squared deviations
    # 2 * 0.2143^2 + 4 * 0.2857^2 + 0.7143^2 = 0.9286, / 6 -> unbiased std 0.3934 (+1e-4 -> 0.3935).
    # Normalised: 0.5 -> -0.5446, 1 -> 0.7261, 0 -> -1.8152 (the worked example rounds to -0.545, 0.726, -1.816).
    # Output 1 (steps end at tokens 2, 5, 8, 11): tokens 0-2 get the sum of all four steps
    # -0.5446 + 3 * 0.7261 = 1.6337; tokens 3-5 the last three, 2.1783; tokens 6-8 the last two, 1.4522;
    # tokens 9-11 the last step alone, 0.7261 (the worked example: 1.634, 2.179, 1.453, 0.726).
    adv = process_advantages(WORKED_REWARDS, WORKED_ENDS, length=12, group_size=3)
    assert adv.shape == (3, 12) and adv.dtype == torch.float32
    expected_1 = torch.tensor([1.6337] * 3 + [2.1783] * 3 + [1.4522] * 3 + [0.7261] * 3)
    torch.testing.assert_close(adv[0], expected_1, atol=1e-3, rtol=0)
    # Output 2 (ends 3, 7): tokens 0-3 get -0.5446 - 1.8152 = -2.3598, tokens 4-7 get -1.8152, then 0.
    expected_2 = torch.tensor([-2.3598] * 4 + [-1.8152] * 4 + [0.0] * 4)
    torch.testing.assert_close(adv[1], expected_2, atol=1e-3, rtol=0)
    # Output 3 (one step ending at 4): tokens 0-4 get 0.7261, then 0.
    expected_3 = torch.tensor([0.7261] * 5 + [0.0] * 7)
    torch.testing.assert_close(adv[2], expected_3, atol=1e-3, rtol=0)


@pytest.mark.parametrize("baseline", ["group", "position"])
@pytest.mark.parametrize("credit", ["sum", "min"])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_process_matches_loop_reference_on_random_inputs(scale, credit, baseline):
    rng = random.Random(0)
    for _ in range(50):
        group_size = rng.randint(1, 4)
        batch = group_size * rng.randint(1, 3)
        length = rng.randint(1, 20)
        step_rewards, step_ends = [], []
        for _ in range(batch):
            k = rng.randint(0, min(5, length))
            step_ends.append(sorted(rng.sample(range(length), k)))
            step_rewards.append([rng.choice([0.0, 1.0, rng.random()]) for _ in range(k)])
        fast = process_advantages(step_rewards, step_ends, length, group_size, scale, credit, baseline)
        slow = process_advantages_loop(step_rewards, step_ends, length, group_size, scale, credit, baseline)
        torch.testing.assert_close(fast, slow, atol=1e-4, rtol=1e-5)


def test_process_zero_after_last_step_end_and_empty_completion():
    adv = process_advantages([[1.0, 0.0], [], [0.3]], [[1, 4], [], [2]], length=8, group_size=3)
    assert adv.shape == (3, 8)
    assert torch.equal(adv[0, 5:], torch.zeros(3))
    assert torch.equal(adv[1], torch.zeros(8))  # no steps: all-zero row
    assert torch.equal(adv[2, 3:], torch.zeros(5))


def test_process_empty_completion_does_not_count_in_group_stats():
    with_empty = process_advantages([[1.0, 0.0], [], [0.5]], [[1, 4], [], [2]], length=6, group_size=3)
    # The same three steps pooled in a group of two completions give the same statistics.
    without = process_advantages([[1.0, 0.0], [0.5]], [[1, 4], [2]], length=6, group_size=2)
    torch.testing.assert_close(with_empty[[0, 2]], without)


def test_process_groups_normalised_independently():
    # Group 2 is group 1 shifted by +10 and scaled by 3: normalisation removes both, so the
    # advantages match row for row. Pooled with group 1 they would not.
    rewards_1 = [[0.0, 1.0], [1.0]]
    rewards_2 = [[10.0, 13.0], [13.0]]
    ends = [[1, 3], [2]]
    adv = process_advantages(rewards_1 + rewards_2, ends + ends, length=5, group_size=2)
    torch.testing.assert_close(adv[:2], adv[2:], atol=1e-4, rtol=0)
    alone = process_advantages(rewards_1, ends, length=5, group_size=2)
    torch.testing.assert_close(adv[:2], alone)


def test_process_equal_rewards_give_zero():
    # 0.7 is not exact in binary, so the pooled mean is off by ~1e-16, divided by std + 1e-4 ~ 1e-4:
    # what is left is ~1e-12 of rounding, no signal.
    adv = process_advantages([[0.7, 0.7], [0.7]], [[0, 2], [1]], length=4, group_size=2)
    torch.testing.assert_close(adv, torch.zeros(2, 4), atol=1e-9, rtol=0)
    assert torch.equal(process_advantages([[1.0, 1.0], [1.0]], [[0, 2], [1]], 4, 2), torch.zeros(2, 4))


def test_process_scale_rewards_worked_example():
    # Two groups: [[0, 1], [1]] (mean 2/3) and [[10, 13], [13]] (mean 12), steps ending at tokens 1, 3 and 2.
    rewards, ends = [[0.0, 1.0], [1.0], [10.0, 13.0], [13.0]], [[1, 3], [2], [1, 3], [2]]
    # "none" only centres: group 1 normalised [-0.667, 0.333], [0.333]; group 2 [-2, 1], [1].
    none = process_advantages(rewards, ends, 4, 2, scale="none")
    torch.testing.assert_close(none[0], torch.tensor([-1 / 3, -1 / 3, 1 / 3, 1 / 3]), atol=1e-6, rtol=0)
    torch.testing.assert_close(none[2], torch.tensor([-1.0, -1.0, 1.0, 1.0]), atol=1e-6, rtol=0)
    # "batch" divides by the std of all six steps [0, 1, 1, 10, 13, 13] (mean 6.333, squared deviations
    # summing to 199.33, / 5 -> 6.3140), so group 1 nearly vanishes and group 2 keeps its larger spread:
    # row 2, token 0: (-2 + 1) / 6.3141 = -0.1584.
    batch = process_advantages(rewards, ends, 4, 2, scale="batch")
    assert unbiased_std([0, 1, 1, 10, 13, 13]) == pytest.approx(6.3140, abs=1e-4)
    torch.testing.assert_close(batch, none / (6.3140 + 1e-4), atol=1e-5, rtol=0)
    assert batch[2, 0].item() == pytest.approx(-0.1584, abs=1e-4)
    # "group" (TRL's default) removes each group's scale: the two groups match row for row.
    group = process_advantages(rewards, ends, 4, 2)
    torch.testing.assert_close(group[:2], group[2:], atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="scale must be one of"):
        process_advantages(rewards, ends, 4, 2, scale="sequence")


def test_process_min_credit_worked_example():
    # PURE's min form on the same group (normalised: output 1 [-0.5446, 0.7261, 0.7261, 0.7261], output 2
    # [-0.5446, -1.8152], output 3 [0.7261]). Output 1: tokens 0-2 see all four steps ahead, min -0.5446;
    # from token 3 on only 0.7261s are ahead (the sum gave 1.6337, 2.1783, 1.4522, 0.7261).
    adv = process_advantages(WORKED_REWARDS, WORKED_ENDS, length=12, group_size=3, credit="min")
    assert adv.shape == (3, 12) and adv.dtype == torch.float32
    torch.testing.assert_close(adv[0], torch.tensor([-0.5446] * 3 + [0.7261] * 9), atol=1e-4, rtol=0)
    # Output 2 (ends 3, 7): both steps' tokens see the bad last step ahead, -1.8152; after token 7, 0.
    torch.testing.assert_close(adv[1], torch.tensor([-1.8152] * 8 + [0.0] * 4), atol=1e-4, rtol=0)
    # Output 3: one step, so min = sum: 0.7261 to token 4, then 0.
    torch.testing.assert_close(adv[2], torch.tensor([0.7261] * 5 + [0.0] * 7), atol=1e-4, rtol=0)
    # The last step's tokens have one step ahead either way: min and sum agree there.
    total = process_advantages(WORKED_REWARDS, WORKED_ENDS, length=12, group_size=3)
    torch.testing.assert_close(adv[:, 9:], total[:, 9:])


def test_process_min_credit_rows_without_steps_and_the_eos():
    # A masked completion (no steps) stays all 0 and out of the statistics; with the eos carrying the last
    # step (extend_last_step) the eos gets the last step's normalised reward under min credit too.
    ends = extend_last_step([[1, 4], [], [2]], [7, 0, 4])  # [[1, 6], [], [3]]
    adv = process_advantages([[1.0, 0.0], [], [0.5]], ends, length=8, group_size=3, credit="min")
    # Steps [1, 0, 0.5]: mean 0.5, std 0.5: normalised [0.5, -0.5] / 0.5001 = [0.9998, -0.9998] and [0].
    # Row 0: every token to the eos (6) sees the -0.9998 step ahead; token 7 is padding, 0.
    torch.testing.assert_close(adv[0], torch.tensor([-1 / 1.0002] * 7 + [0.0]), atol=1e-6, rtol=0)
    assert torch.equal(adv[1], torch.zeros(8)) and torch.equal(adv[2], torch.zeros(8))
    with pytest.raises(ValueError, match="^unknown process credit 'max'; known: sum, min, step$"):
        process_advantages([[1.0]], [[0]], 2, 1, credit="max")


def test_process_position_baseline_worked_example():
    # Index 0 holds [0.5, 0.5, 1]: mean 0.6667, std 0.2887 (+1e-4), normalised -0.5771, -0.5771, 1.1543;
    # index 1 holds [1, 0]: mean 0.5, std 0.7071, normalised 0.7070, -0.7070; indices 2 and 3 hold one step
    # each (output 1's), with nothing to compare to: 0.
    adv = process_advantages(WORKED_REWARDS, WORKED_ENDS, length=12, group_size=3, baseline="position")
    # Output 1 (ends 2, 5, 8, 11), summed: -0.5771 + 0.7070 = 0.1299, then 0.7070, then 0 and 0.
    torch.testing.assert_close(adv[0], torch.tensor([0.1299] * 3 + [0.7070] * 3 + [0.0] * 6), atol=1e-4, rtol=0)
    # Output 2 (ends 3, 7): -0.5771 - 0.7070 = -1.2841, then -0.7070; output 3 (end 4): 1.1543.
    torch.testing.assert_close(adv[1], torch.tensor([-1.2841] * 4 + [-0.7070] * 4 + [0.0] * 4), atol=1e-4, rtol=0)
    torch.testing.assert_close(adv[2], torch.tensor([1.1543] * 5 + [0.0] * 7), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="^unknown process baseline 'step'; known: group, position$"):
        process_advantages(WORKED_REWARDS, WORKED_ENDS, 12, 3, baseline="step")


@pytest.mark.parametrize("credit", ["sum", "min"])
def test_process_position_baseline_cancels_a_prm_that_scores_only_the_position(credit):
    # A PRM that scores a step by where it sits, whatever it says (0.9, 0.6, 0.3 for steps 1-3): pooled over
    # the group (DeepSeekMath) that is a fixed schedule, the same in every completion, pushing every
    # completion's first tokens up and its last step down; per position it is no signal at all.
    rewards, ends = [[0.9, 0.6, 0.3]] * 4, [[2, 5, 8]] * 4
    pooled = process_advantages(rewards, ends, 9, 4, credit=credit)
    assert torch.equal(pooled[0], pooled[3]) and pooled[:, 6:].max() < -1  # the last step: below the mean
    assert torch.equal(process_advantages(rewards, ends, 9, 4, credit=credit, baseline="position"), torch.zeros(4, 9))
    # A step scored above the others at its own position still stands out: completion 2's second step
    # (min credit: its tokens see min(that step, the last step's 0) = 0, the others' below 0).
    rewards = [[0.9, 0.6, 0.3], [0.9, 0.6, 0.3], [0.9, 0.8, 0.3], [0.9, 0.6, 0.3]]
    adv = process_advantages(rewards, ends, 9, 4, credit=credit, baseline="position")
    others = adv[[0, 1, 3], 3]
    assert (others < 0).all() and adv[2, 3] >= 0 and torch.equal(adv[:, 6:], torch.zeros(4, 3))


# ---------------------------------------------------------------------------------------------- hybrid


def test_hybrid_worked_example():
    # Verifier [1, 0, 1] on DeepSeekMath's group: outcome [0.57725, -1.15450, 0.57725] on every token
    # ((1/3) / (0.57735 + 1e-4)), plus w = 0.5 times the min-credit process advantages: output 1, token 0:
    # 0.57725 + 0.5 * -0.54457 = 0.30497; token 3: 0.57725 + 0.5 * 0.72609 = 0.94030; output 2, token 0:
    # -1.15450 + 0.5 * -1.81522 = -2.06211, and after its last step (token 8 on) the outcome alone.
    outcome = outcome_advantages(torch.tensor([1.0, 0.0, 1.0]), group_size=3)
    process = process_advantages(WORKED_REWARDS, WORKED_ENDS, length=12, group_size=3, credit="min")
    adv = hybrid_advantages(outcome, process, 0.5)
    assert adv.shape == (3, 12) and adv.dtype == torch.float32
    assert adv[0, 0].item() == pytest.approx(0.30497, abs=1e-5)
    assert adv[0, 3].item() == pytest.approx(0.94030, abs=1e-5)
    assert adv[1, 0].item() == pytest.approx(-2.06211, abs=1e-5)
    assert adv[1, 8:].tolist() == pytest.approx([-1.15450] * 4, abs=1e-5)
    # Weight 0 is outcome supervision: the outcome advantage on every token, bit for bit.
    assert torch.equal(hybrid_advantages(outcome, process, 0.0), outcome.unsqueeze(1).expand(-1, 12))


def test_hybrid_matches_a_plain_loop():
    rng = random.Random(1)
    for _ in range(20):
        rows, length, w = rng.randint(1, 6), rng.randint(1, 9), rng.choice([0.0, 0.1, 1.0, 3.5])
        outcome = [rng.uniform(-2, 2) for _ in range(rows)]
        process = [[rng.uniform(-3, 3) for _ in range(length)] for _ in range(rows)]
        want = [[outcome[i] + w * process[i][t] for t in range(length)] for i in range(rows)]
        got = hybrid_advantages(torch.tensor(outcome), torch.tensor(process), w)
        torch.testing.assert_close(got, torch.tensor(want), atol=1e-6, rtol=1e-6)


def variance_share_loop(outcome, process, weight, lengths):
    """Plain-loop reference: population variances of the tokens in the loss."""
    o = [outcome[i] for i, n in enumerate(lengths) for _ in range(n)]
    p = [weight * process[i][t] for i, n in enumerate(lengths) for t in range(n)]
    var = lambda xs: sum((x - sum(xs) / len(xs)) ** 2 for x in xs) / len(xs)  # noqa: E731
    return var(p) / (var(o) + var(p)) if var(o) + var(p) > 0 else 0.0


def test_process_variance_share_worked_example_and_limits():
    # Outcome [1, -1], process [[1, 1], [1, -1]], both rows 2 tokens: O [1, 1, -1, -1] has variance 1,
    # P [1, 1, 1, -1] (mean 0.5) variance 0.75: share 0.75 / 1.75 = 0.4286; at w = 2, 3 / 4 = 0.75.
    outcome, process = torch.tensor([1.0, -1.0]), torch.tensor([[1.0, 1.0], [1.0, -1.0]])
    assert process_variance_share(outcome, process, 1.0, [2, 2]) == pytest.approx(0.75 / 1.75, abs=1e-12)
    assert process_variance_share(outcome, process, 2.0, [2, 2]) == pytest.approx(0.75, abs=1e-12)
    # w = 0: the verifier arm again, share 0; no outcome spread (all right or all wrong): 1.
    assert process_variance_share(outcome, process, 0.0, [2, 2]) == 0.0
    assert process_variance_share(torch.zeros(2), process, 0.3, [2, 2]) == pytest.approx(1.0, abs=1e-12)
    # Only tokens in the loss count: row 1 masked out leaves O constant and P [1, 1]: no spread at all, 0.
    assert process_variance_share(outcome, process, 1.0, [2, 0]) == 0.0
    assert math.isnan(process_variance_share(outcome, process, 1.0, [0, 0]))


def test_process_variance_share_matches_a_plain_loop():
    rng = random.Random(2)
    for _ in range(30):
        rows, length, w = rng.randint(1, 6), rng.randint(1, 9), rng.choice([0.05, 0.5, 1.0, 4.0])
        outcome = [rng.choice([0.0, rng.uniform(-2, 2)]) for _ in range(rows)]
        process = [[rng.uniform(-3, 3) for _ in range(length)] for _ in range(rows)]
        lengths = [rng.randint(0, length) for _ in range(rows)]
        if not any(lengths):
            continue
        got = process_variance_share(torch.tensor(outcome), torch.tensor(process), w, lengths)
        assert got == pytest.approx(variance_share_loop(outcome, process, w, lengths), abs=1e-6)


@pytest.mark.parametrize(("outcome", "process", "weight", "match"), [
    (torch.zeros(2, 1), torch.zeros(2, 3), 1.0, r"outcome must have shape \(B,\)"),
    (torch.zeros(3), torch.zeros(2, 3), 1.0, r"got \(3,\) and \(2, 3\)"),
    (torch.zeros(2), torch.zeros(2, 3), -0.5, "process weight must be a finite number >= 0, got -0.5"),
    (torch.zeros(2), torch.zeros(2, 3), float("nan"), "process weight must be a finite number >= 0"),
])
def test_hybrid_bad_input(outcome, process, weight, match):
    with pytest.raises(ValueError, match=match):
        hybrid_advantages(outcome, process, weight)
    with pytest.raises(ValueError, match=match):
        process_variance_share(outcome, process, weight, [1] * outcome.shape[0])


def test_extend_last_step_worked_example():
    # The worked example's output 1 in a completion of 13 tokens (eos at 12): the last step (ending at 11) now
    # ends on the eos. Output 2 ends its last step on its eos already; output 3 was masked (length 0).
    ends = extend_last_step([[2, 5, 8, 11], [3, 7], []], [13, 8, 0])
    assert ends == [[2, 5, 8, 12], [3, 7], []]
    adv = process_advantages([[0.5, 1.0, 1.0, 1.0], [0.5, 0.0], []], ends, length=13, group_size=3)
    # Pooled steps [0.5, 1, 1, 1, 0.5, 0] (mean 0.6667, std 0.4083): the last step's 1 -> 0.8163, and the
    # eos (token 12) carries it like the step's own tokens 9-11; the tokens before are as without the eos.
    assert adv[0, 9:].tolist() == pytest.approx([0.8163] * 4, abs=1e-4)
    before = process_advantages([[0.5, 1.0, 1.0, 1.0], [0.5, 0.0], []], [[2, 5, 8, 11], [3, 7], []], 13, 3)
    torch.testing.assert_close(adv[:, :12], before[:, :12])
    assert before[0, 12].item() == 0.0  # without it the eos got nothing
    torch.testing.assert_close(adv[1], before[1])


def test_extend_last_step_bad_input():
    with pytest.raises(ValueError, match="1 completions but lengths has 2"):
        extend_last_step([[0]], [1, 2])
    with pytest.raises(ValueError, match="completion 0: step end 4 is not inside its 4 tokens"):
        extend_last_step([[1, 4]], [4])


def test_advantage_stats_counts_only_tokens_in_the_loss():
    adv = torch.tensor([[1.0, 2.0, 9.0], [3.0, 0.0, 0.0], [7.0, 7.0, 7.0]])
    # Row 0: its first two tokens; row 1: one; row 2 is masked (length 0). Used: [1, 2, 3].
    stats = advantage_stats(adv, [2, 1, 0])
    assert {k: stats[k] for k in ("mean", "std", "min", "max")} == {"mean": 2.0, "std": 1.0, "min": 1.0, "max": 3.0}
    # RMS sqrt((1 + 4 + 9) / 3) = 2.1602; the mean's share of it 2 / 2.1602 = 0.9258.
    assert stats["rms"] == pytest.approx(math.sqrt(14 / 3), abs=1e-12)
    assert stats["mean_share"] == pytest.approx(2 / math.sqrt(14 / 3), abs=1e-12)
    # One advantage per completion (rft): every token of the completion counts, so longer ones weigh more.
    stats = advantage_stats(torch.tensor([1.0, 0.0]), [3, 1])
    assert stats["mean"] == pytest.approx(0.75) and stats["std"] == pytest.approx(0.5)
    assert all(math.isnan(v) for v in advantage_stats(adv, [0, 0, 0]).values())


def test_the_mean_of_process_advantages_worked_example():
    # REFERENCE.md, "The mean of process advantages": a group of 8, six outputs with steps [1, 1, 1] and two with
    # [1, 1, 0], one token per step. 22 ones and 2 zeros: mean 0.917, unbiased std 0.282; a 1 normalises to
    # +0.295, a 0 to -3.246 (std + 1e-4). Right outputs' tokens get 0.885, 0.590, 0.295 by step, the flawed ones'
    # -2.656, -2.951, -3.246; the per-token mean over the group is -0.295 where outcome advantages' is 0.
    rewards = [[1.0, 1.0, 1.0]] * 6 + [[1.0, 1.0, 0.0]] * 2
    adv = process_advantages(rewards, [[0, 1, 2]] * 8, 3, 8)  # (8, 3)
    assert adv[0].tolist() == pytest.approx([0.885, 0.590, 0.295], abs=1e-3)
    assert adv[7].tolist() == pytest.approx([-2.656, -2.951, -3.246], abs=1e-3)
    stats = advantage_stats(adv, [3] * 8)
    assert stats["mean"] == pytest.approx(-0.295, abs=1e-3)
    assert stats["mean_share"] == pytest.approx(abs(stats["mean"]) / stats["rms"], abs=1e-12) and stats["mean_share"] > 0.15
    # Plain-loop reference of the mean: every token of every output, one by one.
    tokens = [adv[i, t].item() for i in range(8) for t in range(3)]
    assert stats["mean"] == pytest.approx(sum(tokens) / len(tokens), abs=1e-12)
    outcome = advantage_stats(torch.tensor([0.35] * 6 + [-1.05] * 2), [3] * 8)  # centred per group: mean 0
    assert outcome["mean"] == pytest.approx(0.0, abs=1e-7) and outcome["mean_share"] == pytest.approx(0.0, abs=1e-7)


def test_process_single_step_group_has_std_zero():
    # One step in the whole group: it equals the mean, so its normalised reward is 0 (not NaN).
    adv = process_advantages([[0.9], []], [[3], []], length=4, group_size=2)
    assert torch.equal(adv, torch.zeros(2, 4))


@pytest.mark.parametrize(
    ("rewards", "ends", "length", "group_size", "match"),
    [
        ([[1.0]], [[0], [1]], 4, 1, "1 completions but step_ends has 2"),
        ([[1.0, 0.0]], [[0]], 4, 1, "completion 0: 2 step rewards but 1 step ends"),
        ([[1.0], [1.0, 0.0]], [[0], [2, 2]], 4, 1, "completion 1, step 1: .*strictly increasing"),
        ([[1.0], [1.0, 0.0]], [[0], [2, 4]], 4, 1, r"completion 1, step 1: step end 4 is outside \[0, 4\)"),
        ([[1.0], [1.0]], [[-1], [0]], 4, 1, "completion 0, step 0: step end -1"),
        ([[1.0], [0.0, float("nan")]], [[0], [1, 2]], 4, 2, "completion 1, step 1: reward nan"),
        ([[1.0], [float("inf")]], [[0], [1]], 4, 2, "completion 1, step 0: reward inf"),
        ([[1.0], [1.0], [1.0]], [[0], [0], [0]], 4, 2, "not a multiple of group_size 2"),
        ([[1.0]], [[0]], 4, 0, "group_size must be >= 1"),
    ],
)
def test_process_bad_input(rewards, ends, length, group_size, match):
    with pytest.raises(ValueError, match=match):
        process_advantages(rewards, ends, length, group_size)


def _centred_loop(adv, lengths, group_size, over):
    """Plain-loop reference of `centred_advantages`."""
    out = [[0.0] * adv.shape[1] for _ in range(adv.shape[0])]
    size = 1 if over == "output" else group_size
    for g in range(0, adv.shape[0], size):
        cells = [(i, t) for i in range(g, g + size) for t in range(lengths[i])]
        mean = sum(adv[i, t].item() for i, t in cells) / max(len(cells), 1)
        for i, t in cells:
            out[i][t] = adv[i, t].item() - mean
    return torch.tensor(out)


def test_centred_process_advantages_worked_example_and_loop_reference():
    from pipeline.advantages import centred_advantages

    # The group of 8 with two slips (REFERENCE.md): per-token mean -0.295, removed.
    rewards = [[1.0, 1.0, 1.0]] * 6 + [[1.0, 1.0, 0.0]] * 2
    adv = process_advantages(rewards, [[0, 1, 2]] * 8, 3, 8)  # (8, 3)
    group = centred_advantages(adv, [3] * 8, 8, "group")
    assert group[0].tolist() == pytest.approx([1.180, 0.885, 0.590], abs=1e-3)
    assert group[7].tolist() == pytest.approx([-2.361, -2.656, -2.951], abs=1e-3)
    assert advantage_stats(group, [3] * 8)["mean"] == pytest.approx(0.0, abs=1e-6)
    output = centred_advantages(adv, [3] * 8, 8, "output")
    assert all(row == pytest.approx([0.295, 0.0, -0.295], abs=1e-3) for row in output.tolist())
    assert torch.equal(centred_advantages(adv, [3] * 8, 8, "none"), adv)
    # Random groups, ragged and masked lengths: the loop, and 0 outside the loss.
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(8, 6, generator=g)
    lengths = [6, 2, 0, 5, 1, 6, 3, 4]
    for over in ("group", "output"):
        fast = centred_advantages(adv, lengths, 4, over)
        assert torch.allclose(fast, _centred_loop(adv, lengths, 4, over), atol=1e-6)
        assert fast[2].abs().sum() == 0 and fast[1, 2:].abs().sum() == 0
    with pytest.raises(ValueError, match="^unknown process centring 'token'; known: none, group, output$"):
        centred_advantages(adv, lengths, 4, "token")


def test_process_centring_is_refused_where_no_process_advantage_is_made():
    from pipeline.config import ConfigError
    from pipeline.loading import config_from_dict

    assert config_from_dict({"supervision": {"mode": "hybrid", "process_centring": "group"}}, check_trl=False)
    with pytest.raises(ConfigError, match="process_centring 'output' is only used in process and hybrid mode"):
        config_from_dict({"supervision": {"mode": "outcome", "process_centring": "output"}}, check_trl=False)


def _credit_loop(values, ends, length, credit):
    """Plain-loop reference of a credit rule over one completion's step values."""
    out = []
    for t in range(length):
        ahead = [v for v, e in zip(values, ends) if e >= t]
        if not ahead:
            out.append(0.0)
        else:
            out.append({"sum": sum(ahead), "min": min(ahead), "step": ahead[0]}[credit])
    return out


def test_progress_credit_worked_example():
    from pipeline.advantages import hybrid_advantages, outcome_advantages, progress_advantages

    # REFERENCE.md, "Progress credit": oracle values, a group of 2; output 1 right, right, right, output 2 right,
    # wrong, wrong; verifier rewards [1, 0], and V_0 = 0.5 for both (a prover's value of the prompt). One token a step.
    start = [0.5, 0.5]
    progress = progress_advantages([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], [[0, 1, 2]] * 2, 3, start, "step")
    assert progress.tolist() == [[0.5, 0.0, 0.0], [0.5, -1.0, 0.0]]
    outcome = outcome_advantages(torch.tensor([1.0, 0.0]), 2)  # TRL's: [0.707, -0.707]
    hybrid = hybrid_advantages(outcome, progress, 1.0)
    assert hybrid[0].tolist() == pytest.approx([1.207, 0.707, 0.707], abs=1e-3)
    assert hybrid[1].tolist() == pytest.approx([-0.207, -1.707, -0.707], abs=1e-3)  # the error is penalised most
    # Sum credit telescopes: a token gets V_K - V_(k(t)-1); min, the worst progress ahead.
    total = progress_advantages([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], [[0, 1, 2]] * 2, 3, start, "sum")
    assert total.tolist() == [[0.5, 0.0, 0.0], [-0.5, -1.0, 0.0]]
    worst = progress_advantages([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], [[0, 1, 2]] * 2, 3, start, "min")
    assert worst.tolist() == [[0.0, 0.0, 0.0], [-1.0, -1.0, 0.0]]


def test_progress_anchors_are_the_others_mean_outcome_and_the_outcome_itself():
    """Issue 47, point 2: V_0 leaves the output out, V_K is the verifier's; an output's progress then sums to its
    outcome minus the others' mean, 0 in an all-correct or all-wrong group, whatever the PRM's values."""
    from pipeline.advantages import leave_one_out_means, progress_advantages, progress_anchors, uniform_group_means

    # Mixed group of 3 (outcomes [1, 0, 0]): V_0 = [0, 0.5, 0.5], not the group's mean 1/3 for all. A PRM's values
    # [0.6, 0.9], [0.7, 0.4], [0.5] end on the outcomes instead: [0.6, 1], [0.7, 0], [0].
    values = [[0.6, 0.9], [0.7, 0.4], [0.5]]
    start, anchored = progress_anchors(values, [1.0, 0.0, 0.0], 3)
    assert start == [0.0, 0.5, 0.5] and anchored == [[0.6, 1.0], [0.7, 0.0], [0.0]]
    adv = progress_advantages(anchored, [[0, 1], [0, 1], [0]], 2, start, "step")
    assert adv.flatten().tolist() == pytest.approx([0.6, 0.4, 0.2, -0.7, -0.5, 0.0], abs=1e-6)
    assert [adv[i].sum().item() for i in range(3)] == pytest.approx([1.0, -0.5, -0.5], abs=1e-6)  # o_i - the others'
    # An all-correct group and an all-wrong one: each output nets 0, the PRM's dips only move credit between steps.
    values = [[0.6, 0.8], [0.9], [0.3, 0.1], [0.2]]
    start, anchored = progress_anchors(values, [1.0, 1.0, 0.0, 0.0], 2)
    assert start == [1.0, 1.0, 0.0, 0.0] and anchored == [[0.6, 1.0], [1.0], [0.3, 0.0], [0.0]]
    adv = progress_advantages(anchored, [[0, 1], [0], [0, 1], [0]], 2, start, "step")
    assert adv.flatten().tolist() == pytest.approx([-0.4, 0.4, 0.0, 0.0, 0.3, -0.3, 0.0, 0.0], abs=1e-6)
    assert uniform_group_means(adv, [2, 1, 2, 1], [1, 1, 0, 0], 2) == pytest.approx(
        {"all_correct": 0.0, "all_wrong": 0.0}, abs=1e-7)
    # Before the fix (V_0 the group's mean, V_K the PRM's last value): -0.2 and +0.1 per output, the bias.
    old = progress_advantages(values, [[0, 1], [0], [0, 1], [0]], 2, [1.0, 1.0, 0.0, 0.0], "step")
    assert [old[i].sum().item() for i in range(4)] == pytest.approx([-0.2, -0.1, 0.1, 0.2], abs=1e-6)
    # A group of one has no other output: V_0 is its own outcome, so its progress nets 0.
    assert leave_one_out_means([1.0, 0.0], 1) == [1.0, 0.0]
    start, anchored = progress_anchors([[0.4, 0.7]], [1.0], 1)
    assert progress_advantages(anchored, [[0, 1]], 2, start, "sum")[0, 0].item() == pytest.approx(0.0)


def test_uniform_group_means_leave_out_what_the_batch_lacks():
    from pipeline.advantages import uniform_group_means

    adv = torch.tensor([[1.0, 2.0], [3.0, 9.0], [-1.0, -1.0], [0.5, 0.5]])
    # Group 0 all correct (tokens 1, 2, 3: mean 2); group 1 mixed: no all-wrong group, so no such key.
    assert uniform_group_means(adv, [2, 1, 2, 2], [1.0, 1.0, 1.0, 0.0], 2) == {"all_correct": 2.0}
    assert uniform_group_means(adv, [0, 0, 2, 2], [1.0, 1.0, 0.0, 0.0], 2) == {"all_wrong": -0.25}  # masked: none


def _prime_loop(rewards, outcomes, lengths, n, c_p, c_o):
    """PRIME's advantage by plain loops over lists (REFERENCE, "PRIME's advantage")."""
    out = []
    for g in range(0, len(rewards), n):
        means = [sum(rewards[i][: lengths[i]]) / max(lengths[i], 1) for i in range(g, g + n)]
        total = sum(outcomes[g : g + n])
        for i in range(g, g + n):
            r = [x * n / (n - 1) - sum(means) / (n - 1) for x in rewards[i][: lengths[i]]]
            o = outcomes[i] * n / (n - 1) - total / (n - 1)
            step = [c_p * x + (c_o * o if t == lengths[i] - 1 else 0.0) for t, x in enumerate(r)]
            out.append([sum(step[t:]) for t in range(lengths[i])])
    flat = [x for row in out for x in row]
    mean = statistics.fmean(flat)
    std = statistics.stdev(flat)
    width = len(rewards[0])
    return [[(x - mean) / math.sqrt(std**2 + 1e-8) for x in row] + [0.0] * (width - len(row)) for row in out]


def test_prime_worked_example_group_of_three():
    from pipeline.advantages import prime_advantages

    # Token rewards [0.2, 0.4], [0.3], [-0.1, 0.1] (lengths 2, 1, 2), outcomes [1, 1, 0], c_p = c_o = 1.
    # Mean token rewards 0.3, 0.3, 0 (sum 0.6): r' = 1.5 r - 0.3 = [0, 0.3], [0.15], [-0.45, -0.15].
    # o' = 1.5 o - 1 = 0.5, 0.5, -1 on each last token. Returns (reverse sums): [0.8, 0.8], [0.65], [-1.6, -1.15].
    # Over the 5 loss tokens: mean -0.1, unbiased std 1.17633; whitened (x + 0.1) / 1.17633.
    rewards = torch.tensor([[0.2, 0.4], [0.3, 7.0], [-0.1, 0.1]])  # 7.0 lies past output 2's length: ignored
    adv = prime_advantages(rewards, torch.tensor([1.0, 1.0, 0.0]), [2, 1, 2], 3, 1.0, 1.0)
    assert adv.tolist() == [pytest.approx(r, abs=1e-4) for r in ([0.7651, 0.7651], [0.6376, 0.0], [-1.2752, -0.8926])]
    # PRIME's coefficients (5, 5) and a second group with a masked output, against the plain loops.
    g = torch.Generator().manual_seed(3)
    rewards = torch.randn(6, 5, generator=g) * 0.1
    outcomes, lengths = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0], [5, 3, 4, 2, 0, 5]
    fast = prime_advantages(rewards, torch.tensor(outcomes), lengths, 3)
    want = _prime_loop(rewards.tolist(), outcomes, lengths, 3, 5.0, 5.0)
    assert fast.tolist() == [pytest.approx(w, abs=1e-5) for w in want]
    with pytest.raises(ValueError, match="at least 2 outputs per prompt"):
        prime_advantages(rewards, torch.tensor(outcomes), lengths, 1)


def test_prime_centres_each_groups_process_rewards_before_whitening():
    """The leave-one-out baseline removes any constant a group's token rewards share (r' sums to 0 over the group's
    mean token rewards): shifting one group's rewards changes nothing, which whitening over the batch alone would
    not undo (it has two groups); with equal lengths each group's first-token returns sum to 0 before whitening, so
    after it every group's first-token mean is the same, -mean / std of the batch."""
    from pipeline.advantages import prime_advantages

    g = torch.Generator().manual_seed(5)
    rewards, outcomes, lengths = torch.randn(6, 4, generator=g), torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0]), [4] * 6
    shifted = rewards.clone()
    shifted[:3] += 2.5  # one group's PRM is more confident about everything
    assert torch.allclose(prime_advantages(shifted, outcomes, lengths, 3), prime_advantages(rewards, outcomes, lengths, 3),
                          atol=1e-5)
    # Process alone (c_o = 0): whitening is affine, so each group's first-token advantages average to the batch's.
    adv = prime_advantages(rewards, outcomes, lengths, 3, 1.0, 0.0)
    assert adv[:3, 0].mean().item() == pytest.approx(adv[3:, 0].mean().item(), abs=1e-5)


@pytest.mark.parametrize("credit", ["sum", "min", "step"])
def test_progress_and_step_credit_against_the_plain_loop(credit):
    from pipeline.advantages import progress_advantages

    g = torch.Generator().manual_seed(1)
    values = [[torch.rand(1, generator=g).item() for _ in range(n)] for n in (3, 1, 0, 2)]
    ends = [[1, 4, 6], [2], [], [0, 7]]
    start = [0.25, 0.5, 0.5, 0.75]
    fast = progress_advantages(values, ends, 9, start, credit)
    for i, (v, e) in enumerate(zip(values, ends)):
        progress = [b - a for a, b in zip([start[i], *v[:-1]], v)]
        assert fast[i].tolist() == pytest.approx(_credit_loop(progress, e, 9, credit), abs=1e-6)
    # Step credit with DeepSeekMath's normalised values: each token its own step's normalised reward.
    rewards = [[0.5, 1.0, 1.0, 1.0], [0.5, 0.0], [1.0]]
    step = process_advantages(rewards, [[0, 1, 2, 3], [0, 1], [0]], 4, 3, credit="step")
    summed = process_advantages(rewards, [[0, 1, 2, 3], [0, 1], [0]], 4, 3, credit="sum")
    # One token a step: a token's own step is the difference of the sums at it and after it.
    for i in range(3):
        own = [summed[i, t].item() - (summed[i, t + 1].item() if t + 1 < 4 else 0.0) for t in range(4)]
        assert step[i].tolist() == pytest.approx(own, abs=1e-5)
    assert step[0].tolist() == pytest.approx([-0.545, 0.726, 0.726, 0.726], abs=1e-3)  # REFERENCE's normalised


def test_progress_credit_config_where_it_applies():
    from pipeline.config import ConfigError
    from pipeline.loading import config_from_dict

    cfg = config_from_dict({"supervision": {"mode": "hybrid", "process_reward": "progress", "process_credit": "step"},
                            "reward_model": {"oracle": "gold"}}, check_trl=False)
    assert (cfg.supervision.process_reward, cfg.supervision.process_credit) == ("progress", "step")
    with pytest.raises(ConfigError, match="process_reward 'progress' is only used in process and hybrid mode"):
        config_from_dict({"supervision": {"mode": "outcome", "process_reward": "progress"}}, check_trl=False)
    with pytest.raises(ConfigError, match="progress .* is not normalised: drop process_baseline"):
        config_from_dict({"supervision": {"process_reward": "progress", "process_baseline": "position"}},
                         check_trl=False)


# ---------------------------------------------------------------------------------------------- pass@k (PKPO)


def _passk_brute_force(f: list[int], k: int) -> tuple[list[float], float]:
    """Every k-subset of one group, enumerated: each sample's pass@k reward n * (sum over the subsets holding it of
    their max) / C(n, k), and the group's pass@k estimate, the mean over the subsets of their max."""
    import itertools

    n = len(f)
    subsets = list(itertools.combinations(range(n), k))
    rewards = [n * sum(max(f[j] for j in s) for s in subsets if i in s) / len(subsets) for i in range(n)]
    return rewards, sum(max(f[j] for j in s) for s in subsets) / len(subsets)


def test_passk_worked_example_of_the_reference():
    from pipeline.passk import passk_advantages, passk_estimate, passk_rewards

    # REFERENCE.md, n = 4, k = 2, A right, B, C, D wrong: of the 6 pairs AB, AC, AD pass, so PKPO's r~_A = 3/6 and
    # r~_B = r~_C = r~_D = 1/6; summed 1.0 = k * pass@2, pass@2 = 1 - C(3,2)/C(4,2) = 0.5. Our reward is n * r~ (GRPO's
    # loss takes the mean over the group itself): [2, 2/3, 2/3, 2/3], whose mean 1.0 is k * pass@2.
    f = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert passk_rewards(f, 4, 2).tolist() == pytest.approx([2.0, 2 / 3, 2 / 3, 2 / 3], abs=1e-12)
    assert passk_estimate(f, 4, 2).tolist() == pytest.approx([0.5], abs=1e-12)
    # Advantages: minus the group's mean (1.0) -> [1, -1/3, -1/3, -1/3], over outcome mode's std of the 0/1
    # rewards (0.5, unbiased) + 1e-4 -> [1.9996, -0.6665, ...]: 4/3 (= 2 - 2/3) times outcome mode's [1.4997, -0.4999].
    adv = passk_advantages(f, 4, 2)
    torch.testing.assert_close(adv, torch.tensor([1 / 0.5001, -1 / 3 / 0.5001, -1 / 3 / 0.5001, -1 / 3 / 0.5001]),
                               atol=1e-6, rtol=0)
    torch.testing.assert_close(adv, 4 / 3 * outcome_advantages(f, 4), atol=1e-6, rtol=0)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7])
def test_passk_rewards_and_estimate_match_every_k_subset_enumerated(n):
    import itertools

    from pipeline.passk import passk_estimate, passk_rewards

    for f in itertools.product([0, 1], repeat=n):  # every group of n binary rewards
        for k in range(1, n + 1):
            want, rho = _passk_brute_force(list(f), k)
            got = passk_rewards(torch.tensor(f, dtype=torch.float32), n, k)
            assert got.tolist() == pytest.approx(want, abs=1e-6), (f, k)
            assert passk_estimate(torch.tensor(f), n, k).item() == pytest.approx(rho, abs=1e-6), (f, k)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_passk_advantages_match_a_plain_loop_on_random_batches(scale):
    from pipeline.passk import passk_advantages

    rng = random.Random(0)
    for n, k in ((4, 2), (5, 3), (8, 4), (6, 1), (8, 7)):
        f = [rng.random() < p for p in (0.2, 0.5, 0.8) for _ in range(n)]  # three groups, hard to easy
        rewards = torch.tensor(f, dtype=torch.float32)
        # Plain loop: each group's enumerated pass@k rewards minus their mean, over the std outcome mode takes of
        # the 0/1 rewards (the group's unbiased one, the batch's, or 1 with no eps).
        batch_std = statistics.stdev(map(float, f))
        want = []
        for g in range(3):
            group = [int(x) for x in f[g * n : (g + 1) * n]]
            r, _ = _passk_brute_force(group, k)
            mean = sum(r) / n
            std = {"group": statistics.stdev(group), "batch": batch_std, "none": None}[scale]
            want += [(x - mean) / (std + 1e-4) if std is not None else x - mean for x in r]
        assert passk_advantages(rewards, n, k, scale).tolist() == pytest.approx(want, abs=1e-5), (n, k)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_passk_at_k_1_is_outcome_mode_exactly(scale):
    from pipeline.passk import passk_advantages

    rewards = (torch.rand(6 * 8, generator=torch.Generator().manual_seed(1)) < 0.4).float()
    assert torch.equal(passk_advantages(rewards, 8, 1, scale), outcome_advantages(rewards, 8, scale))


def test_passk_invariants_group_sums_and_weights():
    from pipeline.passk import passk_advantages, passk_estimate, passk_group_weights, passk_rewards

    n, k = 8, 3
    rewards = torch.tensor([float(i < c) for c in range(n + 1) for i in range(n)])  # c = 0..8 right per group
    r = passk_rewards(rewards, n, k).view(-1, n)
    torch.testing.assert_close(r.sum(1), n * k * passk_estimate(rewards, n, k), atol=1e-12, rtol=0)
    adv = passk_advantages(rewards, n, k, "none").view(-1, n)
    torch.testing.assert_close(adv.sum(1), torch.zeros(n + 1), atol=1e-5, rtol=0)  # centred per group
    # The weight of a group falls as its right samples grow, and is 0 once c > n - k: every (k-1)-subset of the
    # other n - 1 samples then holds a right one, so a wrong sample's sets pass as often as a right one's.
    w = passk_group_weights(rewards, n, k).view(-1, n)[:, 0].tolist()
    assert w == pytest.approx([k * math.comb(max(n - 1 - c, 0), k - 1) / math.comb(n - 1, k - 1)
                               for c in range(n + 1)])
    assert all(a >= b for a, b in zip(w, w[1:])) and w[n - k + 1 :] == [0.0] * k


@pytest.mark.parametrize(("rewards", "k", "match"), [
    ([1.0, 0.5, 0.0, 1.0], 2, "reward of row 1 is 0.5; pass@k needs binary rewards"),
    ([1.0, float("nan"), 0.0, 1.0], 2, "reward of row 1 is nan"),
    ([1.0, 0.0, 0.0, 1.0], 5, r"k must be an integer in \[1, group_size = 4\], got 5"),
    ([1.0, 0.0, 0.0, 1.0], 0, "got 0"),
    ([1.0, 0.0, 0.0], 2, "not a multiple of group_size"),
])
def test_passk_bad_inputs_are_one_clear_error(rewards, k, match):
    from pipeline.passk import passk_advantages

    with pytest.raises(ValueError, match=match):
        passk_advantages(torch.tensor(rewards), 4, k)


def test_scheduled_k_cuts_the_clock_into_equal_parts():
    from pipeline.passk import scheduled_k

    # PKPO's annealing, high to low: [8, 4, 2, 1] over 10 steps -> parts of 2.5 steps, each step in the part its
    # start falls in (step * 4 // 10); over 3 rounds, [8, 1] cuts at 1.5 rounds: rounds 1 and 2 (done 0, 1) train
    # pass@8, round 3 (done 2) pass@1.
    assert [scheduled_k([8, 4, 2, 1], s, 10) for s in range(10)] == [8, 8, 8, 4, 4, 2, 2, 2, 1, 1]
    assert [scheduled_k([8, 1], r, 3) for r in range(3)] == [8, 8, 1]
    assert scheduled_k([8, 1], 7, 3) == 1  # past the end: the last value
    with pytest.raises(ValueError, match="at least one value"):
        scheduled_k([], 0, 1)


def test_passk_mode_reads_the_scheduled_k_and_logs_the_pass_at_k_reward():
    from pipeline.config import SupervisionConfig
    from pipeline.modes import MODES, AdvantageInputs
    from pipeline.passk import passk_advantages, passk_estimate

    s = SupervisionConfig(mode="passk", passk={"schedule": [3, 2, 1]})
    rewards = torch.tensor([[1.0], [0.0], [0.0], [0.0], [1.0], [1.0], [0.0], [0.0]])  # (B, F): the verifier only
    by_step = []
    for step in range(6):
        x = AdvantageInputs(None, None, rewards, [3] * 8, s, group_size=4, scale="group", step=(step, 6))
        adv, figures = MODES["passk"].advantages(x)
        k = int(figures["k"])
        assert torch.equal(adv, passk_advantages(rewards[:, 0], 4, k, "group"))
        assert figures["reward"] == pytest.approx(passk_estimate(rewards[:, 0], 4, k).mean().item())
        by_step.append(k)
    assert by_step == [3, 3, 2, 2, 1, 1]
    # k = 1: the pass@k reward is pass@1, the mean verifier reward TRL logs as `reward`.
    assert figures["reward"] == pytest.approx(rewards.mean().item())
    # Over rounds: the round's position, not the step's.
    rounds = SupervisionConfig(mode="passk", passk={"schedule": [3, 1], "over": "rounds"})
    ks = [MODES["passk"].advantages(AdvantageInputs(None, None, rewards, [3] * 8, rounds, 4, step=(0, 6),
                                                    round=(r, 2)))[1]["k"] for r in range(2)]
    assert ks == [3.0, 1.0]


def test_passk_mode_refuses_a_reward_that_is_not_binary_naming_it():
    from pipeline.config import SupervisionConfig
    from pipeline.modes import MODES, AdvantageInputs

    rewards = torch.tensor([[1.0], [0.5], [0.0], [0.0]])
    x = AdvantageInputs(None, None, rewards, [3] * 4, SupervisionConfig(mode="passk", passk={"k": 2}), 4,
                        reward_names=("partial_credit",))
    with pytest.raises(ValueError, match="passk mode needs a binary reward: reward function 'partial_credit' "
                                         "returned 0.5 for completion 1"):
        MODES["passk"].advantages(x)


@pytest.mark.parametrize(("data", "expected"), [
    ({"passk": {"k": 9}}, "supervision.passk.k: k = 9 is more than grpo.num_generations (8)"),
    ({"passk": {"k": 8}}, "supervision.passk.k: k = 8 equals grpo.num_generations: every sample of a group"),
    ({"passk": {"k": 0}}, "supervision.passk.k: Input should be greater than or equal to 1"),
    ({"passk": {"schedule": [16, 1]}}, "supervision.passk.schedule: k = 16 is more than grpo.num_generations (8)"),
    ({"passk": {"schedule": [4, 0]}}, "supervision.passk.schedule.1: Input should be greater than or equal to 1"),
    ({"passk": {"k": 2, "schedule": [4, 1]}}, "supervision.passk: give passk.k (one k) or passk.schedule"),
    ({"passk": {"over": "rounds"}}, "supervision.passk: passk.over is the clock of passk.schedule"),
    ({"rewards": {"verifier": 1.0, "orm": 0.5}}, "supervision: passk mode reads the verifier's 0/1 reward alone "
                                                 "(pass@k counts right samples): drop orm from supervision.rewards"),
])
def test_passk_bad_values_are_refused_at_load_naming_the_field(data, expected):
    from pipeline.config import ConfigError
    from pipeline.loading import config_from_dict

    extra = {"reward_model": {"kinds": ["prm", "orm"]}} if "rewards" in data else {}
    with pytest.raises(ConfigError, match=re.escape(expected)):
        config_from_dict({"supervision": {"mode": "passk", **data}, "grpo": {"num_generations": 8}, **extra})


def test_passk_config_loads_and_its_section_is_refused_in_other_modes():
    from pipeline.config import ConfigError
    from pipeline.loading import config_from_dict

    cfg = config_from_dict({"supervision": {"mode": "passk", "passk": {"schedule": [6, 4, 1], "over": "rounds"}},
                            "grpo": {"num_generations": 8}})
    assert cfg.supervision.passk.k_values() == [6, 4, 1]
    # TRL's default num_generations (8) where the YAML gives none.
    with pytest.raises(ConfigError, match=r"supervision.passk.k: k = 8 equals grpo.num_generations"):
        config_from_dict({"supervision": {"mode": "passk", "passk": {"k": 8}}})
    with pytest.raises(ConfigError, match=r"passk \{'k': 2\} is only used in passk mode, not in outcome mode"):
        config_from_dict({"supervision": {"mode": "outcome", "passk": {"k": 2}}}, check_trl=False)
    # A stored config with every default written out (the run directory's) loads in any mode.
    dumped = config_from_dict({"supervision": {"mode": "outcome"}}, check_trl=False).model_dump(mode="json")
    assert config_from_dict(dumped, check_trl=False).supervision.passk.k == 4


def test_passk_docstring_examples_hold():
    import doctest

    import pipeline.passk

    assert doctest.testmod(pipeline.passk).failed == 0
