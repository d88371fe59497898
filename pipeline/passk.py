"""Pass@k as the objective: PKPO's unbiased per-sample rewards (Walder & Karkhanis, arXiv 2505.15201, binary rewards)
and the GRPO advantages made from them (`supervision.mode: passk`).

For a group of n samples with binary rewards f_i, c of them right, `rho(n, c, k) = 1 - C(n-c, k) / C(n, k)` is the
unbiased pass@k estimate (Codex's). Its gradient is unbiased when sample i's log-prob gradient is weighted by

    r~_i = ( sum over the k-subsets S of the group that contain i of max_{j in S} f_j ) / C(n, k)
    right i:  r~_i = C(n-1, k-1) / C(n, k) = k / n
    wrong i:  r~_i = (k / n) * rho(n-1, c, k-1)       (a set holding i still passes through another sample)

PKPO's r~ holds the 1/n of the mean over samples; GRPO's loss takes that mean itself, so the reward here is
`R_i = n * r~_i`: k for a right sample, `k * rho(n-1, c, k-1)` for a wrong one, f itself at k = 1, and a group's mean
`k * rho(n, c, k)`. Within a group R is an affine map of f, `R_i = R_wrong + w(c) * f_i`, with

    w(c) = R_right - R_wrong = k * C(n-1-c, k-1) / C(n-1, k-1)      (k (n-k) / (n-1) at c = 1, 0 once c > n - k)

so after the group's mean the advantage is `w(c)` times outcome mode's: a group counts by how much one more right
sample would raise its pass@k: w falls as c grows, and a group whose other samples already pass every (k-1)-subset
gets nothing. Dividing by the std of R over the group would cancel w(c) and leave outcome
mode's advantages (except the zeroed groups): the std divided by is outcome mode's, of the 0/1 rewards.

Binomials are never formed: `C(a, k) / C(n, k)` is the product `prod_{t<k} (a-t)/(n-t)`, in float64.
Pure functions of tensors and numbers; a batch is TRL's, `B = num_groups * group_size` rows, a group's consecutive.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from pipeline.advantages import _check_group_size, outcome_advantages


def _none_right(n: int, wrong: Tensor, k: int) -> Tensor:
    """C(wrong, k) / C(n, k) per entry, float64: the chance that a k-subset of n samples holds only wrong ones."""
    t = torch.arange(k, dtype=torch.float64)  # (k,); k = 0: the empty product, 1
    return ((wrong.double().unsqueeze(-1) - t).clamp(min=0) / (n - t)).prod(dim=-1)


def _grouped_binary(rewards: Tensor, group_size: int, k: int) -> Tensor:
    """(num_groups, n) float64 0/1 rewards, after one clear error for each way the inputs can be wrong."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must have shape (B,), got {tuple(rewards.shape)}")
    _check_group_size(rewards.numel(), group_size)
    if isinstance(k, bool) or int(k) != k or not 1 <= k <= group_size:
        raise ValueError(f"k must be an integer in [1, group_size = {group_size}], got {k!r}")
    bad = ((rewards != 0) & (rewards != 1)).nonzero().flatten()  # NaN (a reward of None) included
    if bad.numel():
        row = int(bad[0])
        raise ValueError(f"reward of row {row} is {rewards[row].item()}; pass@k needs binary rewards, 0 or 1")
    return rewards.double().view(-1, group_size)


def passk_estimate(rewards: Tensor, group_size: int, k: int) -> Tensor:
    """Each group's unbiased pass@k estimate, `rho(n, c, k) = 1 - C(n-c, k) / C(n, k)` (Codex; PKPO eq. 3).

    >>> passk_estimate(torch.tensor([1, 0, 0, 0, 1, 1, 0, 0]), group_size=4, k=2).tolist()
    [0.5, 0.8333333333333334]

    Args:
        rewards: (B,) binary rewards, each group's `group_size` on consecutive rows.
        group_size: n.
        k: 1 <= k <= n.

    Returns:
        (num_groups,) float64.
    """
    f = _grouped_binary(rewards, group_size, k)  # (N, n)
    return 1 - _none_right(group_size, group_size - f.sum(dim=1), k)  # (N,)


