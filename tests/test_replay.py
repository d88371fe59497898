"""Replay buffer: shard round trip, atomic writes, clear errors on bad rows and bad shards, replay sampling."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.replay import SHARD_SCHEMA, ReplayBuffer, read_shard, write_shard
from pipeline.rundir import RunDir
from tests.helpers import make_row


def fill_run(run_dir, sizes: dict[int, int]) -> None:
    for r, n in sizes.items():
        write_shard([make_row(r, i) for i in range(n)], RunDir(run_dir).shard(r))


def test_schema_has_exactly_the_contract_columns():
    assert SHARD_SCHEMA.names == [
        "round", "policy", "prompt_id", "prompt", "sample_index", "completion", "answer", "steps",
        "outcome", "he_labels", "se_labels", "gold_labels", "rollouts", "num_tokens",
    ]  # fmt: skip


def test_shard_path_format(tmp_path):
    assert RunDir(tmp_path).shard(1) == tmp_path / "round-001" / "samples.parquet"
    assert RunDir(tmp_path).shard(1234) == tmp_path / "round-1234" / "samples.parquet"
    with pytest.raises(ValueError, match="round must be"):
        RunDir(tmp_path).shard(-1)


def test_write_read_round_trip(tmp_path):
    rows = [
        make_row(2, 0),
        make_row(2, 1, answer=None, gold_labels=None, outcome=0, he_labels=[1, 0, 0], se_labels=[1, 0, 0]),
        make_row(2, 2, steps=[], he_labels=[], se_labels=[], gold_labels=[]),
    ]
    path = write_shard(rows, RunDir(tmp_path / "new" / "dirs").shard(2))
    assert path.is_file()
    back = read_shard(path)
    # Integer soft labels come back as floats; otherwise identical, in order.
    rows[1]["se_labels"] = [1.0, 0.0, 0.0]
    assert back == rows
    assert isinstance(back[1]["se_labels"][0], float)
    assert pq.read_schema(path).names == SHARD_SCHEMA.names


def test_write_empty_shard(tmp_path):
    path = write_shard([], tmp_path / "round-000" / "samples.parquet")
    assert read_shard(path) == []


@pytest.mark.parametrize(
    ("overrides", "drop", "match"),
    [
        ({}, "outcome", "row 1: column 'outcome' is missing"),
        ({"outcome": "1"}, None, "row 1: column 'outcome' .* expected int64"),
        ({"outcome": True}, None, "row 1: column 'outcome' .* expected int64"),
        ({"steps": ["a", 3, "c"]}, None, "row 1: column 'steps'"),
        ({"se_labels": [0.5, "x", 1.0]}, None, "row 1: column 'se_labels'"),
        ({"policy": None}, None, "row 1: column 'policy' is None"),
        ({"he_labels": [1, 1]}, None, "row 1: column 'he_labels' has 2 labels for 3 steps"),
        ({"se_labels": [1.0, 1.0, 1.0, 1.0]}, None, "row 1: column 'se_labels' has 4 labels for 3 steps"),
        ({"outcom": 1}, None, "row 1: unknown column 'outcom'"),
    ],
)
def test_write_rejects_bad_rows(tmp_path, overrides, drop, match):
    bad = make_row(0, 1, **overrides)
    if drop:
        del bad[drop]
    path = RunDir(tmp_path).shard(0)
    with pytest.raises(ValueError, match=match):
        write_shard([make_row(0, 0), bad], path)
    assert not path.exists()


def test_interrupted_write_leaves_nothing_and_keeps_previous_shard(tmp_path, monkeypatch):
    path = RunDir(tmp_path).shard(1)
    previous = [make_row(1, i) for i in range(3)]
    write_shard(previous, path)

    real_write_table = pq.write_table

    def write_half_then_fail(table, where, *args, **kwargs):
        real_write_table(table.slice(0, 1), where, *args, **kwargs)  # some bytes reach the temp file
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", write_half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        write_shard([make_row(1, i) for i in range(10)], path)
    # The old shard is untouched and no temp file is left beside it.
    assert read_shard(path) == previous
    assert sorted(p.name for p in path.parent.iterdir()) == ["samples.parquet"]

    # Same for a first write: no shard appears at all.
    fresh = RunDir(tmp_path).shard(2)
    with pytest.raises(OSError, match="disk full"):
        write_shard([make_row(2, 0)], fresh)
    assert list(fresh.parent.iterdir()) == []
    assert ReplayBuffer(tmp_path).rounds() == [1]


def test_read_missing_shard(tmp_path):
    with pytest.raises(FileNotFoundError, match="round-004"):
        read_shard(RunDir(tmp_path).shard(4))


def test_read_shard_with_missing_column(tmp_path):
    path = RunDir(tmp_path).shard(1)
    path.parent.mkdir(parents=True)
    table = pa.Table.from_pylist([make_row(1, 0)], schema=SHARD_SCHEMA).drop_columns(["rollouts"])
    pq.write_table(table, path)
    with pytest.raises(ValueError, match=r"round-001/samples.parquet: column 'rollouts' is missing"):
        read_shard(path)


def test_read_shard_with_wrong_dtype(tmp_path):
    path = RunDir(tmp_path).shard(1)
    path.parent.mkdir(parents=True)
    table = pa.Table.from_pylist([make_row(1, 0)], schema=SHARD_SCHEMA)
    index = SHARD_SCHEMA.get_field_index("outcome")
    table = table.set_column(index, "outcome", pa.array(["1"], pa.string()))
    pq.write_table(table, path)
    with pytest.raises(
        ValueError, match=r"round-001/samples.parquet: column 'outcome' has type string, expected int64"
    ):
        read_shard(path)


def test_read_shard_not_parquet(tmp_path):
    path = RunDir(tmp_path).shard(0)
    path.parent.mkdir(parents=True)
    path.write_text("not parquet")
    with pytest.raises(ValueError, match="round-000/samples.parquet: not a readable parquet shard"):
        read_shard(path)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda t: t.drop_columns(["se_labels"]), "column 'se_labels' is missing"),
        (lambda t: t.set_column(t.schema.get_field_index("outcome"), "outcome", pa.array([1.0, 0.0, 1.0])),
         "column 'outcome' has type double, expected int64"),
        (lambda t: t.set_column(t.schema.get_field_index("steps"), "steps", pa.array(["a", "b", "c"])),
         "column 'steps' has type string, expected list<item: string>"),
    ],
    ids=["missing-column", "wrong-dtype", "scalar-for-list"],
)
def test_bad_shard_names_shard_and_column(tmp_path, mutate, expected):
    path = tmp_path / "round-000" / "samples.parquet"
    path.parent.mkdir()
    pq.write_table(mutate(pa.Table.from_pylist([make_row(0, i) for i in range(3)], schema=SHARD_SCHEMA)), path)
    with pytest.raises(ValueError) as info:
        read_shard(path)
    assert str(info.value) == f"{path}: {expected}"


def test_shard_that_is_not_parquet(tmp_path):
    path = tmp_path / "samples.parquet"
    path.write_bytes(b"PAR1 but not really")
    with pytest.raises(ValueError, match=re.escape(f"{path}: not a readable parquet shard")):
        read_shard(path)


def test_buffer_rounds_read_history(tmp_path):
    fill_run(tmp_path, {2: 5, 0: 3, 1: 4})
    (tmp_path / "round-003").mkdir()  # a round still collecting: no shard yet
    (tmp_path / "round-000" / "policy").mkdir()
    buffer = ReplayBuffer(tmp_path)
    assert buffer.rounds() == [0, 1, 2]
    assert [r["sample_index"] for r in buffer.read(1)] == [0, 1, 2, 3]
    history = buffer.history(before_round=2)
    assert [(r["round"], r["sample_index"]) for r in history] == [(0, i) for i in range(3)] + [
        (1, i) for i in range(4)
    ]
    assert buffer.history(0) == []
    assert ReplayBuffer(tmp_path / "nowhere").rounds() == []


@pytest.fixture
def buffer_37(tmp_path):
    # 37 historical rows in rounds 0-2, plus a round 3 that must never be replayed for before_round=3.
    fill_run(tmp_path, {0: 10, 1: 12, 2: 15, 3: 20})
    return ReplayBuffer(tmp_path)


@pytest.mark.parametrize(("fraction", "expected"), [(0.0, 0), (0.1, 4), (0.5, 18), (1.0, 37), (0.15, 6)])
def test_sample_history_counts_are_exact(buffer_37, fraction, expected):
    # round(0.1 * 37) = round(3.7) = 4; round(0.5 * 37) = round(18.5) = 18 (Python rounds halves to even);
    # round(0.15 * 37) = round(5.55) = 6.
    sample = buffer_37.sample_history(fraction, before_round=3, seed=0)
    assert len(sample) == expected == round(fraction * 37)
    keys = [(r["round"], r["sample_index"]) for r in sample]
    assert len(set(keys)) == len(keys)  # without replacement
    assert all(r["round"] < 3 for r in sample)
    assert keys == sorted(keys)  # history order, whatever the draw order


def test_sample_history_full_fraction_is_whole_history(buffer_37):
    assert buffer_37.sample_history(1.0, before_round=3, seed=5) == buffer_37.history(3)


def test_sample_history_deterministic_per_seed(buffer_37):
    def keys(seed):
        return [(r["round"], r["sample_index"]) for r in buffer_37.sample_history(0.3, 3, seed)]

    assert keys(7) == keys(7)
    assert keys(7) != keys(8)


def test_sample_history_only_earlier_rounds(buffer_37):
    sample = buffer_37.sample_history(1.0, before_round=2, seed=0)
    assert len(sample) == 22 and {r["round"] for r in sample} == {0, 1}
    assert buffer_37.sample_history(0.5, before_round=0, seed=0) == []


@pytest.mark.parametrize("fraction", [-0.1, 1.5, float("nan")])
def test_sample_history_rejects_bad_fraction(buffer_37, fraction):
    with pytest.raises(ValueError, match=r"fraction must be in \[0, 1\]"):
        buffer_37.sample_history(fraction, before_round=3, seed=0)
