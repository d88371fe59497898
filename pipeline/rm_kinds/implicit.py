"""The implicit PRM (Yuan et al., arXiv 2412.01981; PRIME, arXiv 2502.01456): an outcome reward model written as
the log-likelihood ratio of a trained causal LM pi_phi and a frozen reference pi_ref, whose partial sums value every
step without step labels.

    r_t      = beta * log( pi_phi(y_t | y_<t) / pi_ref(y_t | y_<t) )    per completion token t
    r(y)     = sum of r_t over the completion, trained by BCE( sigmoid(r(y)), the verifier's 0/1 outcome )
    V_k      = sum of r_t up to the token holding step k's end (`pipeline.steps.step_token_ends`, as the PRM)

The score the pipeline's step-scoring interface gets (`step_scores`) is sigmoid(V_k): the trained P(correct) read
after step k, a probability like the PRM's, so `aggregation`, the process advantages, progress credit (differences
of values) and the weighted vote take it unchanged. With `aggregation: last` a solution's score is sigmoid(r(y)),
exactly the trained outcome probability. Step k's own reward in PRIME's sense, V_k - V_(k-1), is the progress of
the logits; `process_reward: progress` gives its analogue in probabilities.

pi_phi starts as a copy of the model RM training starts from (the round's policy, or `reward_model.model`), which
is then its reference: at the start r = 0 for every sample. Warm-started rounds keep the reference recorded in the
previous checkpoint, so it stays the round-0 policy. The checkpoint's `igrpo.json` records the reference and beta,
which every scorer of it reads. Training stays one forward of one model per batch: the reference's log-probs are
computed once, when the examples are built (`with_reference`).

PRIME's online update (`ImplicitPrmScorer.update`, then scoring the same batch) runs the frozen reference once a
batch: the update keeps the reference's log-probs of each sequence it read (keyed by its token ids), and the scoring
that follows reads them instead of a second forward. The reference is frozen, so they are the values a second
forward would give (to float rounding where the scoring batch is shaped otherwise: a blank completion the update
skips). The model's side cannot be shared: the update's forward is of the weights before its AdamW step, and PRIME
scores with the weights after it, so the scoring forward of the updated model is needed (reusing the update's would
score with the previous batch's PRM). The reference loads in `reward_model.dtype` (bf16 where it resolves to
bfloat16); the model PRIME updates keeps float32 master weights and runs its forwards under bf16 autocast there.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path

import torch

from models.factories import checkpoint_record, load_policy
from pipeline.dtypes import machine_dtype, torch_dtype
from pipeline.rm_kinds.base import RewardModelKind
from pipeline.rm_kinds.prm import prm_metrics
from pipeline.scorers import StepScorer, _refuse_nonfinite, trained_separator
from pipeline.steps import STEP_SEPARATOR, char_to_token_ends, step_token_ends

# --- the formulas: pure functions of tensors --------------------------------------------------------------


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log p(ids[t] | ids[<t]) from a causal LM's logits, (B, T, V) and (B, T) -> (B, T); 0 at t = 0 (unpredicted).

    >>> lp = token_logprobs(torch.zeros(1, 3, 4), torch.tensor([[0, 1, 2]]))  # uniform over 4 tokens
    >>> [round(v, 4) for v in lp[0].tolist()]
    [0.0, -1.3863, -1.3863]
    """
    logits = logits[:, :-1].float()  # position t-1 predicts token t
    picked = logits.gather(-1, ids[:, 1:, None]).squeeze(-1) - torch.logsumexp(logits, -1)  # (B, T-1)
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)  # (B, T)


