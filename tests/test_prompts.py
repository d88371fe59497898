"""Prompt formats: the text the policy is conditioned on is one text, in GRPO (TRL), collection, evaluation and the RMs.

`problems.prompt_format: chat` gives TRL and everything else `PromptRenderer.render`'s text; these tests
check that it is the template's rendering and that GRPO generates after the same tokens as collection, on
SmolLM2's real tokenizer and on the tiny policy with a chat template of its own (with a tokenizer that adds
a BOS the template does not render too), and that the plain format (the quickstart) is the prompt as it is.
"""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, processors
from transformers import PreTrainedTokenizerFast
from trl.data_utils import maybe_apply_chat_template

from models import char_tokenizer, save_model, tiny_policy
from models.factories import load_tokenizer
from models.tokenizer import DEFAULT_ALPHABET
from pipeline.loading import config_from_dict
from pipeline.passthrough import grpo_config
from pipeline.grpo_trainer import ProcessGRPOTrainer, prompt_texts
from pipeline.policy import round_prompts
from pipeline.problems import GSM8K, EmbeddedArithmetic, Problem
from pipeline.problems.gsm8k import problem_from_row
from pipeline.prompts import PromptRenderer, renderer_from_config
from pipeline.rewards import checked, verifier_reward
from pipeline.rm_kinds.loading import reward_model_from_policy
from pipeline.scorers import PrmScorer
from tests.helpers import mini_config
from tests.tokenizer_cases import smollm2_tokenizer

GSM8K_LIKE = [
    problem_from_row({"question": q, "answer": a}, "inline", f"q{i}")
    for i, (q, a) in enumerate([
        ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
         "How many clips did Natalia sell altogether in April and May?", "48/2 = 24 in May.\n48+24 = 72.\n#### 72"),
        ("Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
         "How much did she earn?", "12/60 = 0.2 per minute.\n0.2 x 50 = 10.\n#### 10"),
    ])
]
# A chat template in the char tokenizer's alphabet, for the tiny policy.
TINY_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:\n{% endif %}")


@pytest.fixture(scope="module")
def smollm2():
    # The GGUF's tokenizer, with SmolLM2-Instruct's chat template: the one copy the suite loads (6 s a load).
    return smollm2_tokenizer()


def chat_char_tokenizer(adds_bos: bool = False):
    """The char tokenizer with TINY_TEMPLATE; `adds_bos`: it also puts a <s> in front of any text, a BOS the
    template does not render (TinyLlama-Chat's and Zephyr's layout)."""
    tok = char_tokenizer()
    tok.chat_template = TINY_TEMPLATE
    if adds_bos:
        tok.add_special_tokens({"bos_token": "<s>"})
        tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)])
    return tok


