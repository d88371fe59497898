"""One convention for solution steps, shared by PRM training, PRM scoring, process advantages and MC labels.

A step is one non-blank line of a completion. Its *end* is the character that closes it: the newline
after the line when there is one, else the line's last character. A PRM reads its score at the token
that holds a step's end, so the score has seen the whole step (Math-Shepherd reads it at a tag token
after each step; the newline plays that tag here without adding a token).

A completion with no newline is one step. A completion that is blank has no steps.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

STEP_SEPARATOR = "\n"


def step_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the steps of `text`, `end` inclusive (the closing newline, if any).

    >>> step_spans("1+2=3\\n3*4=12\\nAnswer: 12")
    [(0, 5), (6, 12), (13, 22)]
    >>> step_spans("\\n\\nx\\n")
    [(2, 3)]
    """
    spans = []
    start = 0
    for line in text.split(STEP_SEPARATOR):
        stop = start + len(line)  # index of the newline after this line (or len(text))
        if line.strip():
            end = stop if stop < len(text) else stop - 1
            spans.append((start, end))
        start = stop + 1
    return spans


def split_steps(text: str) -> list[str]:
    """The steps of `text`, each without its newline and trailing whitespace.

    >>> split_steps("1+2=3\\n\\n3*4=12 \\nAnswer: 12\\n")
    ['1+2=3', '3*4=12', 'Answer: 12']
    """
    return [line.rstrip() for line in text.split(STEP_SEPARATOR) if line.strip()]


def step_char_ends(text: str) -> list[int]:
    """The character index (inclusive) where each step of `text` ends."""
    return [end for _, end in step_spans(text)]


def step_prefixes(text: str) -> list[str]:
    """The prefixes of `text` that end right after each step (its newline included): what MC rollouts continue.

    >>> step_prefixes("a\\nb\\nc")
    ['a\\n', 'a\\nb\\n', 'a\\nb\\nc']
    """
    return [text[: end + 1] for end in step_char_ends(text)]


def char_to_token_ends(offsets: Sequence[tuple[int, int]], char_ends: Sequence[int]) -> list[int]:
    """Map step-end characters to the index of the token that holds each of them.

    Args:
        offsets: (start, end) character span of every token, end exclusive, as fast tokenizers give with
            `return_offsets_mapping=True`. Special tokens with span (0, 0) are ignored.
        char_ends: step-end character indices, increasing.

    Returns:
        For each step end, the last token whose span starts at or before it (so a token covering several
        characters still counts). Steps that map to the same token keep that token.

    >>> char_to_token_ends([(0, 2), (2, 3), (3, 6)], [1, 2, 5])
    [0, 1, 2]
    """
    starts, index = [], []
    for i, (s, e) in enumerate(offsets):
        if e > s:
            starts.append(s)
            index.append(i)
    if not starts:
        raise ValueError("no token covers any character of the text")
    out = []
    for c in char_ends:
        k = bisect.bisect_right(starts, c) - 1
        out.append(index[max(k, 0)])
    return out


def token_char_ends(token_texts: Sequence[str]) -> list[tuple[int, int]]:
    """Character spans of decoded tokens laid end to end: offsets for generated ids, which have no mapping.

    >>> token_char_ends(["ab", "\\n", "c"])
    [(0, 2), (2, 3), (3, 4)]
    """
    spans, pos = [], 0
    for t in token_texts:
        spans.append((pos, pos + len(t)))
        pos += len(t)
    return spans


def scored_step_ends(text: str) -> list[int]:
    """Where a PRM reads scores for `text`: its step ends, or, for a blank completion, its last character.

    Every completion thus gets at least one score, so an empty answer is judged (badly) rather than skipped.
    `-1` (an empty completion) means the character before the completion: the prompt's last one.

    >>> scored_step_ends("a\\nb")
    [1, 2]
    >>> scored_step_ends("")
    [-1]
    """
    return step_char_ends(text) or [len(text) - 1]