def step_values(token_rewards: Sequence[float] | torch.Tensor, first: int, ends: Sequence[int]) -> list[float]:
    """V_k: the sum of the token rewards from the completion's first token to step k's end token, each k.

    A step end before `first` (a blank completion read at the prompt's last token) has seen no completion token: 0.

    >>> step_values([9.0, 0.5, -0.25, 1.0, 2.0], first=1, ends=[2, 4])
    [0.25, 3.25]
    >>> step_values([9.0, 0.5], first=2, ends=[1])
    [0.0]
    """
    r = torch.as_tensor(token_rewards, dtype=torch.float64)
    return [float(r[first : e + 1].sum()) for e in ends]


def implicit_loss(outputs, labels: tuple, num_items_in_batch=None, *, beta: float) -> torch.Tensor:
    """BCE(sigmoid(r(y)), outcome), the mean over the micro-batch (`RewardModelKind.loss`'s contract).

    `labels` is `implicit_collate`'s tuple: outcomes (B,), the input ids (B, T), the reference's log-probs (B, T)
    and the mask of the tokens r(y) sums (B, T). Trainer cannot count a tuple's items (`num_items_in_batch` None):
    the train path has Trainer divide this mean by the accumulation steps.
    """
    outcome, ids, ref, completion = labels
    logp = token_logprobs(outputs.logits, ids)  # (B, T)
    r = beta * ((logp - ref) * completion).sum(-1)  # (B,)
    return torch.nn.functional.binary_cross_entropy_with_logits(r, outcome.float())


# --- tokens -----------------------------------------------------------------------------------------------


def completion_tokens(offsets: Sequence[tuple[int, int]], prompt: str, completion: str,
                      separator: str = STEP_SEPARATOR) -> tuple[int, list[int]]:
    """(the first completion token, each step's end token) of `prompt + completion`, from its offset mapping.

    The first is the token holding the completion's first character (one that also holds prompt characters counts:
    it is where the completion begins); for an empty completion, one past the last token (none). The step ends are
    `steps.step_token_ends`', the tokens the PRM reads (steps split at `separator`, the problem set's).

    >>> completion_tokens([(0, 3), (3, 8), (8, 9), (9, 13)], "Q: ", "1+1=2\\nA: 2")
    (1, [2, 3])
    """
    ends = step_token_ends(offsets, completion, start=len(prompt), separator=separator)
    first = char_to_token_ends(offsets, [len(prompt)])[0] if completion else len(offsets)
    return first, ends


