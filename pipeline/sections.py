"""The base of every config section, and the sections that several others hold (LoRA): a module of its own so the
tables that declare sections (`pipeline.modes`, `pipeline.rm_kinds`) and `pipeline.config` share them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    # allow_inf_nan: a weight, rate or temperature of inf or NaN is a typo, never a setting.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class LoraSection(Section):
    r: int = Field(16, ge=1, description="LoRA rank.")
    alpha: int = Field(32, ge=1, description="LoRA alpha.")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    target_modules: list[str] | str = Field("all-linear", description="Modules to adapt (peft syntax).")
