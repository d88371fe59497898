"""experiments/passk_study.py (issue 59, point 2): its section of docs/results.md is what the kept unit files make, the
other reports keep it, the pairing and the plan's rule on small unit files made here (worked examples), Holm's
correction, the plan names the arms as the code sets them, and every arm's config loads (k below
grpo.num_generations). Its links are checked by tests/test_docs.py; tests/test_results_generated.py compares every
region of docs/results.md, this one's included, after both older reports have rewritten the page."""

from __future__ import annotations

import argparse
import doctest
import shutil

import pytest

from bench._common import ROOT
from experiments import passk_study as passk
from experiments import report as ex
from pipeline.rundir import write_json_atomic


def regions(text: str) -> dict[str, str]:
    return dict(ex.GENERATED.findall(text))


def args(tmp_path, figures) -> argparse.Namespace:
    return argparse.Namespace(runs_dir=str(tmp_path / "runs"), figures=str(figures), smoke=False, experiment="x",
                              tracking_uri=None, mc_prompts=0, rounds=passk.ROUND)


def test_the_section_in_results_md_is_what_the_kept_units_make(tmp_path, monkeypatch):
    # A figure edited by hand, or unit files changed without a rebuild: `python -m experiments.passk_study
    # --report-only`.
    monkeypatch.chdir(ROOT)  # the section names the figures' folder as given, relative to the repository
    committed = (ROOT / "docs" / "results.md").read_text()
    out = tmp_path / "results.md"
    out.write_text(committed)
    passk.report(args(tmp_path, "docs/experiments/passk"), out)
    assert "passk" in regions(committed)
    assert out.read_text() == committed  # the region as committed, and nothing else of the page touched


def test_the_other_reports_keep_the_section_after_the_credit_study_s(tmp_path):
    """`python -m experiments --report-only` writes results.md afresh and puts back each study's block from the old
    page (`keep_study`); `credit_study --report-only` replaces its own block (`with_study`). The passk block comes
    through both as it was, between the credit study's block and section 1; a page without it gets it there."""
    old = tmp_path / "results.md"
    shutil.copy(ROOT / "docs" / "results.md", old)
    committed = old.read_text()
    credit_begin, credit_end = ex.BEGIN, ex.END
    begin, end = ex.study_markers(passk.STUDY)
    block = begin + committed.partition(begin)[2].partition(end)[0] + end
    credit = credit_begin + committed.partition(credit_begin)[2].partition(credit_end)[0] + credit_end
    later = "".join(f"\n\n{b}{committed.partition(b)[2].partition(e)[0]}{e}"  # the studies after passk's, in order
                    for b, e in map(ex.study_markers, ex.STUDIES[ex.STUDIES.index(passk.STUDY) + 1:]) if b in committed)
    fresh = "# Results\n\nheader\n\n## 1. First\n\ntext\n"  # as experiments/report.py writes it, no study blocks
    text = ex.keep_study(fresh, old)
    assert text == f"# Results\n\nheader\n\n{credit}\n\n{block}{later}\n\n## 1. First\n\ntext\n"
    assert ex.with_study(text, credit_begin + "\nnew\n" + credit_end) == \
        f"# Results\n\nheader\n\n{credit_begin}\nnew\n{credit_end}\n\n{block}{later}\n\n## 1. First\n\ntext\n"
    page = tmp_path / "page.md"  # the page before this study: its block goes after the credit study's
    page.write_text(committed.replace(block + "\n\n", ""))
    passk.report(args(tmp_path, tmp_path / "none"), page)
    made = page.read_text()
    assert made.index(credit_end) < made.index(begin) < made.index(end) < made.index("\n## 1. ")
    assert made.replace(made[made.index(begin):made.index(end) + len(end)], block) == committed


def test_the_plan_names_the_arms_the_evaluation_and_the_rule_as_the_code_has_them():
    plan = (ROOT / passk.PLAN).read_text()
    for arm, overrides in passk.ARMS.items():  # the plan names each arm's overrides as the code sets them
        assert f"| `{arm}` | " + " ".join(f"`{o}`" for o in overrides) + " |" in plan
    assert "`eval.samples_per_problem=32`" in plan and passk.EVAL == ["eval.samples_per_problem=32"]
    assert "alpha = P(Z >= 2) = 0.0228" in plan and f"{passk.ALPHA:.4f}" == "0.0228"
    assert "H0: gap <= -0.005" in plan and passk.MARGIN == 0.005


