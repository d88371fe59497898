"""GSM8K (Cobbe et al., 2021) from local jsonl files or the Hugging Face hub, answers read with math-verify.

Each row has a ``question`` and an ``answer`` whose rationale ends with ``#### <number>``. The gold
solution keeps the rationale's lines without the calculator annotations ``<<48/2=24>>`` and ends with
``Answer: <number>``, the answer convention of every problem set. Gold step labels are unknown here.

One extraction (`GSM8K.extract_answer`) serves the verifier, Maj@K, best-of-N, collection and the RMs'
labels: a completion is correct iff its extracted answer is the gold answer's canonical string, so a
sample Pass@K counts is always one Maj@K lets vote. A completion without an ``Answer:`` line states no
answer: it is wrong, whatever numbers it holds.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Iterator
from decimal import Decimal, InvalidOperation
from pathlib import Path

from pydantic import Field

from pipeline.problems.base import (
    Problem,
    ProblemSet,
    ProblemSetConfig,
    ProblemSetKind,
    answer_line_value,
    check_source,
)

PROMPT_TEMPLATE = (
    "Solve the problem step by step, one step per line, and end with a line 'Answer: <number>'.\n"
    "Question: {question}\n"
    "Solution:\n"
)

_CALCULATOR_RE = re.compile(r"<<[^>]*>>")
# A sign counts only when it does not follow a word or digit: in "10-4" the "4" is not negative.
_NUMBER_RE = re.compile(r"(?:(?<![\w.])[+-])?(?:\d[\d,]*(?:\.\d+)?|\.\d+)")
# Model text handed to math-verify is capped: its parser's run time grows with the input, and off the
# main thread it runs without its signal-based timeout.
_MAX_VERIFY_CHARS = 200


def canonical_number(text: str) -> str | None:
    """The canonical string of the number ``text`` (commas, ``$``, a final ``.`` or ``%`` allowed); else None.

    GSM8K states percentages as plain numbers, hence ``%`` is dropped. Integral values lose their
    decimals, so ``"5.00"`` and ``"5"`` agree.

    >>> canonical_number("1,000"), canonical_number("$5.50."), canonical_number("-0"), canonical_number("abc")
    ('1000', '5.5', '0', None)
    """
    cleaned = text.strip().removeprefix("$").removesuffix(".").removesuffix("%").replace(",", "").strip()
    if _NUMBER_RE.fullmatch(cleaned) is None:
        return None
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def solution_lines(rationale: str) -> list[str]:
    """The rationale's non-blank lines with calculator annotations removed.

    >>> solution_lines("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\\n")
    ['Natalia sold 48/2 = 24 clips in May.']
    """
    lines = (_CALCULATOR_RE.sub("", line).strip() for line in rationale.split("\n"))
    return [line for line in lines if line]


def problem_from_row(row: object, where: str, problem_id: str) -> Problem:
    """A Problem from one GSM8K row; ValueError starting with ``where`` (file and line) if it is malformed."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for field in ("question", "answer"):
        value = row.get(field)
        if value is not None and not isinstance(value, str):  # e.g. "answer": 72, not the rationale's text
            raise ValueError(f"{where}: field {field!r} must be text (GSM8K's answer is the worked solution "
                             f"ending in '#### <number>'), got {type(value).__name__} {value!r}")
        if not value or not value.strip():
            raise ValueError(f"{where}: missing or empty field {field!r}")
    rationale, sep, gold = row["answer"].rpartition("####")
    if not sep:
        raise ValueError(f"{where}: answer has no '#### <number>' line")
    answer = canonical_number(gold)
    if answer is None:
        raise ValueError(f"{where}: gold answer {gold.strip()!r} is not a number")
    question = row["question"].strip()
    return Problem(
        id=problem_id,
        prompt=PROMPT_TEMPLATE.format(question=question),
        answer=answer,
        solution="\n".join(solution_lines(rationale) + [f"Answer: {answer}"]),
    )


