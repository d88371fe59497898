"""`policy.dtype` and `reward_model.dtype` (pipeline/dtypes.py): what `auto` resolves to on each kind of machine, bf16
against float32 on the tiny models within a stated tolerance, the trainers' autocast, the run's record of its dtype
(manifest and MLflow) and the refused resume under another dtype."""

from __future__ import annotations

import pytest
import torch

import pipeline.dtypes
from models import load_policy
from pipeline.config import ConfigError
from pipeline.dtypes import read_cpu_flags, resolve_dtype, run_dtypes
from pipeline.loading import config_from_dict
from pipeline.rundir import Manifest, RunDirError
from tests.helpers import mini_config

# /proc/cpuinfo flags of the machines the worked cases are about (abridged).
SAPPHIRE_RAPIDS = {"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}  # this project's CI machine
COOPER_LAKE = {"avx2", "fma", "avx512f", "avx512_bf16"}  # AVX512-BF16, no AMX (Zen 4 too)
SKYLAKE = {"avx2", "fma", "avx512f"}  # AVX-512 without its bf16 instructions: bf16 is emulated
HASWELL = {"avx2", "fma"}  # AVX2 only


@pytest.mark.parametrize("flags, cuda_bf16, expected", [
    (SAPPHIRE_RAPIDS, None, "bfloat16"),  # AMX: oneDNN's bf16 matmuls run on the tiles
    (COOPER_LAKE, None, "bfloat16"),      # AVX512-BF16's dot products
    (SKYLAKE, None, "float32"),           # bf16 converted to float32 and back around every op: slower
    (HASWELL, None, "float32"),
    (HASWELL, True, "bfloat16"),          # an A100/H100 under an old CPU: the GPU computes, it has bf16
    (SAPPHIRE_RAPIDS, False, "float32"),  # a V100/T4 under an AMX CPU: the GPU computes, it has no bf16
])
def test_auto_is_bf16_exactly_where_the_hardware_computes_it(flags, cuda_bf16, expected):
    assert resolve_dtype("auto", flags, cuda_bf16) == expected


def test_an_explicit_dtype_is_taken_as_asked_on_any_machine():
    for flags, cuda in ((HASWELL, None), (SAPPHIRE_RAPIDS, None), (HASWELL, True), (HASWELL, False)):
        assert resolve_dtype("float32", flags, cuda) == "float32"
        assert resolve_dtype("bfloat16", flags, cuda) == "bfloat16"  # slow on Haswell, but asked for
    with pytest.raises(ValueError, match="unknown dtype 'fp16'"):
        resolve_dtype("fp16", SAPPHIRE_RAPIDS, None)


def test_cpu_flags_read_from_cpuinfo_text():
    text = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu avx2 avx512_bf16 amx_bf16\n\nprocessor\t: 1\n"
    assert read_cpu_flags(text) == {"fpu", "avx2", "avx512_bf16", "amx_bf16"}
    assert read_cpu_flags("Processor\t: AArch64\nFeatures\t: fp asimd\n") == frozenset()  # no x86 flags: float32


@pytest.mark.parametrize("section", ["policy", "reward_model"])
def test_a_bad_dtype_names_its_field(section):
    with pytest.raises(ConfigError, match=rf"^{section}\.dtype: Input should be 'auto', 'float32' or 'bfloat16'"):
        config_from_dict({section: {"dtype": "fp16"}}, check_trl=False)


def test_float32_is_the_default_and_the_trainers_autocast_where_bf16(monkeypatch, tmp_path):
    from pipeline.passthrough import grpo_config, rm_training_config, sft_config

    monkeypatch.setattr(pipeline.dtypes, "cpu_flags", lambda: frozenset(SAPPHIRE_RAPIDS))
    default = config_from_dict({}, check_trl=False)
    assert (default.policy.dtype, default.reward_model.dtype) == ("float32", "float32")
    assert not grpo_config(default, str(tmp_path)).bf16 and not sft_config(default, str(tmp_path)).bf16
    auto = config_from_dict({"policy": {"dtype": "auto"}}, check_trl=False)
    # bf16=True: the weights stay float32 (the optimizer's master copy); the forward runs under bf16 autocast.
    assert grpo_config(auto, str(tmp_path)).bf16 and sft_config(auto, str(tmp_path)).bf16
    assert not rm_training_config(auto, str(tmp_path)).bf16  # reward_model.dtype is its own: float32 here
    rms = config_from_dict({"reward_model": {"dtype": "bfloat16"}}, check_trl=False)
    assert rm_training_config(rms, str(tmp_path)).bf16 and not grpo_config(rms, str(tmp_path)).bf16
    monkeypatch.setattr(pipeline.dtypes, "cpu_flags", lambda: frozenset(HASWELL))
    assert not grpo_config(auto, str(tmp_path)).bf16  # auto on an AVX2 CPU: float32


def _logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float()  # (B, T, V)
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]  # (B, T-1): each next token's


