"""Resuming inside a phase: a trainer's checkpoints, and a collection's finished batches, kept across a stop or a
crash in the phase's scratch folder, and picked up by the next attempt at the same work.

A scratch folder belongs to one piece of work: `fingerprint` hashes the config fields that change what it
computes, the phase, the round and its inputs; `claim` deletes (with a message) a scratch folder written under
another fingerprint, so a checkpoint of another config, phase or round is never resumed from.

Trainers (GRPO, the RMs) save a checkpoint every `save_steps` (`pipeline.passthrough.SAVE_STEPS`, pruned to
`save_total_limit`) and, told to stop, one at the next step boundary (`StopAtStepBoundary`); `train_resumable`
resumes from the newest whole one through transformers' own `resume_from_checkpoint`, which restores the weights,
optimizer, scheduler, RNG states and data order: the final weights are those of a run never stopped. State the trainer
does not know of (PRIME's online-updated PRM) goes into the same checkpoints through a `CheckpointedState` callback.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from transformers import TrainerCallback

from pipeline.rundir import STEP_CLOCK, STOP, TRAINER_STATE, last_checkpoint, read_json, write_json_atomic

if TYPE_CHECKING:
    from transformers import Trainer

    from pipeline.config import PipelineConfig

log = logging.getLogger(__name__)

FINGERPRINT_NAME = "igrpo-fingerprint.json"
# Config fields that cannot change what a phase computes: a checkpoint made under other values is still its own.
_IGNORED = {"run": ("name", "runs_dir", "rounds"), "tracking": None, "eval": None, "orchestration": None}


# Fields added to the config since scratch folders were first fingerprinted: hashed only where set away from their
# default, so a phase stopped under an older release resumes its checkpoints after an upgrade (a new field at its
# default computes what the older release did). A field added to the config joins this list; a test pins the hash.
_ADDED = {"supervision": ("prime_process_coef", "prime_outcome_coef", "passk"), "reward_model": ("mc_rollouts", "dtype"),
          "launcher": ("ray_address",), "policy": ("dtype",)}

# The built-in RM kinds' section fields as the flat `reward_model.*` keys they were when fingerprints began: kind ->
# {flat key: field}. The config reads only the sections; the hash reads them so, to stay the same.
_FLAT = {"orm": {"orm_loss": "loss"}, "implicit": {"implicit_beta": "beta", "implicit_online_lr": "online_lr"}}


def _dumped(field) -> object:
    """A field's default as the config's JSON dump holds it (a section, such as `supervision.passk`, as its dict)."""
    default = field.get_default(call_default_factory=True)
    return default.model_dump(mode="json") if hasattr(default, "model_dump") else default


def _as_fingerprinted(data: dict) -> dict:
    """The config's dump as fingerprints have always read it: the RM kinds' sections as their flat keys of before
    (`reward_model.implicit.beta` as `implicit_beta`), the fields added since left out at their defaults."""
    from pipeline.config import PipelineConfig

    rm = dict(data.get("reward_model") or {})
    for kind, flat in _FLAT.items():
        section = rm.get(kind)
        if isinstance(section, dict):
            rest = {k: v for k, v in section.items() if k not in flat.values()}
            rm.pop(kind)
            rm.update({old: section.get(new) for old, new in flat.items()}, **({kind: rest} if rest else {}))
    data = {**data, "reward_model": rm}
    for name, added in _ADDED.items():
        fields = PipelineConfig.model_fields[name].annotation.model_fields  # the defaults, from the config itself
        data[name] = {k: v for k, v in (data.get(name) or {}).items() if k not in added or v != _dumped(fields[k])}
    return data


def fingerprint(cfg: PipelineConfig, phase: str, round_index: int, **inputs) -> str:
    """A hash of what a phase's work depends on: the config (less `_IGNORED`), the phase, the round, its inputs.

    >>> from pipeline.config import PipelineConfig
    >>> a = fingerprint(PipelineConfig(), "policy", 1, policy="p")
    >>> a == fingerprint(PipelineConfig(run={"rounds": 9}), "policy", 1, policy="p"), a == fingerprint(
    ...     PipelineConfig(), "policy", 2, policy="p")
    (True, False)
    """
    data = _as_fingerprinted(cfg.model_dump(mode="json"))
    for section, fields in _IGNORED.items():
        if fields is None:
            data.pop(section, None)
        else:
            for name in fields:
                data.get(section, {}).pop(name, None)
    blob = json.dumps({"config": data, "phase": phase, "round": round_index, "inputs": inputs}, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def claim(scratch: str | Path, fingerprint_: str) -> bool:
    """Make `scratch` this work's folder; True where it holds earlier work of the same fingerprint to resume.

    A folder written under another fingerprint (another config, phase or round), or with none, is deleted first; `pipeline.rundir.keep_resumable` keeps it
    across a stop or a failure.
    """
    scratch = Path(scratch)
    mark = scratch / FINGERPRINT_NAME
    if scratch.exists():
        try:
            found = read_json(mark).get("fingerprint")
        except (OSError, ValueError, AttributeError):
            found = None
        if found == fingerprint_:
            return True
        if found is not None or any(scratch.iterdir()):  # else only made by the Trainer as it was built
            log.warning("%s: left by other work (another config, phase or round): deleted, not resumed", scratch)
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    write_json_atomic(mark, {"fingerprint": fingerprint_})
    return False


class StopAtStepBoundary(TrainerCallback):
    """Told to stop (`pipeline.rundir.STOP`), save a checkpoint at the end of the step and end the training.

    Only at a step that ends a generation cycle (every `cycle` optimizer steps): GRPO generates a batch for several
    steps (`steps_per_generation`, `num_iterations`) and a checkpoint keeps no generations, so one saved inside a
    cycle would resume on other completions. Periodic saves there are skipped for the same reason, and so is
    transformers' save at the last step unless told to stop (the phase saves the model itself right after).
    """

    def __init__(self, cycle: int = 1):
        self.cycle = max(1, cycle)

    def on_train_begin(self, args, state, control, **kwargs):
        STEP_CLOCK.start()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.cycle:
            control.should_save = False
            return control
        STEP_CLOCK.boundary()
        if STOP.is_set():  # at the last step too: the resume then only saves the model
            control.should_save = control.should_training_stop = True
        elif state.global_step >= state.max_steps:
            control.should_save = False
        return control


class CheckpointedState(TrainerCallback):
    """State outside the trainer's model that its checkpoints keep (a subclass's `save` and `load`): written into each
    `checkpoint-N` as transformers saves it (`on_save`, process 0), read back from the one `train_resumable` resumes.

    transformers has written the checkpoint's trainer state (what makes it whole to `last_checkpoint`) before
    `on_save`: a checkpoint without this state's file (`name`) was cut between the two, and is not resumed from.
    """

    name: str  # the file it writes in a checkpoint

    def save(self, path: Path) -> None:
        raise NotImplementedError

    def load(self, path: Path) -> None:
        raise NotImplementedError

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            path = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}" / self.name
            part = path.with_name(f".{path.name}.part")  # renamed whole: the file is there only once written
            self.save(part)
            os.replace(part, path)
        return control


def resumable_checkpoint(scratch: Path, states: list[CheckpointedState]) -> Path | None:
    """The newest whole checkpoint in `scratch` (`last_checkpoint`) that also holds every one of `states`' files; one
    that lacks one is deleted (with a message), so an older one, or none (the phase starts over), is resumed."""
    while (checkpoint := last_checkpoint(scratch)) is not None:
        missing = [s.name for s in states if not (checkpoint / s.name).is_file()]
        if not missing:
            return checkpoint
        log.warning("%s: without %s (cut while saving): deleted, not resumed", checkpoint, ", ".join(missing))
        shutil.rmtree(checkpoint)
    return None


@contextlib.contextmanager
def stop_at_step_boundary():
    """The first SIGINT or SIGTERM only sets `STOP` (the trainer then saves and stops at the step's end, see
    `StopAtStepBoundary`), and goes on, once the trainer has stopped there, to the handler that was there before
    (`flows.signals`' or Prefect's), whose exception unwinds the run: Prefect's TerminationSignal is what ends a
    flow run that a worker cancels CANCELLED rather than CRASHED. A second one goes to that handler at once.
    Where a signal's default action stands (no handler of Python's), it is left alone."""
    # Off the main thread Python takes no signals; under `accelerate launch` each process would stop at its own
    # step (a signal reaches one process, or the processes at different steps) and the others wait for it in
    # their next collective: there a signal unwinds at once, and the periodic checkpoints are what resumes.
    if threading.current_thread() is not threading.main_thread() or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    taken = []  # not STOP itself: flows.signals' watchdog thread may set it before this handler runs

    def deferred(signum, frame):
        taken.append(signum)
        STOP.set()
        if len(taken) == 1:
            return
        for s, h in previous.items():
            signal.signal(s, h)
        previous[signum](signum, frame)

    for s, h in previous.items():
        if callable(h):
            signal.signal(s, deferred)
    try:
        yield
    finally:
        for s, h in previous.items():
            if callable(h) and signal.getsignal(s) is deferred:
                signal.signal(s, h)
    if len(taken) == 1:  # the trainer stopped at the boundary: now the signal's own handler raises
        previous[taken[0]](taken[0], None)


def generation_cycle(args) -> int:
    """Optimizer steps per GRPO generation batch (1 for other trainers): where a checkpoint resumes exactly."""
    micro = getattr(args, "steps_per_generation", None)
    if micro is None:
        return 1
    ga = args.gradient_accumulation_steps
    return math.lcm(micro * getattr(args, "num_iterations", 1), ga) // ga


def train_resumable(trainer: Trainer, fingerprint_: str) -> None:
    """`trainer.train()` in its scratch output_dir, from the newest checkpoint there of the same work, if any;
    then the scratch folder removed. Told to stop, it saves at the next step boundary and raises
    KeyboardInterrupt; stopped or failed, the checkpoints stay for the next attempt (`keep_resumable`).

    Under several processes they share the folder: process 0 claims it and, all finished, removes it (another's
    Trainer may still list its checkpoints there).
    """
    scratch = Path(trainer.args.output_dir)
    states = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, CheckpointedState)]
    if trainer.accelerator.is_main_process:
        claim(scratch, fingerprint_)
        resumable_checkpoint(scratch, states)  # one cut before its `states` were saved: deleted
    trainer.accelerator.wait_for_everyone()
    checkpoint = last_checkpoint(scratch)
    state = read_json(checkpoint / TRAINER_STATE) if checkpoint else {"global_step": 0, "max_steps": 1}
    if checkpoint is not None:
        log.info("resuming from %s (step %d of %d)", checkpoint, state["global_step"], state["max_steps"])
        for s in states:
            s.load(checkpoint / s.name)
    if state["global_step"] >= state["max_steps"]:
        # Stopped in its last step, all trained: transformers' train() would run one step more (a resumed epoch
        # checks max_steps only after a step), so only the weights and the state (its log history) are read back.
        from transformers import TrainerState

        trainer._load_from_checkpoint(str(checkpoint))
        trainer.state = TrainerState.load_from_json(str(checkpoint / TRAINER_STATE))
    else:
        trainer.add_callback(StopAtStepBoundary(generation_cycle(trainer.args)))
        try:
            with stop_at_step_boundary():
                trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        finally:
            STEP_CLOCK.stop()
    if STOP.is_set():  # stopped at a step boundary (told by flows.signals' watchdog alone): unwind as a signal would
        raise KeyboardInterrupt("stopped at a step boundary; its checkpoint is kept for the resume")
    trainer.accelerator.wait_for_everyone()
    if trainer.accelerator.is_main_process:
        shutil.rmtree(scratch, ignore_errors=True)
