"""The aiohttp proxy: per-session routing and auth in front of the four wire APIs.

Routes: ``/s/<session_id>/v1/{chat/completions,responses,messages,messages/count_tokens,models}``
and ``/s/<session_id>/v1beta/models/<model>:{generateContent,streamGenerateContent,countTokens}``
for harnesses (the session key is their API key), ``/admin/...`` for whoever runs episodes
(protected by the admin secret). Sessions are never created implicitly.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import logging
import secrets
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from polar_env import metrics
from polar_env.backends.base import Backend, BackendError
from polar_env.backends.logprobs_mode import LogprobsMismatch, LogprobsMode, sampling_mismatch
from polar_env.chat.template import ChatRenderer
from polar_env.proxy.admin_api import (
    CloseSession,
    CreateSession,
    Health,
    ModelEntry,
    ModelList,
    Resumed,
    SessionCreated,
    SessionDetail,
    SessionUrls,
    SessionView,
)
from polar_env.proxy.codecs import anthropic_messages, gemini_generate_content, openai_chat, openai_responses
from polar_env.proxy.codecs.common import DecodedRequest, WireError, json_response, parse_json_body
from polar_env.proxy.codecs.protocol import Codec, CountingCodec
from polar_env.proxy.engine import CallTicket, ContextOverflow, EngineConfig, SessionStopped, TokenEngine
from polar_env.proxy.offload import ParsePool
from polar_env.proxy.policy import PauseRequest, PolicyVersion, ResumeRequest
from polar_env.proxy.run_slots import RunEnded
from polar_env.proxy.seen import Seen
from polar_env.proxy.sessions import AuthError, BudgetExceeded, Session, SessionRegistry
from polar_env.sandbox.views import socket_dir, unmount
from polar_env.trajectory.ledger import Ledger
from polar_env.trajectory.records import Api, CallOrigin, EpisodeBudget
from polar_env.wire.openai_errors import openai_error
from polar_env.wire.shape import Shape

log = logging.getLogger("polar.proxy")

API_MODULES: dict[str, Codec] = {
    "chat": openai_chat,
    "responses": openai_responses,
    "messages": anthropic_messages,
    "gemini": gemini_generate_content,
}
DEFAULT_MAX_BODY = 64 * 1024 * 1024
OFF_LOOP_BYTES = 256 * 1024  # bodies from this size are parsed in a worker process (proxy/offload.py)
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


def _request_key(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key") or request.headers.get("x-goog-api-key")


ORIGIN_HEADER = "x-polar-origin"
ORIGIN_TAGGED = "origin_tagged"  # session metadata: its calls come through a tagging forwarder
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
DEFAULT_KEEPALIVE_S = 5.0  # well under any harness's stream idle timeout (Codex: 300 s by default)
# The cyclic garbage collector's thresholds in a process that hosts a proxy. Open sessions keep many
# objects alive (messages, call states, chains); at Python's defaults (700, 10, 10) the collector walks
# them over and over, about a tenth of the proxy's CPU at 256 sessions. Nearly everything a call makes
# is freed by reference counting, so collecting less often costs only how long a rare cycle lingers.
GC_THRESHOLDS = (50_000, 50, 100)


def _failure(module: Codec, exc: BaseException) -> tuple[int, Shape]:
    """The HTTP status and the body, in the called API's shape, a failed model call is answered with."""
    if isinstance(exc, ContextOverflow):  # the provider's own shape, so the harness compacts or stops
        return 400, module.encode_overflow(exc.prompt_tokens, exc.window)
    if isinstance(exc, AuthError):
        status, message = 401, str(exc)
    elif isinstance(exc, WireError):
        status, message = exc.status, exc.message
    elif isinstance(
        exc, SessionStopped | RunEnded
    ):  # a 400: no harness retries it (RunEnded: the episode is over)
        status, message = 400, f"episode stopped: {exc}"
    elif isinstance(exc, BudgetExceeded):  # a 400 too: the harness ends instead of retrying
        status, message = 400, f"episode budget exhausted: {exc}"
    elif isinstance(exc, BackendError):
        status, message = (503 if exc.retryable else 502), f"inference backend failed: {exc}"
    else:
        log.error("model call failed in the proxy", exc_info=exc)
        status, message = 500, f"proxy error: {type(exc).__name__}"
    return status, module.encode_error(status, message)


