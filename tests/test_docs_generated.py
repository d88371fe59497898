"""The docs' generated parts are what the code makes now: the config reference (docs/config.md) and the tables of
supervision modes and RM kinds (README.md, docs/supervision.md, docs/reward-models.md), from the registries."""

from __future__ import annotations

import pytest

from docs import generate


def test_every_generated_page_is_up_to_date():
    # After changing a field, a mode or a kind: `python docs/generate.py`.
    assert generate.stale() == []


def test_a_mode_or_kind_registered_changes_its_tables(monkeypatch):
    # The tables come from the registries' declarations, so a description edited there leaves the pages stale.
    from pipeline.modes import MODES
    from pipeline.rm_kinds import RM_KINDS

    monkeypatch.setitem(MODES, "rft", MODES["rft"].__class__(**{**MODES["rft"].__dict__, "use": "never"}))
    assert "| `rft` | Online RFT" in generate.modes_table() and "| never |" in generate.modes_table()
    assert set(generate.stale()) == {"README.md", "docs/supervision.md"}
    monkeypatch.setitem(RM_KINDS, "orm", RM_KINDS["orm"].__class__(**{**RM_KINDS["orm"].__dict__, "training": "x"}))
    assert set(generate.stale()) == {"README.md", "docs/supervision.md", "docs/reward-models.md"}


def test_a_page_without_its_region_is_an_error_naming_it():
    with pytest.raises(ValueError, match="README.md: no region '<!-- generated: modes -->'"):
        generate.generated("README.md", "# no tables here\n")


def test_the_readmes_commands_are_the_parsers_every_subcommand_with_its_required_arguments():
    # Before: a hand-written table, without `igrpo stack` (added to the parser later). Now written from it.
    import argparse

    from flows.cli import build_parser

    table = generate.commands_table()
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert [row.split("`")[1].split()[1] for row in table.splitlines()[2:]] == list(sub.choices)
    assert "| `igrpo stack up\\|status\\|down` |" in table  # a nested choice, its | escaped for the table
    assert "| `igrpo collect CONFIG --policy P --round R --run-dir D` | sample a policy, label its samples |" in table
    assert "| `igrpo compare RUN...` |" in table
    assert "<!-- generated: commands -->\n" + table in (generate.ROOT / "README.md").read_text()