def test_bf16_log_probs_match_float32_within_tolerance(tiny_policy_dir):
    fp32, tok = load_policy(str(tiny_policy_dir))
    bf16, _ = load_policy(str(tiny_policy_dir), torch.bfloat16)
    assert next(bf16.parameters()).dtype == torch.bfloat16
    ids = torch.tensor([tok("7 +5 *3 -4\n7+5=12\n12*3=36\n").input_ids, tok("9 -2 *2 +1\n9-2=7\n7*2=14\n14").input_ids])
    a, b = _logprobs(fp32, ids), _logprobs(bf16, ids)
    # bf16 keeps 8 bits of mantissa (a relative error of 2^-9 ~ 2e-3 a rounding); through 2 layers and a softmax
    # over ~30 tokens the log-probs move by ~1e-2 at most (measured 8e-3 at worst, 1.4e-3 on average): 3e-2 and 5e-3.
    assert (a - b).abs().max().item() < 3e-2
    assert (a - b).abs().mean().item() < 5e-3
    assert not torch.equal(a, b)  # bf16 did run


def test_bf16_prm_scores_match_float32_within_tolerance(tiny_dirs):
    from pipeline.reward_model import load_scorer

    prompts, completions = ["7 +5 *3 -4\n"] * 2, ["7+5=12\n12*3=36\n36-4=32\nAnswer: 32", "7+5=11\n11*3=33\n"]
    scores = {}
    for dtype in ("float32", "bfloat16"):
        rm = config_from_dict({"reward_model": {"dtype": dtype}}, check_trl=False).reward_model
        scorer = load_scorer("prm", tiny_dirs / "prm", rm)
        assert next(scorer.model.parameters()).dtype == getattr(torch, dtype)
        scores[dtype] = torch.tensor([s for row in scorer.step_scores(prompts, completions) for s in row])
    # Step scores are sigmoids of one logit: |d sigmoid| <= |d logit| / 4, and the logit moves by ~1e-2 in bf16.
    assert torch.allclose(scores["bfloat16"], scores["float32"], atol=1e-2, rtol=0)


def test_same_dtype_and_seed_give_the_same_samples(tiny_policy_dir):
    from pipeline.generation import load_sampling_model, sample

    model, tok = load_sampling_model(str(tiny_policy_dir), dtype="bfloat16")
    runs = [sample(model, tok, ["7 +5\n", "3 *4\n"], 2, max_new_tokens=8, seed=3) for _ in range(2)]
    assert runs[0].ids == runs[1].ids and runs[0].texts == runs[1].texts


def test_the_run_records_its_dtype_in_the_manifest_and_mlflow(tmp_path, mlflow_tmp, monkeypatch):
    from mlflow import MlflowClient

    from pipeline.rounds import open_run

    monkeypatch.setattr(pipeline.dtypes, "cpu_flags", lambda: frozenset(SAPPHIRE_RAPIDS))
    cfg = config_from_dict(mini_config(tmp_path, policy={"dtype": "auto"}, tracking={"tracking_uri": mlflow_tmp}),
                           check_trl=False)
    manifest = open_run(cfg)
    assert Manifest.load(cfg.run_dir).dtypes == {"policy": "bfloat16", "reward_model": "float32"} == run_dtypes(cfg)
    params = MlflowClient().get_run(manifest.data["mlflow"]["parent"]).data.params
    assert (params["igrpo.dtype"], params["igrpo.reward_model.dtype"]) == ("bfloat16", "float32")
    assert params["policy.dtype"] == "auto"  # the setting, beside what it resolved to


