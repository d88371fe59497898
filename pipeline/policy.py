"""The GRPO phase: TRL's GRPOTrainer with outcome supervision, process supervision from a PRM, hybrid, or Online RFT.

Process supervision (DeepSeekMath §4.1.3) needs per-token advantages. TRL's `_compute_loss` accepts
`(B, T)` advantages from a subclass, so `ProcessGRPOTrainer` overrides only
`_generate_and_score_completions`: TRL generates and scores as usual, then the PRM scores every step of
the completions TRL decoded (steps located on the policy's own tokens by `steps.step_token_ends`) and the
advantages are replaced by `process_advantages` (TRL's `scale_rewards` applied to the step rewards, the eos
credited with the last step's reward, a completion TRL masked left without steps; sum or min credit). Hybrid
adds them, weighted, to TRL's own outcome advantages (`hybrid_advantages`). Online RFT (§5.2.1)
replaces them the same way, by the verifier's 0/1 reward (`rft_advantages`), which TRL's `scale_rewards`
cannot express (it always subtracts the group mean). Everything else (loss types, clipping, KL) is TRL's.
"""

from __future__ import annotations

import functools
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import Dataset
from trl import GRPOTrainer

from models import save_model
from models.factories import load_tokenizer, lora_config
from pipeline.advantages import (
    advantage_stats,
    centred_advantages,
    extend_last_step,
    prime_advantages,
    process_advantages,
    progress_advantages,
    progress_anchors,
    uniform_group_means,
)
from pipeline.config import PipelineConfig, SupervisionConfig
from pipeline.generation import Continuation, sample
from pipeline.modes import AdvantageInputs, supervision_mode
from pipeline.online_mc import McStepScorer
from pipeline.passthrough import grpo_config
from pipeline.problems import ProblemSet
from pipeline.prompts import PromptRenderer, renderer_from_config
from pipeline.resume import fingerprint, train_resumable
from pipeline.reward_model import load_scorer
from pipeline.rewards import SolutionScorer, active_rewards, build_reward_func, reward_models_needed
from pipeline.rm_kinds.loading import kind_name
from pipeline.rundir import scratch_dir
from pipeline.scorers import GoldStepScorer, PrmScorer
from pipeline.steps import STEP_SEPARATOR, char_to_token_ends, step_token_ends, token_spans


@dataclass
class CompletionSteps:
    """One completion of a GRPO batch as process supervision sees it."""

    text: str  # its ids decoded once: what TRL's reward functions and the PRM read
    ends: list[int]  # index, in its ids, of the token holding each step's end (`steps.step_token_ends`)
    length: int  # its tokens in the loss, eos included; 0 when TRL masked it out (no steps then)
    ids: list[int] = field(default_factory=list, repr=False)  # its ids[:length]: what online MC rollouts go on from


def completion_steps(tokenizer, ids: Sequence[int], length: int, separator: str = STEP_SEPARATOR) -> CompletionSteps:
    """The text and step-end tokens of a generated completion: `ids[:length]`, the rest being padding.

    One entry in `ends` per score `PrmScorer` reads from `text` (steps ending on one token repeat it, see
    `dedupe_steps`). A completion whose text is empty (only the eos) is one step on its last token. A
    completion of length 0 (`grpo.mask_truncated_completions` zeroed its mask) has no steps: it is out of
    the loss, so it stays out of its group's statistics too. `separator`: the problem set's step separator.

    >>> from models import char_tokenizer
    >>> tok = char_tokenizer()
    >>> completion_steps(tok, tok("1=1\\nA\\n").input_ids + [tok.eos_token_id, tok.pad_token_id], 7)
    CompletionSteps(text='1=1\\nA\\n', ends=[3, 5], length=7)
    >>> completion_steps(tok, [tok.eos_token_id], 1), completion_steps(tok, tok("1=1").input_ids, 0)
    (CompletionSteps(text='', ends=[0], length=1), CompletionSteps(text='', ends=[], length=0))
    """
    if length == 0:
        return CompletionSteps("", [], 0)
    text, spans = token_spans(tokenizer, list(ids[:length]))
    ends = step_token_ends(spans, text, separator=separator) if text else [length - 1]
    return CompletionSteps(text, ends, length, list(ids[:length]))


