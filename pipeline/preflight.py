"""Every check before work starts, run once: the config's data, models, prompts and reward functions, the
launcher, MLflow and the run directory (`preflight` for `igrpo run` and the flow; `check_run` for `igrpo check`).

Each check raises the loader's own clear error, naming the field, file, row, path or URI, and writes nothing.
"""

from __future__ import annotations

from pathlib import Path

from pipeline import tracking
from pipeline.collect_choices import TASK_RUNNERS
from pipeline.config import ConfigError, PipelineConfig
from pipeline.dtypes import dtype_change, run_dtypes
from pipeline.launchers import LAUNCHERS
from pipeline.loading import resumed_config_diff
from pipeline.problems import problem_set_from_config
from pipeline.rundir import Manifest, RunDirError, read_json, refuse_if_locked
from pipeline.sampling_backends import BACKENDS

# The setting that needs no extra, for each field that can ask for one.
_WITHOUT = {"backend": "hf", "use_vllm": "false", "task_runner": "thread", "kind": "local"}


def extras_needed(cfg: PipelineConfig) -> list[tuple[str, str, str]]:
    """(field, pip extra, module) for each optional engine the config asks for."""
    needed = [(f"{name}.backend", *extra) for name in ("collect", "eval")
              if (extra := BACKENDS[getattr(cfg, name).backend].extra) is not None]
    if cfg.grpo.get("use_vllm") is True:
        needed.append(("grpo.use_vllm", "vllm", "vllm"))
    if cfg.collect.workers > 1 and (extra := TASK_RUNNERS[cfg.collect.task_runner].extra) is not None:
        needed.append(("collect.task_runner", *extra))
    if (extra := LAUNCHERS[cfg.launcher.kind].extra) is not None:
        needed.append(("launcher.kind", *extra))
    return needed


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def check_extras(cfg: PipelineConfig) -> str:
    """A ConfigError naming every field whose engine is not installed, with the pip command and the setting that
    needs none; checked by every `igrpo` command before anything starts, not when the first GRPO phase does."""
    needed = extras_needed(cfg)
    missing: dict[str, list[str]] = {}
    for field, extra, module in needed:
        if not _installed(module):
            missing.setdefault(extra, []).append(field)
    lines = []
    for extra, fields in missing.items():
        instead = ", ".join(f"{f}: {_WITHOUT[f.rsplit('.', 1)[1]]}" for f in fields)
        lines.append(f"{', '.join(fields)}: needs the [{extra}] extra, which is not installed: "
                     f"pip install 'iterative-grpo[{extra}]' (or set {instead})")
    if lines:
        raise ConfigError("\n".join(lines))
    return ", ".join(sorted({extra for _, extra, _ in needed})) or "none needed"


def _problems(cfg: PipelineConfig) -> str:
    from pipeline.eval_phase import held_out_problems

    problems = problem_set_from_config(cfg)
    held_out_problems(cfg, problems)
    return f"{problems.name}: {len(problems.train)} train, {len(problems.test)} held-out problems"


def _model(spec: str, field: str, causal_lm: bool = False) -> str:
    from models.factories import check_model_available

    path, gguf = check_model_available(spec, field, causal_lm=causal_lm)
    return f"{path}/{gguf}" if gguf else path


def _policy_model(cfg: PipelineConfig) -> str:
    return "tiny (built here)" if cfg.policy.model == "tiny" else _model(cfg.policy.model, "policy.model", causal_lm=True)


def _reward_model_backbone(cfg: PipelineConfig) -> str:
    from pipeline.rm_kinds import RM_KINDS

    spec = cfg.reward_model.model
    causal = any(RM_KINDS[k].head == "AutoModelForCausalLM" for k in cfg.reward_model.kinds)  # the implicit PRM
    return "the round's policy" if spec is None else _model(spec, "reward_model.model", causal_lm=causal)