def _padded(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and their attention mask, (B, T) each."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id)  # (B, T)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)  # (B, T)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return ids, mask


def sequence_logprobs(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A causal LM's log-prob of every token of right-padded `ids` (B, T), no grad (`token_logprobs`)."""
    with torch.inference_mode():
        return token_logprobs(model(input_ids=ids, attention_mask=mask).logits, ids)


# --- training ---------------------------------------------------------------------------------------------


def implicit_examples(rows: list[dict], tokenizer, rm) -> list[dict]:
    """`prompt + completion` ids, the outcome, and the completion's token span up to its last step's end (what
    r(y) sums, so sigmoid(V) at the last step is the trained probability). Blank completions are left out."""
    out = []
    for r in rows:
        if not r["completion"].strip():
            continue  # nothing to score, as the PRM leaves them out
        enc = tokenizer(r["prompt"] + r["completion"], return_offsets_mapping=True)
        first, ends = completion_tokens(enc["offset_mapping"], r["prompt"], r["completion"])
        out.append({"input_ids": enc["input_ids"], "labels": float(r["outcome"]), "first": first, "last": ends[-1]})
    return out


def reference_spec(start: str, warm: bool) -> str:
    """The reference of an implicit PRM trained from `start`: the one a warm start's checkpoint records, else
    `start` itself (absolute where it is a local path, so the record survives another working directory)."""
    if warm:
        return recorded(start)["reference"]
    return str(Path(start).resolve()) if Path(start).exists() else start


def with_reference(examples: list[dict], start: str, warm: bool, rm, batch_size: int = 16) -> tuple[list, dict]:
    """`RewardModelKind.prepare`: each example's reference log-probs (`ref_logprobs`), computed once here so that
    training runs one model; and what the checkpoint records: the reference and beta."""
    from accelerate import PartialState


    reference = reference_spec(start, warm)
    model, _ = load_policy(reference, torch_dtype(rm.dtype))  # frozen: reward_model.dtype
    device = PartialState().device  # this process's device, also under `accelerate launch`
    model.to(device).eval()
    for s in range(0, len(examples), batch_size):
        batch = examples[s : s + batch_size]
        ids, mask = _padded([b["input_ids"] for b in batch], pad_id=0)  # pads are masked: any id does
        logp = sequence_logprobs(model, ids.to(device), mask.to(device)).cpu()  # (b, T)
        for b, row in zip(batch, logp):
            b["ref_logprobs"] = row[: len(b["input_ids"])].tolist()
    return examples, {"reference": reference, "beta": rm.implicit.beta}


def implicit_collate(pad_id: int):
    """Batches for `implicit_loss`: labels as a tuple (outcomes, ids, reference log-probs, completion mask)."""

    def fn(batch: list[dict]) -> dict:
        ids, mask = _padded([b["input_ids"] for b in batch], pad_id)  # (B, T)
        ref, completion = torch.zeros(ids.shape), torch.zeros(ids.shape)  # (B, T)
        for i, b in enumerate(batch):
            ref[i, : len(b["ref_logprobs"])] = torch.tensor(b["ref_logprobs"])
            completion[i, b["first"] : b["last"] + 1] = 1.0
        outcome = torch.tensor([b["labels"] for b in batch])  # (B,)
        # A tuple, not a dict: Trainer counts label items by `labels[..., 1:]`, which a tuple refuses with the
        # TypeError Trainer catches, where a dict raises KeyError on Python >= 3.12 (slices hash there).
        return {"input_ids": ids, "attention_mask": mask, "labels": (outcome, ids, ref, completion)}

    return fn


# --- scoring ----------------------------------------------------------------------------------------------


def recorded(checkpoint: str | Path) -> dict:
    """What an implicit PRM checkpoint's `igrpo.json` records (its reference and beta); a ValueError without them."""
    data = checkpoint_record(checkpoint)
    if "reference" not in data:
        raise ValueError(f"{checkpoint}: an implicit PRM checkpoint records its reference model in igrpo.json, and "
                         "this one has none (not trained by the pipeline's reward-model phase?)")
    return data


class ImplicitPrmScorer(StepScorer):
    """Batched no-grad implicit PRM: the trained model and its reference read `prompt + completion` once each
    (the reference not at all for a sequence `update` just read: module docstring); a step's score is sigmoid(V_k)
    at its end token, a solution's the `aggregation` of them. `bf16_autocast`: the model's forwards under bf16
    autocast (`reward_model.dtype` resolving to bfloat16), over float32 weights where it is updated online."""

    def __init__(self, model, reference, tokenizer, batch_size: int = 64, beta: float = 0.05,
                 aggregation: str = "min", online_lr: float | None = None, record: dict | None = None,
                 bf16_autocast: bool = False):
        self.model, self.reference = model.eval(), reference.eval()
        self.tokenizer, self.batch_size, self.beta, self.aggregation = tokenizer, batch_size, beta, aggregation
        self.online_lr, self._optimizer = online_lr, None  # `update` (PRIME's online update) where set
        self.record = record or {"beta": beta}  # what its checkpoint's igrpo.json records (reference, beta)
        self.separator = trained_separator(model)  # the steps it was trained on (the reward-model phase records them)
        self.bf16_autocast = bf16_autocast  # the model's forwards under bf16 autocast (`reward_model.dtype`)
        # token ids -> the reference's log-probs (T,) of the batch `update` last read: its scoring reads them.
        self._reference_logprobs: dict[tuple[int, ...], torch.Tensor] = {}

    def _autocast(self, device: torch.device):
        """The model's forward precision: bf16 autocast over its float32 weights where `bf16_autocast`."""
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.bf16_autocast)

    def reference_logprobs(self, ids: torch.Tensor, mask: torch.Tensor, keep: bool = False) -> torch.Tensor:
        """The frozen reference's log-probs of right-padded `ids` (b, T), 0 past each row's length: a row `update`
        read in this batch from what it kept, the others from one forward of them (kept for the scoring that follows
        where `keep`: `update`'s batch, which replaces the last one's)."""
        keys = [tuple(row[:n].tolist()) for row, n in zip(ids, mask.sum(1).tolist())]
        if keep:
            self._reference_logprobs = {}
        missing = [i for i, k in enumerate(keys) if k not in self._reference_logprobs]
        computed = {}
        if missing:
            rows = torch.tensor(missing, device=ids.device)
            width = max(len(keys[i]) for i in missing)  # the whole batch's width where every row is missing
            logp = sequence_logprobs(self.reference, ids[rows, :width], mask[rows, :width])  # (m, width)
            computed = {keys[i]: row[: len(keys[i])] for i, row in zip(missing, logp)}
            if keep:
                self._reference_logprobs.update(computed)
        out = torch.zeros(ids.shape, device=ids.device)  # (b, T)
        for i, k in enumerate(keys):
            out[i, : len(k)] = computed[k] if k in computed else self._reference_logprobs[k]
        return out

    def update(self, prompts: Sequence[str], completions: Sequence[str], outcomes: Sequence[float]) -> float | None:
        """PRIME's online update: one AdamW step (`online_lr`) of `implicit_loss` on these samples and their
        verifier outcomes; the loss, or None without a sample to learn from. `ProcessGRPOTrainer` calls it on every
        training batch before scoring its steps. The reference's log-probs computed here are kept for that scoring
        (`reference_logprobs`): one reference forward a batch."""
        rows = [{"prompt": p, "completion": c, "outcome": o} for p, c, o in zip(prompts, completions, outcomes)]
        examples = implicit_examples(rows, self.tokenizer, None)
        if not examples:
            return None
        device = next(self.model.parameters()).device
        self.reference.to(device)
        ids, mask = (t.to(device) for t in _padded([e["input_ids"] for e in examples], self.tokenizer.pad_token_id))
        ref = self.reference_logprobs(ids, mask, keep=True)  # (B, T), a constant; kept for the scoring after
        completion = torch.zeros(ids.shape, device=device)  # (B, T)
        for i, e in enumerate(examples):
            completion[i, e["first"] : e["last"] + 1] = 1.0
        outcome = torch.tensor([e["labels"] for e in examples], device=device)  # (B,)
        self.model.train()
        with self._autocast(device):
            outputs = self.model(input_ids=ids, attention_mask=mask)
        loss = implicit_loss(outputs, (outcome, ids, ref, completion), beta=self.beta)  # logits read in float32
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        return float(loss.detach())

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The online update's AdamW, made on first use."""
        if self._optimizer is None:
            self._optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.online_lr)
        return self._optimizer

    def online_state(self) -> dict:
        """What the online update has changed: the model's weights and the optimizer's state (None before the first
        update), for GRPO's in-phase checkpoints (`grpo_trainer.OnlineScorerState`)."""
        return {"model": self.model.state_dict(),
                "optimizer": self._optimizer.state_dict() if self._optimizer is not None else None}

    def load_online_state(self, state: dict) -> None:
        """Back to an `online_state`: the run resumed from a checkpoint goes on as the one never stopped."""
        self.model.load_state_dict(state["model"])
        if state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])

    def _rewards(self, prompts: Sequence[str], completions: Sequence[str]):
        """Yield, for each (prompt, completion), its token rewards r_t (T,), its offsets and its first completion
        token: one forward of the model per batch, and of the reference for the sequences `update` did not just read
        (`reference_logprobs`), shared by the step and token views."""
        device = next(self.model.parameters()).device
        self.reference.to(device)  # the policy phase moves `model` to its device; the reference follows here
        for s in range(0, len(prompts), self.batch_size):
            ps, cs = prompts[s : s + self.batch_size], completions[s : s + self.batch_size]
            enc = self.tokenizer([p + c for p, c in zip(ps, cs)], return_tensors="pt", padding=True,
                                 padding_side="right", return_offsets_mapping=True)
            ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
            with self._autocast(device):
                logp = sequence_logprobs(self.model, ids, mask)  # (b, T), the updated model: its own forward
            rewards = self.beta * (logp - self.reference_logprobs(ids, mask)).cpu()  # (b, T)
            for r, (p, c) in enumerate(zip(ps, cs)):
                yield rewards[r], enc["offset_mapping"][r].tolist(), p, c

    def step_scores(self, prompts: Sequence[str], completions: Sequence[str]) -> list[list[float]]:
        out: list[list[float]] = []
        for rewards, offsets, p, c in self._rewards(prompts, completions):
            first, ends = completion_tokens(offsets, p, c, self.separator)
            out.append(torch.sigmoid(torch.tensor(step_values(rewards, first, ends))).tolist())
        for i, scores in enumerate(out):
            _refuse_nonfinite("implicit PRM", scores, [completions[i]] * len(scores), sample=i)
        return out

    def token_rewards(self, prompts: Sequence[str], completions: Sequence[str]) -> list[tuple[list[int], list[float]]]:
        """PRIME's per-token process rewards r_t = beta * log(pi_phi / pi_ref) of each completion: for each of its
        tokens (in this PRM's tokenization), the completion's character it ends on and r_t, so that a caller puts
        them on its own tokens (`policy.placed_token_rewards`). An empty completion has none."""
        out = []
        for i, (rewards, offsets, p, c) in enumerate(self._rewards(prompts, completions)):
            spans = [(k, e) for k, (b, e) in enumerate(offsets) if e > b and e > len(p)]  # tokens with completion text
            values = [float(rewards[k]) for k, _ in spans]
            _refuse_nonfinite("implicit PRM", values, [completions[i]] * len(values), sample=i)
            out.append(([e - 1 - len(p) for _, e in spans], values))
        return out


