"""Online Monte-Carlo step values (VinePPO, Kazemnejad et al., arXiv 2410.01679): `reward_model.oracle: mc`.

VinePPO values each step prefix of a sampled output by K fresh completions from it under the current policy:
V(prefix) is the share of them the verifier accepts. No learned value model: these are the values a PRM trained on
Math-Shepherd's soft labels learns to imitate, measured on the batch itself at the price of K rollouts a step. They
stand in for a PRM's step scores in process and hybrid mode (`policy.scored_steps`), so every credit rule takes them;
the study runs them under `process_reward: progress` with PAV's fixed anchors.

Prefixes, rollouts and verdicts are the collection's (`mc_labels.make_request`, `label_exhaustive`, `success_rate`):
a prefix is cut from the policy's own tokens and the rollouts go on from those ids; a prefix that already states an
answer is settled by the verifier, without rollouts. The last step's value is the output's own verdict, exact (the
output ended there), so it costs no rollout; under progress credit it is V_K, the outcome, anyway. The trainer
(`policy.ProcessGRPOTrainer._rollouts`) supplies the completer: its live model, sampled as GRPO samples, seeded by
the run's seed, the step and the process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pipeline.mc_labels import Completer, label_exhaustive, make_request
from pipeline.problems.base import Problem, ProblemSet
from pipeline.scorers import problems_by_prompt


class McStepScorer:
    """Step values by online Monte-Carlo rollouts of the policy being trained: one value per step a PRM would score
    (`steps.scored_step_ends`; a blank completion: one, its verdict), so the trainer credits them as a PRM's.

    Args:
        problem_set: whose verifier judges the rollouts (`is_correct`) and splits the steps.
        problems: prompt text -> the problem it states, for every prompt the trainer will score after (`from_rows`).
        tokenizer: the policy's: prefixes are cut from its ids, the prompts' ids are its encoding (as TRL's).
        rollouts: K, the completions sampled from each unsettled prefix (`reward_model.mc_rollouts`).
        batch_size: sequences per `generate` call of the rollouts (`collect.batch_size`).
    """

    rolls_out = True  # the trainer hands it the completions' ids and a completer (`policy.scored_steps`)

    def __init__(self, problem_set: ProblemSet, problems: Mapping[str, Problem], tokenizer, rollouts: int,
                 batch_size: int = 64):
        if rollouts < 1:
            raise ValueError(f"online MC needs at least one rollout a prefix, got {rollouts}")
        self.problem_set, self.problems, self.tokenizer = problem_set, dict(problems), tokenizer
        self.rollouts, self.batch_size = rollouts, batch_size
        self.separator = problem_set.step_separator

    @classmethod
    def from_rows(cls, problem_set: ProblemSet, rows: Iterable[Mapping], tokenizer, rollouts: int,
                  batch_size: int = 64) -> McStepScorer:
        """From GRPO's dataset (`policy.round_prompts`): each row's `prompt_text` and training problem `prompt_id`."""
        return cls(problem_set, problems_by_prompt(problem_set, rows), tokenizer, rollouts, batch_size)

    def step_values(self, prompts: Sequence[str], completion_ids: Sequence[Sequence[int]],
                    completer: Completer) -> list[list[float]]:
        """Each completion's step values: its unsettled prefixes' rollouts all go to `completer` in one call.

        Args:
            prompts: the text each completion continued (the problem is found by it).
            completion_ids: each completion's ids as sampled (a trailing eos adds no text, so no step).
            completer: (continuations, K) -> K whole completions of each (`mc_labels.Completer`).
        """
        reqs, outcomes = [], []
        for prompt, ids in zip(prompts, completion_ids):
            problem = self.problems.get(prompt)
            if problem is None:
                raise ValueError(f"online MC: no problem has the prompt {prompt[:60]!r} (not among the round's prompts)")
            req = make_request(self.problem_set, problem, self.tokenizer, list(ids), prompt)
            outcome = self.problem_set.is_correct(self.tokenizer.decode(list(ids), skip_special_tokens=True), problem)
            if req.settled:  # the last step's value is the output's verdict: no rollout from a finished output
                req.settled[-1] = outcome
            reqs.append(req)
            outcomes.append(float(outcome))
        labels = label_exhaustive(self.problem_set, completer, reqs, self.rollouts)
        return [lab.se or [o] for lab, o in zip(labels, outcomes)]  # a blank completion: one value, its verdict
