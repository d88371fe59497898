"""Scaling-out settings: optional engines (vLLM, Ray) are one clear error when absent, the 8-GPU recipe
loads and validates, and the GPU check script parses.

vLLM is not installed in CI; where a test needs the config to pass as if it were, `pipeline.config._installed`
is patched, which is the one place the config asks whether an extra is there.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pipeline.config import ConfigError, config_from_dict, grpo_config, load_config

ROOT = Path(__file__).resolve().parent.parent
MULTIGPU = ROOT / "configs" / "gsm8k-multigpu.yaml"


# --- optional engines: one clear error when absent --------------------------------------------------------


@pytest.mark.parametrize(
    "sections, fields",
    [
        ({"collect": {"backend": "vllm"}}, "collect.backend"),
        ({"eval": {"backend": "vllm"}}, "eval.backend"),
        ({"grpo": {"use_vllm": True, "vllm_mode": "colocate"}}, "grpo.use_vllm"),
        ({"collect": {"backend": "vllm"}, "grpo": {"use_vllm": True}}, "collect.backend, grpo.use_vllm"),
    ],
)
def test_vllm_without_the_extra_is_one_clear_error(monkeypatch, sections, fields):
    monkeypatch.setattr("pipeline.config._installed", lambda module: module != "vllm")
    with pytest.raises(ConfigError) as e:
        config_from_dict(sections)
    msg = str(e.value)
    # One line naming every field that asks for vLLM, the install command, and the setting that avoids it.
    assert msg.startswith(f"{fields}: needs the [vllm] extra") and "pip install 'iterative-grpo[vllm]'" in msg
    assert len(msg.splitlines()) == 1


def test_ray_without_the_extra_is_one_clear_error(monkeypatch):
    monkeypatch.setattr("pipeline.config._installed", lambda module: module != "prefect_ray")
    with pytest.raises(ConfigError, match=r"^collect.task_runner: needs the \[ray\] extra.*'iterative-grpo\[ray\]'"):
        config_from_dict({"collect": {"workers": 2, "task_runner": "ray"}})
    # One worker never starts a task runner, so it needs no extra.
    config_from_dict({"collect": {"workers": 1, "task_runner": "ray"}}, check_trl=False)


def test_vllm_settings_pass_when_installed_and_reach_trl(monkeypatch):
    monkeypatch.setattr("pipeline.config._installed", lambda module: True)
    cfg = config_from_dict({"collect": {"backend": "vllm", "vllm_args": {"gpu_memory_utilization": 0.5}},
                            "eval": {"backend": "vllm"}, "grpo": {"use_vllm": True, "vllm_mode": "server"}})
    assert cfg.collect.backend == cfg.eval.backend == "vllm"
    args = grpo_config(cfg, "unused")
    assert args.use_vllm is True and args.vllm_mode == "server"
    with pytest.raises(ConfigError, match="collect.backend"):
        config_from_dict({"collect": {"backend": "sglang"}})
    with pytest.raises(ConfigError, match="collect.workers"):
        config_from_dict({"collect": {"workers": 0}})


def test_default_config_needs_no_extra(monkeypatch):
    monkeypatch.setattr("pipeline.config._installed", lambda module: False)
    config_from_dict({}, check_trl=False)


# --- the 8-GPU recipe --------------------------------------------------------------------------------------


def test_multigpu_recipe_without_vllm_names_every_field(monkeypatch):
    monkeypatch.setattr("pipeline.config._installed", lambda module: module != "vllm")
    with pytest.raises(ConfigError) as e:
        load_config(MULTIGPU)
    assert str(e.value) == (
        f"{MULTIGPU}: collect.backend, eval.backend, grpo.use_vllm: needs the [vllm] extra, which is not installed: "
        "pip install 'iterative-grpo[vllm]' (or set collect.backend: hf, eval.backend: hf, grpo.use_vllm: false)"
    )


def test_multigpu_recipe_loads_and_validates(monkeypatch):
    monkeypatch.setattr("pipeline.config._installed", lambda module: True)
    cfg = load_config(MULTIGPU, check_trl=True)  # builds TRL's GRPOConfig and SFTConfig from it
    assert cfg.policy.model == "Qwen/Qwen2.5-Math-1.5B-Instruct" and cfg.problems.gsm8k.hub_name == "openai/gsm8k"
    assert cfg.launcher.kind == "accelerate" and cfg.launcher.num_processes == 8
    assert Path(cfg.launcher.config_file).name == "zero2.yaml"
    args = grpo_config(cfg, "unused")
    assert (args.use_vllm, args.vllm_mode, args.bf16, args.beta, args.learning_rate) == (True, "colocate", True, 0.04, 1e-6)
    # 8 processes x 16 per device x 8 accumulation steps = 1024 completions = 64 prompts x G per optimizer step,
    # and max_steps x 64 prompts = the prompts offered per round.
    per_step = 8 * args.per_device_train_batch_size * args.gradient_accumulation_steps
    assert per_step == 1024 and per_step % args.num_generations == 0
    assert args.max_steps * per_step // args.num_generations == cfg.supervision.prompts_per_round
    c = cfg.collect
    assert (c.backend, c.task_runner, c.workers, c.gpus_per_worker) == ("vllm", "ray", 8, 1)
    # Collection shards whole batches: at least one batch per worker.
    assert c.prompts_per_round * c.samples_per_prompt // c.batch_size >= c.workers


# --- the GPU check script ------------------------------------------------------------------------------------


def test_gpu_check_script_parses():
    script = ROOT / "bench" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
