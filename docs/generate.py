"""The docs' generated parts, from the code: the config reference (docs/config.md, from the fields' descriptions),
the tables of supervision modes and RM kinds (README.md, docs/supervision.md, docs/reward-models.md, from the
registries' declarations) and the README's table of commands (from the `igrpo` command's parser). Each lies between `<!-- generated: NAME -->` and `<!-- end generated -->`.

Run after changing a field, a mode or a kind, with the package installed: `python docs/generate.py`
(tests/test_docs_generated.py fails while a page differs from what this writes).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from pydantic import BaseModel

from pipeline.config import PipelineConfig, Section
from pipeline.modes import MODES
from pipeline.rm_kinds import RM_KINDS

ROOT = Path(__file__).resolve().parents[1]


def config_reference() -> str:
    """One table per section of the run config, from the fields' defaults and descriptions."""

    def rows(model: type[BaseModel], prefix: str) -> list[str]:
        out = []
        for name, f in model.model_fields.items():
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):  # a section: Section, a problem set's, a kind's
                out += rows(ann, f"{prefix}{name}.")
            else:
                default = f.get_default(call_default_factory=True)
                if isinstance(default, str):  # a newline default ("\n") would break the table's row
                    default = default.encode("unicode_escape").decode()
                out.append(f"| `{prefix}{name}` | `{default}` | {f.description or ''} |")
        return out

    parts: list[str] = []
    for name, f in PipelineConfig.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, Section):
            parts += ["", f"**`{name}:`** ", "", "| field | default | meaning |", "|---|---|---|", *rows(ann, f"{name}.")]
        else:  # a pass-through dict: a row under the section before it
            parts.append(f"| `{name}` | `{f.get_default(call_default_factory=True)}` | {f.description or ''} |")
    return "\n".join(parts[1:]) + "\n"


def modes_table() -> str:
    """`supervision.mode`'s choices (`pipeline.modes.MODES`): what the advantage is, when to use it."""
    rows = [f"| `{name}` | {m.description} | {m.use} |" for name, m in MODES.items()]
    return "\n".join(["| mode | what the advantage is | when to use it |", "|---|---|---|", *rows]) + "\n"


def kinds_table() -> str:
    """`reward_model.kinds`' choices (`pipeline.rm_kinds.RM_KINDS`): what each scores, how it is trained, when to
    use it."""
    rows = [f"| `{name}` | {e.description} | {e.training} | {e.use} |" for name, e in RM_KINDS.items()]
    return "\n".join(["| kind | what it scores | how it is trained | when to use it |", "|---|---|---|---|",
                      *rows]) + "\n"


def _synopsis(prog: str, parser: argparse.ArgumentParser) -> str:
    """`prog` with what it must be given: its positionals and required options (a choice of subcommands: a|b|c)."""
    words = [prog]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            words.append("\\|".join(action.choices))  # escaped: a bare | would end the table's cell
        elif not action.option_strings:
            words.append((action.metavar or action.dest.upper()) + ("..." if action.nargs in ("+", "*") else ""))
        elif action.required:
            words.append(f"{action.option_strings[-1]} {action.metavar or action.dest.upper()}")
    return " ".join(words)


def commands_table() -> str:
    """The `igrpo` command's subcommands (`flows.cli.build_parser`): what each must be given, and its help."""
    from flows.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub._choices_actions}
    rows = [f"| `{_synopsis(f'igrpo {name}', parser)}` | {helps[name]} |" for name, parser in sub.choices.items()]
    return "\n".join(["| command | what |", "|---|---|", *rows]) + "\n"


TIMINGS = ROOT / "docs" / "lab" / "timings.json"  # the README's Timings rows, as measured (issue 57, point 5)


def cpu_words(machine: str) -> str:
    """'Intel Xeon, 2 cores, AVX-512' from a kept unit's `machine` (experiments/runner.py's `machine`).

    >>> cpu_words("Intel(R) Xeon(R) Processor, 2 cores, torch 2.13.0+cpu, AVX512 kernels (native), 2 threads")
    'Intel Xeon, 2 cores, AVX-512'
    """
    cpu, _, rest = machine.partition(", torch ")
    isa = next((p.split()[0] for p in rest.split(", ") if "kernels" in p), "")
    return re.sub(r"\(R\)| Processor", "", cpu) + (", " + re.sub(r"AVX(\d)", r"AVX-\1", isa) if isa else "")


def timings_table() -> str:
    """The README's Timings: one row per README command, from docs/lab/timings.json and the quickstart's kept unit."""
    import json

    t = json.loads(TIMINGS.read_text())
    q, c = t["quickstart"], t["tests"]
    unit = json.loads((ROOT / q["unit"]).read_text())
    idle = lambda row: ", idle" if row["idle"] else ""  # noqa: E731
    rows = [
        f"| the quickstart | the run {unit['seconds']:.0f} s ({unit['seconds'] / 60:.1f} min, "
        f"[results](docs/results.md#the-quickstart-learns-issue-47)), plus installs: ~{q['installs_warm_minutes']:g} "
        f"min with pip's cache warm, ~{q['installs_cold_minutes']:g} min cold ({q['installs_cold_commit']}) | "
        f"{cpu_words(unit['machine'])}{idle(q)} | {unit['commit']} |",
        f"| the tests | `{c['command']}` in {c['where'].replace('TMPDIR', '`TMPDIR`')}: {c['seconds']:.0f} s "
        f"({c['seconds'] / 60:.1f} min): installs ~{c['installs_seconds']:.0f} s, {c['tests']} tests in "
        f"{c['pytest_seconds']:.1f} s on both cores (`-n {c['workers']}`) | {c['machine']}{idle(c)} | {c['commit']} |",
    ]
    return "\n".join(["| command | time | machine | commit |", "|---|---|---|---|", *rows]) + "\n"


# page -> the regions it holds, by name
PAGES = {
    "README.md": {"modes": modes_table, "rm-kinds": kinds_table, "commands": commands_table, "timings": timings_table},
    "docs/supervision.md": {"modes": modes_table},
    "docs/reward-models.md": {"rm-kinds": kinds_table},
    "docs/config.md": {"config": config_reference},
}


def generated(page: str, text: str) -> str:
    """`text` (the page `page`, relative to the repository) with each of its regions made again. The tables' links
    are written from the README: a page in docs/ gets them relative to itself."""
    for name, make in PAGES[page].items():
        body = make()
        if page.startswith("docs/"):
            body = body.replace("](docs/", "](")
        pattern = re.compile(rf"(<!-- generated: {name} -->\n).*?(<!-- end generated -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"{page}: no region '<!-- generated: {name} -->' ... '<!-- end generated -->'")
        text = pattern.sub(lambda m: m.group(1) + body + m.group(2), text)
    return text


def stale() -> list[str]:
    """The pages whose generated regions differ from what the code makes now."""
    return [page for page in PAGES if generated(page, (ROOT / page).read_text()) != (ROOT / page).read_text()]


def main() -> None:
    for page in PAGES:
        path = ROOT / page
        text = path.read_text()
        new = generated(page, text)
        if new != text:
            path.write_text(new)
            print(f"wrote {page}")


if __name__ == "__main__":
    main()
