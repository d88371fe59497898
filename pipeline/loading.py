"""Loading a run config: YAML (strict: no duplicate keys, `1e-5` read as a number), `--set` overrides, validation
into `PipelineConfig` with one error per mistake naming its dotted path, the TRL pass-through checked
(`pipeline.passthrough`), and the diff of a resumed run's stored config against today's.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pipeline.config import ConfigError, PipelineConfig
from pipeline.passthrough import check_passthrough
from pipeline.registry import load_plugins


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads `1e-5` as a string; learning rates are written that way, so read them as floats."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$|^[-+]?(?:\d+\.\d*|\.\d+)$"),
    list("-+0123456789."),
)


def _yaml(text: str) -> Any:
    """Parse YAML text with `_Loader` (a SafeLoader: no arbitrary objects); a key given twice is a ConfigError.

    PyYAML keeps the last of two equal keys without a word, so a config that sets a field twice would run
    with whichever came last: the mapping nodes are checked before they become dicts.
    """
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_duplicate_keys(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _refuse_duplicate_keys(node: yaml.Node, prefix: str = "", seen: set[int] | None = None) -> None:
    """Walk a composed YAML document; a mapping holding one key twice is a ConfigError naming it and both lines."""
    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias of a node already walked
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                line = key.start_mark.line + 1
                if key.value in first:
                    raise ConfigError(f"{prefix}{key.value}: given twice, at line {first[key.value]} and line {line} "
                                      "(YAML would silently keep the last one; remove one of them)")
                first[key.value] = line
            _refuse_duplicate_keys(value, f"{prefix}{key.value}." if isinstance(key, yaml.ScalarNode) else prefix, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicate_keys(item, f"{prefix.rstrip('.')}[{i}].", seen)



def _format_validation(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; every field: docs/config.md)"
        lines.append(f"{path}: {msg}" if path else msg)
    return "\n".join(lines)



def parse_override(item: str) -> tuple[list[str], Any]:
    """'a.b.c=value' -> (['a', 'b', 'c'], value parsed as YAML)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected dotted.key=value")
    key, raw = item.split("=", 1)
    if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", key):
        raise ConfigError(f"override {item!r}: {key!r} is not a dotted key")
    try:
        return key.split("."), _yaml(raw)
    except yaml.YAMLError as e:
        raise ConfigError(f"override {item!r}: the value is not valid YAML ({getattr(e, 'problem', None) or e}); "
                          "quote it to give a string, e.g. --set 'run.name=\"x\"'") from None


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for item in overrides:
        keys, value = parse_override(item)
        node = data
        for depth, k in enumerate(keys[:-1]):
            child = node.setdefault(k, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {'.'.join(keys[: depth + 1])} is not a section")
            node = child
        node[keys[-1]] = value
    return data


def config_from_dict(data: dict, overrides: list[str] | None = None, check_trl: bool = True) -> PipelineConfig:
    load_plugins()  # a config may name what a plugin registers (an RM kind, a mode, a problem set)
    data = apply_overrides(copy.deepcopy(data or {}), overrides or [])  # the caller's dict stays as it was
    try:
        cfg = PipelineConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_validation(e)) from None
    if check_trl:
        check_passthrough(cfg)
    return cfg


def load_config(path: str | Path, overrides: list[str] | None = None, check_trl: bool = True) -> PipelineConfig:
    """Read a YAML config, apply ``--set`` overrides, validate everything. Raises ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = _yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); save the config as UTF-8") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: malformed YAML: {e}") from None
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    if data is None:  # an empty file is more likely a mistake (a wrong path, a lost edit) than a wish for defaults
        raise ConfigError(f"{path} is empty (no sections, only blank lines or comments). To run every default on "
                          "purpose, write `{}` in it (an empty mapping), or start a section such as `run: {}`")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    try:
        return config_from_dict(data, overrides, check_trl)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def config_diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two config dicts (for refusing a changed resume)."""
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        key = f"{prefix}{k}"
        if isinstance(va, dict) and isinstance(vb, dict):
            out += config_diff(va, vb, key + ".")
        elif va != vb:
            out.append(f"{key}: {va!r} -> {vb!r}")
    return out


def resumed_config_diff(stored: dict, current: PipelineConfig) -> list[str]:
    """`config_diff` of a resumed run's stored config against `current`, the stored one read by today's model.

    So a field added since (stored without it, at its default now) or read under an old name (quietly: the user
    wrote none of it) is no change, and
    neither is more rounds (`run.rounds` raised): that extends a run, it changes nothing that was done. Nor is
    `run.runs_dir`: where the run directory lives now (moved, or spelled from another working directory), not
    how it runs. A stored config today's model refuses (a field since removed) is compared as it was stored.
    """
    try:
        stored = PipelineConfig.model_validate(stored, context={"stored": True}).model_dump(mode="json")
    except ValidationError:
        pass
    run = {**(stored.get("run") or {}), "runs_dir": current.model_dump(mode="json")["run"]["runs_dir"]}
    if isinstance(run.get("rounds"), int) and current.run.rounds >= run["rounds"]:
        run["rounds"] = current.run.rounds
    return config_diff({**stored, "run": run}, current.model_dump(mode="json"))

