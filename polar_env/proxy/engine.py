"""The token path: canonical conversation in, token-exact call out (docs/architecture.md, "The token path").

For each request the engine finds the earlier call that this conversation extends (its messages
plus its own answer are a message-level prefix of the request), reuses that call's prompt ids and
sampled ids verbatim, and renders only the messages appended since. The call is appended to the
ledger before the harness gets its answer.

The context window is the user's (``EngineConfig.max_context``) or else the backend's own
(``max_model_len``); a prompt that leaves no room to generate is refused here, before the backend,
as a ``ContextOverflow`` that each API answers in its provider's own error shape. A harness that
sends the same failing request again is stopped after ``MAX_IDENTICAL_FAILURES``: its session
refuses every further call, so a retry loop ends at once instead of running out the deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, TypeVar

from polar_env import metrics
from polar_env.backends.base import Backend, BackendError, ContextOverflow, SamplingParams
from polar_env.backends.logprobs_mode import LogprobsMode
from polar_env.chat.messages import AssistantTurn, Conversation, Message, TokenLogprob, ToolCall
from polar_env.chat.template import ChatRenderer, apply_tool_kinds
from polar_env.outcomes import FailureKind, is_harness
from polar_env.proxy.codecs.common import DecodedRequest, WireError
from polar_env.proxy.policy import PolicyFence
from polar_env.proxy.run_slots import RunEnded, RunSlots
from polar_env.proxy.sessions import SAMPLING_KEYS, BudgetExceeded, CallState, Session, prefix_hashes
from polar_env.trajectory.ledger import Ledger
from polar_env.trajectory.records import (
    HISTORY_THINKING_KEPT,
    LOGPROBS_UNALIGNED,
    VERSION_LABEL,
    WEIGHTS_CHANGED,
    Api,
    CallOrigin,
    CallRecord,
    ids_digest,
)
from polar_env.wire.ids import issued_tool_call_id

log = logging.getLogger(__name__)
T = TypeVar("T")
GUARD_PIECE = 16 * 1024  # characters tokenized at a time when sizing a huge request
# appended text and sampled ids this small are rendered / parsed on the loop when the tokenizer is free
INLINE_CHARS = 4096
INLINE_IDS = 512
LEDGER_INLINE_IDS = 4 * INLINE_IDS  # a ledger line this small is written on the loop (Ledger.append_async)

MAX_IDENTICAL_FAILURES = 2
HISTORY_THINKING_DROPPED = "history thinking dropped (new user turn)"  # chain break reason
NARROWING = ("top_p",)  # forced sampling keys a harness may not set (top_k is never sent at all)
NEUTRALISED = "neutralised:"  # call flag prefix: the harness's narrowing knobs this call did not apply


@dataclass(frozen=True)
class CallTicket:
    """A model call's id and start time, issued before it runs: a streamed answer can open with
    events that name the call (the Responses API's ``response.created``) while it generates."""

    call_id: str
    created_at: float

    @classmethod
    def new(cls) -> CallTicket:
        return cls(os.urandom(12).hex(), time.time())  # 24 hex digits, a tenth of uuid4's cost


class SessionStopped(Exception):
    """The session refuses further calls (the harness repeated a failing request); says why."""


@dataclass
class EngineConfig:
    max_context: int | None = None  # the context window; None: what the backend reports
    default_max_tokens: int = 1024
    backend_retries: int = 2  # extra attempts on retryable backend errors
    retry_backoff_s: float = 0.2
    defaults: dict[str, Any] = field(
        default_factory=dict
    )  # sampling when neither the session nor the harness sets it
    # the start-up logprobs probe's own bound: a backend that hangs must not hang the proxy's start
    # (its generation timeout may be an hour); past it the mode is ``unknown``
    logprobs_probe_timeout_s: float = 30.0
    # a new user turn after thinking turns: ``keep`` extends the chain (the model keeps its own
    # thinking; the stream then differs from a full render by design, flagged ``HISTORY_THINKING_KEPT``),
    # ``drop`` starts a new chain rendered whole, as the template drops that thinking (docs/proxy.md)
    history_thinking: Literal["keep", "drop"] = "keep"
    policy_version: int | None = (
        None  # the serving weights' version at start (the trainer moves it: proxy/policy.py)
    )
    # a call not provably the harness's (origin ``tool``/``unknown``: a process the agent ran with the
    # session's key): ``serve`` answers it behind the harness's calls (proxy/run_slots.py), ``refuse`` answers
    # 403
    agent_calls: Literal["serve", "refuse"] = "serve"


def add_thinking_arguments(
    parser: argparse.ArgumentParser, enable_thinking: bool | None = None, history_thinking: str = "keep"
) -> None:
    """``--enable-thinking`` and ``--history-thinking``, shared by ``polar proxy`` and ``polar rollout``."""
    parser.add_argument(
        "--enable-thinking",
        type=_on_off,
        default=enable_thinking,
        metavar="on|off",
        help="the chat template's enable_thinking (Qwen3/3.5); a request's chat_template_kwargs "
        "override it (default: the template's own default)",
    )
    parser.add_argument(
        "--history-thinking",
        choices=["keep", "drop"],
        default=history_thinking,
        help="a new user turn after thinking turns: keep extends the chain with the model's own "
        "thinking (flagged, counted by polar check), drop starts a new chain rendered as the "
        "template renders it (docs/proxy.md)",
    )


def add_agent_calls_argument(parser: argparse.ArgumentParser, default: str = "serve") -> None:
    """``--agent-calls``, shared by ``polar proxy serve`` and ``polar rollout``."""
    parser.add_argument(
        "--agent-calls",
        choices=["serve", "refuse"],
        default=default,
        help="model calls an episode's tools make with its key (origin tool/unknown): serve them "
        "behind the harness's calls (never pausing its deadline nor counted as backend "
        "evidence), or refuse them with 403 (docs/training.md)",
    )


def _on_off(value: str) -> bool:
    if value.lower() in ("on", "true", "1"):
        return True
    if value.lower() in ("off", "false", "0"):
        return False
    raise argparse.ArgumentTypeError("on or off")


@dataclass
class Extension:
    parent: CallState | None
    prompt_ids: list[int]
    break_reason: str | None
    flags: list[str] = field(default_factory=list)


class TokenEngine:
    def __init__(
        self, renderer: ChatRenderer, backend: Backend, ledger: Ledger, config: EngineConfig | None = None
    ):
        self.renderer = renderer
        self.backend = backend
        self.ledger = ledger
        self.config = config or EngineConfig()
        self.eos_ids = set(renderer.eos_token_ids)
        # Rendering, tokenizing and parsing run here, off the event loop: one thread (started on
        # first use, stopped by ``close``), because a fast tokenizer must not be used from two
        # threads at once; ``_tokenizer`` is held by whoever uses it (the thread, or the loop inline).
        self._cpu: ThreadPoolExecutor | None = None
        self._tokenizer = threading.Lock()
        self._window: int | None = None
        self._window_known = False
        self.fence = PolicyFence(self.config.policy_version)  # every generation passes it (weight sync)
        self.run_slots: RunSlots | None = None  # run-stage admission (the staged rollout driver sets it)

    async def off_loop(self, fn: Callable[..., T], *args: Any, small: bool = False) -> T:
        """``fn(*args)`` on the engine's worker thread: /health and other sessions stay served.
        ``small`` work (a turn's worth of text, well under a millisecond) runs here on the loop
        when the tokenizer is free: the hop to the thread and back costs more than the work, and
        on a loaded machine waits for the scheduler twice."""
        if small and self._tokenizer.acquire(blocking=False):
            try:
                return fn(*args)
            finally:
                self._tokenizer.release()
        if self._cpu is None:
            self._cpu = ThreadPoolExecutor(max_workers=1, thread_name_prefix="polar-tokenize")
        return await asyncio.get_running_loop().run_in_executor(self._cpu, partial(self._locked, fn, *args))

    def _locked(self, fn: Callable[..., T], *args: Any) -> T:
        with self._tokenizer:
            return fn(*args)

    def close(self) -> None:
        """Stop the worker thread once it is idle (a later call starts a new one)."""
        cpu, self._cpu = self._cpu, None
        if cpu is not None:
            cpu.shutdown(wait=True)

    async def context_window(self) -> int | None:
        """The window calls must fit: the configured one, else the backend's (asked once); None: unknown."""
        if self.config.max_context is not None:
            return self.config.max_context
        if not self._window_known:
            ask = getattr(self.backend, "max_model_len", None)
            self._window = await ask() if ask is not None else None
            self._window_known = True
        return self._window

    # -- prefix matching -------------------------------------------------------------------
    def find_parent(
        self, session: Session, conv: Conversation, refs: list[str | None], hashes: list[str] | None = None
    ) -> CallState | None:
        """The latest call whose messages + answer form the longest prefix of ``conv``
        (``hashes``: its ``prefix_hashes``, when the caller already has them)."""
        if not session.calls:
            return None
        hashes = hashes or prefix_hashes(conv.messages)
        tools_fp = conv.tools_fingerprint()
        for k in range(len(conv.messages) - 1, -1, -1):
            for state in reversed(session.by_prefix.get(hashes[k], ())):
                if state.tools_fp == tools_fp and _answers(
                    conv.messages[k], refs[k] if k < len(refs) else None, state
                ):
                    return state
        return None

    def classify_break(self, session: Session, conv: Conversation) -> str:
        if not session.calls:
            return "first call"
        system_fp = conv.messages[0].fingerprint() if conv.messages else None
        if conv.tools_fingerprint() not in {c.tools_fp for c in session.calls}:
            return "tools changed (sub-agent or side call)"
        if system_fp not in {c.system_fp for c in session.calls}:
            return "different system prompt (side call)"
        return "history rewritten (compaction or edited history)"

    async def build_prompt(
        self,
        session: Session,
        conv: Conversation,
        refs: list[str | None],
        hashes: list[str] | None = None,
        enable_thinking: bool | None = None,
    ) -> Extension:
        parent = self.find_parent(session, conv, refs, hashes)  # on the loop: it reads the session
        flags: list[str] = []
        reason = None
        if parent is not None and self.renderer.drops_thinking(conv.messages, parent.n_messages + 1):
            if self.config.history_thinking == "drop":
                parent, reason = None, HISTORY_THINKING_DROPPED
            else:
                flags.append(HISTORY_THINKING_KEPT)
        await self.check_size(conv, parent)
        if parent is None:
            reason = reason or self.classify_break(session, conv)
            render = partial(self.renderer.render_prompt, enable_thinking=enable_thinking)
            return Extension(None, await self.off_loop(render, conv.messages, conv.tools), reason)
        appended = conv.messages[parent.n_messages + 1 :]
        small = sum(map(len, _texts(appended))) < INLINE_CHARS
        return Extension(
            parent,
            await self.off_loop(_extend, self.renderer, parent, appended, enable_thinking, small=small),
            None,
            flags,
        )

    async def check_size(self, conv: Conversation, parent: CallState | None) -> None:
        """Refuse a request whose new text cannot fit the context before it is rendered and tokenized
        whole (seconds, and megabytes of ids, for a 5 MB tool output): at once when even the most
        characters a token holds cannot fit it, else by counting tokens piece by piece, stopping
        as soon as the count is past the room left (with a margin for the cuts between pieces)."""
        window = await self.context_window()
        if window is None:
            return
        texts = _texts(conv.messages[parent.n_messages + 1 :] if parent else conv.messages)
        chars = sum(map(len, texts))
        reused = parent.n_ids if parent else 0
        room = window - reused
        if (least := chars // self.renderer.max_token_chars) >= room:
            raise ContextOverflow(
                reused + least,
                window,
                f"prompt is at least {reused + least} tokens ({chars} "
                f"characters of new text); the model's context is {window} tokens",
            )
        if chars * 4 < room:  # a token holds at least one byte, a character at most four
            return
        tokens, pieces = await self.off_loop(_count_until, self.renderer, texts, room)
        if (least := tokens - 2 * pieces) >= room:
            raise ContextOverflow(
                reused + least,
                window,
                f"prompt is more than {reused + least} tokens ({chars} "
                f"characters of new text); the model's context is {window} tokens",
            )

    async def probe_logprobs_mode(self) -> LogprobsMode:
        """Ask the backend which logprobs it returns (a short probe for HTTP servers); ``unknown``
        when it cannot say or is unreachable now."""
        probe = getattr(self.backend, "probe_logprobs_mode", None)
        if probe is None:
            return "unknown"
        prompt = self.renderer.render_prompt([Message(role="user", content="Say something.")], [])
        try:
            return await asyncio.wait_for(probe(prompt), self.config.logprobs_probe_timeout_s)
        except (BackendError, ContextOverflow, TimeoutError) as exc:
            why = str(exc) or f"no answer in {self.config.logprobs_probe_timeout_s:g} s"
            log.warning("could not tell which logprobs backend %s returns: %s", self.backend.name, why)
            return "unknown"

    # -- sampling ----------------------------------------------------------------------------
    def sampling_for(
        self, session: Session, requested: dict[str, Any], prompt_len: int, window: int | None = None
    ) -> tuple[SamplingParams, list[str]]:
        """The session's forced sampling (the trainer's) wins over the harness; record what it overrode.
        A harness's narrowing knobs (top-p below 1, top-k) are never applied (OpenEnv RFC 006: processed
        logprobs over a truncated distribution are "plausible, aligned and wrong" next to a trainer's over the
        whole one); the call records what was asked (``requested_sampling``) and flags ``neutralised:...``."""
        chosen: dict[str, Any] = {"max_tokens": self.config.default_max_tokens, **self.config.defaults}
        overridden = []
        for key in SAMPLING_KEYS:
            asked = requested.get(key)
            forced = session.info.sampling.get(key)
            if forced is not None:
                chosen[key] = forced
                if asked is not None and asked != forced:
                    overridden.append(key)
            elif asked is not None and key not in NARROWING:
                chosen[key] = asked
        if window is not None:
            if prompt_len >= window:  # not even one token of room
                raise ContextOverflow(prompt_len, window)
            chosen["max_tokens"] = min(int(chosen["max_tokens"]), window - prompt_len)
        chosen["max_tokens"] = max(1, int(chosen["max_tokens"]))
        return SamplingParams(stop_token_ids=sorted(self.eos_ids), **chosen), overridden

    @staticmethod
    def neutralised(session: Session, requested: dict[str, Any]) -> list[str]:
        """The harness's narrowing knobs this call did not apply (a trainer's forced top_p is not the
        harness's)."""
        out = []
        if (
            (top_p := requested.get("top_p")) is not None
            and top_p < 1
            and session.info.sampling.get("top_p") is None
        ):
            out.append("top_p")
        if (top_k := requested.get("top_k")) is not None and top_k > 0:
            out.append("top_k")
        return out

    # -- one call ------------------------------------------------------------------------------
    async def complete(
        self,
        session: Session,
        api: Api,
        request: DecodedRequest,
        origin: CallOrigin | None = None,
        ticket: CallTicket | None = None,
    ) -> tuple[AssistantTurn, CallRecord]:
        """Run one model call; the record is in the ledger before this returns or raises, whatever
        fails (context overflow, backend, cancellation, a bug) — as a failed call with its reason.
        ``origin``: who made it, as the forwarder proved (proxy/app.py); ``ticket``: its id and
        time, when the caller named them before the answer exists (a stream's opening events)."""
        ticket = ticket or CallTicket.new()
        started = time.perf_counter()
        conv = request.conversation
        if session.stopped is not None:
            raise SessionStopped(session.stopped)
        if not is_harness(origin) and self.config.agent_calls == "refuse":
            raise WireError(
                403,
                f"this proxy serves only the harness's own model calls (origin {origin}); see --agent-calls",
            )
        # once: matching, indexing, retry counting (the decoder's, reused from the session's last request)
        hashes = request.prefix_hashes or await self.off_loop(prefix_hashes, conv.messages)
        record = CallRecord(
            session_id=session.id,
            call_index=session.reserve_index(),
            call_id=ticket.call_id,
            api=api,
            created_at=ticket.created_at,
            messages=conv.messages,
            tools=conv.tools,
            requested_sampling={
                **request.requested_sampling,
                **({"stop": request.stop} if request.stop else {}),
            },
            backend=self.backend.name,
            model=self.backend.model,
            flags=list(request.flags),
            origin=origin,
        )
        try:
            return await self._complete(session, request, record, started, hashes)
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError) and session.count_failure(
                f"{api}:{hashes[-1]}:{conv.tools_fingerprint()}", MAX_IDENTICAL_FAILURES, str(exc)
            ):
                self.ledger.update_session(session.info)
            if record.output is None and record.error is None:  # not yet in the ledger
                if isinstance(exc, ContextOverflow):
                    record.error, record.failure_kind = (
                        f"context overflow: {exc}",
                        FailureKind.context_overflow,
                    )
                elif isinstance(exc, BudgetExceeded):
                    record.error, record.failure_kind = f"budget: {exc}", FailureKind.episode_budget
                elif isinstance(exc, BackendError):
                    record.error, record.failure_kind = f"backend: {exc}", FailureKind.backend_failure
                elif isinstance(exc, asyncio.CancelledError):
                    record.error = "cancelled: the call was cancelled before the backend answered"
                elif isinstance(exc, RunEnded):  # the episode ended (cancelled) while this call waited
                    record.error = f"cancelled: {exc}"
                else:
                    record.error = f"proxy: {type(exc).__name__}: {exc}"
                    record.failure_kind = FailureKind.proxy_failure
                record.timings = {**record.timings, "total_ms": (time.perf_counter() - started) * 1e3}
                metrics.call_failed(
                    api,
                    record.failure_kind.value if record.failure_kind is not None else "cancelled",
                    record.timings["total_ms"] / 1e3,
                )
                if isinstance(exc, Exception):  # a large request's JSON is written off the loop
                    await self.ledger.append_async(record)
                    session.remember(record, self.eos_ids)
                else:  # cancelled: awaiting again could be cancelled too; write it now
                    self._persist(session, record)
            raise

    async def _complete(
        self, session: Session, request: DecodedRequest, record: CallRecord, started: float, hashes: list[str]
    ) -> tuple[AssistantTurn, CallRecord]:
        conv = request.conversation
        call_id = record.call_id
        await session.wait_for_token_room()  # a spent budget refuses the call before it costs anything
        session.admit()
        ext = await self.build_prompt(session, conv, request.assistant_refs, hashes, request.enable_thinking)
        record.flags += ext.flags
        prefix = self._prefix(request, record)
        prompt_ids = ext.prompt_ids  # a list of its own: extended in place, never copied whole
        if prefix:
            prompt_ids += await self.off_loop(self.renderer.encode_text, prefix)
        render_ms = (time.perf_counter() - started) * 1e3
        record.prefill = prefix
        record.parent_call_index = ext.parent.call_index if ext.parent else None
        record.reused_prefix_len = ext.parent.n_ids if ext.parent else 0
        record.break_reason = ext.break_reason
        record.timings = {"render_ms": render_ms}
        window = await self.context_window()
        sampling, overridden = self.sampling_for(session, request.requested_sampling, len(prompt_ids), window)
        record.prompt_ids = prompt_ids  # after the context check: an overflow records no megabytes of ids
        # the ledger line stores only what this call adds to its parent, plus the whole prompt's hash
        prompt_digest = (
            ids_digest(prompt_ids[record.reused_prefix_len :], ext.parent.digest)
            if ext.parent
            else ids_digest(prompt_ids)
        )
        record.prompt_sha256 = prompt_digest.hexdigest()
        if ext.parent:
            record.reused_messages, record.reused_tools = ext.parent.n_messages, True
        record.sampling, record.overridden = sampling, overridden
        if overridden:
            record.flags.append("overridden:" + ",".join(overridden))
        if neutralised := self.neutralised(session, request.requested_sampling):
            record.flags.append(NEUTRALISED + ",".join(neutralised))
        if (room := await session.wait_for_token_room()) is not None and sampling.max_tokens > room:
            sampling = record.sampling = sampling.model_copy(update={"max_tokens": room})
            record.flags.append(f"budget:max_tokens={room}")
        slots, harness = self.run_slots, is_harness(record.origin)
        if slots is not None:
            admission_s = await slots.enter(session.id, harness=harness)
            metrics.RUN_SLOT_WAIT.observe(admission_s)
        else:
            admission_s = 0.0
        gen_started = time.perf_counter()
        # calls in parallel share what is left; held until this call's sampled tokens are counted
        session.reserve_tokens(sampling.max_tokens)
        try:
            try:
                record.policy_version, generation, held_ms = await self.fence.generate(
                    partial(self._generate, session, prompt_ids, sampling),
                    partial(record.flags.append, "fence_aborted"),
                )
            except ContextOverflow as exc:  # the backend's own refusal: answered as ours would be
                raise ContextOverflow(len(prompt_ids), exc.window or window, str(exc)) from exc
            finally:
                if slots is not None:  # the backend has answered (or failed): the slot is the next call's
                    slots.leave(session.id, harness=harness)
            generate_ms = (time.perf_counter() - gen_started) * 1e3 - held_ms  # the fence's wait apart
            self._note_version(record, generation.weight_versions)
            if generation.prompt_ids is not prompt_ids and generation.prompt_ids != prompt_ids:
                record.flags.append("backend_prompt_mismatch")
            sampled, logprobs, finish = generation.token_ids, generation.logprobs, generation.finish_reason
            if len(logprobs) != len(sampled) or not all(map(math.isfinite, logprobs)):
                record.flags.append(LOGPROBS_UNALIGNED)  # a context-only turn (the chain builder masks it)
            text = stop = None
            if request.stop and (
                cut := await self.off_loop(self.renderer.cut_at_stop, sampled, request.stop)
            ):
                n, stop, text = cut
                sampled, logprobs, finish = sampled[:n], logprobs[:n], "stop"
            small = len(sampled) <= INLINE_IDS
            parsed = await self.off_loop(
                partial(
                    self.renderer.parse_output,
                    sampled,
                    prefix=prefix,
                    text=text,
                    enable_thinking=request.enable_thinking,
                ),
                small=small,
            )
            token_logprobs = (
                await self.off_loop(self._token_logprobs, sampled, logprobs, small=small)
                if request.logprobs
                else None
            )
            tool_calls = [
                ToolCall(
                    id=issued_tool_call_id(call_id, i), name=tc.name, arguments=tc.arguments, kind=tc.kind
                )
                for i, tc in enumerate(apply_tool_kinds(parsed.tool_calls, conv.tools))
            ]
            turn = AssistantTurn(
                call_id=call_id,
                content=parsed.content,
                reasoning=parsed.reasoning,
                tool_calls=tool_calls,
                finish_reason="tool_calls" if tool_calls else finish,
                prompt_tokens=len(prompt_ids),
                completion_tokens=len(sampled),
                malformed_tool_call=parsed.malformed,
                model=request.model or self.backend.model,
                stop_sequence=stop,
                prefill=request.prefill or "",
                logprobs=token_logprobs,
                created_at=int(record.created_at),
            )
            if parsed.malformed:
                record.flags.append("malformed_tool_call")
            record.sampled_ids, record.logprobs = sampled, logprobs
            record.output, record.finish_reason, record.stop_sequence = turn, finish, stop
            record.model = generation.model or self.backend.model
            total_s = time.perf_counter() - started
            record.timings = {"render_ms": render_ms, "generate_ms": generate_ms, "total_ms": total_s * 1e3}
            if held_ms:
                record.timings["fence_ms"] = held_ms
            if admission_s:  # waited for a run slot (proxy/run_slots.py); not part of generate_ms
                record.timings["admission_ms"] = admission_s * 1e3
            line_ids = len(prompt_ids) - record.reused_prefix_len + len(sampled)  # what its line holds
            await self.ledger.append_async(
                record, small=ext.parent is not None and line_ids <= LEDGER_INLINE_IDS
            )
            session.remember(record, self.eos_ids, hashes[-1], ids_digest(sampled, prompt_digest))
            metrics.call_answered(record.api, len(prompt_ids), len(sampled), total_s)
            return turn, record
        finally:
            session.release_tokens(sampling.max_tokens)

    def _note_version(self, record: CallRecord, labels: list[str]) -> None:
        """Which weights sampled the call: the server's numeric label where it gives one (the fence then
        follows it, so admission needs no trainer call), else the version the trainer set, if any."""
        record.weight_versions = labels
        numeric = [int(label) for label in labels if VERSION_LABEL.fullmatch(label)]
        if numeric:
            record.policy_version, record.version_source = numeric[0], "server"
            if numeric[-1] != numeric[0]:
                record.flags.append(WEIGHTS_CHANGED)
            if self.fence.version != numeric[-1]:
                self.fence.set_version(numeric[-1])
        elif record.policy_version is not None:
            record.version_source = "trainer"

    def _prefix(self, request: DecodedRequest, record: CallRecord) -> str:
        """Text of the reply the prompt already holds: the harness's prefill, else the start of the
        tool call that ``tool_choice`` requires."""
        if request.prefill is not None:
            if request.tool_choice.mode != "auto":
                record.flags.append("unenforced:tool_choice(prefill)")
            return request.prefill
        if request.tool_choice.mode == "auto":
            return ""
        return self.renderer.forced_call_prefix(request.tool_choice.name)

    def _token_logprobs(self, ids: list[int], logprobs: list[float]) -> list[TokenLogprob]:
        """The recorded logprobs in the OpenAI shape (the end-of-turn token is not part of the text)."""
        out = []
        for token_id, logprob in zip(ids, logprobs, strict=False):
            if token_id in self.eos_ids:
                continue
            token = self.renderer.tokenizer.decode([token_id], skip_special_tokens=False)
            out.append(TokenLogprob(token=token, logprob=logprob, bytes=list(token.encode())))
        return out

    async def count_tokens(self, request: DecodedRequest) -> int:
        conv = request.conversation
        prompt = await self.off_loop(self.renderer.render_prompt, conv.messages, conv.tools)
        return len(prompt) + len(await self.off_loop(self.renderer.encode_text, request.prefill or ""))

    async def _generate(self, session: Session, prompt_ids: list[int], sampling: SamplingParams):
        attempt = 0
        while True:
            metrics.BUSY.enter()  # the backend's busy time: the inference busy fraction
            try:
                return await self.backend.generate(prompt_ids, sampling, session_id=session.id)
            except BackendError as exc:
                if not exc.retryable or attempt >= self.config.backend_retries:
                    raise
            finally:
                metrics.BUSY.leave()
            attempt += 1
            await asyncio.sleep(self.config.retry_backoff_s * attempt)

    def _persist(self, session: Session, record: CallRecord) -> None:
        self.ledger.append(record)
        session.remember(record, self.eos_ids)


def _texts(messages: list[Message]) -> list[str]:
    """The text a render of ``messages`` tokenizes (contents, reasoning, tool-call arguments)."""
    return [
        t for m in messages for t in (m.content, m.reasoning or "", *(tc.arguments for tc in m.tool_calls))
    ]


def _count_until(renderer: ChatRenderer, texts: list[str], limit: int) -> tuple[int, int]:
    """(tokens, pieces): ``texts`` tokenized in pieces of ``GUARD_PIECE`` characters until past
    ``limit``; each piece holds the interpreter only briefly, so the event loop keeps running."""
    tokens = pieces = 0
    for text in texts:
        for start in range(0, len(text), GUARD_PIECE):
            tokens += len(renderer.encode_text(text[start : start + GUARD_PIECE]))
            pieces += 1
            if tokens - 2 * pieces >= limit:
                return tokens, pieces
    return tokens, pieces


def _extend(
    renderer: ChatRenderer, parent: CallState, appended: list[Message], enable_thinking: bool | None = None
) -> list[int]:
    """The parent's prompt and sampled ids followed by the rendered ``appended`` messages."""
    ids = parent.token_ids()
    ids += renderer.render_continuation(
        appended, previous_ended_with_eos=parent.ended_with_eos, enable_thinking=enable_thinking
    )
    return ids


_NON_ALPHANUMERIC = re.compile(r"[^A-Za-z0-9]")


def _answers(message: Message, ref: str | None, state: CallState) -> bool:
    """Whether ``message`` (an assistant turn the harness sent back) is the answer of ``state``."""
    if message.role != "assistant":
        return False
    issued = [_id_key(tc.id) for tc in state.output.tool_calls]
    sent = [_id_key(tc.id) for tc in message.tool_calls]
    if ref is not None and state.call_id in ref:
        return sent == issued  # a ref on part of a turn (one of its calls) is not the turn
    if issued:
        return sent == issued
    return not message.tool_calls and message.content.strip() == state.output.content.strip()


def _id_key(tool_call_id: str | None) -> str:
    """A tool-call id as compared with the one issued: its letters and digits. Some harnesses rewrite
    ids to the charset their strictest provider takes (OpenClaw sends ``call_ab12_0`` back as
    ``callab120``); an issued id is unique per call, so the letters alone still name one call."""
    return _NON_ALPHANUMERIC.sub("", tool_call_id or "")