def dedupe_steps(scores: list[float], ends: list[int]) -> tuple[list[float], list[int]]:
    """One step per token: when steps end on the same token (a multi-character token), the last one's score wins.

    >>> dedupe_steps([0.1, 0.9, 0.5], [3, 3, 7])
    ([0.9, 0.5], [3, 7])
    """
    kept: dict[int, float] = {}
    for s, e in zip(scores, ends):
        kept[e] = s
    return list(kept.values()), list(kept)


def scored_steps(scorer, prompts: Sequence[str], rows: Sequence[CompletionSteps],
                 completer=None) -> list[tuple[list[float], list[int]]]:
    """Each completion's (step scores, step-end tokens) from `scorer` (a PRM, the gold labels, or online MC values),
    one step per token (`dedupe_steps`); a completion out of the loss (length 0) is not scored and has no steps.

    A scorer that rolls out (`online_mc.McStepScorer`) reads the completions' ids, never their text tokenized again,
    and samples through `completer` (the trainer's live policy); the others read the text."""
    live = [i for i, r in enumerate(rows) if r.length]
    texts = [prompts[i] for i in live]
    got = (scorer.step_values(texts, [rows[i].ids for i in live], completer) if getattr(scorer, "rolls_out", False)
           else scorer.step_scores(texts, [rows[i].text for i in live]))
    by_row = dict(zip(live, got))
    return [dedupe_steps(by_row[i], r.ends) if r.length else ([], []) for i, r in enumerate(rows)]


def placed_token_rewards(spans: Sequence[tuple[int, int]], char_ends: Sequence[int], rewards: Sequence[float],
                         length: int) -> list[float]:
    """A completion's token rewards, read by a scorer in its own tokenization, put on the policy's `length` tokens:
    each reward on the policy token holding the character its token ends on (`spans`: the text each policy token
    adds, `steps.token_spans`), summed where several land on one. With the policy's own tokenizer that is one
    reward per token; the eos adds no text, so it gets none.

    >>> placed_token_rewards([(0, 2), (2, 3), (3, 3)], [0, 1, 2], [0.5, 0.25, -1.0], 3)
    [0.75, -1.0, 0.0]
    """
    out = [0.0] * length
    if char_ends:
        for k, r in zip(char_to_token_ends(spans, char_ends), rewards):
            out[k] += r
    return out


def prompt_texts(inputs: list[dict], tokenizer, template_kwargs: dict | None = None) -> list[str]:
    """The text each GRPO input's completions continue, as the PRM reads it: the dataset's `prompt_text`
    (`round_prompts`), else the prompt itself, rendered as TRL renders it when it is a conversation."""
    from trl.data_utils import maybe_apply_chat_template

    return [x["prompt_text"] if "prompt_text" in x
            else maybe_apply_chat_template({"prompt": x["prompt"]}, tokenizer, **(template_kwargs or {}))["prompt"]
            for x in inputs]


def process_metrics(step_rewards: Sequence[Sequence[float]], group_size: int) -> dict[str, float]:
    """PRM step-reward figures of a batch; completions without steps (masked) are left out.

    >>> process_metrics([[0.5, 1.0], [], [1.0], [1.0]], 2)
    {'process/step_reward_mean': 0.875, 'process/steps_per_completion': 1.3333333333333333, 'process/frac_groups_zero_spread': 0.5}
    """
    flat = [v for s in step_rewards for v in s]
    live = sum(1 for s in step_rewards if s)
    spreads = []
    for g in range(0, len(step_rewards), group_size):
        values = [v for s in step_rewards[g : g + group_size] for v in s]
        spreads.append(max(values) - min(values) if values else 0.0)  # no steps at all: no signal either
    return {
        "process/step_reward_mean": sum(flat) / len(flat) if flat else float("nan"),
        "process/steps_per_completion": len(flat) / live if live else 0.0,
        "process/frac_groups_zero_spread": sum(s < 1e-6 for s in spreads) / len(spreads),
    }


class ProcessGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose advantages are made by its supervision mode (`pipeline.modes.MODES`): TRL's outcome
    advantages as they are (`outcome`), a PRM's step rewards (`process`), TRL's plus `process_weight` times those
    (`hybrid`), the verifier's 0/1 reward (`rft`, Online RFT: the first reward function must be the verifier), or
    a registered mode's.

    In every mode but outcome the statistics of the advantages used are logged (`<mode>/advantage_mean`, `_std`,
    `_min`, `_max`, over the tokens in the loss), with the mode's own figures (`hybrid/process_variance_share`),
    and TRL's completions table shows them (a completion's first-token advantage); TRL's own `reward`,
    `reward_std` stay the outcome rewards'.

    A step scorer with an `online_lr` (the implicit PRM with `reward_model.implicit.online_lr`, PRIME) first takes one
    update on each training batch's completions and verifier outcomes (`update`), then scores them.

    Args:
        prm_scorer: scores each step of `prompt + completion` (required in a mode with step rewards).
        supervision: the `supervision:` config section (its mode, credit, baseline and weight), or a mode's name
            with the settings below.
        process_credit, process_weight, process_baseline, process_centring, process_reward: with a mode's name,
            as `supervision.*`.
    """

    def __init__(self, *args, prm_scorer: PrmScorer | None = None, supervision: str | SupervisionConfig = "outcome",
                 process_credit: str = "sum", process_weight: float = 1.0, process_baseline: str = "group",
                 process_centring: str = "none", process_reward: str = "value", step_separator: str = STEP_SEPARATOR,
                 **kwargs):
        if isinstance(supervision, str):
            supervision = SupervisionConfig.model_construct(
                mode=supervision, process_credit=process_credit, process_weight=process_weight,
                process_baseline=process_baseline, process_centring=process_centring, process_reward=process_reward)
        self.mode = supervision_mode(supervision.mode)
        if self.mode.step_rewards and prm_scorer is None:
            raise ValueError(f"{supervision.mode} supervision needs a PRM (prm_scorer)")
        super().__init__(*args, **kwargs)
        self.prm_scorer, self.supervision, self.step_separator = prm_scorer, supervision, step_separator

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # Kept for the mode (rft reads the verifier's): TRL returns the rewards gathered over processes, (B_all, F).
        self._last_rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        return self._last_rewards

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        from accelerate.utils import gather_object

        ids = out["completion_ids"]  # (B, T)
        lengths = [int(n) for n in out["completion_mask"].sum(1).tolist()]  # 0 for a masked completion
        all_lengths = gather_object(lengths)  # a group's completions may sit on several processes
        if self.mode.advantages is None:  # TRL's own advantages: only their statistics are logged
            self._log_advantages(torch.tensor(gather_object(out["advantages"].tolist())), all_lengths, table=False)
            return out
        process = self._step_advantages(inputs, ids, lengths, all_lengths) if self.mode.step_rewards else None
        # TRL's outcome advantages, as outcome mode trains on them, are this process's rows: gather them in
        # process order, as the step scores were, before the mode combines them with the whole batch's.
        outcome = (torch.tensor(gather_object(out["advantages"].tolist()), dtype=torch.float32)  # (B_all,)
                   if self.mode.trl_advantage else None)
        adv, figures = self.mode.advantages(AdvantageInputs(outcome, process, self._last_rewards, all_lengths,
                                                            self.supervision))  # (B_all,) or (B_all, T')
        mode = "train" if self.model.training else "eval"
        for key, value in figures.items():
            self._metrics[mode][f"{self.supervision.mode}/{key}"].append(value)
        start = self.accelerator.process_index * len(inputs)
        local = adv[start : start + len(inputs)]
        out["advantages"] = (local[:, : ids.shape[1]] if local.dim() == 2 else local).to(ids.device)
        self._log_advantages(adv, all_lengths)
        return out

    def _step_advantages(self, inputs, ids, lengths: list[int], all_lengths: list[int]):
        """Score every step of this process's completions, gather the group, return (B_all, T') advantages."""
        from accelerate.utils import gather_object

        # One copy of the ids to the host (a row at a time was one device sync per completion on a GPU).
        host_ids = ids.tolist()
        rows = [completion_steps(self.processing_class, r, n, self.step_separator) for r, n in zip(host_ids, lengths)]
        prompts = prompt_texts(inputs, self.processing_class, self.chat_template_kwargs)
        verifier = self._last_rewards[:, 0].float().cpu()  # (B_all,) the verifier is reward column 0
        if getattr(self.prm_scorer, "online_lr", None) and self.model.training:  # PRIME: update, then score
            start = self.accelerator.process_index * len(inputs)  # this process's rows
            outcomes = verifier[start : start + len(inputs)].tolist()
            live = [(prompts[i], r.text, outcomes[i]) for i, r in enumerate(rows) if r.length]  # masked: out
            if live and (loss := self.prm_scorer.update(*zip(*live))) is not None:
                self._metrics["train"]["process/online_loss"].append(loss)  # the update is on: its loss shows it
        group_size = self.num_generations if self.model.training else self.num_generations_eval
        width = max([ids.shape[1], *all_lengths])
        s, mode = self.supervision, "train" if self.model.training else "eval"
        if s.process_reward == "prime":
            return self._prime_advantages(prompts, host_ids, lengths, verifier, all_lengths, group_size, width)
        steps = self._scored_steps(prompts, rows)  # a masked completion is not scored
        all_scores, all_ends = gather_object([s for s, _ in steps]), gather_object([e for _, e in steps])
        ends = extend_last_step(all_ends, all_lengths)  # the eos carries the last step's reward
        if s.process_reward == "progress":  # PAV's anchors: V_0 the others' mean outcome, V_K the outcome itself
            start, values = progress_anchors(all_scores, verifier.tolist(), group_size)
            adv = progress_advantages(values, ends, width, start, s.process_credit)
            # Where the verifier says nothing the process term should net ~0: a bias shows here first.
            for key, value in uniform_group_means(adv, all_lengths, verifier.tolist(), group_size).items():
                self._metrics[mode][f"process/progress_mean_{key}"].append(value)
        else:
            adv = process_advantages(all_scores, ends, width, group_size, self.args.scale_rewards, s.process_credit,
                                     s.process_baseline)
        adv = centred_advantages(adv, all_lengths, group_size, self.supervision.process_centring)
        for key, value in process_metrics(all_scores, group_size).items():
            self._metrics[mode][key].append(value)
        return adv

    def _scored_steps(self, prompts: list[str], rows: list[CompletionSteps]) -> list[tuple[list[float], list[int]]]:
        """`scored_steps` by the trainer's step scorer; online MC's cost logged every step (`process/mc_seconds`, the
        valuation's wall time, and `process/mc_tokens`, the tokens its rollouts generated: 0 where none was needed)."""
        if not getattr(self.prm_scorer, "rolls_out", False):
            return scored_steps(self.prm_scorer, prompts, rows)
        from trl.models import unwrap_model_for_generation

        start, spent = time.perf_counter(), [0]
        # Every process unwraps every step, rollouts or none: under ZeRO-3 the weights' gather is collective.
        with unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                         gather_deepspeed3_params=self.args.ds3_gather_for_generation) as model:
            steps = scored_steps(self.prm_scorer, prompts, rows,
                                 functools.partial(self._rollouts, model=model, spent=spent))
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["process/mc_seconds"].append(time.perf_counter() - start)
        self._metrics[mode]["process/mc_tokens"].append(float(spent[0]))
        return steps

    def _rollouts(self, prefixes: list[Continuation], n: int, model, spent: list[int]) -> list[list[str]]:
        """`n` whole completions of each step prefix by the live policy (`model`, unwrapped), for online MC values.

        Sampled as GRPO samples (its temperature and top_p, `max_completion_length` tokens in all: a longer one is
        cut there, as GRPO would have cut it), all prefixes in `batch_size` batches, eval mode and no grad
        (`generation.sample`), seeded by the run's seed, the step and the process (`mc_seed`: a resumed run draws the
        same); the trainer's own RNG streams are left as they were. Adds the tokens it generated to `spent[0]`.
        """
        limit, tok, device = self.max_completion_length, self.processing_class, self.accelerator.device
        room = max(1, limit - min(len(p.completion_ids) for p in prefixes))
        seed = mc_seed(self.args.seed, self.state.global_step, self.accelerator.process_index)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            out = sample(model, tok, prefixes, n, temperature=self.temperature, top_p=self.top_p, max_new_tokens=room,
                         batch_size=self.prm_scorer.batch_size, seed=seed)
        texts = [[t if len(ids) <= limit else tok.decode(ids[:limit], skip_special_tokens=True)
                  for t, ids in zip(row_texts, row_ids)] for row_texts, row_ids in zip(out.texts, out.ids)]
        spent[0] += out.total_tokens
        return texts

    def _prime_advantages(self, prompts, ids: list[list[int]], lengths: list[int], verifier, all_lengths: list[int],
                          group_size: int, width: int):
        """PRIME's (B_all, T') advantages (`prime_advantages`): the implicit PRM's token rewards of this process's
        completions, put on the policy's tokens and gathered, with the verifier's outcomes."""
        from accelerate.utils import gather_object

        live = [i for i, n in enumerate(lengths) if n]  # a masked completion is not scored: no rewards
        decoded = {i: token_spans(self.processing_class, ids[i][: lengths[i]]) for i in live}
        scored = self.prm_scorer.token_rewards([prompts[i] for i in live], [decoded[i][0] for i in live])
        placed = dict(zip(live, (placed_token_rewards(decoded[i][1], *r, lengths[i]) for i, r in zip(live, scored))))
        rows = gather_object([placed.get(i, []) for i in range(len(lengths))])
        rewards = torch.zeros(len(rows), width)  # (B_all, T')
        for i, row in enumerate(rows):
            rewards[i, : len(row)] = torch.tensor(row)
        s = self.supervision
        return prime_advantages(rewards, verifier, all_lengths, group_size, s.prime_process_coef, s.prime_outcome_coef)

    def _log_advantages(self, adv, all_lengths: list[int], table: bool = True) -> None:
        """The statistics of the advantages trained on (`advantage_stats`, every mode), and, where they replace
        TRL's (`table`), each completion's first-token advantage in TRL's completions table."""
        mode = "train" if self.model.training else "eval"
        for key, value in advantage_stats(adv, all_lengths).items():
            self._metrics[mode][f"{self.supervision.mode}/advantage_{key}"].append(value)
        if not table:
            return
        # TRL put its own (the verifier's) advantage of every gathered completion last in its table's log.
        logged = self._logs.get("advantages") if isinstance(getattr(self, "_logs", None), dict) else None
        if logged is not None and len(logged) >= len(all_lengths):
            for _ in all_lengths:
                logged.pop()
            logged.extend((adv[:, 0] if adv.dim() == 2 else adv).tolist())


