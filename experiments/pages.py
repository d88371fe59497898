"""docs/results.md whole, and README.md's results and Timings, made again from the kept files alone (issue 57,
point 5): what tests/test_figures_kept.py compares the committed pages with, and what to run after keeping a unit
(seconds, no `runs/` needed):

  python -m experiments.pages           # rewrite docs/results.md and the README's two regions from the kept files

docs/results.md is the reports' output and nothing else: experiments/report.py's sections (their verdicts from
experiments/verdicts.py), then each study's section (`STUDY_REPORTS`), written into an empty page, so no text of the
committed page is carried over and every number on it is made from docs/experiments/. A new study's section joins
by one entry in `STUDY_REPORTS`; a verdict is a template (experiments/verdicts.py, credit_verdicts.py), never a
paragraph written into the page.

The README's `results` region is experiments/report.py's `glance`, its `timings` region docs/generate.py's
`timings_table` (docs/lab/timings.json and the quickstart's kept unit). Outside those regions, the README's results
and Timings sections hold no digit but in a link's target (an address: tests/test_docs.py checks it resolves).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench._common import ROOT
from docs.generate import timings_table
from experiments import credit_study, passk_study, runner, smollm2_budgets, smollm2_step_credit, step_credit
from experiments import report as main_report
from experiments.report import GENERATED, HISTORY, glance, write_region

# The README's sections whose figures are kept (their headings, as written), and the generated regions in them.
README_SECTIONS = ("## Results at a glance", "### Timings")
README_REGIONS = ("results", "timings")
NUMBER = re.compile(r"\d+")  # a number token: a run of digits (a decimal is two, a date three)
LINK_TARGET = re.compile(r"\]\([^)\s]*\)")


def _study(module, figures: str) -> Callable[[Path], None]:
    """A study's report (`module.report`), written into the page `out` from its kept units under `figures`."""
    def write(out: Path) -> None:
        module.report(argparse.Namespace(runs_dir=str(out.parent / "runs"), figures=figures, rounds=2, smoke=False,
                                         experiment="x", tracking_uri=None, mc_prompts=0), out)
    return write


# Each study's report, in the order their sections stand (each puts its section after the others').
def _step_credit(out: Path) -> None:
    step_credit.report(argparse.Namespace(out=str(out), figures=step_credit.FIGURES, plan=step_credit.PLAN))


STUDY_REPORTS = (_study(credit_study, "docs/experiments/credit"), _study(passk_study, "docs/experiments/passk"),
                 _step_credit, smollm2_budgets.report, smollm2_step_credit.report)


def results_page() -> str:
    """docs/results.md as the reports write it into an empty page from the kept units (no plots, no MLflow)."""
    cwd = Path.cwd()
    with tempfile.TemporaryDirectory() as tmp:
        docs = Path(tmp) / "docs"
        (docs / HISTORY).parent.mkdir(parents=True)
        shutil.copy(ROOT / "docs" / HISTORY, docs / HISTORY)  # the header links it when it is there
        os.chdir(ROOT)  # the pages name the kept files relative to the repository
        try:
            a = argparse.Namespace(runs_dir=str(Path(tmp) / "runs"), seeds=[0, 1, 2], rounds=2, out=str(docs),
                                   figures="docs/experiments", smoke=False, experiment=runner.EXPERIMENT,
                                   tracking_uri=None, mc_prompts=64)
            main_report.report(runner.Experiments(a), "python -m experiments", None, log=False, plots=False)
            for write in STUDY_REPORTS:
                write(docs / "results.md")
        finally:
            os.chdir(cwd)
        return (docs / "results.md").read_text()


def readme_regions() -> dict[str, str]:
    """The README's regions with figures, as their generators write them from the kept files."""
    results = glance(ROOT / "docs" / "experiments", credit_study.LEARNED)  # a table; issue 57's row after its rows
    cwd = Path.cwd()
    os.chdir(ROOT)  # the row reads the kept files relative to the repository
    try:
        row = step_credit.glance_row()
    finally:
        os.chdir(cwd)
    return {"results": results.rstrip("\n") + "\n| " + " | ".join(row) + " |\n", "timings": timings_table()}


def readme_spans(text: str) -> list[tuple[int, int]]:
    """Where the README's results and Timings sections lie: each from its heading to the next heading of its level
    or above."""
    spans = []
    for heading in README_SECTIONS:
        start = text.index(heading + "\n")
        nxt = re.compile(r"^#{1,%d} " % len(heading.split()[0]), re.M).search(text, start + len(heading))
        spans.append((start, nxt.start() if nxt else len(text)))
    return spans


def readme_sections(text: str) -> str:
    return "".join(text[a:b] for a, b in readme_spans(text))


class Kept:
    """What the kept files make of the pages (`results_page`, `readme_regions`), to check pages against."""

    def __init__(self, results: str, regions: dict[str, str]):
        self.results, self.regions = results, regions
        self.results_regions = dict(GENERATED.findall(results))
        self.results_lines = set(GENERATED.sub("", results).splitlines())

    @classmethod
    def now(cls) -> Kept:
        return cls(results_page(), readme_regions())

    def problems(self, results: str, readme: str) -> list[str]:
        """What the pages say that the kept files do not: each region of docs/results.md that differs from what its
        report makes, or that no report makes, and each line outside them that no report writes; each README region
        that differs from its generator's; each digit of the README's results and Timings sections outside those
        regions and outside link targets. Empty: every number is kept."""
        bad = []
        if results != self.results:
            have = dict(GENERATED.findall(results))
            bad += [f"docs/results.md: region {name!r} is not what its report makes (python -m experiments.pages)"
                    for name, body in have.items() if name in self.results_regions and body != self.results_regions[name]]
            bad += [f"docs/results.md: region {name!r} is made by no report (its study's report belongs in "
                    "experiments/pages.py's STUDY_REPORTS)" for name in have.keys() - self.results_regions.keys()]
            bad += [f"docs/results.md: region {name!r} is missing (python -m experiments.pages)"
                    for name in self.results_regions.keys() - have.keys()]
            bad += [f"docs/results.md: a line no report writes: {line[:100]!r}"
                    for line in GENERATED.sub("", results).splitlines() if line not in self.results_lines]
            bad = bad or ["docs/results.md: not what the reports make (python -m experiments.pages)"]
        sections = readme_sections(readme)
        have = dict(GENERATED.findall(sections))
        bad += [f"README.md: region {name!r} is not what its generator makes (python -m experiments.pages)"
                for name in README_REGIONS if have.get(name) != self.regions[name]]
        bad += [f"README.md: a figure outside a generated region: {line[:100]!r}"
                for line in LINK_TARGET.sub("", GENERATED.sub("", sections)).splitlines() if NUMBER.search(line)]
        return bad


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    page = ROOT / "docs" / "results.md"
    page.write_text(results_page())
    for name, body in readme_regions().items():
        write_region(ROOT / "README.md", name, body)
    print(f"wrote {page.relative_to(ROOT)} and README.md's {', '.join(README_REGIONS)}")


if __name__ == "__main__":
    main()
