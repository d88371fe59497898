"""Every number a reader sees in docs/results.md and in the README's results and Timings sections is made from the kept
files, and a test finds any one of them changed (issue 57, point 5): on 5098874, 12 of 20 numbers sampled there could
be changed by one digit while the tests still passed.

What counts as a figure: every run of digits, in prose as in tables (counts, times, dates, commits, section numbers
too). docs/results.md is compared whole with what the reports write from docs/experiments/ into an empty page
(experiments/pages.py): nothing of the committed page is carried over, so every digit on it is remade, and a verdict
is a template (experiments/verdicts.py, credit_verdicts.py), not a paragraph written into the page. In the README's
two sections the figures lie in the regions `results` (experiments/report.py's `glance`) and `timings`
(docs/generate.py's `timings_table`: docs/lab/timings.json and the quickstart's kept unit), compared with what those
make; outside the regions a digit may stand only in a link's target, an address (tests/test_docs.py checks that it
resolves), which is the one kind of number token the mutations below leave alone.

After keeping a unit or changing a report: `python -m experiments.pages`.
"""

from __future__ import annotations

import ast
import doctest
import json
import re
import time

import pytest

from bench._common import ROOT
from experiments import pages
from experiments.report import GENERATED


@pytest.fixture(scope="module")
def kept() -> pages.Kept:
    return pages.Kept.now()


def committed() -> tuple[str, str]:
    return (ROOT / "docs" / "results.md").read_text(), (ROOT / "README.md").read_text()


def test_the_pages_are_what_the_kept_files_make(kept):
    results, readme = committed()
    assert kept.problems(results, readme) == []


def mutated(text: str, m: re.Match) -> str:
    """`text` with the last digit of the number token `m` changed (9 -> 0, any other d -> d + 1)."""
    i = m.end() - 1
    return text[:i] + str((int(text[i]) + 1) % 10) + text[i + 1:]


def tokens(text: str, start: int = 0, end: int | None = None) -> list[re.Match]:
    """The number tokens of `text[start:end]` a mutation may change: all but those in a link's target outside the
    generated regions (an address, the rule's one exception)."""
    regions = [m.span() for m in GENERATED.finditer(text)]
    links = [m.span() for m in pages.LINK_TARGET.finditer(text) if not any(a <= m.start() < b for a, b in regions)]
    return [m for m in pages.NUMBER.finditer(text, start, len(text) if end is None else end)
            if not any(a <= m.start() < b for a, b in links)]


def test_every_number_changed_by_one_digit_is_found(kept):
    """Each number token of docs/results.md and of the README's two sections, changed by one digit in a copy of the
    text (the files are never touched), makes the check fail: a figure a test cannot see cannot be kept."""
    results, readme = committed()
    begin = time.perf_counter()
    missed = [f"docs/results.md: {results[max(0, m.start() - 40):m.end() + 10]!r}" for m in tokens(results)
              if not kept.problems(mutated(results, m), readme)]
    in_readme = [m for a, b in pages.readme_spans(readme) for m in tokens(readme, a, b)]
    missed += [f"README.md: {readme[max(0, m.start() - 40):m.end() + 10]!r}" for m in in_readme
               if not kept.problems(results, mutated(readme, m))]
    n = len(tokens(results)) + len(in_readme)
    assert n > 1000 and len(in_readme) > 50  # every one of them, not a sample
    assert missed == [], f"{len(missed)} of {n} changes went unseen"
    assert time.perf_counter() - begin < 30


def test_a_hand_written_line_a_moved_figure_and_a_figure_outside_the_readmes_regions_are_each_named(kept):
    results, readme = committed()
    at = results.index("## 1. ")  # a paragraph no report writes, between two sections
    hand = results[:at] + "Held in 3 of 3 seeds.\n\n" + results[at:]
    assert kept.problems(hand, readme) == ["docs/results.md: a line no report writes: 'Held in 3 of 3 seeds.'"]
    # A figure swapped for another that the tables also hold: still not what the report makes there.
    swapped = results.replace("mean -0.021 ± 0.006 SE", "mean -0.016 ± 0.014 SE", 1)
    assert swapped != results and kept.problems(swapped, readme) == [
        "docs/results.md: region 'results-2' is not what its report makes (python -m experiments.pages)"]
    intro = readme.replace("embedded problem set at the budgets", "embedded problem set, 3 seeds, at the budgets")
    assert [p.partition(":")[0] for p in kept.problems(results, intro)] == ["README.md"]
    moved = readme.replace("<!-- end generated -->\n\nOther times", "\nOther times").replace(
        "<!-- generated: timings -->\n", "")
    assert "README.md: region 'timings' is not what its generator makes (python -m experiments.pages)" in \
        kept.problems(results, moved)


def test_a_region_no_report_makes_is_named_with_where_its_report_belongs(kept):
    results, readme = committed()
    extra = results.replace("<!-- passk-study: end -->",
                            "<!-- generated: step-credit -->\nx\n<!-- end generated -->\n<!-- passk-study: end -->")
    assert "docs/results.md: region 'step-credit' is made by no report (its study's report belongs in " \
           "experiments/pages.py's STUDY_REPORTS)" in kept.problems(extra, readme)


def test_the_timings_rows_read_the_kept_files():
    # The quickstart's run time is its kept unit's (247.5 s: the README said 248 s by hand); the tests' row is
    # docs/lab/timings.json's.
    from docs import generate

    examples = doctest.testmod(generate)
    assert examples.attempted and not examples.failed
    unit = json.loads((ROOT / json.loads(generate.TIMINGS.read_text())["quickstart"]["unit"]).read_text())
    assert f"| the quickstart | the run {unit['seconds']:.0f} s ({unit['seconds'] / 60:.1f} min" in generate.timings_table()


@pytest.mark.parametrize("module", ["experiments/verdicts.py", "experiments/credit_verdicts.py"])
def test_the_verdict_templates_type_no_figure(module):
    """The verdicts' prose is code: a decimal or a 'k of n' count typed into one of its strings would be a figure no
    kept file makes (inline code, a command or a setting, may hold digits)."""
    tree = ast.parse((ROOT / module).read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.FunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr)}  # docstrings: their examples are not the page's
    typed = [f"{module}:{node.lineno}: {node.value[:80]!r}" for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
             and re.search(r"\d\.\d|\d+ of \d+", re.sub(r"`[^`]*`", "", node.value))]
    assert typed == []
    assert re.search(r"\d\.\d", "0.947") and re.search(r"\d+ of \d+", "3 of 3 seeds")  # what it would catch
