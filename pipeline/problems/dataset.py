"""Any question/answer data set as a problem set (`problems.kind: dataset`): a hub id, or local jsonl, parquet
or csv files, read with `datasets`.

The section maps the data's columns (a prompt, or a list of chat messages; a gold answer, or a solution the
answer is read from), says how answers are written (`number`, or `latex` judged by math-verify) and where a
step ends (`step_separator`), and may name a column of per-step gold labels. `preset: gsm8k` fills the
fields GSM8K needs (its ``#### n`` solutions), giving the same problems as `problems.kind: gsm8k`.

One extraction (`DatasetProblems.extract_answer`) and one equivalence (`DatasetProblems.equivalent`) serve
every phase: the verifier is ``equivalent(extracted, gold)``, and Maj@K and best-of-N group answers by the
same equivalence (`pipeline.evaluate.merge_equivalent`), so ``\\frac12``, ``0.5`` and ``1/2`` are one vote
and all right or all wrong. An answer math-verify cannot parse is no answer: wrong, and no vote.

Every row is checked before any work: a missing column (named, beside the columns there are), a row without
a prompt or an answer (named by its 0-based index), an unreadable file, a bad regular expression (at load).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

import pipeline.problems.gsm8k as gsm8k  # the module itself: importing the package would be a cycle
from pipeline import steps
from pipeline.problems.base import (
    ANSWER_PREFIX,
    Problem,
    ProblemSet,
    ProblemSetConfig,
    ProblemSetKind,
    answer_line_value,
    check_source,
)
from pipeline.registry import Registry, name_in

_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}  # `datasets` packaged builders
# Model text handed to math-verify is capped: its parser's run time grows with the input (gsm8k.py's reason).
_MAX_VERIFY_CHARS = 500

PRESETS: dict[str, dict[str, Any]] = {
    # GSM8K: the question, and a rationale ending in "#### <number>" whose calculator annotations are dropped.
    "gsm8k": dict(name="gsm8k", hub_name="openai/gsm8k", hub_config="main", prompt_column="question",
                  solution_column="answer", gold_regex=r"####([^\n]*)", answer_format="number",
                  solution_strip=r"<<[^>]*>>", prompt_template=gsm8k.PROMPT_TEMPLATE.replace("{question}", "{prompt}")),
}


def boxed_content(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in `text` (braces balanced), or None.

    >>> boxed_content("so \\\\boxed{\\\\frac{1}{2}} and \\\\boxed{x^{2}}.")
    'x^{2}'
    >>> boxed_content("\\\\boxed{1") is None
    True
    """
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j].strip()
    return None  # unclosed: the completion was cut


def last_match(pattern: str, text: str) -> str | None:
    """Group 1 (or the whole match, without groups) of the last match of `pattern` in `text`, stripped.

    >>> last_match("is ([0-9]+)", "it is 3, no, it is 4")
    '4'
    """
    found = list(re.finditer(pattern, text))
    if not found:
        return None
    m = found[-1]
    return (m.group(1) if m.re.groups else m.group(0)).strip()


def _timeout() -> int | None:
    return gsm8k._timeout()  # math-verify's timeouts use SIGALRM: only on the main thread


@functools.lru_cache(maxsize=4096)
def parse_latex(text: str) -> tuple:
    """math-verify's parse of a LaTeX answer (LaTeX, then plain expressions); () when it reads nothing.

    Cached: Maj@K compares each answer with several others.
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    try:
        return tuple(parse(f"${text}$", [LatexExtractionConfig(), ExprExtractionConfig()],
                           parsing_timeout=_timeout()))
    except Exception:  # a parser failure on model text means "no answer", not a crash
        return ()


def canonical_latex(text: str) -> str | None:
    """math-verify's normalised LaTeX of an answer, so that most spellings of one value are one string; None
    when it parses to nothing.

    >>> canonical_latex("\\\\frac12"), canonical_latex("0.5"), canonical_latex("")
    ('\\\\frac{1}{2}', '\\\\frac{1}{2}', None)
    """
    parsed = parse_latex(text[:_MAX_VERIFY_CHARS])
    strings = [p for p in parsed if isinstance(p, str) and p.strip()]
    return strings[-1] if len(parsed) > len(strings) and strings else None  # needs a math reading, not text only


def latex_equivalent(a: str, b: str) -> bool:
    """math-verify's equivalence of two LaTeX answers (numbers, fractions, radicals, intervals, expressions).

    >>> latex_equivalent("\\\\frac{1}{2}", "1/2"), latex_equivalent("(0,1]", "(0,1)")
    (True, False)
    """
    from math_verify import verify

    try:
        return a == b or bool(verify(list(parse_latex(a)), list(parse_latex(b)), timeout_seconds=_timeout()))
    except Exception:  # an unparsable pair is two different answers
        return False


def canonical_number(text: str) -> str | None:
    """A number's canonical string (`gsm8k.canonical_number`, else a rational math-verify reads), or None."""
    return gsm8k.canonical_number(text) or gsm8k._rational_via_math_verify(text[:_MAX_VERIFY_CHARS])


