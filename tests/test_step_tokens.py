"""Step ends in tokens for any tokenizer: decoding generated ids, the PRM's read positions in GRPO, evaluation
and RM training, MC rollout prefixes (issue 15, point 2), and point 3's worked example.

The tokenizers and texts are in `tests/tokenizer_cases.py` (char, SmolLM2's byte-level BPE, a
SentencePiece-style Metaspace one; texts with `\\n\\n`, tabs, trailing spaces, emoji, curly quotes); every
expected value comes from a plain loop beside the fast code.
"""

from __future__ import annotations

import statistics

import pytest
import torch

from models import char_tokenizer
from pipeline.advantages import process_advantages
from pipeline.mc_labels import make_request
from pipeline.grpo_trainer import completion_steps
from pipeline.rm_kinds.prm import prm_examples
from pipeline.scorers import PrmScorer
from pipeline.steps import scored_step_ends, token_spans
from tests.tokenizer_cases import (
    KINDS,
    PROMPT,
    TEXTS,
    encode,
    id_variants,
    metaspace_tokenizer,
    policy_and_prm,
    reference_pieces,
    reference_prm_positions,
    reference_token_of,
    smollm2_tokenizer,
    tokenizer_of,
)


@pytest.fixture(scope="module", params=KINDS)
def tok(request):
    return tokenizer_of(request.param)


@pytest.fixture(scope="module")
def prm_dir(tok, tmp_path_factory):
    return policy_and_prm(tok, tmp_path_factory.mktemp("prm"))


# --- decoding and step ends in the policy's own ids -----------------------------------------------------


def test_token_spans_are_the_prefix_decodes(tok):
    for text in TEXTS:
        for ids in id_variants(tok, text):
            decoded, spans = token_spans(tok, ids)
            want_text, want_pieces = reference_pieces(tok, ids)
            assert decoded == want_text == tok.decode(ids, skip_special_tokens=True)
            assert [decoded[s:e] for s, e in spans] == want_pieces
            assert spans[0][0] == 0 and spans[-1][1] == len(decoded)
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous


def test_per_token_decodes_lose_text_on_real_tokenizers():
    """Why the pieces come from one decode: decoding token by token is wrong on both real tokenizers."""
    smol, sp = smollm2_tokenizer(), metaspace_tokenizer()
    text = TEXTS[1]
    for t in (smol, sp):
        ids = encode(t, text)
        joined = "".join(t.decode([i]) for i in ids)
        assert joined != t.decode(ids)
        assert "\ufffd" in joined or joined.count(" ") < text.count(" ")  # split emoji, dropped spaces
        assert "".join(t.decode(ids)[s:e] for s, e in token_spans(t, ids)[1]) == t.decode(ids)


def test_grpo_step_ends_are_the_tokens_that_complete_each_step(tok):
    for text in TEXTS + ["", "   "]:
        for ids in id_variants(tok, text):
            steps = completion_steps(tok, ids, len(ids))
            decoded, pieces = reference_pieces(tok, ids)
            assert steps.text == decoded
            if not decoded:  # only the eos: one step on it
                assert steps.ends == [len(ids) - 1]
                continue
            assert steps.ends == [reference_token_of(pieces, c) for c in scored_step_ends(decoded)]


# --- the PRM reads each step on one token in GRPO, evaluation and RM training ---------------------------


def test_prm_reads_each_step_where_it_was_trained(tok, prm_dir):
    from pipeline.rm_kinds.loading import load_reward_model

    model, prm_tok, _ = load_reward_model(prm_dir / "prm", expect="prm")
    scorer = PrmScorer(model, prm_tok, batch_size=3)
    for text in TEXTS:
        for ids in id_variants(tok, text):
            # GRPO: the PRM is given the completion as completion_steps decodes the policy's ids; evaluation
            # and the shard hold the same text (generation decodes the same ids the same way).
            completion = completion_steps(tok, ids, len(ids)).text
            assert completion == tok.decode(ids, skip_special_tokens=True)
            grpo = scorer.step_scores([PROMPT], [completion])[0]
            evaluation = scorer.step_scores([PROMPT, PROMPT], [TEXTS[0], completion])[1]  # another batch
            k = len(scored_step_ends(completion))
            row = {"prompt": PROMPT, "completion": completion, "se_labels": [0.5] * k, "he_labels": [1] * k}
            example = prm_examples([row], prm_tok, "soft")[0]
            trained_on = [i for i, y in enumerate(example["labels"]) if y != -100.0]
            input_ids, positions = reference_prm_positions(prm_tok, PROMPT, completion)
            assert example["input_ids"] == input_ids and trained_on == positions
            with torch.inference_mode():
                probs = torch.sigmoid(model(torch.tensor([input_ids])).logits[0, :, 0])  # (T,)
            want = probs[positions].tolist()
            assert grpo == pytest.approx(want, abs=1e-6)
            assert evaluation == pytest.approx(want, abs=1e-5)


def test_mc_rollouts_continue_from_the_policys_own_ids(tok):
    from pipeline.problems import EmbeddedArithmetic, Problem

    ps = EmbeddedArithmetic(num_train=4, num_test=2, seed=0)
    problem = Problem("p", PROMPT, "72", TEXTS[0])
    for text in TEXTS:
        for ids in id_variants(tok, text):
            completion = ids[:-1]  # generation hands over the ids before the eos
            req = make_request(ps, problem, tok, completion)
            decoded, pieces = reference_pieces(tok, completion)
            ends = [reference_token_of(pieces, c) for c in scored_step_ends(decoded)]
            prompt = tuple(tok(PROMPT).input_ids)
            assert [c.prompt_ids for c in req.continuations] == [prompt] * len(ends)
            # The policy's own ids up to the token holding each step end: never the prefix text re-tokenized.
            assert [list(c.completion_ids) for c in req.continuations] == [completion[: e + 1] for e in ends]
            assert req.prefixes == ["".join(pieces[: e + 1]) for e in ends]


def test_hf_generation_goes_on_from_a_continuation(tok, prm_dir):
    from models import load_policy
    from pipeline.generation import Continuation, sample

    model, _ = load_policy(str(prm_dir / "policy"))
    ids = id_variants(tok, TEXTS[1])[-1][:-1]  # bytes where the tokenizer has them: not what encode gives
    prefix = Continuation(tuple(tok(PROMPT).input_ids), tuple(ids[:7]))
    out = sample(model, tok, [prefix], 1, greedy=True, max_new_tokens=6)
    with torch.inference_mode():
        full = model.generate(torch.tensor([[*prefix.prompt_ids, *prefix.completion_ids]]), do_sample=False,
                              max_new_tokens=6, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    new = full[0, len(prefix.prompt_ids) + 7 :].tolist()
    new = new[: new.index(tok.eos_token_id)] if tok.eos_token_id in new else new
    # The whole completion, prefix ids first, decoded as one text.
    assert out.ids[0][0] == ids[:7] + new
    assert out.texts[0][0] == tok.decode(ids[:7] + new, skip_special_tokens=True)
    assert out.num_tokens[0][0] == len(full[0]) - len(prefix.prompt_ids) - 7


def test_sampling_stops_on_the_models_end_of_turn_ids_as_trl_does(tok, prm_dir):
    """A chat model's generation_config lists its end of turn beside the tokenizer's eos (Llama-3's <|eot_id|>,
    Gemma's <end_of_turn>): collection and evaluation must stop there, as TRL's GRPO does, not run on into an
    invented next turn. Here the stand-in end of turn is the token the tiny policy samples most."""
    from collections import Counter

    from models import load_policy
    from pipeline.generation import sample

    model, _ = load_policy(str(prm_dir / "policy"))
    opts = dict(temperature=1.0, max_new_tokens=24, seed=5)
    free = sample(model, tok, [PROMPT], 8, **opts)
    end_of_turn = Counter(i for row in free.ids[0] for i in row).most_common(1)[0][0]
    model.generation_config.eos_token_id = [tok.eos_token_id, end_of_turn]
    stopped = sample(model, tok, [PROMPT], 8, **opts)
    cut = 0
    for before, after, k in zip(free.ids[0], stopped.ids[0], stopped.num_tokens[0]):
        # The same draws up to the end of turn, then nothing more; num_tokens counts the stop, as it counts eos.
        want = before[: before.index(end_of_turn)] if end_of_turn in before else before
        assert after == want
        assert k == (len(want) + 1 if end_of_turn in before else len(after) + (len(after) < 24))
        cut += end_of_turn in before
    assert cut > 0
    assert stopped.texts[0] == [tok.decode(ids, skip_special_tokens=True) for ids in stopped.ids[0]]


# --- the worked example of point 3, without a model -----------------------------------------------------


def test_masked_row_out_of_the_statistics_worked_example():
    """Three completions of two steps, every step scored 0.9, and a cut completion TRL masked.

    Before: the masked row was read as one step on its first token (say 0.1) and counted in the group's
    mean 0.786 and std 0.302 (7 steps), so each 0.9 step normalised to 0.378 and the first tokens of the
    three finished completions got 2 x 0.378 = 0.756. Now the masked row has no steps: every step equals
    the mean and all advantages are 0.
    """
    tok = char_tokenizer()
    finished = tok("1\n2\n").input_ids + [tok.eos_token_id]  # 2 steps, ends at tokens 1 and 3, eos at 4
    cut = tok("1\n2\n3").input_ids
    before = process_advantages([[0.9, 0.9]] * 3 + [[0.1]], [[1, 3]] * 3 + [[0]], 5, 4)
    seven = [0.9] * 6 + [0.1]
    mean, std = statistics.fmean(seven), statistics.stdev(seven)
    assert (round(mean, 3), round(std, 3)) == (0.786, 0.302)
    assert before[0, 0].item() == pytest.approx(2 * (0.9 - mean) / (std + 1e-4), abs=1e-5)
    assert before[0, 0].item() == pytest.approx(0.756, abs=1e-3)
    steps = [completion_steps(tok, finished, 5)] * 3 + [completion_steps(tok, cut, 0)]  # TRL: mask sum 0
    assert [s.ends for s in steps] == [[1, 3]] * 3 + [[]]
    after = process_advantages([[0.9, 0.9]] * 3 + [[]], [s.ends for s in steps], 5, 4)
    assert after.abs().max().item() == 0.0
