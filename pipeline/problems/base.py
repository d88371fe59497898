"""What every problem set gives the pipeline: prompts, gold answers, a verifier and gold step labels; and
what a problem-set module gives the registry (`ProblemSetKind`: its config section and a builder).

The answer convention, shared by all sets: a completion ends with a line ``Answer: <value>``. The stated
answer is the value of the LAST line that starts with ``Answer:`` (so a model that corrects itself is
judged on its final word). Model output is only ever parsed, never passed to ``eval``/``exec``.

Steps are split one way (`pipeline.steps`), which places PRM labels and scores, MC prefixes and process
advantages; a set chooses only its separator (`ProblemSet.step_separator`, data that every phase passes to
`pipeline.steps`), never a splitter of its own, which would disagree with them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from pipeline import steps

ANSWER_PREFIX = "Answer:"


@dataclass(frozen=True)
class Problem:
    """One problem with its gold answer and gold solution.

    Attributes:
        id: Unique within the set, e.g. ``"arith-train-00042"`` or ``"gsm8k-test-00017"``.
        prompt: The full text given to the policy; the completion continues right after it.
        answer: The gold final answer as a canonical string (e.g. ``"32"``).
        solution: The gold solution, one step per line, the last line ``"Answer: <answer>"``.
    """

    id: str
    prompt: str
    answer: str
    solution: str


def answer_line_value(completion: str) -> str | None:
    """The raw text after ``Answer:`` on the last line that starts with it, stripped; None if no such line.

    >>> answer_line_value("1+2=3\\nAnswer: 4\\nAnswer: 3 \\n")
    '3'
    >>> answer_line_value("1+2=3") is None
    True
    """
    value = None
    for line in completion.split("\n"):  # a line, whatever the step separator
        stripped = line.strip()
        if stripped.startswith(ANSWER_PREFIX):
            value = stripped[len(ANSWER_PREFIX) :].strip()
    return value


class ProblemSet(ABC):
    """A train/test pair of problem lists plus the functions that judge completions for them.

    Subclasses set ``name``, ``train`` and ``test`` (disjoint: no prompt in both) and implement
    ``extract_answer``. ``has_gold_step_labels`` says whether ``gold_step_labels`` ever returns labels.
    ``step_separator`` is the regular expression between two steps (`pipeline.steps`), a line by default.
    """

    name: str
    train: list[Problem]
    test: list[Problem]
    has_gold_step_labels: bool = False
    step_separator: str = steps.STEP_SEPARATOR

    @abstractmethod
    def extract_answer(self, completion: str) -> str | None:
        """The final answer the completion states, canonical; None if it states none or it is unparsable."""

    def is_correct(self, completion: str, problem: Problem) -> bool:
        """The verifier: True iff the completion's stated answer equals the gold answer.

        An override must judge exactly what `extract_answer` returns (no fallback of its own): Maj@K votes
        on the extracted answers, so a sample the verifier counts without one would count for Pass@K only.
        """
        return self.extract_answer(completion) == problem.answer

    def equivalent(self, a: str, b: str) -> bool:
        """Whether two extracted answers state the same value (Maj@K and best-of-N vote by it): by default,
        equal strings, as the extraction is canonical. A set whose `is_correct` is ``equivalent(extracted,
        gold)`` keeps the verifier and the votes agreeing on every form of an answer."""
        return a == b

    def gold_step_labels(self, completion: str, problem: Problem) -> list[int] | None:
        """One 0/1 label per step of ``pipeline.steps.split_steps(completion, self.step_separator)``, or None
        when the set cannot know."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, train={len(self.train)}, test={len(self.test)})"


class ProblemSetConfig(BaseModel):
    """Base of a problem set's config section, ``problems.<kind>``: strict, every field documented once."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def check_selected(self) -> None:
        """Raise ValueError (saying the fix) if the section cannot build its set (when ``problems.kind`` picks it)."""


@dataclass(frozen=True)
class ProblemSetKind:
    """A problem set as the registry (`pipeline.problems.PROBLEM_SETS`) knows it.

    Attributes:
        kind: the name ``problems.kind`` selects it by, and its config section's key.
        config: its config section (``problems.<kind>.*`` in YAML and in the README's config reference).
        build: (its config section, the run seed) -> the problem set.
        description: one line for the section.
        problem_set: the class `build` returns, so what it can judge (``has_gold_step_labels``) is known at
            config load, before building the set (GSM8K's reads the hub).
    """

    kind: str
    config: type[ProblemSetConfig]
    build: Callable[[ProblemSetConfig, int], ProblemSet]
    description: str
    problem_set: type[ProblemSet]


def check_source(section: str, train_path: str | None, test_path: str | None, hub_name: str | None) -> None:
    """A problem set read from local train/test files or from the hub: both files or neither, and one source.

    >>> check_source("gsm8k", "train.jsonl", None, "openai/gsm8k")
    Traceback (most recent call last):
    ValueError: gsm8k.train_path and gsm8k.test_path go together (local files, read instead of gsm8k.hub_name)
    """
    if bool(train_path) != bool(test_path):  # half a local override would silently read the hub
        raise ValueError(f"{section}.train_path and {section}.test_path go together (local files, read instead of "
                         f"{section}.hub_name)")
    if not hub_name and not train_path:
        raise ValueError(f"{section} needs {section}.train_path and {section}.test_path, or {section}.hub_name")
