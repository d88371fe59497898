"""The oracle PRM (`reward_model.oracle: gold`, issue 16 point 2): GRPO's step rewards are the gold step labels.

The problem of the tests: "7 +5 *3 -4" (7+5=12, 12*3=36, 36-4=32, Answer: 32), and "9 -2" (9-2=7, Answer: 7)
for a second GRPO group. A gold label says whether a step equals the gold chain's step at its place
(`arithmetic.step_labels`): anything after the Answer line is wrong, an unparsable line is wrong.
"""

from __future__ import annotations

import pytest

from pipeline.advantages import extend_last_step, process_advantages
from pipeline.config import ConfigError
from pipeline.loading import config_from_dict
from pipeline.grpo_trainer import completion_steps
from pipeline.problems import GSM8K, EmbeddedArithmetic, Problem
from pipeline.problems.arithmetic import format_prompt, format_solution
from pipeline.rewards import reward_models_needed
from pipeline.scorers import GoldStepScorer
from pipeline.steps import scored_step_ends
from pipeline.tracking import flatten
from tests.helpers import SIZES, mini_config, run_grpo
from tests.tokenizer_cases import KINDS, PROMPT, PROMPT_B, encode, policy_and_prm, tokenizer_of

ARITH = EmbeddedArithmetic(num_train=20, num_test=5)


def problem(pid: str, start: int, ops: list[tuple[str, int]]) -> Problem:
    from pipeline.problems.arithmetic import chain_values

    return Problem(pid, format_prompt(start, ops), str(chain_values(start, ops)[-1]), format_solution(start, ops))


A = problem("a", 7, [("+", 5), ("*", 3), ("-", 4)])
B = problem("b", 9, [("-", 2)])

# Awkward completions of A with their gold labels, worked out by hand (one per non-blank line; a blank
# completion: one label 0, read where a PRM reads it, at its last character).
AWKWARD = [
    ("7+5=12\n12*3=36\n36-4=32\nAnswer: 32", [1, 1, 1, 1]),  # the gold solution, no final newline
    ("7+5=12\n\n\n12*3=36  \n36-4=32 \nAnswer: 32\n\n", [1, 1, 1, 1]),  # blank lines, trailing spaces
    ("7+5=12\n12*3=35\n", [1, 0]),  # no Answer line; a slip
    ("7+5=12\n12*3=36\n36-4=32\nAnswer: 32\nAnswer: 32", [1, 1, 1, 1, 0]),  # a line after the Answer line
    ("7 + 5 = 12", [1]),  # one step, spaces inside, no newline at the end
    ("hello\n7+5=12\n", [0, 0]),  # an unparsable first step, then the first step in second place
    ("", [0]),  # empty: no step, one score
    ("  \n \n ", [0]),  # only whitespace: the same
]


def oracle() -> GoldStepScorer:
    return GoldStepScorer(ARITH, {A.prompt: A, B.prompt: B})


# --- config ------------------------------------------------------------------------------------------------


def error_of(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, check_trl=False)
    return str(info.value)


def test_oracle_is_off_by_default_and_loads_for_process_supervision_on_the_embedded_set():
    assert config_from_dict({}, check_trl=False).reward_model.oracle is None
    cfg = config_from_dict({"reward_model": {"oracle": "gold"}}, check_trl=False)
    assert (cfg.reward_model.oracle, cfg.supervision.mode, cfg.problems.kind) == ("gold", "process", "arithmetic")
    assert flatten(cfg.model_dump(mode="json"))["reward_model.oracle"] == "gold"  # the parent run's MLflow param
    # The GRPO phase loads no PRM then; an ORM reward still needs its ORM (there is none in process mode).
    assert reward_models_needed(cfg) == {}
    assert reward_models_needed(config_from_dict({}, check_trl=False)) == {"prm": "process supervision"}


