"""experiments/step_credit.py (issue 57, points 1 and 2): every sweep setting's config loads with its budget and arms;
a plan file's mistakes are named by file and field; the plan is enforced on real commits (a throwaway git repository:
the plan's commit, a descendant, a sibling branch); the rule's worked examples (Holm over the plan's arms, the seeds
at or above); the share of the oracle's gain and its bootstrap interval; the sweep's and the study's tables from unit
files shaped like the kept ones (docs/experiments/credit/long-chains/verifier-s0.json: `unit`, `commit`, `date`,
`machine`, `seconds`, `overrides`, `rounds` with string keys)."""

from __future__ import annotations

import argparse
import dataclasses
import doctest
import json
import math
import subprocess
from pathlib import Path

import pytest

from bench._common import ROOT
from experiments import plans
from experiments import step_credit as sc
from pipeline.loading import load_config

PLAN = """# Plan: a study

Prose, then the machine-readable part:

```yaml
task: sparse-middle
arms: [verifier, oracle-progress, prm-progress]
seeds: [0, 1, 2, 3, 4]
metric: eval/maj@8
round: 1
rule: {test: holm-paired-t, alpha: 0.05, min_seeds_at_or_above: 4}
```
"""


def write_plan(path: Path, text: str = PLAN) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def unit(name: str, r0: dict, r1: dict, commit: str = "abc1234", seconds: float = 200.0) -> dict:
    """A kept unit file as the runner writes it: its rounds' metrics under string keys, as JSON gives them back."""
    return {"unit": name, "commit": commit, "date": "2026-12-07", "machine": "AMD EPYC, 2 cores, torch 2.13.0+cpu",
            "seconds": seconds, "overrides": ["supervision.mode=outcome"], "start": "0123456789ab",
            "rounds": {"0": {"eval/greedy": 0.3, **r0}, "1": {"eval/greedy": 0.4, **r1}}}


# --- point 1: the settings ------------------------------------------------------------------------------


def test_every_setting_loads_with_the_sweep_budget_and_both_arms():
    # A misspelt path (`problems.arithmetic.sft_noise_where`) is a ConfigError at load: so every override is a field.
    for setting, overrides in sc.SETTINGS.items():
        for arm in sc.SWEEP_ARMS:
            cfg = load_config(ROOT / sc.CONFIG, [*overrides, *sc.SWEEP_BUDGET, *sc.ARMS[arm]])
            assert (cfg.run.rounds, cfg.eval.num_problems, cfg.eval.samples_per_problem, cfg.eval.best_of_n,
                    cfg.collect.prompts_per_round, cfg.grpo["max_steps"]) == (1, 200, 8, [4], 64, 80)
    sets = {s: load_config(ROOT / sc.CONFIG, [*o, *sc.SWEEP_BUDGET]).problems.arithmetic
            for s, o in sc.SETTINGS.items()}
    assert {s: (p.sft_noise, p.sft_noise_at, p.min_steps, p.max_steps) for s, p in sets.items()} == {
        "sparse-middle": (0.7, ["middle"], 2, 3), "sparse-answer": (0.7, ["answer"], 2, 3),
        "sparse-weak-sft": (0.3, ["middle"], 2, 3), "middle": (0.3, ["middle"], 2, 3),
        "long-middle": (0.5, ["middle"], 4, 5), "long-sparse": (0.7, ["middle"], 4, 5)}
    long = load_config(ROOT / sc.CONFIG, sc.SETTINGS["long-sparse"])
    assert (long.grpo["max_completion_length"], long.collect.max_new_tokens, long.eval.max_new_tokens) == (64, 64, 64)
    weak = load_config(ROOT / sc.CONFIG, sc.SETTINGS["sparse-weak-sft"])
    assert weak.bootstrap.sft_args["num_train_epochs"] == 2


def test_a_unit_runs_the_plans_round_from_its_seeds_sft_policy(tmp_path):
    # SWEEP_BUDGET says run.rounds=1; a study's round (here 2) and an arm's own budget come after it and win.
    a = argparse.Namespace(runs_dir="x", figures="y", smoke=False, experiment="x", tracking_uri=None)
    units = sc.Units(a, tmp_path / "study", tmp_path / "figures", sc.CONFIG,
                     [*sc.SETTINGS["long-sparse"], *sc.SWEEP_BUDGET], 2)
    cfg = units.arm_config("mc-progress-wc", 3)
    assert (cfg.run.rounds, cfg.run.seed, cfg.run.name, cfg.grpo["max_steps"], cfg.bootstrap.sft) == (
        2, 3, "study-mc-progress-wc-s3", 22, False)
    assert cfg.policy.model == str(tmp_path / "study" / "sft-s3" / "policy")