def problems_from_rows(rows: Iterable[tuple[str, object]], split: str, source: str) -> list[Problem]:
    """Problems from ``(where, row)`` pairs, rejecting an empty source and repeated questions."""
    problems: list[Problem] = []
    first_seen: dict[str, str] = {}
    for where, row in rows:
        problem = problem_from_row(row, where, f"gsm8k-{split}-{len(problems):05d}")
        if problem.prompt in first_seen:
            raise ValueError(f"{where}: duplicate question, first seen at {first_seen[problem.prompt]}")
        first_seen[problem.prompt] = where
        problems.append(problem)
    if not problems:
        raise ValueError(f"{source} is empty: no GSM8K rows")
    return problems


def read_jsonl_rows(path: Path) -> Iterator[tuple[str, object]]:
    """``("<path> line <n>", row)`` for each non-blank line (1-based n); ValueError on invalid JSON or UTF-8."""
    if not path.is_file():
        raise FileNotFoundError(f"GSM8K file not found: {path}")
    # Bytes, decoded line by line, so that a Latin-1, UTF-16 or parquet file is an error naming its line
    # (a text file's decoder reads ahead in blocks and knows no line).
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            where = f"{path} line {number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{where}: not UTF-8 (byte {raw[e.start]:#04x}); "
                                 f"GSM8K files are read as UTF-8 JSON lines") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: invalid JSON ({e.msg})") from None
            yield where, row


def _take(problems: list[Problem], count: int | None, name: str, source: str) -> list[Problem]:
    """The first ``count`` problems (all when None)."""
    if count is None:
        return problems
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"{name} must be None or an integer >= 0, got {count!r}")
    if count > len(problems):
        raise ValueError(f"{name}={count} but {source} has only {len(problems)} problems")
    return problems[:count]


def _check_disjoint(train: list[Problem], test: list[Problem]) -> None:
    overlap = {p.prompt for p in train} & {p.prompt for p in test}
    if overlap:
        ids = [p.id for p in test if p.prompt in overlap][:5]
        raise ValueError(f"{len(overlap)} test question(s) also appear in train, e.g. {ids}")


class GSM8K(ProblemSet):
    """Grade-school math word problems; answers are numbers, read with math-verify where they are not plain.

    Build with `GSM8K.from_jsonl` or `GSM8K.from_hub`. Problems keep file order, so ``num_train`` /
    ``num_test`` take a prefix of each file.
    """

    name = "gsm8k"
    has_gold_step_labels = False

    def __init__(self, train: list[Problem], test: list[Problem]) -> None:
        _check_disjoint(train, test)
        self.train = train
        self.test = test

    @classmethod
    def from_jsonl(
        cls,
        train_path: str | Path,
        test_path: str | Path,
        num_train: int | None = None,
        num_test: int | None = None,
    ) -> GSM8K:
        """Read the ``train.jsonl`` / ``test.jsonl`` format of openai/grade-school-math.

        Every row of both files is validated before anything is returned.

        Raises:
            FileNotFoundError: a file does not exist.
            ValueError: naming the file and 1-based line, for invalid JSON, a missing field, a gold answer
                that is not a number or a repeated question; also for an empty file.
        """
        splits = {}
        for split, path, count in (("train", train_path, num_train), ("test", test_path, num_test)):
            path = Path(path)
            problems = problems_from_rows(read_jsonl_rows(path), split, str(path))
            splits[split] = _take(problems, count, f"num_{split}", str(path))
        return cls(splits["train"], splits["test"])

    @classmethod
    def from_hub(
        cls,
        name: str = "openai/gsm8k",
        config: str = "main",
        num_train: int | None = None,
        num_test: int | None = None,
    ) -> GSM8K:
        """Load GSM8K with `datasets.load_dataset(name, config)` (its "train" and "test" splits).

        Raises:
            FileNotFoundError: the hub cannot give the dataset (offline, no network, no such name), saying
                how to read local files instead.
        """
        from datasets import load_dataset  # heavy import, only on this path

        try:
            dataset = load_dataset(name, config)
        except Exception as e:  # offline, unreachable, unknown name: one error with the way out, not a traceback
            raise FileNotFoundError(
                f"problems.gsm8k.hub_name {name!r}: cannot load it from the hub ({type(e).__name__}: {e}); read "
                "local jsonl files instead: --set problems.gsm8k.train_path=DIR/train.jsonl "
                "--set problems.gsm8k.test_path=DIR/test.jsonl"
            ) from None
        splits = {}
        for split, count in (("train", num_train), ("test", num_test)):
            source = f"{name}[{split}]"
            rows = ((f"{source} row {i + 1}", row) for i, row in enumerate(dataset[split]))
            splits[split] = _take(problems_from_rows(rows, split, source), count, f"num_{split}", source)
        return cls(splits["train"], splits["test"])

    def extract_answer(self, completion: str) -> str | None:
        """The number on the last ``Answer:`` line, canonical, or None (no such line, or no number on it).

        A plain number (``$1,036.``, ``0.50``, ``15%``) is read directly; anything else (``72 clips``,
        ``\\frac{144}{2}``, ``\\boxed{72}``) is parsed by math-verify and kept if it is a rational number, so
        answers that agree in value agree as strings (what majority voting counts, and what the verifier
        compares with the gold answer: `ProblemSet.is_correct`).

        >>> GSM8K([], []).extract_answer("12*3 = 36\\nAnswer: $1,036.")
        '1036'
        """
        value = answer_line_value(completion)
        if value is None:
            return None
        return canonical_number(value) or _rational_via_math_verify(value[:_MAX_VERIFY_CHARS])


