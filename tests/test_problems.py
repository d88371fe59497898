"""Problem sets: the registry, generation, answer extraction, verifiers, gold step labels and input errors."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipeline import steps
from pipeline.problems import (
    GSM8K,
    PROBLEM_SETS,
    EmbeddedArithmetic,
    Problem,
    ProblemSet,
    load_problem_set,
    problem_set_from_config,
)
from pipeline.problems.arithmetic import chain_values, format_solution, parse_prompt
from pipeline.problems.base import answer_line_value

# A few dozen GSM8K rows ship with the tests (tests/data/gsm8k/README.md says which); the full files are
# not part of the repository, and the tests that need them skip when they are not beside the checkout.
GSM8K_DIR = Path(__file__).resolve().parent / "data" / "gsm8k"
FULL_GSM8K_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
needs_full_gsm8k = pytest.mark.skipif(
    not (FULL_GSM8K_DIR / "train.jsonl").is_file() or not (FULL_GSM8K_DIR / "test.jsonl").is_file(),
    reason=f"GSM8K's full train.jsonl/test.jsonl are not in {FULL_GSM8K_DIR} (the fixture's tests still run)",
)

# The worked example of the brief: 7 +5 *3 -4 has the gold chain 7 -> 12 -> 36 -> 32.
EXAMPLE = Problem(
    id="arith-test-example",
    prompt="7 +5 *3 -4\n",
    answer="32",
    solution="7+5=12\n12*3=36\n36-4=32\nAnswer: 32",
)


@pytest.fixture(scope="module")
def arith() -> EmbeddedArithmetic:
    return EmbeddedArithmetic(seed=0, num_train=300, num_test=50)


@pytest.fixture(scope="module")
def gsm8k() -> GSM8K:
    return GSM8K.from_jsonl(GSM8K_DIR / "train.jsonl", GSM8K_DIR / "test.jsonl")


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def row(question: str, answer: str) -> str:
    return json.dumps({"question": question, "answer": answer})


# ---------------------------------------------------------------- base


def test_answer_line_value_takes_the_last_answer_line():
    # The model's final word counts: a later Answer line overrides an earlier one; leading spaces are fine.
    assert answer_line_value("Answer: 1\nx\n  Answer:  2 \n") == "2"
    assert answer_line_value("no answer here") is None
    # "Answer:" must start the line; mentioning it mid-line is not a statement of the answer.
    assert answer_line_value("my Answer: 3") is None


def test_steps_are_not_the_problem_sets_to_split():
    # One step convention (pipeline/steps.py) places PRM labels and scores, MC prefixes and advantages; a
    # set's own splitter would disagree with them, so a set has none to override.
    assert not hasattr(ProblemSet, "split_steps")


def test_problem_sets_are_problem_sets(arith, gsm8k):
    assert isinstance(arith, ProblemSet) and isinstance(gsm8k, ProblemSet)
    assert arith.has_gold_step_labels is True and gsm8k.has_gold_step_labels is False


# ---------------------------------------------------------------- arithmetic: generation

PROMPT_RE = re.compile(r"\d+( [+\-*]\d+)+\n")


def test_generated_problems_follow_the_format_and_the_ranges(arith):
    for p in arith.train + arith.test:
        assert PROMPT_RE.fullmatch(p.prompt), p.prompt
        start, ops = parse_prompt(p.prompt)
        values = chain_values(start, ops)
        assert 2 <= len(ops) <= 3  # default min_steps, max_steps
        assert 1 <= start <= 20  # default start_range
        assert all(op in "+-*" and 1 <= b <= 9 for op, b in ops)  # default operators, operand_range
        assert all(0 <= v <= 99 for v in values)  # every intermediate value within [0, max_value]
        assert p.answer == str(values[-1])
        assert p.solution == format_solution(start, ops)
        assert p.solution.split("\n")[-1] == f"Answer: {p.answer}"


def test_solution_format_on_the_worked_example():
    assert format_solution(*parse_prompt(EXAMPLE.prompt)) == EXAMPLE.solution


def test_ids_unique_and_splits_disjoint(arith):
    assert len(arith.train) == 300 and len(arith.test) == 50
    assert arith.train[42].id == "arith-train-00042" and arith.test[7].id == "arith-test-00007"
    prompts = [p.prompt for p in arith.train + arith.test]
    assert len(set(prompts)) == len(prompts)  # no duplicate within a split and none shared


def test_generation_is_deterministic_per_seed(arith):
    again = EmbeddedArithmetic(seed=0, num_train=300, num_test=50)
    assert again.train == arith.train and again.test == arith.test
    other = EmbeddedArithmetic(seed=1, num_train=300, num_test=50)
    assert other.test != arith.test


def test_test_set_does_not_depend_on_num_train(arith):
    # The test set is drawn first, so a bigger training budget is evaluated on the same problems.
    bigger = EmbeddedArithmetic(seed=0, num_train=1000, num_test=50)
    assert bigger.test == arith.test
    assert bigger.train[:300] == arith.train


def test_every_operator_gets_used(arith):
    ops = [op for p in arith.train for op, _ in parse_prompt(p.prompt)[1]]
    assert set(ops) == {"+", "-", "*"}
    # Operators are drawn uniformly among the usable ones, so none dominates (each ~1/3).
    assert all(ops.count(op) / len(ops) > 0.25 for op in "+-*")


def test_a_set_that_often_gets_stuck_still_stays_in_range():
    # With only "-" a chain reaches 0 quickly and then has no usable operand >= 1: such draws are resampled.
    subtract = EmbeddedArithmetic(num_train=20, num_test=5, operators=("-",), start_range=(10, 30), max_value=30)
    for p in subtract.train + subtract.test:
        assert all(v >= 0 for v in chain_values(*parse_prompt(p.prompt)))


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"operators": ()}, "operators"),
        ({"operators": ("+", "/")}, "operators"),
        ({"operators": ("+", "+")}, "operators"),
        ({"min_steps": 4, "max_steps": 3}, "min_steps"),
        ({"min_steps": 0}, "min_steps"),
        ({"start_range": (20, 1)}, "start_range"),
        ({"start_range": (1, 200)}, "start_range"),  # above max_value 99
        ({"operand_range": (9, 1)}, "operand_range"),
        ({"operand_range": (-3, 3)}, "operand_range"),
        ({"max_value": -1}, "max_value"),
        ({"num_train": -1}, "num_train"),
        ({"num_test": 1.5}, "num_test"),
        # 1 +1 +1 and 1 +1 +1 +1 are the only two problems these ranges allow.
        ({"start_range": (1, 1), "operand_range": (1, 1), "operators": ("+",)}, "num_train"),
        # 1..5 times 9 always exceeds 5: no chain can be made at all.
        ({"start_range": (1, 5), "operand_range": (9, 9), "operators": ("*",), "max_value": 5}, "num_train"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        EmbeddedArithmetic(**{"num_train": 20, "num_test": 5, **kwargs})


# ---------------------------------------------------------------- arithmetic: answers and verifier


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (EXAMPLE.solution, "32"),
        ("7+5=12\nAnswer: 12\n36-4=32\nAnswer: 032", "32"),  # last Answer line, canonical integer
        ("Answer:32", "32"),  # no space needed after the colon
        ("Answer: -5", "-5"),
        ("7+5=12\n12*3=36\n36-4=32", None),  # no Answer line
        ("Answer: 32 apples", None),  # not exactly one integer
        ("Answer: 30+2", None),  # parsed, never evaluated
        ("Answer:", None),
    ],
)
def test_arithmetic_extract_answer(arith, completion, expected):
    assert arith.extract_answer(completion) == expected


def test_arithmetic_is_correct(arith):
    assert arith.is_correct(EXAMPLE.solution, EXAMPLE)
    assert arith.is_correct("Answer: 032", EXAMPLE)  # compared as integers
    assert not arith.is_correct("Answer: 31", EXAMPLE)
    assert not arith.is_correct("36-4=32", EXAMPLE)  # the right number, but never stated as the answer
    for p in arith.train + arith.test:
        assert arith.is_correct(p.solution, p)


# ---------------------------------------------------------------- arithmetic: gold step labels


@pytest.mark.parametrize(
    ("completion", "labels"),
    [
        # The gold solution: every step right.
        (EXAMPLE.solution, [1, 1, 1, 1]),
        # Spaces around tokens are allowed, blank lines are not steps.
        (" 7 + 5 = 12\n\n12 * 3=36\n36 -4 = 32\nAnswer:32\n", [1, 1, 1, 1]),
        # Wrong arithmetic at step 1 (12*3 is 36), carried forward: step 2 starts from 35, not the gold 36,
        # and the final answer is wrong, so all three are 0.
        ("7+5=12\n12*3=35\n35-4=31\nAnswer: 31", [1, 0, 0, 0]),
        # Same slip, but step 2 goes back to the gold value 36: labels measure each step against the gold
        # chain, so step 2 and the Answer line are right again.
        ("7+5=12\n12*3=35\n36-4=32\nAnswer: 32", [1, 0, 1, 1]),
        # Wrong operand: 7+6=13 is true arithmetic but not the problem's operation; the rest follows it.
        ("7+6=13\n13*3=39\n39-4=35\nAnswer: 35", [0, 0, 0, 0]),
        # Wrong operator at step 2 (36+4 instead of 36-4).
        ("7+5=12\n12*3=36\n36+4=40\nAnswer: 40", [1, 1, 0, 0]),
        # Right chain, wrong final answer.
        ("7+5=12\n12*3=36\n36-4=32\nAnswer: 31", [1, 1, 1, 0]),
        # Premature Answer line: at position 2 the operation 36-4 is due, so an Answer line there is wrong,
        # whether it states the running value 36 or even the gold 32.
        ("7+5=12\n12*3=36\nAnswer: 36", [1, 1, 0]),
        ("7+5=12\n12*3=36\nAnswer: 32", [1, 1, 0]),
        # Extra lines after the Answer line are wrong, whatever they say.
        (EXAMPLE.solution + "\nAnswer: 32", [1, 1, 1, 1, 0]),
        (EXAMPLE.solution + "\n32+0=32\nthe end", [1, 1, 1, 1, 0, 0]),
        # Missing Answer line: the operation steps keep their labels, there is simply no Answer step.
        ("7+5=12\n12*3=36\n36-4=32", [1, 1, 1]),
        # Garbage and near-misses do not parse.
        ("hello\n7+5=12 !\n12x3=36\n36-4=32=32", [0, 0, 0, 0]),
        ("", []),
    ],
)
def test_gold_step_labels_hand_made(arith, completion, labels):
    assert arith.gold_step_labels(completion, EXAMPLE) == labels
    assert len(labels) == len(steps.split_steps(completion))  # one label per step of the one convention


def test_gold_solutions_get_all_ones(arith):
    for p in arith.train + arith.test:
        assert arith.gold_step_labels(p.solution, p) == [1] * len(steps.split_steps(p.solution))


def test_one_wrong_result_marks_exactly_that_step(arith):
    # Changing the result of step k (and nothing else) breaks step k only: step k+1 still starts from the
    # gold value, so against the gold chain it is right.
    for p in arith.test:
        lines = p.solution.split("\n")
        for k in range(len(lines) - 1):
            lhs, result = lines[k].split("=")
            broken = "\n".join(lines[:k] + [f"{lhs}={int(result) + 1}"] + lines[k + 1 :])
            expected = [int(i != k) for i in range(len(lines))]
            assert arith.gold_step_labels(broken, p) == expected


# ---------------------------------------------------------------- gsm8k: loading


def test_gsm8k_loads_the_fixture_files(gsm8k):
    assert len(gsm8k.train) == 41 and len(gsm8k.test) == 20  # the lines of the fixture's train/test.jsonl
    first = gsm8k.train[0]
    assert first.id == "gsm8k-train-00000" and gsm8k.test[17].id == "gsm8k-test-00017"
    assert first.prompt.startswith("Solve the problem step by step")
    assert "Question: Natalia sold clips to 48 of her friends" in first.prompt
    assert first.prompt.endswith("\nSolution:\n")
    assert first.answer == "72"
    # The calculator annotations <<48/2=24>> and <<48+24=72>> are gone; the answer closes the solution.
    assert first.solution == (
        "Natalia sold 48/2 = 24 clips in May.\n"
        "Natalia sold 48+24 = 72 clips altogether in April and May.\n"
        "Answer: 72"
    )


def test_gsm8k_answers_are_canonical(gsm8k):
    for p in gsm8k.train + gsm8k.test:
        assert re.fullmatch(r"-?\d+(\.\d+)?", p.answer), p.answer  # commas gone
        assert "<<" not in p.solution and p.solution.endswith(f"\nAnswer: {p.answer}")
    # Some rows end with "#### 10,000" (the fixture's last training row): it is read by value.
    raw = [json.loads(line) for line in (GSM8K_DIR / "train.jsonl").read_text().splitlines()]
    i = next(i for i, r in enumerate(raw) if r["answer"].endswith("#### 10,000"))
    assert gsm8k.train[i].answer == "10000"


def test_gsm8k_num_train_num_test_take_a_prefix(gsm8k):
    small = GSM8K.from_jsonl(GSM8K_DIR / "train.jsonl", GSM8K_DIR / "test.jsonl", num_train=5, num_test=3)
    assert small.train == gsm8k.train[:5] and small.test == gsm8k.test[:3]
    with pytest.raises(ValueError, match="num_test=2000 but .*test.jsonl has only 20 problems"):
        GSM8K.from_jsonl(GSM8K_DIR / "train.jsonl", GSM8K_DIR / "test.jsonl", num_test=2000)


@needs_full_gsm8k
def test_gsm8k_full_files_load_and_the_fixture_is_their_copy(gsm8k):
    full = GSM8K.from_jsonl(FULL_GSM8K_DIR / "train.jsonl", FULL_GSM8K_DIR / "test.jsonl")
    assert len(full.train) == 7473 and len(full.test) == 1319  # the lines of train.jsonl / test.jsonl
    for p in full.train + full.test:
        assert re.fullmatch(r"-?\d+(\.\d+)?", p.answer), p.answer
    # The fixture's rows are the files' own: the first 40 training rows plus the first "10,000" row, the first
    # 20 test rows (ids are positions, so only the text is compared).
    strip = lambda ps: [(p.prompt, p.answer, p.solution) for p in ps]  # noqa: E731
    assert strip(gsm8k.train[:40]) == strip(full.train[:40]) and strip(gsm8k.test) == strip(full.test[:20])
    raw = [json.loads(line) for line in (FULL_GSM8K_DIR / "train.jsonl").read_text().splitlines()]
    i = next(i for i, r in enumerate(raw) if r["answer"].endswith("#### 10,000"))
    assert strip(gsm8k.train[40:]) == strip([full.train[i]])


def test_gsm8k_missing_file(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [row("q", "#### 1")])
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        GSM8K.from_jsonl(train, tmp_path / "nope.jsonl")


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "empty"),
        (["", "  "], "empty"),  # blank lines only
        ([row("a", "#### 1"), "{not json"], "bad.jsonl line 2: invalid JSON"),
        ([json.dumps({"answer": "#### 1"})], "bad.jsonl line 1: missing or empty field 'question'"),
        ([json.dumps({"question": "q"})], "bad.jsonl line 1: missing or empty field 'answer'"),
        ([json.dumps({"question": "q", "answer": 72})], "bad.jsonl line 1: field 'answer' must be text .* got int 72"),
        ([json.dumps(["q", "#### 1"])], "bad.jsonl line 1: expected a JSON object"),
        ([row("a", "1+1=2")], "bad.jsonl line 1: answer has no '#### <number>' line"),
        ([row("a", "#### 1"), row("b", "x\n#### abc")], "bad.jsonl line 2: gold answer 'abc' is not a number"),
        # A blank line still counts in the numbering, so the error points at the right line of the file.
        ([row("a", "#### 1"), "", row("b", "#### 1"), row("a", "#### 2")], "line 4: duplicate.*line 1"),
    ],
)
def test_gsm8k_bad_rows_name_file_and_line(tmp_path, lines, message):
    good = write_jsonl(tmp_path / "test.jsonl", [row("z", "#### 9")])
    bad = write_jsonl(tmp_path / "bad.jsonl", lines)
    with pytest.raises(ValueError, match=message):
        GSM8K.from_jsonl(bad, good)


@pytest.mark.parametrize(
    ("content", "line"),
    [
        # Line 2 holds a Latin-1 "é" (byte 0xe9); line 1 is ASCII, so it reads the same in either encoding.
        ((row("a", "#### 1") + '\n{"question": "café", "answer": "#### 2"}\n').encode("latin-1"), 2),
        ((row("a", "#### 1") + "\n").encode("utf-16"), 1),  # its byte order mark 0xff 0xfe
        (b"PAR1\x15\x04\x15\xdc\xa8\x01\x15\x9ciL\x15R\n\x00\x12", 1),  # a parquet file's first bytes
    ],
    ids=["latin-1", "utf-16", "parquet"],
)
def test_gsm8k_a_file_not_in_utf8_names_file_and_line(tmp_path, content, line):
    good = write_jsonl(tmp_path / "test.jsonl", [row("z", "#### 9")])
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content)
    expected = rf"bad\.jsonl line {line}: not UTF-8 \(byte 0x..\); GSM8K files are read as UTF-8 JSON lines$"
    with pytest.raises(ValueError, match=expected):
        GSM8K.from_jsonl(bad, good)


def test_gsm8k_rejects_a_test_question_in_train(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [row("a", "#### 1"), row("b", "#### 2")])
    test = write_jsonl(tmp_path / "test.jsonl", [row("b", "#### 2")])
    with pytest.raises(ValueError, match="also appear in train"):
        GSM8K.from_jsonl(train, test)


# ---------------------------------------------------------------- gsm8k: answers and verifier

CLIPS = Problem(id="gsm8k-x", prompt="Question: clips\nSolution:\n", answer="72", solution="Answer: 72")


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("48+24 = 72\nAnswer: 72", "72"),
        ("Answer: $1,036.", "1036"),  # dollar sign, commas and a final period are formatting
        ("Answer: 0.50", "0.5"),
        ("Answer: 72.0", "72"),
        ("Answer: 15%", "15"),  # GSM8K states percentages as plain numbers
        # Anything but a plain number goes through math-verify, and equal values give equal strings:
        ("Answer: 72 clips", "72"),
        ("Answer: \\frac{144}{2}", "72"),
        ("Answer: \\frac{1}{2}", "0.5"),  # a terminating fraction becomes a decimal, like "0.50" above
        ("Answer: 1/3", "1/3"),  # a non-terminating one stays a fraction
        ("Answer: \\sqrt{2}", None),  # not a rational number: not a GSM8K answer
        ("Answer: 70\nAnswer: 72", "72"),  # the last Answer line
        ("so 72 clips", None),  # no Answer line: no stated answer (and the verifier says wrong, below)
        ("**Answer:** 72", None),  # the line must start with "Answer:"
        ("Answer: none", None),
    ],
)
def test_gsm8k_extract_answer(gsm8k, completion, expected):
    assert gsm8k.extract_answer(completion) == expected


@pytest.mark.parametrize(
    ("completion", "correct"),
    [
        ("48/2 = 24\n48+24 = 72\nAnswer: 72", True),
        ("Answer: 72.00", True),
        ("Answer: $72", True),
        ("Answer: 72 clips", True),
        ("Answer: 73", False),
        ("Answer: 72\nAnswer: 73", False),  # the final word counts
        # No Answer line: no answer, hence wrong, even when the last number is the gold one (Maj@K could
        # not count its vote: the verifier must not count it either).
        ("48+24 = 72\nso she sold 72 clips", False),
        ("no numbers at all", False),
        ("", False),
        ("Answer: \\frac{144}{2}", True),  # no plain number: math-verify reads it
    ],
)
def test_gsm8k_is_correct(gsm8k, completion, correct):
    assert gsm8k.is_correct(completion, CLIPS) is correct


def test_gsm8k_verifier_is_the_extracted_answer_against_the_gold_one(gsm8k):
    # One extraction for the verifier, Maj@K, best-of-N, collection and the RMs' labels: a completion is
    # correct exactly when its extracted answer is the gold answer's canonical string.
    completions = [p.solution for p in gsm8k.test] + [
        "Answer: 72 clips", "Answer: \\frac{144}{2}", "so 72", "Answer: 71", "", "Answer: 72.000", "Answer: $72",
    ]
    for text in completions:
        for problem in (CLIPS, *gsm8k.test[:3]):
            assert gsm8k.is_correct(text, problem) == (gsm8k.extract_answer(text) == problem.answer), text


def test_gsm8k_pass_at_k_and_maj_at_k_count_the_same_samples():
    from pipeline.evaluate import summarize_samples

    gsm8k = GSM8K([], [])
    # The example: three samples ending "... = 72 clips." with no Answer line, one "Answer: 70" (gold 72).
    # Pass@1 counted the three through a last-number fallback of the verifier (0.75) while Maj@1, voting on the
    # extracted answers, let none of them vote (0). Now neither counts them.
    texts = ["48/2 = 24\n48+24 = 72 clips.", "She sold 48+24 = 72 clips.", "24+48 = 72 clips.", "48+22 = 70\nAnswer: 70"]
    metrics = summarize_samples([([gsm8k.extract_answer(t) for t in texts], [gsm8k.is_correct(t, CLIPS) for t in texts])],
                                [1, 2, 4])
    assert metrics["pass@1"] == 0.0 and metrics["maj@1"] == 0.0
    assert metrics["pass@4"] == 0.0 and metrics["maj@4"] == 0.0
    # Stated on an Answer line, the same three count for both: Maj@1 is Pass@1 (a vote of one sample).
    stated = [t + "\nAnswer: 72" for t in texts[:3]] + texts[3:]
    metrics = summarize_samples([([gsm8k.extract_answer(t) for t in stated], [gsm8k.is_correct(t, CLIPS) for t in stated])],
                                [1, 2, 4])
    assert metrics["pass@1"] == metrics["maj@1"] == 0.75
    assert metrics["maj@4"] == 1.0  # three votes for 72 against one for 70


def test_gsm8k_gold_solutions_verify_and_have_no_step_labels(gsm8k):
    for p in gsm8k.test[:30]:
        assert gsm8k.is_correct(p.solution, p)
        assert gsm8k.gold_step_labels(p.solution, p) is None


def test_gsm8k_is_correct_off_the_main_thread(gsm8k):
    # math-verify's timeout uses SIGALRM, which a worker thread may not set; the verifier must still work.
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(gsm8k.is_correct, "Answer: 72 clips", CLIPS).result() is True  # read by math-verify
        assert pool.submit(gsm8k.is_correct, "Answer: 71 clips", CLIPS).result() is False


# ---------------------------------------------------------------- load_problem_set


def test_load_problem_set_arithmetic():
    ps = load_problem_set("arithmetic", seed=3, num_train=10, num_test=4)
    assert isinstance(ps, EmbeddedArithmetic) and len(ps.train) == 10 and len(ps.test) == 4


def test_load_problem_set_gsm8k_from_files():
    ps = load_problem_set(
        "gsm8k", train_path=GSM8K_DIR / "train.jsonl", test_path=str(GSM8K_DIR / "test.jsonl"), num_test=2
    )
    assert isinstance(ps, GSM8K) and len(ps.test) == 2


def test_config_choices_and_sections_come_from_the_registry():
    from pipeline.config import ConfigError, PipelineConfig, ProblemsConfig
    from pipeline.loading import config_from_dict

    with pytest.raises(ConfigError, match="^problems.kind: unknown problem set kind 'math'; known: arithmetic, gsm8k, "
                                          "dataset$"):
        config_from_dict({"problems": {"kind": "math"}}, check_trl=False)
    for kind, entry in PROBLEM_SETS.items():
        assert ProblemsConfig.model_fields[kind].annotation is entry.config  # YAML `problems.<kind>.*`
    # The config's set is the registry's build of its section, seeded by the run.
    cfg = PipelineConfig.model_validate({"run": {"seed": 4},
                                         "problems": {"arithmetic": {"num_train": 30, "num_test": 5}}})
    built = problem_set_from_config(cfg)
    assert built.train == EmbeddedArithmetic(seed=4, num_train=30, num_test=5).train
    assert built.test == load_problem_set("arithmetic", seed=4, num_train=30, num_test=5).test
    gsm = PipelineConfig.model_validate({"problems": {"kind": "gsm8k", "gsm8k": {
        "train_path": str(GSM8K_DIR / "train.jsonl"), "test_path": str(GSM8K_DIR / "test.jsonl"), "num_test": 3}}})
    assert [p.id for p in problem_set_from_config(gsm).test] == [p.id for p in GSM8K.from_jsonl(
        GSM8K_DIR / "train.jsonl", GSM8K_DIR / "test.jsonl", num_test=3).test]


def test_the_gsm8k_recipe_reads_the_hub_unless_local_files_are_given(monkeypatch):
    from pipeline.loading import load_config
    from pipeline.problems import problem_set_from_config

    # Offline: were the local files ignored, the hub read would fail at once instead of waiting on a network.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    recipe = Path(__file__).resolve().parents[1] / "configs" / "smollm2-gsm8k.yaml"
    cfg = load_config(recipe, check_trl=False)
    assert cfg.problems.gsm8k.hub_name == "openai/gsm8k" and cfg.problems.gsm8k.train_path is None
    local = load_config(recipe, [f"problems.gsm8k.train_path={GSM8K_DIR / 'train.jsonl'}",
                                 f"problems.gsm8k.test_path={GSM8K_DIR / 'test.jsonl'}", "problems.gsm8k.num_test=20"],
                        check_trl=False)
    ps = problem_set_from_config(local)
    assert isinstance(ps, GSM8K) and len(ps.train) == 41 and len(ps.test) == 20


def test_load_problem_set_errors():
    with pytest.raises(ValueError, match="arithmetic.*gsm8k"):  # the known kinds are listed
        load_problem_set("math")
    with pytest.raises(ValueError, match="test_path"):
        load_problem_set("gsm8k", train_path=GSM8K_DIR / "train.jsonl")
    with pytest.raises(ValueError, match="num_tests"):  # a field of no section: pydantic names it
        load_problem_set("arithmetic", num_tests=3)


def test_sft_noise_slips_an_exact_share_of_sft_solutions_and_nothing_else():
    clean = EmbeddedArithmetic(seed=3, num_train=200, num_test=20)
    noisy = EmbeddedArithmetic(seed=3, num_train=200, num_test=20, sft_noise=0.25)
    assert noisy.test == clean.test
    assert [(p.id, p.prompt, p.answer) for p in noisy.train] == [(p.id, p.prompt, p.answer) for p in clean.train]
    slipped = [(c, n) for c, n in zip(clean.train, noisy.train) if c.solution != n.solution]
    assert len(slipped) == 50
    for c, n in slipped:
        # Same steps; the Answer line states the first step's result, so the verifier rejects it.
        assert n.solution.split("\n")[:-1] == c.solution.split("\n")[:-1]
        assert n.solution.split("\n")[-1] == "Answer: " + c.solution.split("\n")[0].split("=")[1]
        assert not noisy.is_correct(n.solution, n)
    assert EmbeddedArithmetic(seed=3, num_train=200, num_test=20, sft_noise=0.25).train == noisy.train
    with pytest.raises(ValueError, match="sft_noise"):
        EmbeddedArithmetic(num_train=2, num_test=1, sft_noise=1.5)



def test_middle_slips_put_one_wrong_step_mid_chain_carried_on_to_a_wrong_answer():
    """sft_noise_at: [answer, middle] shares the noisy solutions between the slips; a middle slip is one wrong step
    (gold labels 1 before it, 0 from it on), later steps computed right from the slipped value, a wrong answer."""
    from pipeline.problems.arithmetic import chain_values, middle_slip, parse_prompt, step_labels

    assert middle_slip("7+5=12\n12*3=36\n36-4=32\nAnswer: 32", [("+", 5), ("*", 3), ("-", 4)]) == (
        "7+5=12\n12*3=37\n37-4=33\nAnswer: 33")
    clean = EmbeddedArithmetic(seed=3, num_train=200, num_test=20, min_steps=5, max_steps=6)
    noisy = EmbeddedArithmetic(seed=3, num_train=200, num_test=20, min_steps=5, max_steps=6, sft_noise=0.2,
                               sft_noise_at=["answer", "middle"])
    assert noisy.test == clean.test
    slipped = [(c, n) for c, n in zip(clean.train, noisy.train) if c.solution != n.solution]
    assert len(slipped) == 40
    middles = [n for c, n in slipped if c.solution.split("\n")[-2] != n.solution.split("\n")[-2]]
    assert len(middles) == 20  # in turn: half of each
    for n in middles:
        start, ops = parse_prompt(n.prompt)
        steps = n.solution.split("\n")
        k = len(ops) // 2
        assert step_labels(steps, start, ops) == [1] * k + [0] * (len(ops) + 1 - k)
        assert int(steps[k].split("=")[1]) == chain_values(start, ops)[k + 1] + 1
        for line in steps[k + 1 : len(ops)]:  # each later step is right arithmetic on the slipped value
            left, result = line.split("=")
            assert eval(left) == int(result)
        assert not noisy.is_correct(n.solution, n)
    # The default is the answer slip alone, as before the option: the same solutions.
    assert EmbeddedArithmetic(seed=3, num_train=200, num_test=20, sft_noise=0.25).train == EmbeddedArithmetic(
        seed=3, num_train=200, num_test=20, sft_noise=0.25, sft_noise_at=["answer"]).train
    with pytest.raises(ValueError, match="sft_noise_at"):
        EmbeddedArithmetic(num_train=2, num_test=1, sft_noise_at=["start"])

def test_round_noise_fresh_problems_are_in_neither_split(tmp_path):
    """experiments/round_noise.py --fresh: a smaller SE from problems no policy of the run has seen (SFT noise on)."""
    from experiments import round_noise
    from pipeline.loading import config_from_dict
    from pipeline.problems import problem_set_from_config
    from tests.helpers import mini_config

    data = mini_config(tmp_path)
    data["problems"]["arithmetic"]["sft_noise"] = 0.3
    cfg = config_from_dict(data)
    ps = problem_set_from_config(cfg)
    fresh = round_noise.fresh_problems(cfg, 30)
    seen = {p.prompt for p in ps.train + ps.test}
    assert len(fresh) == 30 and len({p.prompt for p in fresh}) == 30 and not seen & {p.prompt for p in fresh}
    assert all(ps.is_correct(f"Answer: {p.answer}", p) for p in fresh)
    assert round_noise.fresh_problems(cfg, 0) == []
