"""Every figure of docs/results.md's generated regions and of README.md's results is remade from the kept units
under docs/experiments/ (issue 47, point 8; the whole page, verdicts included, and every number on it changed by one
digit: tests/test_figures_kept.py); the spread over seeds and the decision rule are pure functions
(experiments/report.py)."""

from __future__ import annotations

import argparse
import doctest
import math
import shutil

import pytest

from bench._common import ROOT
from experiments import credit_study as study
from experiments import report as ex
from experiments import runner, stats


def regions(text: str) -> dict[str, str]:
    return dict(ex.GENERATED.findall(text))


def rebuilt(tmp_path, monkeypatch) -> str:
    """docs/results.md as both reports write it again from docs/experiments/ (no plots, no MLflow), in tmp_path."""
    monkeypatch.chdir(ROOT)  # the header names the figures' folder as given, relative to the repository
    docs = tmp_path / "docs"
    (docs / "lab").mkdir(parents=True)
    shutil.copy(ROOT / "docs" / "results.md", docs / "results.md")
    shutil.copy(ROOT / "docs" / ex.HISTORY, docs / ex.HISTORY)  # the header links it when it is there
    a = argparse.Namespace(runs_dir=str(tmp_path / "runs"), seeds=[0, 1, 2], rounds=2, out=str(docs),
                           figures="docs/experiments", smoke=False, experiment=runner.EXPERIMENT,
                           tracking_uri=None, mc_prompts=64)
    ex.report(runner.Experiments(a), "python -m experiments", None, log=False, plots=False)
    study.report(argparse.Namespace(runs_dir=str(tmp_path / "credit"), figures="docs/experiments/credit",
                                    rounds=2, smoke=False, experiment="x", tracking_uri=None, mc_prompts=0),
                 docs / "results.md")
    return (docs / "results.md").read_text()


def test_every_generated_region_is_what_the_reports_make_from_the_kept_figures(tmp_path, monkeypatch):
    # A figure edited by hand, or kept files changed without a rebuild: `python -m experiments --report-only`,
    # then `python -m experiments.credit_study --report-only` (each rewrites README's results too).
    committed = (ROOT / "docs" / "results.md").read_text()
    made = regions(rebuilt(tmp_path, monkeypatch))
    assert set(regions(committed)) == set(made) and "credit-quickstart" in made and "results-6" in made
    for name, body in regions(committed).items():
        assert body == made[name], f"docs/results.md's region {name!r} differs from what its report makes"
    readme = regions((ROOT / "README.md").read_text())
    from experiments.pages import readme_regions

    assert readme["results"] == readme_regions()["results"]  # ex.glance's rows and issue 57's


def test_a_figure_edited_inside_a_region_is_found_and_a_missing_region_named(tmp_path, monkeypatch):
    committed = (ROOT / "docs" / "results.md").read_text()
    body = regions(committed)["credit-quickstart"]
    edited = committed.replace(body, body.replace("-0.029 ± 0.005 SE", "-0.019 ± 0.005 SE"))
    assert edited != committed
    assert regions(edited)["credit-quickstart"] != regions(rebuilt(tmp_path, monkeypatch))["credit-quickstart"]
    page = tmp_path / "page.md"
    page.write_text("# no region\n")
    with pytest.raises(ValueError, match="page.md: no region '<!-- generated: results -->'"):
        ex.write_region(page, "results", "x\n")


def test_the_study_section_states_its_rule_before_any_result():
    section = (ROOT / "docs" / "results.md").read_text().partition(ex.BEGIN)[2].partition(ex.END)[0]
    assert ex.RULE in section and section.index(ex.RULE) < section.index("### ")


def test_mean_se_worked_examples():
    # [0.70, 0.74, 0.72]: mean 0.72, SD 0.02, SE 0.02 / sqrt(3) = 0.011547
    mean, se = ex.mean_se([0.70, 0.74, 0.72])
    assert mean == pytest.approx(0.72, abs=1e-12) and se == pytest.approx(0.02 / math.sqrt(3), abs=1e-12)
    assert math.isnan(ex.mean_se([0.5])[1])  # one seed: no spread
    assert ex.fmt_se([0.01, 0.03, 0.02]) == "+0.020 ± 0.006 SE" and ex.fmt_se([]) == "-"
    moved = doctest.testmod(stats)  # the spreads and the rule, re-exported by experiments/report.py
    assert doctest.testmod(ex).failed == 0 and moved.attempted and not moved.failed


