"""One registry type for every extension point (`pipeline.registry`): keyword-only registration, one error shape;
and plugins by entry points: a distribution declaring one in `iterative_grpo.plugins` has its registrations loaded
where a config is validated and where each process the project starts begins. A round of a plugin's RM kind under
2 processes is test_launcher.py's RM-phase test; tests/test_extending.py registers one of each from outside.
"""

from __future__ import annotations

import ast

import pytest

from pipeline import modes, phases, problems, rewards, rm_kinds
from pipeline.registry import PluginError, Registry, load_plugins
from tests.helpers import ROOT, plugin_distribution

TABLES = {  # what an entry is called -> (the registry, its built-in names in order)
    "supervision mode": (modes.MODES, "outcome, process, hybrid, rft"),
    "reward function": (rewards.REWARD_FUNCS, "verifier, orm"),
    "reward model kind": (rm_kinds.RM_KINDS, "prm, orm, implicit"),
    "PRM head": (rm_kinds.PRM_HEADS, "value, label_tokens, classification"),
    "problem set kind": (problems.PROBLEM_SETS, "arithmetic, gsm8k, dataset"),
    "phase": (phases.PHASES, "policy, collect, reward_model, eval"),
}


@pytest.mark.parametrize("what", TABLES)
def test_every_extension_point_is_a_registry_with_one_error_shape(what):
    table, known = TABLES[what]
    assert isinstance(table, Registry)
    with pytest.raises(ValueError, match=f"^unknown {what} 'x'; known: {known}$"):
        table["x"]
    with pytest.raises(KeyError):  # still a dict's contract for code that catches KeyError
        table["x"]


def test_registration_is_keyword_only_in_order_and_never_replaces(registries):
    table = phases.PHASES

    def stats(cfg, runs, round_index):
        return phases.PhaseResult({})

    with pytest.raises(TypeError):  # an entry object, positionally: registration takes keywords only
        table.register("stats", table["collect"])
    table.register("stats", after="collect", run=stats, inputs=lambda done, r: {})
    assert list(table) == ["policy", "collect", "stats", "reward_model", "eval"]
    assert table["stats"].name == "stats"  # the registry fills the entry's own name field
    with pytest.raises(ValueError, match="^phase 'stats' is already registered; register yours under another name$"):
        table.register("stats", run=stats, inputs=lambda done, r: {})
    with pytest.raises(ValueError, match="^unknown phase 'colect'; known: policy, collect, stats, reward_model, eval$"):
        table.register("more", after="colect", run=stats, inputs=lambda done, r: {})
    rewards.REWARD_FUNCS.register("brevity", build=lambda problem_set, scorers: None)
    assert list(rewards.REWARD_FUNCS) == ["verifier", "orm", "brevity"]  # last by default


# --- plugins ---------------------------------------------------------------------------------------------

# A plugin's module: a function the entry point names, registering a kind that reuses the ORM's implementation.
ORM_AGAIN = '''from pipeline.rm_kinds import RM_KINDS


def register():
    RM_KINDS.register("orm_again", head="AutoModelForSequenceClassification", scores_steps=False, mc_labels=False,
                      implementation="pipeline.rm_kinds.orm:ORM", description="the ORM under another name")
'''


def test_a_plugin_is_loaded_where_the_config_is_validated_once_per_process(tmp_path, monkeypatch, registries):
    from pipeline.loading import config_from_dict

    assert "orm_again" not in rm_kinds.RM_KINDS
    monkeypatch.syspath_prepend(str(plugin_distribution(tmp_path / "site", "orm-again", {"orm_again.py": ORM_AGAIN},
                                                        "orm_again = orm_again:register")))
    cfg = config_from_dict({"reward_model": {"kinds": ["prm", "orm_again"]}}, check_trl=False)
    assert cfg.reward_model.kinds == ["prm", "orm_again"]
    assert rm_kinds.rm_kind("orm_again") is rm_kinds.rm_kind("orm")
    # The path changes: the entry points are read again, and this one, loaded already, is not loaded twice (its
    # `register` called again would raise: the name is taken).
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))
    load_plugins()


def test_a_plugin_that_fails_to_load_is_one_error_naming_it_and_its_distribution(tmp_path, monkeypatch, capsys):
    from flows.cli import main

    monkeypatch.syspath_prepend(str(plugin_distribution(tmp_path, "broken-plugin", {
        "broken_plugin.py": "import not_installed_anywhere\n"}, "broken = broken_plugin")))
    message = ("plugin 'broken' (broken_plugin) of broken-plugin 0.1, entry point group 'iterative_grpo.plugins', "
               "failed to load: ModuleNotFoundError: No module named 'not_installed_anywhere'")
    with pytest.raises(PluginError) as e:
        load_plugins()
    assert str(e.value) == message
    # `igrpo` says so in one line before it reads any config, and exits 2 (a user's error).
    assert main(["check", str(tmp_path / "never-read.yaml")]) == 2
    assert capsys.readouterr().err == f"igrpo: error: {message}\n"


# Where each process the project starts begins (`igrpo`, the flow in a Prefect worker, an `accelerate launch` rank,
# a Ray worker's shard) and where a config is validated: each loads the plugins before anything else.
ENTRIES = {"flows/cli.py": "_run_command", "flows/iterative.py": "iterative_rl", "pipeline/rounds.py": "launched",
           "pipeline/fanout.py": "generate_shard", "pipeline/loading.py": "config_from_dict"}


@pytest.mark.parametrize("path", ENTRIES)
def test_each_process_entry_loads_the_plugins_first(path):
    tree = ast.parse((ROOT / path).read_text())
    func = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == ENTRIES[path])
    calls = [n for statement in func.body for n in ast.walk(statement) if isinstance(n, ast.Call)]  # no decorator
    first = min(calls, key=lambda n: (n.lineno, n.col_offset))
    assert ast.unparse(first.func) == "load_plugins", f"{path}:{func.name} calls {ast.unparse(first)} first"


def test_the_registration_functions_of_before_still_register_for_one_release(registries):
    # A user's module written against the register_* functions keeps working, with a warning naming the new call.
    import dataclasses

    from pipeline import modes, phases, problems, rewards, rm_kinds

    old = [(modes.register_mode, modes.MODES, "outcome"), (rewards.register_reward, rewards.REWARD_FUNCS, "verifier"),
           (rm_kinds.register_rm_kind, rm_kinds.RM_KINDS, "orm")]
    for register, table, model in old:
        with pytest.warns(DeprecationWarning, match=r"is deprecated .* write .*\.register\('copy', field=value"):
            register("copy", table[model])
        assert table["copy"] == table[model]
    ps = dataclasses.replace(problems.PROBLEM_SETS["arithmetic"], kind="copy")
    with pytest.warns(DeprecationWarning, match=r"register_problem_set is deprecated"):
        problems.register_problem_set(ps)
    assert problems.PROBLEM_SETS["copy"] == ps
    phase = dataclasses.replace(phases.PHASES["eval"], name="copy")
    with pytest.warns(DeprecationWarning, match=r"register_phase is deprecated"):
        phases.register_phase(phase, after="collect")
    assert list(phases.PHASES)[2] == "copy"
    with pytest.warns(DeprecationWarning, match=r"register_phase is deprecated"):  # `after` given by position too
        phases.register_phase(dataclasses.replace(phase, name="copy2"), "collect")
    assert list(phases.PHASES)[2] == "copy2"