def conversation_ids(tokenizer, messages) -> list[int]:
    """The ids TRL's GRPOTrainer would generate after for a conversational prompt (the template alone)."""
    return tokenizer.apply_chat_template(conversation=[messages], add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"][0]


def test_smollm2_chat_prompt_is_the_text_and_tokens_trl_conditions_on(smollm2):
    renderer = PromptRenderer(smollm2)  # unset: SmolLM2 has a chat template, so chat
    assert renderer.format == "chat"
    for p in GSM8K_LIKE:
        text = renderer.render(p)
        assert text.endswith("<|im_start|>assistant\n")  # the generation prompt: the assistant's turn is open
        assert "Question: " + p.prompt.split("Question: ")[1].strip() in text
        # TRL's own rendering of the conversation, and (SmolLM2 adds no special tokens) its ids.
        assert maybe_apply_chat_template({"prompt": renderer.messages(p)}, smollm2)["prompt"] == text
        assert smollm2(text)["input_ids"] == conversation_ids(smollm2, renderer.messages(p))
    # GRPO's dataset: the rendered text, as TRL's `prompt` and as the `prompt_text` the ORM and PRM read.
    rows = round_prompts(GSM8K(GSM8K_LIKE, []), 2, 0, 1, renderer=renderer)
    for row in rows:
        assert row["prompt"] == row["prompt_text"] in {renderer.render(p) for p in GSM8K_LIKE}


def test_smollm2_system_prompt_replaces_the_templates_default(smollm2):
    default = PromptRenderer(smollm2, "chat").render(GSM8K_LIKE[0])
    custom = PromptRenderer(smollm2, "chat", system_prompt="You are a careful math tutor.").render(GSM8K_LIKE[0])
    assert "You are a helpful AI assistant named SmolLM" in default  # SmolLM2's template adds its own
    assert custom.startswith("<|im_start|>system\nYou are a careful math tutor.<|im_end|>\n")
    assert "SmolLM" not in custom


def test_smollm2_plain_format_is_the_prompt_as_it_is(smollm2):
    renderer = PromptRenderer(smollm2, "plain")
    assert [renderer.render(p) for p in GSM8K_LIKE] == [p.prompt for p in GSM8K_LIKE]
    rows = round_prompts(GSM8K(GSM8K_LIKE, []), 2, 0, 1, renderer=renderer)
    assert set(rows["prompt"]) == set(rows["prompt_text"]) == {p.prompt for p in GSM8K_LIKE}


def test_char_tokenizer_defaults_to_plain_prompts():
    # The quickstart's tiny policy has no chat template: its prompts stay exactly what they were.
    ps = EmbeddedArithmetic(num_train=5, num_test=5)
    renderer = PromptRenderer(char_tokenizer())
    assert renderer.format == "plain"
    assert [renderer.render(p) for p in ps.train] == [p.prompt for p in ps.train]
    rows = round_prompts(ps, 5, 0, 1, renderer=renderer)
    assert len(rows) == 5 and rows["prompt"] == rows["prompt_text"]
    assert set(rows["prompt"]) == {p.prompt for p in ps.train}


def test_chat_without_a_template_and_system_prompt_without_chat_are_errors_naming_the_field():
    with pytest.raises(ValueError, match=r"problems.prompt_format: chat needs a tokenizer with a chat template"):
        PromptRenderer(char_tokenizer(), "chat")
    with pytest.raises(ValueError, match=r"problems.system_prompt: only chat prompts have a system message"):
        PromptRenderer(char_tokenizer(), None, system_prompt="Be brief.")


@pytest.mark.parametrize("template", ["{{ bos_token }}" + TINY_TEMPLATE, TINY_TEMPLATE], ids=["llama", "zephyr"])
def test_rendered_text_tokenizes_to_one_bos_with_a_tokenizer_that_adds_it(template):
    # The tokenizer puts <s> in front of any text. Llama's template renders a <s> too, which the text must not
    # carry as well; TinyLlama-Chat's and Zephyr's renders none, and the tokenizer's <s> is the prompt's one BOS.
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, "<s>": 3}
    for ch in DEFAULT_ALPHABET:
        vocab.setdefault(ch, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 3)])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="<eos>", pad_token="<pad>",
                                  unk_token="<unk>")
    tok.chat_template = template
    renderer = PromptRenderer(tok)
    p = Problem("a", "7 +5\n", "12", "7+5=12\nAnswer: 12")
    assert renderer.render(p) == "user: 7 +5\nassistant:\n"
    ids = tok(renderer.render(p))["input_ids"]
    assert ids[0] == 3 and ids.count(3) == 1
    assert tok.decode(ids, skip_special_tokens=True) == renderer.render(p)