@dataclass
class PolicyPhaseResult:
    policy_path: Path
    metrics: dict[str, float]


def round_prompts(
    problem_set: ProblemSet, count: int, seed: int, round_index: int, *, renderer: PromptRenderer
) -> Dataset:
    """The training prompts offered to GRPO in a round: a seeded draw from the training problems.

    `prompt` is what TRL generates after and `prompt_text`, the same text, what the reward functions (ORM)
    and the PRM score the completions after: the rendered prompt, in chat format too (`pipeline/prompts.py`).
    """
    problems = list(problem_set.train)
    random.Random(seed * 1000 + round_index).shuffle(problems)
    texts = [renderer.render(p) for p in problems[:count]]
    return Dataset.from_list([{"prompt": text, "prompt_text": text, "answer": p.answer, "prompt_id": p.id,
                               "solution": p.solution} for p, text in zip(problems, texts)])


def build_reward_funcs(cfg: PipelineConfig, problem_set: ProblemSet, scorers: Mapping[str, SolutionScorer]):
    """Reward functions and weights for GRPOTrainer, from `supervision.rewards` through the registry
    (`pipeline.rewards.active_rewards`: in process mode the verifier is there for logging only; in rft mode
    it is the reward, weight 1). `scorers`: RM kind -> the loaded scorer a reward function needs."""
    weights = active_rewards(cfg.supervision.mode, cfg.supervision.rewards)
    return [build_reward_func(name, problem_set, scorers) for name in weights], list(weights.values())


