"""Online Monte-Carlo step values (`reward_model.oracle: mc`, issue 47 point 5, VinePPO): each step's value is the
share of K completions from its prefix, by the policy being trained, that the verifier accepts.

The problem: "7 +5 *3 -4" (7+5=12, 12*3=36, 36-4=32, Answer: 32). The completer of the worked example is a
designed function (the policy in the pipeline): it reads each prefix back from its ids and writes K endings whose
verdicts are fixed by hand, so every value below is a count of accepted endings over K.
"""

from __future__ import annotations

import re

import pytest
import torch
from transformers import TrainerCallback

from models import char_tokenizer
from pipeline.config import ConfigError
from pipeline.generation import Continuation
from pipeline.loading import config_from_dict
from pipeline.online_mc import McStepScorer
from pipeline.grpo_trainer import mc_seed
from pipeline.policy import value_source
from pipeline.problems import EmbeddedArithmetic, Problem
from pipeline.problems.arithmetic import format_prompt, format_solution
from pipeline.rewards import reward_models_needed
from tests.helpers import ROOT, SIZES, mini_config

ARITH = EmbeddedArithmetic(num_train=20, num_test=5)
A = Problem("a", format_prompt(7, [("+", 5), ("*", 3), ("-", 4)]), "32",
            format_solution(7, [("+", 5), ("*", 3), ("-", 4)]))
TOK = char_tokenizer()
K = 4

# prefix text -> the verdicts of its K rollouts, by hand: how many of 4 endings reach "Answer: 32".
VERDICTS = {
    "7+5=12\n": [True, True, True, False],  # 3 of 4
    "7+5=12\n12*3=35\n": [False, True, False, False],  # 1 of 4: a slip, rarely undone
    "7+5=12\n12*3=35\n35-4=31\n": [False] * 4,
    "7+5=12\n12*3=36\n": [True] * 4,
    "7+5=12\n12*3=36\n36-4=32\n": [True, True, False, True],
}


class Designed:
    """The completer: K whole completions of each prefix (its ids read back), ending in the answer its verdicts say.
    Records each call's prefixes and K."""

    def __init__(self):
        self.calls: list[tuple[list[Continuation], int]] = []

    def __call__(self, prefixes: list[Continuation], n: int) -> list[list[str]]:
        self.calls.append((prefixes, n))
        out = []
        for c in prefixes:
            prefix = TOK.decode(list(c.completion_ids))
            out.append([prefix + ("Answer: 32" if ok else "Answer: 0") for ok in VERDICTS[prefix][:n]])
        return out


def scorer(rollouts: int = K) -> McStepScorer:
    return McStepScorer(ARITH, {A.prompt: A}, TOK, rollouts)


def test_a_step_value_is_the_mean_verdict_of_the_rollouts_from_its_prefix_and_the_last_is_the_outcome():
    completions = [
        "7+5=12\n12*3=35\n35-4=31\nAnswer: 31",  # a slip at step 2, carried forward: wrong
        "7+5=12\n12*3=36\n36-4=32\nAnswer: 32",  # right
        "7+5=12\nAnswer: 12\n12*3=36",  # an early (wrong) answer: its prefixes from there are settled by the verifier
        "",  # blank: no step, one value, its verdict
    ]
    ids = [TOK(c).input_ids + [TOK.eos_token_id] for c in completions]  # as sampled: the eos adds no step
    completer = Designed()
    values = scorer().step_values([A.prompt] * 4, ids, completer)
    assert values == [
        [3 / 4, 1 / 4, 0 / 4, 0.0],  # 3, 1, 0 of 4 accepted; the last step: the output's verdict (31: wrong)
        [3 / 4, 4 / 4, 3 / 4, 1.0],  # the last step: right
        [3 / 4, 0.0, 0.0],  # "Answer: 12" stated, settled wrong without rollouts; the last is the verdict
        [0.0],
    ]
    # One batched call: every unsettled prefix of every completion (3 + 3 + 1), none of a last step, K each.
    ((prefixes, n),) = completer.calls
    assert n == K and len(prefixes) == 7
    # The rollouts go on from the policy's own ids: the prompt's, then the completion's up to the step's end.
    assert all(list(c.prompt_ids) == TOK(A.prompt).input_ids for c in prefixes)
    assert [list(c.completion_ids) for c in prefixes[:3]] == [ids[0][:7], ids[0][:15], ids[0][:23]]  # 7, 8, 8 characters


