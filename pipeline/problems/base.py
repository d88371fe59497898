"""What every problem set gives the pipeline: prompts, gold answers, a verifier, steps and gold step labels.

The answer convention, shared by all sets: a completion ends with a line ``Answer: <value>``. The stated
answer is the value of the LAST line that starts with ``Answer:`` (so a model that corrects itself is
judged on its final word). Model output is only ever parsed, never passed to ``eval``/``exec``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

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
    for line in completion.split(steps.STEP_SEPARATOR):
        stripped = line.strip()
        if stripped.startswith(ANSWER_PREFIX):
            value = stripped[len(ANSWER_PREFIX) :].strip()
    return value


class ProblemSet(ABC):
    """A train/test pair of problem lists plus the functions that judge completions for them.

    Subclasses set ``name``, ``train`` and ``test`` (disjoint: no prompt in both) and implement
    ``extract_answer``. ``has_gold_step_labels`` says whether ``gold_step_labels`` ever returns labels.
    """

    name: str
    train: list[Problem]
    test: list[Problem]
    has_gold_step_labels: bool = False

    @abstractmethod
    def extract_answer(self, completion: str) -> str | None:
        """The final answer the completion states, canonical; None if it states none or it is unparsable."""

    def is_correct(self, completion: str, problem: Problem) -> bool:
        """The verifier: True iff the completion's stated answer equals the gold answer.

        An override must judge exactly what `extract_answer` returns (no fallback of its own): Maj@K votes
        on the extracted answers, so a sample the verifier counts without one would count for Pass@K only.
        """
        return self.extract_answer(completion) == problem.answer

    def split_steps(self, completion: str) -> list[str]:
        """The steps of a completion (non-blank lines), by the shared convention of ``pipeline.steps``."""
        return steps.split_steps(completion)

    def gold_step_labels(self, completion: str, problem: Problem) -> list[int] | None:
        """One 0/1 label per step of ``split_steps(completion)``, or None when the set cannot know them."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, train={len(self.train)}, test={len(self.test)})"
