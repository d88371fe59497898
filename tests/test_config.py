"""The run config: the shipped configs load, and every mistake is one ConfigError naming the dotted path of the
field, an optional engine that is not installed included.

Loads with ``check_trl=True`` build TRL's GRPOConfig/SFTConfig (a few seconds the first time); only the tests
about the ``grpo:`` pass-through, the engines and the shipped configs use them, the rest validate with
``check_trl=False``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import ConfigError, PipelineConfig
from pipeline.loading import (
    apply_overrides,
    config_diff,
    config_from_dict,
    load_config,
    parse_override,
    resumed_config_diff,
)
from pipeline.passthrough import grpo_config
from pipeline.preflight import check_extras

QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"
MULTIGPU = Path(__file__).resolve().parents[1] / "configs" / "gsm8k-multigpu.yaml"


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def error_of(data: dict, check_trl: bool = False) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, check_trl=check_trl)
    return str(info.value)


# --- the shipped configs ---------------------------------------------------------------------------


def test_quickstart_loads_with_trl_checks():
    cfg = load_config(QUICKSTART)
    assert isinstance(cfg, PipelineConfig)
    assert cfg.run.name == "quickstart" and cfg.run.rounds == 2
    assert cfg.supervision.mode == "outcome" and cfg.reward_model.kinds == ["prm"]  # the PRM co-trained, in eval
    assert cfg.grpo["num_generations"] == 8
    # "1.0e-5" must arrive as a float (plain YAML 1.1 would give the string '1.0e-5', which TRL would take).
    assert isinstance(cfg.grpo["learning_rate"], float) and 0 < cfg.grpo["learning_rate"] < 1
    assert cfg.bootstrap.sft_args["learning_rate"] == pytest.approx(2e-3)
    assert cfg.policy.tiny.max_position_embeddings == 128
    assert cfg.run_dir == Path("runs") / "quickstart"


@pytest.mark.parametrize("path", sorted(set(QUICKSTART.parent.glob("*.yaml")) - {MULTIGPU}), ids=lambda p: p.name)
def test_every_shipped_config_loads_with_trl_checks(path):  # the multi-GPU one needs vLLM: its own test above
    cfg = load_config(path)
    assert cfg.run.name == path.stem


def test_long_chains_plants_slips_mid_chain_and_fits_the_tiny_policy():
    from pipeline.problems import problem_set_from_config

    cfg = load_config(QUICKSTART.parent / "long-chains.yaml")
    ps = problem_set_from_config(cfg)
    assert {len(p.prompt.split()) - 1 for p in ps.train} == {5, 6}
    assert [p for p in ps.train if not ps.is_correct(p.solution, p)]  # the slips are there
    # The longest prompt and the longest gold solution fit the tiny policy's positions (char-level: 1 token a char).
    longest = max(len(p.prompt) for p in ps.train + ps.test) + cfg.grpo["max_completion_length"]
    assert max(len(p.solution) for p in ps.train) <= cfg.grpo["max_completion_length"]
    assert longest <= cfg.policy.tiny.max_position_embeddings


def test_empty_mapping_gives_the_defaults(tmp_path):
    # An empty file is refused (tests/test_check.py); `{}` is how to ask for every default.
    cfg = load_config(write(tmp_path, "{}\n"), check_trl=False)
    assert cfg == PipelineConfig()


def test_multigpu_recipe_without_vllm_names_every_field(monkeypatch):
    monkeypatch.setattr("pipeline.preflight._installed", lambda module: module != "vllm")
    with pytest.raises(ConfigError) as e:
        check_extras(load_config(MULTIGPU))
    assert str(e.value) == (
        "collect.backend, eval.backend, grpo.use_vllm: needs the [vllm] extra, which is not installed: "
        "pip install 'iterative-grpo[vllm]' (or set collect.backend: hf, eval.backend: hf, grpo.use_vllm: false)"
    )


def test_multigpu_recipe_loads_and_validates(monkeypatch):
    monkeypatch.setattr("pipeline.preflight._installed", lambda module: True)
    cfg = load_config(MULTIGPU, check_trl=True)  # builds TRL's GRPOConfig and SFTConfig from it
    assert cfg.policy.model == "Qwen/Qwen2.5-Math-1.5B-Instruct" and cfg.problems.gsm8k.hub_name == "openai/gsm8k"
    assert cfg.launcher.kind == "accelerate" and cfg.launcher.num_processes == 8
    assert Path(cfg.launcher.config_file).name == "zero2.yaml"
    args = grpo_config(cfg, "unused")
    assert (args.use_vllm, args.vllm_mode, args.bf16, args.beta, args.learning_rate) == (True, "colocate", True, 0.04, 1e-6)
    # 8 processes x 16 per device x 8 accumulation steps = 1024 completions = 64 prompts x G per optimizer step,
    # and max_steps x 64 prompts = the prompts offered per round.
    per_step = 8 * args.per_device_train_batch_size * args.gradient_accumulation_steps
    assert per_step == 1024 and per_step % args.num_generations == 0
    assert args.max_steps * per_step // args.num_generations == cfg.supervision.prompts_per_round
    c = cfg.collect
    assert (c.backend, c.task_runner, c.workers, c.gpus_per_worker) == ("vllm", "ray", 8, 1)
    # Collection shards whole batches: at least one batch per worker.
    assert c.prompts_per_round * c.samples_per_prompt // c.batch_size >= c.workers


# --- file-level errors -----------------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"config file '.*nope\.yaml' does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_malformed_yaml_names_the_file(tmp_path):
    path = write(tmp_path, "run:\n  name: [unclosed\n")
    with pytest.raises(ConfigError, match=r"run\.yaml: malformed YAML"):
        load_config(path, check_trl=False)


def test_top_level_must_be_a_mapping(tmp_path):
    path = write(tmp_path, "- run\n- grpo\n")
    with pytest.raises(ConfigError, match=r"run\.yaml: the top level must be a mapping of sections, got list"):
        load_config(path, check_trl=False)


def test_file_errors_are_prefixed_with_the_path(tmp_path):
    # A field error found while loading a file names the file first, then the dotted field.
    path = write(tmp_path, "run:\n  rounds: 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, check_trl=False)
    assert str(info.value).startswith(f"{path}: run.rounds: ")


# --- field errors name the dotted path ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"foo": 1}, "foo: unknown key"),
        ({"run": {"bogus": 1}}, "run.bogus: unknown key"),
        ({"policy": {"tiny": {"widht": 3}}}, "policy.tiny.widht: unknown key"),
        ({"eval": {"temperature": "hot"}}, "eval.temperature: Input should be a valid number"),
        ({"run": {"rounds": 0}}, "run.rounds: Input should be greater than or equal to 1"),
        ({"reward_model": {"replay_fraction": 1.5}}, "reward_model.replay_fraction: Input should be less than or equal to 1"),
        ({"reward_model": {"holdout_fraction": -0.1}}, "reward_model.holdout_fraction: Input should be greater than or equal to 0"),
        ({"collect": {"strategy": "greedy"}}, "collect.strategy: unknown collection strategy 'greedy'; known: exhaustive, first_error"),
        ({"run": {"name": "../escape"}}, "run.name: must be letters, digits"),
        ({"run": {"name": "a/b"}}, "run.name: must be letters, digits"),
        ({"run": {"name": "a..b"}}, "run.name: must be letters, digits"),
        ({"policy": {"tiny": {"hidden_size": 30, "num_heads": 4}}}, "policy.tiny: hidden_size 30 must be divisible"),
        ({"problems": {"arithmetic": {"min_steps": 4, "max_steps": 3}}}, "problems.arithmetic: min_steps 4 is above"),
        ({"problems": {"kind": "gsm8k"}}, "problems: gsm8k needs gsm8k.train_path"),
        ({"problems": {"kind": "math"}}, "problems.kind: unknown problem set kind 'math'; known: arithmetic, gsm8k, dataset"),
        ({"supervision": {"rewards": {"length": 1.0}}}, "supervision.rewards: unknown reward function 'length'; known: verifier, orm"),
        ({"supervision": {"rewards": {"orm": -1.0}}}, "supervision.rewards.orm: Input should be greater than or equal to 0"),
        ({"supervision": {"rewards": {"orm": 1.0}, "orm_weight": 1.0}}, "supervision: give supervision.rewards or the older"),
        ({"supervision": {"mode": "outcome", "rewards": {}}}, "supervision: outcome mode needs a weight above 0"),
        ({"supervision": {"mode": "rft", "rewards": {"orm": 0.5}}}, "supervision: rft mode rewards the verifier's correct samples only: drop orm"),
        ({"supervision": {"mode": "hybrid", "rewards": {"verifier": 0.0}}}, "supervision: hybrid mode needs a weight above 0"),
        ({"supervision": {"mode": "hybrid", "process_weight": -0.5}}, "supervision.process_weight: Input should be greater than or equal to 0"),
        ({"supervision": {"mode": "hybrid", "process_weight": float("inf")}}, "supervision.process_weight: Input should be a finite number"),
        ({"supervision": {"process_credit": "max"}}, "supervision.process_credit: unknown process credit 'max'; known: sum, min, step"),
        # a knob the mode ignores: refused, naming it
        ({"supervision": {"mode": "outcome", "process_weight": 0.5}},
         "supervision: process_weight 0.5 is only used in hybrid mode, not in outcome mode: remove it, or set mode: hybrid"),
        ({"supervision": {"mode": "process", "process_weight": 2.0}}, "supervision: process_weight 2.0 is only used in hybrid mode, not in process"),
        ({"supervision": {"mode": "rft", "process_credit": "min"}},
         "supervision: process_credit 'min' is only used in process and hybrid mode, not in rft mode"),
        ({"supervision": {"mode": "outcome", "process_baseline": "position"}},
         "supervision: process_baseline 'position' is only used in process and hybrid mode, not in outcome mode"),
        ({"supervision": {"process_baseline": "step"}}, "supervision.process_baseline: unknown process baseline 'step'; known: group, position"),
        ({"reward_model": {"kinds": ["prm", "value"]}}, "reward_model.kinds: unknown reward model kind 'value'; known: prm, orm"),
        ({"reward_model": {"kinds": ["prm", "orm", "prm"]}}, "reward_model.kinds: prm given more than once"),
        ({"reward_model": {"holdout_fraction": 1.0}}, "reward_model.holdout_fraction: Input should be less than 1"),
        ({"reward_model": {"orm": {"loss": "pairwise"}}, "collect": {"samples_per_prompt": 1}},
         "reward_model.orm.loss: pairwise needs a right and a wrong sample of one prompt, and collect.samples_per_prompt is 1"),
        # numpy's and torch's seeds are 32-bit: anything else fails inside the first phase
        ({"run": {"seed": -1}}, "run.seed: Input should be greater than or equal to 0"),
        ({"run": {"seed": 2**32}}, "run.seed: Input should be less than 4294967296"),
        # inf and NaN are never settings (a weight of .inf trained on a reward of inf without a word)
        ({"supervision": {"mode": "outcome", "rewards": {"verifier": float("inf")}}},
         "supervision.rewards.verifier: Input should be a finite number"),
        ({"eval": {"temperature": float("inf")}}, "eval.temperature: Input should be a finite number"),
        ({"reward_model": {"exploit": {"pattern": "x", "bonus": float("nan")}}},
         "reward_model.exploit.bonus: Input should be a finite number"),
        # half a local override of the hub would read the hub's test split against local training rows
        ({"problems": {"kind": "gsm8k", "gsm8k": {"hub_name": "openai/gsm8k", "train_path": "t.jsonl"}}},
         "problems: gsm8k.train_path and gsm8k.test_path go together"),
    ],
)
def test_field_errors_name_the_dotted_path(data, expected):
    assert error_of(data).startswith(expected)


def test_one_line_per_mistake():
    # Two independent mistakes: both reported at once, one per line, so a user fixes them in one go.
    message = error_of({"run": {"rounds": 0}, "eval": {"temperature": "hot"}})
    lines = message.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("run.rounds:") and lines[1].startswith("eval.temperature:")


def test_cross_section_consistency():
    # Process supervision reads a PRM, so the PRM must be among the trained reward models.
    assert "reward_model.kinds must include 'prm'" in error_of({"reward_model": {"kinds": ["orm"]}})
    assert "reward_model.kinds must include 'prm' when supervision.mode is 'hybrid'" in error_of(
        {"supervision": {"mode": "hybrid"}, "reward_model": {"kinds": ["orm"]}})
    # best_of_n = 32 cannot be drawn from 16 samples per problem.
    assert "eval.best_of_n [32]" in error_of({"eval": {"best_of_n": [4, 32]}})
    # A reward scored by a reward model needs that model trained: the orm reward, by either spelling.
    for supervision in ({"mode": "outcome", "rewards": {"orm": 0.5}}, {"mode": "outcome", "orm_weight": 0.5}):
        message = error_of({"supervision": supervision, "reward_model": {"kinds": ["prm"]}})
        assert "reward_model.kinds must include 'orm' when supervision.rewards.orm > 0" in message


# --- supervision.rewards, and the weights it replaced ---------------------------------------------


@pytest.mark.parametrize(
    ("old", "rewards"),
    [
        ({}, {"verifier": 1.0}),  # the defaults: verifier 1, ORM 0 (a zero weight is no entry)
        ({"orm_weight": 0.5}, {"verifier": 1.0, "orm": 0.5}),  # verifier_weight keeps its default, 1
        ({"verifier_weight": 0.0, "orm_weight": 1.0}, {"orm": 1.0}),  # the ORM alone
        ({"verifier_weight": 2.0}, {"verifier": 2.0}),
    ],
)
def test_old_reward_weights_read_as_rewards(old, rewards):
    cfg = config_from_dict({"supervision": {"mode": "outcome", **old}}, check_trl=False)
    assert cfg.supervision.rewards == rewards
    assert cfg == config_from_dict({"supervision": {"mode": "outcome", "rewards": rewards}}, check_trl=False)


def test_old_weights_in_an_override_are_read_too():
    # `--set supervision.orm_weight=1` (how experiments/runner.py ran its ORM arm) still means verifier 1 + ORM 1.
    cfg = config_from_dict({"supervision": {"mode": "outcome"}}, ["supervision.orm_weight=1"], check_trl=False)
    assert cfg.supervision.rewards == {"verifier": 1.0, "orm": 1.0}


# The defaults of main at 2ed3edc (before supervision.rewards) as a run manifest stores them:
# model_dump(mode="json"), with supervision.verifier_weight 1.0 and orm_weight 0.0.
OLD_MANIFEST_CONFIG = Path(__file__).parent / "data" / "config-before-rewards.json"


def test_an_old_run_directorys_config_reads_as_todays_defaults():
    import json

    stored = json.loads(OLD_MANIFEST_CONFIG.read_text())
    assert stored["supervision"]["verifier_weight"] == 1.0 and "rewards" not in stored["supervision"]
    # Its flat reward_model.orm_loss is read no more (no release shipped it): the ORM's section says it now.
    stored["reward_model"]["orm"] = {"loss": stored["reward_model"].pop("orm_loss")}
    assert PipelineConfig.model_validate(stored) == PipelineConfig()
    # So resuming it is no change, while a real change still shows.
    assert resumed_config_diff(stored, PipelineConfig()) == []
    changed = config_from_dict({"supervision": {"rewards": {"verifier": 1.0, "orm": 0.5}}}, check_trl=False)
    assert resumed_config_diff(stored, changed) == ["supervision.rewards.orm: None -> 0.5"]
    # A field added later, stored nowhere, is no change at its default.
    del stored["collect"]["gpus_per_worker"]
    assert resumed_config_diff(stored, PipelineConfig()) == []
    # An outcome run of that time, verifier 0 and ORM 1: the same config as the one written with rewards.
    stored["supervision"].update(mode="outcome", verifier_weight=0.0, orm_weight=1.0)
    now = config_from_dict({"supervision": {"mode": "outcome", "rewards": {"orm": 1.0}}}, check_trl=False)
    assert resumed_config_diff(stored, now) == []


# --- a kind's settings in its own section -----------------------------------------------------------------


def test_a_kinds_flat_key_of_before_is_an_unknown_field():
    # No release shipped the flat keys (`reward_model.implicit_beta`): a kind's settings are its section alone.
    for old in ({"implicit_beta": 0.5}, {"orm_loss": "pairwise"}, {"implicit_online_lr": None}):
        with pytest.raises(ConfigError, match=f"^reward_model.{next(iter(old))}: "):
            config_from_dict({"reward_model": {"kinds": ["prm", "implicit", "orm"], **old}}, check_trl=False)


@pytest.mark.parametrize("rm", [{"implicit": {"online_lr": 1e-6}},
                                {"kinds": ["prm"], "orm": {"loss": "pairwise"}}])
def test_a_kinds_section_set_for_a_kind_not_trained_is_refused(rm):
    # Nothing reads reward_model.<kind> unless the kind is trained: before the sections, the online update set beside
    # a PRM was refused by its cross-field check, and a kind's section must not be silently ignored either.
    with pytest.raises(ConfigError, match=r"reward_model\.(implicit|orm) sets (online_lr|loss), but '(implicit|orm)' "
                                          r"is not in reward_model\.kinds"):
        config_from_dict({"reward_model": rm}, check_trl=False)
    # A stored config spells every section out at its defaults: that is not a setting, and resumes.
    stored = config_from_dict({"reward_model": {"kinds": ["prm"]}}, check_trl=False).model_dump(mode="json")
    assert config_from_dict(stored, check_trl=False).reward_model.kinds == ["prm"]


def test_hybrid_config_and_the_reward_models_it_loads():
    from pipeline.rewards import reward_models_needed

    cfg = config_from_dict({"supervision": {"mode": "hybrid", "process_weight": 0.3, "process_credit": "min"}},
                           check_trl=False)
    assert (cfg.supervision.process_weight, cfg.supervision.process_credit) == (0.3, "min")
    # The PRM for the process term; the outcome term's rewards as in outcome mode, the ORM when weighted.
    assert reward_models_needed(cfg) == {"prm": "hybrid supervision"}
    with_orm = config_from_dict({"supervision": {"mode": "hybrid", "rewards": {"verifier": 1.0, "orm": 0.5}}},
                                check_trl=False)
    assert reward_models_needed(with_orm) == {"prm": "hybrid supervision", "orm": "supervision.rewards.orm > 0"}
    # Defaults, and values equal to them, load in every mode (a stored config writes every field out).
    for mode in ("outcome", "process", "hybrid", "rft"):
        cfg = config_from_dict({"supervision": {"mode": mode, "process_weight": 1.0, "process_credit": "sum",
                                                "process_baseline": "group"}}, check_trl=False)
        assert cfg.supervision.mode == mode
    assert config_from_dict({"supervision": {"process_credit": "min"}}, check_trl=False).supervision.mode == "process"
    assert config_from_dict({"supervision": {"mode": "hybrid", "process_baseline": "position"}},
                            check_trl=False).supervision.process_baseline == "position"
    # w = 0 is allowed (the verifier arm, through the hybrid code path).
    assert config_from_dict({"supervision": {"mode": "hybrid", "process_weight": 0}}, check_trl=False)


def test_trl_options_a_mode_would_ignore_are_refused_with_the_reason():
    # rft's advantage is the verifier's 0/1 reward itself: TRL's scale_rewards has nothing to scale.
    message = error_of({"supervision": {"mode": "rft"}, "grpo": {"scale_rewards": "none"}})
    assert message.startswith("grpo.scale_rewards: not used in rft mode") and "no group baseline" in message
    # Process and rft advantages do not come from TRL's combination of reward functions.
    for mode in ("process", "rft"):
        message = error_of({"supervision": {"mode": mode}, "grpo": {"multi_objective_aggregation": "normalize_then_sum"}})
        assert message.startswith("grpo.multi_objective_aggregation: not used in process or rft mode")
    # The pipeline sets TRL's reward weights itself, in every mode: supervision.rewards is the knob (the message
    # named the deprecated verifier_weight before).
    message = error_of({"supervision": {"mode": "outcome"}, "grpo": {"reward_weights": [1.0]}})
    assert message.startswith("grpo.reward_weights: set by the pipeline") and "supervision.rewards" in message
    assert "verifier_weight" not in message
    message = error_of({"supervision": {"mode": "hybrid"}, "grpo": {"reward_weights": [1.0]}})
    assert message.startswith("grpo.reward_weights: set by the pipeline")
    # Honoured, so accepted: scale_rewards in outcome, process and hybrid mode (process mode scales its steps
    # by it, hybrid both its terms), and multi_objective_aggregation in hybrid (its outcome term is TRL's).
    for mode in ("outcome", "process", "hybrid"):
        cfg = config_from_dict({"supervision": {"mode": mode}, "grpo": {"scale_rewards": "batch"}}, check_trl=False)
        assert cfg.grpo["scale_rewards"] == "batch"
    cfg = config_from_dict({"supervision": {"mode": "hybrid"}, "grpo": {"multi_objective_aggregation": "normalize_then_sum"}},
                           check_trl=False)
    assert cfg.grpo["multi_objective_aggregation"] == "normalize_then_sum"


def test_run_name_that_is_safe_is_kept():
    cfg = config_from_dict({"run": {"name": "quickstart-s1.v2_b"}}, check_trl=False)
    assert cfg.run_dir == Path("runs") / "quickstart-s1.v2_b"


# --- the grpo: pass-through is checked against TRL --------------------------------------------------


def test_grpo_num_generations_below_two_is_refused():
    # TRL refuses one generation per prompt (no group to normalise over); the error says which section.
    message = error_of({"grpo": {"num_generations": 1}}, check_trl=True)
    assert message.startswith("grpo")
    assert "generations" in message


def test_grpo_unknown_field_names_it():
    message = error_of({"grpo": {"bogus": 3}}, check_trl=True)
    assert message.startswith("grpo.bogus: not a field of TRL's GRPOConfig")


def test_sft_args_unknown_field_names_it():
    message = error_of({"bootstrap": {"sft_args": {"num_epochz": 3}}}, check_trl=True)
    assert message.startswith("bootstrap.sft_args.num_epochz: not a field of TRL's SFTConfig")


def test_grpo_string_where_a_number_is_expected():
    # TRL's dataclasses would accept 'abc' and fail hours later inside the optimiser.
    message = error_of({"grpo": {"learning_rate": "abc"}}, check_trl=True)
    assert message.startswith("grpo.learning_rate: expected a number, got 'abc'")


@pytest.mark.parametrize(("grpo", "expected"), [
    # TRL's own arithmetic on it failed first: "grpo: not a field of TRL's GRPOConfig (unsupported operand...)"
    ({"num_generations": "banana"}, "grpo.num_generations: expected an integer or null, got 'banana'"),
    ({"max_steps": 1.5}, "grpo.max_steps: expected an integer, got 1.5"),  # accepted before, and trained on
    ({"use_vllm": "yes"}, "grpo.use_vllm: expected true or false, got 'yes'"),
    ({"max_completion_length": True}, "grpo.max_completion_length: expected an integer or null, got True"),
    ({"top_entropy_quantile": "high"}, "grpo.top_entropy_quantile: expected a number, got 'high'"),
])
def test_grpo_values_are_checked_against_the_type_trl_declares(grpo, expected):
    message = error_of({"supervision": {"mode": "outcome"}, "grpo": grpo}, check_trl=True)
    assert message.startswith(expected) and "TRL's GRPOConfig declares" in message, message


def test_declared_types_accept_what_trl_takes():
    # An int where a float is declared, a name of an enum member, a documented bool for scale_rewards.
    cfg = config_from_dict({"grpo": {"learning_rate": 1, "lr_scheduler_type": "cosine", "scale_rewards": False,
                                     "report_to": ["mlflow"], "max_steps": 3}})
    assert cfg.grpo["scale_rewards"] is False


@pytest.mark.parametrize(("data", "expected"), [
    # the RMs' trainer arguments are built at load too, not first in round 0's RM phase
    ({"reward_model": {"train_args": {"learning_rat": 1e-3}}},
     "reward_model.train_args.learning_rat: not a field of the RMs' TrainingArguments"),
    ({"reward_model": {"train_args": {"learning_rate": "abc"}}},
     "reward_model.train_args.learning_rate: expected a number, got 'abc'"),  # then what declares it
    ({"reward_model": {"train_args": {"num_train_epochs": -1}}},
     "reward_model.train_args.num_train_epochs: must be above 0, got -1"),
    # a pairwise ORM alone trains with TRL's RewardConfig, whose own fields are then fine
    ({"reward_model": {"kinds": ["orm"], "orm": {"loss": "pairwise"},
                       "train_args": {"center_rewards_coefficient": 0.01}},
      "supervision": {"mode": "outcome", "rewards": {"orm": 1.0}}}, None),
    # values TRL accepts when built and fails on (or trains nothing with) after round 0
    ({"grpo": {"temperature": 0}}, "grpo.temperature: must be above 0"),
    ({"grpo": {"per_device_train_batch_size": 0}}, "grpo.per_device_train_batch_size: must be at least 1, got 0"),
    ({"grpo": {"max_completion_length": -3}}, "grpo.max_completion_length: must be at least 1, got -3"),
    ({"grpo": {"learning_rate": float("nan")}}, "grpo.learning_rate: must be a finite number, got nan"),
    ({"bootstrap": {"sft_args": {"learning_rate": -1}}}, "bootstrap.sft_args.learning_rate: must be at least 0, got -1"),
    # every ranged field, not only those above: these three started a run (save_steps: -1 until the first save)
    ({"grpo": {"save_steps": -1}}, "grpo.save_steps: must be above 0, got -1"),
    ({"grpo": {"adam_beta2": 1.5}}, "grpo.adam_beta2: must be in [0, 1), got 1.5"),
    ({"reward_model": {"train_args": {"max_steps": 0}}},
     "reward_model.train_args.max_steps: must be -1 (train num_train_epochs) or at least 1, got 0"),
    ({"grpo": {"save_steps": 0.5, "max_steps": -1, "top_p": 1}}, None),  # a fraction of the steps; the defaults
])
def test_pass_through_values_that_would_fail_after_round_zero_are_refused_at_load(data, expected):
    if expected is None:
        config_from_dict(data, check_trl=True)
    else:
        assert error_of(data, check_trl=True).startswith(expected)


def test_every_pass_through_range_names_a_field_of_trl_or_transformers():
    # A key no config has (renamed or removed upstream) would check nothing; and each range accepts the default.
    import dataclasses

    from trl import GRPOConfig, RewardConfig, SFTConfig

    from pipeline.passthrough import _RANGES

    defaults = {f.name: f.default for c in (GRPOConfig, SFTConfig, RewardConfig) for f in dataclasses.fields(c)}
    assert [key for key in _RANGES if key not in defaults] == []
    numeric = {k: v for k, v in defaults.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert [key for key, (valid, _) in _RANGES.items() if key in numeric and not valid(numeric[key])] == []


def test_malformed_yaml_in_an_override_names_the_override():
    with pytest.raises(ConfigError, match=r"^override 'run.name=\[unclosed': the value is not valid YAML"):
        config_from_dict({}, ["run.name=[unclosed"])


def test_a_config_file_that_is_not_utf8_names_the_file(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("run:\n  name: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.yaml: not UTF-8 text"):
        load_config(path)


def test_grpo_number_where_a_flag_is_expected():
    # TRL's default for this field is False, so a flag is expected; "sometimes" would be truthy in TRL.
    message = error_of({"grpo": {"mask_truncated_completions": "sometimes"}}, check_trl=True)
    assert message.startswith("grpo.mask_truncated_completions: expected true or false, got 'sometimes'")


# --- optional engines (vLLM, Ray): one clear error when absent ---------------------------------------
# vLLM is not installed in CI; where a test needs the config to pass as if it were, `pipeline.preflight._installed`
# is patched, which is the one place that asks whether an extra is there (`check_extras`: every igrpo command).


@pytest.mark.parametrize(
    "sections, fields",
    [
        ({"collect": {"backend": "vllm"}}, "collect.backend"),
        ({"eval": {"backend": "vllm"}}, "eval.backend"),
        ({"grpo": {"use_vllm": True, "vllm_mode": "colocate"}}, "grpo.use_vllm"),
        ({"collect": {"backend": "vllm"}, "grpo": {"use_vllm": True}}, "collect.backend, grpo.use_vllm"),
    ],
)
def test_vllm_without_the_extra_is_one_clear_error(monkeypatch, sections, fields):
    monkeypatch.setattr("pipeline.preflight._installed", lambda module: module != "vllm")
    with pytest.raises(ConfigError) as e:
        check_extras(config_from_dict(sections))
    msg = str(e.value)
    # One line naming every field that asks for vLLM, the install command, and the setting that avoids it.
    assert msg.startswith(f"{fields}: needs the [vllm] extra") and "pip install 'iterative-grpo[vllm]'" in msg
    assert len(msg.splitlines()) == 1


def test_ray_without_the_extra_is_one_clear_error(monkeypatch):
    monkeypatch.setattr("pipeline.preflight._installed", lambda module: module != "prefect_ray")
    with pytest.raises(ConfigError, match=r"^collect.task_runner: needs the \[ray\] extra.*'iterative-grpo\[ray\]'"):
        check_extras(config_from_dict({"collect": {"workers": 2, "task_runner": "ray"}}))
    # One worker never starts a task runner, so it needs no extra.
    cfg = config_from_dict({"collect": {"workers": 1, "task_runner": "ray"}}, check_trl=False)
    assert (cfg.collect.workers, cfg.collect.task_runner) == (1, "ray")


def test_vllm_settings_pass_when_installed_and_reach_trl(monkeypatch):
    monkeypatch.setattr("pipeline.preflight._installed", lambda module: True)
    cfg = config_from_dict({"collect": {"backend": "vllm", "vllm_args": {"gpu_memory_utilization": 0.5}},
                            "eval": {"backend": "vllm"}, "grpo": {"use_vllm": True, "vllm_mode": "server"}})
    assert cfg.collect.backend == cfg.eval.backend == "vllm"
    args = grpo_config(cfg, "unused")
    assert args.use_vllm is True and args.vllm_mode == "server"
    with pytest.raises(ConfigError, match="collect.backend"):
        config_from_dict({"collect": {"backend": "sglang"}})
    with pytest.raises(ConfigError, match="collect.workers"):
        config_from_dict({"collect": {"workers": 0}})


def test_default_config_needs_no_extra(monkeypatch):
    asked = []
    monkeypatch.setattr("pipeline.preflight._installed", lambda module: asked.append(module) or False)
    cfg = config_from_dict({}, check_trl=False)
    assert check_extras(cfg) == "none needed"
    # With no extra installed the defaults load, asking for none, and run on the built-in engines:
    # HF generate for collection and eval, no vLLM in GRPO, one collection worker in this process.
    assert asked == []
    assert (cfg.collect.backend, cfg.eval.backend) == ("hf", "hf")
    assert (cfg.collect.workers, cfg.collect.task_runner) == (1, "thread")
    assert grpo_config(cfg, "unused").use_vllm is False


# --- --set overrides --------------------------------------------------------------------------------


def test_overrides_on_load_are_typed():
    cfg = load_config(QUICKSTART, ["grpo.learning_rate=1e-5", "run.seed=3"])
    # "1e-5" is a float (not the string YAML 1.1 would give), "3" an int.
    assert cfg.grpo["learning_rate"] == 1e-5 and type(cfg.grpo["learning_rate"]) is float
    assert cfg.run.seed == 3 and type(cfg.run.seed) is int
    # Everything else stays as the file says.
    assert cfg.grpo["num_generations"] == 8


def test_override_creates_missing_sections_and_nested_keys():
    data = apply_overrides({}, ["reward_model.train_args.learning_rate=2e-4", "run.name=abc", "policy.lora.r=8"])
    assert data == {
        "reward_model": {"train_args": {"learning_rate": 2e-4}},
        "run": {"name": "abc"},
        "policy": {"lora": {"r": 8}},
    }


def test_override_values_parse_as_yaml():
    assert parse_override("eval.best_of_n=[1, 2]") == (["eval", "best_of_n"], [1, 2])
    assert parse_override("reward_model.warm_start=false") == (["reward_model", "warm_start"], False)
    # Only the first '=' splits: the value may hold one.
    assert parse_override("run.name=a=b") == (["run", "name"], "a=b")


def test_override_errors():
    with pytest.raises(ConfigError, match=r"override 'nokey': expected dotted.key=value"):
        apply_overrides({}, ["nokey"])
    with pytest.raises(ConfigError, match=r"override 'a b=1': 'a b' is not a dotted key"):
        apply_overrides({}, ["a b=1"])
    with pytest.raises(ConfigError, match=r"override 'run.name.x=1': run.name is not a section"):
        apply_overrides({"run": {"name": "q"}}, ["run.name.x=1"])


def test_override_error_is_validated_like_the_file(tmp_path):
    # A bad value given by --set is reported exactly as if written in the file.
    with pytest.raises(ConfigError, match=r"run\.yaml: reward_model\.replay_fraction: Input should be less than or equal to 1"):
        load_config(write(tmp_path, "run: {rounds: 2}\n"), ["reward_model.replay_fraction=1.5"], check_trl=False)


# --- config_diff --------------------------------------------------------------------------------------


def test_config_diff_lists_changed_dotted_keys():
    a = {"run": {"seed": 0, "name": "q"}, "grpo": {"learning_rate": 5e-5}, "eval": {"best_of_n": [4, 16]}}
    b = {"run": {"seed": 1, "name": "q"}, "grpo": {}, "eval": {"best_of_n": [4, 16]}, "extra": 1}
    assert config_diff(a, b) == [
        "extra: None -> 1",
        "grpo.learning_rate: 5e-05 -> None",
        "run.seed: 0 -> 1",
    ]
    assert config_diff(a, a) == []


def test_config_diff_of_real_configs_after_an_override():
    base = config_from_dict({}, check_trl=False).model_dump()
    changed = config_from_dict({}, ["run.seed=3", "collect.rollouts_per_step=8"], check_trl=False).model_dump()
    assert config_diff(base, changed) == ["collect.rollouts_per_step: 4 -> 8", "run.seed: 0 -> 3"]


def test_overrides_leave_the_callers_dict_as_it_was():
    """config_from_dict applied `--set` overrides inside the caller's nested sections, so a second config made
    from the same dict (a manifest's config, experiments/prm_study.py's variants) inherited the first one's overrides."""
    data = {"reward_model": {"target": "soft", "train_args": {"learning_rate": 3e-4}}}
    first = config_from_dict(data, ["reward_model.target=hard", "reward_model.train_args.learning_rate=1e-4"],
                             check_trl=False)
    second = config_from_dict(data, ["reward_model.train_args.num_train_epochs=3"], check_trl=False)
    assert (first.reward_model.target, first.reward_model.train_args["learning_rate"]) == ("hard", 1e-4)
    assert data == {"reward_model": {"target": "soft", "train_args": {"learning_rate": 3e-4}}}
    assert (second.reward_model.target, second.reward_model.train_args["learning_rate"]) == ("soft", 3e-4)


def test_the_tiny_policy_trains_without_activation_checkpointing():
    # TRL turns activation checkpointing on by default: for the tiny policy it recomputed every layer's forward in
    # the backward pass (a quarter of the quickstart's SFT time) to save memory it does not need. The weights
    # after training are the same either way (checked bitwise on the quickstart's SFT, 4 steps).
    from pipeline.passthrough import sft_config

    tiny = config_from_dict({})
    assert not sft_config(tiny, "unused").activation_checkpointing
    assert not grpo_config(tiny, "unused").activation_checkpointing
    asked = config_from_dict({"bootstrap": {"sft_args": {"gradient_checkpointing": True}}})
    assert sft_config(asked, "unused").activation_checkpointing  # a value the user gives wins
    real = config_from_dict({"policy": {"model": "org/some-model"}}, check_trl=False)
    assert sft_config(real, "unused").activation_checkpointing  # a real model keeps TRL's default