def policy_peft_config(cfg: PipelineConfig):
    """The GRPO phase's adapter (`policy.lora`) as a PEFT LoraConfig; None trains every weight."""
    lo = cfg.policy.lora
    return lora_config(lo.r, lo.alpha, lo.dropout, lo.target_modules, "CAUSAL_LM") if lo else None


def run_policy_phase(
    cfg: PipelineConfig,
    problem_set: ProblemSet,
    policy_path: str | Path,
    out_dir: str | Path,
    round_index: int,
    reward_models: Mapping[str, str | Path] | None = None,
    report_to: str = "none",
    callbacks=None,
) -> PolicyPhaseResult:
    """One round of GRPO from `policy_path`, saved to `out_dir`.

    The reference model is the round's starting policy (π_ref ← π_θ): TRL loads it from the same path.
    `reward_models`: RM kind -> checkpoint, for those the mode and rewards need (`reward_models_needed`):
    the PRM in process mode, the ORM for an `orm` reward; others are ignored. With `reward_model.oracle`
    no PRM gives the step rewards (`step_scorer`).
    """
    # Reward models first: a wrong path or a wrong kind fails before any training.
    scorers = {}
    for kind, why in reward_models_needed(cfg).items():
        if (reward_models or {}).get(kind) is None:
            raise ValueError(f"{why} needs {kind_name(kind)}: give --reward-model PATH")
        scorers[kind] = load_scorer(kind, reward_models[kind], cfg.reward_model, batch_size=cfg.collect.batch_size)
    funcs, weights = build_reward_funcs(cfg, problem_set, scorers)
    tokenizer = load_tokenizer(str(policy_path))
    data = round_prompts(problem_set, cfg.supervision.prompts_per_round, cfg.run.seed, round_index,
                         renderer=renderer_from_config(cfg, tokenizer))
    prm = step_scorer(cfg, problem_set, data, tokenizer, scorers)
    check_step_separator(prm, problem_set)

    peft_config = policy_peft_config(cfg)

    args = grpo_config(cfg, str(scratch_dir(out_dir)), reward_weights=weights, report_to=report_to,
                       seed=cfg.run.seed + round_index, run_name=f"grpo-round-{round_index}")
    trainer = ProcessGRPOTrainer(
        model=str(policy_path), reward_funcs=funcs, args=args, train_dataset=data,
        processing_class=tokenizer, peft_config=peft_config, callbacks=callbacks,
        prm_scorer=prm, supervision=cfg.supervision, step_separator=problem_set.step_separator,
    )
    for scorer in scorers.values():  # on this process's device (its own GPU under accelerate launch)
        scorer.model.to(trainer.accelerator.device)
    train_resumable(trainer, fingerprint(cfg, "policy", round_index, policy=str(policy_path), out=str(out_dir),
                                         reward_models={k: str(v) for k, v in (reward_models or {}).items()}))
    save_model(trainer.model, tokenizer, out_dir)
    return PolicyPhaseResult(Path(out_dir), policy_metrics(trainer.state.log_history))