def test_every_arm_config_loads_and_the_anneal_runs_k_from_7_to_1(tmp_path):
    from pipeline.passk import scheduled_k

    study = passk.PasskStudy(args(tmp_path, tmp_path / "kept"))
    cfgs = {arm: study.arm_config(arm, 1) for arm in passk.ARMS}
    assert {arm: c.supervision.mode for arm, c in cfgs.items()} == {
        "verifier": "outcome", "passk-4": "passk", "passk-anneal": "passk"}
    assert all(c.eval.samples_per_problem == 32 and c.run.rounds == 2 and c.run.seed == 1 for c in cfgs.values())
    assert all(c.grpo["num_generations"] == 8 for c in cfgs.values())  # k = 8 would be refused at load
    assert cfgs["passk-4"].supervision.passk.k_values() == [4]
    sched = cfgs["passk-anneal"].supervision.passk
    steps = cfgs["passk-anneal"].grpo["max_steps"]
    ks = [scheduled_k(sched.k_values(), s, steps) for s in range(steps)]  # 80 steps, 7 parts of 11-12 steps
    assert sched.over == "steps" and ks[0] == 7 and ks[-1] == 1 and ks == sorted(ks, reverse=True)
    assert {k: ks.count(k) for k in set(ks)} == {7: 12, 6: 11, 5: 12, 4: 11, 3: 12, 2: 11, 1: 11}
    # Each seed's arms start from one policy: the seed's SFT, the `start` each unit records.
    assert {str(c.policy.model) for c in cfgs.values()} == {str(study.sft_path(1))}


# --- worked examples: unit files made here ------------------------------------------------------------------

# Four eval problems a seed. The verifier's per-problem figures, the same in every seed.
VERIFIER = {"pass@1": [0.5, 0.5, 0.5, 0.5], "pass@16": [0.75, 1.0, 0.5, 0.5], "maj@8": [1.0, 0.0, 1.0, 0.0],
            "greedy": [1.0, 0.0, 1.0, 0.0]}
# passk-4 gains 0.25 Pass@16 on 2, 1 and 3 problems of seeds 0, 1, 2: per-seed gaps 0.125, 0.0625, 0.1875; the rest
# as the verifier. passk-anneal: Pass@1 0.004 lower on one problem a seed, the rest as the verifier.
ARMS = {"verifier": {s: VERIFIER for s in range(3)},
        "passk-4": {0: {**VERIFIER, "pass@16": [0.75, 1.0, 0.75, 0.75]},
                    1: {**VERIFIER, "pass@16": [0.75, 1.0, 0.75, 0.5]},
                    2: {**VERIFIER, "pass@16": [1.0, 1.0, 0.75, 0.75]}},
        "passk-anneal": {s: {**VERIFIER, "pass@1": [0.5, 0.5, 0.5, 0.496]} for s in range(3)}}


def keep_units(where, arms=ARMS, starts=None):
    """The unit files a finished study would keep (runner.Experiments.record), round 0 and 2, per-problem figures."""
    for s in range(3):
        write_json_atomic(where / f"sft-s{s}.json", {"unit": f"sft-s{s}", "commit": "abc1234", "machine": "a CPU",
                                                     "seconds": 90.0, "metrics": {}, "policy": f"sft{s}"})
    for arm, seeds in arms.items():
        for s, pp in seeds.items():
            means = {f"eval/{k}": sum(v) / len(v) for k, v in pp.items()}
            write_json_atomic(where / f"{arm}-s{s}.json", {
                "unit": f"{arm}-s{s}", "commit": "abc1234", "machine": "a CPU", "seconds": 240.0 + s,
                "overrides": passk.overrides(arm), "start": (starts or {}).get((arm, s), f"sft{s}"),
                "rounds": {"0": means, "2": means}, "per_problem": {"0": pp, "2": pp}})


def kept(where) -> dict:
    return passk.PasskStudy(args(where, where)).kept()


