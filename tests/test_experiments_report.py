"""experiments/runner.py (the runner: arms, units, kept figures) and experiments/report.py (docs/results.md from
them): a rebuilt report keeps the verdicts written by hand under its sections; the best-of-N section from constructed
run directories."""

import os
from pathlib import Path

from experiments import credit_study as study
from experiments import report as ex
from experiments import runner


def test_rebuilt_report_keeps_each_sections_verdict_in_its_own_section(tmp_path):
    ph = ex.PLACEHOLDER
    fresh = f"# R\n\n## 1. A\n\n| t |\n\n{ph}\n\n## 2. B\n\nnew table\n\n{ph}\n\n## 3. C\n\n{ph}\n"
    old = tmp_path / "results.md"
    old.write_text(f"# R\n\n## 1. A\n\nold table\n\n{ph}\n\n## 2. B\n\nold\n\n**What held / what did not:** B held,\n"
                   "on two lines.\n\n## 9. Gone\n\n**What held / what did not:** stale.\n")
    text = ex.keep_verdicts(fresh, old)
    sections = text.split("\n## ")
    assert ph in sections[1] and "new table" in sections[2]
    assert "B held,\non two lines." in sections[2] and ph not in sections[2]
    assert ph in sections[3] and "stale" not in text
    assert ex.keep_verdicts(fresh, tmp_path / "missing.md") == fresh


PICKS = ("prm", "prm_vote", "orm", "orm_vote", "majority", "random")


def _prm_runs(tmp_path):
    """The prm arm, seeds 0 and 1, rounds 0 and 1, as the pipeline records them: pick i at N in round r scores
    0.1 i + 0.05 N + 0.01 r in seed 0, 0.2 more in seed 1 (so each cell is that + 0.1 ± 0.141); the arguments."""
    import argparse

    from pipeline.rundir import Manifest, phase_key

    for seed, shift in ((0, 0.0), (1, 0.2)):
        phases = {}
        for r in (0, 1):
            bon = {f"bon/{w}@{n}": 0.1 * i + 0.05 * n + 0.01 * r + shift
                   for i, w in enumerate(PICKS) for n in (2, 4)}
            phases[phase_key(r, "eval")] = {"metrics": {"eval/greedy": 0.5, "eval/maj@8": 0.5, **bon}}
        Manifest(tmp_path / "runs" / f"prm-s{seed}", {"config": {}, "phases": phases, "mlflow": {}}).save()
    return argparse.Namespace(runs_dir=str(tmp_path / "runs"), seeds=[0, 1], rounds=1, out=str(tmp_path / "docs"),
                              figures=str(tmp_path / "docs" / "experiments"), smoke=True, experiment="x",
                              tracking_uri=None, mc_prompts=4)


def test_best_of_n_section_has_each_rms_pick_and_weighted_vote_from_the_runs(tmp_path, monkeypatch):
    a = _prm_runs(tmp_path)
    drawn = {}
    real_plot = ex.plot_lines

    def plot_lines(path, panels, *args, **kwargs):  # the real plot, its panels kept to be read
        drawn[path.name] = panels
        return real_plot(path, panels, *args, **kwargs)

    monkeypatch.setattr(ex, "plot_lines", plot_lines)
    text = ex.report(runner.Experiments(a), "python -m experiments --smoke", None, log=False).read_text()

    section = text.split("\n## 5. ")[1].split("\n## ")[0]
    assert "RM-weighted majority vote" in section
    header, _, row2, row4 = [line for line in section.splitlines() if line.startswith("|")]
    labels = ["PRM", "PRM vote", "ORM", "ORM vote", "majority", "random"]
    assert header == "| " + " | ".join(["N"] + [f"{x} r{r}" for r in (0, 1) for x in labels]) + " |"
    cells = row2.strip("| ").split(" | ")
    # N = 2, round 0: PRM 0.1 and 0.3 -> 0.2; PRM vote 0.2 and 0.4 -> 0.3; ORM vote (i = 3) 0.5.
    assert cells[:5] == ["2", "0.200 ± 0.141 SD", "0.300 ± 0.141 SD", "0.400 ± 0.141 SD", "0.500 ± 0.141 SD"]
    # N = 4, round 1: PRM vote 0.1 + 0.2 + 0.01 + 0.1 = 0.41; random (i = 5) 0.81.
    assert [row4.strip("| ").split(" | ")[i] for i in (8, 12)] == ["0.410 ± 0.141 SD", "0.810 ± 0.141 SD"]
    panels = drawn["best_of_n.png"]
    assert [title for title, _, _ in panels] == ["best-of-N, round 0", "best-of-N, round 1"]
    assert list(panels[1][2]) == labels and panels[1][2]["ORM vote"][0] == [2, 4]
    assert (tmp_path / "docs" / "img" / "best_of_n.png").stat().st_size > 1000


