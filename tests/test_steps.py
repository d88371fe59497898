"""The step convention (`pipeline/steps.py`): where a step ends, in text and in tokens, for any tokenizer; a
completion's steps as GRPO scores them."""

from __future__ import annotations

import pytest

from models import char_tokenizer
from pipeline.grpo_trainer import completion_steps, dedupe_steps
from pipeline.steps import (
    char_to_token_ends,
    scored_step_ends,
    split_steps,
    step_char_ends,
    step_spans,
    token_char_ends,
)


def test_step_spans_edge_cases():
    assert step_spans("12*3=36") == [(0, 6)]  # no newline: one step ending at its last character
    assert step_spans("") == [] and step_spans("  \n\t\n") == []  # blank: no steps
    assert step_spans("a\n") == [(0, 1)]  # a trailing newline closes the step
    assert step_spans("a\nb") == [(0, 1), (2, 2)]  # the last step ends at its last character
    assert step_spans("\n\nab\n\ncd") == [(2, 4), (6, 7)]  # blank lines are skipped, not steps
    assert step_spans(" \nx") == [(2, 2)]  # a whitespace-only line is blank


def test_step_char_ends():
    text = "7+5=12\n\n12*3=36\nAnswer: 36"
    assert split_steps(text) == ["7+5=12", "12*3=36", "Answer: 36"]
    # Ends: the newline at 6 (the blank line at 7 is skipped), the newline at 15, the last character 25.
    assert step_char_ends(text) == [6, 15, 25]
    assert step_char_ends("") == []


def test_scored_step_ends_always_gives_one():
    assert scored_step_ends("a\nb\n") == [1, 3]
    assert scored_step_ends("") == [-1]  # the prompt's last character
    assert scored_step_ends("  ") == [1]  # the last character of a blank completion


def test_char_to_token_ends_multi_char_tokens():
    # Tokens "12" "*3=" "36\n" "Ans" "wer: 36": character spans laid end to end.
    offsets = token_char_ends(["12", "*3=", "36\n", "Ans", "wer: 36"])
    assert offsets == [(0, 2), (2, 5), (5, 8), (8, 11), (11, 18)]
    # The step ends at the newline (character 7, inside token 2) and at the last character (17, token 4).
    assert char_to_token_ends(offsets, [7, 17]) == [2, 4]
    # A token covering two step ends keeps both: "a\nb\n" as one token.
    assert char_to_token_ends([(0, 4), (4, 5)], [1, 3, 4]) == [0, 0, 1]


def test_char_to_token_ends_skips_special_tokens():
    # A BOS token with span (0, 0) must not be chosen for character 0; the real tokens follow it.
    offsets = [(0, 0), (0, 1), (1, 2), (2, 3)]
    assert char_to_token_ends(offsets, [0, 2]) == [1, 3]
    with pytest.raises(ValueError, match="no token covers"):
        char_to_token_ends([(0, 0)], [0])


def test_completion_steps_and_dedupe():
    tok = char_tokenizer()
    ids = lambda text: tok(text).input_ids  # noqa: E731
    # One char per token: ends are the character ends; the eos is counted in the length, not a step.
    assert completion_steps(tok, ids("1=1\nA\n") + [tok.eos_token_id], 7).ends == [3, 5]
    # Padding after the length is not read.
    assert completion_steps(tok, ids("12\n3") + [tok.pad_token_id] * 3, 4).ends == [2, 3]
    # Two steps ending in one token: the token repeats, and dedupe keeps the later step's score.
    assert dedupe_steps([0.2, 0.7, 0.4], [0, 0, 1]) == ([0.7, 0.4], [0, 1])
    # Blank completions are one step at their last token (so even an empty answer is judged).
    assert completion_steps(tok, [tok.eos_token_id], 1).ends == [0]
    assert completion_steps(tok, ids(" \n") + [tok.eos_token_id], 3).ends == [1]
    # A masked completion (length 0) has no steps and no text.
    assert completion_steps(tok, ids("1=1\n"), 0).ends == []