def test_the_matched_verifier_gets_the_grpo_wall_clock_of_its_seeds_costliest_arm(tmp_path):
    # Seed 3's verifier trained 40 s a round and its vineppo 150 s: 80 steps x 150 / 40 = 300 steps of 8 prompts.
    # Seed 4's runtimes (another ratio) must not enter seed 3's; the oracle's and the verifier's own do not count.
    figures = tmp_path / "figures"
    figures.mkdir()
    kept = {"verifier-s3": 40.0, "vineppo-s3": 150.0, "oracle-progress-s3": 41.0, "verifier-s4": 40.0,
            "vineppo-s4": 400.0}
    for name, seconds in kept.items():
        (figures / f"{name}.json").write_text(json.dumps({"grpo_seconds": {"1": seconds}}))
    a = argparse.Namespace(runs_dir="x", figures="y", smoke=False, experiment="x", tracking_uri=None)
    units = sc.Units(a, tmp_path / "study", figures, sc.CONFIG, [*sc.SETTINGS["long-sparse"], *sc.SWEEP_BUDGET], 1)
    own = units.arm_overrides("verifier-matched", 3, ["verifier", "oracle-progress", "vineppo", "verifier-matched"])
    assert own == ["supervision.mode=outcome", "grpo.max_steps=300", "supervision.prompts_per_round=2400"]
    cfg = units.arm_config("verifier-matched", 3, own)
    assert (cfg.grpo["max_steps"], cfg.supervision.prompts_per_round, cfg.supervision.mode) == (300, 2400, "outcome")
    with pytest.raises(ValueError, match="no kept unit file"):  # seed 5's arms have not run: it cannot run first
        units.arm_overrides("verifier-matched", 5, ["verifier", "vineppo"])
    assert units.arm_overrides("vineppo", 3, []) == sc.ARMS["vineppo"]


def test_a_study_runs_the_matched_verifier_after_its_seeds_other_arms(tmp_path, monkeypatch):
    plan = sc.load_plan(write_plan(tmp_path / "plan.md", PLAN.replace(
        "arms: [verifier, oracle-progress, prm-progress]", "arms: [verifier-matched, verifier, oracle-progress]")))
    a = argparse.Namespace(runs_dir="x", figures="y", smoke=False, experiment="x", tracking_uri=None, seeds=[1, 3])
    units = sc.Units(a, tmp_path / "study", tmp_path / "figures", plan.config, list(plan.overrides), plan.round)
    calls = []
    monkeypatch.setattr(units, "run_arms", lambda seeds, arms, after: calls.append((seeds, arms)))
    sc.run_study(a, plan, units)
    assert calls == [([1, 3], ["verifier", "oracle-progress", "verifier-matched"])]
    with pytest.raises(plans.PlanError, match="seed 7 is not in the plan"):
        sc.run_study(argparse.Namespace(**{**vars(a), "seeds": [7]}), plan, units)
    sc.run_study(argparse.Namespace(**{**vars(a), "seeds": None, "arms": ["verifier-matched", "verifier"]}), plan,
                 units)
    assert calls[-1] == ([0, 1, 2, 3, 4], ["verifier", "verifier-matched"])
    with pytest.raises(plans.PlanError, match="arm 'vineppo' is not in the plan"):
        sc.run_study(argparse.Namespace(**{**vars(a), "arms": ["vineppo"]}), plan, units)


# --- point 2: the plan ----------------------------------------------------------------------------------


def test_a_plan_loads(tmp_path):
    plan = sc.load_plan(write_plan(tmp_path / "plan.md"))
    assert (plan.config, plan.arms, plan.tested, plan.seeds, plan.metric, plan.round, plan.alpha, plan.min_seeds,
            plan.oracle) == (sc.CONFIG, ("verifier", "oracle-progress", "prm-progress"),
                             ("oracle-progress", "prm-progress"), (0, 1, 2, 3, 4), "eval/maj@8", 1, 0.05, 4,
                             "oracle-progress")
    assert plan.overrides == (*sc.SETTINGS["sparse-middle"], *sc.SWEEP_BUDGET)


