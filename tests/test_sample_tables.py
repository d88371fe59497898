"""MLflow's view of the work: each round's sample tables (a fixed, seeded slice), logged once, and the
experiment's kind (MLflow 3's model-training view); the tables a finished run logged."""

from __future__ import annotations

import json
import random

import pytest
from mlflow import MlflowClient

from pipeline.problems.arithmetic import EmbeddedArithmetic
from pipeline.replay import read_shard, write_shard
from pipeline.rundir import RunDir
from pipeline.sample_tables import eval_samples, pick, sample_table, scored_by
from pipeline.scorers import Scores
from pipeline.tracking import EXPERIMENT_KIND_TAG, connect, create_run, log_table
from tests.helpers import NAME, make_row, mlflow_structure

COLUMNS = ["round", "prompt_id", "sample_index", "prompt", "completion", "steps", "answer", "verifier",
           "prm_step_scores", "prm_score", "orm_score", "he_labels", "se_labels", "gold_labels", "scored_by"]
ARITH = EmbeddedArithmetic(num_train=4, num_test=6, seed=3)


def _shard(tmp_path, round_: int, prompt_ids: list[str], samples: int = 2, **overrides) -> list[dict]:
    """A round's shard on disk, read back through the checked reader; its rows in the order given."""
    rows = []
    for k, pid in enumerate(prompt_ids):
        for j in range(samples):
            he = [1, j % 2, 0]
            rows.append(make_row(round_, 0, **{
                "prompt_id": pid, "sample_index": j, "prompt": f"{pid}?\n", "outcome": j % 2,
                "completion": f"{pid} sample {j} of round {round_}", "he_labels": he, "se_labels": [v / 2 for v in he],
                "gold_labels": [1, 1, k % 2], **overrides}))
    return read_shard(write_shard(rows, RunDir(tmp_path).shard(round_)))


def _scores(rows: list[dict], offset: float) -> dict[str, Scores]:
    """Scores that tell the rows apart: a PRM's (with steps) and an ORM's, one per row in order."""
    prm = [[offset + i / 100, offset + i / 100 + 0.001] for i in range(len(rows))]
    return {"prm": Scores([min(s) for s in prm], prm), "orm": Scores([offset + i / 50 for i in range(len(rows))])}


def test_the_collect_table_shows_the_same_prompts_every_round_with_every_column(tmp_path):
    ids = [f"arith-train-{i:05d}" for i in range(6)]
    shards = {0: _shard(tmp_path, 0, ids), 1: _shard(tmp_path, 1, ids[::-1])}  # the same prompts, in another order
    tables = {r: sample_table(rows, _scores(rows, 0.1 * (r + 1)), 4, seed=0, scored_by=f"prm=rm{r}")
              for r, rows in shards.items()}
    for r, table in tables.items():
        assert [list(row) for row in table] == [COLUMNS] * 4
        assert {row["round"] for row in table} == {r} and {row["scored_by"] for row in table} == {f"prm=rm{r}"}
        assert len({row["prompt_id"] for row in table}) == 4  # 4 prompts, one sample each, before any second sample
        assert {row["sample_index"] for row in table} == {0}
        scores = _scores(shards[r], 0.1 * (r + 1))
        for row in table:  # every value from its own sample: the shard's row, the scores at that row's position
            i = next(i for i, x in enumerate(shards[r])
                     if (x["prompt_id"], x["sample_index"]) == (row["prompt_id"], row["sample_index"]))
            x = shards[r][i]
            assert (row["completion"], row["answer"], row["verifier"]) == (x["completion"], x["answer"], x["outcome"])
            assert (row["he_labels"], row["se_labels"], row["gold_labels"]) == (
                x["he_labels"], x["se_labels"], x["gold_labels"])
            assert row["prm_step_scores"] == scores["prm"].steps[i] and row["prm_score"] == scores["prm"].solutions[i]
            assert row["orm_score"] == scores["orm"].solutions[i]
    assert [row["prompt_id"] for row in tables[0]] == [row["prompt_id"] for row in tables[1]]
    # Another seed, another slice; the table's size from the config's rows, 0: none.
    other = sample_table(shards[0], _scores(shards[0], 0.1), 4, seed=1)
    assert [row["prompt_id"] for row in other] != [row["prompt_id"] for row in tables[0]]
    assert len(sample_table(shards[0], {}, 100, seed=0)) == 12 and sample_table(shards[0], {}, 0, seed=0) == []