def test_a_fresh_clone_rebuilds_the_same_report_from_the_kept_figures_alone(tmp_path):
    """The machine that ran the arms is gone (runs/ with it); what each finished unit left in docs/experiments/
    rebuilds the report, marks the unit done, and names the commit it ran from."""
    import shutil

    a = _prm_runs(tmp_path)
    runs = runner.Experiments(a)
    for name in ("prm-s0", "prm-s1"):  # what `unit` does when an arm finishes
        runs.status["units"][name] = {"status": "done", "seconds": 90.0}
        runs.record(name, {"rounds": runner.rounds_of(tmp_path / "runs" / name)})
    before = ex.report(runs, "python -m experiments --smoke", None, log=False).read_text()
    shutil.rmtree(tmp_path / "runs")

    fresh = runner.Experiments(a)
    after = ex.report(fresh, "python -m experiments --smoke", None, log=False).read_text()
    assert after == before
    row = next(line for line in after.splitlines() if line.startswith("| `prm` GRPO + PRM (process) |"))
    assert row.endswith("| 2 of 2 seeds |")  # both seeds' rounds, from the figures
    assert "sum of all units' wall times over every invocation 3 min" in after
    commit = fresh.recorded("prm-s0")["commit"]
    assert f"`{commit}` (2 units)" in after and commit != "unknown"
    machine = fresh.recorded("prm-s0")["machine"]  # the same seed on another CPU ends elsewhere: say which one ran it
    assert f"on {machine} (2 units)" in after and f"{os.cpu_count()} cores, torch " in machine
    assert not fresh.pending("prm-s0") and fresh.pending("orm-s0")


def test_the_report_says_when_a_seeds_arms_started_from_different_round0_policies(tmp_path):
    """A seed regenerated in parts on two machines retrains its SFT, which may end elsewhere: its arms then differ
    from round 0 on, and the report must say so rather than pair them as if they differed only by method."""
    a = _prm_runs(tmp_path)
    runs = runner.Experiments(a)
    rounds = runner.rounds_of(tmp_path / "runs" / "prm-s0")
    for name, start in (("prm-s0", "aaa"), ("verifier-s0", "aaa"), ("prm-s1", "bbb"), ("verifier-s1", "ccc")):
        runs.status["units"][name] = {"status": "done", "seconds": 60.0}
        runs.record(name, {"rounds": rounds, "start": start})
    text = ex.report(runs, "python -m experiments --smoke", None, log=False).read_text()
    assert "**Seed 1's arms started from 2 different round-0 policies** (`bbb`: prm; `ccc`: verifier)" in text
    assert "Seed 0's arms started" not in text