def passk_rewards(rewards: Tensor, group_size: int, k: int) -> Tensor:
    """Each sample's pass@k reward `R_i = n * r~_i` (module docstring): k if right, `k * rho(n-1, c, k-1)` if wrong.

    Worked example (REFERENCE.md, "Pass@k as the objective"), n = 4, k = 2, rewards [1, 0, 0, 0]: of the 6 pairs
    AB, AC, AD pass, so r~ = [3/6, 1/6, 1/6, 1/6] and R = 4 r~ = [2, 0.667, 0.667, 0.667]; their mean, 1.0, is
    k * pass@2 = 2 * 0.5. At k = 1, R is the rewards themselves.

    >>> [round(r, 4) for r in passk_rewards(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=4, k=2).tolist()]
    [2.0, 0.6667, 0.6667, 0.6667]

    Args:
        rewards: (B,) binary verifier rewards, each group's `group_size` on consecutive rows.
        group_size: n, the samples of a prompt.
        k: 1 <= k <= n.

    Returns:
        (B,) float64.

    Raises:
        ValueError: a reward other than 0 or 1 (naming its row), k out of [1, n], a bad shape or group size.
    """
    f = _grouped_binary(rewards, group_size, k)  # (N, n)
    n, c = group_size, f.sum(dim=1, keepdim=True)  # (N, 1)
    wrong = k * (1 - _none_right(n - 1, (n - 1) - c, k - 1))  # (N, 1): the other n-1 hold all c right ones
    return torch.where(f == 1, torch.full_like(f, float(k)), wrong).flatten()  # (B,)


def passk_group_weights(rewards: Tensor, group_size: int, k: int) -> Tensor:
    """Each sample's group weight `w(c) = k * C(n-1-c, k-1) / C(n-1, k-1)`, the gap between its group's right and
    wrong pass@k rewards. (B,) float64; 1 everywhere at k = 1."""
    f = _grouped_binary(rewards, group_size, k)  # (N, n)
    n, c = group_size, f.sum(dim=1, keepdim=True)  # (N, 1)
    return (k * _none_right(n - 1, (n - 1) - c, k - 1)).expand_as(f).flatten()  # (B,)


def passk_advantages(rewards: Tensor, group_size: int, k: int, scale: str = "group") -> Tensor:
    """GRPO advantages for pass@k: PKPO's rewards (`passk_rewards`) minus their group's mean, over outcome mode's std.

        A_i = (R_i - mean_group(R)) / (std(f) + 1e-4) = w(c) * A_outcome_i

    with std(f) the std outcome mode divides the 0/1 rewards by (TRL's `scale_rewards`: the group's unbiased std,
    the batch's, or none). So k = 1 gives outcome mode's advantages exactly, and a larger k reweighs each group by
    `w(c)` (`passk_group_weights`), the more the fewer right samples it has. The group's mean holds sample i's own
    reward, so the expected update is (1 - k/n) times pass@k's gradient before the std (the direction, not the
    size): at k = n every sample of a group has the same reward and the advantages are 0 (the config refuses it).

    Worked example, n = 4, k = 2, rewards [1, 0, 0, 0]: R = [2, 0.667, 0.667, 0.667], mean 1.0, centred
    [1, -0.333, -0.333, -0.333]; std(f) = 0.5, so A = [1.9996, -0.6665, -0.6665, -0.6665]: w = 2 - 0.667 = 4/3
    times outcome mode's [1.4997, -0.4999, ...]. With two right samples, [1, 1, 0, 0]: w = 2 * C(1, 1) / C(3, 1)
    = 0.667; with three, w = 2 * C(0, 1) / C(3, 1) = 0: any pair holding a wrong sample passes through its partner.

    >>> [round(a, 4) for a in passk_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, 2).tolist()]
    [1.9996, -0.6665, -0.6665, -0.6665]

    Args:
        rewards: (B,) binary verifier rewards, each group's `group_size` on consecutive rows.
        group_size: n = G, the samples of a prompt.
        k: 1 <= k <= n.
        scale: TRL's `scale_rewards`, "group", "batch" or "none", applied as outcome mode applies it.

    Returns:
        (B,) float32, one advantage per completion (for all its tokens, as outcome mode's).

    Raises:
        ValueError: a reward other than 0 or 1 (naming its row), k out of [1, n], a bad scale, shape or group size.
    """
    weights = passk_group_weights(rewards, group_size, k)  # (B,) validates the rewards and k
    return (weights * outcome_advantages(rewards.float(), group_size, scale).double()).float()  # (B,)


def scheduled_k(values: Sequence[int], done: int, total: int) -> int:
    """k at position `done` (0-based) of `total` (a phase's GRPO steps, or a run's RL rounds): the positions are cut
    into `len(values)` equal parts, part j taking `values[j]` (PKPO anneals k from high to low); past the end, the last.

    >>> [scheduled_k([8, 4, 2, 1], step, 10) for step in range(10)]
    [8, 8, 8, 4, 4, 2, 2, 2, 1, 1]
    >>> [scheduled_k([4], step, 3) for step in range(3)]
    [4, 4, 4]
    """
    if not values:
        raise ValueError("a schedule of k needs at least one value")
    return int(values[min(len(values) - 1, max(done, 0) * len(values) // max(total, 1))])
