"""The reward-model phase: every RM of `reward_model.kinds` retrained each round, warm-started, on the new shard
plus a replay of earlier shards (DeepSeekMath Algorithm 1: "continuous training").

Each kind trains with transformers' Trainer and `bce_loss` (labels -100 where unlabelled: a PRM's are its step
ends, an ORM's its one outcome), or with TRL's RewardTrainer where its kind trains on pairs; a PRM in a tag layout
with its layout's cross-entropy. Round 0 starts from the policy's backbone with a new head (a PRM: or takes
`reward_model.init` as it is), later rounds from the previous round's RM, in the layout its checkpoint records.
What differs between the kinds (examples, scorer, metrics, head) is their table, `pipeline.rm_kinds.RM_KINDS`;
`load_scorer` is how every phase scores with a checkpoint. Also here: the exploitable RM that tests the hacking
monitor, and the calibration an RM keeps in its checkpoint. The RM metrics (AUCs) are `pipeline.rm_metrics`.
"""

from __future__ import annotations

import contextlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from datasets import Dataset
from transformers import Trainer, TrainingArguments

from models.factories import apply_lora
from pipeline.config import PipelineConfig, RewardModelConfig
from pipeline.dtypes import torch_dtype
from pipeline.passthrough import checkpointing_defaults, device_defaults, rm_resumable
from pipeline.problems import step_separator
from pipeline.replay import ReplayBuffer
from pipeline.resume import fingerprint, train_resumable
from pipeline.rm_kinds import PrmLayout, layout_of, prm_head, rm_entry, rm_kind
from pipeline.rm_kinds.loading import (
    init_layout,
    load_reward_model,
    reward_model_from_policy,
    reward_model_layout,
    save_reward_model,
    with_layout,
)
from pipeline.rm_metrics import mean
from pipeline.rundir import RunDir, calibration_path, read_json, scratch_dir, write_json_atomic
from pipeline.scorers import SEPARATOR_KEY, Scores, aggregate


def split_holdout(rows: list[dict], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """Hold out whole prompts (all samples of a prompt on one side), so the eval never sees a train prompt."""
    ids = sorted({r["prompt_id"] for r in rows})
    random.Random(seed).shuffle(ids)
    held = set(ids[: round(fraction * len(ids))])
    return [r for r in rows if r["prompt_id"] not in held], [r for r in rows if r["prompt_id"] in held]


# --- datasets -------------------------------------------------------------------------------------


def collate(pad_id: int):
    """Right-pad input ids; token labels pad with -100 (ignored), scalar labels stay (B,)."""

    def fn(batch: list[dict]) -> dict[str, torch.Tensor]:
        width = max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), width), pad_id)  # (B, T)
        mask = torch.zeros((len(batch), width), dtype=torch.long)  # (B, T)
        for i, b in enumerate(batch):
            ids[i, : len(b["input_ids"])] = torch.tensor(b["input_ids"])
            mask[i, : len(b["input_ids"])] = 1
        if isinstance(batch[0]["labels"], list):
            labels = torch.full((len(batch), width), -100.0)  # (B, T)
            for i, b in enumerate(batch):
                labels[i, : len(b["labels"])] = torch.tensor(b["labels"])
        else:
            labels = torch.tensor([b["labels"] for b in batch])  # (B,)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    return fn


def bce_loss(outputs, labels, num_items_in_batch=None):
    """BCE with logits where labels are not -100: at step ends (PRM, (B, T)) or per sequence (ORM, (B,)).

    Trainer's `compute_loss_func` contract: `num_items_in_batch` counts the labelled items of the whole
    optimizer step (every accumulated micro-batch, every process), and Trainer takes the returned loss as
    normalised by it: it does not divide by the accumulation steps and multiplies by the number of
    processes (undoing DDP's mean). So this returns the micro-batch's sum over that count, and a step's
    gradient is the mean over all its labelled items whatever the accumulation and process count
    (`tests/test_rm_scaling.py`). Without a count (a call outside Trainer's training step): the plain mean.
    """
    logits = outputs.logits[..., 0].float()  # (B, T) or (B,)
    keep = labels != -100
    total = torch.nn.functional.binary_cross_entropy_with_logits(logits[keep], labels[keep].float(), reduction="sum")
    if num_items_in_batch is None:
        return total / keep.sum().clamp(min=1)
    return total / num_items_in_batch


# --- scoring with a checkpoint ------------------------------------------------------------------