def test_a_table_has_nulls_where_labels_are_not_known(tmp_path):
    # GSM8K has no gold step labels; eval samples have no MC labels (no rollouts), the embedded set's gold ones.
    gsm8k = sample_table(_shard(tmp_path, 0, ["gsm8k-train-00001"], gold_labels=None), {}, 2, seed=0)
    assert [row["gold_labels"] for row in gsm8k] == [None, None]
    problems = ARITH.test[:3]
    texts = [[p.solution, "1+1=3\nAnswer: 3"] for p in problems]
    rows = {r: eval_samples(ARITH, problems, [p.prompt for p in problems], texts,
                            [[ARITH.extract_answer(t) for t in ts] for ts in texts],
                            [[ARITH.is_correct(t, p) for t in ts] for ts, p in zip(texts, problems)], r) for r in (0, 2)}
    table = sample_table(rows[2], {}, 6, seed=0)
    assert {(row["he_labels"], row["se_labels"]) for row in table} == {(None, None)}
    for row in table:
        problem = next(p for p in problems if p.id == row["prompt_id"])
        assert row["gold_labels"] == ARITH.gold_step_labels(row["completion"], problem)
        assert row["verifier"] == (row["sample_index"] == 0)  # the gold solution right, the slip wrong
        assert row["steps"] == row["completion"].split("\n")  # no blank lines in these
    assert [r["prompt_id"] for r in table] == [r["prompt_id"] for r in sample_table(rows[0], {}, 6, seed=0)]


def _pick_reference(keys, rows, seed):
    """A plain loop: prompts in rank order, sample 0 of each, then sample 1 of each, ...; listed by rank."""
    import hashlib

    by_rank = sorted({pid for pid, _ in keys}, key=lambda pid: hashlib.sha256(f"{seed}:{pid}".encode()).hexdigest())
    taken = []
    for j in range(max(s for _, s in keys) + 1):
        for pid in by_rank:
            if (pid, j) in keys and len(taken) < rows:
                taken.append((pid, j))
    return [keys.index(k) for pid in by_rank for k in sorted(taken) if k[0] == pid]


def test_pick_against_a_plain_loop():
    rng = random.Random(0)
    for trial in range(50):
        keys = [(f"p{i}", j) for i in range(rng.randint(1, 9)) for j in range(rng.randint(1, 4))]
        rng.shuffle(keys)
        rows = rng.randint(0, len(keys) + 2)
        assert pick(keys, rows, seed=trial) == _pick_reference(keys, rows, trial)


def test_a_prompts_place_does_not_depend_on_the_others():
    # Rounds that share some prompts show the shared ones in the same order.
    a = [(f"p{i}", 0) for i in range(8)]
    b = [(f"p{i}", 0) for i in range(4, 12)]
    shown_a = [a[i][0] for i in pick(a, 8, seed=0)]
    shown_b = [b[i][0] for i in pick(b, 8, seed=0)]
    assert [p for p in shown_a if p in shown_b] == [p for p in shown_b if p in shown_a]


def test_scores_of_another_length_are_refused_naming_the_rm(tmp_path):
    rows = _shard(tmp_path, 0, ["p0", "p1"])
    with pytest.raises(ValueError, match="orm scores: 3 for 4 samples"):
        sample_table(rows, {"orm": Scores([0.5] * 3)}, 2, seed=0)


def test_scored_by_names_checkpoints_in_the_run_directory_relative_to_it(tmp_path):
    paths = {"prm": str(tmp_path / "round-001" / "reward_model" / "prm"), "orm": "models:/x-orm@round-1"}
    assert scored_by(paths, tmp_path) == "prm=round-001/reward_model/prm, orm=models:/x-orm@round-1"


# --- in MLflow ------------------------------------------------------------------------------------------