@pytest.mark.parametrize("old, new, field", [
    ("```yaml", "```", "```yaml"),  # no yaml block
    ("round: 1", "round: 1\nrounds: 2", "rounds"),  # unknown field
    ("metric: eval/maj@8\n", "", "metric"),  # missing
    ("task: sparse-middle", "task: sparse-centre", "task"),
    ("task: sparse-middle", "task: {setting: middle, overrides: [eval.num_problems]}", "task.overrides"),
    ("task: sparse-middle", "task: {config: configs/none.yaml}", "task.config"),
    ("[verifier, oracle-progress, prm-progress]", "[verifier, oracle-progess]", "arms"),
    ("[verifier, oracle-progress, prm-progress]", "[oracle-progress, prm-progress]", "arms"),  # no control
    ("[0, 1, 2, 3, 4]", "[0]", "seeds"),  # no t over one seed
    ("[0, 1, 2, 3, 4]", "[0, 1, 1]", "seeds"),
    ("eval/maj@8", "maj@8", "metric"),
    ("round: 1", "round: 0", "round"),
    ("test: holm-paired-t", "test: paired-t", "rule.test"),
    ("alpha: 0.05", "alpha: 5", "rule.alpha"),
    ("min_seeds_at_or_above: 4", "min_seeds_at_or_above: 6", "rule.min_seeds_at_or_above"),
    ("round: 1", "round: 1\noracle: prm-progresss", "oracle"),
])
def test_a_bad_plan_is_named_by_file_and_field(tmp_path, old, new, field):
    assert old in PLAN
    path = write_plan(tmp_path / "plan.md", PLAN.replace(old, new))
    with pytest.raises(plans.PlanError) as e:
        sc.load_plan(path)
    assert str(e.value).startswith(f"{path}: {field}: ")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path) -> dict:
    """A throwaway repository: `base`, then `plan` (adds plan.md) and `after` on main; `sibling` on a branch from
    `base`, which never saw the plan. Checked out at `after`."""
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    commits = {}
    for name in ("base", "plan", "after"):
        if name == "plan":
            write_plan(r / "plan.md")
        (r / f"{name}.txt").write_text(name)
        git(r, "add", "-A")
        git(r, "commit", "-q", "-m", name)
        commits[name] = git(r, "rev-parse", "HEAD")
    git(r, "checkout", "-q", "-b", "side", commits["base"])
    (r / "side.txt").write_text("side")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "sibling")
    commits["sibling"] = git(r, "rev-parse", "HEAD")
    git(r, "checkout", "-q", "main")
    return {"path": r, **commits}


def test_plan_commit_is_the_commit_that_added_it_and_an_uncommitted_plan_is_refused(repo, tmp_path):
    assert plans.plan_commit(repo["path"] / "plan.md") == repo["plan"]
    git(repo["path"], "rm", "-q", "plan.md")
    git(repo["path"], "commit", "-q", "-m", "drop the plan")
    write_plan(repo["path"] / "plan.md")
    git(repo["path"], "add", "plan.md")
    git(repo["path"], "commit", "-q", "-m", "add it again")
    assert plans.plan_commit(repo["path"] / "plan.md") == repo["plan"]  # the first add, not the newest
    (repo["path"] / "plan.md").write_text(PLAN.replace("round: 1", "round: 2"))
    with pytest.raises(plans.PlanError, match="plan.md: the plan has changes not committed"):
        plans.plan_commit(repo["path"] / "plan.md")
    new = write_plan(repo["path"] / "new-plan.md")
    with pytest.raises(plans.PlanError, match="new-plan.md: the plan is not committed"):
        plans.plan_commit(new)


def test_check_units_refuses_a_sibling_commit_an_unplanned_arm_and_seed_and_flags_a_dirty_one(repo):
    plan = sc.load_plan(repo["path"] / "plan.md")
    r = {"0": {"eval/maj@8": 0.5}}

    def kept(commit: str) -> dict:
        return {"commit": commit, "rounds": r, "seconds": 1.0}

    ok = {"sft-s0": kept(repo["plan"][:7]), "verifier-s0": kept(repo["after"][:7]),
          "prm-progress-s1": kept(repo["after"][:7] + "-dirty")}
    assert plans.check_units(plan, ok, "figs") == [
        f"figs/prm-progress-s1.json ran from {repo['after'][:7]} with uncommitted changes (`-dirty`)."]
    refusals = {
        "oracle-progress-s0": (kept(repo["sibling"][:7]), "does not descend from the plan's"),
        "oracle-progress-s2": (kept(repo["base"][:7] + "-dirty"), "does not descend from the plan's"),
        "verifier-s3": (kept("0000000"), "is not a commit of this repository"),
        "implicit-s0": (kept(repo["after"][:7]), "arm 'implicit' is not in the plan"),
        "verifier-s7": (kept(repo["after"][:7]), "seed '7' is not in the plan"),
    }
    for name, (k, why) in refusals.items():
        with pytest.raises(plans.PlanError) as e:
            plans.check_units(plan, {**ok, name: k}, "figs")
        assert str(e.value).startswith(f"figs/{name}.json: ") and why in str(e.value), str(e.value)
        assert "\n" not in str(e.value)  # one sentence for the one refused unit