def _prm_layout(cfg: PipelineConfig) -> str:
    """The PRM layout against what will read it, before any work: a fresh PRM's label tokens in its backbone's
    tokenizer (a missing tag is added then), or `reward_model.init`: its checkpoint, its layout against the config's
    `head`, its tokenizer holding the tag and label tokens."""
    from pipeline.rm_kinds import layout_of, rm_entry
    from pipeline.rm_kinds.heads import single_token

    rm = cfg.reward_model
    if not any(rm_entry(kind).layouts for kind in rm.kinds):
        return "no PRM"
    layout = layout_of(rm)
    if rm.init:
        layout = _init_layout(cfg, layout)
    elif layout.label_tokens:
        spec = rm.model or cfg.policy.model
        try:
            tokenizer = _backbone_tokenizer(spec)
        except Exception:  # the policy.model / reward_model.model checks report it
            return "not checked: the backbone does not load"
        for token in layout.label_tokens:
            single_token(tokenizer, token, f"reward_model.label_tokens (in the tokenizer of {spec}):")
    return f"head {layout.head}" + (f", tag {layout.step_tag!r}" if layout.step_tag else "")


def _backbone_tokenizer(spec: str):
    from models import char_tokenizer
    from models.factories import load_tokenizer

    return char_tokenizer() if spec == "tiny" else load_tokenizer(spec)


def _init_layout(cfg: PipelineConfig, asked):
    """`reward_model.init`'s layout: a PRM checkpoint whose recorded layout (else the one its architecture shows)
    is the config's, with a tokenizer that holds its tag and label tokens; else a ValueError naming the mismatch."""
    from transformers import AutoConfig, AutoTokenizer

    from models.factories import check_model_available
    from pipeline.rm_kinds import rm_entry
    from pipeline.rm_kinds.heads import StepReader
    from pipeline.rm_kinds.loading import kind_name, reward_model_kind, reward_model_layout

    rm, spec = cfg.reward_model, cfg.reward_model.init
    path, _ = check_model_available(spec, "reward_model.init")
    try:
        kind = reward_model_kind(path)
    except ValueError:  # a causal LM, as a published label-token PRM is
        kind = None
    if kind is not None and not rm_entry(kind).layouts:
        raise ValueError(f"reward_model.init: {spec} is {kind_name(kind)}, not a PRM (a kind that scores steps)")
    recorded = reward_model_layout(path) if Path(path).is_dir() else None
    if recorded is None:
        _architecture_fits(spec, AutoConfig.from_pretrained(path), asked.head)
    else:
        given = {"head": rm.head, "step_tag": rm.step_tag, "label_tokens": tuple(rm.label_tokens or ()) or None}
        wrong = [f"{k} {v!r} (its igrpo.json: {getattr(recorded, k)!r})" for k, v in given.items()
                 if (v is not None or k == "head") and v != getattr(recorded, k)]
        if wrong:
            raise ValueError(f"reward_model.init: {spec} has another layout: {', '.join(wrong)}; set "
                             f"reward_model.head: {recorded.head} (and drop step_tag / label_tokens), or give a PRM "
                             "of the layout asked for")
    try:
        StepReader.build(recorded or asked, AutoTokenizer.from_pretrained(path))
    except ValueError as e:
        raise ValueError(f"reward_model.init: {spec}: {e}") from None
    return recorded or asked


def _architecture_fits(spec: str, config, head: str) -> None:
    """A checkpoint with no recorded layout (a published PRM) must be the model of `head`: a causal LM for label
    tokens, token classification with the head's classes otherwise."""
    from models.factories import _CAUSAL_LM
    from pipeline.rm_kinds import prm_head

    labels = prm_head(head).num_labels
    arch = (config.architectures or ["no architecture"])[0]
    if labels is None:
        fits, need = arch.endswith(_CAUSAL_LM), "a causal LM"
    else:
        fits = arch.endswith("ForTokenClassification") and config.num_labels == labels
        need = f"token classification with {labels} label{'s' * (labels > 1)}"
    if not fits:
        held = arch if arch.endswith(_CAUSAL_LM) else f"{arch} with {config.num_labels} labels"
        raise ValueError(f"reward_model.init: {spec} holds a {held}, but head {head!r} needs {need}: set "
                         "reward_model.head to the checkpoint's layout")