def _number_solution(body: str, answer: str, stated: str | None, labels: list[int] | None):
    # The number format's convention: the last line states the answer (what extract_answer reads).
    lines = [line.strip() for line in body.split("\n") if line.strip() and not line.strip().startswith(ANSWER_PREFIX)]
    labels = None if labels is None else labels + [1]  # the added line states the gold answer
    return "\n".join(lines + [f"{ANSWER_PREFIX} {answer}"]), labels


def _latex_solution(body: str, answer: str, stated: str | None, labels: list[int] | None):
    return (body if body.strip() else f"\\boxed{{{stated}}}"), labels  # an answer alone: boxed as the target


@dataclass(frozen=True, kw_only=True)
class AnswerFormat:
    """How a text states its answer and how two answers compare (`ANSWER_FORMATS.register(NAME, description=...,
    ...)`), the choices of the dataset section's `answer_format`.

    Attributes:
        description: the format, for the docs.
        stated: (a text) -> the raw answer its own statement gives (no `answer_regex`), or None.
        canonical: (a raw answer) -> its canonical string, or None when it does not parse.
        equivalent: (two canonical answers) -> whether they are one answer.
        marker: what states the answer, for messages (`\\boxed{}`).
        last_lines: the statement is looked for in a completion's last `answer_lines` lines only (else anywhere,
            unless `answer_regex` is given).
        solution: (a solution's body, its canonical gold answer, the gold as stated, its step labels or None) ->
            (the SFT target, its step labels): the solution rewritten to state the answer the format's way.
    """

    description: str
    stated: Callable[[str], str | None]
    canonical: Callable[[str], str | None]
    equivalent: Callable[[str, str], bool]
    marker: str
    last_lines: bool = True
    solution: Callable[[str, str, str | None, list[int] | None], tuple[str, list[int] | None]]


ANSWER_FORMATS: Registry[AnswerFormat] = Registry("answer format", AnswerFormat, {
    "number": AnswerFormat(description="a completion's Answer: line, compared as numbers", stated=answer_line_value,
                           canonical=canonical_number, equivalent=lambda a, b: a == b, marker="Answer: line",
                           last_lines=False, solution=_number_solution),
    "latex": AnswerFormat(description="a completion's last \\boxed{}, compared by math-verify",
                          stated=boxed_content, canonical=canonical_latex, equivalent=latex_equivalent,
                          marker="\\boxed{}", solution=_latex_solution),
})


def stated_answer(completion: str, answer_format: str, answer_regex: str | None, answer_lines: int | None) -> str | None:
    """The raw answer a text states: the regex's last match, else the format's own statement (the last
    ``\\boxed{}``, latex, or ``Answer:`` line, number); in the text's last `answer_lines` lines (None: all of them).
    Not yet canonical."""
    if answer_lines is not None:
        completion = "\n".join(completion.rstrip().split("\n")[-answer_lines:])
    if answer_regex is not None:
        return last_match(answer_regex, completion)
    return ANSWER_FORMATS[answer_format].stated(completion)


def canonical_answer(text: str | None, answer_format: str) -> str | None:
    if text is None:
        return None
    return ANSWER_FORMATS[answer_format].canonical(text)


