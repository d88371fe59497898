"""The embedded synthetic problem set: short chains of integer operations, with gold step labels.

A problem is a start value and a chain of operations applied left to right; the prompt is
``"7 +5 *3 -4\\n"`` and the gold solution writes one operation per line::

    7+5=12
    12*3=36
    36-4=32
    Answer: 32

The strings use digits and a few symbols only, so a character-level tiny model can learn the format, and
every step can be checked exactly, which gives gold process labels to measure PRMs and MC labels against.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Sequence
from typing import Literal

from pydantic import Field, model_validator

from pipeline.problems.base import Problem, ProblemSet, ProblemSetConfig, ProblemSetKind, answer_line_value
from pipeline.steps import split_steps

Operation = tuple[str, int]  # (operator, right operand)

SUPPORTED_OPERATORS = ("+", "-", "*")

_INT = r"[+-]?\d+"
# "<int><op><int>=<int>", spaces allowed around every token.
_STEP_RE = re.compile(rf"\s*({_INT})\s*([+\-*])\s*({_INT})\s*=\s*({_INT})\s*")
_PROMPT_OP_RE = re.compile(r"([+\-*])(\d+)")


def apply_operation(a: int, op: str, b: int) -> int:
    """``a op b`` for a supported operator.

    >>> apply_operation(12, "*", 3)
    36
    """
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown operator {op!r}; known: {SUPPORTED_OPERATORS}")


def chain_values(start: int, ops: Sequence[Operation]) -> list[int]:
    """The gold values of a chain: the start, then the value after each operation.

    >>> chain_values(7, [("+", 5), ("*", 3), ("-", 4)])
    [7, 12, 36, 32]
    """
    values = [start]
    for op, b in ops:
        values.append(apply_operation(values[-1], op, b))
    return values


def format_prompt(start: int, ops: Sequence[Operation]) -> str:
    """The prompt of a chain; the newline ends it so the completion starts on a fresh line.

    >>> format_prompt(7, [("+", 5), ("*", 3), ("-", 4)])
    '7 +5 *3 -4\\n'
    """
    return " ".join([str(start)] + [f"{op}{b}" for op, b in ops]) + "\n"


def parse_prompt(prompt: str) -> tuple[int, list[Operation]]:
    """Inverse of `format_prompt` (prompts are ours, so a mismatch is a bug and raises ValueError).

    >>> parse_prompt("7 +5 *3 -4\\n")
    (7, [('+', 5), ('*', 3), ('-', 4)])
    """
    tokens = prompt.split()
    if not tokens or not tokens[0].isdigit():
        raise ValueError(f"not an arithmetic prompt: {prompt!r}")
    ops = []
    for token in tokens[1:]:
        match = _PROMPT_OP_RE.fullmatch(token)
        if match is None:
            raise ValueError(f"not an arithmetic prompt: {prompt!r} (bad token {token!r})")
        ops.append((match.group(1), int(match.group(2))))
    return int(tokens[0]), ops


def format_solution(start: int, ops: Sequence[Operation]) -> str:
    """The gold solution: one ``a<op>b=c`` line per operation, then ``Answer: <final>``.

    >>> print(format_solution(7, [("+", 5), ("*", 3), ("-", 4)]))
    7+5=12
    12*3=36
    36-4=32
    Answer: 32
    """
    values = chain_values(start, ops)
    lines = [f"{values[k]}{op}{b}={values[k + 1]}" for k, (op, b) in enumerate(ops)]
    lines.append(f"Answer: {values[-1]}")
    return "\n".join(lines)


def answer_slip(solution: str) -> str:
    """A solution whose Answer line states the first step's result (a copying slip; the steps stay right).

    >>> print(answer_slip("7+5=12\\n12*3=36\\nAnswer: 36"))
    7+5=12
    12*3=36
    Answer: 12
    """
    lines = solution.split("\n")
    first = lines[0].split("=")[-1]
    return "\n".join(lines[:-1] + [f"Answer: {first}"])


def middle_slip(solution: str, ops: Sequence[Operation]) -> str:
    """A solution whose middle step (operation ``len(ops) // 2``) writes a result one too high, and whose later
    steps and Answer line carry the slipped value on, each computed right from it: one wrong step in the middle of
    the chain, a wrong answer, and no sign of the slip at the end. An outcome reward says only that something
    went wrong; a step reward says where.

    >>> print(middle_slip("7+5=12\\n12*3=36\\n36-4=32\\nAnswer: 32", [("+", 5), ("*", 3), ("-", 4)]))
    7+5=12
    12*3=37
    37-4=33
    Answer: 33
    """
    lines = solution.split("\n")
    k = len(ops) // 2
    value = int(_STEP_RE.fullmatch(lines[k]).group(1))
    for j in range(k, len(ops)):
        op, b = ops[j]
        result = apply_operation(value, op, b) + (j == k)  # the slip: one too many, once
        lines[j] = f"{value}{op}{b}={result}"
        value = result
    return "\n".join(lines[: len(ops)] + [f"Answer: {value}"])


SLIPS = ("answer", "middle")  # where a noisy SFT solution goes wrong (`sft_noise_at`)


def parse_int_answer(value: str | None) -> int | None:
    """The integer an ``Answer:`` value states, or None if it is not exactly one integer.

    >>> parse_int_answer(" 032 "), parse_int_answer("32."), parse_int_answer(None)
    (32, None, None)
    """
    if value is None or re.fullmatch(_INT, value.strip()) is None:
        return None
    return int(value)


def step_labels(steps: Sequence[str], start: int, ops: Sequence[Operation]) -> list[int]:
    """Gold 0/1 labels of a completion's steps, each measured against the GOLD chain.

    Step k (0-based) with k < len(ops) is correct iff it parses as ``<int><op><int>=<int>`` (spaces
    allowed around tokens), its left operand equals the gold value before operation k (the start for
    k = 0), its operator and right operand equal operation k, and its result equals the true result.
    Step k = len(ops) is correct iff it is an ``Answer: <int>`` line stating the gold answer. Every step
    after that is incorrect, and so is an ``Answer:`` line that comes before all operations are done.
    An unparsable step is incorrect.

    Because each step is compared with the gold chain, not with the completion's own previous result,
    a slip at step 1 that is carried forward makes step 2 incorrect too, while a step 2 that returns to
    the gold value is correct again: the labels say which steps are right, not whether the completion
    can still recover.

    Args:
        steps: the completion's steps (`pipeline.steps.split_steps`).
        start: the problem's start value.
        ops: the problem's operations, in order.

    Returns:
        One label per step.

    >>> step_labels(["7+5=12", "12*3=35", "35-4=31", "Answer: 31"], 7, [("+", 5), ("*", 3), ("-", 4)])
    [1, 0, 0, 0]
    """
    values = chain_values(start, ops)
    labels = []
    for k, step in enumerate(steps):
        if k < len(ops):
            match = _STEP_RE.fullmatch(step)
            ok = match is not None and (
                int(match.group(1)) == values[k]
                and (match.group(2), int(match.group(3))) == tuple(ops[k])
                and int(match.group(4)) == values[k + 1]
            )
        elif k == len(ops):
            ok = step.strip().startswith("Answer:") and parse_int_answer(answer_line_value(step)) == values[-1]
        else:
            ok = False  # nothing may follow the Answer line
        labels.append(int(ok))
    return labels


def _operand_upper_bound(a: int, op: str, operand_range: tuple[int, int], max_value: int) -> int:
    """The largest operand b in range with 0 <= a op b <= max_value (below operand_range[0] if none).

    All operands are >= 0, so each operator's valid operands form one interval starting at the range's
    low end: computing its top end avoids scanning the whole operand range.
    """
    lo, hi = operand_range
    if op == "+":
        return min(hi, max_value - a)
    if op == "-":
        return min(hi, a)
    return hi if a == 0 else min(hi, max_value // a)  # "*"


def sample_chain(
    rng: random.Random,
    num_ops: int,
    start_range: tuple[int, int],
    operand_range: tuple[int, int],
    operators: Sequence[str],
    max_value: int,
) -> tuple[int, list[Operation]] | None:
    """A random chain whose every value stays within [0, max_value]; None if it got stuck (resample).

    The operator is drawn uniformly among those that have at least one in-range operand, then the operand
    uniformly among those; drawing (operator, operand) pairs jointly would favour "+" and "-", which
    usually admit more operands than "*".
    """
    start = rng.randint(*start_range)
    value, ops = start, []
    for _ in range(num_ops):
        bounds = {op: _operand_upper_bound(value, op, operand_range, max_value) for op in operators}
        usable = [op for op in operators if bounds[op] >= operand_range[0]]
        if not usable:
            return None
        op = rng.choice(usable)
        b = rng.randint(operand_range[0], bounds[op])
        ops.append((op, b))
        value = apply_operation(value, op, b)
    return start, ops


def _check_count(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_range(name: str, value: object, minimum: int, maximum: int | None = None) -> tuple[int, int]:
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 2
        or any(isinstance(v, bool) or not isinstance(v, int) for v in value)
    ):
        raise ValueError(f"{name} must be a pair of integers (low, high), got {value!r}")
    lo, hi = value
    if lo > hi:
        raise ValueError(f"{name} is reversed: low {lo} > high {hi}")
    if lo < minimum or (maximum is not None and hi > maximum):
        upper = "" if maximum is None else f" and high <= {maximum}"
        raise ValueError(f"{name} must have low >= {minimum}{upper}, got {value!r}")
    return lo, hi


class EmbeddedArithmetic(ProblemSet):
    """Synthetic multi-step integer arithmetic, deterministic for a seed, with gold step labels.

    The test set is drawn first and the train set after it, from one ``random.Random(seed)``, with
    duplicate prompts dropped: train and test never share a prompt, and the test set does not change
    when only ``num_train`` does, so runs with different training budgets are evaluated on the same
    problems.

    Args:
        seed: Seed of the generator.
        num_train: Number of training problems.
        num_test: Number of held-out problems.
        min_steps: Fewest operations in a chain.
        max_steps: Most operations in a chain.
        start_range: Inclusive range of start values, within [0, max_value].
        operand_range: Inclusive range of right operands, >= 0.
        operators: Operators to draw from, a subset of ``("+", "-", "*")``.
        max_value: Every intermediate value stays within [0, max_value].
        sft_noise: Share of the training problems whose `solution` (the SFT target, nothing else) has a
            slip (`sft_noise_at`). It stands for imperfect SFT data: a habit the bootstrapped policy learns and
            RL can unlearn. Answers, step labels and the test set are unaffected.
        sft_noise_at: The slips, the noisy solutions shared among them in turn: ``"answer"``, the ``Answer:``
            line states the FIRST step's result (`answer_slip`); ``"middle"``, the middle step's result is one
            too high and carried on (`middle_slip`), a wrong step that only step rewards can locate.

    Raises:
        ValueError: naming the argument, for a bad value or when the ranges cannot give
            ``num_train + num_test`` distinct problems.
    """

    name = "arithmetic"
    has_gold_step_labels = True

    def __init__(
        self,
        *,
        seed: int = 0,
        num_train: int = 2000,
        num_test: int = 200,
        min_steps: int = 2,
        max_steps: int = 3,
        start_range: tuple[int, int] = (1, 20),
        operand_range: tuple[int, int] = (1, 9),
        operators: Sequence[str] = ("+", "-", "*"),
        max_value: int = 99,
        sft_noise: float = 0.0,
        sft_noise_at: Sequence[str] = ("answer",),
    ) -> None:
        _check_count("num_train", num_train, 0)
        if not 0 <= sft_noise <= 1:
            raise ValueError(f"sft_noise must be between 0 and 1, got {sft_noise!r}")
        if isinstance(sft_noise_at, str) or not sft_noise_at or not set(sft_noise_at) <= set(SLIPS):
            raise ValueError(f"sft_noise_at must be a non-empty list of {SLIPS}, got {sft_noise_at!r}")
        _check_count("num_test", num_test, 0)
        _check_count("min_steps", min_steps, 1)
        _check_count("max_steps", max_steps, 1)
        if min_steps > max_steps:
            raise ValueError(f"min_steps ({min_steps}) must be <= max_steps ({max_steps})")
        _check_count("max_value", max_value, 0)
        start_range = _check_range("start_range", start_range, 0, max_value)
        operand_range = _check_range("operand_range", operand_range, 0)
        if isinstance(operators, str) or not operators:
            raise ValueError(f"operators must be a non-empty sequence of {SUPPORTED_OPERATORS}, got {operators!r}")
        unknown = [op for op in operators if op not in SUPPORTED_OPERATORS]
        if unknown:
            raise ValueError(f"operators has unknown operator(s) {unknown}; known: {SUPPORTED_OPERATORS}")
        if len(set(operators)) != len(operators):
            raise ValueError(f"operators has duplicates: {operators!r}")

        self.seed = seed
        self.config = dict(
            min_steps=min_steps,
            max_steps=max_steps,
            start_range=start_range,
            operand_range=operand_range,
            operators=tuple(operators),
            max_value=max_value,
        )
        chains = self._distinct_chains(random.Random(seed), num_test + num_train)
        self.test = [self._problem("test", i, *chain) for i, chain in enumerate(chains[:num_test])]
        self.train = [self._problem("train", i, *chain) for i, chain in enumerate(chains[num_test:])]
        if sft_noise > 0:
            # Its own generator: the problems are the same with and without noise.
            # Only where the first result differs from the answer, so every slip is a wrong answer.
            eligible = [i for i, p in enumerate(self.train) if answer_slip(p.solution) != p.solution]
            count = min(round(sft_noise * len(self.train)), len(eligible))
            noisy = random.Random(seed + 1).sample(eligible, count)
            for n, i in enumerate(noisy):
                p = self.train[i]
                slipped = (answer_slip(p.solution) if sft_noise_at[n % len(sft_noise_at)] == "answer"
                           else middle_slip(p.solution, parse_prompt(p.prompt)[1]))
                self.train[i] = dataclasses.replace(p, solution=slipped)

    def _distinct_chains(self, rng: random.Random, count: int) -> list[tuple[int, list[Operation]]]:
        """`count` chains with distinct prompts, in draw order."""
        cfg = self.config
        # Give up only after many draws in a row bring nothing new: the ranges are then (nearly) exhausted.
        patience = 1000 + 10 * count
        seen: set[str] = set()
        chains = []
        misses = 0
        while len(chains) < count:
            num_ops = rng.randint(cfg["min_steps"], cfg["max_steps"])
            chain = sample_chain(
                rng, num_ops, cfg["start_range"], cfg["operand_range"], cfg["operators"], cfg["max_value"]
            )
            prompt = None if chain is None else format_prompt(*chain)
            if prompt is None or prompt in seen:
                misses += 1
                if misses >= patience:
                    raise ValueError(
                        f"cannot make num_train + num_test = {count} distinct problems: found {len(chains)} "
                        f"with {cfg}; lower num_train/num_test or widen start_range/operand_range/max_value"
                    )
                continue
            misses = 0
            seen.add(prompt)
            chains.append(chain)
        return chains

    @staticmethod
    def _problem(split: str, index: int, start: int, ops: list[Operation]) -> Problem:
        return Problem(
            id=f"arith-{split}-{index:05d}",
            prompt=format_prompt(start, ops),
            answer=str(chain_values(start, ops)[-1]),
            solution=format_solution(start, ops),
        )

    def extract_answer(self, completion: str) -> str | None:
        """The integer on the last ``Answer:`` line, canonical (``"032"`` -> ``"32"``), or None.

        >>> EmbeddedArithmetic(num_train=1, num_test=1).extract_answer("7+5=12\\nAnswer: 012")
        '12'
        """
        value = parse_int_answer(answer_line_value(completion))
        return None if value is None else str(value)

    def is_correct(self, completion: str, problem: Problem) -> bool:
        """True iff the stated answer equals the gold answer, compared as integers."""
        value = parse_int_answer(answer_line_value(completion))
        return value is not None and value == int(problem.answer)

    def gold_step_labels(self, completion: str, problem: Problem) -> list[int]:
        """One 0/1 label per step of the completion, against the gold chain (see `step_labels`)."""
        start, ops = parse_prompt(problem.prompt)
        return step_labels(split_steps(completion), start, ops)


class ArithmeticConfig(ProblemSetConfig):
    num_train: int = Field(2000, ge=1, description="Training problems (GRPO prompts, collection prompts, SFT).")
    num_test: int = Field(200, ge=1, description="Held-out problems for evaluation.")
    min_steps: int = Field(2, ge=1, description="Fewest operations in a problem.")
    max_steps: int = Field(3, ge=1, description="Most operations in a problem.")
    start_range: tuple[int, int] = Field((1, 20), description="Range of the start value, inclusive.")
    operand_range: tuple[int, int] = Field((1, 9), description="Range of the operands, inclusive.")
    operators: list[Literal["+", "-", "*"]] = Field(["+", "-", "*"], min_length=1, description="Operators used.")
    max_value: int = Field(99, ge=1, description="Every intermediate value stays in [0, max_value].")
    sft_noise: float = Field(0.0, ge=0, le=1, description=(
        "Share of SFT solutions with a slip (`sft_noise_at`): imperfect SFT data, a habit RL can unlearn "
        "(answers, step labels and tests unaffected)."))
    sft_noise_at: list[Literal[SLIPS]] = Field(["answer"], min_length=1, description=(
        "Where a noisy SFT solution slips, the noisy ones shared among the listed slips in turn: `answer` (the "
        "Answer line copies the first step's result), `middle` (the middle step's result is one too high and "
        "carried on to a wrong answer: a wrong step only step rewards can locate)."))

    @model_validator(mode="after")
    def _ordered(self):
        if self.min_steps > self.max_steps:
            raise ValueError(f"min_steps {self.min_steps} is above max_steps {self.max_steps}")
        return self


def _from_config(section: ArithmeticConfig, seed: int) -> EmbeddedArithmetic:
    # The run seed draws the problems: another seed is another problem set.
    try:
        return EmbeddedArithmetic(seed=seed, **section.model_dump())
    except ValueError as e:  # a combination of fields the section's own validators pass: name the section
        raise ValueError(f"problems.arithmetic: {e}") from e


PROBLEM_SET = ProblemSetKind("arithmetic", ArithmeticConfig, _from_config, "The embedded problem set.",
                             EmbeddedArithmetic)