def test_the_study_refuses_to_start_without_a_committed_plan_off_its_line_or_over_foreign_units(repo, tmp_path):
    a = argparse.Namespace(plan=str(repo["path"] / "plan.md"), figures=str(tmp_path / "figs"), runs_dir="x",
                           smoke=False, experiment="x", tracking_uri=None)
    plan, units = sc.study_units(a, code=repo["path"])  # HEAD is `after`: a descendant
    assert units.extra["plan_commit"] == repo["plan"] and units.rounds == plan.round == 1
    assert units.task == [*sc.SETTINGS["sparse-middle"], *sc.SWEEP_BUDGET]
    # The code checked out at the sibling (a worktree of the same repository), the plan read from main's checkout.
    git(repo["path"], "worktree", "add", "-q", str(tmp_path / "wt"), "side")
    with pytest.raises(plans.PlanError, match="does not descend from the plan's commit"):
        sc.study_units(a, code=tmp_path / "wt")
    with pytest.raises(plans.PlanError, match="does not descend from the plan's commit"):  # this repository: no such
        sc.study_units(a)
    assert plans.descends("HEAD", repo["plan"], repo["path"]) is True
    assert plans.descends("HEAD", repo["plan"], tmp_path / "wt") is False
    assert plans.descends("--help", repo["plan"], repo["path"]) is None  # never passed to git as an option
    (tmp_path / "figs" / "study").mkdir(parents=True)
    (tmp_path / "figs" / "study" / "verifier-s0.json").write_text(f'{{"commit": "{repo["sibling"][:7]}"}}')
    with pytest.raises(plans.PlanError, match="verifier-s0.json: its commit"):  # a unit kept from off the plan's line
        sc.study_units(a, code=repo["path"])
    with pytest.raises(SystemExit, match="the plan is not committed"):
        sc.main(["study", "--plan", str(write_plan(tmp_path / "loose" / "plan.md"))])


# --- point 2: the rule, worked examples -----------------------------------------------------------------


def t4_sf(t: float) -> float:
    """P(T >= t) for Student's t with 4 df, in closed form: 1/2 - (3/8) u (1 - u^2 / 12), u = t / sqrt(1 + t^2/4)."""
    u = t / math.sqrt(1 + t * t / 4)
    return 0.5 - 3 / 8 * u * (1 - u * u / 12)


def plan_of(tmp_path, arms: list[str], **rule) -> plans.Plan:
    base = sc.load_plan(write_plan(tmp_path / "plan.md"))
    return dataclasses.replace(base, arms=("verifier", *arms), **rule)


def test_decide_worked_example_an_arm_passes_uncorrected_but_not_holm(tmp_path):
    """Three arms, 5 seeds, alpha 0.05, min 4 seeds at or above.

    A: gaps 0.04 0.03 0.05 0.02 0.06: mean 0.04, deviations 0 -.01 .01 -.02 .02, SS 10e-4, var 2.5e-4, SD 0.015811,
       SE 0.0070711, t = 0.04 / 0.0070711 = 5.6569 (4 sqrt 2), p = 0.002406 (4 df).
    B: gaps 0.01 0.02 0 0.03 0.01: mean 0.014, deviations -.004 .006 -.014 .016 -.004, SS 5.2e-4, var 1.3e-4,
       SD 0.011402, SE 0.0050990, t = 2.7456, p = 0.025803: below alpha 0.05 (the uncorrected rule passes it, 5 of 5
       seeds at or above) but above Holm's 0.05 / 2 = 0.025 at rank 2.
    C: gaps -0.01 0 0.01 -0.02 0: mean -0.004, SE 0.0050990, t = -0.7845, p = 0.76169, rank 3 (threshold 0.05).
    Holm: A's 0.002406 <= 0.05 / 3 = 0.016667 passes, B stops it. A pays; B and C do not.
    """
    plan = plan_of(tmp_path, ["a", "b", "c"])
    gaps = {"a": dict(enumerate([0.04, 0.03, 0.05, 0.02, 0.06])), "b": dict(enumerate([0.01, 0.02, 0.0, 0.03, 0.01])),
            "c": dict(enumerate([-0.01, 0.0, 0.01, -0.02, 0.0]))}
    v = plans.decide(plan, gaps)
    assert [round(v[x].t, 4) for x in "abc"] == [5.6569, 2.7456, -0.7845]
    assert [v[x].p for x in "abc"] == pytest.approx([t4_sf(5.656854), t4_sf(2.745626), t4_sf(-0.784465)], abs=1e-6)
    assert [round(v[x].p, 6) for x in "abc"] == [0.002406, 0.025803, 0.76169]
    assert [(v[x].rank, v[x].threshold) for x in "abc"] == [(1, pytest.approx(0.05 / 3)), (2, 0.025), (3, 0.05)]
    assert v["b"].p < 0.05 and v["b"].at_or_above == 5  # the uncorrected rule would say it pays
    assert [(v[x].holm, v[x].pays) for x in "abc"] == [(True, True), (False, False), (False, False)]
    assert (v["a"].mean, v["a"].se) == pytest.approx((0.04, 0.0070711), abs=1e-7)
    # With B alone in the family (m = 1) the same gaps pay: the correction is what fails it above.
    assert plans.decide(plan_of(tmp_path, ["b"]), {"b": gaps["b"]})["b"].pays