def test_gaps_pair_every_seeds_problems_and_the_rule_reads_them(tmp_path):
    keep_units(tmp_path)
    data = passk.figures(kept(tmp_path))
    g = passk.gap(data, "passk-4", "pass@16")
    # Per seed: 0.125, 0.0625, 0.1875. Per problem, the 12 differences pooled: six 0.25, six 0: mean 0.125, each
    # 0.125 from it, SD sqrt(12 * 0.125^2 / 11) = 0.130558, SE 0.130558 / sqrt(12) = 0.037689, z 3.3166.
    assert g.seeds == pytest.approx((0.125, 0.0625, 0.1875), abs=1e-12)
    assert g.mean == pytest.approx(0.125, abs=1e-12) and g.se == pytest.approx(0.0376889, abs=1e-6)
    assert g.z == pytest.approx(3.31662, abs=1e-4)
    maj = passk.gap(data, "passk-4", "maj@8")  # as the verifier on every problem: no gap, no spread, z 0
    assert (maj.mean, maj.se, maj.z) == (0.0, 0.0, 0.0)
    a = passk.gap(data, "passk-anneal", "pass@1")
    # Three -0.004 and nine 0: mean -0.001, SD sqrt((3 * 0.003^2 + 9 * 0.001^2) / 11) = 0.0018091, SE 0.00052223.
    assert a.mean == pytest.approx(-0.001, abs=1e-12) and a.se == pytest.approx(0.00052223, abs=1e-7)
    # Not below by 0.005: z = (-0.001 + 0.005) / 0.00052223 = 7.66; Pass@16 equal, no spread: z = +inf.
    assert passk.non_inferior_z(a) == pytest.approx(7.6595, abs=1e-3)

    text = "\n".join(passk.section(kept(tmp_path), str(tmp_path)))
    assert "Units kept: 9 of 9 planned, from `abc1234` on a CPU; sum of their wall times 41 min" in text
    # Pass@16 per seed: 3.25 / 4, 3.0 / 4, 3.5 / 4 (0.8125 prints 0.812: round half to even); wall times 240-242 s.
    assert ("| `passk-4` | 0, 1, 2 | 0.500 / 0.500 / 0.500 | 0.812 / 0.750 / 0.875 | 0.500 / 0.500 / 0.500 | "
            "0.500 / 0.500 / 0.500 | 241 |") in text
    # 0.0625 prints +0.062 (round half to even); the mean of the three, 0.125 ± 0.0625 / sqrt(3) = 0.036 SE.
    assert ("| `passk-4` | Pass@16 | +0.125 / +0.062 / +0.188 | +0.125 ± 0.036 SE | 3 of 3 | "
            "+0.1250 ± 0.0377 SE (z +3.32) |") in text
    assert "| `passk-anneal` | Pass@1 | -0.001 / -0.001 / -0.001 | -0.001 ± 0.000 SE | 0 of 3 | " in text
    # Holm over the 2 arms: the annealed arm's p, the larger of P(Z >= 7.66) and P(Z >= inf), ~1e-14, is the smaller
    # and passes first at 0.0228 / 2; passk-4's p = P(Z >= 3.32) = 0.00046 is then tested at 0.0228 and passes. But
    # the annealed arm's Pass@1 is below the verifier's (-0.001): "at or above" fails on the point estimate.
    assert "| 0.0005 | 0.0228 | **met** |" in text
    assert "| 0.0000 | 0.0114 | not met: Pass@1 below the verifier |" in text
    assert "started from" not in text


def test_no_verdict_before_every_unit_and_a_seed_from_two_policies_is_flagged(tmp_path):
    keep_units(tmp_path, starts={("passk-4", 1): "other"})
    (tmp_path / "passk-anneal-s2.json").unlink()
    text = "\n".join(passk.section(kept(tmp_path), str(tmp_path)))
    assert "Units kept: 8 of 9 planned" in text and text.count("no verdict yet (8 of 9 units)") == 2
    assert "**Seed 1's arms started from 2 different SFT policies** (other, sft1)" in text
    empty = tmp_path / "none"
    empty.mkdir()
    text = "\n".join(passk.section(kept(empty), "docs/experiments/passk"))
    assert "**Not run yet**: no unit kept in `docs/experiments/passk/` (0 of 9 arm units)." in text
    assert text.count("| - | - | - | not run yet |") == 2


G = passk.Gap  # (per-seed gaps, per-problem mean, paired SE)