@pytest.mark.parametrize("data, says", [
    ({"problems": {"kind": "gsm8k", "gsm8k": {"hub_name": "openai/gsm8k"}}},
     "needs gold step labels, which problems.kind 'gsm8k' does not have (kinds with them: arithmetic)"),
    ({"supervision": {"mode": "outcome"}}, "which only supervision.mode 'process' or 'hybrid' uses, not 'outcome'"),
    ({"supervision": {"mode": "rft"}}, "which only supervision.mode 'process' or 'hybrid' uses, not 'rft'"),
])
def test_oracle_refused_where_there_are_no_gold_labels_or_no_step_rewards(data, says):
    message = error_of({**data, "reward_model": {"oracle": "gold"}})
    assert message.startswith("reward_model.oracle: 'gold' ") and says in message, message
    assert len(message.splitlines()) == 1


def test_oracle_value_other_than_gold_refused():
    assert error_of({"reward_model": {"oracle": "silver"}}).startswith("reward_model.oracle: ")


# --- the scorer ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_oracle_labels_are_gold_and_one_per_step_the_trainer_locates(kind):
    """On each tokenizer the trainer finds one step end per label (before merging steps on one token)."""
    tok, scorer = tokenizer_of(kind), oracle()
    for text, want in AWKWARD:
        assert scorer.step_scores([A.prompt], [text]) == [want], text
        if text.strip():
            assert want == ARITH.gold_step_labels(text, A), text
        # What the trainer hands the scorer: the completion's ids decoded (SentencePiece's decoder may drop a
        # leading space), and the step ends it locates on those ids.
        ids = encode(tok, text) + [tok.eos_token_id]
        steps = completion_steps(tok, ids, len(ids))
        (labels,) = scorer.step_scores([A.prompt], [steps.text])
        assert labels == want and len(steps.ends) == len(labels), (kind, text, steps)


def test_oracle_finds_each_problem_by_its_prompt_and_refuses_an_unknown_one():
    assert oracle().step_scores([A.prompt, B.prompt], ["9-2=7\nAnswer: 7", "9-2=7\nAnswer: 7"]) == [[0, 0], [1, 1]]
    with pytest.raises(ValueError, match=r"oracle PRM: no problem has the prompt '5 \+1\\n' \(not among the round"):
        oracle().step_scores(["5 +1\n"], ["5+1=6"])


def test_oracle_from_the_rounds_rows_and_its_refusals():
    p = ARITH.train[3]
    scorer = GoldStepScorer.from_rows(ARITH, [{"prompt_text": "rendered:" + p.prompt, "prompt_id": p.id}])
    assert scorer.step_scores(["rendered:" + p.prompt], [p.solution]) == [[1.0] * len(p.solution.splitlines())]
    with pytest.raises(ValueError, match=r"prompt_id 'nope': not a training problem of arithmetic"):
        GoldStepScorer.from_rows(ARITH, [{"prompt_text": "x", "prompt_id": "nope"}])
    q = ARITH.train[4]
    with pytest.raises(ValueError, match=rf"prompt_id '{q.id}' and '{p.id}' have the same prompt text"):
        GoldStepScorer.from_rows(ARITH, [{"prompt_text": "x", "prompt_id": p.id}, {"prompt_text": "x", "prompt_id": q.id}])
    gsm = GSM8K([Problem("g0", "Q?\n", "1", "Answer: 1")], [Problem("g1", "R?\n", "2", "Answer: 2")])
    with pytest.raises(ValueError, match=r"gsm8k: has no gold step labels, so it cannot be the oracle PRM"):
        GoldStepScorer(gsm, {})


# --- GRPO with the oracle ------------------------------------------------------------------------------------

# (completion, finished with an eos, its gold labels by hand); the first four are group A, the rest group B.
ROLLOUT = [
    ("7+5=12\n12*3=36\n36-4=32\nAnswer: 32", True, [1, 1, 1, 1]),
    ("7+5=12\n12*3=35\n35-4=31\nAnswer: 31", True, [1, 0, 0, 0]),  # a slip carried forward
    ("", True, [0]),  # only the eos
    ("7+5=12\n\n12*3=36  \nAnswer: 36\nAnswer: 32", True, [1, 1, 0, 1]),  # an early Answer, then the right one
    ("9-2=7\nAnswer: 7", True, [1, 1]),
    ("9-2=6\nAnswer: 6", True, [0, 0]),
    ("9-2=7\nAnswer: 7\n", True, [1, 1]),
    ("9-2=7\nAnswer: 7", False, []),  # cut (no eos): TRL masks it, so it has no steps
]