def step_scorer(cfg: PipelineConfig, problem_set: ProblemSet, data: Dataset, tokenizer,
                scorers: Mapping[str, SolutionScorer]):
    """What scores GRPO's steps: with `reward_model.oracle: gold` the gold step labels of each prompt's problem
    (`GoldStepScorer`), with `mc` online Monte-Carlo values of the policy being trained (`McStepScorer`, K =
    `reward_model.mc_rollouts`), else the loaded step scorer (`supervision.process_reward_model`; None in a mode
    without step rewards)."""
    rm = cfg.reward_model
    if rm.oracle == "gold":
        return GoldStepScorer.from_rows(problem_set, data)
    if rm.oracle == "mc":
        return McStepScorer.from_rows(problem_set, data, tokenizer, rm.mc_rollouts, cfg.collect.batch_size)
    return scorers.get(cfg.supervision.process_reward_model)


def mc_seed(seed: int, step: int, process: int) -> int:
    """The seed of online MC's rollouts at a GRPO step on a process: the same for a run resumed at that step.

    >>> mc_seed(0, 3, 0), mc_seed(0, 3, 1), mc_seed(1, 0, 0)
    (3000, 3001, 1000003000)
    """
    return (seed * 1_000_003 + step) * 1000 + process


def value_source(cfg: PipelineConfig) -> str:
    """The prover whose step values a process reward reads, named for the logs (PAV: values are one prover's):
    `oracle:gold`, `mc:<K>` (online MC, the policy itself with K rollouts a prefix), `prm:<head layout>` (`prm:value`,
    `prm:label_tokens`...), or the RM kind (`implicit`).

    >>> from pipeline.config import PipelineConfig
    >>> value_source(PipelineConfig()), value_source(PipelineConfig(reward_model={"oracle": "gold"}))
    ('prm:value', 'oracle:gold')
    >>> value_source(PipelineConfig(reward_model={"oracle": "mc", "mc_rollouts": 8}))
    'mc:8'
    """
    from pipeline.rm_kinds import layout_kinds

    if cfg.reward_model.oracle == "mc":
        return f"mc:{cfg.reward_model.mc_rollouts}"
    if cfg.reward_model.oracle is not None:
        return f"oracle:{cfg.reward_model.oracle}"
    kind = cfg.supervision.process_reward_model
    return f"{kind}:{cfg.reward_model.head}" if kind in layout_kinds() else kind