class DatasetProblems(ProblemSet):
    """Problems read from a data set, judged in its answer format (module docstring).

    Args:
        train, test: the problems (disjoint).
        name: the set's name (problem ids start with it).
        answer_format: ``number`` or ``latex``.
        answer_regex: where a completion states its answer (group 1 of the last match); None: the format's own.
        answer_lines: how many last lines of a completion hold its answer (latex and regex only).
        step_separator: the regular expression between two steps (`pipeline.steps`).
        step_labels: problem id -> the gold 0/1 label of each step of its solution, where the data has them.
    """

    has_gold_step_labels = False  # what the config knows at load: labels cover the data's own solutions only

    def __init__(self, train: list[Problem], test: list[Problem], *, name: str = "dataset",
                 answer_format: str = "latex", answer_regex: str | None = None, answer_lines: int = 3,
                 step_separator: str = steps.STEP_SEPARATOR, step_labels: dict[str, list[int]] | None = None):
        gsm8k._check_disjoint(train, test)
        self.train, self.test, self.name = train, test, name
        self.answer_format, self.answer_regex, self.answer_lines = answer_format, answer_regex, answer_lines
        self.step_separator = step_separator
        self.step_labels = dict(step_labels or {})
        self.has_gold_step_labels = bool(self.step_labels)
        solutions = {p.id: p.solution for p in train + test}
        self._labelled_steps = {i: steps.split_steps(solutions[i], step_separator) for i in self.step_labels}

    def extract_answer(self, completion: str) -> str | None:
        """The answer the completion states, canonical (math-verify's LaTeX, or a number's string); None when
        it states none or it does not parse."""
        own = self.answer_regex is None and not ANSWER_FORMATS[self.answer_format].last_lines
        lines = None if own else self.answer_lines
        raw = stated_answer(completion, self.answer_format, self.answer_regex, lines)
        return canonical_answer(raw, self.answer_format)

    def equivalent(self, a: str, b: str) -> bool:
        return ANSWER_FORMATS[self.answer_format].equivalent(a, b)

    def is_correct(self, completion: str, problem: Problem) -> bool:
        answer = self.extract_answer(completion)
        return answer is not None and self.equivalent(answer, problem.answer)

    def gold_step_labels(self, completion: str, problem: Problem) -> list[int] | None:
        """The data's labels, for a completion whose steps are its labelled solution's; None otherwise."""
        labels = self.step_labels.get(problem.id)
        if labels is None or steps.split_steps(completion, self.step_separator) != self._labelled_steps[problem.id]:
            return None
        return list(labels)


def _check_regex(value: str | None, field: str) -> str | None:
    if value is not None:
        try:
            re.compile(value)
        except re.error as e:
            raise ValueError(f"{field}: {value!r} is not a regular expression: {e}") from None
    return value


class DatasetConfig(ProblemSetConfig):
    preset: Literal["gsm8k"] | None = Field(None, description=(
        "Fill the fields not given with a known data set's: gsm8k (question, answer ending '#### n', number "
        "format, its prompt, the hub id openai/gsm8k)."))
    name: str = Field("dataset", description="The set's name; problem ids are NAME-train-00000, ...")
    train_path: str | None = Field(None, description="Local training file (.jsonl, .json, .parquet or .csv); with test_path, read instead of hub_name.")
    test_path: str | None = Field(None, description="Local held-out file, same formats.")
    hub_name: str | None = Field(None, description="Hub data set id, read when no local files are given.")
    hub_config: str | None = Field(None, description="The hub data set's configuration (GSM8K's 'main').")
    train_split: str = Field("train", description="The hub split of training problems.")
    test_split: str = Field("test", description="The hub split of held-out problems.")
    num_train: int | None = Field(None, ge=1, description="Use only the first N training problems.")
    num_test: int | None = Field(None, ge=1, description="Use only the first N held-out problems.")
    prompt_column: str | None = Field("problem", description="The column of problem texts (or set messages_column).")
    messages_column: str | None = Field(None, description=(
        "A column of chat messages ([{role, content}, ...]) instead of prompt_column: the last user message is "
        "the problem (a system message goes in problems.system_prompt)."))
    prompt_template: str = Field("{prompt}\n", description="The policy's prompt, {prompt} replaced by the problem text.")
    answer_column: str | None = Field(None, description="The column of gold answers; None: read them from solution_column.")
    solution_column: str | None = Field("solution", description="The column of worked solutions (the SFT targets).")
    gold_regex: str | None = Field(None, description=(
        "Where a solution states its gold answer: group 1 of the regex's last match. None: the last \\boxed{} "
        "(latex) or Answer: line (number)."))
    solution_strip: str | None = Field(None, description="A regex removed from solutions (GSM8K's <<48/2=24>> annotations).")
    answer_format: name_in(ANSWER_FORMATS) = Field("latex", description=(
        "Answer format (pipeline.problems.dataset ANSWER_FORMATS): number: a completion's Answer: line, compared as numbers; "
        "latex: its last \\boxed{}, compared by "
        "math-verify (fractions, radicals, intervals, expressions); a number-format solution is rewritten to end "
        "in 'Answer: <answer>', a latex one is kept."))
    answer_regex: str | None = Field(None, description=(
        "Where a completion states its answer instead of the format's own: group 1 of the last match in its last "
        "answer_lines lines."))
    answer_lines: int = Field(3, ge=1, description="How many last lines of a completion hold its \\boxed{} or answer_regex match.")
    step_separator: str = Field("\n", description=(
        "The regex between two steps, for MC labels, PRM step ends and process advantages: '\\n' a line, "
        "'\\n\\n' a paragraph."))
    step_labels_column: str | None = Field(None, description=(
        "A column of 0/1 gold labels, one per step of the row's solution (the steps step_separator gives)."))

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        # A preset gives defaults, never overrides: the user's fields win.
        if isinstance(data, dict) and data.get("preset") in PRESETS:
            return {**PRESETS[data["preset"]], **data}
        return data

    @field_validator("gold_regex", "answer_regex", "solution_strip")
    @classmethod
    def _regex(cls, v: str | None, info) -> str | None:
        return _check_regex(v, f"dataset.{info.field_name}")

    @field_validator("step_separator")
    @classmethod
    def _separator(cls, v: str) -> str:
        try:
            steps.separator_pattern(v)
        except ValueError as e:
            raise ValueError(f"dataset.step_separator: {e}") from None
        return v

    def check_selected(self) -> None:
        check_source("dataset", self.train_path, self.test_path, self.hub_name)
        if (self.prompt_column is None) == (self.messages_column is None):
            raise ValueError("dataset: give one of dataset.prompt_column and dataset.messages_column")
        if self.answer_column is None and self.solution_column is None:
            raise ValueError("dataset: give dataset.answer_column, dataset.solution_column, or both")


