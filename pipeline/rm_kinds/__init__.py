"""The reward-model kinds as one table, `RM_KINDS`: torch-free, so the config validates `reward_model.kinds`
without importing transformers.

An entry says how the kind's model is built (a transformers head, one logit, on a policy's backbone), whether it
scores steps (then it can drive process and hybrid mode: `supervision.process_reward_model`), and where its
implementation is: a `RewardModelKind` (training examples and loss, scorer, held-out metrics), imported when first
used. A kind may declare its own config section, `reward_model.<kind>` (`pipeline/rm_kinds/sections.py`), and a check
of the whole config; its texts make the docs' table of kinds (`docs/generate.py`). The reward-model phase, every scorer (`pipeline.reward_model.load_scorer`), `models.factories` and the eval
phase read the table. A new kind is its module plus one `RM_KINDS.register(NAME, ...)` call (docs/extending.md).

A kind that scores steps is read in one of the published PRM layouts, `PRM_HEADS` (`reward_model.head`): today's
one-logit value head at each step's closing newline, Math-Shepherd's label tokens at a step tag, or Qwen2.5-Math-PRM's
2-class head at a separator. A checkpoint records its layout in `igrpo.json`; loading and scoring read it there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.modes import step_reward_modes, supervision_mode
from pipeline.problems import PROBLEM_SETS
from pipeline.registry import Registry, resolve
from pipeline.rm_kinds.sections import ImplicitSection, KindSection, OrmSection, check_implicit, check_orm


@dataclass(frozen=True)
class RewardModelKind:
    """What the pipeline does differently for one kind of reward model.

    Attributes:
        examples: (training rows, tokenizer, `reward_model:` config) -> training examples: `input_ids` and
            `labels` for BCE (`reward_model.bce_loss`: -100 where unlabelled), TRL's `chosen_ids` /
            `rejected_ids` when `pairwise`.
        pairwise: (`reward_model:` config) -> True to train with TRL's RewardTrainer on pairs, else BCE.
        scorer: (model, tokenizer, batch size, `reward_model:` config) -> its scorer (`pipeline.scorers`):
            `scorer(prompts, completions)` is one score per solution, `scorer.scores(...)` a `Scores`, and a kind
            that scores steps has `scorer.step_scores(...)`; `scorer.model` is the model.
        metrics: (scorer, held-out rows) -> RM quality, `<kind>/...`, `<kind>/mean_score` (mean solution score)
            among them.
        lora_task_type: peft's task type of its head.
        solution_auc: the metric of `metrics` that is the AUC of its solution scores against the verifier.
        loss: (`reward_model:` config, tokenizer) -> Trainer's `compute_loss_func` where it is not BCE on one logit
            (a PRM's tag layouts, the implicit PRM); None, or a None returned: `reward_model.bce_loss`. It follows
            `bce_loss`'s contract (its sum over Trainer's `num_items_in_batch`), unless `loss_is_mean`.
        loss_is_mean: its loss returns its micro-batch's mean (Trainer cannot count items of its labels, e.g. a
            tuple): Trainer then divides it by the accumulation steps.
        collate: (pad token id) -> the data collator of its examples; None: `reward_model.collate`.
        prepare: (examples, what training starts from, warm, `reward_model:` config) -> (the examples with what the
            loss needs from outside the trained model, what the checkpoint's `igrpo.json` records beside its kind);
            None: the examples as they are, nothing more recorded. The implicit PRM's: its reference model's
            log-probabilities, and which reference (`pipeline/rm_kinds/implicit.py`).
    """

    examples: Callable[[list[dict], Any, Any], list[dict]]
    pairwise: Callable[[Any], bool]
    scorer: Callable[[Any, Any, int, Any], Callable[[Sequence[str], Sequence[str]], list[float]]]
    metrics: Callable[[Any, list[dict]], dict[str, float]]
    lora_task_type: str
    solution_auc: str
    loss: Callable[[Any, Any], Callable | None] | None = None
    loss_is_mean: bool = False
    collate: Callable[[int], Callable] | None = None
    prepare: Callable[[list[dict], str, bool, Any], tuple[list[dict], dict]] | None = None


@dataclass(frozen=True, kw_only=True)
class RMKindEntry:
    """One registered kind (`RM_KINDS.register(NAME, head=..., scores_steps=..., implementation=..., ...)`).

    Attributes:
        head: the transformers auto class of its model, by name (`AutoModelForTokenClassification`): one logit on
            the backbone, new in round 0; a checkpoint's architecture tells its kind where `igrpo.json` does not.
        scores_steps: its scorer reads a score at every step end (it can give process supervision's step rewards).
        implementation: its `RewardModelKind`, or where it is, "module:attribute" (imported on first use).
        description: what it scores, for the docs' table of kinds.
        training: how it is trained, for the table.
        use: when to use it, for the table.
        mc_labels: it trains on the collection's Monte-Carlo step labels, so `collect.rollouts_per_step: 0` (no
            rollouts) is refused while it is in `reward_model.kinds`.
        layouts: its model takes a PRM head layout (`reward_model.head`, `step_tag`, `label_tokens`, `init`;
            `PRM_HEADS`), recorded in its checkpoint.
        config: its own config section, `reward_model.<kind>` (a `KindSection`); None: none.
        moved: its section's fields that were flat `reward_model.*` keys before: old key -> field. The old key is
            still read, with a deprecation warning naming the new one.
        check: (the whole `PipelineConfig`) -> None, raising ValueError that names the field and says the fix;
            run at load while the kind is in `reward_model.kinds`.
    """

    head: str
    scores_steps: bool
    implementation: str | RewardModelKind
    description: str = ""
    training: str = ""
    use: str = ""
    mc_labels: bool = True
    layouts: bool = False
    config: type[KindSection] | None = None
    moved: Mapping[str, str] = field(default_factory=dict)
    check: Callable[[Any], None] | None = None


RM_KINDS: Registry[RMKindEntry] = Registry("reward model kind", RMKindEntry, {
    "prm": RMKindEntry(
        head="AutoModelForTokenClassification", scores_steps=True, implementation="pipeline.rm_kinds.prm:PRM",
        description="every step, read at its end; a solution is the `aggregation` (min, last, product) of its steps. "
        "`head`: a value head at each step's closing newline (default), or at a tag token after it, Math-Shepherd's "
        "P(`+`) against `-` (`label_tokens`) or Qwen2.5-Math-PRM's 2 classes (`classification`)",
        training="cross-entropy at step ends on the MC labels, hard or soft (`target`)",
        use="process and hybrid mode (the default `supervision.process_reward_model`); best-of-N and the vote; "
            "`init:` starts from a published PRM ([docs](docs/reward-models.md#start-from-a-published-prm))",
        layouts=True),
    "orm": RMKindEntry(
        head="AutoModelForSequenceClassification", scores_steps=False, implementation="pipeline.rm_kinds.orm:ORM",
        description="the whole solution (one logit, P(correct)); with `orm.loss: pairwise` a ranking score",
        training="`orm.loss: bce` (default) on the verifier's 0/1 outcomes, or `pairwise`: Bradley-Terry with TRL's "
                 "`RewardTrainer` on (correct, incorrect) pairs of one prompt",
        use="an `orm` reward in outcome or hybrid mode; best-of-N and the vote",
        mc_labels=False, config=OrmSection, moved={"orm_loss": "loss"}, check=check_orm),
    "implicit": RMKindEntry(
        head="AutoModelForCausalLM", scores_steps=True, implementation="pipeline.rm_kinds.implicit:IMPLICIT",
        description="every step: sigmoid of `implicit.beta` times the summed log-ratio of a causal LM to its frozen "
        "reference (the round-0 policy) up to the step's end (implicit PRM, PRIME)",
        training="BCE of sigmoid(beta log pi/pi_ref) on the verifier's outcomes: no step labels, no MC rollouts",
        use="process or hybrid mode without Monte-Carlo labelling; PRIME's credit; scoring costs two LM forwards "
            "([docs](docs/reward-models.md#the-implicit-prm))",
        mc_labels=False, config=ImplicitSection, moved={"implicit_beta": "beta", "implicit_online_lr": "online_lr"},
        check=check_implicit),
})


def rm_entry(kind: str) -> RMKindEntry:
    """The registry entry of `kind` (an unknown one: the registry's error, listing the known ones)."""
    return RM_KINDS[kind]


def rm_kind(kind: str) -> RewardModelKind:
    """The implementation of `kind` (imported on first use)."""
    return resolve(RM_KINDS[kind].implementation)


def mc_label_kinds() -> list[str]:
    """The kinds that train on Monte-Carlo step labels (`RMKindEntry.mc_labels`)."""
    return [name for name, e in RM_KINDS.items() if e.mc_labels]


def layout_kinds() -> list[str]:
    """The kinds whose model takes a PRM head layout (`RMKindEntry.layouts`)."""
    return [name for name, e in RM_KINDS.items() if e.layouts]


def step_kinds() -> list[str]:
    """The kinds whose scorers read a score at every step end."""
    return [name for name, e in RM_KINDS.items() if e.scores_steps]


@dataclass(frozen=True)
class PrmHead:
    """One published layout of a PRM's head: where a step's score is read and how (REFERENCE, "Step-tag PRMs").

    Attributes:
        model_class: the transformers auto class of its model.
        num_labels: a token-classification head's classes; None for a causal LM's own LM head.
        step_tag: the default tag token put after each step, read there; None: no tag, read at the step's end
            (`pipeline.steps`: the closing newline stands in for the tag).
        label_tokens: the default (right, wrong) label tokens read from the LM head's logits; None: no label tokens.
        math: where its pure functions are, "module:attribute" (a `pipeline.rm_kinds.heads.HeadMath`).
        description: one line, for the docs.
        lora_task_type: peft's task type of its model.
    """

    model_class: str
    num_labels: int | None
    step_tag: str | None
    label_tokens: tuple[str, str] | None
    math: str
    description: str = ""
    lora_task_type: str = "TOKEN_CLS"


PRM_HEADS: Registry[PrmHead] = Registry("PRM head", PrmHead, {
    "value": PrmHead("AutoModelForTokenClassification", 1, None, None, "pipeline.rm_kinds.heads:VALUE",
                     "one logit on the backbone at each step's closing newline: sigmoid(logit), trained by BCE"),
    # Math-Shepherd (peiyi9979/math-shepherd-mistral-7b-prm): the LM head itself; a tag token after each step.
    "label_tokens": PrmHead("AutoModelForCausalLM", None, "ки", ("+", "-"), "pipeline.rm_kinds.heads:LABEL_TOKENS",
                            "a causal LM: P('+') normalised against '-' at a tag after each step, CE on the label token",
                            lora_task_type="CAUSAL_LM"),
    # Qwen2.5-Math-PRM: a 2-class head on every token, read at a separator after each step.
    "classification": PrmHead("AutoModelForTokenClassification", 2, "<extra_0>", None,
                              "pipeline.rm_kinds.heads:CLASSIFICATION",
                              "2 classes on the backbone: softmax(logits)[1] at a separator after each step, CE"),
})


@dataclass(frozen=True)
class PrmLayout:
    """A PRM's head and its tokens, as its checkpoint records them (`igrpo.json`) and the config asks for them."""

    head: str = "value"
    step_tag: str | None = None
    label_tokens: tuple[str, str] | None = None

    def to_json(self) -> dict:
        return {"head": self.head, "step_tag": self.step_tag,
                "label_tokens": list(self.label_tokens) if self.label_tokens else None}

    @staticmethod
    def from_json(data: dict) -> PrmLayout:
        tokens = data.get("label_tokens")
        return PrmLayout(data.get("head", "value"), data.get("step_tag"), tuple(tokens) if tokens else None)


def prm_head(name: str) -> PrmHead:
    """The entry of head `name` (an unknown one: the registry's error, listing the known ones)."""
    return PRM_HEADS[name]


def layout_of(rm: Any) -> PrmLayout:
    """The layout that `reward_model:` (`rm`) asks for: its head, with the head's default tokens where none is given."""
    entry = prm_head(rm.head)
    tokens = tuple(rm.label_tokens) if rm.label_tokens else entry.label_tokens
    return PrmLayout(rm.head, rm.step_tag or entry.step_tag, tokens)


def check_layout(rm: Any) -> None:
    """Every mistake in the PRM layout that `reward_model:` (`rm`) asks for, before any work (its tokens against a
    tokenizer: the preflight). Raises ValueError naming the field."""
    entry = prm_head(rm.head)
    if rm.step_tag is not None and entry.step_tag is None:
        raise ValueError(f"step_tag: head {rm.head!r} puts no tag after a step (it reads each step's closing "
                         "newline); drop step_tag, or set head: label_tokens or classification")
    if rm.step_tag == "":
        raise ValueError("step_tag: empty; give the tag token, or drop it for the head's default")
    if rm.label_tokens is not None and entry.label_tokens is None:
        raise ValueError(f"label_tokens: head {rm.head!r} reads no label tokens; drop label_tokens, or set "
                         "head: label_tokens")
    tokens = rm.label_tokens
    if tokens is not None and (len(tokens) != 2 or len(set(tokens)) != 2 or "" in tokens):
        raise ValueError(f"label_tokens: {tokens} must be two different tokens, [right, wrong], e.g. ['+', '-']")
    layout = layout_of(rm)
    if layout.label_tokens and layout.step_tag in layout.label_tokens:
        raise ValueError(f"step_tag {layout.step_tag!r} is also a label token: the tag must be its own token")
    shaped = {"head": rm.head != "value", "step_tag": rm.step_tag, "label_tokens": rm.label_tokens, "init": rm.init}
    given = [name for name, value in shaped.items() if value]
    if given and not any(rm_entry(kind).layouts for kind in rm.kinds):
        raise ValueError(f"{', '.join(given)}: only {', '.join(layout_kinds())} has a PRM layout, and kinds "
                         f"{rm.kinds} has none: add one, or drop {', '.join(given)}")


def check_kinds(cfg: Any) -> None:
    """What the RM kinds need of the rest of a `PipelineConfig`: the step scorer among them and scoring steps, MC
    labels collected for the kinds that train on them, then each kind's own check. Raises ValueError."""
    mode, step_rm, kinds = cfg.supervision.mode, cfg.supervision.process_reward_model, cfg.reward_model.kinds
    if supervision_mode(mode).step_rewards:
        if step_rm not in kinds:
            raise ValueError(f"reward_model.kinds must include {step_rm!r} when supervision.mode is '{mode}' "
                             f"(supervision.process_reward_model: its step scores are the step rewards)")
        if not rm_entry(step_rm).scores_steps:
            raise ValueError(f"supervision.process_reward_model: {step_rm!r} scores whole solutions, not steps; "
                             f"give a kind that scores steps: {', '.join(step_kinds())}")
    needs_mc = [kind for kind in kinds if kind in mc_label_kinds()]
    if cfg.collect.rollouts_per_step == 0 and needs_mc:
        others = [k for k in RM_KINDS if k not in mc_label_kinds()]
        raise ValueError(f"collect.rollouts_per_step: 0 collects no Monte-Carlo step labels, which "
                         f"{', '.join(needs_mc)} in reward_model.kinds trains on: set rollouts_per_step >= 1, "
                         f"or train only kinds that need none ({', '.join(others)})")
    for kind in kinds:
        if RM_KINDS[kind].check:
            RM_KINDS[kind].check(cfg)
    _check_oracle(cfg)


def _check_oracle(cfg: Any) -> None:
    """`reward_model.oracle` stands in for the step scorer: a mode with step rewards, a problem set with gold ones."""
    oracle, mode = cfg.reward_model.oracle, cfg.supervision.mode
    if oracle is None:
        return
    if cfg.supervision.process_reward == "prime":
        raise ValueError(f"reward_model.oracle: {oracle!r} gives step labels, and process_reward: prime needs the "
                         "implicit PRM's token rewards: drop the oracle, or use process_reward: progress")
    if not supervision_mode(mode).step_rewards:
        raise ValueError(f"reward_model.oracle: {oracle!r} replaces the PRM's step rewards, which only supervision."
                         f"mode {' or '.join(map(repr, step_reward_modes()))} uses, not {mode!r}; "
                         "drop reward_model.oracle or change the mode")
    with_gold = [kind for kind, p in PROBLEM_SETS.items() if p.problem_set.has_gold_step_labels]
    if cfg.problems.kind not in with_gold:
        raise ValueError(f"reward_model.oracle: {oracle!r} needs gold step labels, which problems.kind "
                         f"{cfg.problems.kind!r} does not have (kinds with them: {', '.join(with_gold)}); "
                         "drop reward_model.oracle")


def move_flat_keys(data: dict) -> tuple[dict, list[tuple[str, str]]]:
    """`reward_model:` data with each kind's older flat keys (`implicit_beta`) moved into its section
    (`implicit: {beta: ...}`), and the (old, new) dotted keys moved. Both given is a ValueError.

    >>> move_flat_keys({"kinds": ["orm"], "orm_loss": "pairwise"})
    ({'kinds': ['orm'], 'orm': {'loss': 'pairwise'}}, [('reward_model.orm_loss', 'reward_model.orm.loss')])
    """
    data, moved = dict(data), []
    for kind, entry in RM_KINDS.items():
        for old, new in entry.moved.items():
            section = data.get(kind) or {}
            if old not in data or not isinstance(section, dict):  # a section that is no mapping: its own error
                continue
            if new in section:
                raise ValueError(f"give reward_model.{kind}.{new} or the older reward_model.{old}, not both")
            data[kind] = {**section, new: data.pop(old)}
            moved.append((f"reward_model.{old}", f"reward_model.{kind}.{new}"))
    return data, moved
