"""The character-level tokenizer of the embedded default: a real `PreTrainedTokenizerFast`.

One token per character (a BPE model with no merges), so offsets, padding, saving and loading all go
through the ordinary transformers paths, and step ends map to tokens one to one.
"""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
# Everything the embedded problems and GSM8K-style text can use; unknown characters become <unk>.
DEFAULT_ALPHABET = string.digits + "+-*/=()., :\n" + string.ascii_letters + "?!'\"$%#<>_;"


def char_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerFast:
    """A character-level tokenizer with pad and eos tokens, left padding (for generation).

    >>> tok = char_tokenizer()
    >>> tok.decode(tok("7+5=12").input_ids)
    '7+5=12'
    """
    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for ch in dict.fromkeys(alphabet):
        vocab.setdefault(ch, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    backend.decoder = decoders.Fuse()  # characters join back without spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )
