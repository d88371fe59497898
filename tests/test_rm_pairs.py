"""Pairs for the pairwise (Bradley-Terry) ORM: every correct/incorrect pair of one prompt in one round."""

from __future__ import annotations

import pytest

from models.tokenizer import char_tokenizer
from pipeline.loading import config_from_dict
from pipeline.reward_model import train_reward_model
from pipeline.rm_kinds.orm import orm_pairs


def row(round_, prompt_id, completion, outcome):
    return {"round": round_, "prompt_id": prompt_id, "prompt": f"Q{prompt_id}\n", "completion": completion,
            "outcome": outcome}


def test_pairs_are_correct_against_incorrect_within_a_prompt_and_round():
    tok = char_tokenizer()
    rows = [row(0, "a", "1", 1), row(0, "a", "2", 0), row(0, "a", "3", 0),  # 1 x 2 pairs
            row(0, "b", "4", 1), row(0, "b", "5", 1),                        # no wrong one: no pair
            row(1, "a", "6", 0),                                             # other round: no pair with round 0
            row(1, "c", "7", 1), row(1, "c", "8", 0)]                        # 1 pair
    pairs = orm_pairs(rows, tok)
    decoded = [(tok.decode(p["chosen_ids"]), tok.decode(p["rejected_ids"])) for p in pairs]
    assert decoded == [("Qa\n1", "Qa\n2"), ("Qa\n1", "Qa\n3"), ("Qc\n7", "Qc\n8")]


def test_pairwise_orm_without_any_pair_is_a_clear_error(tmp_path, tiny_policy_dir):
    cfg = config_from_dict({"reward_model": {"orm": {"loss": "pairwise"}}}, check_trl=False)
    rows = [row(0, "a", "1", 1), row(0, "b", "2", 0)]
    with pytest.raises(ValueError, match="orm.loss=pairwise: no prompt has both"):
        train_reward_model(cfg, "orm", rows, tiny_policy_dir, tmp_path / "orm", warm=False)
    assert not (tmp_path / "orm").exists()
