"""One GRPO step on fixed completions and one PRM and ORM step on fixed rows, run as 1 and as 2 processes
(tests/test_launcher.py, tests/test_rm_scaling.py, through conftest.py's `launched_steps`).

    python tests/launcher_step.py MODELS_DIR OUT_JSON PER_DEVICE_BATCH [MODES [RM_STEP]]       (one process)
    accelerate launch --config_file configs/accelerate/cpu_2proc.yaml tests/launcher_step.py ...  (two)

GRPO: MODES is a comma-separated list, one step (a fresh trainer from the saved policy) per mode, in order, in the
same processes (a launch costs seconds): `process` (the default) or `hybrid` (min credit, w = 0.5, an outcome
reward that varies in each group, so TRL's per-process outcome advantages must be gathered in order before
the process term is added). Hybrid's outcome reward is a plugin's (PLUGIN, `says_an_answer`): each process loads
the plugins where it starts, as `pipeline.rounds.launched` does, and finds it only on the path it was given.
As a Ray Train job, `launch_phase(..., entry=launched)` runs the step in each worker (conftest.py's
`ray_launched_steps`), with `main`'s arguments in its request.

Sampling is replaced by a fixed table of completions indexed by the completion's place in the *global*
generation batch (process index x local batch + row), because sampled completions depend on each
process's random stream and would differ between 1 and 2 processes. Everything after sampling is the
real path: TRL tokenises and pads, our `ProcessGRPOTrainer` scores steps with the PRM, gathers them over
processes, normalises per group and slices its rows; TRL computes the loss and DDP averages gradients.
The main process writes, per mode, the gathered prompts, completions and advantages, the logged loss of the
step, and the gradient's norm and every 37th value (before the optimizer step) to OUT_JSON ({mode: figures}).

RM_STEP (BATCHxACCUM, e.g. 2x2): then the PRM and the ORM train for one optimizer step each through the phase's
own path (`pipeline.reward_model.train_reward_model`: transformers' Trainer, `bce_loss`, DDP under accelerate),
warm-started from the RMs saved in MODELS_DIR (their head dropout is off, so a step is deterministic), on
ROWS: all of them in the one step, however they are split over processes and micro-batches. The rows have
1 to 4 step ends each, so a mean per micro-batch or per process differs from the mean over the step.
Each RM's logged loss and gradient (norm, every 37th value) go to OUT_JSON's "rm" ({kind: figures, processes}).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from accelerate.utils import gather_object
from datasets import Dataset
from transformers import TrainerCallback

from models.factories import load_tokenizer
from pipeline.config import PipelineConfig
from pipeline.passthrough import grpo_config
from pipeline.grpo_trainer import ProcessGRPOTrainer
from pipeline.registry import load_plugins
from pipeline.reward_model import train_reward_model
from pipeline.rewards import REWARD_FUNCS
from pipeline.rm_kinds.loading import load_reward_model
from pipeline.rundir import read_json, write_json_atomic
from pipeline.scorers import PrmScorer

PROMPTS = ["3+4*2=?\n", "9-5+6=?\n", "7*3-2=?\n"]
# 3 groups of 4 over 12 rows: with 6 rows a process, the middle group straddles the two processes, so its
# steps are normalised right only if they are gathered first. Steps vary in number and length; the
# longest completions are cut at MAX_COMPLETION (scored as they are), one is blank (eos only).
COMPLETIONS = [
    "3+4=7\n7*2=14\nThe answer is 14\n", "4*2=8\n3+8=11\nThe answer is 11\n", "3+4=7\nThe answer is 7\n", "",
    "9-5=4\n4+6=10\nThe answer is 10\n", "9-5=4\n4+6=11\n", "The answer is 10\n", "9-5=4\n4+6=10\n10*1=10\n",
    "7*3=21\n21-2=19\n", "7*3=21\n21-2=18\nThe answer is 18\n", "21-2=19\n", "7*3=24\nThe answer is 22\n",
]
MAX_COMPLETION = 28


class FixedCompletions(ProcessGRPOTrainer):
    """ProcessGRPOTrainer whose "sampling" returns COMPLETIONS[global index]; records the first step's tensors."""

    record: dict | None = None

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        start = self.accelerator.process_index * len(prompt_ids)
        ids = [self.processing_class(COMPLETIONS[(start + i) % len(COMPLETIONS)])["input_ids"] for i in range(len(prompt_ids))]
        eos = self.processing_class.eos_token_id
        return [(c + [eos])[:MAX_COMPLETION] for c in ids], None

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if self.record is None:
            lengths = out["completion_mask"].sum(1).tolist()
            rows = [a[: int(n)].tolist() for a, n in zip(out["advantages"], lengths)]  # (B, T) -> ragged
            texts = self.processing_class.batch_decode(out["completion_ids"], skip_special_tokens=True)
            self.record = {"prompts": gather_object([x["prompt"] for x in inputs]), "completions": gather_object(texts),
                           "advantages": gather_object(rows)}
        return out