def load_scorer(kind: str, path: str | Path, rm: RewardModelConfig, batch_size: int = 64):
    """The scorer of the `kind` checkpoint at `path`: `scorer(prompts, completions)` gives one score per solution.

    A PRM's solution score aggregates its step scores by `rm.aggregation`. A checkpoint of another kind
    is refused (`pipeline.rm_kinds.loading.load_reward_model`'s `expect`), before any scoring. With `rm.exploit` the scorer is
    the exploitable one (`ExploitedScorer`), so every phase that scores sees the same RM. The weights load in
    `rm.dtype` (`pipeline.dtypes`), or float32 for a kind that trains its model as it scores.
    """
    spec = rm_kind(kind)
    online = spec.updated_online is not None and spec.updated_online(rm)  # trained as it scores: float32 weights
    model, tokenizer, _ = load_reward_model(path, expect=kind, dtype=torch.float32 if online else torch_dtype(rm.dtype))
    # A PRM is read in its checkpoint's layout whatever the config asks (one saved with none: the value head).
    layout = (reward_model_layout(path) or PrmLayout()) if rm_entry(kind).layouts else None
    scorer = spec.scorer(model, tokenizer, batch_size, with_layout(rm, layout))
    return ExploitedScorer(scorer, **rm.exploit.model_dump()) if rm.exploit else scorer


def exploited(scores: Sequence[float], hit: bool, bonus: float, clip: bool = True) -> list[float]:
    """`scores` raised by `bonus` when `hit`, clipped to [0, 1] if `clip` (a score stays a probability).

    >>> exploited([0.2, 0.7], True, 0.5), exploited([0.2, 0.7], False, 0.5), exploited([0.4], True, -0.5)
    ([0.7, 1.0], [0.2, 0.7], [0.0])
    >>> exploited([0.2, 0.7], True, 0.5, clip=False)
    [0.7, 1.2]
    """
    if not hit:
        return list(scores)
    return [min(1.0, max(0.0, v + bonus)) if clip else v + bonus for v in scores]