class GSM8KConfig(ProblemSetConfig):
    train_path: str | None = Field(None, description="Local jsonl of training problems (GSM8K's format); with test_path, read instead of hub_name.")
    test_path: str | None = Field(None, description="Local jsonl of held-out problems.")
    hub_name: str | None = Field(None, description="Hub dataset name (e.g. openai/gsm8k), used when no local files are given.")
    num_train: int | None = Field(None, ge=1, description="Use only the first N training problems.")
    num_test: int | None = Field(None, ge=1, description="Use only the first N held-out problems.")

    def check_selected(self) -> None:
        check_source("gsm8k", self.train_path, self.test_path, self.hub_name)


def _from_config(section: GSM8KConfig, seed: int) -> GSM8K:
    # Local files override the hub (a recipe names the hub, `--set` points at a copy); the seed draws nothing.
    if section.train_path:
        return GSM8K.from_jsonl(section.train_path, section.test_path, section.num_train, section.num_test)
    return GSM8K.from_hub(name=section.hub_name, num_train=section.num_train, num_test=section.num_test)


PROBLEM_SET = ProblemSetKind("gsm8k", GSM8KConfig, _from_config, "GSM8K from local jsonl or the hub.", GSM8K)


def _timeout() -> int | None:
    # math-verify's timeouts use SIGALRM, which only the main thread may set (flows may run us in a worker).
    return 5 if threading.current_thread() is threading.main_thread() else None


def _rational_via_math_verify(text: str) -> str | None:
    """The canonical string of the rational number math-verify reads in ``text``; None if none.

    Terminating fractions become decimals (``\\frac{1}{2}`` -> ``"0.5"``), others stay ``"p/q"``.
    """
    import sympy  # math-verify's dependency; imported here like math-verify itself
    from math_verify import parse

    try:
        parsed = parse(text, parsing_timeout=_timeout())
        expr = parsed[0].doit() if parsed and isinstance(parsed[0], sympy.Basic) else None
    except Exception:  # a parser failure on model text means "no answer", not a crash
        return None
    if expr is None or not expr.is_number:
        return None
    if expr.is_Float:
        return canonical_number(format(Decimal(str(expr)), "f"))
    if not expr.is_Rational:
        return None  # irrational or not a plain number: not a GSM8K answer
    p, q = int(expr.p), int(expr.q)
    if set(sympy.primefactors(q)) <= {2, 5}:  # terminating decimal
        return canonical_number(format(Decimal(p) / Decimal(q), "f"))
    return f"{p}/{q}"
