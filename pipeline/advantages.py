"""GRPO advantages: outcome supervision (one scalar per completion), process supervision (per step, sum or
min credit, normalised over the group or per step position), hybrid (outcome plus weighted process), Online RFT.

Both follow DeepSeekMath (arXiv 2402.03300) §4.1.2 and §4.1.3, with TRL's numerical conventions so that
outcome advantages computed here equal the ones `GRPOTrainer` computes itself:

* the std is the *unbiased* one (`torch.std`'s default), not the population std of the paper's formula;
* `1e-4` is added to the std before dividing, so a group whose rewards are all equal gets zero advantages
  instead of `0 / 0`.

Worked example (DeepSeekMath §4.1.2 outcome supervision, rewards [1, 0, 1]): mean 0.667, unbiased std 0.577, advantages
[0.577, -1.155, 0.577] (the population std 0.471 would give [0.707, -1.414, 0.707]).

Everything here is a pure function of tensors, lists and numbers; batches are laid out as TRL lays them out,
`B = num_prompts * group_size` rows with the `group_size` completions of one prompt on consecutive rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from pipeline.credit import BASELINES, CENTRINGS, CREDITS

STD_EPS = 1e-4
"""Added to the std before dividing (TRL's constant), so equal rewards give 0, not NaN."""

SCALES = ("group", "batch", "none")
"""TRL's `scale_rewards`, carried over to steps. The process choices (credit, baseline, centring) are the tables of
`pipeline.credit`, whose tensor math is `pipeline.credit_math`."""


def _in_loss(lengths: Sequence[int], width: int) -> Tensor:
    """(B, width) bool: the tokens in the loss, `t < lengths[i]`."""
    return torch.arange(width).unsqueeze(0) < torch.tensor([int(n) for n in lengths]).unsqueeze(1)


def _check_group_size(batch_size: int, group_size: int) -> None:
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if batch_size % group_size != 0:
        raise ValueError(
            f"batch size {batch_size} is not a multiple of group_size {group_size}: "
            "each prompt needs exactly group_size completions on consecutive rows"
        )


def outcome_advantages(rewards: Tensor, group_size: int, scale: str = "group") -> Tensor:
    """Group-normalised outcome advantages (DeepSeekMath §4.1.2), as TRL 1.16 computes them.

    `A_i = (r_i - mean(group)) / (std + 1e-4)`; the same value then applies to every token of completion i.
    The std is unbiased (`torch.std`), per group for `scale="group"` and over the whole batch for
    `scale="batch"` (the rewards are still centred on their *group* mean, as in TRL); `scale="none"` only
    centres. A group (or batch) of one completion has std 0, again as in TRL.

    Args:
        rewards: (B,) one scalar reward per completion; B a multiple of `group_size`, consecutive rows
            one group.
        group_size: G, the number of completions sampled per prompt.
        scale: "group", "batch" or "none" (TRL's `scale_rewards`).

    Returns:
        (B,) float advantages (float32 unless `rewards` is a wider float type).

    Raises:
        ValueError: on an unknown `scale`, a bad `group_size`, a `rewards` tensor that is not 1-D, or a
            non-finite reward (the message names its row).
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must have shape (B,), got {tuple(rewards.shape)}")
    _check_group_size(rewards.numel(), group_size)
    if not rewards.is_floating_point():
        rewards = rewards.float()  # verifier rewards often arrive as 0/1 integers
    bad = (~torch.isfinite(rewards)).nonzero().flatten()
    if bad.numel():
        row = int(bad[0])
        raise ValueError(f"reward of row {row} is {rewards[row].item()}; rewards must be finite")

    grouped = rewards.view(-1, group_size)  # (num_groups, G)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).flatten()  # (B,)
    if scale == "none":
        return centred
    if scale == "group":
        # torch.std of a single element is NaN; TRL takes it as 0 there, so do we.
        std = grouped.std(dim=1) if group_size > 1 else torch.zeros(grouped.shape[0], dtype=rewards.dtype)
        std = std.repeat_interleave(group_size)  # (B,)
    else:
        std = rewards.std() if rewards.numel() > 1 else rewards.new_zeros(())  # () broadcast over (B,)
    return centred / (std + STD_EPS)  # (B,)


def rft_advantages(rewards: Tensor) -> Tensor:
    """Online RFT's gradient coefficient (DeepSeekMath §5.2.1, `GC_RFT = I(o)`): 1 for a correct completion, else 0.

    No group baseline and no scaling: a wrong completion gets no gradient (never a negative one) and a group
    that is all correct still reinforces every completion, where GRPO's group-normalised advantages give 0.
    Worked example: verifier rewards [1, 0, 1, 1] -> [1, 0, 1, 1] (GRPO, group of 4: [0.433, -1.299, 0.433, 0.433]).

    Args:
        rewards: (B,) verifier rewards, each exactly 0 or 1.

    Returns:
        (B,) float32 advantages, the same value for every token of a completion.

    Raises:
        ValueError: `rewards` not 1-D, or a value other than 0 or 1 (the message names its row).
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must have shape (B,), got {tuple(rewards.shape)}")
    bad = ((rewards != 0) & (rewards != 1)).nonzero().flatten()
    if bad.numel():
        row = int(bad[0])
        raise ValueError(f"reward of row {row} is {rewards[row].item()}; Online RFT needs verifier rewards of 0 or 1")
    return rewards.to(torch.float32)  # (B,)


def _validate_process_inputs(
    step_rewards: Sequence[Sequence[float]], step_ends: Sequence[Sequence[int]], length: int, group_size: int
) -> None:
    """One clear error naming the completion and step, before any tensor work."""
    if len(step_rewards) != len(step_ends):
        raise ValueError(
            f"step_rewards has {len(step_rewards)} completions but step_ends has {len(step_ends)}"
        )
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    _check_group_size(len(step_rewards), group_size)
    for i, (rewards_i, ends_i) in enumerate(zip(step_rewards, step_ends)):
        if len(rewards_i) != len(ends_i):
            raise ValueError(
                f"completion {i}: {len(rewards_i)} step rewards but {len(ends_i)} step ends"
            )
        previous = -1
        for j, (reward, end) in enumerate(zip(rewards_i, ends_i)):
            if not math.isfinite(float(reward)):
                raise ValueError(f"completion {i}, step {j}: reward {reward} is not finite")
            if isinstance(end, bool) or int(end) != end:
                raise ValueError(f"completion {i}, step {j}: step end {end!r} is not an integer")
            if not 0 <= end < length:
                raise ValueError(f"completion {i}, step {j}: step end {end} is outside [0, {length})")
            if end <= previous:
                raise ValueError(
                    f"completion {i}, step {j}: step end {end} does not come after the previous one "
                    f"({previous}); step ends must be strictly increasing"
                )
            previous = end


def _normalised_steps(
    step_rewards: Sequence[Sequence[float]],
    step_ends: Sequence[Sequence[int]],
    group_size: int,
    scale: str,
    baseline: str = "group",
) -> tuple[Tensor, Tensor, Tensor]:
    """Every step of the batch flattened, (S,) each: its completion, its end token, its normalised reward."""
    batch_size = len(step_rewards)

    # Flatten every step of the batch into one vector; each step keeps its completion, group and end.
    counts = torch.tensor([len(r) for r in step_rewards], dtype=torch.long)  # (B,)
    completion = torch.repeat_interleave(torch.arange(batch_size), counts)  # (S,)
    # float64 for the statistics: the sum of many rewards should not lose the 4th decimal.
    reward = torch.tensor([float(r) for rs in step_rewards for r in rs], dtype=torch.float64)  # (S,)
    end = torch.tensor([int(e) for es in step_ends for e in es], dtype=torch.long)  # (S,)

    # The segment a step is normalised in: its group, or its group and its index in the completion (the baseline).
    segment, num_segments = BASELINES[baseline].segments(completion, counts, group_size)  # (S,), N

    # Per-segment mean and unbiased std (segment sums, no Python loop).
    n = torch.zeros(num_segments, dtype=torch.float64).index_add_(0, segment, torch.ones_like(reward))  # (N,)
    total = torch.zeros(num_segments, dtype=torch.float64).index_add_(0, segment, reward)  # (N,)
    mean = total / n.clamp(min=1)  # (N,)  segments without steps never get read below
    centred = reward - mean[segment]  # (S,)
    if scale == "none":
        normalised = centred
    elif scale == "batch":
        std = reward.std() if reward.numel() > 1 else reward.new_zeros(())  # () over every step of the batch
        normalised = centred / (std + STD_EPS)
    else:
        squares = torch.zeros(num_segments, dtype=torch.float64).index_add_(0, segment, centred**2)
        std = torch.where(n > 1, (squares / (n - 1).clamp(min=1)).sqrt(), torch.zeros_like(n))  # (N,)
        normalised = centred / (std[segment] + STD_EPS)  # (S,)
    return completion, end, normalised


def process_advantages(
    step_rewards: Sequence[Sequence[float]],
    step_ends: Sequence[Sequence[int]],
    length: int,
    group_size: int,
    scale: str = "group",
    credit: str = "sum",
    baseline: str = "group",
) -> Tensor:
    """Per-token advantages from per-step PRM rewards (DeepSeekMath §4.1.3, process supervision).

    All step rewards of one group (the `group_size` consecutive completions of one prompt) are normalised
    together, `r~ = (r - mean) / (std + 1e-4)` with mean and unbiased std over every step of every
    completion of the group (std 0 when the group has a single step). `scale` is TRL's `scale_rewards`
    carried over to steps: "group" as above, "batch" divides by the std of every step of the batch (still
    centred on the group's mean, as TRL does), "none" only centres. Token t of completion i then gets the
    sum of the normalised rewards of its steps that end at or after t:

        A[i, t] = sum_{j : step_ends[i][j] >= t} r~[i][j]

    so the first tokens carry the whole solution's signal and the tokens after the last step end get 0
    (GRPO first moves the last step's end onto the eos, `extend_last_step`).
    Worked example (DeepSeekMath §4.1.3 process supervision): group steps [0.5, 1, 1, 1], [0.5, 0], [1] -> mean 0.714, std 0.393,
    output 1 normalised [-0.545, 0.726, 0.726, 0.726], its tokens get 1.634, 2.179, 1.453, 0.726 by step.

    `credit="min"` is PURE's min-form credit assignment (arXiv 2504.15275, "Stop Summation"): token t gets
    the *minimum* of the normalised rewards of its steps ending at or after t, so its credit is tied to the
    weakest step still ahead of it and cannot be collected from many mediocre steps (the paper's reward
    hacking of summed PRM returns); again 0 after the last step end and for a completion without steps:

        A[i, t] = min_{j : step_ends[i][j] >= t} r~[i][j]

    Worked example, the same group: output 1's tokens get -0.545 (step 1: min of all four), 0.726, 0.726,
    0.726 by step; output 2's [-0.545, -1.816] give -1.816 on both steps; output 3 gets 0.726.

    `baseline="position"` normalises each step only with the group's steps at the same index j (the j-th
    steps of the G completions), mean and std as above. A PRM whose scores fall with a step's position
    whatever it says (seen with SmolLM2 on ~100 first-error rows a round, docs/lab/smollm2-arith.md) gives
    DeepSeekMath's pooled baseline a fixed schedule, early steps above the mean and the `Answer:` line below it
    in every completion; per position that prior cancels and only the ranking of the same step across completions
    is left. A step no other completion of the group reaches has no one to compare with: 0.
    Worked example, the same group: index 0 holds [0.5, 0.5, 1] (mean 0.667, std 0.289), index 1 [1, 0]
    (mean 0.5, std 0.707), indices 2 and 3 one step each. Normalised: output 1 [-0.577, 0.707, 0, 0], its
    tokens get 0.130, 0.707, 0, 0 by step (sum); output 2 [-0.577, -0.707] gives -1.284, -0.707; output 3
    gets 1.154.

    Args:
        step_rewards: B lists; `step_rewards[i][j]` is the PRM reward of step j of completion i. A
            completion with no steps gets an all-zero row and does not count in its group's statistics.
        step_ends: B lists, same lengths as `step_rewards`; `step_ends[i][j]` is the 0-based index
            (inclusive) of step j's last token in the completion, strictly increasing, in [0, length).
        length: T, the padded completion length of the batch.
        group_size: G, completions per prompt; B must be a multiple of it.
        scale: "group" (default), "batch" or "none".
        credit: "sum" (default, DeepSeekMath), "min" (PURE), "step" (a token gets its own step's normalised
            reward only), or another entry of `pipeline.credit.CREDITS`.
        baseline: "group" (default, DeepSeekMath: every step of the group), "position", or another entry of
            `pipeline.credit.BASELINES`.

    Returns:
        (B, T) float32 advantages, ready for TRL's `(B, T)` advantages hook.

    Raises:
        ValueError: mismatched list lengths, step ends not increasing or out of range, or a non-finite
            reward (naming completion i and step j); a bad `group_size`, `length`, `scale`, `credit` or
            `baseline`.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    CREDITS[credit], BASELINES[baseline]  # an unknown one: the registry's error, listing the known ones
    _validate_process_inputs(step_rewards, step_ends, length, group_size)
    batch_size = len(step_rewards)
    completion, end, normalised = _normalised_steps(step_rewards, step_ends, group_size, scale, baseline)  # (S,) each

    return _credited(completion, end, normalised, batch_size, length, credit)


def _credited(completion: Tensor, end: Tensor, value: Tensor, batch_size: int, length: int, credit: str) -> Tensor:
    """(B, T) float32 token advantages from step values, (S,) each with its completion and end token, by the credit's
    entry (`pipeline.credit.CREDITS`): the sum ("sum"), the minimum ("min") of the values of the steps ending at or
    after each token, or the value of its own step ("step"); 0 after the last step end."""
    return CREDITS[credit].credited(completion, end, value, batch_size, length).to(torch.float32)  # (B, T)


def leave_one_out_means(values: Sequence[float], group_size: int) -> list[float]:
    """Each completion's mean of the *other* completions' `values` in its group (B of them, G consecutive ones a
    group): PAV's V_0, the prompt's value estimated without the output being credited (arXiv 2410.08146).

    A group of one has no other output: its own value is taken, so its progress nets V_K - V_0 = 0 (no signal,
    as GRPO's outcome advantage of a group of one is 0).

    >>> leave_one_out_means([1.0, 0.0, 0.0, 1.0, 1.0, 1.0], 3)
    [0.0, 0.5, 0.5, 1.0, 1.0, 1.0]
    >>> leave_one_out_means([1.0, 0.0], 1)
    [1.0, 0.0]
    """
    _check_group_size(len(values), group_size)
    if group_size == 1:
        return [float(v) for v in values]
    sums = [sum(values[g : g + group_size]) for g in range(0, len(values), group_size)]
    return [(sums[i // group_size] - v) / (group_size - 1) for i, v in enumerate(values)]


def progress_anchors(step_values: Sequence[Sequence[float]], outcomes: Sequence[float],
                     group_size: int) -> tuple[list[float], list[list[float]]]:
    """PAV's anchors for `progress_advantages`: V_0 the leave-one-out mean of the group's other outcomes, and V_K,
    the value after the last step, the verifier's outcome itself (REFERENCE, "Progress credit"). With both, an
    output's progress telescopes to its outcome minus the others' mean, 0 in an all-correct or all-wrong group:
    the process term then only moves credit between steps.

    Args:
        step_values: B lists, V[i][k] after step k from the prover (a PRM, gold labels); a completion without
            steps (out of the loss) stays without.
        outcomes: B verifier rewards (0/1).
        group_size: G.

    Returns:
        (start_values, step_values): B values V_0, and B lists with the last value replaced by the outcome.

    >>> progress_anchors([[0.9, 0.8], [0.7], []], [1.0, 1.0, 0.0], 3)
    ([0.5, 0.5, 1.0], [[0.9, 1.0], [1.0], []])
    """
    if len(outcomes) != len(step_values):
        raise ValueError(f"outcomes has {len(outcomes)} entries for {len(step_values)} completions")
    ends = [[*v[:-1], float(o)] if len(v) else [] for v, o in zip(step_values, outcomes)]
    return leave_one_out_means([float(o) for o in outcomes], group_size), ends


def uniform_group_means(advantages: Tensor, lengths: Sequence[int], outcomes: Sequence[float],
                        group_size: int) -> dict[str, float]:
    """The per-token mean of (process) advantages over the loss tokens of the groups whose outcomes are all 1
    ("all_correct") and of those all 0 ("all_wrong"); a key is absent where the batch has no such group (or no
    loss token in them). Where the verifier gives no signal, a process term that is not ~0 there is a bias
    (REFERENCE, "Progress credit": a PRM's last value in V_K's place pushes every correct output down).

    >>> uniform_group_means(torch.tensor([[1.0, -1.0], [0.5, 0.0], [2.0, 2.0], [3.0, 3.0]]), [2, 1, 2, 0],
    ...                     [1, 1, 0, 1], 2)
    {'all_correct': 0.16666666666666666}
    """
    _check_group_size(len(outcomes), group_size)
    out = {}
    for key, want in (("all_correct", 1.0), ("all_wrong", 0.0)):
        rows = [i for g in range(0, len(outcomes), group_size)
                if all(float(o) == want for o in outcomes[g : g + group_size]) for i in range(g, g + group_size)]
        used = loss_tokens(advantages[rows], [lengths[i] for i in rows]) if rows else advantages.new_zeros(0)
        if used.numel():
            out[key] = used.mean().item()
    return out


def progress_advantages(
    step_values: Sequence[Sequence[float]],
    step_ends: Sequence[Sequence[int]],
    length: int,
    start_values: Sequence[float],
    credit: str = "step",
) -> Tensor:
    """Per-token advantages from the progress each step makes (PAV, Setlur et al., arXiv 2410.08146).

    Step k of completion i is credited with its progress, the change in the value (the probability of reaching
    the right answer) it makes: d[i][k] = V[i][k] - V[i][k-1], with V[i][0] = `start_values[i]` (for GRPO the
    mean verifier reward of the group's other outputs, a Monte-Carlo estimate of V(q) under the policy that sampled
    them; and V[i][K] the output's own outcome: `progress_anchors`). Progress is already a difference against the
    prompt's value, so it is not normalised again. Token t gets its own step's progress (`credit` "step"), or the sum ("sum": it telescopes to V[i][K] - V[i][k(t)-1])
    or the minimum ("min") of the progress of the steps ending at or after it; 0 after the last step end.

    Worked example (REFERENCE, "Progress credit": oracle values, a group of 2): output 1's steps right, right,
    right (V = 1, 1, 1), output 2's right, wrong, wrong (V = 1, 0, 0), verifier rewards [1, 0], V_0 = 0.5 (a prover's value of the
    prompt). Progress: output 1 [0.5, 0, 0]; output 2 [0.5, -1, 0]. With TRL's outcome advantages [0.707, -0.707] and
    w = 1 (hybrid), output 2's step 1 gets -0.207 (the right step is penalised least), step 2 -1.707 (the
    error, most), step 3 -0.707. GRPO's leave-one-out V_0 in this group of 2 is the other output's outcome, 0 and
    1: progress [1, 0, 0] and [0, -1, 0], each output's summing to its outcome minus the other's.

    Args:
        step_values: B lists; V[i][k] after step k (a PRM's score at its end, a gold label, an MC estimate).
        step_ends: B lists, as `process_advantages`'.
        length: T, the padded completion length of the batch.
        start_values: B values before the first step.
        credit: "step" (default), "sum" or "min".

    Returns:
        (B, T) float32 advantages.
    """
    CREDITS[credit]  # an unknown one: the registry's error, listing the known ones
    if len(start_values) != len(step_values):
        raise ValueError(f"start_values has {len(start_values)} entries for {len(step_values)} completions")
    _validate_process_inputs(step_values, step_ends, length, 1)
    progress = [[v - prev for prev, v in zip([v0, *values[:-1]], values)]
                for v0, values in zip(start_values, step_values)]
    counts = torch.tensor([len(p) for p in progress], dtype=torch.long)  # (B,)
    completion = torch.repeat_interleave(torch.arange(len(progress)), counts)  # (S,)
    end = torch.tensor([int(e) for es in step_ends for e in es], dtype=torch.long)  # (S,)
    value = torch.tensor([d for p in progress for d in p], dtype=torch.float64)  # (S,)
    return _credited(completion, end, value, len(progress), length, credit)


def prime_advantages(token_rewards: Tensor, outcomes: Tensor, lengths: Sequence[int], group_size: int,
                     process_coef: float = 5.0, outcome_coef: float = 5.0) -> Tensor:
    """PRIME's advantages from an implicit PRM's token rewards and the verifier (Cui et al., arXiv 2502.01456), as
    verl's PRIME recipe computes them (`recipe/prime/prime_core_algos.py`, `compute_rloo_advantage_return`).

    Each reward source gets its own leave-one-out baseline within the group of n outputs, the sources are weighted
    and summed, turned into returns (reverse cumulative sums, gamma 1) and whitened over the batch's loss tokens:

        process:  r'[i, t] = r[i, t] * n/(n-1) - (sum_j m_j)/(n-1)      m_j the mean token reward of output j
        outcome:  o'[i]    = o[i] * n/(n-1) - (sum_j o_j)/(n-1)         placed on output i's last token
        A[i, t]  = whiten( sum_{s >= t} (c_p * r'[i, s] + c_o * o'[i, s]) )

    `whiten` is verl's `masked_whiten`: (x - mean) / sqrt(var + 1e-8), mean and unbiased variance over the loss
    tokens of the whole batch. A token reward is a reward summed forward into a return, not a step value summed
    over later steps; the baseline makes each group's process rewards, and so its process returns' sums, centred.

    Worked example (n = 3, one group, lengths 2, 1, 2; c_p = c_o = 1): token rewards [0.2, 0.4], [0.3], [-0.1, 0.1]
    have means m = 0.3, 0.3, 0 (sum 0.6): r' = r * 1.5 - 0.3 = [0, 0.3], [0.15], [-0.45, -0.15]. Outcomes [1, 1, 0]
    give o' = o * 1.5 - 1 = 0.5, 0.5, -1 on the last tokens. Returns [0.8, 0.8], [0.65], [-1.6, -1.15]; over
    these 5 tokens mean -0.1, unbiased std 1.1763: A = [0.7651, 0.7651], [0.6376], [-1.2752, -0.8926].

    Args:
        token_rewards: (B, T) r[i, t] = beta * log(pi_phi / pi_ref) of token t of output i (0 where the PRM
            reads none); only the loss tokens (`t < lengths[i]`) count.
        outcomes: (B,) the verifier's rewards.
        lengths: B loss-token counts (0: masked out; such an output's mean token reward counts as 0 in its
            group's baseline, as in verl, and it gets no advantage).
        group_size: n >= 2 (the baseline needs another output).
        process_coef, outcome_coef: c_p and c_o (PRIME's recipe: 5 and 5).

    Returns:
        (B, T) float32 advantages, 0 outside the loss tokens.
    """
    if group_size < 2:
        raise ValueError(f"PRIME's leave-one-out baseline needs at least 2 outputs per prompt, got {group_size}")
    _check_group_size(token_rewards.shape[0], group_size)
    if outcomes.shape != (token_rewards.shape[0],) or len(lengths) != token_rewards.shape[0]:
        raise ValueError(f"token_rewards {tuple(token_rewards.shape)}, outcomes {tuple(outcomes.shape)} and "
                         f"{len(lengths)} lengths do not describe the same batch")
    n, width = group_size, token_rewards.shape[1]
    count = torch.tensor([int(x) for x in lengths], dtype=torch.float64)  # (B,)
    mask = _in_loss(lengths, width)  # (B, T)
    r = torch.where(mask, token_rewards.double(), 0.0)  # (B, T)
    m = r.sum(1) / count.clamp(min=1)  # (B,) each output's mean token reward
    others = m.view(-1, n).sum(1).repeat_interleave(n) / (n - 1)  # (B,)
    process = torch.where(mask, r * n / (n - 1) - others.unsqueeze(1), 0.0)  # (B, T)
    o = outcomes.double()  # (B,)
    o_loo = o * n / (n - 1) - o.view(-1, n).sum(1).repeat_interleave(n) / (n - 1)  # (B,)
    last = torch.zeros_like(r)  # (B, T) the outcome on each output's last loss token
    live = count > 0
    last[live.nonzero().flatten(), (count[live] - 1).long()] = o_loo[live]
    returns = (process_coef * process + outcome_coef * last).flip(1).cumsum(1).flip(1)  # (B, T)
    used = returns[mask]  # (tokens,)
    if used.numel() < 2:  # verl refuses a variance of fewer than 2 tokens; nothing to whiten
        return torch.zeros_like(returns, dtype=torch.float32)
    whitened = (returns - used.mean()) * torch.rsqrt(used.var() + 1e-8)  # (B, T) unbiased var, as verl's
    return torch.where(mask, whitened, 0.0).to(torch.float32)  # (B, T)


def extend_last_step(step_ends: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[list[int]]:
    """Step ends with each completion's last step running to its last token: the eos when it stopped.

    Decided (issue 15): DeepSeekMath's sum gives every token after the last step end 0, and the eos always
    lies there (a step ends at its newline or last character, the eos follows), so stopping would never be
    reinforced or discouraged. The eos (and any blank tokens before it) belongs to the last step instead:
    it carries the last step's normalised reward, and every earlier token keeps its advantage, since the
    sum over the steps ending at or after it is unchanged. Outcome mode does the same (the scalar advantage
    is on every token, eos included).

    Worked example: a completion of 13 tokens (eos at 12) whose steps end at tokens [2, 5, 8, 10] gets
    [2, 5, 8, 12]; with the worked example's output 1 (normalised [-0.545, 0.726, 0.726, 0.726]) tokens 11 and
    12 get 0.726 instead of 0. A completion with no steps (masked, `lengths` 0) stays without steps.

    Args:
        step_ends: B lists of strictly increasing token indices, as `process_advantages` takes them.
        lengths: B completion lengths in tokens (eos included; 0 for a completion out of the loss).

    Returns:
        B new lists; only the last entry of each changes, to `lengths[i] - 1`.

    Raises:
        ValueError: mismatched lengths, or a step end at or beyond its completion's length (naming it).
    """
    if len(step_ends) != len(lengths):
        raise ValueError(f"step_ends has {len(step_ends)} completions but lengths has {len(lengths)}")
    out = []
    for i, (ends, n) in enumerate(zip(step_ends, lengths)):
        ends = [int(e) for e in ends]
        if ends and ends[-1] >= n:
            raise ValueError(f"completion {i}: step end {ends[-1]} is not inside its {n} tokens")
        out.append(ends[:-1] + [int(n) - 1] if ends else [])
    return out


def advantage_stats(advantages: Tensor, lengths: Sequence[int]) -> dict[str, float]:
    """Mean, std (unbiased), min, max and root mean square of the advantages on the tokens that enter the loss,
    and the mean's share of the RMS, |mean| / RMS.

    What GRPO actually trains on: TRL logs the statistics of its own outcome advantages, which process and
    rft modes replace. Token t of completion i counts when `t < lengths[i]` (a masked completion has
    length 0 and does not count); an all-empty batch gives NaN statistics. Outcome advantages are centred
    per group, so their per-token mean is near 0 (exactly 0 with equal lengths); DeepSeekMath's process
    advantages are not, and `mean_share` says how much of the update pushes every sampled token the same way
    (REFERENCE, "The mean of process advantages": -0.295 per token in a group of 8 with two slips).

    Args:
        advantages: (B, T) per-token advantages, or (B,) one advantage per completion (every token's).
        lengths: B token counts in the loss (eos included).

    >>> {k: round(v, 4) for k, v in advantage_stats(torch.tensor([[1.0, 2.0, 9.0], [3.0, 0.0, 0.0]]), [2, 1]).items()}
    {'mean': 2.0, 'std': 1.0, 'min': 1.0, 'max': 3.0, 'rms': 2.1602, 'mean_share': 0.9258}
    """
    used = loss_tokens(advantages, lengths)  # (tokens,)
    if used.numel() == 0:
        return dict.fromkeys(("mean", "std", "min", "max", "rms", "mean_share"), float("nan"))
    std = used.std().item() if used.numel() > 1 else 0.0
    mean, rms = used.mean().item(), used.square().mean().sqrt().item()
    return {"mean": mean, "std": std, "min": used.min().item(), "max": used.max().item(), "rms": rms,
            "mean_share": abs(mean) / rms if rms > 0 else 0.0}


def loss_tokens(advantages: Tensor, lengths: Sequence[int], width: int | None = None) -> Tensor:
    """The float64 advantages of the tokens in the loss (`t < lengths[i]`), row after row; a (B,) tensor is
    one advantage per completion, repeated over its tokens (`width` of them at most, default the longest)."""
    if advantages.dim() == 1:
        width = width if width is not None else max([int(n) for n in lengths], default=0)
        advantages = advantages.unsqueeze(1).expand(-1, max(width, 1))  # (B, T)
    if advantages.shape[0] != len(lengths):
        raise ValueError(f"advantages have {advantages.shape[0]} rows but lengths has {len(lengths)}")
    return advantages.detach().cpu().double()[_in_loss(lengths, advantages.shape[1])]  # (tokens,)


def centred_advantages(advantages: Tensor, lengths: Sequence[int], group_size: int, over: str = "group") -> Tensor:
    """Process advantages with their per-token mean removed, over the tokens in the loss: each group's (`over`
    "group": the G completions of one prompt together) or each completion's ("output"); "none" leaves them.

    DeepSeekMath's process advantages do not sum to zero over a group's tokens, as outcome advantages do: with
    sum credit a rare wrong step normalises to a large negative value that every earlier token of its output
    carries, so the update pushes the sampled tokens down as a whole (REFERENCE, "The mean of process
    advantages"). Centring keeps each token's credit relative to its group's (or its output's) and removes the
    push. Tokens outside the loss stay 0.

        A'[i, t] = A[i, t] - mean of A over the loss tokens of i's group (or of i)

    Worked example (the group of 8 with two slips, one token a step, sum credit): the right outputs' tokens
    0.885, 0.590, 0.295 and the flawed ones' -2.656, -2.951, -3.246 have the mean -0.295; centred over the group
    1.180, 0.885, 0.590 and -2.361, -2.656, -2.951. Per output, each output's own mean goes: [0.295, 0, -0.295]
    for all eight.

    Args:
        advantages: (B, T) per-token advantages.
        lengths: B token counts in the loss (0: masked out).
        group_size: G; B must be a multiple of it.
        over: "group", "output", "none", or another entry of `pipeline.credit.CENTRINGS`.

    Returns:
        (B, T) float32.
    """
    centre = CENTRINGS[over].centre  # an unknown one: the registry's error, listing the known ones
    _check_group_size(advantages.shape[0], group_size)
    return centre(advantages, _in_loss(lengths, advantages.shape[1]), group_size)  # (B, T)


def _check_hybrid_inputs(outcome: Tensor, process: Tensor, weight: float) -> None:
    if outcome.dim() != 1 or process.dim() != 2 or process.shape[0] != outcome.shape[0]:
        raise ValueError(f"outcome must have shape (B,) and process (B, T), got {tuple(outcome.shape)} "
                         f"and {tuple(process.shape)}")
    if not (math.isfinite(weight) and weight >= 0):
        raise ValueError(f"process weight must be a finite number >= 0, got {weight}")


def hybrid_advantages(outcome: Tensor, process: Tensor, weight: float) -> Tensor:
    """Hybrid supervision: the outcome advantage on every token plus `weight` times the process advantage.

        A[i, t] = A_outcome[i] + w * A_process[i, t]

    The verifier's group-normalised outcome advantage keeps the answer's signal on every token; the PRM's
    process term (`process_advantages`, sum or min credit) adds credit by step. PURE (arXiv 2504.15275)
    reports its best results with a small share of verifier reward mixed into PRM rewards; this mixes the
    advantages instead, so each keeps its own normalisation. `weight` 0 is outcome supervision exactly.
    Worked example: outcome [0.577, -1.155, 0.577] (verifier [1, 0, 1]) and the min-credit process
    advantages of DeepSeekMath's group (output 1's step 1: -0.545), w = 0.5: output 1's first token gets
    0.577 + 0.5 * -0.545 = 0.305 (0.30497 unrounded).

    Args:
        outcome: (B,) one outcome advantage per completion (TRL's, from the verifier).
        process: (B, T) per-token process advantages.
        weight: w >= 0.

    Returns:
        (B, T) float32 advantages (added in float64).

    Raises:
        ValueError: shapes that do not match, or a weight that is negative or not finite.
    """
    _check_hybrid_inputs(outcome, process, weight)
    combined = outcome.double().unsqueeze(1) + weight * process.double()  # (B, 1) + (B, T) -> (B, T)
    return combined.to(torch.float32)  # (B, T)


def process_variance_share(outcome: Tensor, process: Tensor, weight: float, lengths: Sequence[int]) -> float:
    """Share of the hybrid advantages' variance carried by the PRM term, over the tokens in the loss.

        share = Var(w * P) / (Var(O) + Var(w * P))

    with O the outcome advantage of each token's completion and P its process advantage, both over the
    tokens with `t < lengths[i]`. This form, not Var(w * P) / Var(O + w * P): the covariance of the two
    terms is left out, so the share stays in [0, 1] and grows with w, is 0 at w = 0 (the verifier arm
    again) and 1 where the outcome has no spread (every group all right or all wrong), whatever the PRM
    and the verifier agree on. Both variances 0 (no signal at all) gives 0; no token in the loss, NaN.

    Worked example: outcome [1, -1], process [[1, 1], [1, -1]], w = 1, lengths [2, 2]: tokens O [1, 1, -1,
    -1] (population variance 1), P [1, 1, 1, -1] (mean 0.5, variance 0.75): share 0.75 / 1.75 = 0.4286.

    >>> round(process_variance_share(torch.tensor([1.0, -1.0]), torch.tensor([[1.0, 1.0], [1.0, -1.0]]), 1.0, [2, 2]), 4)
    0.4286
    """
    _check_hybrid_inputs(outcome, process, weight)
    o = loss_tokens(outcome, lengths, width=process.shape[1])  # (tokens,)
    p = weight * loss_tokens(process, lengths)  # (tokens,)
    if o.numel() == 0:
        return float("nan")
    # Population variances: the normalisation cancels in the ratio; one token has variance 0, not NaN.
    var_o, var_p = o.var(correction=0).item(), p.var(correction=0).item()
    return var_p / (var_o + var_p) if var_o + var_p > 0 else 0.0
