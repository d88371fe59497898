"""Round 0's policy: SFT of a fresh tiny policy (or a given model) on the gold solutions, with TRL's SFTTrainer."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from datasets import Dataset

from models import char_tokenizer, load_policy, save_model, tiny_policy
from models.factories import apply_lora
from pipeline.dtypes import lora_base_dtype
from pipeline.config import PipelineConfig
from pipeline.passthrough import sft_config
from pipeline.problems import problem_set_from_config
from pipeline.prompts import renderer_from_config


@dataclass
class BootstrapResult:
    policy_path: Path
    metrics: dict[str, float]


def initial_policy(cfg: PipelineConfig):
    """The model round 0 starts from: a new tiny policy over the char tokenizer, or a loaded one."""
    if cfg.policy.model == "tiny":
        tokenizer = char_tokenizer()
        t = cfg.policy.tiny
        model = tiny_policy(
            tokenizer, t.hidden_size, t.num_layers, t.num_heads, t.intermediate_size,
            t.max_position_embeddings, seed=cfg.run.seed,
        )
        return model, tokenizer
    return load_policy(cfg.policy.model, lora_base_dtype(cfg.policy.dtype, cfg.policy.lora is not None))


def run_bootstrap(cfg: PipelineConfig, out_dir: str | Path, callbacks=None) -> BootstrapResult:
    """SFT the initial policy on the training problems' gold solutions and save it to `out_dir`."""
    out_dir = Path(out_dir)
    model, tokenizer = initial_policy(cfg)
    metrics: dict[str, float] = {}
    if cfg.bootstrap.sft:
        problems = problem_set_from_config(cfg)
        # prompt/completion rows: TRL trains on the completion only and appends eos to it. The prompt is the
        # rendered text (in the chat template where there is one), what collection and evaluation condition on.
        render = renderer_from_config(cfg, tokenizer).render
        data = Dataset.from_list([{"prompt": render(p), "completion": p.solution} for p in problems.train])
        if cfg.policy.lora:
            lo = cfg.policy.lora
            model = apply_lora(model, lo.r, lo.alpha, lo.dropout, lo.target_modules, "CAUSAL_LM")
        from trl import SFTTrainer

        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            trainer = SFTTrainer(
                model=model, args=sft_config(cfg, tmp), train_dataset=data,
                processing_class=tokenizer, callbacks=callbacks,
            )
            result = trainer.train()
        metrics = {"sft/train_loss": float(result.training_loss), "sft/seconds": time.perf_counter() - start}
        model = trainer.model
    save_model(model, tokenizer, out_dir)
    return BootstrapResult(out_dir, metrics)