def test_the_scorer_refuses_an_unknown_prompt_and_no_rollouts():
    with pytest.raises(ValueError, match=r"online MC: no problem has the prompt '5 \+1\\n'"):
        scorer().step_values(["5 +1\n"], [TOK("5+1=6").input_ids], Designed())
    with pytest.raises(ValueError, match="at least one rollout"):
        scorer(0)


def test_mc_seed_depends_on_the_seed_the_step_and_the_process_only():
    seeds = {mc_seed(s, step, p) for s in range(3) for step in range(50) for p in range(4)}
    assert len(seeds) == 3 * 50 * 4


def vineppo_reference(text: str, values: list[float]) -> list[float]:
    """VinePPO's token advantages by a plain loop (arXiv 2410.01679, §4; McGill-NLP/VinePPO's
    `_compute_step_advantages`): with V(s_0) .. V(s_K) the values before the first step and after each, step k's
    advantage is V(s_k) - V(s_(k-1)), on each of its tokens (one a character here); the eos gets the last step's."""
    steps = re.findall(r"[^\n]*\n|[^\n]+", text)  # a line a step, its newline in it
    assert len(values) == len(steps) + 1
    advantages = [after - before for before, after in zip(values, values[1:])]
    return [a for a, step in zip(advantages, steps) for _ in step] + [advantages[-1]]


def test_the_vineppo_arm_trains_on_the_mc_advantage_alone_and_mc_progress_adds_the_outcome():
    """Issue 57, point 3: the arm `vineppo` gives every token of step k VinePPO's advantage V(s_k) - V(s_(k-1)), with
    V(s_0) the prompt's value (the group's other outputs' mean outcome: an MC estimate of the empty prefix by the same
    policy), the online MC values between, and the verifier's outcome after the last step; no outcome term, nothing
    normalised (TRL's scale_rewards reaches none of it). `mc-progress` differs in its mode alone, and adds TRL's
    group-normalised outcome advantage to the same.

    Worked example, a group of 3 (the completions of the first test, less the blank), outcomes [0, 1, 0], so
    V(s_0) = [1/2, 0, 1/2], the leave-one-out means; the values from VERDICTS' counts of 4:
      the slip:        V = 1/2, 3/4, 1/4, 0, 0 (wrong)         A = +1/4, -1/2, -1/4, 0
      right:           V = 0, 3/4, 1, 3/4, 1 (right)            A = +3/4, +1/4, -1/4, +1/4
      an early answer: V = 1/2, 3/4, 0 (settled: 12), 0 (wrong) A = +1/4, -3/4, 0
    """
    from experiments.credit_arms import ARMS
    from pipeline.advantages import extend_last_step, outcome_advantages
    from pipeline.grpo_trainer import completion_steps, scored_steps
    from pipeline.loading import load_config
    from pipeline.modes import MODES, AdvantageInputs
    from pipeline.step_rewards import PROCESS_REWARDS, ProcessInputs

    assert set(ARMS["vineppo"]) ^ set(ARMS["mc-progress"]) == {"supervision.mode=process", "supervision.mode=hybrid"}
    texts = ["7+5=12\n12*3=35\n35-4=31\nAnswer: 31", "7+5=12\n12*3=36\n36-4=32\nAnswer: 32",
             "7+5=12\nAnswer: 12\n12*3=36"]
    values = [[1 / 2, 3 / 4, 1 / 4, 0.0, 0.0], [0.0, 3 / 4, 1.0, 3 / 4, 1.0], [1 / 2, 3 / 4, 0.0, 0.0]]
    ids = [TOK(t).input_ids + [TOK.eos_token_id] for t in texts]
    lengths, verifier = [len(x) for x in ids], torch.tensor([0.0, 1.0, 0.0])
    assert lengths == [len(t) + 1 for t in texts]  # a token a character, and the eos
    # As ProcessGRPOTrainer._step_advantages: the steps on the policy's tokens, the MC values, the eos in the last step.
    rows = [completion_steps(TOK, x, n, ARITH.step_separator) for x, n in zip(ids, lengths)]
    steps = scored_steps(scorer(), [A.prompt] * 3, rows, Designed())
    ends = extend_last_step([e for _, e in steps], lengths)

    def advantages(arm: str, scale: str = "group"):
        s = load_config(ROOT / "configs" / "quickstart.yaml", ARMS[arm]).supervision
        process, _ = PROCESS_REWARDS[s.process_reward].advantages(
            ProcessInputs([v for v, _ in steps], ends, None, verifier, lengths, 3, max(lengths), scale, s))
        mode = MODES[s.mode]
        outcome = outcome_advantages(verifier, 3, scale) if mode.trl_advantage else None
        return mode.advantages(AdvantageInputs(outcome, process, verifier[:, None], lengths, s, group_size=3,
                                               scale=scale))[0]  # (B, T)

    for scale in ("group", "batch", "none"):
        vine = advantages("vineppo", scale)
        for i, (text, v) in enumerate(zip(texts, values)):
            assert vine[i, : lengths[i]].tolist() == pytest.approx(vineppo_reference(text, v), abs=1e-7), (scale, i)
    hybrid, outcome = advantages("mc-progress"), outcome_advantages(verifier, 3)  # outcome: [-0.577, 1.155, -0.577]
    for i, n in enumerate(lengths):
        assert hybrid[i, :n].tolist() == pytest.approx((vine[i, :n] + outcome[i]).tolist(), abs=1e-6)


