"""One convention for solution steps, shared by PRM training, PRM scoring, process advantages and MC labels.

A step is one non-blank piece of a completion between two matches of the problem set's step separator
(`ProblemSet.step_separator`, a regular expression: ``"\n"`` by default, a line; ``"\n\n"`` a paragraph).
Its *end* is the character that closes it: the last character of the separator after it when there is one
(so an MC prefix holds the whole separator, and the rollout starts the next step), else the piece's last
character. Every function here takes that separator, and every caller passes its problem
set's, so MC prefixes, PRM labels and scores and process advantages still share one split. A PRM reads its score at the token
that holds a step's end, so the score has seen the whole step (Math-Shepherd reads it at a tag token
after each step; the newline plays that tag here without adding a token).

A completion with no separator is one step. A completion that is blank has no steps.

Tokens: `step_token_ends` is the one answer to "which token holds each step's end", for the PRM's input
when it is scored (`rewards.PrmScorer`) and trained (`reward_model.prm_examples`) and for the policy's own
completion ids in GRPO (`policy.completion_steps`), so the three cannot disagree. Its character spans come
from the tokenizer's offset mapping for a tokenized text, and from `token_spans` for generated ids: the ids
are decoded once and each token's span is measured in that decoded text (never by decoding tokens one by one,
which drops SentencePiece's leading spaces and turns a character split over byte tokens into U+FFFD).
"""

from __future__ import annotations

import bisect
import functools
import os
import re
from collections.abc import Iterator, Sequence

STEP_SEPARATOR = "\n"  # the default: a step is a line


@functools.lru_cache(maxsize=64)
def separator_pattern(separator: str) -> re.Pattern:
    """The compiled separator; a ValueError naming it when it is not a regular expression that can match text.

    >>> separator_pattern("\\n\\n").pattern
    '\\n\\n'
    """
    try:
        pattern = re.compile(separator)
    except re.error as e:
        raise ValueError(f"step separator {separator!r} is not a regular expression: {e}") from None
    if pattern.fullmatch(""):  # it would match between every two characters: every character a step
        raise ValueError(f"step separator {separator!r} matches the empty text; it must match at least one character")
    return pattern


def _pieces(text: str, separator: str) -> Iterator[tuple[int, int, int]]:
    """(start, stop, end) of each piece between separators: `text[start:stop]`, `end` the closing character."""
    start = 0
    for m in separator_pattern(separator).finditer(text):
        # A zero-width match (a lookahead) closes the piece on its own last character.
        yield start, m.start(), m.end() - 1 if m.end() > m.start() else m.start() - 1
        start = m.end()
    yield start, len(text), len(text) - 1


def step_spans(text: str, separator: str = STEP_SEPARATOR) -> list[tuple[int, int]]:
    """(start, end) character spans of the steps of `text`, `end` inclusive (the closing separator's last
    character, if any).

    >>> step_spans("1+2=3\\n3*4=12\\nAnswer: 12")
    [(0, 5), (6, 12), (13, 22)]
    >>> step_spans("\\n\\nx\\n")
    [(2, 3)]
    >>> step_spans("a\\nb\\n\\nc", "\\n\\n")
    [(0, 4), (5, 5)]
    """
    return [(start, end) for start, stop, end in _pieces(text, separator) if text[start:stop].strip()]


def split_steps(text: str, separator: str = STEP_SEPARATOR) -> list[str]:
    """The steps of `text`, each without its separator and trailing whitespace.

    >>> split_steps("1+2=3\\n\\n3*4=12 \\nAnswer: 12\\n")
    ['1+2=3', '3*4=12', 'Answer: 12']
    """
    return [text[start:stop].rstrip() for start, stop, _ in _pieces(text, separator) if text[start:stop].strip()]


def step_char_ends(text: str, separator: str = STEP_SEPARATOR) -> list[int]:
    """The character index (inclusive) where each step of `text` ends."""
    return [end for _, end in step_spans(text, separator)]


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
    """Character spans of token texts laid end to end (the texts must be exact pieces of one string).

    >>> token_char_ends(["ab", "\\n", "c"])
    [(0, 2), (2, 3), (3, 4)]
    """
    spans, pos = [], 0
    for t in token_texts:
        spans.append((pos, pos + len(t)))
        pos += len(t)
    return spans