def test_the_hybrid_arm_is_chosen_by_maj8_among_those_whose_prm_term_carries_a_fifth_of_the_variance(monkeypatch):
    arms = ("hybrid-sum-w0.3", "hybrid-sum-w1", "hybrid-min-w0.3", "hybrid-min-w1")
    monkeypatch.setattr(ex, "HYBRID_ARMS", arms)  # a grid of four, whatever the script's is today
    sum_lo, sum_hi, min_lo, min_hi = arms

    def arm(maj, shares):  # rounds 0..2 of one seed; the shares of RL rounds 1 and 2
        return {0: {"eval/maj@8": 0.7}, **{r: {"eval/maj@8": maj, ex.SHARE: s} for r, s in zip((1, 2), shares)}}

    data = {sum_lo: {0: arm(0.95, (0.1, 0.3))},  # best Maj@8, but its PRM term is under 20% in round 1
            sum_hi: {0: arm(0.90, (0.5, 0.6))}, min_hi: {0: arm(0.92, (0.4, 0.2))}, min_lo: {1: arm(0.99, (0.5, 0.5))}}
    assert ex.chosen_hybrid(data, 0, 2) == min_hi  # min_lo ran on another seed only
    assert ex.chosen_hybrid({sum_lo: data[sum_lo]}, 0, 2) == sum_lo  # none eligible: the best of those run
    assert ex.chosen_hybrid({}, 0, 2) is None
    assert ex.paired({min_hi: data[min_hi], "verifier": {0: arm(0.9, (0, 0))}}, min_hi, "verifier", 2,
                     "eval/maj@8") == [0.92 - 0.9]


def test_the_exploit_arm_rewards_exactly_the_slip_the_sft_data_teaches(tmp_path):
    """Its pattern, on the quickstart's own problems: every slipped solution (`answer_slip`, what `sft_noise`
    writes) matches; a gold one only where its first result is its answer (then the slip is no error)."""
    import argparse
    import re

    from pipeline.problems import problem_set_from_config
    from pipeline.problems.arithmetic import answer_slip, format_solution, parse_prompt

    runs = runner.Experiments(argparse.Namespace(runs_dir=str(tmp_path), figures=str(tmp_path / "figures"), smoke=False,
                                             experiment="x", tracking_uri=None, rounds=2))
    cfg = runs.arm_config("exploit", 0)  # the overrides load: the pattern survives --set's YAML
    assert not cfg.reward_model.retrain and cfg.reward_model.exploit.model_dump() == runner.EXPLOIT
    pattern, ps = re.compile(cfg.reward_model.exploit.pattern, re.MULTILINE), problem_set_from_config(cfg)
    slipped = same = 0
    for p in ps.test:
        gold = format_solution(*parse_prompt(p.prompt))
        bad = answer_slip(gold)
        assert bool(pattern.search(gold)) == (bad == gold), gold
        if bad != gold:
            slipped += 1
            assert pattern.search(bad) and not ps.is_correct(bad, p), bad
            assert not pattern.search(bad.replace("Answer: ", "Answer: 1")), bad  # 12 is not 112
        same += bad == gold
    assert slipped > 150 and 0 < same < 30  # 188 and 12 of the 200 held-out problems
    assert ex.fired({"exploit": {0: {1: {"a": 1.0}}, 1: {1: {"a": 0.0}}}}, "exploit", 1, "a") == "1/2"


def test_a_rebuilt_report_links_the_history_beside_it_and_leaves_it_as_written(tmp_path):
    """Superseded reports are kept by hand in lab/results-history.md: a rebuild must point to it, not overwrite it."""
    a = _prm_runs(tmp_path)
    runs = runner.Experiments(a)
    assert "results-history.md" not in ex.report(runs, "python -m experiments", None, log=False).read_text()
    history = Path(a.out) / "lab" / "results-history.md"
    history.parent.mkdir(parents=True)
    history.write_text("# Results history\n\nold figures\n")
    text = ex.report(runs, "python -m experiments", None, log=False).read_text()
    assert "[lab/results-history.md](lab/results-history.md)" in text
    assert history.read_text() == "# Results history\n\nold figures\n"


