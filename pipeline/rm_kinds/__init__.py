"""The reward-model kinds as one table, `RM_KINDS`: torch-free, so the config validates `reward_model.kinds`
without importing transformers.

An entry says how the kind's model is built (a transformers head, one logit, on a policy's backbone), whether it
scores steps (then it can drive process and hybrid mode: `supervision.process_reward_model`), and where its
implementation is: a `RewardModelKind` (training examples and loss, scorer, held-out metrics), imported when first
used. A kind may declare its own config section, `reward_model.<kind>` (`pipeline/rm_kinds/sections.py`), and a check
of the whole config; its texts make the docs' table of kinds (`docs/generate.py`). The reward-model phase, every scorer (`pipeline.reward_model.load_scorer`), a kind's
checkpoints (`pipeline.rm_kinds.loading`) and the eval phase read the table. A new kind is its module plus one
`RM_KINDS.register(NAME, ...)` call (docs/extending.md). The types, tables and lookups are `base.py`, below the kind
modules; this module registers the built-in entries, each implementation imported on first use.

A kind that scores steps is read in one of the published PRM layouts, `PRM_HEADS` (`reward_model.head`): today's
one-logit value head at each step's closing newline, Math-Shepherd's label tokens at a step tag, or Qwen2.5-Math-PRM's
2-class head at a separator. A checkpoint records its layout in `igrpo.json`; loading and scoring read it there.
"""

from __future__ import annotations

from typing import Any

from pipeline.modes import step_reward_modes, supervision_mode
from pipeline.problems import PROBLEM_SETS
from pipeline.rm_kinds.base import (
    AGGREGATIONS,
    PRM_HEADS,
    PRM_TARGETS,
    RM_KINDS,
    PrmHead,
    PrmLayout,
    RewardModelKind,
    RMKindEntry,
    head_math,
    layout_kinds,
    layout_of,
    mc_label_kinds,
    prm_head,
    rm_entry,
    rm_kind,
    step_kinds,
    token_reward_kinds,
)
from pipeline.rm_kinds.sections import ORM_LOSSES, ImplicitSection, OrmSection, check_implicit, check_orm
from pipeline.step_rewards import ORACLES, PROCESS_REWARDS

__all__ = [
    "AGGREGATIONS", "ORM_LOSSES", "PRM_HEADS", "PRM_TARGETS", "RM_KINDS", "PrmHead", "PrmLayout", "RMKindEntry",
    "RewardModelKind", "check_kinds", "check_layout",
    "head_math", "layout_kinds", "layout_of", "mc_label_kinds", "prm_head", "rm_entry", "rm_kind", "step_kinds",
    "token_reward_kinds",
]


# The built-in implementations, each imported on first use (they import torch; the tables must not). The imports
# are real ones, inside functions, so that the import graph (tests/test_architecture.py) sees them.
def _prm() -> RewardModelKind:
    from pipeline.rm_kinds.prm import PRM

    return PRM


def _orm() -> RewardModelKind:
    from pipeline.rm_kinds.orm import ORM

    return ORM


def _implicit() -> RewardModelKind:
    from pipeline.rm_kinds.implicit import IMPLICIT

    return IMPLICIT


def _heads():
    from pipeline.rm_kinds import heads

    return heads


RM_KINDS.update({
    "prm": RMKindEntry(
        head="AutoModelForTokenClassification", scores_steps=True, implementation=_prm,
        description="every step, read at its end; a solution is the `aggregation` (min, last, product) of its steps. "
        "`head`: a value head at each step's closing newline (default), or at a tag token after it, Math-Shepherd's "
        "P(`+`) against `-` (`label_tokens`) or Qwen2.5-Math-PRM's 2 classes (`classification`)",
        training="cross-entropy at step ends on the MC labels, hard or soft (`target`)",
        use="process and hybrid mode (the default `supervision.process_reward_model`); best-of-N and the vote; "
            "`init:` starts from a published PRM ([docs](docs/reward-models.md#start-from-a-published-prm))",
        layouts=True),
    "orm": RMKindEntry(
        head="AutoModelForSequenceClassification", scores_steps=False, implementation=_orm,
        description="the whole solution (one logit, P(correct)); with `orm.loss: pairwise` a ranking score",
        training="`orm.loss: bce` (default) on the verifier's 0/1 outcomes, or `pairwise`: Bradley-Terry with TRL's "
                 "`RewardTrainer` on (correct, incorrect) pairs of one prompt",
        use="an `orm` reward in outcome or hybrid mode; best-of-N and the vote",
        mc_labels=False, config=OrmSection, check=check_orm),
    "implicit": RMKindEntry(
        head="AutoModelForCausalLM", scores_steps=True, implementation=_implicit,
        description="every step: sigmoid of `implicit.beta` times the summed log-ratio of a causal LM to its frozen "
        "reference (the round-0 policy) up to the step's end (implicit PRM, PRIME)",
        training="BCE of sigmoid(beta log pi/pi_ref) on the verifier's outcomes: no step labels, no MC rollouts",
        use="process or hybrid mode without Monte-Carlo labelling; PRIME's credit; scoring costs two LM forwards "
            "([docs](docs/reward-models.md#the-implicit-prm))",
        mc_labels=False, token_rewards=True, config=ImplicitSection, check=check_implicit),
})