class ProxyServer:
    """One proxy: an engine, its sessions, and the HTTP front; start it on TCP and/or a Unix socket."""

    def __init__(
        self,
        engine: TokenEngine,
        registry: SessionRegistry,
        *,
        admin_secret: str,
        max_body_bytes: int = DEFAULT_MAX_BODY,
        owns_backend: bool = True,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
    ):
        self.engine = engine
        self.owns_backend = owns_backend  # close the backend on stop() (not when the caller shares it)
        self.registry = registry
        if not admin_secret:
            raise ValueError("an empty admin secret would open the admin API to everyone")
        self.admin_secret = admin_secret
        self.max_body_bytes = max_body_bytes
        self.keepalive_s = keepalive_s  # SSE keep-alive interval while a streamed call generates
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        self.host = "127.0.0.1"
        self.unix_socket: Path | None = None
        self._socket_mount = False  # its dir is a tmpfs this proxy mounted (`views.socket_dir`)
        self._inflight: dict[str, set[asyncio.Task]] = {}  # session id -> model calls still running
        self.logprobs_mode: LogprobsMode = "unknown"  # which logprobs the backend returns (probed at start)
        # the sandboxes' forwarders prove each call's origin with it (sandbox/forwarder.py); never in a ledger
        self.origin_key = secrets.token_urlsafe(24)
        self._parsers = ParsePool()
        self.started_at = time.time()  # what the model list gives as the served model's creation time
        if gc.get_threshold()[0] < GC_THRESHOLDS[0]:
            gc.set_threshold(*GC_THRESHOLDS)

    @classmethod
    def create(
        cls,
        *,
        renderer: ChatRenderer,
        backend: Backend,
        data_dir: Path,
        admin_secret: str,
        config: EngineConfig | None = None,
        fsync: bool = False,
        max_body_bytes: int = DEFAULT_MAX_BODY,
        owns_backend: bool = True,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
    ) -> ProxyServer:
        """Build a proxy over ``data_dir``, recovering every session already recorded there."""
        ledger = Ledger(Path(data_dir), fsync=fsync)
        engine = TokenEngine(renderer, backend, ledger, config)
        registry = SessionRegistry(ledger, engine.eos_ids)
        report = registry.recover()
        if not report.ok:
            log.warning("ledger recovery found torn or corrupt lines: %s", report.model_dump_json())
        return cls(
            engine,
            registry,
            admin_secret=admin_secret,
            max_body_bytes=max_body_bytes,
            owns_backend=owns_backend,
            keepalive_s=keepalive_s,
        )

    # -- in-process API ----------------------------------------------------------------------
    def create_session(
        self,
        session_id: str | None = None,
        *,
        sampling: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        training: bool = False,
        budget: EpisodeBudget | dict[str, Any] | None = None,
    ) -> tuple[str, str]:
        """Register a session; returns ``(session_id, api_key)``. The key is not stored. A training
        session whose enforced sampling does not match the backend's logprobs is refused
        (LogprobsMismatch)."""
        if training and (why := sampling_mismatch(self.logprobs_mode, sampling or {})):
            raise LogprobsMismatch(why)
        session, key = self.registry.create(
            session_id,
            sampling=sampling,
            metadata=metadata,
            training=training,
            logprobs_mode=self.logprobs_mode,
            budget=budget,
        )
        return session.id, key

    def session_urls(self, session_id: str, base: str | None = None) -> SessionUrls:
        base = base or self.base_url
        return SessionUrls(openai=f"{base}/s/{session_id}/v1", anthropic=f"{base}/s/{session_id}")

    def _track(self, session_id: str, task: asyncio.Task) -> None:
        tasks = self._inflight.setdefault(session_id, set())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def drain(self, session_id: str, timeout_s: float = 30.0) -> None:
        """Wait for the session's calls still running (a harness killed mid-call leaves one behind),
        then cancel what is left; either way each call is in the ledger before this returns."""
        tasks = list(self._inflight.pop(session_id, ()))
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- HTTP app ------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_bytes, middlewares=[self._errors])
        r = app.router
        r.add_get("/", self._ok)  # add_get answers HEAD too
        r.add_get("/health", self._health)
        r.add_get("/metrics", self._metrics)
        r.add_route("HEAD", "/s/{sid}", self._ok)
        r.add_route("HEAD", "/s/{sid}/", self._ok)
        r.add_route("HEAD", "/s/{sid}/v1", self._ok)
        for prefix in ("/s/{sid}/v1", "/s/{sid}"):
            r.add_post(prefix + "/chat/completions", self._call("chat"))
            r.add_post(prefix + "/responses", self._call("responses"))
        r.add_post("/s/{sid}/v1/messages", self._call("messages"))
        r.add_post("/s/{sid}/v1/messages/count_tokens", self._count_tokens)
        r.add_get("/s/{sid}/v1/models", self._models)
        for version in ("v1beta", "v1"):  # Gemini: the model and the method are the last segment
            r.add_post(f"/s/{{sid}}/{version}/models/{{target}}", self._gemini)
        r.add_post("/admin/sessions", self._admin_create)
        r.add_get("/admin/sessions", self._admin_list)
        r.add_get("/admin/sessions/{sid}", self._admin_get)
        r.add_post("/admin/sessions/{sid}/close", self._admin_close)
        r.add_get("/admin/sessions/{sid}/calls", self._admin_calls)
        r.add_get("/admin/policy", self._admin_policy)
        r.add_post("/admin/policy", self._admin_policy)
        r.add_post("/admin/pause", self._admin_pause)
        r.add_post("/admin/resume", self._admin_resume)
        return app

    async def start(
        self, host: str = "127.0.0.1", port: int | None = 0, unix_socket: Path | None = None
    ) -> None:
        """Listen on ``unix_socket`` and/or TCP ``host:port`` (0: any free port; None: no TCP listener
        beside the socket)."""
        self.logprobs_mode = await self.engine.probe_logprobs_mode()
        log.info("backend %s returns %s logprobs", self.engine.backend.name, self.logprobs_mode)
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        self.host = host
        if unix_socket is not None:
            unix_socket = Path(unix_socket)
            self._socket_mount = socket_dir(unix_socket.parent)  # sandboxes bind it: as root a tmpfs
            self.unix_socket = unix_socket  # stop() unmounts its dir even if the listener never starts
            unix_socket.unlink(missing_ok=True)
            site = web.UnixSite(self._runner, str(unix_socket), backlog=4096)
            await site.start()
            unix_socket.chmod(0o666)  # sandbox uids connect through the bind-mounted directory
        if port is not None and (unix_socket is None or port):
            tcp = web.TCPSite(self._runner, host, port, backlog=4096)
            await tcp.start()
            self.port = tcp._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        """Finish the calls in flight, close the server, then stop every thread and process the
        proxy started (tokenizer, ledger writer, parse workers, an owned backend's): they are idle
        by then, so joining them is immediate."""
        pending = [t for tasks in self._inflight.values() for t in tasks]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            _forget_middleware_chains()
        self._parsers.close(wait=True)
        self.engine.close()
        self.registry.ledger.close()
        if self.owns_backend:
            await self.engine.backend.aclose()
        if self._socket_mount and self.unix_socket is not None:
            unmount(self.unix_socket.parent)
            self._socket_mount = False

    # -- handlers ------------------------------------------------------------------------------
    @web.middleware
    async def _errors(self, request: web.Request, handler):
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge as exc:
            return _error(
                413, f"request body too large (limit {self.max_body_bytes} bytes): {exc.text}", request
            )
        except web.HTTPNotFound:
            return _error(404, f"unknown route {request.method} {request.path}", request)
        except web.HTTPMethodNotAllowed as exc:
            allowed = ", ".join(sorted(exc.allowed_methods))
            response = _error(
                405, f"method {request.method} not allowed on {request.path}; allowed: {allowed}", request
            )
            response.headers["Allow"] = allowed
            return response

    async def _ok(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _health(self, request: web.Request) -> web.Response:
        return json_response(
            Health(
                sessions=len(self.registry.all()),
                backend=self.engine.backend.name,
                model=self.engine.backend.model,
            )
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        """Prometheus's text format (polar_env/metrics.py), on the TCP listener only: the Unix
        socket is the sandboxes' way in, and an agent has no business reading the run's figures."""
        if not isinstance(request.transport.get_extra_info("sockname") if request.transport else None, tuple):
            return _error(404, f"unknown route {request.method} {request.path}", request)
        return web.Response(body=metrics.exposition(), headers={"Content-Type": metrics.CONTENT_TYPE})

    def _origin(self, request: web.Request, session: Session) -> CallOrigin | None:
        """Who made the call: the origin the sandbox's forwarder tagged it with, its key checked
        (sandbox/forwarder.py); in a session that expects tags, an untagged or forged call is
        ``unknown`` (a process that reached the socket without the forwarder); else None."""
        tag = request.headers.get(ORIGIN_HEADER, "")
        origin, _, key = tag.partition(" ")
        if (
            key
            and hmac.compare_digest(key.encode(), self.origin_key.encode())
            and origin in ("harness", "tool")
        ):
            return origin
        return "unknown" if session.info.metadata.get(ORIGIN_TAGGED) else None

    def _session(self, request: web.Request, key: str | None = None) -> Session:
        return self.registry.authenticate(request.match_info["sid"], key or _request_key(request))

    async def _read_json(self, request: web.Request, default: bytes = b"") -> Any:
        return await self._off_loop(await request.read(), parse_json_body, default)

    async def _off_loop(self, raw: bytes, parse: Callable[[bytes], T], default: bytes = b"") -> T:
        """``parse(raw)``, in a worker process for a large body: JSON, validation and the volatile
        rules over megabytes would otherwise hold /health and every other session (a thread would
        too: they hold the GIL)."""
        raw = raw or default
        if len(raw) < OFF_LOOP_BYTES:
            return parse(raw)
        return await self._parsers.run(parse, raw)

    async def _decode_call(
        self, session: Session, raw: bytes, decode: Callable[..., DecodedRequest]
    ) -> DecodedRequest:
        """A model call's body decoded, reusing what the session's last request already decoded
        (proxy/seen.py). Here, on the loop, when the body is small or only its new part is (a Chat
        Completions or Messages request growing by less than ``OFF_LOOP_BYTES`` since the last: its
        parse is one fast orjson pass); else whole in a worker process, which sends back the snapshot it
        made."""
        seen = session.seen
        if len(raw) < OFF_LOOP_BYTES or (
            seen.decoded is not None and len(raw) - seen.body_bytes < OFF_LOOP_BYTES
        ):
            return _decode(decode, raw, seen)
        decoded, session.seen = await self._parsers.run(partial(_decode_fresh, decode), raw)
        return decoded

    def _call(self, api: Api):
        module = API_MODULES[api]

        async def handler(request: web.Request) -> web.StreamResponse:
            return await self._model_call(request, api, module.decode)

        return handler

    async def _gemini(self, request: web.Request) -> web.StreamResponse:
        """``models/<model>:<method>``: the URL names the model and whether to stream; Gemini clients
        send the key as ``x-goog-api-key`` or ``?key=``."""
        gemini = gemini_generate_content
        try:
            model, method = gemini.parse_target(request.match_info["target"])
        except WireError as exc:
            return json_response(gemini.encode_error(exc.status, exc.message), status=exc.status)
        key = request.query.get("key")
        if method == "countTokens":
            return await self._count_tokens(
                request, gemini, partial(gemini.decode_count_tokens, model=model), key
            )
        stream, sse = method == "streamGenerateContent", request.query.get("alt") == "sse"
        return await self._model_call(
            request, "gemini", partial(gemini.decode, model=model, stream=stream, sse=sse), key
        )

    async def _model_call(
        self, request: web.Request, api: Api, decode: Callable[[Any], DecodedRequest], key: str | None = None
    ) -> web.StreamResponse:
        """One model call in ``api``'s shape: auth, decode, the engine, the answer (SSE when it streams)."""
        module = API_MODULES[api]
        try:
            session = self._session(request, key)
            decoded = await self._decode_call(session, await request.read(), decode)
            ticket = CallTicket.new()
            task = asyncio.ensure_future(
                self.engine.complete(session, api, decoded, self._origin(request, session), ticket)
            )
            self._track(session.id, task)
            if decoded.stream:  # a quick answer or failure keeps its own status line
                await asyncio.wait({task}, timeout=self.keepalive_s)
                if not task.done():
                    return await self._stream_while_generating(
                        request, module, decoded, session, task, ticket
                    )
            # shielded: a harness that disconnects does not cancel a call that is being recorded
            turn, _record = await asyncio.shield(task)
        except web.HTTPException:  # 413 and friends: the middleware answers them
            raise
        except Exception as exc:  # noqa: BLE001 - recorded by the engine; answered in the API's shape
            status, body = _failure(module, exc)
            return json_response(body, status=status)
        if not decoded.stream:
            return json_response(module.encode_response(turn, decoded))
        response = web.StreamResponse(headers=SSE_HEADERS)
        try:
            await response.prepare(request)
            for frame in module.encode_stream(turn, decoded):
                await response.write(frame)
            await response.write_eof()
        except ConnectionResetError:  # the call is recorded; only the harness is gone
            log.info(
                "session %s: client disconnected before the answer of call %s was sent",
                session.id,
                turn.call_id,
            )
        return response

    async def _stream_while_generating(
        self,
        request: web.Request,
        module: Codec,
        decoded: DecodedRequest,
        session: Session,
        task: asyncio.Task,
        ticket: CallTicket,
    ) -> web.StreamResponse:
        """Open the stream before the answer exists, with the API's opening events where it has
        them, and send its keep-alive every ``keepalive_s`` until the answer exists, so a slow
        generation never trips a harness's idle timeout; a failure from then on is the API's
        in-stream error event (the status line is already sent)."""
        response = web.StreamResponse(headers=SSE_HEADERS)
        head = module.encode_stream_head(
            decoded, ticket.call_id, decoded.model or self.engine.backend.model, int(ticket.created_at)
        )
        try:
            await response.prepare(request)
            for frame in head:
                await response.write(frame)
            while not task.done():
                await asyncio.wait({task}, timeout=self.keepalive_s)
                if not task.done():
                    await response.write(module.KEEPALIVE)
            try:
                turn, _record = task.result()
                frames = module.encode_stream(turn, decoded)[len(head) :]  # its head is sent already
            except Exception as exc:  # noqa: BLE001 - recorded by the engine; told in the API's shape
                frames = [module.encode_stream_error(_failure(module, exc)[1])]
            for frame in frames:
                await response.write(frame)
            await response.write_eof()
        except ConnectionResetError:  # the call goes on and is recorded; only the harness is gone
            log.info("session %s: client disconnected while its call was generating", session.id)
        return response

    async def _count_tokens(
        self,
        request: web.Request,
        module: CountingCodec = anthropic_messages,
        decode: Callable[[Any], DecodedRequest] = anthropic_messages.decode_count_tokens,
        key: str | None = None,
    ) -> web.Response:
        """The prompt's token count from the real chat template (Anthropic's and Gemini's count routes)."""
        try:
            self._session(request, key)
            decoded = await self._off_loop(await request.read(), partial(_decode, decode))
            count = await self.engine.count_tokens(decoded)
        except AuthError as exc:
            return json_response(module.encode_error(401, str(exc)), status=401)
        except WireError as exc:
            return json_response(module.encode_error(exc.status, exc.message), status=exc.status)
        except web.HTTPException:
            raise
        except Exception as exc:  # noqa: BLE001 - answered in the API's shape, never aiohttp's plain text
            log.exception("count_tokens failed in the proxy")
            return json_response(module.encode_error(500, f"proxy error: {type(exc).__name__}"), status=500)
        return json_response(module.encode_count(count))

    async def _models(self, request: web.Request) -> web.Response:
        try:
            self._session(request)
        except AuthError as exc:
            return _error(401, str(exc))
        model = self.engine.backend.model
        return json_response(ModelList(data=[ModelEntry.served_since(model, self.started_at)]))

    # -- admin ---------------------------------------------------------------------------------
    def _admin_ok(self, request: web.Request) -> bool:
        return hmac.compare_digest((_request_key(request) or "").encode(), self.admin_secret.encode())

    async def _admin_create(self, request: web.Request) -> web.Response:
        body = await self._admin_body(request, CreateSession)
        if isinstance(body, web.Response):
            return body
        try:
            sid, key = self.create_session(
                body.session_id,
                sampling=body.sampling,
                metadata=body.metadata.model_dump() if body.metadata else None,
                training=body.training,
                budget=body.budget,
            )
        except WireError as exc:
            return _error(exc.status, exc.message)
        except (ValueError, TypeError) as exc:
            return _error(400, str(exc))
        base = f"{request.scheme}://{request.host}"
        return json_response(
            SessionCreated(session_id=sid, api_key=key, urls=self.session_urls(sid, base)), status=201
        )

    async def _admin_list(self, request: web.Request) -> web.Response:
        if not self._admin_ok(request):
            return _error(401, "admin API requires the admin secret as Bearer token")
        return json_response([SessionView.of(s.info) for s in self.registry.all()])

    def _admin_session(self, request: web.Request) -> Session | web.Response:
        if not self._admin_ok(request):
            return _error(401, "admin API requires the admin secret as Bearer token")
        session = self.registry.get(request.match_info["sid"])
        return session if session is not None else _error(404, "unknown session")

    async def _admin_get(self, request: web.Request) -> web.Response:
        session = self._admin_session(request)
        if isinstance(session, web.Response):
            return session
        return json_response(SessionDetail.of(session.info, calls=len(session.calls)))

    async def _admin_close(self, request: web.Request) -> web.Response:
        session = self._admin_session(request)
        if isinstance(session, web.Response):
            return session
        body = await self._admin_body(request, CloseSession)
        if isinstance(body, web.Response):
            return body
        return json_response(SessionView.of(self.registry.close(session.id, body.status)))

    async def _admin_body(self, request: web.Request, model: type[M]) -> M | web.Response:
        """The admin request's body as ``model`` (an empty body: its defaults), or the 400/401 answer."""
        if not self._admin_ok(request):
            return _error(401, "admin API requires the admin secret as Bearer token")
        try:
            return model.model_validate(await self._read_json(request, b"{}"))
        except WireError as exc:
            return _error(exc.status, exc.message)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()
            )
            return _error(400, f"bad {request.path} body: {problems}")

    async def _admin_policy(self, request: web.Request) -> web.Response:
        """GET: the version served and the fence's state; POST ``{"version": N}``: set the version."""
        if request.method == "POST":
            body = await self._admin_body(request, PolicyVersion)
            if isinstance(body, web.Response):
                return body
            self.engine.fence.set_version(body.version)
        elif not self._admin_ok(request):
            return _error(401, "admin API requires the admin secret as Bearer token")
        return json_response(self.engine.fence.state())

    async def _admin_pause(self, request: web.Request) -> web.Response:
        """Close the weight-sync fence; answers once the calls in flight finished (504: they did not)."""
        body = await self._admin_body(request, PauseRequest)
        if isinstance(body, web.Response):
            return body
        report = await self.engine.fence.pause(body)
        return json_response(report, status=200 if report.drained else 504)

    async def _admin_resume(self, request: web.Request) -> web.Response:
        body = await self._admin_body(request, ResumeRequest)
        if isinstance(body, web.Response):
            return body
        window = self.engine.fence.resume(body.version)
        return json_response(Resumed(version=self.engine.fence.version, window=window))

    async def _admin_calls(self, request: web.Request) -> web.Response:
        session = self._admin_session(request)
        if isinstance(session, web.Response):
            return session
        records = self.registry.ledger.calls(session.id)
        return json_response(records)


def _decode(decode: Callable[..., DecodedRequest], raw: bytes, seen: Seen | None = None) -> DecodedRequest:
    """The request decoded (reusing what ``seen``, the session's last request, already decoded)
    with its messages' prefix hashes."""
    decoded = decode(parse_json_body(raw)) if seen is None else decode(parse_json_body(raw), seen=seen)
    if not decoded.conversation.messages:
        raise WireError(400, "the request holds no message for the model (only skipped or empty items)")
    if seen is not None:
        seen.body_bytes = len(raw)
        decoded.prefix_hashes = seen.hashes(decoded.conversation.messages)
    return decoded


def _decode_fresh(decode: Callable[..., DecodedRequest], raw: bytes) -> tuple[DecodedRequest, Seen]:
    """:func:`_decode` from nothing, in a worker process: the request and the snapshot it leaves
    (without the running hashes, which do not pickle; the next request starts them anew)."""
    seen = Seen()
    decoded = _decode(decode, raw, seen)
    seen.hashed = None
    return decoded, seen


def _error(status: int, message: str, request: web.Request | None = None) -> web.Response:
    """An error outside any model call, in the shape of the API the path belongs to (OpenAI's otherwise)."""
    path = request.path if request is not None else ""
    if "/messages" in path:
        encode = anthropic_messages.encode_error
    elif "/v1beta/" in path or "/models/" in path:
        encode = gemini_generate_content.encode_error
    else:
        encode = openai_error
    return json_response(encode(status, message), status=status)


def _forget_middleware_chains() -> None:
    """aiohttp caches each route's middleware chain in a module-level LRU cache (1,024 entries) keyed
    by the handler and the app: a stopped proxy's bound handlers keep it, its engine, ledger and
    backend (a local model's weights) alive for the process's life. Every proxy a process starts and
    stops (a ``polar train`` round, each test) then stays in memory, which is what made the test
    suite outgrow 24 GB in one process. Emptied at stop; a running app's chains are rebuilt on
    their next request."""
    from aiohttp import web_app

    cache = getattr(web_app, "_cached_build_middleware", None)
    if cache is not None and hasattr(cache, "cache_clear"):
        cache.cache_clear()