# --- reading rows ---------------------------------------------------------------------------------------


def read_split(path: str | Path, split: str) -> Any:
    """One local file as a `datasets.Dataset`; FileNotFoundError or ValueError naming it when it cannot be read."""
    path = Path(path)
    builder = _BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise ValueError(f"{path}: unknown file type {path.suffix!r}; known: {', '.join(_BUILDERS)}")
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    from datasets import load_dataset  # heavy import, only on this path

    try:
        return load_dataset(builder, data_files={split: str(path)}, split=split)
    except Exception as e:  # a malformed file: one error naming it, not the builder's traceback
        raise ValueError(f"{path}: cannot read it as {builder} ({type(e).__name__}: {str(e)[:300]})") from None


def read_hub(section: DatasetConfig) -> dict[str, Any]:
    """The train and test splits of `hub_name`; FileNotFoundError with the way out when the hub cannot give them."""
    from datasets import load_dataset

    try:
        data = load_dataset(section.hub_name, section.hub_config)
        return {"train": data[section.train_split], "test": data[section.test_split]}
    except Exception as e:  # offline, unreachable, unknown name or split
        raise FileNotFoundError(
            f"problems.dataset.hub_name {section.hub_name!r}: cannot load it ({type(e).__name__}: {str(e)[:300]}); "
            "read local files instead: --set problems.dataset.train_path=FILE --set problems.dataset.test_path=FILE"
        ) from None


def _check_columns(data: Any, section: DatasetConfig, source: str) -> None:
    wanted = {f: getattr(section, f) for f in ("prompt_column", "messages_column", "answer_column",
                                                  "solution_column", "step_labels_column")}
    for field, column in wanted.items():
        if column is not None and column not in data.column_names:
            raise ValueError(f"{source}: no column {column!r} (problems.dataset.{field}); its columns: "
                             f"{', '.join(data.column_names)}")


