"""The shape of the house, over every folder of code but the tests (the packages, bench/, experiments/, any other
script folder): no import cycle, and no import by string that would hide one; `models/` the ground floor; no function
over 80 lines of code; no script that imports the tests or edits `sys.path`; the config and its tables (supervision
modes, RM kinds) import without torch; `pipeline/` never imports `flows/`; no test module imports another;
docs/extending.md's module map matches the tree."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP = {"tests", "build", "dist", "runs", "mlruns"}  # the tests themselves; build outputs and run folders


def source_files() -> list[Path]:
    """Every Python file of the top-level folders that hold code (a virtual environment's or a hidden one's aside)."""
    folders = [d for d in sorted(ROOT.iterdir()) if d.is_dir() and d.name not in SKIP and not d.name.startswith(".")
               and not (d / "pyvenv.cfg").exists()]
    return [p for d in folders for p in sorted(d.rglob("*.py"))]


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports, at module level or inside a function (a lazy import that
    closes a circle is a circle all the same: it only moves the failure to the first call)."""
    modules = {_module(p): p for p in source_files()}
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
    assert {"pipeline.config", "pipeline.phases", "flows.cli", "models.factories", "bench._common",
            "experiments.runner", "experiments.report"} <= set(graph)
    assert cycles(graph) == []


def test_the_cycle_finder_sees_a_lazy_import(tmp_path):
    # The graph counts imports inside functions: a circle closed by a lazy import is found.
    graph = {"pipeline.a": {"pipeline.b"}, "pipeline.b": {"pipeline.a"}, "pipeline.c": set()}
    assert cycles(graph) == [["pipeline.a", "pipeline.b"]]


def test_models_is_the_ground_floor():
    # models/ builds and loads from plain arguments: what needs an RM kind's table or a PRM layout is
    # pipeline/rm_kinds/loading.py. Before: models/factories.py imported pipeline.rm_kinds and pipeline.rundir inside
    # 6 functions, so models/ and pipeline/ depended on each other.
    up = {f"{m} -> {d}" for m, deps in import_graph().items() if m.split(".")[0] == "models"
          for d in deps if d.split(".")[0] != "models"}
    assert up == set()


# "module:attribute" naming one of the project's modules, for importlib: an import the graph cannot see
_BY_STRING = re.compile(r"(pipeline|flows|models|bench|experiments)(\.\w+)+:\w+")
PLUGIN_RESOLVER = "pipeline/registry.py"  # imports a plugin's "module:attribute": a module outside the project


def test_no_import_by_string():
    # Before: the RM kinds' table named "pipeline.rm_kinds.prm:PRM", whose module imported `auc` back from
    # pipeline.reward_model, the module that read the table: a cycle at run time. The project's own lazy imports
    # are real imports inside a function (pipeline/rm_kinds/__init__.py), which the graph above counts.
    found = []
    for p in source_files():
        for node in ast.walk(ast.parse(p.read_text())):
            called = isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
            if (called in ("import_module", "__import__") and str(p.relative_to(ROOT)) != PLUGIN_RESOLVER) or (
                    isinstance(node, ast.Constant) and isinstance(node.value, str) and _BY_STRING.fullmatch(node.value)):
                found.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def _code_lines(node: ast.FunctionDef) -> int:
    """A function's lines without its docstring (worked examples in a docstring are welcome)."""
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]
    return body[-1].end_lineno - body[0].lineno + 1 if body else 0


def test_no_function_over_80_lines_of_code():
    long = [f"{p.relative_to(ROOT)}:{node.name} ({_code_lines(node)} lines)"
            for p in source_files() for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _code_lines(node) > 80]
    assert long == []


def _is_sys_path(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
            and node.value.id == "sys")


def _sys_path_edit(node: ast.AST) -> bool:
    """`sys.path.insert(...)` (or any method call on it), or an assignment to `sys.path` or an item of it."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return _is_sys_path(node.func.value)
    if isinstance(node, (ast.Assign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(_is_sys_path(t.value if isinstance(t, ast.Subscript) else t) for t in targets)
    return False


def test_no_script_imports_the_tests_or_edits_sys_path():
    # Scripts run as modules from the repository root (`python -m bench.faults`); what they share with the tests
    # lives in the project (configs/mini.yaml), not in tests/.
    found = []
    for p in source_files():
        for node in ast.walk(ast.parse(p.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n == "tests" or n.startswith("tests.") for n in names):
                found.append(f"{p.relative_to(ROOT)}:{node.lineno} imports {names[0]}")
            elif _sys_path_edit(node):
                found.append(f"{p.relative_to(ROOT)}:{node.lineno} edits sys.path")
    assert found == []


def test_the_sys_path_check_sees_each_way_of_editing_it():
    edits = ["sys.path.insert(0, ROOT)", "sys.path.append('x')", "sys.path[:] = []", "sys.path = ['x']",
             "sys.path += ['x']"]
    assert all(_sys_path_edit(ast.parse(code).body[0].value if "(" in code else ast.parse(code).body[0])
               for code in edits)
    assert not _sys_path_edit(ast.parse("print(sys.path)").body[0].value)


def test_the_config_and_its_tables_import_without_torch():
    # Validating a config (supervision modes, RM kinds, reward functions, problem sets) needs no torch: `igrpo
    # check` and the config's errors come in a fraction of a second, and no table imports a trainer.
    # The plugin loader too: a config is validated after the plugins' registrations are loaded.
    code = ("import sys; import pipeline.config, pipeline.modes, pipeline.rm_kinds, pipeline.loading; "
            "pipeline.loading.config_from_dict({}, check_trl=False); "
            "print(sorted(m for m in ('torch', 'transformers', 'trl') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- the layout ----------------------------------------------------------------------------------------


def test_pipeline_never_imports_flows():
    offenders = {f"{m} -> {d}" for m, deps in import_graph().items() if m.split(".")[0] == "pipeline"
                 for d in deps if d.split(".")[0] == "flows"}
    assert offenders == set()


def test_no_test_module_imports_another_or_conftest():
    """Shared functions and constants live in tests/helpers.py, fixtures in conftest.py: a module of tests/ that
    imports a test module (or conftest) runs its import-time work and ties the two files' tests together."""
    def imported(path: Path) -> set[str]:
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module:
                names |= {n.module} | {f"{n.module}.{a.name}" for a in n.names}  # `from tests import test_x` too
        return names

    def a_test_module(name: str) -> bool:
        last = name.split(".")[-1]
        return last == "conftest" or last.startswith("test_")

    offenders = {p.name: sorted(filter(a_test_module, imported(p))) for p in (ROOT / "tests").glob("*.py")}
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_module_map_matches_the_tree():
    page = (ROOT / "docs" / "extending.md").read_text()
    section = page[page.index("## Module map"):]
    listed = set(re.findall(r"^\| `((?:pipeline|models|flows)/[\w/]+(?:\.py|/))` \|", section, flags=re.M))
    tree = {str(p.relative_to(ROOT)) for d in ("pipeline", "models", "flows") for p in (ROOT / d).glob("*.py")
            if p.name != "__init__.py"}
    tree |= {f"{p.relative_to(ROOT)}/" for d in ("pipeline", "models", "flows") for p in (ROOT / d).iterdir()
             if p.is_dir() and (p / "__init__.py").exists()}
    assert listed == tree