def checkpoint_scorer(model, tokenizer, batch_size: int, rm) -> ImplicitPrmScorer:
    """The scorer of a loaded implicit PRM checkpoint, with the reference and beta its igrpo.json records."""

    meta = recorded(model.name_or_path)  # from_pretrained keeps the directory it loaded from
    reference, _ = load_policy(meta["reference"], torch_dtype(rm.dtype))  # frozen: reward_model.dtype
    return ImplicitPrmScorer(model, reference, tokenizer, batch_size, meta.get("beta", rm.implicit.beta),
                             rm.aggregation, rm.implicit.online_lr,
                             {k: v for k, v in meta.items() if k in ("reference", "beta")},
                             bf16_autocast=machine_dtype(rm.dtype) == "bfloat16")  # over PRIME's float32 weights


def implicit_metrics(scorer: ImplicitPrmScorer, rows: list[dict]) -> dict[str, float]:
    """The PRM's held-out figures (step AUC against MC labels where the shard has them, and gold; solution AUC
    against outcomes; mean score), named `implicit/...`."""
    return {k.replace("prm/", "implicit/", 1): v for k, v in prm_metrics(scorer, rows).items()}


IMPLICIT = RewardModelKind(
    examples=implicit_examples,
    pairwise=lambda rm: False,
    scorer=checkpoint_scorer,
    metrics=implicit_metrics,
    lora_task_type="CAUSAL_LM",
    solution_auc="implicit/solution_auc",
    loss=lambda rm, tokenizer: partial(implicit_loss, beta=rm.implicit.beta),
    loss_is_mean=True,
    collate=implicit_collate,
    prepare=with_reference,
    updated_online=lambda rm: rm.implicit.online_lr is not None,
)
