"""Render canonical conversations to prompt token ids and parse sampled ids back.

The proxy renders a full prompt only for the first call of a chain; later calls append
``render_continuation`` of the new messages to the earlier prompt + sampled ids, so what the
model generated is never re-encoded and the cost of a call depends on what was appended only.

How template messages are built from canonical ones: ``reasoning`` becomes ``reasoning_content``;
tool-call arguments are given to the template as a JSON object; arguments that are not a JSON
object (custom free-text tools such as Codex's ``apply_patch``) are given as ``{"input": TEXT}``,
and custom tools are offered as functions taking one string parameter ``input``. The parser does
not know tool kinds, so a custom tool's call comes back as ``{"input": ...}`` JSON;
``apply_tool_kinds`` unwraps it given the request's tools. Messages are normalised first
(``chat/normalise.py``: system messages after the first, conversations without a user query).

``enable_thinking`` is given to the template as Qwen3/3.5 templates read it: the renderer's own
setting (the run's), or a request's (``chat_template_kwargs``), None leaving the template's default.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Literal

from polar_env.chat.messages import Message, ToolCall, ToolSpec
from polar_env.chat.normalise import appended_messages, conversation_messages
from polar_env.chat.parsers import CALL_OPEN, THINK_OPEN, ParsedOutput, ToolFormat, parse_text

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
_FORMAT_TEMPLATES: dict[str, str] = {"hermes": "chatml_hermes_tools", "qwen3_coder": "qwen3_coder_tools"}
_SENTINEL = "\u2063polar-continuation-base\u2063"  # never produced by a harness
log = logging.getLogger(__name__)


def bundled_template(name: str) -> str:
    """Text of a template shipped in ``polar_env/chat/templates`` (name with or without ``.jinja``)."""
    return (TEMPLATES_DIR / f"{name.removesuffix('.jinja')}.jinja").read_text()


def infer_tool_format(chat_template: str) -> ToolFormat:
    return "qwen3_coder" if "<function=" in chat_template else "hermes"


class ChatRenderer:
    """A tokenizer plus a tools-aware ChatML template, for rendering prompts and parsing outputs."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        chat_template: str | None = None,
        tool_format: Literal["hermes", "qwen3_coder"] = "hermes",
        enable_thinking: bool | None = None,
    ):
        self.tokenizer = tokenizer
        self.tool_format: ToolFormat = tool_format
        self.enable_thinking = enable_thinking
        self.chat_template: str = (
            chat_template or tokenizer.chat_template or bundled_template(_FORMAT_TEMPLATES[tool_format])
        )
        vocab = tokenizer.get_vocab()
        # no token decodes to more characters than its vocabulary entry has (byte-level or not):
        # text of N characters takes at least N / max_token_chars tokens, known before tokenizing
        self.max_token_chars: int = max(map(len, vocab), default=1) or 1
        self.end_of_turn: str = "<|im_end|>" if "<|im_end|>" in vocab else tokenizer.eos_token
        ids = [vocab[self.end_of_turn], tokenizer.eos_token_id]
        self.eos_token_ids: list[int] = list(dict.fromkeys(i for i in ids if i is not None))
        # the Rust tokenizer's batch encode without offsets (the same ids): a quarter less CPU a call than
        # transformers' ``encode``, which every model call pays on the text it appends
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._fast_encode = getattr(backend, "encode_batch_fast", None)
        base = [Message(role="user", content="."), Message(role="assistant", content=_SENTINEL)]
        self._base = [self._message_dict(m) for m in base]
        self._opens_think = {
            flag: self._render(self._base[:1], [], add_generation_prompt=True, enable_thinking=flag)
            .rstrip()
            .endswith(THINK_OPEN)
            for flag in (None, True, False)
        }
        base_text = self._render(self._base, [], add_generation_prompt=False)
        if _SENTINEL + self.end_of_turn not in base_text:
            raise ValueError("chat template does not end an assistant turn with the end-of-turn token")
        self._glue = base_text.rsplit(_SENTINEL + self.end_of_turn, 1)[1]  # e.g. "\n"
        # Qwen3.5: every assistant turn after the last user query carries a think block, even empty
        self._always_thinks = THINK_OPEN in base_text

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        chat_template: str | None = None,
        tool_format: Literal["hermes", "qwen3_coder"] | None = None,
        enable_thinking: bool | None = None,
    ) -> ChatRenderer:
        """Load the tokenizer at ``path``; ``chat_template`` is template text, a file path or a
        bundled template name (default: the tokenizer's own template; a bundled one only where the
        directory has none, the Qwen3.5 one for a Qwen3.5 checkpoint, with a warning for any Qwen)."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path))
        template = _resolve_template(chat_template) if chat_template else tokenizer.chat_template
        if template is None:
            model_type = _model_type(Path(path))
            fmt = tool_format or ("qwen3_coder" if model_type.startswith("qwen3_5") else "hermes")
            template = bundled_template(_FORMAT_TEMPLATES[fmt])
            if model_type.startswith("qwen"):
                log.warning(
                    "%s (model_type %s) has no chat template: using polar_env's bundled %s.jinja "
                    "(%s format), not the checkpoint's own",
                    path,
                    model_type,
                    _FORMAT_TEMPLATES[fmt],
                    "Qwen3.5" if fmt == "qwen3_coder" else "Qwen3 Hermes",
                )
        return cls(
            tokenizer,
            chat_template=template,
            tool_format=tool_format or infer_tool_format(template),
            enable_thinking=enable_thinking,
        )

    # ---- rendering -------------------------------------------------------------------------

    def render_prompt(
        self, messages: list[Message], tools: list[ToolSpec], *, enable_thinking: bool | None = None
    ) -> list[int]:
        """Token ids of the whole conversation plus the assistant generation prompt."""
        return self._encode(
            self.render_text(messages, tools, add_generation_prompt=True, enable_thinking=enable_thinking)
        )

    def render_text(
        self,
        messages: list[Message],
        tools: list[ToolSpec],
        *,
        add_generation_prompt: bool,
        enable_thinking: bool | None = None,
    ) -> str:
        """The template's text of the whole (normalised) conversation."""
        return self._render(
            [self._message_dict(m) for m in conversation_messages(messages)],
            [self._tool_dict(t) for t in tools],
            add_generation_prompt=add_generation_prompt,
            enable_thinking=enable_thinking,
        )

    def render_continuation(
        self, appended: list[Message], *, previous_ended_with_eos: bool, enable_thinking: bool | None = None
    ) -> list[int]:
        """Ids that follow a sampled assistant turn: end token (only if the turn was cut), the
        template glue, the appended messages and the generation prompt.

        Renders a fixed two-message base conversation (whose assistant content is a sentinel)
        followed by ``appended``, checks that the glue after the base assistant's end token is
        what the template writes without ``appended``, and encodes only the text after that end
        token: being a special token, it splits tokenization, so these ids are exactly those of a
        full render. No history is rendered or tokenized.
        """
        full = self._render(
            self._base + [self._message_dict(m) for m in appended_messages(appended)],
            [],
            add_generation_prompt=True,
            enable_thinking=enable_thinking,
        )
        _, marker, suffix = full.partition(_SENTINEL + self.end_of_turn)
        if not marker or _SENTINEL in suffix or not suffix.startswith(self._glue):
            raise ValueError("chat template renders an assistant turn's end differently when messages follow")
        ids = self._encode(suffix)
        return ids if previous_ended_with_eos else self._encode(self.end_of_turn) + ids

    def count_tokens(self, messages: list[Message], tools: list[ToolSpec]) -> int:
        return len(self.render_prompt(messages, tools))

    def drops_thinking(self, messages: list[Message], upto: int) -> bool:
        """Whether a full render of ``messages`` differs from the stream that extends the call
        answering ``messages[:upto]``: a user query among the appended messages makes the template
        drop the think blocks of the assistant turns since the previous query (docs/proxy.md,
        "Thinking in the history"). Scans only back to that query, and only when one was appended."""
        if not any(_is_query(m) for m in messages[upto:]):
            return False
        for i in range(upto - 1, -1, -1):
            m = messages[i]
            if _is_query(m) and (i or m.role != "system"):
                return False
            if m.role == "assistant" and (
                self._always_thinks or (m.reasoning or "").strip() or "</think>" in m.content
            ):
                return True
        return False

    def opens_think(self, enable_thinking: bool | None = None) -> bool:
        """Whether the generation prompt leaves the model inside a ``<think>`` block."""
        return self._opens_think[self._thinking(enable_thinking)]

    # ---- parsing ---------------------------------------------------------------------------

    def parse_output(
        self,
        token_ids: list[int],
        *,
        prefix: str = "",
        text: str | None = None,
        enable_thinking: bool | None = None,
    ) -> ParsedOutput:
        """Parse sampled ids (a trailing end-of-turn id is dropped) continuing ``prefix`` (text the
        prompt already holds of this turn: a prefill or a forced tool call's start); ``text``: their
        text when it is not their whole decode (a reply cut at a stop string)."""
        text = self.sampled_text(token_ids) if text is None else text
        return parse_text(prefix + text, self.tool_format, started_in_think=self.opens_think(enable_thinking))

    def sampled_text(self, token_ids: list[int]) -> str:
        ids = token_ids[:-1] if token_ids and token_ids[-1] in self.eos_token_ids else token_ids
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def cut_at_stop(self, token_ids: list[int], stops: list[str]) -> tuple[int, str, str] | None:
        """``(n, stop, text)``: the earliest stop string in the sampled text, the fewest leading ids
        whose text holds it and the text before it; None when no stop string was sampled. The reply is cut
        there as a provider cuts it: the ids up to the one that completed the stop string stay the record (the
        model sampled them; the next prompt continues them), the text before it is the answer."""
        text = self.sampled_text(token_ids)
        hits = [(text.find(s), s) for s in stops if s in text]
        if not hits:
            return None
        at, stop = min(hits)
        lo, hi = 1, len(token_ids)  # ``stop in decode(ids[:n])`` is monotone in n: binary search
        while lo < hi:
            mid = (lo + hi) // 2
            if stop in self.tokenizer.decode(token_ids[:mid], skip_special_tokens=False):
                hi = mid
            else:
                lo = mid + 1
        return lo, stop, text[:at]

    def forced_call_prefix(self, name: str | None) -> str:
        """The start of a tool call, written after the generation prompt when ``tool_choice``
        requires one (any tool, or the tool ``name``): the model continues inside the call."""
        if self.tool_format == "hermes":
            return (
                CALL_OPEN
                + "\n"
                + ("" if name is None else '{"name": ' + json.dumps(name) + ', "arguments": ')
            )
        return CALL_OPEN + "\n<function=" + ("" if name is None else name + ">\n")

    def encode_text(self, text: str) -> list[int]:
        """Ids of text that follows the generation prompt (a prefill), special tokens not added."""
        return self._encode(text) if text else []

    # ---- internals -------------------------------------------------------------------------

    def _thinking(self, enable_thinking: bool | None) -> bool | None:
        return self.enable_thinking if enable_thinking is None else enable_thinking

    def _render(
        self,
        messages: list[dict],
        tools: list[dict],
        *,
        add_generation_prompt: bool,
        enable_thinking: bool | None = None,
    ) -> str:
        flag = self._thinking(enable_thinking)
        extra = {} if flag is None else {"enable_thinking": flag}
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            chat_template=self.chat_template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **extra,
        )

    def _encode(self, text: str) -> list[int]:
        if self._fast_encode is not None:
            return self._fast_encode([text], add_special_tokens=False)[0].ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    @staticmethod
    def _message_dict(m: Message) -> dict[str, Any]:
        return {
            "role": m.role,
            "content": m.content,
            "reasoning_content": m.reasoning,
            "tool_calls": [
                {
                    "id": tc.id,
                    "type": "function",
                    "function": {"name": tc.name, "arguments": _arguments_object(tc.arguments, tc.kind)},
                }
                for tc in m.tool_calls
            ],
            "tool_call_id": m.tool_call_id,
            "name": m.name,
        }

    @staticmethod
    def _tool_dict(t: ToolSpec) -> dict[str, Any]:
        if t.kind == "custom":
            params = {
                "type": "object",
                "properties": {"input": {"type": "string", "description": "raw input"}},
                "required": ["input"],
            }
            return {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": params},
            }
        return {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }


def apply_tool_kinds(calls: list[ToolCall], tools: list[ToolSpec]) -> list[ToolCall]:
    """Give parsed calls of custom (free-text) tools their kind and raw text back.

    The model sees a custom tool as a function with one ``input`` string (see module docstring);
    this undoes that wrapping for the tools the request declared custom.
    """
    custom = {t.name for t in tools if t.kind == "custom"}
    out = []
    for call in calls:
        if call.name in custom:
            try:
                value = json.loads(call.arguments)
            except (ValueError, RecursionError):
                value = call.arguments
            text = value.get("input", call.arguments) if isinstance(value, dict) else call.arguments
            call = call.model_copy(
                update={
                    "kind": "custom",
                    "arguments": text if isinstance(text, str) else json.dumps(text, ensure_ascii=False),
                }
            )
        out.append(call)
    return out


def _arguments_object(arguments: str, kind: str) -> dict[str, Any]:
    if kind == "function":
        try:
            value = json.loads(arguments)
        except (ValueError, RecursionError):
            value = None
        if isinstance(value, dict):
            return value
    return {"input": arguments}


def _is_query(m: Message) -> bool:
    """A message Qwen templates count as a user query (a later system message renders as one)."""
    if m.role == "system":
        return True
    text = m.content.strip()
    return m.role == "user" and not (text.startswith("<tool_response>") and text.endswith("</tool_response>"))


def _model_type(path: Path) -> str:
    """``model_type`` of the checkpoint's config.json ("" when there is none)."""
    try:
        return str(json.loads((path / "config.json").read_text()).get("model_type", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def _resolve_template(spec: str) -> str:
    if "{" in spec:
        return spec
    path = Path(spec)
    if path.is_file():
        return path.read_text()
    return bundled_template(spec)