def _text(value: Any, where: str, column: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
        raise ValueError(f"{where}: column {column!r} is empty or not text: {value!r}")
    return str(value)


def _prompt(row: dict, section: DatasetConfig, where: str) -> str:
    if section.prompt_column is not None:
        return _text(row[section.prompt_column], where, section.prompt_column).strip()
    messages = row[section.messages_column]
    users = [m.get("content") for m in messages or [] if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        raise ValueError(f"{where}: column {section.messages_column!r} holds no user message")
    return _text(users[-1], where, section.messages_column).strip()


@dataclass(frozen=True)
class _Solution:
    answer: str
    text: str
    labels: list[int] | None


def _gold(solution: str, section: DatasetConfig) -> tuple[str | None, str]:
    """(the gold answer a solution states, raw; the solution without the `gold_regex` match and what follows)."""
    if section.gold_regex is None:
        return stated_answer(solution, section.answer_format, None, None), solution
    found = list(re.finditer(section.gold_regex, solution))
    if not found:
        return None, solution
    m = found[-1]
    return (m.group(1) if m.re.groups else m.group(0)).strip(), solution[: m.start()]


def _solution(row: dict, section: DatasetConfig, where: str) -> _Solution:
    """The gold answer (canonical), the solution the policy is SFT'd on, and its step labels, from one row."""
    body = ""  # an answer column without solutions: the answer alone is the target
    if section.solution_column is not None:
        body = _text(row[section.solution_column], where, section.solution_column)
        body = re.sub(section.solution_strip, "", body) if section.solution_strip else body
    if section.answer_column is not None:
        value = row[section.answer_column]
        stated = None if value is None or isinstance(value, bool) else str(value)
    else:
        stated, body = _gold(body, section)
    answer = canonical_answer(stated, section.answer_format)
    if answer is None:
        marker = ANSWER_FORMATS[section.answer_format].marker
        source = section.answer_column or section.gold_regex or f"{section.solution_column}'s last {marker}"
        raise ValueError(f"{where}: no {section.answer_format} answer in {source!r} (read {stated!r})")
    labels = None
    if section.step_labels_column is not None:
        labels = _labels(row[section.step_labels_column], where, section.step_labels_column)
    body, labels = ANSWER_FORMATS[section.answer_format].solution(body, answer, stated, labels)
    return _Solution(answer, body, labels)


def _labels(value: Any, where: str, column: str) -> list[int]:
    if not isinstance(value, (list, tuple)) or any(v not in (0, 1) or isinstance(v, float) and v % 1 for v in value):
        raise ValueError(f"{where}: column {column!r} must be a list of 0/1 step labels, got {value!r}")
    return [int(v) for v in value]


def problems_from_data(data: Any, section: DatasetConfig, split: str, source: str) -> tuple[list[Problem], dict]:
    """Problems and step labels from one split's rows, every row checked (errors name the row's 0-based index)."""
    _check_columns(data, section, source)
    problems, labels, seen = [], {}, {}
    for i, row in enumerate(data):
        where = f"{source} row {i}"
        prompt = section.prompt_template.replace("{prompt}", _prompt(row, section, where))
        if prompt in seen:
            raise ValueError(f"{where}: duplicate problem, first seen at row {seen[prompt]}")
        seen[prompt] = i
        sol = _solution(row, section, where)
        problem = Problem(f"{section.name}-{split}-{len(problems):05d}", prompt, sol.answer, sol.text)
        if sol.labels is not None:
            found = len(steps.split_steps(sol.text, section.step_separator))
            if found != len(sol.labels):
                raise ValueError(f"{where}: {len(sol.labels)} step labels in {section.step_labels_column!r} but "
                                 f"{found} steps in its solution (split by {section.step_separator!r})")
            labels[problem.id] = sol.labels
        problems.append(problem)
    if not problems:
        raise ValueError(f"{source} is empty: no rows")
    return problems, labels


def _from_config(section: DatasetConfig, seed: int) -> DatasetProblems:
    # Local files override the hub (a recipe names the hub, `--set` points at a copy); the seed draws nothing.
    if section.train_path:
        splits = {s: (read_split(p, s), str(p)) for s, p in (("train", section.train_path), ("test", section.test_path))}
    else:
        splits = {s: (d, f"{section.hub_name}[{s}]") for s, d in read_hub(section).items()}
    out, labels = {}, {}
    for split, count in (("train", section.num_train), ("test", section.num_test)):
        data, source = splits[split]
        problems, found = problems_from_data(data, section, split, source)
        out[split] = gsm8k._take(problems, count, f"problems.dataset.num_{split}", source)
        labels |= {p.id: found[p.id] for p in out[split] if p.id in found}
    return DatasetProblems(out["train"], out["test"], name=section.name, answer_format=section.answer_format,
                           answer_regex=section.answer_regex, answer_lines=section.answer_lines,
                           step_separator=section.step_separator, step_labels=labels)


PROBLEM_SET = ProblemSetKind("dataset", DatasetConfig, _from_config,
                             "Any data set: hub id or local jsonl/parquet/csv, mapped columns, number or LaTeX answers.",
                             DatasetProblems)