# --- config ------------------------------------------------------------------------------------------------


def error_of(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, check_trl=False)
    return str(info.value)


def test_the_mc_oracle_loads_in_the_modes_with_step_rewards_on_any_problem_set():
    cfg = config_from_dict({"reward_model": {"oracle": "mc", "mc_rollouts": 8}}, check_trl=False)
    assert (cfg.reward_model.oracle, cfg.reward_model.mc_rollouts, value_source(cfg)) == ("mc", 8, "mc:8")
    assert reward_models_needed(cfg) == {}  # no PRM loaded for GRPO
    hybrid = {"supervision": {"mode": "hybrid", "process_reward": "progress", "process_credit": "step"}}
    assert config_from_dict({**hybrid, "reward_model": {"oracle": "mc"}}, check_trl=False).reward_model.mc_rollouts == 4
    # No gold step labels needed: the verifier judges the rollouts.
    gsm = {"problems": {"kind": "gsm8k", "gsm8k": {"hub_name": "openai/gsm8k"}}, "reward_model": {"oracle": "mc"}}
    assert config_from_dict(gsm, check_trl=False).reward_model.oracle == "mc"


@pytest.mark.parametrize("data, says", [
    ({"reward_model": {"oracle": "mc", "mc_rollouts": 0}}, "reward_model.mc_rollouts: "),
    ({"reward_model": {"mc_rollouts": 8}}, "reward_model.mc_rollouts: 8 is read only with reward_model.oracle: mc"),
    ({"reward_model": {"oracle": "gold", "mc_rollouts": 2}}, "reward_model.mc_rollouts: 2 is read only with"),
    ({"supervision": {"mode": "outcome"}, "reward_model": {"oracle": "mc"}},
     "reward_model.oracle: 'mc' replaces the PRM's step rewards, which only supervision.mode 'process' or 'hybrid'"),
    ({"supervision": {"process_reward": "prime", "process_reward_model": "implicit"}, "collect": {"rollouts_per_step": 0},
      "reward_model": {"kinds": ["implicit"], "oracle": "mc"}},
     "reward_model.oracle: 'mc' gives step values, and process_reward: prime needs the implicit PRM's token rewards"),
])
def test_the_mc_fields_refused_where_nothing_would_read_them(data, says):
    message = error_of(data)
    assert says in message and len(message.splitlines()) == 1, message


# --- GRPO with online MC --------------------------------------------------------------------------------------