def test_grpo_step_with_the_oracle_uses_the_gold_labels_advantages(tmp_path):
    """A real ProcessGRPOTrainer step on designed completions (char tokenizer: token k is character k)."""

    tok = tokenizer_of("char")
    rows = [encode(tok, text) + ([tok.eos_token_id] if done else []) for text, done, _ in ROLLOUT]
    scorer = GoldStepScorer(ARITH, {PROMPT: A, PROMPT_B: B})  # the trainer's prompt texts -> their problems
    run = run_grpo(tok, policy_and_prm(tok, tmp_path) / "policy", tmp_path / "grpo", rows, "process", scorer)
    adv, lengths = run["advantages"], run["mask"].sum(1).tolist()  # (B, T), in ROLLOUT's order
    assert lengths == [len(r) if done else 0 for r, (_, done, _) in zip(rows, ROLLOUT)]
    # The reference: the hand labels at the step ends (one token per character: the character index; a
    # blank completion's one step on its eos), the eos carrying the last step's reward.
    labels = [[float(v) for v in want] for _, _, want in ROLLOUT]
    ends = [[e if e >= 0 else len(r) - 1 for e in scored_step_ends(text)] if done else []
            for r, (text, done, _) in zip(rows, ROLLOUT)]
    want = process_advantages(labels, extend_last_step(ends, lengths), adv.shape[1], 4, "group")
    assert adv.tolist() == [pytest.approx(w, abs=1e-6) for w in want.tolist()]
    # Credit follows the gold labels: the right solution's tokens above the slipped one's, from the slip on.
    assert adv[0, 0] > adv[1, 0] and adv[1, 2] > adv[1, 10]
    logged = next(h for h in run["logs"] if "process/step_reward_mean" in h)
    flat = [v for row in labels for v in row]
    assert logged["process/step_reward_mean"] == pytest.approx(sum(flat) / len(flat), abs=1e-6)


def test_run_policy_phase_with_the_oracle_needs_no_prm(tmp_path, tiny_dirs, monkeypatch):
    """The phase trains without a PRM path; every completion's step rewards are its problem's gold labels."""
    from pipeline.policy import run_policy_phase

    seen = []
    original = GoldStepScorer.step_scores

    def recording(self, prompts, completions):  # a spy: the oracle labels as it would, the inputs kept
        out = original(self, prompts, completions)
        seen.extend(zip(prompts, completions, out))
        return out

    monkeypatch.setattr(GoldStepScorer, "step_scores", recording)
    cfg = config_from_dict(mini_config(
        tmp_path, policy={"tiny": dict(SIZES["tiny"])}, reward_model={"oracle": "gold"},
        supervision={"prompts_per_round": 4},
        grpo={"max_steps": 1, "per_device_train_batch_size": 4, "num_generations": 2, "max_completion_length": 12},
    ), check_trl=False)
    ps = EmbeddedArithmetic(num_train=20, num_test=5)
    res = run_policy_phase(cfg, ps, tiny_dirs / "policy", tmp_path / "round-001" / "policy", 1, reward_models=None)
    assert (res.policy_path / "config.json").is_file()
    by_prompt = {p.prompt: p for p in ps.train}  # plain prompts: the text scored after is the problem's prompt
    assert len(seen) == 4
    for prompt, completion, labels in seen:
        want = ps.gold_step_labels(completion, by_prompt[prompt]) if completion.strip() else [0]
        assert labels == want


def test_oracle_also_feeds_hybrid_supervision_without_a_prm():
    cfg = config_from_dict({"supervision": {"mode": "hybrid"}, "reward_model": {"oracle": "gold"}}, check_trl=False)
    assert cfg.reward_model.oracle == "gold" and reward_models_needed(cfg) == {}
