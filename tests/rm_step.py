"""One reward-model training step on fixed rows; run by tests/test_rm_scaling.py as 1 and as 2 processes.

    python tests/rm_step.py MODELS_DIR OUT_JSON PER_DEVICE_BATCH GRAD_ACCUM        (one process)
    accelerate launch --config_file configs/accelerate/cpu_2proc.yaml tests/rm_step.py ...  (two)

The PRM and then the ORM train for one optimizer step through the phase's own path
(`pipeline.reward_model.train_reward_model`: transformers' Trainer, `bce_loss`, DDP under accelerate),
warm-started from the RMs saved in MODELS_DIR (their head dropout is off, so a step is deterministic), on
ROWS: all of them in the one step, however they are split over processes and micro-batches. The rows have
1 to 4 step ends each, so a mean per micro-batch or per process differs from the mean over the step.
The main process writes each RM's logged loss and gradient (norm, and every 37th value, taken before the
optimizer step) to OUT_JSON.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline.config import PipelineConfig
from pipeline.reward_model import train_reward_model
from pipeline.rundir import write_json_atomic
from tests.launcher_step import GradientProbe


def _row(i: int, steps: list[str], se: list[float], outcome: int) -> dict:
    completion = "".join(s + "\n" for s in steps)
    return {"prompt_id": f"p{i}", "prompt": f"{i}+3*2=?\n", "completion": completion, "outcome": outcome,
            "he_labels": [int(y > 0) for y in se], "se_labels": se}


ROWS = [
    _row(0, ["3*2=6", "0+6=6", "Answer: 6"], [1.0, 0.75, 1.0], 1),
    _row(1, ["1+3=4", "4*2=8", "Answer: 8"], [0.5, 0.0, 0.0], 0),
    _row(2, ["Answer: 8"], [1.0], 1),
    _row(3, ["3*2=6", "3+6=9", "9+0=9", "Answer: 9"], [1.0, 1.0, 0.25, 1.0], 1),
    _row(4, ["4+3=7", "Answer: 14"], [0.25, 0.0], 0),
    _row(5, ["3*2=6", "5+6=11", "Answer: 11"], [1.0, 1.0, 1.0], 1),
    _row(6, ["6+3=9", "9*2=18", "18-1=17", "Answer: 17"], [0.0, 0.0, 0.0, 0.0], 0),
    _row(7, ["Answer: 13"], [1.0], 1),
]


class StepProbe(GradientProbe):
    """The first step's gradient (GradientProbe) and the loss Trainer logs for it."""

    loss: float | None = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.loss is None and logs and "loss" in logs:
            self.loss = logs["loss"]


def rm_config(per_device_batch: int, grad_accum: int) -> PipelineConfig:
    """One optimizer step over ROWS, no clipping (the gradient is read as it is), soft PRM targets."""
    return PipelineConfig(reward_model={"target": "soft", "train_args": {
        "per_device_train_batch_size": per_device_batch, "gradient_accumulation_steps": grad_accum, "max_steps": 1,
        "logging_steps": 1, "max_grad_norm": 0.0, "learning_rate": 1e-3}})


def train_one_step(models_dir: str | Path, kind: str, per_device_batch: int, grad_accum: int) -> StepProbe:
    probe = StepProbe()
    cfg = rm_config(per_device_batch, grad_accum)
    out = Path(models_dir) / f"trained-{kind}-{per_device_batch}x{grad_accum}"
    train_reward_model(cfg, kind, ROWS, Path(models_dir) / kind, out, warm=True, callbacks=[probe])
    return probe


def main(models_dir: str, out_json: str, per_device_batch: int, grad_accum: int) -> None:
    import torch.distributed as dist

    result = {}
    for kind in ("prm", "orm"):
        probe = train_one_step(models_dir, kind, per_device_batch, grad_accum)
        result[kind] = {"loss": probe.loss, "grad_norm": probe.grad.norm().item(), "grad_sample": probe.grad[::37].tolist()}
    processes = dist.get_world_size() if dist.is_initialized() else 1
    if not dist.is_initialized() or dist.get_rank() == 0:
        write_json_atomic(out_json, {**result, "processes": processes})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    # As pipeline/launch.py's entry does: a group left to die with the interpreter can abort at exit.
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