def test_a_resume_in_another_dtype_is_refused_in_one_sentence(tmp_path, mlflow_tmp, monkeypatch):
    from pipeline.rounds import open_run

    monkeypatch.setattr(pipeline.dtypes, "cpu_flags", lambda: frozenset(SAPPHIRE_RAPIDS))
    data = mini_config(tmp_path, policy={"dtype": "auto"}, tracking={"tracking_uri": mlflow_tmp})
    open_run(config_from_dict(data, check_trl=False))
    open_run(config_from_dict(data, check_trl=False))  # the same machine: resumes
    # The run directory taken to an AVX2-only machine: `auto` is float32 there.
    monkeypatch.setattr(pipeline.dtypes, "cpu_flags", lambda: frozenset(HASWELL))
    with pytest.raises(RunDirError) as e:
        open_run(config_from_dict(data, check_trl=False))
    run_dir = tmp_path / "runs" / data["run"]["name"]
    assert str(e.value) == (f"{run_dir} ran in bfloat16 and policy.dtype 'auto' is float32 on this machine: set "
                            "policy.dtype: bfloat16 to resume it as it ran, or use another run.name")
    # Back on the first machine, another setting: refused too, by the same sentence, before the config's diff.
    monkeypatch.setattr(pipeline.dtypes, "cpu_flags", lambda: frozenset(SAPPHIRE_RAPIDS))
    with pytest.raises(RunDirError, match=r"ran in bfloat16 and policy.dtype 'float32' is float32: set policy.dtype: "
                                          r"bfloat16 to resume it as it ran, or use another run.name$"):
        open_run(config_from_dict(data, ["policy.dtype=float32"], check_trl=False))


def test_a_run_from_before_dtypes_ran_in_float32(tmp_path, mlflow_tmp):
    from pipeline.preflight import refuse_changed_dtype

    cfg = config_from_dict(mini_config(tmp_path, tracking={"tracking_uri": mlflow_tmp}), check_trl=False)
    old = Manifest(cfg.run_dir, {"config": cfg.model_dump(mode="json"), "phases": {}, "mlflow": {}})  # no "dtype"
    refuse_changed_dtype(old, cfg)  # float32 then and now
    with pytest.raises(RunDirError, match=r"ran in float32 and policy.dtype 'bfloat16' is bfloat16: set policy"):
        refuse_changed_dtype(old, config_from_dict(mini_config(tmp_path, policy={"dtype": "bfloat16"}),
                                                   check_trl=False))


def test_bf16_sft_keeps_float32_weights_and_trains_them(tmp_path):
    from datasets import Dataset
    from trl import SFTTrainer

    from models import char_tokenizer, tiny_policy
    from pipeline.passthrough import sft_config
    from tests.helpers import SIZES

    cfg = config_from_dict({"policy": {"dtype": "bfloat16"}, "bootstrap": {"sft_args": {"max_steps": 2}}},
                           check_trl=False)
    tok = char_tokenizer()
    model = tiny_policy(tok, **SIZES["tiny"])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    data = Dataset.from_list([{"prompt": "7 +5\n", "completion": "7+5=12\nAnswer: 12"}] * 8)
    trainer = SFTTrainer(model=model, args=sft_config(cfg, str(tmp_path)), train_dataset=data, processing_class=tok)
    assert trainer.accelerator.mixed_precision == "bf16"  # its forward under bf16 autocast, on the CPU
    trainer.train()
    after = trainer.model.state_dict()
    assert all(v.dtype == torch.float32 for v in after.values())  # master weights: float32
    assert any(not torch.equal(before[k], after[k]) for k in before)  # and trained