def check_step_separator(scorer, problem_set: ProblemSet) -> None:
    """A ValueError where a step scorer reads steps at another separator than the problem set's (a PRM trained on
    another set): its scores would land on other tokens than the steps GRPO credits."""
    theirs = getattr(scorer, "separator", None)
    if theirs is not None and theirs != problem_set.step_separator:
        raise ValueError(f"the PRM was trained on steps split by {theirs!r}, and {problem_set.name}'s steps are split "
                         f"by {problem_set.step_separator!r}: train a PRM on this problem set's steps")


def policy_metrics(log_history: list[dict]) -> dict[str, float]:
    """Training reward at the start and end of the phase (first and last logged values), and the loss; in
    hybrid mode the mean share of the advantages' variance the PRM term carried over the phase; in every mode the
    advantages' per-token mean and its share of their RMS, averaged over the phase.

    >>> policy_metrics([{"reward": 0.2, "hybrid/process_variance_share": 0.3, "step": 1},
    ...                 {"reward": 0.6, "hybrid/process_variance_share": 0.5, "hybrid/advantage_mean": -0.2,
    ...                  "hybrid/advantage_mean_share": 0.25, "step": 2}])  # doctest: +NORMALIZE_WHITESPACE
    {'policy/reward_start': 0.2, 'policy/reward_end': 0.6, 'policy/steps': 2.0, 'policy/process_variance_share': 0.4,
     'policy/advantage_mean': -0.2, 'policy/advantage_mean_share': 0.25}
    """
    logs = [h for h in log_history if "reward" in h]
    if not logs:
        return {}
    k = max(1, len(logs) // 4)  # average a quarter at each end: single logs are noisy
    mean = lambda xs, key: sum(x[key] for x in xs) / len(xs)  # noqa: E731
    out = {
        "policy/reward_start": mean(logs[:k], "reward"),
        "policy/reward_end": mean(logs[-k:], "reward"),
        "policy/steps": float(log_history[-1].get("step", len(logs))),
    }
    if "loss" in logs[-1]:
        out["policy/loss_end"] = mean(logs[-k:], "loss")
    # Each logged step's share; NaN where no token was in the loss (every completion masked): left out.
    shares = [h["hybrid/process_variance_share"] for h in logs
              if math.isfinite(h.get("hybrid/process_variance_share", math.nan))]
    if shares:
        out["policy/process_variance_share"] = sum(shares) / len(shares)
    # The advantages' per-token mean and its share of their RMS (`advantage_stats`), over the phase: how much of
    # the update pushed every sampled token one way (REFERENCE, "The mean of process advantages").
    for stat in ("mean", "mean_share"):
        xs = [v for h in logs for k, v in h.items() if k.endswith(f"/advantage_{stat}") and math.isfinite(v)]
        if xs:
            out[f"policy/advantage_{stat}"] = sum(xs) / len(xs)
    return out
