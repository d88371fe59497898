"""`igrpo run` refuses a bad config file or `--set` override with one clear error, before any work; `igrpo eval`
runs the eval phase's code on any policy.

User errors go through the CLI in-process (`main([...])` returns 2 and prints `igrpo: error: ...`) and
must leave no run directory behind.
"""

from __future__ import annotations

import pytest

from flows.cli import main
from tests.helpers import assert_user_error, mini_config, run_cli

pytestmark = pytest.mark.usefixtures("isolated")


# --- the config file ------------------------------------------------------------------------------------


def test_malformed_yaml(tmp_path, capsys):
    rc, err = run_cli(tmp_path, capsys, "run:\n  name: [unclosed\n")
    assert_user_error(tmp_path, rc, err, str(tmp_path / "run.yaml"), "malformed YAML", "line 2")


def test_top_level_not_a_mapping(tmp_path, capsys):
    rc, err = run_cli(tmp_path, capsys, "- run\n- policy\n")
    assert_user_error(tmp_path, rc, err, str(tmp_path / "run.yaml"), "the top level must be a mapping")


@pytest.mark.parametrize(
    ("section", "values", "expected"),
    [
        # unknown keys, at every depth
        ("collect", {"promts_per_round": 4}, "collect.promts_per_round: unknown key"),
        ("policy", {"tiny": {"hiden_size": 64}}, "policy.tiny.hiden_size: unknown key"),
        ("nosuchsection", {"x": 1}, "nosuchsection: unknown key"),
        # wrong types
        ("run", {"rounds": "three"}, "run.rounds: Input should be a valid integer"),
        ("collect", {"temperature": "hot"}, "collect.temperature: Input should be a valid number"),
        ("reward_model", {"kinds": "prm"}, "reward_model.kinds: Input should be a valid list"),
        ("grpo", {"learning_rate": "fast"}, "grpo.learning_rate: expected a number, got 'fast'"),
        ("grpo", {"use_vllm": "yes"}, "grpo.use_vllm: expected true or false"),
        # out of range
        ("reward_model", {"replay_fraction": 1.5}, "reward_model.replay_fraction: Input should be less than or equal to 1"),
        ("run", {"rounds": 0}, "run.rounds: Input should be greater than or equal to 1"),
        ("grpo", {"num_generations": 1}, "grpo.num_generations: must be at least 2"),
        ("eval", {"best_of_n": [2, 64]}, "eval.best_of_n [64] must lie in [1, eval.samples_per_problem]"),
        ("supervision", {"mode": "outcome", "verifier_weight": 0.0}, "outcome mode needs a weight above 0 in supervision.rewards"),
        # a field TRL's configs reject
        ("grpo", {"bogus": 1}, "grpo.bogus: not a field of TRL's GRPOConfig"),
        ("problems", {"prompt_format": "dialog"}, "problems.prompt_format: Input should be 'chat' or 'plain'"),
        ("problems", {"prompt_format": "plain", "system_prompt": "Be brief."},
         "problems: system_prompt: only chat prompts have a system message"),
        ("bootstrap", {"sft_args": {"num_epochz": 2}}, "bootstrap.sft_args.num_epochz: not a field of TRL's SFTConfig"),
    ],
)
def test_bad_config_field_names_it(tmp_path, capsys, section, values, expected):
    data = mini_config(tmp_path)
    data.setdefault(section, {}).update(values)
    rc, err = run_cli(tmp_path, capsys, data)
    assert_user_error(tmp_path, rc, err, str(tmp_path / "run.yaml"), expected)


def test_missing_config_file(tmp_path, capsys):
    capsys.readouterr()
    rc = main(["run", str(tmp_path / "nope.yaml")])
    assert_user_error(tmp_path, rc, capsys.readouterr().err, "nope.yaml", "does not exist")

# --- --set overrides ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("run.nope=1", "run.nope: unknown key"),
        ("nokey", "override 'nokey': expected dotted.key=value"),
        ("run.rounds.deep=1", "override 'run.rounds.deep=1': run.rounds is not a section"),
        ("run..rounds=1", "'run..rounds' is not a dotted key"),
        ("run.rounds=-1", "run.rounds: Input should be greater than or equal to 1"),
        ("reward_model.replay_fraction=1.5", "reward_model.replay_fraction: Input should be less than or equal to 1"),
    ],
)
def test_bad_override_names_it(tmp_path, capsys, override, expected):
    rc, err = run_cli(tmp_path, capsys, mini_config(tmp_path), override)
    assert_user_error(tmp_path, rc, err, expected)


# --- igrpo eval: the eval phase's code on any policy ----------------------------------------------------


@pytest.mark.slow  # the session's finished mini run
def test_igrpo_eval_gives_best_of_n_for_the_reward_models_given_and_remakes_a_rounds_eval_json(finished, tmp_path,
                                                                                             capsys):
    import math

    from flows.cli import main
    from pipeline.rundir import RunDir, read_json

    run = RunDir(finished.cfg.run_dir)
    policy, prm, orm = run.policy(2), run.reward_model(2, "prm"), run.reward_model(2, "orm")
    base = ["eval", str(finished.root / "mini.yaml"), "--policy", str(policy)]

    assert main([*base, "--out", str(tmp_path / "plain.json")]) == 0
    plain = read_json(tmp_path / "plain.json")["metrics"]
    assert {"eval/greedy", "eval/maj@4", "bon/majority@2", "bon/random@4"} <= set(plain)
    assert not any(k.startswith(("bon/prm", "bon/orm", "monitor/")) for k in plain)  # no RM, no shard: skipped

    assert main([*base, "--reward-model", f"prm={prm}", "--out", str(tmp_path / "prm.json")]) == 0
    with_prm = read_json(tmp_path / "prm.json")["metrics"]
    assert {"bon/prm@2", "bon/prm@4", "bon/prm_vote@2", "bon/prm_vote@4"} <= set(with_prm)
    assert not any(k.startswith("bon/orm") for k in with_prm)
    timings = ("eval/completions_per_s",)
    same = lambda a, b: a == b or (math.isnan(a) and math.isnan(b))  # noqa: E731  (no gold step AUC: NaN)
    assert {k for k in with_prm if k in plain} == set(plain)
    assert all(same(with_prm[k], v) for k, v in plain.items() if k not in timings)  # the same seeded samples
    printed = capsys.readouterr().out.split("metric ")[-1].splitlines()[1:]  # the table of the last command
    assert len(printed) == len(with_prm) and len({len(line) for line in printed}) == 1, printed  # values aligned
    assert {line.split()[0]: float(line.split()[1]) for line in printed}["bon/prm_vote@4"] == pytest.approx(
        with_prm["bon/prm_vote@4"], abs=5e-5)

    # --round R samples as round R's eval phase did (seed run.seed + R): with that round's RMs, its eval.json remade
    # (all but the monitor's figures, which read the round's shard).
    assert main([*base, "--round", "2", "--reward-model", f"prm={prm}", "--reward-model", f"orm={orm}",
                 "--out", str(tmp_path / "round2.json")]) == 0
    remade = read_json(tmp_path / "round2.json")["metrics"]
    recorded = {k: v for k, v in read_json(run.eval_json(2))["metrics"].items() if not k.startswith("monitor/")}
    assert set(remade) == set(recorded)
    assert {k for k in recorded if k not in timings and not same(remade[k], recorded[k])} == set()

    assert main([*base, "--reward-model", str(prm)]) == 2
    assert "--reward-model takes KIND=PATH" in capsys.readouterr().err