def test_round_noise_samples_in_the_runs_dtype(tmp_path, tiny_policy_dir, monkeypatch):
    """experiments/round_noise.py evaluates in the run's `policy.dtype`, as its eval phase did (it sampled in float32
    whatever the run's dtype, so a bf16 run's rounds were compared in another precision than they were evaluated)."""
    from experiments import round_noise
    from pipeline.loading import config_from_dict
    from pipeline.problems import problem_set_from_config
    from tests.helpers import mini_config

    data = mini_config(tmp_path)
    data["policy"]["dtype"] = "bfloat16"
    data["eval"].update(samples_per_problem=2, best_of_n=[2], max_new_tokens=4)
    cfg = config_from_dict(data)
    ps = problem_set_from_config(cfg)
    loaded = []
    real = round_noise.open_sampler

    def recording(path, c, fanout=None, dtype="float32"):  # the real sampler, its dtype noted
        loaded.append(dtype)
        return real(path, c, fanout, dtype)

    monkeypatch.setattr(round_noise, "open_sampler", recording)
    values = round_noise.per_problem(cfg, ps, ps.test[:2], tiny_policy_dir, seed=0)
    assert loaded == ["bfloat16"] and len(values["pass@1"]) == 2


def test_a_lora_base_trains_in_bf16_only_where_the_setting_resolves_to_it(tmp_path, monkeypatch):
    """With a LoRA adapter the frozen base is loaded in bf16 under `auto` on a bf16 CPU (TRL's GRPO load and the SFT's
    alike); every weight that trains stays float32, and so does a run without an adapter or on an AVX2 CPU."""
    from pipeline.dtypes import lora_base_dtype
    from pipeline.passthrough import grpo_config

    monkeypatch.setattr(pipeline.dtypes, "cpu_flags", lambda: frozenset(SAPPHIRE_RAPIDS))
    lora = {"lora": {"r": 4, "alpha": 8}}
    auto = config_from_dict({"policy": {"dtype": "auto", **lora}}, check_trl=False)
    assert grpo_config(auto, str(tmp_path)).model_init_kwargs == {"dtype": "bfloat16"}
    assert lora_base_dtype("auto", lora=True) == torch.bfloat16 and lora_base_dtype("auto", lora=False) == torch.float32
    full = config_from_dict({"policy": {"dtype": "auto"}}, check_trl=False)
    assert grpo_config(full, str(tmp_path)).model_init_kwargs == {"dtype": "float32"}
    monkeypatch.setattr(pipeline.dtypes, "cpu_flags", lambda: frozenset(HASWELL))
    assert grpo_config(auto, str(tmp_path)).model_init_kwargs == {"dtype": "float32"}


def test_a_bf16_base_keeps_its_adapters_update_when_merged(tmp_path, tiny_policy_dir):
    """An adapter's update far under bf16's resolution of the weights it adds to survives the merge on save: the
    checkpoint holds the bf16 base plus the update in float32 (merged in bf16, the update rounded away)."""
    from models import apply_lora, save_model

    model, tok = load_policy(str(tiny_policy_dir), torch.bfloat16)
    model = apply_lora(model, 4, 4, 0.0, ["q_proj"], "CAUSAL_LM")
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert layer.lora_A["default"].weight.dtype == torch.float32  # the adapter trains in float32
    with torch.no_grad():
        layer.lora_A["default"].weight.fill_(1e-3)
        layer.lora_B["default"].weight.fill_(1e-3)
    base = layer.base_layer.weight.detach().float().clone()
    update = (layer.lora_B["default"].weight @ layer.lora_A["default"].weight).detach()  # 4 * 1e-6 a weight, scale 1
    save_model(model, tok, tmp_path / "merged")
    merged, _ = load_policy(str(tmp_path / "merged"))
    got = merged.model.layers[0].self_attn.q_proj.weight.detach()
    assert torch.allclose(got, base + update, rtol=0, atol=1e-9)
    assert not torch.equal(got, base)
