"""One registry type for every extension point (`pipeline.registry`): keyword-only registration, one error shape;
and plugins by entry points: a distribution declaring one in `iterative_grpo.plugins` has its registrations loaded
where a config is validated and where each process the project starts begins. A round of a plugin's RM kind under
2 processes is test_launcher.py's RM-phase test; tests/test_extending.py registers one of each from outside.
"""

from __future__ import annotations

import ast

import pytest

from pipeline import (
    collect_choices,
    credit,
    launchers,
    modes,
    phases,
    problems,
    rewards,
    rm_kinds,
    sampling_backends,
    step_rewards,
)
from pipeline.problems import dataset
from pipeline.registry import PluginError, Registry, load_plugins
from tests.helpers import ROOT, plugin_distribution

TABLES = {  # what an entry is called -> (the registry, its built-in names in order)
    "supervision mode": (modes.MODES, "outcome, process, hybrid, rft, passk"),
    "reward function": (rewards.REWARD_FUNCS, "verifier, orm"),
    "reward model kind": (rm_kinds.RM_KINDS, "prm, orm, implicit"),
    "PRM head": (rm_kinds.PRM_HEADS, "value, label_tokens, classification"),
    "problem set kind": (problems.PROBLEM_SETS, "arithmetic, gsm8k, dataset"),
    "phase": (phases.PHASES, "policy, collect, reward_model, eval"),
    "process reward": (step_rewards.PROCESS_REWARDS, "value, progress, prime"),
    "oracle": (step_rewards.ORACLES, "gold, mc"),
    "launcher": (launchers.LAUNCHERS, "local, accelerate, ray"),
    "process credit": (credit.CREDITS, "sum, min, step"),
    "process baseline": (credit.BASELINES, "group, position"),
    "process centring": (credit.CENTRINGS, "none, group, output"),
    "aggregation": (rm_kinds.AGGREGATIONS, "min, last, product"),
    "collection strategy": (collect_choices.STRATEGIES, "exhaustive, first_error"),
    "task runner": (collect_choices.TASK_RUNNERS, "thread, ray"),
    "prover": (collect_choices.PROVERS, "policy, round0"),
    "sampling backend": (sampling_backends.BACKENDS, "hf, vllm"),
    "ORM loss": (rm_kinds.ORM_LOSSES, "bce, pairwise"),
    "PRM target": (rm_kinds.PRM_TARGETS, "hard, soft"),
    "answer format": (dataset.ANSWER_FORMATS, "number, latex"),
}