@pytest.mark.parametrize("g4, ga, met4, met_a, level4", [
    # passk-4: Pass@16 +0.010 ± 0.004 (z 2.5, p 0.0062) first, <= 0.0114: passes; Maj@8 -0.002 ± 0.003 within 1 SE.
    # The annealed arm: Pass@1 +0.001 ± 0.002 (z_NI 3.0) and Pass@16 0 ± 0.003 (z_NI 1.67, p 0.048 > 0.0228): fails.
    ((0.010, 0.004, -0.002, 0.003), ((0.001, 0.002), (0.0, 0.003)), True, False, 0.0114),
    # Holm bites: passk-4 at z 2.1 (p 0.018) would pass one test at 2 SE, but with the other arm's p larger it is
    # tested first, at 0.0114, and fails; the annealed arm is then not reached.
    ((0.0084, 0.004, 0.0, 0.003), ((0.001, 0.002), (0.0, 0.003)), False, False, 0.0114),
    # Step-down: the annealed arm's p (z_NI 3.0 and 3.33: p 0.0013) passes first at 0.0114, then passk-4's 0.018 is
    # tested at 0.0228 and passes.
    ((0.0084, 0.004, 0.0, 0.003), ((0.001, 0.002), (0.0, 0.0015)), True, True, 0.0228),
    # Pass@16 well above (z 5), but Maj@8 -0.008 ± 0.003: moved 2.67 SE, more than 1: not met.
    ((0.020, 0.004, -0.008, 0.003), ((0.001, 0.002), (0.0, 0.0015)), False, True, 0.0114),
])
def test_the_rule_holm_over_the_two_arms(g4, ga, met4, met_a, level4):
    gaps = {"passk-4": {"pass@16": G((), g4[0], g4[1]), "maj@8": G((), g4[2], g4[3])},
            "passk-anneal": {"pass@1": G((), *ga[0]), "pass@16": G((), *ga[1])}}
    v = passk.decide(gaps)
    assert (v["passk-4"].met, v["passk-anneal"].met) == (met4, met_a)
    assert v["passk-4"].level == pytest.approx(level4, abs=1e-4)


def test_an_arm_not_run_fails_and_the_other_is_tested_at_half_alpha():
    v = passk.decide({"passk-4": {"pass@16": G((), 0.0084, 0.004), "maj@8": G((), 0.0, 0.003)}})
    assert v["passk-anneal"].p == 1.0 and not v["passk-anneal"].met
    assert v["passk-4"].level == pytest.approx(passk.ALPHA / 2) and not v["passk-4"].met  # p 0.018 > 0.0114
    assert "Pass@16 p 0.0179 > Holm's level 0.0114" in v["passk-4"].why


def test_holm_and_the_one_sided_p():
    # REFERENCE.md's example: m = 6, alpha 0.05: 0.004 <= 0.05/6 passes, 0.014 > 0.05/5 stops the rest.
    assert ex.holm([0.004, 0.014, 0.016, 0.034, 0.12, 0.3], 0.05) == [True] + [False] * 5
    assert ex.holm([0.3, 0.004], 0.05) == [False, True]  # in the caller's order, whatever the sort
    assert ex.holm([0.01, 0.02], 0.05) == [True, True] and ex.holm([0.03, 0.026], 0.05) == [False, False]
    assert ex.holm([float("nan"), 0.001], 0.05) == [False, True]
    assert ex.one_sided_p(0.0) == 0.5 and ex.one_sided_p(float("inf")) == 0.0
    assert ex.one_sided_p(2.0) == pytest.approx(0.0227501, abs=1e-7) and passk.ALPHA == ex.one_sided_p(2.0)
    assert doctest.testmod(ex).failed == 0


def test_the_report_keeps_the_verdict_written_under_the_region(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "results.md"
    shutil.copy(ROOT / "docs" / "results.md", out)
    end = ex.study_markers(passk.STUDY)[1]
    verdict = "**What held / what did not:** written by hand."
    out.write_text(out.read_text().replace(end, "\n" + verdict + "\n" + end))  # a paragraph under the region
    passk.report(args(tmp_path, "docs/experiments/passk"), out)
    text = out.read_text()
    assert text.count(verdict) == 1 and text.index(ex.GENERATED_END, text.index("<!-- generated: passk -->")) < \
        text.index(verdict) < text.index(end)