@pytest.mark.parametrize("gaps, verdict", [
    ([0.02, 0.03, 0.01, 0.02, -0.001], True),    # 3.0 SE, 4 of 5 at or above
    ([0.04, 0.0, 0.0, 0.0, -0.001], False),      # 4 of 5 at or above, but 1.0 SE: not 2
    ([0.04, 0.05, 0.03, -0.001, -0.001], False),  # 2.2 SE, but 3 of 5 at or above
    ([0.005, 0.003, 0.008], True),               # 3 seeds: all 3 at or above, 3.7 SE
    ([0.02, 0.03, -0.001], False),               # 3 seeds, one below
    ([0.0, 0.0, 0.0], False),                    # a zero effect: mean not above 0
    ([0.05], False),                             # one seed: no SE
    ([0.003, 0.003], False),                     # two equal seeds: an SE of 0, and the rule asks 3 or 5 seeds
])
def test_the_decision_rule(gaps, verdict):
    assert ex.pays(gaps) is verdict


def test_smollm2_control_pairs_every_policy_with_round_0_and_the_learned_arm_with_the_verifier(tmp_path):
    from experiments import smollm2_control as control
    from pipeline.rundir import write_json_atomic

    assert control.section(tmp_path) == ["Not measured yet."]  # nothing kept: nothing claimed
    for arm in control.ARMS:
        write_json_atomic(tmp_path / f"{arm}.json", {
            "arm": arm, "overrides": study.ARMS[arm], "commit": "abc1234", "machine": "a CPU", "seconds": 600.0,
            "grpo_seconds": {"1": 400.0, "2": 420.0 if arm == "verifier" else 630.0},
            "rounds": {str(r): {"eval/greedy": 0.5, "eval/pass@1": 0.5, "eval/maj@4": 0.5} for r in (0, 1, 2)}})
    base, better = [0.0, 0.5, 1.0, 0.5], [0.5, 0.5, 1.0, 1.0]  # paired_difference's example: +0.25, SE 0.1443
    runs = "runs/smol47"
    write_json_atomic(tmp_path / control.NOISE, {
        "command": "python -m experiments.round_noise x", "problems": 4, "fresh": 3, "samples": 4, "temperature": 0.7,
        "policies": {"round 0": f"{runs}/verifier/round-000/policy", "round 2": f"{runs}/verifier/round-002/policy",
                     "p": f"{runs}/implicit-prime/round-002/policy"},
        "per_problem": {"0": {"round 0": dict.fromkeys(control.METRICS, base),
                              "round 2": dict.fromkeys(control.METRICS, base),
                              "p": dict.fromkeys(control.METRICS, better)}}})
    text = "\n".join(control.section(tmp_path))
    gain = " | ".join(["+0.250 ± 0.144 SE (+1.7 SE)"] * 3)
    assert f"| `implicit-prime` round 2 - round 0 | {gain} |" in text
    assert f"| `implicit-prime` round 2 - `verifier` round 2 | {gain} |" in text
    assert "| `verifier` round 2 - round 0 | +0.000 ± 0.000 SE |" in text  # no spread: no z
    assert "| `implicit-prime` | 2 | 0.500 | 0.500 | 0.500 | 630 (1.50x the verifier's) |" in text


def test_keeping_smollm2_s_arms_names_a_missing_arm_and_writes_nothing(tmp_path):
    from experiments import smollm2_control as control

    (tmp_path / "runs" / "verifier").mkdir(parents=True)  # begun, never recorded: no manifest.json
    with pytest.raises(SystemExit, match=r"runs/verifier: no run directory of the `verifier` arm \(no manifest.json\)"):
        control.keep(tmp_path / "runs", f"sqlite:///{tmp_path}/mlflow.db", "abc1234", tmp_path / "kept")
    assert not (tmp_path / "kept").exists()
