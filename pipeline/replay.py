"""The replay buffer: one labelled parquet shard per round, and replay sampling over the past rounds.

Each round's collection phase writes `run_dir/round-XXX/samples.parquet` (XXX the 3-digit round). The
buffer is the union of these shards. Reward-model retraining in round r uses all of shard r plus a random
fraction (DeepSeekMath §4.2, Algorithm 1: 10%) of the shards of rounds < r; `ReplayBuffer.sample_history`
draws that fraction, exactly and reproducibly.

Every row keeps its provenance (round, the policy checkpoint that sampled it) and both Math-Shepherd step
labels (hard and soft estimation), so a later round can retrain on either without relabelling.

Shards are written atomically (`rundir.atomic_path`), so a crash never leaves a half-written shard where a
finished one is expected.
"""

from __future__ import annotations

import math
import os
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from models.atomic import atomic_path
from pipeline.rundir import RunDir

SHARD_SCHEMA = pa.schema(
    [
        pa.field("round", pa.int64(), nullable=False),
        pa.field("policy", pa.string(), nullable=False),  # checkpoint path of the policy that sampled it
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("prompt", pa.string(), nullable=False),
        pa.field("sample_index", pa.int64(), nullable=False),
        pa.field("completion", pa.string(), nullable=False),
        pa.field("answer", pa.string()),  # the extracted answer; null when none could be parsed
        pa.field("steps", pa.list_(pa.string()), nullable=False),
        pa.field("outcome", pa.int64(), nullable=False),  # verifier label, 0 or 1
        pa.field("he_labels", pa.list_(pa.int64()), nullable=False),  # Math-Shepherd hard estimation, per step
        pa.field("se_labels", pa.list_(pa.float64()), nullable=False),  # Math-Shepherd soft estimation, per step
        pa.field("gold_labels", pa.list_(pa.int64())),  # gold step labels; null when the problem set has none
        pa.field("rollouts", pa.int64(), nullable=False),  # MC completions spent labelling this sample
        pa.field("num_tokens", pa.int64(), nullable=False),
    ]
)

_STEP_LABEL_COLUMNS = ("he_labels", "se_labels")


# --------------------------------------------------------------------------------------------- validation


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # True is an int to Python, not to us


def _is_float(value: object) -> bool:
    return isinstance(value, float) or _is_int(value)  # 1 is a fine soft label; it is stored as 1.0


def _checker(type_: pa.DataType):
    """A predicate for one Python value of an arrow type (scalars and lists of scalars only)."""
    if pa.types.is_list(type_):
        item = _checker(type_.value_type)
        return lambda v: isinstance(v, (list, tuple)) and all(item(x) for x in v)
    if pa.types.is_int64(type_):
        return _is_int
    if pa.types.is_float64(type_):
        return _is_float
    if pa.types.is_string(type_):
        return lambda v: isinstance(v, str)
    raise TypeError(f"no checker for {type_}")  # only reached if SHARD_SCHEMA grows a new type


_CHECKERS = {field.name: _checker(field.type) for field in SHARD_SCHEMA}


def _validate_row(index: int, row: dict) -> None:
    if not isinstance(row, dict):
        raise ValueError(f"row {index}: expected a dict, got {type(row).__name__}")
    unknown = sorted(set(row) - set(SHARD_SCHEMA.names))
    if unknown:
        # Refuse rather than drop: a misspelt column would otherwise vanish silently.
        raise ValueError(f"row {index}: unknown column {unknown[0]!r}; shard columns are {SHARD_SCHEMA.names}")
    for field in SHARD_SCHEMA:
        if field.name not in row:
            raise ValueError(f"row {index}: column {field.name!r} is missing")
        value = row[field.name]
        if value is None:
            if field.nullable:
                continue
            raise ValueError(f"row {index}: column {field.name!r} is None but may not be null")
        if not _CHECKERS[field.name](value):
            raise ValueError(
                f"row {index}: column {field.name!r} has value {value!r:.80} of type {type(value).__name__}, "
                f"expected {field.type}"
            )
    for name in _STEP_LABEL_COLUMNS:
        if row[name] and len(row[name]) != len(row["steps"]):  # none at all: collected without MC rollouts
            raise ValueError(
                f"row {index}: column {name!r} has {len(row[name])} labels for {len(row['steps'])} steps"
            )