def test_decide_worked_example_the_seeds_at_or_above_and_a_missing_arm(tmp_path):
    """One arm tested (m = 1): gaps 0.05 0.06 0.05 -0.001 -0.001, mean 0.0316, deviations .0184 .0284 .0184 -.0326
    -.0326, SS 36.092e-4, var 9.023e-4, SD 0.030038, SE 0.013434, t = 2.3523, p = 0.0392 <= 0.05: Holm passes it,
    but 3 of 5 seeds are at or above, under the plan's 4: it does not pay. With min 3 it pays. An arm of the plan
    with no gaps has p NaN: it fails, and still counts in m (the other is tested at 0.05 / 2)."""
    gaps = {"x": dict(enumerate([0.05, 0.06, 0.05, -0.001, -0.001]))}
    v = plans.decide(plan_of(tmp_path, ["x"]), gaps)["x"]
    assert (round(v.t, 4), round(v.p, 4), v.holm, v.at_or_above, v.pays) == (2.3523, 0.0392, True, 3, False)
    assert v.p == pytest.approx(t4_sf(2.352321), abs=1e-6)
    assert plans.decide(plan_of(tmp_path, ["x"], min_seeds=3), gaps)["x"].pays
    both = plans.decide(plan_of(tmp_path, ["x", "y"]), gaps)
    assert math.isnan(both["y"].p) and not both["y"].pays and both["x"].threshold == 0.025 and not both["x"].holm
    with pytest.raises(ValueError, match="not tested by the plan"):
        plans.decide(plan_of(tmp_path, ["x"]), {**gaps, "z": {0: 0.1}})


def test_paired_t_edges():
    assert all(math.isnan(x) for x in plans.paired_t([0.1]))  # one seed: no spread, no test
    assert plans.paired_t([0.01, 0.01, 0.01]) == (math.inf, 0.0)
    assert plans.paired_t([-0.01, -0.01]) == (-math.inf, 1.0)


def test_oracle_share_and_its_bootstrap_interval():
    # Every seed's arm gap half the oracle's: every resample's ratio is 0.5, so the interval is one point.
    assert plans.oracle_share([0.01, 0.02, 0.015, 0.005], [0.02, 0.04, 0.03, 0.01]) == (0.5, 0.5, 0.5, 0.95)
    # Two seeds: resamples (0,0) 0.01/0.02 = 0.5, (1,1) 0.03/0.02 = 1.5, mixed 0.04/0.04 = 1 (half of them); each
    # end holds ~1/4 of the resamples, more than the 2.5% tail: the interval is [0.5, 1.5] around the share 1.0.
    assert plans.oracle_share([0.01, 0.03], [0.02, 0.02]) == (1.0, 0.5, 1.5, 0.95)
    # Oracle gaps 0.04 and -0.02: a quarter of the resamples have no oracle gain (more than the tail): unbounded.
    assert plans.oracle_share([0.01, 0.0], [0.04, -0.02])[1:3] == (-math.inf, math.inf)
    assert math.isnan(plans.oracle_share([0.01, 0.0], [0.0, -0.02]).share)  # no oracle gain to share
    noisy = ([0.01, 0.02, -0.005, 0.015, 0.0], [0.03, 0.035, 0.02, 0.04, 0.025])
    s = plans.oracle_share(*noisy)
    assert s == plans.oracle_share(*noisy) and s != plans.oracle_share(*noisy, seed=1)  # deterministic, by its seed
    assert s.share == pytest.approx(0.008 / 0.03) and s.low < s.share < s.high  # means 0.008 and 0.03
    with pytest.raises(ValueError, match="paired gaps"):
        plans.oracle_share([0.1], [0.1, 0.2])


def test_the_modules_doctests():
    result = doctest.testmod(plans)
    assert result.failed == 0 and result.attempted >= 3  # paired_t, recorded_commit, oracle_share


# --- the tables: pure functions of unit files -------------------------------------------------------------