def _study(seed: int, collect: list[int], aucs: list[float]) -> dict:
    """What experiments/prm_study.py keeps for one run: its default variant's figures by round."""
    return {"run": f"runs/study/verifier-p{collect[0]}-s{seed}", "seed": seed, "collect": collect,
            "samples_per_test_problem": 8,
            "results": {"default": {str(r): {"test": {"step_auc_gold": x}, "held_out": {"step_auc_gold": x - 0.05},
                                             "train_seconds": 30.0 * collect[0] / 192} for r, x in enumerate(aucs)}}}


def test_the_prm_study_table_is_built_from_the_kept_study_results_of_every_run(tmp_path):
    """The study's runs are not in the runs directory (nor on a fresh clone): section 6 tabulates what each kept study
    file holds, one row per run and variant, named by the run's seed and how much it collected a round; the kept
    units are not confused with them."""
    from pipeline.rundir import write_json_atomic

    a = _prm_runs(tmp_path)
    kept = Path(a.figures) / "prm-study"
    write_json_atomic(kept / "verifier-p384-s1.json", _study(1, [384, 8], [0.882, 0.913, 0.853]))
    write_json_atomic(kept / "verifier-s1.json", _study(1, [192, 8], [0.739, 0.828, 0.754]))
    write_json_atomic(kept / "verifier-s0.json", _study(0, [192, 8], [0.9, 0.8]))
    runs = runner.Experiments(a)
    text = ex.report(runs, "python -m experiments", None, log=False).read_text()
    lines = text.partition("| seed | collected a round |")[2].partition("\n\n")[0].splitlines()
    lines = ["| seed | collected a round |" + lines[0], *lines[2:]]  # the header, then the rows
    assert lines[0] == ("| seed | collected a round | variant | round 0 | round 1 | round 2 | mean (test) | min (test) "
                        "| train s/round |")
    assert lines[1:] == ["| 0 | 192 prompts x 8 | default | 0.900 (0.850) | 0.800 (0.750) | - | 0.850 | 0.800 | 30 |",
                         "| 1 | 192 prompts x 8 | default | 0.739 (0.689) | 0.828 (0.778) | 0.754 (0.704) | 0.774 | 0.739 | 30 |",
                         "| 1 | 384 prompts x 8 | default | 0.882 (0.832) | 0.913 (0.863) | 0.853 (0.803) | 0.883 | 0.853 | 60 |"]
    assert "prm-study" not in runner.Experiments(a).kept() and "verifier-s1" not in runner.Experiments(a).kept()


def test_every_arm_of_the_credit_study_is_a_config_the_pipeline_accepts():
    """experiments/credit_study.py's arms (and their centred and weighted variants) load on both tasks' configs, and say
    what they change: a refused combination would otherwise surface hours into the study."""
    for task, path in study.TASKS.items():
        hybrid = [x for x in study.ARMS if "progress" in x or x == "implicit"]  # a process weight needs hybrid mode
        # PRIME credits tokens, not steps: its arm has no centred variant (the config refuses one).
        for arm in [*study.ARMS, *(f"{x}-centred" for x in study.ARMS
                                   if x not in ("verifier", "verifier-matched", "implicit-prime")),
                    *(f"{x}{v}" for x in hybrid for v in ("-w3", "-w0.5-centred"))]:
            cfg = study.load_config(study.ROOT / path, study.overrides(arm))
            s, base = cfg.supervision, arm.removesuffix("-centred")
            assert s.mode == ("outcome" if arm in ("verifier", "verifier-matched") else "process" if base
                              in ("oracle", "implicit-prime", "vineppo") else "hybrid"), (task, arm)
            assert (s.process_reward == "prime") == (arm == "implicit-prime"), (task, arm)
            assert (s.process_reward == "progress") == ("progress" in arm or base == "vineppo"), (task, arm)
            assert (s.process_centring == "group") == arm.endswith("-centred"), (task, arm)
            assert s.process_weight == (3.0 if "-w3" in arm else 0.5 if "-w0.5" in arm else 1.0), (task, arm)
        implicit = study.load_config(study.ROOT / path, study.overrides("implicit"))
        assert implicit.collect.rollouts_per_step == 0 and implicit.reward_model.kinds == ["implicit"]
        prime = study.load_config(study.ROOT / path, study.overrides("implicit-prime"))
        assert prime.reward_model.implicit.online_lr and prime.collect.rollouts_per_step == 0  # PRIME updates online


