"""`ProcessGRPOTrainer`: TRL's GRPOTrainer whose advantages its supervision mode makes (outcome, process supervision
from a PRM, hybrid, Online RFT, or a registered mode), and the pieces of a GRPO batch it reads.

Process supervision (DeepSeekMath §4.1.3) needs per-token advantages. TRL's `_compute_loss` accepts
`(B, T)` advantages from a subclass, so `ProcessGRPOTrainer` overrides only
`_generate_and_score_completions`: TRL generates and scores as usual, then the step scorer scores every step of
the completions TRL decoded (steps located on the policy's own tokens by `steps.step_token_ends`) and the
process reward (`supervision.process_reward`, `pipeline.step_rewards.PROCESS_REWARDS`) turns those scores into
advantages (`process_advantages`: TRL's `scale_rewards` applied to the step rewards, the eos credited with the
last step's reward, a completion TRL masked left without steps; sum or min credit). The mode then combines them
with TRL's own outcome advantages (hybrid) or replaces them (process; rft by the verifier's 0/1 reward, which TRL's
`scale_rewards` cannot express). Everything else (loss types, clipping, KL) is TRL's. The phase that runs it is
`pipeline/policy.py`.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from trl import GRPOTrainer

from pipeline.advantages import advantage_stats, extend_last_step
from pipeline.config import SupervisionConfig
from pipeline.generation import Continuation, sample
from pipeline.modes import AdvantageInputs, supervision_mode
from pipeline.resume import CheckpointedState
from pipeline.scorers import PrmScorer
from pipeline.step_rewards import PROCESS_REWARDS, ProcessInputs
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
    update on each training batch's completions and verifier outcomes (`update`), then scores them with the updated
    weights (PRIME's order): the frozen reference's forward is shared by the two (one a batch: the scorer keeps the
    update's log-probs), the model's is not (the update's is of the weights before its step); its weights and
    optimizer go into the trainer's checkpoints and come back on resume (`OnlineScorerState`).

    Args:
        prm_scorer: scores each step of `prompt + completion` (required in a mode with step rewards).
        supervision: the `supervision:` config section (its mode, credit, baseline and weight), or a mode's name
            with the settings below.
        process_credit, process_weight, process_baseline, process_centring, process_reward: with a mode's name,
            as `supervision.*`.
        round_position: (RL rounds before this one, run.rounds), for a mode's schedule over rounds
            (`supervision.passk.over: rounds`).
    """

    def __init__(self, *args, prm_scorer: PrmScorer | None = None, supervision: str | SupervisionConfig = "outcome",
                 process_credit: str = "sum", process_weight: float = 1.0, process_baseline: str = "group",
                 process_centring: str = "none", process_reward: str = "value", step_separator: str = STEP_SEPARATOR,
                 round_position: tuple[int, int] = (0, 1), **kwargs):
        if isinstance(supervision, str):
            supervision = SupervisionConfig.model_construct(
                mode=supervision, process_credit=process_credit, process_weight=process_weight,
                process_baseline=process_baseline, process_centring=process_centring, process_reward=process_reward)
        self.mode = supervision_mode(supervision.mode)
        if self.mode.step_rewards and prm_scorer is None:
            raise ValueError(f"{supervision.mode} supervision needs a PRM (prm_scorer)")
        super().__init__(*args, **kwargs)
        self.prm_scorer, self.supervision, self.step_separator = prm_scorer, supervision, step_separator
        self.round_position = round_position
        if getattr(prm_scorer, "online_lr", None):  # PRIME: the PRM it updates is in its checkpoints
            self.add_callback(OnlineScorerState(prm_scorer))

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
        group_size = self.num_generations if self.model.training else self.num_generations_eval
        adv, figures = self.mode.advantages(AdvantageInputs(
            outcome, process, self._last_rewards, all_lengths, self.supervision, group_size=group_size,
            scale=self.args.scale_rewards, step=(self.state.global_step, self.state.max_steps),
            round=self.round_position, reward_names=tuple(self.reward_func_names)))  # (B_all,) or (B_all, T')
        mode = "train" if self.model.training else "eval"
        for key, value in figures.items():
            self._metrics[mode][f"{self.supervision.mode}/{key}"].append(value)
        start = self.accelerator.process_index * len(inputs)
        local = adv[start : start + len(inputs)]
        out["advantages"] = (local[:, : ids.shape[1]] if local.dim() == 2 else local).to(ids.device)
        self._log_advantages(adv, all_lengths)
        return out

    def _step_advantages(self, inputs, ids, lengths: list[int], all_lengths: list[int]):
        """Score every step of this process's completions, gather the group, return (B_all, T') advantages made by
        the process reward (`supervision.process_reward`: `pipeline.step_rewards.PROCESS_REWARDS`)."""
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
        reward, mode = PROCESS_REWARDS[self.supervision.process_reward], "train" if self.model.training else "eval"
        scores = ends = tokens = None
        if reward.token_rewards:  # PRIME: the implicit PRM's token rewards, on the policy's tokens
            tokens = self._token_rewards(prompts, host_ids, lengths, width)
        else:
            steps = self._scored_steps(prompts, rows)  # a masked completion is not scored
            scores, ends = gather_object([s for s, _ in steps]), gather_object([e for _, e in steps])
            ends = extend_last_step(ends, all_lengths)  # the eos carries the last step's reward
            for key, value in process_metrics(scores, group_size).items():
                self._metrics[mode][key].append(value)
        adv, figures = reward.advantages(ProcessInputs(scores, ends, tokens, verifier, all_lengths, group_size, width,
                                                       self.args.scale_rewards, self.supervision))  # (B_all, T')
        for key, value in figures.items():
            self._metrics[mode][f"process/{key}"].append(value)
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
        # Under the trainer's autocast (bf16 where `policy.dtype` is, over the float32 weights), as its own forward.
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), self.accelerator.autocast():
            out = sample(model, tok, prefixes, n, temperature=self.temperature, top_p=self.top_p, max_new_tokens=room,
                         batch_size=self.prm_scorer.batch_size, seed=seed)
        texts = [[t if len(ids) <= limit else tok.decode(ids[:limit], skip_special_tokens=True)
                  for t, ids in zip(row_texts, row_ids)] for row_texts, row_ids in zip(out.texts, out.ids)]
        spent[0] += out.total_tokens
        return texts

    def _token_rewards(self, prompts, ids: list[list[int]], lengths: list[int], width: int):
        """The step scorer's token rewards of this process's completions (`scorer.token_rewards`: the implicit PRM's),
        put on the policy's tokens and gathered: (B_all, T')."""
        from accelerate.utils import gather_object

        live = [i for i, n in enumerate(lengths) if n]  # a masked completion is not scored: no rewards
        decoded = {i: token_spans(self.processing_class, ids[i][: lengths[i]]) for i in live}
        scored = self.prm_scorer.token_rewards([prompts[i] for i in live], [decoded[i][0] for i in live])
        placed = dict(zip(live, (placed_token_rewards(decoded[i][1], *r, lengths[i]) for i, r in zip(live, scored))))
        rows = gather_object([placed.get(i, []) for i in range(len(lengths))])
        rewards = torch.zeros(len(rows), width)  # (B_all, T')
        for i, row in enumerate(rows):
            rewards[i, : len(row)] = torch.tensor(row)
        return rewards

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