class RecordingTrainer(ProcessGRPOTrainer):
    """Records the prompt ids TRL generated after, and the prompt texts the PRM scored (spies, not mocks)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.prompt_ids, self.prm_prompts = [], []
        original = self.prm_scorer.step_scores

        def spy(prompts, completions):
            self.prm_prompts.extend(prompts)
            return original(prompts, completions)

        self.prm_scorer.step_scores = spy

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        for ids, mask in zip(out["prompt_ids"], out["prompt_mask"]):
            self.prompt_ids.append(ids[mask.bool()].tolist())
        return out


@pytest.mark.parametrize("adds_bos", [False, True], ids=["template-only", "tokenizer-adds-bos"])
def test_chat_grpo_step_conditions_the_policy_and_the_prm_on_the_rendered_text(tmp_path, adds_bos):
    """One process-mode GRPO step of the tiny policy with a chat template: TRL gets the rendered text, generates
    after exactly the ids collection and evaluation sample after (with a tokenizer that adds a BOS the template
    lacks too), and the PRM and the verifier read that text and plain completions."""
    from pipeline.generation import prompt_ids

    tok = chat_char_tokenizer(adds_bos)
    save_model(tiny_policy(tok, 32, 2, 2, 64, 96, seed=0), tok, tmp_path / "policy")

    prm_model, prm_tok = reward_model_from_policy(str(tmp_path / "policy"), "prm")
    cfg = config_from_dict(mini_config(tmp_path, grpo={"max_steps": 1, "per_device_train_batch_size": 4,
                                                        "num_generations": 4, "max_completion_length": 6}),
                           check_trl=False)
    ps = EmbeddedArithmetic(num_train=4, num_test=2)
    renderer = renderer_from_config(cfg, load_tokenizer(str(tmp_path / "policy")))
    assert renderer.format == "chat"  # the template survived the save
    data = round_prompts(ps, 1, cfg.run.seed, 1, renderer=renderer)
    problem = next(p for p in ps.train if p.id == data[0]["prompt_id"])
    assert data[0]["prompt"] == renderer.render(problem)
    seen_completions = []

    def verifier(completions, **kwargs):
        seen_completions.extend(completions)
        return verifier_reward(ps)(completions, **kwargs)

    trainer = RecordingTrainer(
        model=str(tmp_path / "policy"), reward_funcs=[checked(verifier, "verifier")], processing_class=tok,
        args=grpo_config(cfg, str(tmp_path / "scratch"), reward_weights=[1.0]), train_dataset=data,
        prm_scorer=PrmScorer(prm_model, prm_tok), supervision="process",
    )
    trainer.train()
    text = data[0]["prompt_text"]
    assert text.startswith("user: ") and text.endswith("\nassistant:\n")
    assert trainer.prompt_ids and all(ids == prompt_ids(tok, text) for ids in trainer.prompt_ids)
    assert all((ids[0] == tok.bos_token_id) == adds_bos for ids in trainer.prompt_ids)
    assert trainer.prm_prompts and set(trainer.prm_prompts) == {text}
    assert seen_completions and all(isinstance(c, str) for c in seen_completions)  # not TRL's message lists


@pytest.mark.slow  # a collection phase
def test_collected_shard_holds_the_rendered_prompt_and_rollouts_continue_it(tmp_path, monkeypatch):
    """Collection with a chat-template policy: samples and MC rollouts are generated after the rendered text,
    and the shard's `prompt` column (what the RMs train and score on) holds it."""
    import pipeline.fanout as fanout
    from pipeline.collect import run_collection_phase
    from pipeline.problems import problem_set_from_config
    from pipeline.replay import read_shard

    tok = chat_char_tokenizer()
    save_model(tiny_policy(tok, 32, 2, 2, 64, 96, seed=0), tok, tmp_path / "policy")
    cfg = config_from_dict(mini_config(tmp_path, collect={"prompts_per_round": 3, "samples_per_prompt": 2,
                                                          "rollouts_per_step": 1, "max_new_tokens": 12}),
                           check_trl=False)
    ps = problem_set_from_config(cfg)
    inputs: list[str] = []
    real_sample = fanout.sample

    def spy(model, tokenizer, prompts, n, **kwargs):
        inputs.extend(prompts)
        return real_sample(model, tokenizer, prompts, n, **kwargs)

    monkeypatch.setattr(fanout, "sample", spy)
    torch.manual_seed(0)
    res = run_collection_phase(cfg, ps, tmp_path / "policy", cfg.run_dir, 0)
    rows = read_shard(res.shard_path)
    renderer = PromptRenderer(tok)
    by_id = {p.id: p for p in ps.train}
    assert rows and all(r["prompt"] == renderer.render(by_id[r["prompt_id"]]) for r in rows)
    rendered = {r["prompt"] for r in rows}
    assert all(r["prompt"].startswith("user: ") and r["prompt"].endswith("assistant:\n") for r in rows)
    # Every generation call (the samples as text, then the rollouts from the policy's own ids of prompt and
    # step prefix) starts with a rendered prompt.
    texts = [t if isinstance(t, str) else tok.decode(list(t.prompt_ids) + list(t.completion_ids)) for t in inputs]
    assert len(texts) > len(rendered) and all(any(t.startswith(q) for q in rendered) for t in texts)
    assert any(not isinstance(t, str) for t in inputs)  # the rollouts did run


def test_a_dataset_without_prompt_text_is_read_as_trl_renders_it():
    # A user's own dataset for ProcessGRPOTrainer (no `prompt_text` column): the PRM reads the plain prompt,
    # or TRL's rendering of a conversation.
    tok = chat_char_tokenizer()
    messages = [{"role": "user", "content": "7 +5"}]
    inputs = [{"prompt": messages}, {"prompt": "7 +5\n"}, {"prompt": messages, "prompt_text": "given"}]
    assert prompt_texts(inputs, tok) == ["user: 7 +5\nassistant:\n", "7 +5\n", "given"]


def test_chat_sft_bootstrap_trains_after_the_rendered_prompt(tmp_path, monkeypatch):
    """The round-0 SFT of a chat-template policy: each example is the rendered prompt, then the gold solution
    (the part trained on), so the bootstrapped policy learns to answer after what collection and GRPO show it."""
    import trl

    from pipeline.bootstrap import run_bootstrap
    from pipeline.problems import problem_set_from_config

    tok = chat_char_tokenizer()
    save_model(tiny_policy(tok, 32, 2, 2, 64, 128, seed=0), tok, tmp_path / "policy")
    cfg = config_from_dict(mini_config(tmp_path, policy={"model": str(tmp_path / "policy")},
                                       problems={"arithmetic": {"num_train": 8, "num_test": 2}},
                                       bootstrap={"sft_args": {"max_steps": 1, "per_device_train_batch_size": 8}}),
                           check_trl=False)
    seen = {}

    class RecordingSFT(trl.SFTTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen["data"] = self.train_dataset

    monkeypatch.setattr(trl, "SFTTrainer", RecordingSFT)
    run_bootstrap(cfg, tmp_path / "sft")
    renderer = PromptRenderer(tok)
    for row, p in zip(seen["data"], problem_set_from_config(cfg).train):
        assert row["prompt"] == renderer.render(p) and row["prompt"].startswith("user: ")
        prompt_ids = tok(renderer.render(p))["input_ids"]
        assert row["input_ids"][: len(prompt_ids)] == prompt_ids
        trained = row["labels"][len(prompt_ids):]
        assert row["labels"][: len(prompt_ids)] == [-100] * len(prompt_ids) and -100 not in trained
        assert tok.decode(trained, skip_special_tokens=True) == p.solution  # then eos