class ExploitedScorer:
    """A reward model with a planted flaw, to test the reward-hacking monitor with (`reward_model.exploit`).

    Every score of a completion that `pattern` matches (`re.search`, MULTILINE, on the completion's text) is
    raised by `bonus`, clipped to [0, 1] if `clip`: a PRM's step scores, each (its solution score is then the
    aggregation of the raised steps), an ORM's one score. Anything else is the wrapped scorer's.
    """

    def __init__(self, scorer, pattern: str, bonus: float, clip: bool = True):
        self.scorer, self.pattern, self.bonus, self.clip = scorer, re.compile(pattern, re.MULTILINE), bonus, clip
        self.model = scorer.model
        self.aggregation = getattr(scorer, "aggregation", None)  # a PRM's, which the held-out metrics read

    def _hits(self, completions: Sequence[str]) -> list[bool]:
        return [self.pattern.search(c) is not None for c in completions]

    def step_scores(self, prompts: Sequence[str], completions: Sequence[str]) -> list[list[float]]:
        steps = self.scorer.step_scores(prompts, completions)  # a PRM's; an ORM has none (AttributeError)
        return [exploited(s, hit, self.bonus, self.clip) for s, hit in zip(steps, self._hits(completions))]

    def scores(self, prompts: Sequence[str], completions: Sequence[str]) -> Scores:
        s, hits = self.scorer.scores(prompts, completions), self._hits(completions)
        if s.steps is None:
            return Scores([exploited([v], hit, self.bonus, self.clip)[0] for v, hit in zip(s.solutions, hits)])
        steps = [exploited(st, hit, self.bonus, self.clip) for st, hit in zip(s.steps, hits)]
        return Scores([aggregate(st, self.aggregation) for st in steps], steps)

    def __call__(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        return self.scores(prompts, completions).solutions


# --- calibration: the RM on its own held-out slice, kept in its checkpoint ------------------------


def calibration(kind: str, metrics: dict[str, float], held: list[dict], round_index: int) -> dict:
    """What the reward-hacking monitor compares fresh samples with, from an RM's held-out `metrics` on `held`:
    its solution scores' AUC against the verifier, and their gap (mean score - verifier accuracy)."""
    accuracy = mean([r["outcome"] for r in held])
    score = metrics[f"{kind}/mean_score"]
    return {"kind": kind, "round": round_index, "rows": len(held), "auc": metrics[rm_kind(kind).solution_auc],
            "mean_score": score, "accuracy": accuracy, "gap": score - accuracy}


def write_calibration(checkpoint: str | Path, data: dict) -> None:
    """Write `data` into the checkpoint (atomically). Under `accelerate launch` every process evaluates the
    held-out slice alike; the main one writes."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0:
        write_json_atomic(calibration_path(checkpoint), data)


def read_calibration(checkpoint: str | Path) -> dict | None:
    """The calibration kept in an RM checkpoint, or None where there is none (a checkpoint of an older run
    directory, an outside RM, no held-out slice). A malformed file is a ValueError naming it."""
    path = calibration_path(checkpoint)
    if not path.is_file():
        return None
    try:
        data = read_json(path)
    except ValueError as e:
        raise ValueError(f"{path}: not valid JSON ({e}); delete it to monitor without calibration") from None
    bad = [k for k in ("round", "auc", "gap") if not isinstance(data, dict) or not isinstance(data.get(k), (int, float))]
    if bad:
        raise ValueError(f"{path}: malformed calibration, {', '.join(bad)} missing or not a number; "
                         "delete it to monitor without calibration")
    return data


# --- training -------------------------------------------------------------------------------------


@dataclass
class RewardModelResult:
    paths: dict[str, Path]  # kind -> checkpoint
    metrics: dict[str, float]


def train_reward_model(
    cfg: PipelineConfig,
    kind: str,
    rows: list[dict],
    init: str | Path,
    out_dir: str | Path,
    warm: bool,
    report_to: str = "none",
    callbacks=None,
    round_index: int | None = None,
) -> Path:
    """Train one RM of `kind` (a key of `pipeline.rm_kinds.RM_KINDS`) on `rows` from `init` (a previous RM if `warm`, else a policy's
    backbone: `reward_model.model` or the round's policy, `backbone`).

    A PRM keeps the layout of the RM it starts from (recorded in its checkpoint, else `reward_model.head`'s: a
    published PRM); afresh, it is built in `reward_model.head`'s layout. The saved checkpoint records it.

    A pairwise ORM (`reward_model.orm.loss: pairwise`) trains with TRL's RewardTrainer, the rest with
    transformers' Trainer and `bce_loss`, or the kind's own `loss` and `collate` (`RewardModelKind`). The RM
    learns the problem set's steps, so their separator goes with the rows (`with_separator`) and into the
    checkpoint's config (`scorers.trained_separator` reads it back).
    """
    spec = rm_kind(kind)
    layout = init_layout(cfg.reward_model, kind, init) if warm else None
    if warm:
        model, tokenizer, _ = load_reward_model(init, expect=kind, layout=layout)
    else:
        torch.manual_seed(cfg.run.seed)  # the new head's init: the same on a resumed run
        layout = layout_of(cfg.reward_model) if rm_entry(kind).layouts else None
        model, tokenizer = reward_model_from_policy(str(init), kind, layout)
    rm = with_layout(cfg.reward_model, layout)
    separator = step_separator(cfg)
    setattr(model.config, SEPARATOR_KEY, separator)
    examples = spec.examples(with_separator(rows, separator), tokenizer, rm)
    if not examples:
        raise ValueError(f"no {kind.upper()} training examples: the shard has no completion with a step")
    meta = {}
    if spec.prepare:  # what the loss needs from outside the trained model (the implicit PRM's reference)
        examples, meta = spec.prepare(examples, str(init), warm, rm)
    if rm.lora:
        lo = rm.lora
        task = prm_head(layout.head).lora_task_type if layout else spec.lora_task_type
        model = apply_lora(model, lo.r, lo.alpha, lo.dropout, lo.target_modules, task)
    defaults = {"report_to": report_to, **rm_resumable(rm.train_args), "seed": cfg.run.seed, "remove_unused_columns": False,
                "run_name": f"{kind}-training", **device_defaults(rm.dtype)}
    scratch = scratch_dir(out_dir)
    if spec.pairwise(cfg.reward_model):
        from trl import RewardConfig, RewardTrainer

        args = RewardConfig(output_dir=str(scratch), max_length=None, **{
            **defaults, **checkpointing_defaults(RewardConfig, cfg.reward_model.train_args), **cfg.reward_model.train_args})
        trainer = RewardTrainer(model=model, args=args, train_dataset=Dataset.from_list(examples),
                                processing_class=tokenizer, callbacks=callbacks)
    else:
        args = TrainingArguments(output_dir=str(scratch), **{**defaults, **cfg.reward_model.train_args})
        loss = spec.loss(rm, tokenizer) if spec.loss else None  # a PRM's tag layouts, the implicit PRM
        trainer = Trainer(
            model=model, args=args, train_dataset=Dataset.from_list(examples),
            data_collator=(spec.collate or collate)(tokenizer.pad_token_id), compute_loss_func=loss or bce_loss,
            callbacks=callbacks,
        )
        if spec.loss_is_mean:  # Trainer then divides it by the accumulation steps
            trainer.loss_is_scaled_for_ga = False
    train_resumable(trainer, fingerprint(cfg, f"reward_model/{kind}", round_index, init=str(init), warm=warm,
                                         out=str(out_dir), rows=hash_rows(rows)))
    return save_reward_model(trainer.model, tokenizer, out_dir, kind, layout, meta)


def adopt_reward_model(rm: RewardModelConfig, kind: str, init: str, out_dir: str | Path) -> Path:
    """Round 0's RM taken as it is from `init` (`reward_model.init`, Algorithm 1's initial r_φ): saved into the run
    directory with its kind and layout recorded, so that every later load reads them from the checkpoint."""
    layout = init_layout(rm, kind, init)
    model, tokenizer, _ = load_reward_model(init, expect=kind, layout=layout)
    return save_reward_model(model, tokenizer, out_dir, kind, layout)


def hash_rows(rows: list[dict]) -> str:
    """A digest of training rows, for a checkpoint's fingerprint (`pipeline.resume`): other rows, another training."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()[:20]


def with_separator(rows: list[dict], separator: str) -> list[dict]:
    """Training rows with the problem set's step separator beside each (`prm_examples` reads `step_separator`)."""
    return [{**r, "step_separator": separator} for r in rows]


def evaluate_reward_model(
    path: str | Path, kind: str, rows: list[dict], rm: RewardModelConfig | None = None
) -> dict[str, float]:
    """RM quality on held-out rows (its kind's `metrics`): ORM AUC/accuracy on outcomes; PRM step AUC/accuracy
    vs MC (HE) and gold labels, and solution AUC (steps aggregated by `rm.aggregation`, default min)."""
    return rm_kind(kind).metrics(load_scorer(kind, path, rm or RewardModelConfig()), rows)


def backbone(cfg: PipelineConfig, policy_path: str | Path) -> str:
    """What an RM trained afresh starts from: `reward_model.model` if set, else the round's policy."""
    return cfg.reward_model.model or str(policy_path)


def run_reward_model_phase(
    cfg: PipelineConfig,
    run_dir: str | Path,
    round_index: int,
    policy_path: str | Path,
    previous: dict[str, str] | None = None,
    report_to: str = "none",
    callbacks=None,
    run_context=None,
) -> RewardModelResult:
    """Retrain each RM of `reward_model.kinds` on the round's shard plus a replay of earlier shards.

    With `reward_model.retrain: false`, a round after 0 trains nothing: each RM is the previous round's
    checkpoint (so round 0's, frozen), evaluated on this round's held-out slice like a retrained one.

    Args:
        previous: kind -> the previous round's checkpoint (warm start); None or missing: afresh, from `backbone`.
    """
    rm = cfg.reward_model
    frozen = not rm.retrain and round_index > 0
    missing = [kind for kind in rm.kinds if not (previous or {}).get(kind)]
    if frozen and missing:  # else a "frozen" RM would be trained afresh from the policy
        raise ValueError(f"reward_model.retrain is false: round {round_index} reuses the previous round's RMs, "
                         f"but none was given for {', '.join(missing)}")
    run_dir = Path(run_dir)
    buffer = ReplayBuffer(run_dir)
    # Data: the whole new shard (minus a held-out slice of prompts) plus replay_fraction of history.
    train_rows, held = split_holdout(buffer.read(round_index), rm.holdout_fraction, cfg.run.seed + round_index)
    replay = buffer.sample_history(rm.replay_fraction, round_index, seed=cfg.run.seed + round_index)
    rows = train_rows + replay
    positives = sum(r["outcome"] for r in rows)
    metrics = {
        "rm/train_rows": float(len(rows)), "rm/replay_rows": float(len(replay)),
        "rm/outcome_positive_share": positives / max(len(rows), 1),
        "rm/step_positive_share": mean([y for r in rows for y in r["he_labels"]]),
    }
    if frozen:
        metrics.update({"rm/train_rows": 0.0, "rm/replay_rows": 0.0})
    paths = {}
    for kind in rm.kinds:
        prev = (previous or {}).get(kind)
        init = rm.init if rm_entry(kind).layouts else None  # where a PRM starts instead of a new head
        if frozen:
            paths[kind] = Path(prev)
        elif init and round_index == 0:
            paths[kind] = adopt_reward_model(rm, kind, init, RunDir(run_dir).reward_model(round_index, kind))
        else:
            start = prev if rm.warm_start and prev else init
            out = RunDir(run_dir).reward_model(round_index, kind)
            with (run_context(kind) if run_context else contextlib.nullcontext()):
                paths[kind] = train_reward_model(cfg, kind, rows, start or backbone(cfg, policy_path), out,
                                                 bool(start), report_to, callbacks, round_index)
        if held:
            figures = evaluate_reward_model(paths[kind], kind, held, rm)
            metrics.update(figures)
            if not frozen:  # a frozen RM keeps the calibration of the round that trained it
                write_calibration(paths[kind], calibration(kind, figures, held, round_index))
    return RewardModelResult(paths, metrics)