class OnlineScorerState(CheckpointedState):
    """The step scorer an online update trains (PRIME's implicit PRM, `online_state`: its weights and optimizer) in
    each of GRPO's checkpoints, and restored from the one resumed: the PRM goes on from where it was, as the policy."""

    name = "online_scorer.safetensors"  # tensors and JSON, never a pickle (tests/test_security.py)

    def __init__(self, scorer):
        self.scorer = scorer

    def save(self, path: Path) -> None:
        state = self.scorer.online_state()
        # Cloned: safetensors refuses tensors that share storage (tied embeddings); loading re-ties them.
        tensors = {f"model.{k}": v.detach().clone().contiguous() for k, v in state["model"].items()}
        optimizer = state["optimizer"]
        for i, per_param in (optimizer or {}).get("state", {}).items():
            tensors.update({f"optimizer.{i}.{k}": torch.as_tensor(v).clone().contiguous() for k, v in per_param.items()})
        groups = json.dumps(optimizer["param_groups"]) if optimizer is not None else "null"
        save_file(tensors, str(path), metadata={"param_groups": groups})

    def load(self, path: Path) -> None:
        with safe_open(str(path), framework="pt") as f:
            groups = json.loads(f.metadata()["param_groups"])
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118  safe_open has no iteration
        model = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
        per_param: dict[int, dict] = {}
        for k, v in tensors.items():
            if k.startswith("optimizer."):
                _, i, name = k.split(".", 2)
                per_param.setdefault(int(i), {})[name] = v
        optimizer = None if groups is None else {"state": per_param, "param_groups": groups}
        self.scorer.load_online_state({"model": model, "optimizer": optimizer})


def mc_seed(seed: int, step: int, process: int) -> int:
    """The seed of online MC's rollouts at a GRPO step on a process: the same for a run resumed at that step.

    >>> mc_seed(0, 3, 0), mc_seed(0, 3, 1), mc_seed(1, 0, 0)
    (3000, 3001, 1000003000)
    """
    return (seed * 1_000_003 + step) * 1000 + process
