"""What the policy is conditioned on: a problem's prompt as plain text, or in the tokenizer's chat template.

`problems.prompt_format: chat` renders the problem in the template with its generation prompt;
`PromptRenderer.render` gives that one text to every reader: TRL's GRPOTrainer (its `prompt` column), the
bootstrap's SFT, collection and its MC rollouts, evaluation, and the PRM and ORM (trained and scored on
`render(problem) + completion`, the shard's `prompt` column holding the rendered text). `plain` uses
`Problem.prompt` as it is. Unset: `chat` when the tokenizer has a chat template, `plain` otherwise (the tiny
char-level policy has none).

One text, one tokenization: every reader, TRL included, tokenizes it the usual way, `tokenizer(text)`, the
tokenizer's own special tokens added once. TRL is handed the text, not the messages: it tokenizes a
conversation with the template alone, which gives other ids wherever the tokenizer adds a BOS the template
does not render (TinyLlama-Chat, Zephyr) or an EOS, so GRPO would train on prompts that sampling never
shows. A template that renders the BOS a tokenizer adds itself (Llama, Mistral, Gemma) would give it twice,
so the rendered text leaves that leading BOS to the tokenizer.
"""

from __future__ import annotations

from typing import Any

from pipeline.problems import Problem

FIELD = "problems.prompt_format"


class PromptRenderer:
    """A problem's prompt for one tokenizer and format: its messages, its text, and what TRL's dataset holds.

    Args:
        tokenizer: the policy's tokenizer (its chat template, if any, renders `chat`).
        prompt_format: "chat", "plain", or None for the default (chat iff the tokenizer has a template).
        system_prompt: a system message before the problem (chat only).
        template_kwargs: extra arguments of `apply_chat_template`; pass GRPOConfig's `chat_template_kwargs`,
            so the text matches what TRL renders.

    Raises:
        ValueError: naming `problems.prompt_format` (chat without a template) or `problems.system_prompt`
            (a system prompt in plain format).
    """

    def __init__(self, tokenizer, prompt_format: str | None = None, system_prompt: str | None = None,
                 template_kwargs: dict[str, Any] | None = None):
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if prompt_format not in (None, "chat", "plain"):
            raise ValueError(f"{FIELD}: must be chat or plain, got {prompt_format!r}")
        if prompt_format == "chat" and not has_template:
            name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            raise ValueError(f"{FIELD}: chat needs a tokenizer with a chat template, and the policy's tokenizer "
                             f"({name}) has none: set {FIELD}: plain, or leave it unset (chat only where there is a template)")
        self.tokenizer, self.system_prompt = tokenizer, system_prompt
        self.chat = prompt_format == "chat" or (prompt_format is None and has_template)
        if system_prompt is not None and not self.chat:
            raise ValueError(f"problems.system_prompt: only chat prompts have a system message, and the prompts "
                             f"here are plain ({FIELD}: {prompt_format or 'unset, and the tokenizer has no chat template'})")
        self.template_kwargs = dict(template_kwargs or {})
        self._strip_bos = self.chat and _adds_bos(tokenizer)

    @property
    def format(self) -> str:
        return "chat" if self.chat else "plain"

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        """The conversation of a problem: an optional system message, then the problem as the user's turn."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else []
        return [*system, {"role": "user", "content": problem.prompt.strip()}]

    def render(self, problem: Problem) -> str:
        """The text the policy continues: `problem.prompt`, or the conversation in the chat template with
        the generation prompt (the assistant's turn opened)."""
        if not self.chat:
            return problem.prompt
        text = self.tokenizer.apply_chat_template(
            self.messages(problem), tokenize=False, add_generation_prompt=True, **self.template_kwargs
        )
        if self._strip_bos and text.startswith(self.tokenizer.bos_token):
            text = text[len(self.tokenizer.bos_token):]  # the tokenizer adds it back (module docstring)
        return text


def _adds_bos(tokenizer) -> bool:
    """Whether tokenizing text puts the BOS token in front by itself."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return bos is not None and tokenizer("x")["input_ids"][:1] == [bos]


def renderer_from_config(cfg, tokenizer) -> PromptRenderer:
    """The run's `PromptRenderer` for a tokenizer (GRPO's `chat_template_kwargs` included, as TRL renders with them)."""
    p = cfg.problems
    return PromptRenderer(tokenizer, p.prompt_format, p.system_prompt, cfg.grpo.get("chat_template_kwargs"))


def check_prompt_format(cfg, problem: Problem) -> str:
    """Preflight: the prompt format resolves on the round-0 policy's tokenizer and renders `problem`, and the
    tokenized prompt does not end in the EOS (a tokenizer with ``add_eos_token``, or a post-processor that
    appends it, would start every sample after an end of sequence, in GRPO as in sampling).

    Returns the resolved format.
    """
    if cfg.policy.model == "tiny":
        from models import char_tokenizer

        tokenizer = char_tokenizer()
    else:
        from models.factories import load_tokenizer

        tokenizer = load_tokenizer(cfg.policy.model)
    renderer = renderer_from_config(cfg, tokenizer)
    ids = tokenizer(renderer.render(problem)).input_ids  # a template that refuses the messages fails here
    if ids and ids[-1] == tokenizer.eos_token_id:
        raise ValueError(
            f"policy.model: its tokenizer ends every prompt with its EOS token {tokenizer.eos_token!r}, so every "
            "sample would start after an end of sequence; turn that off in the model's tokenizer files "
            '("add_eos_token": false in tokenizer_config.json, or the post-processor in tokenizer.json)')
    return renderer.format
