"""The tensor math of the process advantages' choices (`pipeline.credit`'s tables): how a token is credited with the
values of the steps ahead of it (`supervision.process_credit`), which steps a step reward is normalised with
(`supervision.process_baseline`), and whose mean is removed from the advantages (`supervision.process_centring`).

Pure functions of tensors and numbers, below `pipeline.advantages` (which reads them through the tables) and
importing nothing of the project. Steps arrive flattened, (S,) each, with the completion and the end token of each
(`pipeline.advantages`' layout); a batch is `B = num_prompts * group_size` rows, a group consecutive rows.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _at_ends(completion: Tensor, end: Tensor, value: Tensor, batch_size: int, length: int, fill: float) -> Tensor:
    """(B, T) float64: each value at its step's last token, `fill` elsewhere (ends are unique within a row)."""
    at_ends = torch.full((batch_size, length), fill, dtype=torch.float64)  # (B, T)
    at_ends[completion, end] = value
    return at_ends


def sum_credit(completion: Tensor, end: Tensor, value: Tensor, batch_size: int, length: int) -> Tensor:
    """(B, T): each token gets the sum of the values of the steps ending at or after it (DeepSeekMath §4.1.3), by a
    reverse cumulative sum along T; 0 after the last step end."""
    return _at_ends(completion, end, value, batch_size, length, 0.0).flip(1).cumsum(1).flip(1)  # (B, T)


def min_credit(completion: Tensor, end: Tensor, value: Tensor, batch_size: int, length: int) -> Tensor:
    """(B, T): each token gets the minimum of the values of the steps ending at or after it (PURE, arXiv 2504.15275);
    0 after the last step end."""
    # +inf elsewhere is neutral for a reverse cumulative min; what stays +inf has no step ahead: 0.
    advantages = _at_ends(completion, end, value, batch_size, length, math.inf).flip(1).cummin(1).values.flip(1)
    return torch.where(torch.isinf(advantages), torch.zeros_like(advantages), advantages)  # (B, T)


def step_credit(completion: Tensor, end: Tensor, value: Tensor, batch_size: int, length: int) -> Tensor:
    """(B, T): each token gets the value of its own step, the first ending at or after it; 0 after the last step
    end."""
    # The index of the nearest step end at or after each token, by a cumulative max over the flipped row of the
    # positions that hold an end (-1 elsewhere); -1 left means no step ahead: 0.
    at_ends = _at_ends(completion, end, value, batch_size, length, 0.0)  # (B, T)
    has = torch.zeros(batch_size, length, dtype=torch.bool)  # (B, T)
    has[completion, end] = True
    positions = torch.arange(length).expand(batch_size, -1)  # (B, T) in the flipped row's order
    nearest = torch.where(has.flip(1), positions, torch.full_like(positions, -1)).cummax(1).values  # (B, T)
    filled = at_ends.flip(1).gather(1, nearest.clamp(min=0))  # (B, T)
    return torch.where(nearest >= 0, filled, torch.zeros_like(filled)).flip(1)  # (B, T)


def group_segments(completion: Tensor, counts: Tensor, group_size: int) -> tuple[Tensor, int]:
    """Each step's segment, (S,), and the number of segments: its group (DeepSeekMath §4.1.3: every step of the
    group together)."""
    return completion // group_size, len(counts) // group_size


def position_segments(completion: Tensor, counts: Tensor, group_size: int) -> tuple[Tensor, int]:
    """Each step's segment, (S,), and the number of segments: its group and its index in its completion, so a step
    is compared with the group's steps at the same index only."""
    batch_size = len(counts)
    width = int(counts.max()) if batch_size else 0
    index = torch.arange(len(completion)) - (counts.cumsum(0) - counts)[completion]  # (S,) 0, 1, ... per completion
    return (completion // group_size) * width + index, (batch_size // group_size) * width


def mean_removed(advantages: Tensor, mask: Tensor, size: int) -> Tensor:
    """(B, T) float32: the advantages less their mean over the loss tokens (`mask`, (B, T)) of each `size`
    consecutive rows (a group: G; an output: 1); 0 outside the loss."""
    adv = advantages.double()  # (B, T)
    sums = (adv * mask).view(-1, size, adv.shape[1]).sum(dim=(1, 2))  # (B / size,)
    counts = mask.view(-1, size, adv.shape[1]).sum(dim=(1, 2)).clamp(min=1)  # (B / size,)
    means = (sums / counts).repeat_interleave(size).unsqueeze(1)  # (B, 1)
    return torch.where(mask, adv - means, torch.zeros_like(adv)).to(torch.float32)  # (B, T)