def sweep_units(base: tuple[float, float], oracle: tuple[float, float], r0: float = 0.3, wrong: float | None = None,
                per_problem: bool = False):
    """Two seeds of one setting: the verifier's round-1 Maj@8 `base[s]`, the oracle's `oracle[s]`; Pass@1 0.1 lower.
    `per_problem`: round 1's Pass@1 on 2 eval problems a seed, verifier 0 0.5 and 0.5 0.5, oracle 0.5 0.5 and 0.5 1:
    differences 0.5 0 0 0.5 pooled, mean 0.25, SD sqrt(4 x 0.25^2 / 3) = 0.2887, paired SE 0.2887 / 2 = 0.1443."""
    out, pp = {}, {"verifier": ([0.0, 0.5], [0.5, 0.5]), "oracle-progress": ([0.5, 0.5], [0.5, 1.0])}
    for s in (0, 1):
        zero = {"eval/pass@1": r0 - 0.1 + s / 100, "eval/maj@8": r0 + s / 100}
        for arm, m in (("verifier", base[s]), ("oracle-progress", oracle[s])):
            extra = {sc.ALL_WRONG: wrong} if wrong is not None and arm == "verifier" else {}
            out[f"{arm}-s{s}"] = unit(f"{arm}-s{s}", zero, {"eval/maj@8": m, "eval/pass@1": m - 0.1, **extra},
                                      seconds=200.0 + 10 * s + (20 if arm != "verifier" else 0))
            if per_problem:
                out[f"{arm}-s{s}"]["per_problem"] = {"1": {"pass@1": pp[arm][s]}}
        out[f"sft-s{s}"] = {"unit": f"sft-s{s}", "commit": "abc1234", "seconds": 90.0, "metrics": {}}
    return out


def test_the_sweep_table_from_unit_files():
    kept = {"sparse-middle": sweep_units((0.40, 0.42), (0.45, 0.48), per_problem=True),  # +0.05, +0.06
            "middle": sweep_units((0.70, 0.72), (0.71, 0.71), r0=0.6)}  # +0.01, -0.01: mean 0 ± 0.01 SE
    md = "\n".join(sc.sweep_section(kept))
    assert "| `sparse-middle` | 0 | 0.200 | 0.300 | 0.400 | 0.450 | 0.300 | 0.350 | 200 / 220 |" in md
    assert "| `sparse-middle` | 1 | 0.210 | 0.310 | 0.420 | 0.480 | 0.320 | 0.380 | 210 / 230 |" in md
    # Round-0 means over seeds; the gaps per seed, mean ± SE (0.055 ± 0.005); per problem 0.25 ± 0.1443 paired SE;
    # 2 of 2 at or above; median arm and SFT wall times.
    assert ("| `sparse-middle` | 0, 1 | 0.205 | 0.305 | +0.050 / +0.060; +0.055 ± 0.005 SE | +0.050 / +0.060; "
            "+0.055 ± 0.005 SE | +0.250 ± 0.144 SE | 2 of 2 | 215 | 90 |") in md
    assert "| `middle` | 0, 1 | 0.505 | 0.605 | +0.010 / -0.010; +0.000 ± 0.010 SE | " in md
    assert "+0.000 ± 0.010 SE | not kept | 1 of 2 | 215 | 90 |" in md  # no per-problem figures kept
    # Two of the six settings: no choice yet, the leader so far named.
    assert md.endswith("Largest oracle gain on Pass@1 (the plan's metric): so far `sparse-middle`, +0.055 ± 0.005 SE "
                       "over 2 seeds; 2 of 6 settings screened: no choice until all are.")
    level = {s: sweep_units((0.70, 0.72), (0.70, 0.72)) for s in sc.SETTINGS}  # every other setting: no gap
    md = "\n".join(sc.sweep_section({**level, **kept}))
    assert md.endswith("Largest oracle gain on Pass@1 (the plan's metric): `sparse-middle`, +0.055 ± 0.005 SE over "
                       "2 seeds: the study's task.")
    assert "all-wrong" not in md  # no unit records it: no column
    assert sc.best_setting(kept) == sc.best_setting(kept, "eval/maj@8") == "sparse-middle"
    assert "[docs/x.md](docs/x.md)" in sc.sweep_section(kept, link="docs/x.md")[0]
    kept["middle"] = sweep_units((0.70, 0.72), (0.80, 0.80), r0=0.6, wrong=0.25)
    md = "\n".join(sc.sweep_section({**level, **kept}, primary="eval/maj@8"))
    assert "all-wrong groups r1 (verifier) (mean)" in md and "| `middle` | 0 | 0.500 | 0.600 | 0.250 |" in md
    assert md.endswith("Largest oracle gain on Maj@8 (the plan's metric): `middle`, +0.090 ± 0.010 SE over 2 seeds: "
                       "the study's task.")
    # The best mean gain under the plan's +0.01: no study.
    below = sc.sweep_section({**level, "middle": sweep_units((0.70, 0.72), (0.715, 0.72))})[-1]  # mean 0.0075
    assert below.endswith("`middle`, +0.008 ± 0.008 SE over 2 seeds: below the plan's +0.01: no study, the finding "
                          "is the sweep itself.")
    assert sc.sweep_section({})[-1].endswith("none measured yet.")


def fake_study(arms: dict[str, list[float]], base: list[float]) -> dict:
    """Seeds 0-4: the verifier's round-1 Maj@8 `base[s]`, each arm's `arms[arm][s]`."""
    out = {f"sft-s{s}": {"unit": f"sft-s{s}", "commit": "abc1234", "seconds": 60.0} for s in range(5)}
    for arm, xs in {"verifier": base, **arms}.items():
        out |= {f"{arm}-s{s}": unit(f"{arm}-s{s}", {"eval/maj@8": 0.3}, {"eval/maj@8": x}) for s, x in enumerate(xs)}
    return out