PRM_HEADS.update({
    "value": PrmHead("AutoModelForTokenClassification", 1, None, None, lambda: _heads().VALUE,
                     "one logit on the backbone at each step's closing newline: sigmoid(logit), trained by BCE"),
    # Math-Shepherd (peiyi9979/math-shepherd-mistral-7b-prm): the LM head itself; a tag token after each step.
    "label_tokens": PrmHead("AutoModelForCausalLM", None, "ки", ("+", "-"), lambda: _heads().LABEL_TOKENS,
                            "a causal LM: P('+') normalised against '-' at a tag after each step, CE on the label token",
                            lora_task_type="CAUSAL_LM"),
    # Qwen2.5-Math-PRM: a 2-class head on every token, read at a separator after each step.
    "classification": PrmHead("AutoModelForTokenClassification", 2, "<extra_0>", None,
                              lambda: _heads().CLASSIFICATION,
                              "2 classes on the backbone: softmax(logits)[1] at a separator after each step, CE"),
})


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
        _check_token_rewards(cfg)
    needs_mc = [kind for kind in kinds if kind in mc_label_kinds()]
    if cfg.collect.rollouts_per_step == 0 and needs_mc:
        others = [k for k in RM_KINDS if k not in mc_label_kinds()]
        raise ValueError(f"collect.rollouts_per_step: 0 collects no Monte-Carlo step labels, which "
                         f"{', '.join(needs_mc)} in reward_model.kinds trains on: set rollouts_per_step >= 1, "
                         f"or train only kinds that need none ({', '.join(others)})")
    _check_unused_sections(cfg)
    for kind in kinds:
        if RM_KINDS[kind].check:
            RM_KINDS[kind].check(cfg)
    _check_oracle(cfg)


def _check_token_rewards(cfg: Any) -> None:
    """PRIME's credit reads the step scorer's token rewards: its kind must give them (`RMKindEntry.token_rewards`), and
    the exploitable RM (`reward_model.exploit`), which raises step scores only, gives none. (Without them GRPO's first
    batch failed with an AttributeError.) An oracle in its place is `_check_oracle`'s."""
    reward, step_rm, rm = cfg.supervision.process_reward, cfg.supervision.process_reward_model, cfg.reward_model
    if not PROCESS_REWARDS[reward].token_rewards or rm.oracle is not None:
        return
    steps = " or ".join(n for n, e in PROCESS_REWARDS.items() if not e.token_rewards)
    if not rm_entry(step_rm).token_rewards:
        raise ValueError(f"supervision.process_reward_model: {step_rm!r} gives no token rewards, which process_reward: "
                         f"{reward} reads: use a kind that gives them ({', '.join(token_reward_kinds())}), or "
                         f"process_reward: {steps}")
    if rm.exploit is not None:
        raise ValueError(f"reward_model.exploit: the exploitable RM raises step scores and gives no token rewards, "
                         f"which process_reward: {reward} reads: drop reward_model.exploit, or use process_reward: "
                         f"{steps}")


def _check_unused_sections(cfg: Any) -> None:
    """A kind's own section set while the kind is not trained would be ignored: one error naming the fields."""
    for kind, entry in RM_KINDS.items():
        section = getattr(cfg.reward_model, kind, None)
        if entry.config is None or section is None or kind in cfg.reward_model.kinds:
            continue
        default = type(section)().model_dump()  # a stored config spells every field out: compare values
        changed = [name for name, value in section.model_dump().items() if value != default[name]]
        if changed:
            raise ValueError(f"reward_model.{kind} sets {', '.join(changed)}, but {kind!r} is not in "
                             f"reward_model.kinds ({', '.join(cfg.reward_model.kinds)}), so nothing would read it: "
                             f"add {kind!r} to reward_model.kinds, or drop reward_model.{kind}")


def _check_oracle(cfg: Any) -> None:
    """`reward_model.oracle` stands in for the step scorer: a mode with step rewards, and for gold, a problem set with
    gold step labels; `mc_rollouts` only with the MC oracle."""
    oracle, mode, rm = cfg.reward_model.oracle, cfg.supervision.mode, cfg.reward_model
    fields = type(rm).model_fields
    for name, entry in ORACLES.items():  # an oracle's own fields, set under another
        for field in entry.reads:
            if name != oracle and getattr(rm, field) != fields[field].default:
                raise ValueError(f"reward_model.{field}: {getattr(rm, field)} is read only with reward_model.oracle: "
                                 f"{name} (it is {oracle!r}): set the oracle to {name}, or drop {field}")
    if oracle is None:
        return
    reward = cfg.supervision.process_reward
    if PROCESS_REWARDS[reward].token_rewards:
        steps = [n for n, e in PROCESS_REWARDS.items() if not e.token_rewards]
        raise ValueError(f"reward_model.oracle: {oracle!r} gives step values, and process_reward: {reward} needs the "
                         f"implicit PRM's token rewards: drop the oracle, or use process_reward: {' or '.join(steps)}")
    if not supervision_mode(mode).step_rewards:
        raise ValueError(f"reward_model.oracle: {oracle!r} replaces the PRM's step rewards, which only supervision."
                         f"mode {' or '.join(map(repr, step_reward_modes()))} uses, not {mode!r}; "
                         "drop reward_model.oracle or change the mode")
    if not ORACLES[oracle].gold_labels:  # mc: the verifier judges the rollouts, and every problem set has one
        return
    with_gold = [kind for kind, p in PROBLEM_SETS.items() if p.problem_set.has_gold_step_labels]
    if cfg.problems.kind not in with_gold:
        raise ValueError(f"reward_model.oracle: {oracle!r} needs gold step labels, which problems.kind "
                         f"{cfg.problems.kind!r} does not have (kinds with them: {', '.join(with_gold)}); "
                         "drop reward_model.oracle")