class Logs(TrainerCallback):
    """The trainer's logs, as they are logged."""

    def __init__(self):
        self.history: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.history.append(dict(logs or {}))


class Spy:
    """Records each valuation's values and each rollout call (its prefixes, what it wrote, the trainer's training
    flag and CPU RNG state before and after), the real methods doing the work."""

    def __init__(self, monkeypatch):
        from pipeline.grpo_trainer import ProcessGRPOTrainer

        self.values, self.rollouts = [], []
        values, rollouts = McStepScorer.step_values, ProcessGRPOTrainer._rollouts

        def valued(scorer, prompts, completion_ids, completer):
            self.values[-1].append(out := values(scorer, prompts, completion_ids, completer))
            return out

        def rolled(trainer, prefixes, n, **kwargs):
            before = (trainer.model.training, torch.get_rng_state())
            out = rollouts(trainer, prefixes, n, **kwargs)
            self.rollouts[-1].append(([c.completion_ids for c in prefixes], n, out, before[0], trainer.model.training,
                                      torch.equal(before[1], torch.get_rng_state())))
            return out

        monkeypatch.setattr(McStepScorer, "step_values", valued)
        monkeypatch.setattr(ProcessGRPOTrainer, "_rollouts", rolled)

    def run(self, tmp_path, tiny_dirs, name: str) -> list[dict]:
        """Two GRPO steps of the tiny policy, hybrid mode, progress credit on online MC values (K = 3): the logs; the
        values and rollouts recorded under a new entry."""
        from pipeline.policy import run_policy_phase

        self.values.append([])
        self.rollouts.append([])
        logs = Logs()
        cfg = config_from_dict(mini_config(
            tmp_path / name, policy={"tiny": dict(SIZES["tiny"])}, reward_model={"oracle": "mc", "mc_rollouts": 3},
            supervision={"prompts_per_round": 4, "mode": "hybrid", "process_reward": "progress",
                         "process_credit": "step"},
            grpo={"max_steps": 2, "per_device_train_batch_size": 4, "num_generations": 2, "max_completion_length": 12,
                  "logging_steps": 1},
        ), check_trl=False)
        out = tmp_path / name / "round-001" / "policy"
        assert (run_policy_phase(cfg, ARITH, tiny_dirs / "policy", out, 1, reward_models=None, callbacks=[logs])
                .policy_path / "config.json").is_file()
        return logs.history


def test_grpo_with_online_mc_values_runs_logs_its_cost_and_reproduces_with_the_seed(tmp_path, tiny_dirs, monkeypatch):
    spy = Spy(monkeypatch)
    logs = spy.run(tmp_path, tiny_dirs, "a")
    assert len(spy.values[0]) == 2  # one valuation a step, of its 4 completions
    for values in spy.values[0]:
        assert len(values) == 4 and all(v and all(0.0 <= x <= 1.0 for x in v) for v in values)
    steps = [h for h in logs if "process/mc_tokens" in h]
    assert len(steps) == 2 and all(h["process/mc_seconds"] > 0 for h in steps)
    # Logged every step, 0 where no prefix needed rollouts (no line before the last one); some did here.
    assert sum(h["process/mc_tokens"] for h in steps) > 0 and spy.rollouts[0]
    for prefixes, n, texts, was_training, is_training, rng_kept in spy.rollouts[0]:
        # K sampled endings of each prefix, written on from its ids; the policy back in training mode after, and
        # the trainer's RNG as it was (the rollouts draw from their own seed).
        assert n == 3 and len(texts) == len(prefixes) and all(len(t) == 3 for t in texts)
        assert was_training and is_training and rng_kept
        decoded = [TOK.decode(list(ids), skip_special_tokens=True) for ids in prefixes]
        assert all(t.startswith(d) for d, ts in zip(decoded, texts) for t in ts)
    # Same config, same seed: the same prefixes, rollouts and values (the rollouts' seed is the run's, the step's and
    # the process's, `mc_seed`, never the trainer's RNG, which a resumed run restores elsewhere).
    spy.run(tmp_path, tiny_dirs, "b")
    assert spy.rollouts[1] == spy.rollouts[0] and spy.values[1] == spy.values[0]