# ------------------------------------------------------------------------------------------------- shards


def write_shard(rows: list[dict], path: str | os.PathLike) -> Path:
    """Validate `rows` against `SHARD_SCHEMA` and write them to `path` atomically.

    Args:
        rows: one dict per sample, exactly the columns of `SHARD_SCHEMA`; `he_labels` and `se_labels`
            hold one label per entry of `steps`, or none (collected with `collect.rollouts_per_step: 0`).
        path: the shard's path, usually `RunDir(run_dir).shard(round)`; parent directories are created.

    Returns:
        `path` as a `Path`.

    Raises:
        ValueError: a row with a missing, unknown or mistyped column, or label lists whose length differs
            from `steps` (naming the row index and the column). Nothing is written then.
    """
    for index, row in enumerate(rows):
        _validate_row(index, row)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=SHARD_SCHEMA)

    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return path


def read_shard(path: str | os.PathLike) -> list[dict]:
    """Read a shard back as one dict per row, checking its columns and types first.

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: the file is not parquet, or a column of `SHARD_SCHEMA` is missing or has another type
            (naming the shard and the column). Extra columns are ignored.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no replay shard at {path}")
    try:
        table = pq.read_table(path)
    except pa.ArrowException as error:
        raise ValueError(f"{path}: not a readable parquet shard ({error})") from error
    for field in SHARD_SCHEMA:
        if field.name not in table.schema.names:
            raise ValueError(f"{path}: column {field.name!r} is missing")
        found = table.schema.field(field.name).type
        if found != field.type:  # list item names (item/element) do not count in arrow's equality
            raise ValueError(f"{path}: column {field.name!r} has type {found}, expected {field.type}")
    return table.select(SHARD_SCHEMA.names).to_pylist()


# ------------------------------------------------------------------------------------------------ buffer


class ReplayBuffer:
    """All round shards of one run directory, and the historical replay drawn for RM retraining.

    Args:
        run_dir: the run directory holding `round-XXX/samples.parquet` shards.
    """

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)

    def rounds(self) -> list[int]:
        """The rounds that have a shard, sorted."""
        run = RunDir(self.run_dir)
        return [r for r in run.rounds() if run.shard(r).is_file()]

    def read(self, round: int) -> list[dict]:
        """The rows of one round's shard."""
        return read_shard(RunDir(self.run_dir).shard(round))

    def history(self, before_round: int) -> list[dict]:
        """All rows of the shards of rounds < `before_round`, in round order, then file order."""
        return [row for r in self.rounds() if r < before_round for row in self.read(r)]

    def sample_history(self, fraction: float, before_round: int, seed: int) -> list[dict]:
        """A uniform draw without replacement of `round(fraction * n)` of the n historical rows.

        Deterministic for a seed; the rows come back in history order (round, then file order), so the
        result does not depend on the order of the draw.

        Args:
            fraction: share of the historical rows to replay, in [0, 1] (DeepSeekMath uses 0.1).
            before_round: only shards of rounds < this are drawn from (the current round's shard is used
                whole, not replayed).
            seed: seed of the draw.

        Raises:
            ValueError: `fraction` outside [0, 1].
        """
        if not (isinstance(fraction, (int, float)) and math.isfinite(fraction) and 0 <= fraction <= 1):
            raise ValueError(f"fraction must be in [0, 1], got {fraction!r}")
        rows = self.history(before_round)
        count = round(fraction * len(rows))  # Python's round: banker's rounding on exact halves
        chosen = sorted(random.Random(seed).sample(range(len(rows)), count))
        return [rows[i] for i in chosen]