def test_every_table_of_the_project_is_here_and_restored_by_the_fixture():
    # The tables of every pipeline module (imported above): each has its error-shape case in TABLES, and each is one
    # that conftest.py's `registries` restores (`registry.tables()`: every Registry made), whose modules, imported
    # alone in a fresh interpreter (helpers.TABLE_MODULES), make every table.
    import subprocess
    import sys

    from pipeline import registry

    found = {id(v) for name, m in list(sys.modules.items()) if name.startswith("pipeline")
             for v in vars(m).values() if isinstance(v, Registry)}
    assert found == {id(t) for t, _ in TABLES.values()}
    assert found <= {id(t) for t in registry.tables()}
    made = subprocess.run([sys.executable, "-c", "from tests.helpers import import_tables; import_tables(); "
                           "from pipeline import registry; print(len(registry.tables()))"],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert int(made) == len(TABLES)


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


def test_the_registration_functions_of_before_are_gone():
    # No release shipped the register_* functions of before the Registry type: each table's `register` is the one way.
    from pipeline import modes, phases, problems, registry, rewards, rm_kinds

    assert not hasattr(registry, "deprecated")
    for module, old in [(rewards, "register_reward"), (rm_kinds, "register_rm_kind"), (modes, "register_mode"),
                        (problems, "register_problem_set"), (phases, "register_phase")]:
        assert not hasattr(module, old), f"{module.__name__}.{old}"


# --- a registration reaches every reader of the config's classes -------------------------------------------


def test_a_kind_registered_from_a_test_file_reaches_every_module_that_imported_the_config_classes(registries):
    # Before: the config's classes were made again on each registration and rebound in pipeline.config only, so a
    # module that had imported RewardModelConfig (pipeline.reward_model, pipeline.rm_kinds.loading) kept the class
    # of before the plugin loaded, without its section: `evaluate_reward_model`'s default refused the kind's keys.
    import sys

    from pydantic import Field

    import pipeline.reward_model  # noqa: F401  the readers, imported before the registration
    import pipeline.rm_kinds.loading  # noqa: F401
    from pipeline import config
    from pipeline.rm_kinds.sections import KindSection

    class WidthSection(KindSection):
        width: int = Field(3, description="A setting of the test's kind.")

    rm_kinds.RM_KINDS.register("wide", head="AutoModelForSequenceClassification", scores_steps=False,
                               mc_labels=False, implementation=lambda: rm_kinds.rm_kind("orm"), config=WidthSection)
    problems.PROBLEM_SETS.register("copied", **{k: getattr(problems.PROBLEM_SETS["arithmetic"], k)
                                                for k in ("config", "build", "description", "problem_set")})
    readers = {(name, cls): getattr(module, cls) for name, module in list(sys.modules.items())
               if name.split(".")[0] in ("pipeline", "flows", "models")
               for cls in ("PipelineConfig", "RewardModelConfig", "ProblemsConfig") if hasattr(module, cls)}
    assert {("pipeline.reward_model", "RewardModelConfig"), ("pipeline.rm_kinds.loading", "RewardModelConfig")} <= set(
        readers)
    assert [where for where, cls in readers.items() if cls is not getattr(config, where[1])] == []  # one class each
    assert pipeline.reward_model.RewardModelConfig(wide={"width": 5}).wide.width == 5
    assert pipeline.rm_kinds.loading.RewardModelConfig().wide.width == 3
    assert pipeline.reward_model.PipelineConfig(problems={"kind": "copied"}).problems.copied is not None
    # Undone (the fixture takes the entries out): the section goes with it, from every reader alike.
    rm_kinds.RM_KINDS.pop("wide")
    config._extension_registered()
    with pytest.raises(Exception, match="wide"):
        pipeline.rm_kinds.loading.RewardModelConfig(wide={"width": 5})


# --- the config's choices are the tables' names -------------------------------------------------------------

CHOICES = {"supervision.process_reward": "process reward", "reward_model.oracle": "oracle", "launcher.kind": "launcher",
           "supervision.process_credit": "process credit", "supervision.process_baseline": "process baseline",
           "supervision.process_centring": "process centring", "reward_model.aggregation": "aggregation",
           "collect.strategy": "collection strategy", "collect.task_runner": "task runner", "collect.prover": "prover",
           "collect.backend": "sampling backend", "eval.backend": "sampling backend",
           "reward_model.target": "PRM target",
           "reward_model.orm.loss": "ORM loss", "problems.dataset.answer_format": "answer format"}


def _at(field: str, value, data: dict | None = None) -> dict:
    """`data` with the dotted `field` set to `value` (its sections merged, not replaced)."""
    data = dict(data or {})
    head, _, rest = field.partition(".")
    data[head] = _at(rest, value, data.get(head)) if rest else value
    return data


@pytest.mark.parametrize("field", CHOICES)
def test_a_choice_of_the_config_is_its_tables_name_with_the_registrys_one_error(field, monkeypatch):
    # Before: Literal fields, whose error was pydantic's "Input should be 'value', 'progress' or 'prime'", and an
    # if-chain over the names in the trainer, so a plugin could add none.
    from pipeline.config import ConfigError
    from pipeline.loading import config_from_dict

    table, known = TABLES[CHOICES[field]]
    base = {"problems": {"kind": "dataset", "dataset": {"hub_name": "o/d"}}} if field.startswith("problems.") else {}
    with pytest.raises(ConfigError, match=f"^{field}: unknown {CHOICES[field]} 'x'; known: {known}$"):
        config_from_dict(_at(field, "x", base), check_trl=False)
    monkeypatch.setitem(table, "x", next(iter(table.values())))  # an entry added (as a plugin would): now a choice
    data = _at(field, "x", {**base, "supervision": {"mode": "process"}})
    value = config_from_dict(data, check_trl=False)
    for name in field.split("."):
        value = getattr(value, name)
    assert value == "x"


def test_a_process_reward_registered_from_a_test_file_makes_the_trainers_step_advantages(monkeypatch):
    # The trainer reads the entry, not a name: `ProcessGRPOTrainer._step_advantages` hands the gathered step scores to
    # its `advantages`, and logs its figures under process/.
    import torch

    from pipeline.step_rewards import PROCESS_REWARDS, ProcessInputs

    def halved(x: ProcessInputs):
        adv, figures = PROCESS_REWARDS["value"].advantages(x)
        return adv / 2, {"halved": 1.0, **figures}

    monkeypatch.setitem(PROCESS_REWARDS, "halved", step_rewards.ProcessReward(description="half", advantages=halved))
    from pipeline.config import SupervisionConfig

    s = SupervisionConfig(mode="process", process_reward="halved")
    x = ProcessInputs([[1.0], [0.0]], [[1], [1]], None, torch.tensor([1.0, 0.0]), [2, 2], 2, 2, "group", s)
    full, _ = PROCESS_REWARDS["value"].advantages(x)
    adv, figures = PROCESS_REWARDS[s.process_reward].advantages(x)
    assert torch.equal(adv, full / 2) and figures == {"halved": 1.0}


def test_a_credit_registered_from_a_test_file_makes_the_process_advantages(registries):
    # `process_advantages` reads the credit's entry, not an if-chain over the names: a credit registered from here
    # (the last step's value on every token ahead of it, a made-up credit) is a choice of the config and is what
    # the real function credits each token with.
    import torch

    from pipeline.advantages import process_advantages
    from pipeline.loading import config_from_dict

    def final(completion, end, value, batch_size, length):
        out = torch.zeros(batch_size, length, dtype=torch.float64)  # (B, T)
        for i, e, v in zip(completion.tolist(), end.tolist(), value.tolist()):
            out[i, : e + 1] = v  # the later steps overwrite: each token keeps the last step's value
        return out

    credit.CREDITS.register("final", description="the last step's value", credited=final)
    cfg = config_from_dict({"supervision": {"mode": "process", "process_credit": "final"}}, check_trl=False)
    # One group of 2: steps [1, 0] (ends 1, 3) and [0] (end 2); mean 1/3, unbiased std 0.5774: normalised
    # [1.1545, -0.5773] and [-0.5773]; every token of output 1 to its last step end gets -0.5773, of output 2 too.
    adv = process_advantages([[1.0, 0.0], [0.0]], [[1, 3], [2]], 5, 2, credit=cfg.supervision.process_credit)
    expected = torch.tensor([[-0.5773] * 4 + [0.0], [-0.5773] * 3 + [0.0] * 2])
    torch.testing.assert_close(adv, expected, atol=1e-4, rtol=0)
    assert adv.dtype == torch.float32  # the entry's (B, T), cast as the built-in credits' are


def test_an_aggregation_registered_from_a_test_file_is_the_scorers(registries):
    from pipeline.loading import config_from_dict
    from pipeline.scorers import aggregate

    rm_kinds.AGGREGATIONS.register("mean", description="the mean step score", aggregate=lambda s: sum(s) / len(s))
    cfg = config_from_dict({"reward_model": {"aggregation": "mean"}}, check_trl=False)
    assert aggregate([0.9, 0.5, 0.7], cfg.reward_model.aggregation) == pytest.approx(0.7)
