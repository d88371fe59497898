"""The shape of the house: no import cycle in `pipeline/`, `flows/`, `models/`; no function over 80 lines of code;
the config and its tables (supervision modes, RM kinds) import without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pipeline", "flows", "models")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports, at module level or inside a function (a lazy import that
    closes a circle is a circle all the same: it only moves the failure to the first call)."""
    modules = {_module(p): p for d in PACKAGES for p in (ROOT / d).rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package
                    package = name.split(".")[: None if path.name == "__init__.py" else -1]
                    base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                found |= {base} | {f"{base}.{a.name}" for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm).

    >>> cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}})
    [['a', 'b']]
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    # Before the redesign: config <-> reward_model (the config imported the torch-heavy RM module for its table)
    # and launch <-> rounds.
    graph = import_graph()
    assert {"pipeline.config", "pipeline.phases", "flows.cli", "models.factories"} <= set(graph)
    assert cycles(graph) == []


def test_the_cycle_finder_sees_a_lazy_import(tmp_path):
    # The graph counts imports inside functions: a circle closed by a lazy import is found.
    graph = {"pipeline.a": {"pipeline.b"}, "pipeline.b": {"pipeline.a"}, "pipeline.c": set()}
    assert cycles(graph) == [["pipeline.a", "pipeline.b"]]


def _code_lines(node: ast.FunctionDef) -> int:
    """A function's lines without its docstring (worked examples in a docstring are welcome)."""
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]
    return body[-1].end_lineno - body[0].lineno + 1 if body else 0


def test_no_function_over_80_lines_of_code():
    long = [f"{p.relative_to(ROOT)}:{node.name} ({_code_lines(node)} lines)"
            for d in ("pipeline", "flows") for p in (ROOT / d).rglob("*.py")
            for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _code_lines(node) > 80]
    assert long == []


def test_the_config_and_its_tables_import_without_torch():
    # Validating a config (supervision modes, RM kinds, reward functions, problem sets) needs no torch: `igrpo
    # check` and the config's errors come in a fraction of a second, and no table imports a trainer.
    # The plugin loader too: a config is validated after the plugins' registrations are loaded.
    code = ("import sys; import pipeline.config, pipeline.modes, pipeline.rm_kinds, pipeline.loading; "
            "pipeline.loading.config_from_dict({}, check_trl=False); "
            "print(sorted(m for m in ('torch', 'transformers', 'trl') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