def _credit_unit(figures: Path, task: str, arm: str, seed: int, maj8: dict[int, float]) -> None:
    from pipeline.rundir import write_json_atomic

    rounds = {r: {"eval/maj@8": m, "eval/greedy": m, "eval/pass@1": m - 0.1, "policy/advantage_mean_share": 0.5}
              for r, m in maj8.items()}
    write_json_atomic(figures / task / f"{arm}-s{seed}.json", {
        "unit": f"{arm}-s{seed}", "commit": "abc1234", "date": "2026-12-05", "machine": "cpu", "seconds": 60.0,
        "rounds": rounds})


def test_the_credit_study_section_is_rebuilt_from_its_kept_figures_and_survives_the_main_reports_rebuild(tmp_path):
    """The study's section goes before the older sections of results.md, names each arm's per-seed gap to the
    verifier of the same seed (mean ± SE, in how many seeds it is at or above, the rule's verdict), and a rebuild of
    the main report by experiments/report.py keeps it as written."""
    import argparse

    figures = tmp_path / "docs" / "experiments" / "credit"
    for seed, (v, o) in enumerate([(0.80, 0.84), (0.90, 0.88), (0.70, 0.75)]):
        _credit_unit(figures, "quickstart", "verifier", seed, {0: 0.6, 1: 0.7, 2: v})
        _credit_unit(figures, "quickstart", "oracle-progress", seed, {0: 0.6, 1: 0.7, 2: o})
    out = tmp_path / "docs" / "results.md"
    out.write_text("# Results\n\nheader\n\n## 1. Old\n\nold table\n")
    a = argparse.Namespace(runs_dir=str(tmp_path / "runs"), figures=str(figures), rounds=2, smoke=False,
                           experiment="x", tracking_uri=None, mc_prompts=0)
    text = study.report(a, out).read_text()
    assert text.index("## Process rewards that pay") < text.index("## 1. Old") and "old table" in text
    row = [line for line in text.splitlines() if line.startswith("| `oracle-progress` |")][-1]  # the overrides' first
    # gaps +0.04, -0.02, +0.05: SD 0.038, SE 0.022; below on one seed of 3, so it does not pay
    assert "| 0.840 / 0.880 / 0.750 |" in row and "| +0.040 / -0.020 / +0.050 | +0.023 ± 0.022 SE | not kept |" in row
    assert row.endswith("| 2 of 3 | does not pay | 0.50 | 60 |") and study.RULE in text  # 60: its median wall time
    assert "### long-chains\n\nNot measured yet." in text
    assert study.report(a, out).read_text() == text  # rebuilt in place, not added again
    verdict = "**What held / what did not:** progress\ncredit held, on one seed."
    out.write_text(text.replace(study.END, verdict + "\n" + study.END))
    text = study.report(a, out).read_text()
    assert text.count(verdict) == 1 and text.index(verdict) < text.index(study.END)

    runs = runner.Experiments(_prm_runs(tmp_path))  # the main report, rebuilt into the same file
    rebuilt = ex.report(runs, "python -m experiments", None, log=False).read_text()
    assert text.partition(study.BEGIN)[2].partition(study.END)[0] in rebuilt
    assert rebuilt.index(study.BEGIN) < rebuilt.index("## 1. ")