def test_the_study_section_and_glance_from_unit_files(tmp_path):
    """Verifier 0.5 on every seed; oracle-progress = A's gaps above (t 5.6569, p 0.002406), prm-progress = B's
    (p 0.025803): Holm over the 2 arms, thresholds 0.025 then 0.05: A passes at rank 1; B's 0.0258 > 0.05 / 2 would
    fail at rank 1, but at rank 2 its threshold is 0.05: it passes Holm, and 5 of 5 seeds: it pays too. B's share of
    the oracle's gain: 0.014 / 0.04 = 0.35."""
    plan = sc.load_plan(write_plan(tmp_path / "plan.md"))
    base = [0.5] * 5
    kept = fake_study({"oracle-progress": [0.54, 0.53, 0.55, 0.52, 0.56],
                        "prm-progress": [0.51, 0.52, 0.5, 0.53, 0.51]}, base)
    md = "\n".join(sc.study_section(plan, kept, "f" * 40, [], "plan.md"))
    assert "[plan.md](plan.md), committed in `ffffffffffff`" in md and "**2 arms tried**" in md
    assert "Holm-corrected one-sided paired t over seeds at alpha 0.05 over the 2 arms" in md
    assert ("| `oracle-progress` | +0.040 / +0.030 / +0.050 / +0.020 / +0.060 | +0.040 ± 0.007 SE | 5.66 (4 df) | "
            "0.0024 | 0.0250 (rank 1) | 5 of 5 | **pays** | - |") in md
    row = next(line for line in md.splitlines() if line.startswith("| `prm-progress`"))
    assert "| 2.75 (4 df) | 0.0258 | 0.0500 (rank 2) | 5 of 5 | **pays** | 0.35 [95% CI " in row
    line = sc.glance(plan, kept)
    assert line == ("2 arms vs the verifier on `sparse-middle` (Maj@8, round 1), Holm over the 2, >= 4 of 5 seeds at "
                    "or above; pays: oracle-progress, prm-progress")
    del kept["prm-progress-s4"]
    assert sc.glance(plan, kept).endswith("no verdict yet (14 of 15 units)")
    assert "no verdict yet (14 of 15 units)" in "\n".join(sc.study_section(plan, kept, None, [], "plan.md"))
    assert "**Not run yet**: 0 of 15 units kept." in sc.study_section(plan, {}, None, [], "plan.md")


def test_the_study_section_compares_rm_arms_with_the_matched_verifier_and_states_each_goal(tmp_path):
    """Gaps to the verifier: oracle +0.04 (pays; goal 1 met), prm-progress +0.014 (pays at Holm's rank 4, share 0.35
    < 0.5: goal 2 not met), vineppo +0.02 and the matched verifier +0.01 on every seed: vineppo - matched = +0.010
    on each (goal 3 met), prm-progress - matched 0 / +0.01 / -0.01 / +0.02 / 0."""
    plan = sc.load_plan(write_plan(tmp_path / "plan.md", PLAN.replace(
        "arms: [verifier, oracle-progress, prm-progress]",
        "arms: [verifier, oracle-progress, prm-progress, vineppo, verifier-matched]")))
    kept = fake_study({"oracle-progress": [0.54, 0.53, 0.55, 0.52, 0.56], "prm-progress": [0.51, 0.52, 0.5, 0.53, 0.51],
                       "vineppo": [0.52] * 5, "verifier-matched": [0.51] * 5}, [0.5] * 5)
    for s, steps in enumerate([300, 310, 295, 305, 300]):
        kept[f"verifier-matched-s{s}"]["overrides"] += [f"grpo.max_steps={steps}"]
    md = "\n".join(sc.study_section(plan, kept, "f" * 40, [], "plan.md"))
    assert "| `vineppo` | +0.010 / +0.010 / +0.010 / +0.010 / +0.010 | +0.010 ± 0.000 SE | 5 of 5 | " \
           "300 / 310 / 295 / 305 / 300 |" in md
    assert "| `prm-progress` | +0.000 / +0.010 / -0.010 / +0.020 / +0.000 | +0.004 ± 0.005 SE | 4 of 5 |" in md
    assert "| `oracle-progress` | +0.040" in md.split("At equal GRPO wall-clock")[0]
    matched = next(line for line in md.splitlines() if line.startswith("| `verifier-matched` | +0.010"))
    assert matched.endswith("| **pays** | - |")  # the matched verifier is no RM: no share of the oracle's gain
    assert "| `oracle-progress` |" not in md.split("At equal GRPO wall-clock")[1]  # not an RM arm
    assert "- Goal 1, the oracle pays with a mean gain of at least +0.03 Maj@8: **met** (pays, +0.040 ± 0.007 SE)." \
           in md
    assert "- Goal 2, a co-trained PRM pays and recovers at least 50% of the oracle's gain: **not met** " \
           "(`prm-progress` pays, share 0.35 [95% CI" in md
    assert "- Goal 3, at equal compute an RM arm is at or above `verifier-matched` (mean gap >= 0): **met** (the " \
           "best, `vineppo`, +0.010)." in md
    del kept["vineppo-s2"]  # an unfinished study states no goal
    assert "Goal" not in "\n".join(sc.study_section(plan, kept, "f" * 40, [], "plan.md"))


