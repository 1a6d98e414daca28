"""What every HTTP inference backend shares: base-URL choice, one aiohttp session, error mapping.

A backend may be given several base URLs (data-parallel servers). Calls of one session go to the
same server, so its prefix cache keeps the growing conversation; calls without a session id are
spread round-robin. Failures become ``BackendError``; ``retryable`` is true only where sending
the same request again can succeed (connection errors, timeouts, 5xx, 408, 429, a garbled body).
Retrying is the caller's choice, with one exception made here: a pooled keep-alive connection the
server closed just as it was reused is retried once at once (seen with vLLM's uvicorn, which drops
idle connections after 5 s).

Where a server reports which weights it serves (``version_path``: vLLM's ``GET /weight_info``, there
when it runs with ``VLLM_SERVER_DEV_MODE=1``, which its weight-sync API needs too), the label is read
before and after each generation: a trainer that swaps weights need not tell the proxy anything. A
server without the route (404) is not asked again; a label it cannot give this once leaves the call
unversioned, never failed.

A server's refusal of a prompt as too long (vLLM's 400 "maximum context length is N tokens",
SGLang's "longer than the model's context length") is a ``ContextOverflow``, not a failure: the
harness must see its API's own overflow error. The context window itself is what the server's
``/v1/models`` reports as ``max_model_len`` (vLLM and SGLang both do).
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import re
import zlib
from collections.abc import Sequence
from typing import Any

import aiohttp

from polar_env import fastjson
from polar_env.backends.base import BackendError, ContextOverflow
from polar_env.backends.ids_json import dumps_body

log = logging.getLogger(__name__)
_ERROR_EXCERPT = 500
JSON_HEADERS = {"Content-Type": "application/json"}
KEEPALIVE_S = 3.0
# how inference servers word "the prompt does not fit"; the group, where present, is the window
OVERFLOW_PATTERNS = (
    re.compile(r"maximum context length is (\d+) tokens"),  # vLLM (and OpenAI)
    re.compile(r"longer than the model's context length \((\d+) tokens\)"),  # SGLang
    re.compile(r"exceeds the context window"),
)


def overflow_window(text: str) -> int | None | bool:
    """The window named in a server's context-length refusal; True when it names none; False when
    ``text`` is no such refusal."""
    for pattern in OVERFLOW_PATTERNS:
        match = pattern.search(text)
        if match:
            return int(match.group(1)) if match.groups() else True
    return False


def normalize_base_url(url: str) -> str:
    """Strip a trailing ``/`` and ``/v1``: the OpenAI convention names the API root, we add paths."""
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"backend URL must start with http:// or https://: {url!r}")
    return url


class RemoteBackend:
    """Base of the HTTP backends; subclasses set ``name`` and implement ``generate``."""

    name: str = "remote"
    version_path: str | None = None  # GET -> {"weight_version": label}: the weights the server serves now
    prompt_key: str | None = None  # the request body's field holding the prompt's token ids

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        model: str = "",
        timeout_s: float = 600.0,
        api_key: str | None = None,
    ):
        urls = [url] if isinstance(url, str) else list(url)
        if not urls:
            raise ValueError(f"{self.name} backend needs at least one URL")
        self.urls = [normalize_base_url(u) for u in urls]
        self.model = model
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(30.0, timeout_s))
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._round_robin = itertools.count()
        self._session: aiohttp.ClientSession | None = None
        self._window: int | None = None
        self._window_asked = False
        self._unversioned: set[str] = set()  # servers that answered version_path with 404/405

    def pick_url(self, session_id: str | None = None) -> str:
        """The same server for every call of a session; round-robin for calls without one."""
        if len(self.urls) == 1:
            return self.urls[0]
        if session_id:
            return self.urls[zlib.crc32(session_id.encode()) % len(self.urls)]
        return self.urls[next(self._round_robin) % len(self.urls)]

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # idle connections are dropped before uvicorn's 5 s keep-alive closes them (vLLM's default)
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
            )
        return self._session

    async def post_json(self, base_url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` and return the decoded JSON object, or raise ``BackendError``."""
        where = f"{self.name} {base_url}{path}"
        payload = dumps_body(body, self.prompt_key)  # many thousand ids: orjson, each id of a chain once
        for attempt in (1, 2):
            try:
                async with self._client().post(
                    base_url + path, data=payload, headers=JSON_HEADERS
                ) as response:
                    raw = await response.read()
                    status = response.status
                break
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
                # a pooled connection the server closed as we reused it: sending again is safe
                # (a generation is just sampled anew), and a second failure is a real one
                stale = isinstance(e, aiohttp.ServerDisconnectedError) or e.errno in (
                    errno.ECONNRESET,
                    errno.EPIPE,
                )
                if attempt == 2 or not stale:
                    raise BackendError(f"{where}: {type(e).__name__}: {e}", retryable=True) from e
            except TimeoutError as e:
                raise BackendError(f"{where}: timed out", retryable=True) from e
            except aiohttp.ClientError as e:
                raise BackendError(f"{where}: {type(e).__name__}: {e}", retryable=True) from e
        else:  # the second attempt breaks or raises
            raise AssertionError(where)
        if status >= 400:
            text = raw.decode("utf-8", errors="replace")
            if status in (400, 413) and (window := overflow_window(text)) is not False:
                raise ContextOverflow(
                    0,
                    None if window is True else window,  # the engine knows the prompt length
                    f"{where}: {text[:_ERROR_EXCERPT]}",
                )
            raise BackendError(
                f"{where}: HTTP {status}: {text[:_ERROR_EXCERPT]}",
                retryable=status >= 500 or status in (408, 429),
                status=status,
            )
        try:
            reply = fastjson.loads(raw)
        except ValueError as e:
            excerpt = raw[:_ERROR_EXCERPT].decode("utf-8", errors="replace")
            raise BackendError(
                f"{where}: invalid JSON in reply: {excerpt!r}", retryable=True, status=status
            ) from e
        if not isinstance(reply, dict):
            excerpt = raw[:_ERROR_EXCERPT].decode("utf-8", errors="replace")
            raise BackendError(f"{where}: reply is not a JSON object: {excerpt!r}", status=status)
        return reply

    async def served_version(self, base_url: str) -> str | None:
        """The label of the weights ``base_url`` serves now (``version_path``), or None where it gives
        none."""
        if self.version_path is None or base_url in self._unversioned:
            return None
        try:
            async with self._client().get(base_url + self.version_path) as response:
                if response.status in (404, 405):
                    self._unversioned.add(base_url)
                    log.info(
                        "%s %s reports no weight version (%s %d): calls are unversioned unless a trainer "
                        "sets the version",
                        self.name,
                        base_url,
                        self.version_path,
                        response.status,
                    )
                    return None
                payload = await response.json(content_type=None) if response.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("%s %s: could not read the weight version: %s", self.name, base_url, exc)
            return None
        label = payload.get("weight_version") if isinstance(payload, dict) else None
        return str(label) if isinstance(label, str | int) and not isinstance(label, bool) else None

    async def max_model_len(self) -> int | None:
        """``max_model_len`` from the first server's ``/v1/models``, asked once; None if it says none."""
        if not self._window_asked:
            self._window_asked = True
            try:
                async with self._client().get(self.urls[0] + "/v1/models") as response:
                    payload = await response.json(content_type=None) if response.status == 200 else {}
                models = payload.get("data") if isinstance(payload, dict) else None
                lengths = [m.get("max_model_len") for m in models or [] if isinstance(m, dict)]
                self._window = next((n for n in lengths if isinstance(n, int) and n > 0), None)
            except (aiohttp.ClientError, TimeoutError, ValueError):
                self._window = None
        return self._window

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def malformed(backend: str, what: str, payload: Any) -> BackendError:
    """A reply that parsed but lacks what the wire contract promises: a bug, not worth a retry."""
    return BackendError(f"{backend}: malformed reply ({what}): {json.dumps(payload)[:_ERROR_EXCERPT]}")


def as_token_ids(value: Any) -> list[int] | None:
    """``value`` as a list of ints, or None when it is not one (bools are not token ids)."""
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return None
    return value


def aligned_logprobs(logprobs: list[float] | None, token_ids: list[int]) -> list[float]:
    """The logprobs when there is one per sampled token, else ``[]``: the sampled ids are still the
    answer (the harness gets it), but the turn is context, never a target (loss mask 0; OpenEnv RFC 006),
    and the engine flags the call ``logprobs_unaligned``."""
    return logprobs if logprobs is not None and len(logprobs) == len(token_ids) else []


def as_logprobs(value: Any) -> list[float] | None:
    """``value`` as a list of floats, or None when any entry is missing or not a number."""
    if not isinstance(value, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in value
    ):
        return None
    return [float(x) for x in value]