def test_the_credit_study_gives_the_per_problem_paired_se_where_the_units_kept_per_problem_figures(tmp_path):
    """Units that kept eval.json's `per_problem` (round -> metric -> one value per problem) get the paired SE over
    every seed's problems pooled: here 3 seeds x 4 problems, the arm right on one more problem of each seed."""
    import argparse

    from pipeline.rundir import read_json, write_json_atomic

    figures = tmp_path / "docs" / "experiments" / "credit"
    for seed in range(3):
        _credit_unit(figures, "quickstart", "verifier", seed, {0: 0.5, 1: 0.5, 2: 0.5})
        _credit_unit(figures, "quickstart", "oracle-progress", seed, {0: 0.5, 1: 0.5, 2: 0.75})
        for arm, per in (("verifier", [1, 0, 1, 0]), ("oracle-progress", [1, 1, 1, 0])):
            path = figures / "quickstart" / f"{arm}-s{seed}.json"
            write_json_atomic(path, {**read_json(path), "per_problem": {"2": {"maj@8": per}}})
    out = tmp_path / "docs" / "results.md"
    a = argparse.Namespace(runs_dir=str(tmp_path / "runs"), figures=str(figures), rounds=2, smoke=False,
                           experiment="x", tracking_uri=None, mc_prompts=0)
    text = study.report(a, out).read_text()
    row = [line for line in text.splitlines() if line.startswith("| `oracle-progress` |")][-1]
    # per-problem differences 0, 1, 0, 0 on each seed: mean 0.25, SD 0.452, paired SE 0.452 / sqrt(12) = 0.131;
    # the per-seed gaps are all +0.25 (SD 0, SE 0): 2 SE above 0 and 3 of 3, so it pays
    assert "| +0.250 ± 0.131 SE | 3 of 3 | pays |" in row and "Per problem: the differences" in text


def test_the_frozen_studys_section_checks_the_room_per_seed_and_pairs_its_arms(tmp_path):
    """Issue 47's study (`--frozen`): its own section per task, the room check of point 4 on the verifier arm (round
    0's Maj@8 within [0.5, 0.8], a gain of at least 0.05, with its paired SE) and the arms' table by the rule."""
    import argparse

    from pipeline.rundir import read_json, write_json_atomic

    frozen = tmp_path / "frozen"
    for seed, (start, end) in enumerate([(0.66, 0.76), (0.85, 0.95), (0.70, 0.72)]):
        _credit_unit(frozen, "quickstart", "verifier", seed, {0: start, 1: start, 2: end})
        _credit_unit(frozen, "quickstart", "oracle-progress", seed, {0: start, 1: start, 2: end + 0.01})
    path = frozen / "quickstart" / "verifier-s0.json"  # seed 0 kept its per-problem figures: 4 problems
    write_json_atomic(path, {**read_json(path), "per_problem": {"0": {"maj@8": [1, 0, 0, 1]},
                                                                "2": {"maj@8": [1, 1, 0, 1]}}})
    a = argparse.Namespace(runs_dir=str(tmp_path / "runs"), figures=str(tmp_path / "credit"), frozen=str(frozen),
                           rounds=2, smoke=False, experiment="x", tracking_uri=None, mc_prompts=0)
    text = "\n".join(study.frozen_section(a))
    assert "### Issue 47's study on `quickstart`, from one commit" in text and "long-chains" not in text
    assert "<!-- generated: frozen-quickstart -->" in text and "every unit from `abc1234`" in text
    # per-problem differences 0, 1, 0, 0: mean 0.25, SD 0.5, paired SE 0.25
    assert "| 0 | 0.660 | yes | 0.760 | +0.100 | 0.250 | yes |" in text
    assert "| 1 | 0.850 | **no** | 0.950 | +0.100 | not kept | yes |" in text
    assert "| 2 | 0.700 | yes | 0.720 | +0.020 | not kept | **no** |" in text
    row = next(line for line in text.splitlines() if line.startswith("| `oracle-progress` |"))
    assert "| +0.010 / +0.010 / +0.010 |" in row and "| 3 of 3 | pays |" in row