def test_the_report_checks_the_units_before_writing_and_flags_a_changed_plan(repo, tmp_path, capsys):
    """The section written into a page from unit files in a folder; a refused unit leaves the page as it was."""
    from pipeline.rundir import write_json_atomic

    figs, out = tmp_path / "figs", tmp_path / "results.md"
    out.write_text("# Results\n\nOlder sections.\n")
    for setting, units in {"long-sparse": sweep_units((0.40, 0.42), (0.45, 0.48))}.items():
        for n, u in units.items():
            write_json_atomic(figs / "sweep" / setting / f"{n}.json", u)
    for n, u in fake_study({"oracle-progress": [0.54, 0.53, 0.55, 0.52, 0.56],
                             "prm-progress": [0.51, 0.52, 0.5, 0.53, 0.51]}, [0.5] * 5).items():
        write_json_atomic(figs / "study" / f"{n}.json", {**u, "commit": repo["after"][:7]})
    a = argparse.Namespace(out=str(out), figures=str(figs), plan=str(repo["path"] / "plan.md"))
    sc.report(a)
    page = out.read_text()
    assert page.startswith("# Results\n\nOlder sections.\n") and "<!-- generated: step-credit-sweep -->" in page
    assert "Largest oracle gain on Pass@1 (the plan's metric): so far `long-sparse`, +0.055 ± 0.005 SE over 2 seeds" in page
    assert f"committed in `{repo['plan'][:12]}`" in page and "| `prm-progress` |" in page and "**Flag**" not in page
    assert "glance: 2 arms vs the verifier on `sparse-middle`" in capsys.readouterr().out
    write_json_atomic(figs / "study" / "verifier-s0.json", {**fake_study({}, [0.5] * 5)["verifier-s0"],
                                                            "commit": repo["sibling"][:7]})
    with pytest.raises(plans.PlanError, match="verifier-s0.json: its commit"):
        sc.report(a)
    assert out.read_text() == page  # nothing written
    write_json_atomic(figs / "study" / "verifier-s0.json", {**fake_study({}, [0.5] * 5)["verifier-s0"],
                                                            "commit": repo["after"][:7]})
    (repo["path"] / "plan.md").write_text(PLAN.replace("# Plan: a study", "# Plan: a study, edited"))
    git(repo["path"], "commit", "-q", "-am", "edit the plan")
    sc.report(a)
    assert f"**Flag**: the plan changed after its commit, in `{git(repo['path'], 'rev-parse', 'HEAD')[:12]}`" in (
        out.read_text())


def test_the_command_line():
    a = sc.parser().parse_args(["sweep", "--settings", "middle", "long-sparse", "--seeds", "0", "1", "--runs-dir", "r"])
    assert (a.command, a.settings, a.seeds, a.runs_dir, a.figures) == ("sweep", ["middle", "long-sparse"], [0, 1], "r",
                                                                        sc.FIGURES)
    assert sc.parser().parse_args(["--runs-dir", "r", "sweep"]).runs_dir == "r"  # the subcommand does not undo it
    assert sc.parser().parse_args(["sweep"]).settings == list(sc.SETTINGS)
    a = sc.parser().parse_args(["--report-only"])
    assert (a.report_only, a.command, a.plan, a.out) == (True, None, sc.PLAN, "docs/results.md")
    assert sc.parser().parse_args(["study", "--plan", "p.md"]).plan == "p.md"
    with pytest.raises(SystemExit):
        sc.parser().parse_args(["sweep", "--settings", "sparse-centre"])
    with pytest.raises(SystemExit):
        sc.parser().parse_args(["study"])  # no plan: no study


def test_units_pin_the_thread_count_asked():
    # Two studies side by side at 1 thread each: the restart pins OMP_NUM_THREADS to --threads, the kernels as ever.
    from experiments import runner

    assert doctest.testmod(runner).failed == 0
    assert runner.pinned_env(["study", "--threads=1"]) == {**runner.PINNED, "OMP_NUM_THREADS": "1"}
    with pytest.raises(SystemExit, match="--threads: expected a positive integer, got '0'"):
        runner.pinned_env(["--threads", "0"])
