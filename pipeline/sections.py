"""The base of every config section, and the sections that several others hold (LoRA): a module of its own so the
tables that declare sections (`pipeline.modes`, `pipeline.rm_kinds`) and `pipeline.config` share them."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

REPO_ROOT = Path(__file__).resolve().parents[1]


def accelerate_config_path(config_file: str) -> Path:
    """Where `launcher.config_file` points: as given (absolute, or from the working directory), else from the repo.

    The fallback lets `configs/accelerate/zero2.yaml` work from any directory with an editable install. Here, not in
    the config or the launch code, as both read it and the launchers' table (which the config imports) starts the
    launch code.
    """
    path = Path(config_file).expanduser()
    if path.is_absolute() or path.exists():
        return path
    return REPO_ROOT / path


class Section(BaseModel):
    # allow_inf_nan: a weight, rate or temperature of inf or NaN is a typo, never a setting.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class LoraSection(Section):
    r: int = Field(16, ge=1, description="LoRA rank.")
    alpha: int = Field(32, ge=1, description="LoRA alpha.")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    target_modules: list[str] | str = Field("all-linear", description="Modules to adapt (peft syntax).")
