"""The PRM/ORM loss and gradient of one optimizer step do not depend on gradient accumulation or processes.

transformers' Trainer, given a `compute_loss_func`, takes its loss as already normalised over the whole
step: it skips the division by the accumulation steps and multiplies by the number of processes (undoing
DDP's mean). A per-micro-batch mean there scaled the gradient by accumulation x processes (x32 under the
multi-GPU recipe). Every run here is compared with a plain loop: the mean BCE over every labelled item
(step end, or sequence) of the rows, one row at a time.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.rm_kinds.loading import load_reward_model
from pipeline.rm_kinds.orm import orm_examples
from pipeline.rm_kinds.prm import prm_examples
from tests.launcher_step import ROWS, train_one_step


def reference_step(models_dir: Path, kind: str) -> tuple[float, torch.Tensor]:
    """Plain loop: sum of BCE over every labelled item, row by row, divided by their count; its gradient."""
    model, tok, _ = load_reward_model(models_dir / kind, expect=kind)
    model.train()
    examples = prm_examples(ROWS, tok, "soft") if kind == "prm" else orm_examples(ROWS, tok)
    total, count = torch.zeros(()), 0
    for ex in examples:
        logits = model(input_ids=torch.tensor([ex["input_ids"]])).logits[0, ..., 0]  # (T,) or ()
        labels = torch.tensor(ex["labels"])
        keep = labels != -100
        total = total + torch.nn.functional.binary_cross_entropy_with_logits(logits[keep], labels[keep], reduction="sum")
        count += int(keep.sum())
    loss = total / count
    loss.backward()
    return loss.item(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.fixture(scope="module")
def reference(mini_models) -> dict[str, tuple[float, torch.Tensor]]:
    return {kind: reference_step(mini_models, kind) for kind in ("prm", "orm")}


def test_the_rows_make_micro_batch_means_differ_from_the_step_mean():
    # The check below can fail only if a wrong normalisation changes the result: step ends per row vary
    # (1 to 4), so per-micro-batch means weight items unequally, and 8 rows in 4 micro-batches of 2
    # would give 4x the gradient if each micro-batch's mean were backpropagated as it is.
    counts = [len(r["se_labels"]) for r in ROWS]
    assert len(ROWS) == 8 and min(counts) == 1 and max(counts) == 4


@pytest.mark.parametrize("kind", ["prm", "orm"])
def test_gradient_accumulation_gives_the_plain_mean_loss_and_gradient(mini_models, reference, kind):
    """One step over the 8 rows as 1 micro-batch of 8 and as 4 accumulated micro-batches of 2.

    Before the fix: accumulation 4 gave a logged loss about 4x and a gradient norm about 4x the
    reference (each micro-batch's mean taken as the step's share: 2.750 against 0.688 for the PRM).
    Measured after: losses within 6e-8, gradient entries within 1.2e-7 (largest 0.43).
    """
    ref_loss, ref_grad = reference[kind]
    for batch, accum in ((8, 1), (2, 4)):
        probe = train_one_step(mini_models, kind, batch, accum)
        assert probe.loss == pytest.approx(ref_loss, rel=1e-6), (batch, accum)
        torch.testing.assert_close(probe.grad, ref_grad, rtol=1e-5, atol=5e-7, msg=f"{kind} {batch}x{accum}")
    assert ref_grad.norm() > 1e-3  # not a trivially zero gradient


@pytest.mark.slow
def test_two_processes_give_the_plain_mean_loss_and_gradient(reference, launched_steps):
    """2 processes x 2 rows x 2 accumulated micro-batches under `accelerate launch` (gloo, CPU; conftest.py's
    `launched_steps`), against the plain loop, which 1 process matches (above). Before the fix: loss and gradient
    about 2 x 2 = 4x the reference (PRM loss 2.750 against 0.688). Measured after: losses within 6e-8, gradient
    norms within 1.1e-7 relative."""
    two = launched_steps[2]["rm"]
    assert two["processes"] == 2
    for kind in ("prm", "orm"):
        ref_loss, ref_grad = reference[kind]
        assert two[kind]["loss"] == pytest.approx(ref_loss, rel=1e-6), kind
        assert two[kind]["grad_norm"] == pytest.approx(ref_grad.norm().item(), rel=1e-6), kind
        torch.testing.assert_close(torch.tensor(two[kind]["grad_sample"]), ref_grad[::37], rtol=1e-5, atol=5e-7)