def _prompts(cfg: PipelineConfig) -> str:
    from pipeline.prompts import check_prompt_format

    try:
        problem = problem_set_from_config(cfg).train[0]
    except Exception:  # the problems check reports it
        return "not checked: the problem set does not load"
    try:
        _policy_model(cfg)
    except Exception:  # the policy.model check reports it
        return "not checked: the policy does not load"
    return f"prompt format {check_prompt_format(cfg, problem)}"


# GRPOTrainer's own keyword arguments, which a probe before any training cannot give a reward function.
_TRL_ONLY_KWARGS = {"completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}


def _rewards(cfg: PipelineConfig) -> str:
    """Call each GRPO reward function that needs no trained RM on the gold solutions of a few training problems,
    as GRPO will (the dataset's columns as keyword arguments; the prompt as plain text), so that one which
    raises or returns NaN, a string or the wrong count fails now, as `checked`'s RewardError, not after round 0."""
    from pipeline.rewards import REWARD_FUNCS, RewardError, active_rewards, build_reward_func

    try:
        problem_set = problem_set_from_config(cfg)
    except Exception:  # the problems check reports it
        return "not checked: the problem set does not load"
    problems = problem_set.train[:8]
    names = [n for n in active_rewards(cfg.supervision.mode, cfg.supervision.rewards)
             if REWARD_FUNCS[n].reward_model is None]
    columns = {"prompts": [p.prompt for p in problems], "prompt": [p.prompt for p in problems],
               "prompt_text": [p.prompt for p in problems], "answer": [p.answer for p in problems],
               "prompt_id": [p.id for p in problems], "solution": [p.solution for p in problems]}
    probed = []
    for name in names:
        try:
            build_reward_func(name, problem_set, {})([p.solution for p in problems], **columns)
        except RewardError as e:
            if isinstance(e.__cause__, KeyError) and e.__cause__.args and e.__cause__.args[0] in _TRL_ONLY_KWARGS:
                continue  # it reads what only GRPO gives: GRPO's own call checks it
            raise RewardError(f"supervision.rewards: {e} (probed on the gold solutions of {len(problems)} "
                              "training problems before any work)") from e
        probed.append(name)
    return f"{', '.join(probed) or 'none'} probed on {len(problems)} gold solutions"


def _launcher(cfg: PipelineConfig) -> str:
    entry = LAUNCHERS[cfg.launcher.kind]
    if not entry.in_process:
        from pipeline.launch import check_launchable

        check_launchable(cfg.launcher)
    return entry.summary(cfg.launcher)


def _runs_dir_is_a_folder(cfg: PipelineConfig) -> None:
    """A RunDirError naming `run.runs_dir` where it, or a folder above it, is a file: the run could not start."""
    for path in (cfg.run_dir, *cfg.run_dir.parents):
        if path.exists() and not path.is_dir():
            raise RunDirError(f"run.runs_dir: {str(Path(cfg.run.runs_dir))!r} cannot hold run directories: "
                              f"{str(path)!r} is a file, not a folder")


def _run_directory(cfg: PipelineConfig) -> str:
    """What `igrpo run` would do with the run directory; a RunDirError where it would refuse."""
    _runs_dir_is_a_folder(cfg)
    refuse_if_locked(cfg.run_dir)
    try:
        manifest = Manifest.load(cfg.run_dir)
    except FileNotFoundError:
        return f"{cfg.run_dir}: new (will be created)"
    refuse_changed_dtype(manifest, cfg)
    refuse_changed_config(manifest, cfg)
    return f"{cfg.run_dir}: resumes it ({len(manifest.data['phases'])} phases done)"


def _recorded_outputs(cfg: PipelineConfig) -> str:
    """Each output a resumed run's manifest records, opened far enough to know it is whole (a checkpoint's config,
    weight headers and tokenizer; a shard's parquet footer; a JSON that parses), so that a damaged file is one
    error naming it before any work, not a traceback in the phase that reads it hours later."""
    try:
        _runs_dir_is_a_folder(cfg)
    except RunDirError:  # the run directory check reports it
        return "not checked: run.runs_dir is not a folder"
    try:
        manifest = Manifest.load(cfg.run_dir)  # a damaged manifest: its own RunDirError
    except FileNotFoundError:
        return "none (a new run)"
    outputs = manifest.outputs()
    for key, path in outputs:
        damage = _damage(path)
        if damage:
            raise RunDirError(f"{path}: recorded as the output of {key}, but {damage}. Restore it, or redo that "
                              f"phase and the phases after it: `igrpo run CONFIG --redo {key}`")
    return f"{len(outputs)} recorded outputs whole"


def _damage(path: Path) -> str | None:
    """What is wrong with a recorded output, or None when it reads."""
    if not path.exists():
        return "it is missing"
    try:
        if path.is_dir():
            from models.factories import check_checkpoint

            check_checkpoint(str(path))
        elif path.suffix == ".parquet":
            import pyarrow.parquet as pq

            pq.read_metadata(path)
        elif path.suffix == ".json":
            read_json(path)
    except Exception as e:  # each reader's own error, kept in one line
        return f"it does not read ({' '.join(f'{type(e).__name__}: {e}'.split())[:300]})"
    return None


def refuse_changed_config(manifest: Manifest, cfg: PipelineConfig) -> None:
    """A RunDirError listing the differing keys when the run directory was started with another config."""
    diff = resumed_config_diff(manifest.data["config"], cfg)
    if diff:
        raise RunDirError(
            f"{cfg.run_dir} was started with another config; differing keys:\n  " + "\n  ".join(diff)
            + "\nUse another run.name, or --force to continue with the new config"
        )


def refuse_changed_dtype(manifest: Manifest, cfg: PipelineConfig) -> None:
    """A RunDirError of one sentence where `cfg` resolves, on this machine, to other dtypes than the run ran in (an
    `auto` on a machine with or without bf16, or another setting)."""
    settings = {"policy": cfg.policy.dtype, "reward_model": cfg.reward_model.dtype}
    sentence = dtype_change(str(cfg.run_dir), manifest.dtypes, run_dtypes(cfg), settings)
    if sentence:
        raise RunDirError(sentence)


def _dtypes(cfg: PipelineConfig) -> str:
    """The dtypes the run would run in here (`pipeline.dtypes`)."""
    got = run_dtypes(cfg)
    return f"policy {got['policy']} ({cfg.policy.dtype}), reward models {got['reward_model']} ({cfg.reward_model.dtype})"


# The checks of the config's inputs, by what they check; each returns what it found, in a few words.
CHECKS = {
    "extras": check_extras,
    "problems": _problems,
    "policy.model": _policy_model,
    "reward_model.model": _reward_model_backbone,
    "reward_model.head": _prm_layout,
    "problems.prompt_format": _prompts,
    "supervision.rewards": _rewards,
    "launcher": _launcher,
    "dtype": _dtypes,
    "recorded outputs": _recorded_outputs,
}


def preflight(cfg: PipelineConfig) -> None:
    """What can be checked before any work: the problem set loads, the policy's and the RMs' model specs resolve
    and their checkpoints are whole, the prompt format suits its tokenizer, the reward functions that need no RM
    score gold solutions, MLflow answers.

    Raises the loader's own clear error (naming the file, row, path or URI); writes nothing in the run dir.
    """
    _runs_dir_is_a_folder(cfg)
    for check in CHECKS.values():
        check(cfg)
    tracking.connect(cfg.tracking.tracking_uri, cfg.tracking.experiment)


def check_run(cfg: PipelineConfig) -> tuple[dict[str, str], list[str]]:
    """`igrpo check`: the preflight, creating nothing (MLflow's store is probed, not opened), and the run directory.

    Every check runs, so all problems show at once. Returns (what each check found, the errors).
    """
    checks = {**CHECKS, "tracking": lambda c: tracking.probe(c.tracking.tracking_uri, c.tracking.experiment),
              "run directory": _run_directory}
    found, errors = {}, []
    for name, check in checks.items():
        try:
            found[name] = check(cfg)
        except (ValueError, OSError, RuntimeError) as e:  # the loaders' and checks' own errors, one line each
            errors.append(str(e))
    return found, errors