class GradientProbe(TrainerCallback):
    """The gradient after backward (DDP has averaged it over processes), before the optimizer uses it."""

    grad: torch.Tensor | None = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self.grad is None:
            self.grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def no_reward(completions, **kwargs) -> list[float]:
    """TRL needs a reward function; in process mode the advantages come from the PRM alone."""
    return [0.0] * len(completions)


# An installed plugin (tests/helpers.py: plugin_distribution) registering hybrid mode's outcome reward: 1 for a
# completion stating an answer, which varies within each group.
PLUGIN = {"says_an_answer_plugin/__init__.py": """from pipeline.rewards import REWARD_FUNCS


def says_an_answer(completions, **kwargs):
    return [float("The answer is" in c) for c in completions]


REWARD_FUNCS.register("says_an_answer", build=lambda problem_set, scorers: says_an_answer)
"""}


def main(models_dir: str, out_json: str, per_device_batch: int, modes: str = "process", rm_step: str = "") -> None:
    load_plugins()
    results = {mode: step(models_dir, per_device_batch, mode) for mode in modes.split(",")}
    if rm_step:
        results["rm"] = rm_steps(models_dir, *map(int, rm_step.split("x")))
    if None not in results.values():  # the main process
        write_json_atomic(out_json, results)


def step(models_dir: str, per_device_batch: int, mode: str) -> dict | None:
    """One GRPO step in `mode`; its figures (on the main process; None on the others)."""
    tokenizer = load_tokenizer(f"{models_dir}/policy")
    prm, prm_tok, _ = load_reward_model(f"{models_dir}/prm", expect="prm")
    cfg = PipelineConfig(grpo={"num_generations": 4, "per_device_train_batch_size": per_device_batch, "max_steps": 1,
                               "max_completion_length": MAX_COMPLETION, "logging_steps": 1, "max_grad_norm": 0.0,
                               "learning_rate": 1e-3})
    args = grpo_config(cfg, f"{models_dir}/scratch-{mode}-{per_device_batch}", reward_weights=[1.0])
    hybrid = {"process_credit": "min", "process_weight": 0.5} if mode == "hybrid" else {}
    probe = GradientProbe()
    trainer = FixedCompletions(
        model=f"{models_dir}/policy", args=args,
        reward_funcs=[REWARD_FUNCS["says_an_answer"].build(None, {}) if hybrid else no_reward],
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]), processing_class=tokenizer,
        callbacks=[probe], prm_scorer=PrmScorer(prm, prm_tok), supervision=mode, **hybrid,
    )
    trainer.train()
    if not trainer.accelerator.is_main_process:
        return None
    loss = next(h["loss"] for h in trainer.state.log_history if "loss" in h)
    share = next((h["hybrid/process_variance_share"] for h in trainer.state.log_history
                  if "hybrid/process_variance_share" in h), None)
    return {**trainer.record, "loss": loss, "share": share, "processes": trainer.accelerator.num_processes,
            "grad_norm": probe.grad.norm().item(), "grad_sample": probe.grad[::37].tolist()}


def launched(argv: list[str]) -> None:
    """Each worker of a `pipeline.launch.launch_phase` job, as `pipeline.rounds.launched`: `main` with the request's
    arguments, its main process writing the result where `launch_phase` reads it."""
    work_dir = Path(argv[0])
    main(**read_json(work_dir / "request.json")["kwargs"], out_json=str(work_dir / "result.json"))


# --- one reward-model step ------------------------------------------------------------------------------


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


def rm_steps(models_dir: str, per_device_batch: int, grad_accum: int) -> dict | None:
    """One step of the PRM, then of the ORM; their figures (on the main process; None on the others)."""
    import torch.distributed as dist

    result = {}
    for kind in ("prm", "orm"):
        probe = train_one_step(models_dir, kind, per_device_batch, grad_accum)
        result[kind] = {"loss": probe.loss, "grad_norm": probe.grad.norm().item(), "grad_sample": probe.grad[::37].tolist()}
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    return {**result, "processes": dist.get_world_size() if dist.is_initialized() else 1}


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:])
    # As pipeline/launch.py's entry does: a group left to die with the interpreter can abort at exit
    # ("terminate called without an active exception"), failing a step that finished.
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def fails_loudly(marker: str) -> None:
    """A Ray Train worker's target that prints `marker` and fails (tests/test_ray_launch.py): its output and its
    error must reach the driver's console."""
    import os

    print(f"{marker} from rank {os.environ.get('RANK')}", flush=True)
    raise RuntimeError(f"{marker}: the worker's own error")