def test_a_table_logged_again_on_resume_is_kept_once(tmp_path, mlflow_tmp):
    experiment = connect(mlflow_tmp, "tables")
    run = create_run(experiment, "round-000-eval")
    rows = sample_table(_shard(tmp_path, 0, ["p0", "p1", "p2"]), _scores([None] * 6, 0.2), 4, seed=0)
    log_table(run, rows, "samples/collect.json")
    log_table(run, rows, "samples/collect.json")  # a resumed eval phase logs its seeded rows again
    client = MlflowClient()
    path = client.download_artifacts(run, "samples/collect.json", str(tmp_path))
    with open(path) as f:
        table = json.load(f)
    assert table["columns"] == COLUMNS and len(table["data"]) == 4
    for logged, row in zip(table["data"], rows):  # lists, nulls and strings as logged; floats to 10 digits
        for value, (column, expected) in zip(logged, row.items()):
            floats = isinstance(expected, float) or (isinstance(expected, list) and isinstance(expected[0], float))
            assert value == (pytest.approx(expected, abs=1e-9) if floats else expected), column
    assert {"path": "samples/collect.json", "type": "table"} in json.loads(
        client.get_run(run).data.tags["mlflow.loggedArtifacts"])  # what MLflow's UI lists as a table


def test_the_experiment_opens_in_the_model_training_view_unless_a_kind_was_chosen(mlflow_tmp):
    client = MlflowClient()
    made = connect(mlflow_tmp, "fresh")
    assert client.get_experiment(made).tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    older = client.create_experiment("older")  # one made before the tag (an earlier version, or by hand)
    assert connect(mlflow_tmp, "older") == older
    assert client.get_experiment(older).tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    chosen = client.create_experiment("chosen", tags={EXPERIMENT_KIND_TAG: "genai_development"})
    connect(mlflow_tmp, "chosen")
    assert client.get_experiment(chosen).tags[EXPERIMENT_KIND_TAG] == "genai_development"


# --- in a finished run ---------------------------------------------------------------------------------------


def _table(run_id: str, name: str, into) -> list[dict]:
    import mlflow

    into = into / f"{run_id}-{name}"  # not MLflow's default, a temp folder left behind
    into.mkdir()
    with open(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=f"samples/{name}.json",
                                                  dst_path=str(into))) as f:
        table = json.load(f)
    return [dict(zip(table["columns"], row)) for row in table["data"]]


@pytest.mark.slow  # the session's finished mini run
def test_each_rounds_eval_run_holds_its_sample_tables(finished, tmp_path):
    """The same held-out prompts every round, the shard's rows, each scored by the RMs of its round."""
    cfg = finished.cfg
    runs = {r.info.run_name: r.info.run_id for r in mlflow_structure(NAME)["all"].values()}
    eval_ids = []
    for r in range(cfg.run.rounds + 1):
        run_id = runs[f"round-{r:03d}-eval"]
        evals, collected = _table(run_id, "eval", tmp_path), _table(run_id, "collect", tmp_path)
        assert len(evals) == cfg.tracking.sample_table_rows == 16  # of 8 problems x 4 samples: 2 of each
        assert len(collected) == 12  # the whole shard: 6 prompts x 2 samples
        assert {x["round"] for x in evals + collected} == {r}
        assert all(len(x["prm_step_scores"]) >= 1 and 0 <= x["orm_score"] <= 1 for x in evals + collected)
        assert all(x["he_labels"] is None and isinstance(x["gold_labels"], list) for x in evals)
        shard = {(x["prompt_id"], x["sample_index"]): x for x in read_shard(RunDir(cfg.run_dir).shard(r))}
        for x in collected:
            row = shard[x["prompt_id"], x["sample_index"]]
            assert (x["completion"], x["verifier"], x["he_labels"]) == (row["completion"], row["outcome"],
                                                                      row["he_labels"])
        rms = f"round-{max(r - 1, 0):03d}/reward_model"  # the RMs GRPO trained against score the shard
        assert collected[0]["scored_by"] == f"prm={rms}/prm, orm={rms}/orm"
        assert evals[0]["scored_by"] == f"prm=round-{r:03d}/reward_model/prm, orm=round-{r:03d}/reward_model/orm"
        eval_ids.append([(x["prompt_id"], x["sample_index"]) for x in evals])
    assert eval_ids[0] == eval_ids[1] == eval_ids[2]
