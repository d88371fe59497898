"""The PRM head layouts' math and token placement (their table is `pipeline.rm_kinds.PRM_HEADS`).

Each layout is a pure function from the logits at the read positions to P(step right), and, for the tag layouts,
to the (right, wrong) log-probabilities its cross-entropy trains. `StepReader` says where a PRM of a layout reads:
at each step's closing newline (value) or at a tag token put after each step (label_tokens, classification); the
PRM's training examples and its scorer both use it, so a PRM is trained on the tokens it is read at.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from pipeline.rm_kinds.base import PrmLayout, head_math
from pipeline.steps import STEP_SEPARATOR, char_to_token_ends, scored_step_ends, tagged_steps


def value_probability(logits: torch.Tensor, label_ids=None) -> torch.Tensor:
    """One logit per position (N, 1) -> sigmoid, (N,)."""
    return torch.sigmoid(logits[:, 0])


def label_token_probability(logits: torch.Tensor, label_ids: Sequence[int]) -> torch.Tensor:
    """LM logits (N, V) -> P(right label token) normalised against the wrong one: softmax over the two logits, (N,)
    (Math-Shepherd's scorer: the rest of the vocabulary does not count)."""
    return torch.softmax(logits[:, list(label_ids)], dim=-1)[:, 0]


def classification_probability(logits: torch.Tensor, label_ids=None) -> torch.Tensor:
    """Two class logits (N, 2) -> softmax(logits)[:, 1], class 1 meaning right (Qwen2.5-Math-PRM), (N,)."""
    return torch.softmax(logits, dim=-1)[:, 1]


def label_token_log_probs(logits: torch.Tensor, label_ids: Sequence[int]) -> torch.Tensor:
    """LM logits (N, V) -> log-probabilities over the whole vocabulary of the (right, wrong) label tokens, (N, 2):
    the cross-entropy on the label token (Math-Shepherd's training), which also pulls mass onto the two labels."""
    return torch.log_softmax(logits, dim=-1)[:, list(label_ids)]


def classification_log_probs(logits: torch.Tensor, label_ids=None) -> torch.Tensor:
    """Two class logits (N, 2) -> log-probabilities of (right, wrong) = (class 1, class 0), (N, 2)."""
    return torch.log_softmax(logits, dim=-1)[:, [1, 0]]


def soft_cross_entropy(log_probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy of (right, wrong) log-probabilities (N, 2) against P(right) targets (N,): soft (SE)
    labels weigh both; a hard label is the usual cross-entropy on its label."""
    return -(targets * log_probs[:, 0] + (1 - targets) * log_probs[:, 1]).sum()


@dataclass(frozen=True)
class HeadMath:
    probability: Callable[[torch.Tensor, Sequence[int] | None], torch.Tensor]
    log_probs: Callable[[torch.Tensor, Sequence[int] | None], torch.Tensor] | None  # None: BCE on the one logit


VALUE = HeadMath(value_probability, None)
LABEL_TOKENS = HeadMath(label_token_probability, label_token_log_probs)
CLASSIFICATION = HeadMath(classification_probability, classification_log_probs)


def single_token(tokenizer, text: str, what: str) -> int:
    """The id of `text` where the tokenizer holds it as one token; else a ValueError naming `what` and the fix."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1 or ids[0] == tokenizer.unk_token_id:
        pieces = tokenizer.convert_ids_to_tokens(ids)
        raise ValueError(f"{what} {text!r} is not one token of this tokenizer (it encodes as {pieces}): give a "
                         "token of its vocabulary")
    return ids[0]


# Step endings a tag follows in `tagged_steps`: a digit, a letter, punctuation, a trailing space (policies leave
# them), an emoji; a byte-level BPE merges an in-vocabulary tag such as '§' with the space before it.
TAG_PROBE = "1 + 2 = 3\nx = 12.\nit is 7 \n(a)\nok 😀\nAnswer: 12"


def tag_kept_apart(tokenizer, tag: str) -> bool:
    """Whether `tokenizer` keeps `tag` one token of its own after every kind of step ending (`TAG_PROBE`): else a
    step's score is read at a token the PRM was never trained to answer at."""
    ids = tokenizer.encode(tag, add_special_tokens=False)
    if len(ids) != 1:
        return False
    text, ends = tagged_steps(TAG_PROBE, tag)
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    return all(enc["input_ids"][i] == ids[0] for i in char_to_token_ends(enc["offset_mapping"], ends))


@dataclass(frozen=True)
class StepReader:
    """Where a PRM of one layout reads its step scores, and how (`PrmScorer`, `prm_examples`).

    `place` gives the text the PRM reads and the character where each step's score is read: the step's end
    (value), or the last character of the tag put after it. `read` turns the logits at those tokens into P(right).
    """

    layout: PrmLayout
    tag_id: int | None = None
    label_ids: tuple[int, int] | None = None

    @staticmethod
    def build(layout: PrmLayout, tokenizer) -> StepReader:
        """The reader of `layout` on `tokenizer`; a tag or label token it does not hold as one token, or a tag it
        merges with the text before it: ValueError."""
        tag = single_token(tokenizer, layout.step_tag, "reward_model.step_tag") if layout.step_tag else None
        if tag is not None and not tag_kept_apart(tokenizer, layout.step_tag):
            raise ValueError(f"reward_model.step_tag {layout.step_tag!r} merges with the text before it in this "
                             "tokenizer (after a trailing space, say): a PRM trained from a policy adds it as a token "
                             "of its own; a checkpoint needs a tokenizer that holds it as an added token")
        labels = (tuple(single_token(tokenizer, t, "reward_model.label_tokens") for t in layout.label_tokens)
                  if layout.label_tokens else None)
        return StepReader(layout, tag, labels)

    def place(self, prompt: str, completion: str, separator: str = STEP_SEPARATOR) -> tuple[str, list[int]]:
        """(the text the PRM reads, the character of each step's read position in it); steps split at `separator`,
        the problem set's."""
        if self.layout.step_tag is None:
            return prompt + completion, [len(prompt) + e for e in scored_step_ends(completion, separator)]
        tagged, ends = tagged_steps(completion, self.layout.step_tag, separator)
        return prompt + tagged, [len(prompt) + e for e in ends]

    def tokens(self, offsets: Sequence[tuple[int, int]], ids: Sequence[int], chars: Sequence[int]) -> list[int]:
        """The token index of each read character; a tag that did not stay its own token is a ValueError (the
        score would be read at a token the PRM was never trained to answer at)."""
        idx = char_to_token_ends(offsets, chars)
        if self.tag_id is not None and any(int(ids[i]) != self.tag_id for i in idx):
            raise ValueError(f"step tag {self.layout.step_tag!r} merges with the text around it in this tokenizer: "
                             "give a tag the tokenizer keeps apart (an added token)")
        return idx

    def read(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits at the read tokens (N, C) -> P(step right), (N,)."""
        return head_math(self.layout.head).probability(logits, self.label_ids)

    def loss(self):
        """Trainer's `compute_loss_func` for a tag layout, or None (the value head trains with `bce_loss`)."""
        log_probs = head_math(self.layout.head).log_probs
        if log_probs is None:
            return None
        label_ids = self.label_ids

        def fn(outputs, labels, num_items_in_batch=None):
            # As `reward_model.bce_loss`: labels -100 where unlabelled; the sum over the optimizer step's count.
            keep = labels != -100  # (B, T)
            total = soft_cross_entropy(log_probs(outputs.logits[keep].float(), label_ids), labels[keep].float())
            return total / (num_items_in_batch if num_items_in_batch is not None else keep.sum().clamp(min=1))

        return fn
