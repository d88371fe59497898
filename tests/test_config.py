"""The run config: the quickstart loads, and every mistake is one ConfigError naming the dotted path of the field.

Loads with ``check_trl=True`` build TRL's GRPOConfig/SFTConfig (a few seconds the first time); only the tests
about the ``grpo:`` pass-through and the full quickstart use them, the rest validate with ``check_trl=False``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import (
    ConfigError,
    PipelineConfig,
    apply_overrides,
    config_diff,
    config_from_dict,
    load_config,
    parse_override,
)

QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def error_of(data: dict, check_trl: bool = False) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, check_trl=check_trl)
    return str(info.value)


# --- the shipped config ----------------------------------------------------------------------------


def test_quickstart_loads_with_trl_checks():
    cfg = load_config(QUICKSTART)
    assert isinstance(cfg, PipelineConfig)
    # Values written in the file, not the defaults: run.rounds defaults to 3 as well, so check others too.
    assert cfg.run.name == "quickstart" and cfg.run.rounds == 3
    assert cfg.supervision.mode == "process"
    assert cfg.grpo["num_generations"] == 8
    # "1.0e-5" must arrive as a float (plain YAML 1.1 would give the string '1.0e-5', which TRL would take).
    assert isinstance(cfg.grpo["learning_rate"], float) and 0 < cfg.grpo["learning_rate"] < 1
    assert cfg.bootstrap.sft_args["learning_rate"] == pytest.approx(2e-3)
    assert cfg.policy.tiny.max_position_embeddings == 128
    assert cfg.run_dir == Path("runs") / "quickstart"


def test_empty_file_gives_the_defaults(tmp_path):
    cfg = load_config(write(tmp_path, ""), check_trl=False)
    assert cfg == PipelineConfig()


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
        ({"reward_model": {"replay_fraction": 1.5}}, "reward_model.replay_fraction: must be between 0 and 1"),
        ({"reward_model": {"holdout_fraction": -0.1}}, "reward_model.holdout_fraction: must be between 0 and 1"),
        ({"collect": {"strategy": "greedy"}}, "collect.strategy: Input should be 'exhaustive' or 'first_error'"),
        ({"run": {"name": "../escape"}}, "run.name: must be letters, digits"),
        ({"run": {"name": "a/b"}}, "run.name: must be letters, digits"),
        ({"run": {"name": "a..b"}}, "run.name: must be letters, digits"),
        ({"policy": {"tiny": {"hidden_size": 30, "num_heads": 4}}}, "policy.tiny: hidden_size 30 must be divisible"),
        ({"problems": {"arithmetic": {"min_steps": 4, "max_steps": 3}}}, "problems.arithmetic: min_steps 4 is above"),
        ({"problems": {"kind": "gsm8k"}}, "problems: gsm8k needs gsm8k.train_path"),
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
    # best_of_n = 32 cannot be drawn from 16 samples per problem.
    assert "eval.best_of_n [32]" in error_of({"eval": {"best_of_n": [4, 32]}})


def test_trl_options_a_mode_would_ignore_are_refused_with_the_reason():
    # rft's advantage is the verifier's 0/1 reward itself: TRL's scale_rewards has nothing to scale.
    message = error_of({"supervision": {"mode": "rft"}, "grpo": {"scale_rewards": "none"}})
    assert message.startswith("grpo.scale_rewards: not used in rft mode") and "no group baseline" in message
    # Process and rft advantages do not come from TRL's combination of reward functions.
    for mode in ("process", "rft"):
        message = error_of({"supervision": {"mode": mode}, "grpo": {"multi_objective_aggregation": "normalize_then_sum"}})
        assert message.startswith("grpo.multi_objective_aggregation: not used in process or rft mode")
    # The pipeline sets TRL's reward weights itself, in every mode: the supervision weights are the knob.
    message = error_of({"supervision": {"mode": "outcome"}, "grpo": {"reward_weights": [1.0]}})
    assert message.startswith("grpo.reward_weights: set by the pipeline") and "supervision.verifier_weight" in message
    # Honoured, so accepted: scale_rewards in outcome and process mode (process mode scales its steps by it).
    for mode in ("outcome", "process"):
        cfg = config_from_dict({"supervision": {"mode": mode}, "grpo": {"scale_rewards": "batch"}}, check_trl=False)
        assert cfg.grpo["scale_rewards"] == "batch"


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
    assert message.startswith("grpo.bogus: not a field of TRL's config")


def test_sft_args_unknown_field_names_it():
    message = error_of({"bootstrap": {"sft_args": {"num_epochz": 3}}}, check_trl=True)
    assert message.startswith("bootstrap.sft_args.num_epochz: not a field of TRL's config")


def test_grpo_string_where_a_number_is_expected():
    # TRL's dataclasses would accept 'abc' and fail hours later inside the optimiser.
    message = error_of({"grpo": {"learning_rate": "abc"}}, check_trl=True)
    assert message == "grpo.learning_rate: expected a number, got 'abc'"


def test_grpo_number_where_a_flag_is_expected():
    # TRL's default for this field is False, so a flag is expected; "sometimes" would be truthy in TRL.
    message = error_of({"grpo": {"mask_truncated_completions": "sometimes"}}, check_trl=True)
    assert message == "grpo.mask_truncated_completions: expected true or false, got 'sometimes'"


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
    with pytest.raises(ConfigError, match=r"run\.yaml: reward_model\.replay_fraction: must be between 0 and 1"):
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


def test_readme_config_reference_is_the_generated_one():
    # Every field is documented where users look: regenerate with pipeline.config.config_reference().
    from pathlib import Path

    from pipeline.config import config_reference

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert config_reference() in readme