def token_spans(tokenizer, ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
    """Decode generated `ids` once, as TRL decodes a completion (special tokens skipped), with each token's span.

    Token k's span is the text it adds: what `decode(ids[:k+1])` has of the decoded text beyond
    `decode(ids[:k])` (`prefix_pieces`, the definition). So a token that only starts a multi-byte character
    adds nothing of it (the token that completes it holds it), and a special token adds nothing. Computed with
    the tokenizer's streaming decoder (`tokenizers.decoders.DecodeStream`, linear in the length), which holds
    a chunk back until its bytes are whole: only those held-back tokens are measured by prefix decodes. If the
    stream's chunks do not join to the decoded text (a slow tokenizer, a decoder that cleans up spaces, a
    character cut at the end), every token is (exact, quadratic).

    Returns:
        (text, spans): `spans[k] = (start, end)`, `text[start:end]` the text token k adds; the spans are
        contiguous and cover `text`.
    """
    ids = [int(i) for i in ids]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    chunks = _stream_chunks(tokenizer, ids)
    if chunks is None or "".join(c or "" for c in chunks) != text:
        return text, token_char_ends(prefix_pieces(tokenizer, ids, text))
    spans, done, held = [], 0, []
    for k, chunk in enumerate(chunks):
        if chunk is None:
            held.append(k)
            continue
        stop = done + len(chunk)
        for j in held:  # what each held-back token added, by the definition (rare: split characters)
            prefix = tokenizer.decode(ids[: j + 1], skip_special_tokens=True)
            reached = min(stop, max(done, len(os.path.commonprefix([prefix, text]))))
            spans.append((done, reached))
            done = reached
        spans.append((done, stop))
        done, held = stop, []
    spans += [(done, done)] * len(held)  # trailing specials (the eos): nothing is left to add
    return text, spans


def _stream_chunks(tokenizer, ids: list[int]) -> list[str | None] | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(skip_special_tokens=True)
    return [stream.step(backend, i) for i in ids]  # None: held back (an incomplete character, a special token)


def prefix_pieces(tokenizer, ids: Sequence[int], text: str) -> list[str]:
    """The text each token adds, by definition: token k adds what `decode(ids[:k+1])` has of `text` beyond
    `decode(ids[:k])` (the common prefix with the whole decoded `text`, never shrinking).

    The plain reference of `token_spans`: one decode per token.
    """
    pieces, done = [], 0
    for k in range(1, len(ids) + 1):
        prefix = tokenizer.decode(list(ids[:k]), skip_special_tokens=True)
        reached = max(done, len(os.path.commonprefix([prefix, text])))
        pieces.append(text[done:reached])
        done = reached
    if pieces:
        pieces[-1] += text[done:]  # whatever a prefix decode never showed, the whole decode has at its end
    return pieces


def step_token_ends(offsets: Sequence[tuple[int, int]], completion: str, start: int = 0,
                    separator: str = STEP_SEPARATOR) -> list[int]:
    """The index of the token that holds each scored step end of `completion` (`scored_step_ends`).

    The one place that maps steps to tokens: PRM scoring, PRM training and GRPO's process advantages all
    call it, so a PRM reads each step's score on the token it was trained on.

    Args:
        offsets: (start, end) character span of every token of the sequence, end exclusive (a tokenizer's
            `offset_mapping`, or `token_spans` for generated ids); empty spans are never chosen.
        completion: the completion's text.
        start: where `completion` starts in the text the offsets measure (`len(prompt)` for `prompt +
            completion`, 0 for a completion on its own).
        separator: the problem set's step separator.

    Prompt "Q: " and completion "1+1=2\\nA: 2" as the tokens "Q: ", "1+1=2", "\\n", "A: 2": the steps end
    at the newline (character 8 of the whole text) and at the last character (12).

    >>> step_token_ends([(0, 3), (3, 8), (8, 9), (9, 13)], "1+1=2\\nA: 2", start=3)
    [2, 3]
    """
    return char_to_token_ends(offsets, [start + e for e in scored_step_ends(completion, separator)])


def scored_step_ends(text: str, separator: str = STEP_SEPARATOR) -> list[int]:
    """Where a PRM reads scores for `text`: its step ends, or, for a blank completion, its last character.

    Every completion thus gets at least one score, so an empty answer is judged (badly) rather than skipped.
    `-1` (an empty completion) means the character before the completion: the prompt's last one.

    >>> scored_step_ends("a\\nb")
    [1, 2]
    >>> scored_step_ends("")
    [-1]
    """
    return step_char_ends(text, separator) or [len(text) - 1]


def tagged_steps(text: str, tag: str, separator: str = STEP_SEPARATOR) -> tuple[str, list[int]]:
    """`text` with `tag` put after each scored step (`scored_step_ends`), and where each tag ends in the result.

    Step-tag PRMs (Math-Shepherd's `ки`, Qwen2.5-Math-PRM's `<extra_0>`) read a step's score at a tag token after
    it. The tag goes right after the step's text, before its separator (Math-Shepherd's "step ки\\n"), so the
    steps stay those of `pipeline.steps` and a PRM of any layout scores the same steps. A blank text gets one
    tag at its end (its one score, as `scored_step_ends`).

    Returns:
        (tagged text, the index of each tag's last character in it, one per scored step).

    >>> tagged_steps("1+2=3\\n3*4=12\\nAnswer: 12", "#")
    ('1+2=3#\\n3*4=12#\\nAnswer: 12#', [5, 13, 25])
    >>> tagged_steps("a\\nb\\n\\nc", "#", "\\n\\n")
    ('a\\nb#\\n\\nc#', [3, 7])
    >>> tagged_steps("", "#")
    ('#', [0])
    """
    cuts = [stop for start, stop, _ in _pieces(text, separator) if text[start:stop].strip()] or [len(text)]
    pieces, ends, done = [], [], 0
    for cut in cuts:
        pieces += [text[done:cut], tag]
        done = cut
        ends.append(sum(map(len, pieces)) - 1)
    return "".join(pieces) + text[done:], ends
