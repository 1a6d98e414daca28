"""`polar proxy serve --workers N`: N proxy processes, each owning a share of the sessions.

One proxy process is CPU-bound on one core. Sessions share nothing (a session's chains, its key and
its ledger belong to it alone), so the layout past one core splits the sessions, not the calls: a
front process on ``--port`` serves the admin API and hands each new session to the worker holding
the fewest; that worker creates it, and the answer's ``urls`` point at the worker's own port
(``--port`` + 1 + K), where the harness then sends every call. Model calls never cross the front:
no second hop, no shared state, no lock between processes.

Each worker is a whole one-process proxy on ``DATA_DIR/worker-K`` (its own ledger), so what holds
for one process holds here: every call is on disk before its answer, a restart recovers each
worker's sessions from its directory, and an unknown session or a wrong key gets the same 401 from
every worker (a worker knows only its own sessions). The front answers model-call routes with a 404
naming where calls go, whatever the session, so it tells no one which sessions exist.

SO_REUSEPORT on one port would not do: the kernel spreads connections, not sessions, and one
keep-alive connection (a load balancer's, an SDK's pool) carries calls of many sessions, so each
worker would have to forward most calls to the owner, which is the hop this layout avoids.
"""

from __future__ import annotations

import asyncio
import ctypes
import hmac
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, cast

import aiohttp
from aiohttp import web
from pydantic import ValidationError
from yarl import URL

from polar_env import event_loop, fastjson
from polar_env.proxy.admin_api import Health, WorkerAnswer, WorkersAnswer, WorkersHealth
from polar_env.proxy.codecs.common import json_response
from polar_env.stop_signal import wait_for_stop_signal
from polar_env.wire.openai_errors import openai_error

log = logging.getLogger("polar.proxy.workers")
START_TIMEOUT_S = 300.0  # loading the tokenizer on a loaded machine takes a while
STOP_TIMEOUT_S = 60.0  # a worker finishes (and records) its calls in flight before it exits


class LayoutError(ValueError):
    """The data directory or the flags do not fit the layout asked for."""


class WorkerStartError(RuntimeError):
    """A worker exited, or did not listen in time, at start (its own error is on stderr above)."""


def worker_dir(data_dir: Path, index: int) -> Path:
    return Path(data_dir) / f"worker-{index}"


def check_data_dir(data_dir: Path, workers: int) -> None:
    """Refuse a data directory whose sessions this layout would not serve (they would look lost)."""
    data_dir = Path(data_dir)
    served = {worker_dir(data_dir, k).name for k in range(workers)} if workers > 1 else set()
    others = sorted(p.name for p in data_dir.glob("worker-*") if p.name not in served)
    if workers > 1 and (data_dir / "sessions").is_dir():
        raise LayoutError(
            f"{data_dir} holds the ledger of a one-process proxy: serve it without --workers, "
            "or give --workers another --data-dir"
        )
    if others:
        raise LayoutError(
            f"{data_dir} holds sessions of {', '.join(others)}, which --workers {workers} "
            f"would not serve: start with the --workers it was served with"
        )


def _die_with_parent(parent_pid: int) -> None:
    """SIGTERM this worker when the front dies, even by SIGKILL (Linux), so no orphan keeps its port."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the front died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _worker_main(build: Callable[[], Any], host: str, port: int, ready: Connection, parent_pid: int) -> None:
    _die_with_parent(parent_pid)
    event_loop.run(_worker(build, host, port, ready))


async def _worker(build: Callable[[], Any], host: str, port: int, ready: Connection) -> None:
    proxy = build()
    await proxy.start(host, port)
    ready.send(proxy.port)
    ready.close()
    await wait_for_stop_signal()
    await proxy.stop()


class Workers:
    """The worker processes (``spawn``: each imports afresh, nothing forked from the front's loop)."""

    def __init__(self, builds: list[Callable[[], Any]], host: str, ports: list[int]):
        context = multiprocessing.get_context("spawn")
        self.procs: list[BaseProcess] = []
        self._ready: list[Connection] = []
        for build, port in zip(builds, ports, strict=True):
            receive, send = context.Pipe(duplex=False)
            # started from the main thread: PR_SET_PDEATHSIG fires when the thread that forked exits
            proc = context.Process(
                target=_worker_main,
                args=(build, host, port, send, os.getpid()),
                name="polar-proxy-worker",
                daemon=False,
            )  # a worker starts parse processes
            proc.start()
            send.close()
            self.procs.append(proc)
            self._ready.append(receive)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> list[int]:
        """Each worker's port once it listens; a worker that exits first fails the start."""
        ports = []
        for k, (proc, ready) in enumerate(zip(self.procs, self._ready, strict=True)):
            if not ready.poll(timeout_s):
                raise WorkerStartError(f"proxy worker {k} did not start within {timeout_s:.0f} s")
            try:
                ports.append(ready.recv())
            except EOFError:
                proc.join(5)
                raise WorkerStartError(
                    f"proxy worker {k} exited at start (code {proc.exitcode}); its error is above"
                ) from None
        return ports

    def wait_any_exit(self) -> None:
        wait([p.sentinel for p in self.procs])

    def stop(self) -> None:
        """SIGTERM each worker (it finishes and records its calls in flight), then wait for all."""
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()  # SIGTERM
        for proc in self.procs:
            proc.join(STOP_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
                proc.join()


class Front:
    """The admin API of the layout: assigns sessions to workers and forwards the per-session routes
    to the worker that owns the session."""

    def __init__(self, worker_ports: list[int], host: str, admin_secret: str):
        local = "127.0.0.1" if host in ("", "0.0.0.0") else "::1" if host == "::" else host
        self.ports = worker_ports
        self.urls = [str(URL.build(scheme="http", host=local, port=p)) for p in worker_ports]
        self.admin_secret = admin_secret
        self.owner: dict[str, int] = {}  # session id -> worker index
        self.load = [0] * len(worker_ports)  # sessions assigned to each worker
        self.http: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        """Learn which worker holds which recovered session (each lists its own)."""
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        )
        for k, url in enumerate(self.urls):
            async with self.http.get(f"{url}/admin/sessions", headers=self._auth()) as resp:
                resp.raise_for_status()
                for info in fastjson.loads(await resp.read()):
                    self.owner[info["session_id"]] = k
                    self.load[k] += 1

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=2**20)
        r = app.router
        r.add_get("/", self._health)
        r.add_get("/health", self._health)
        r.add_post("/admin/sessions", self._create)
        r.add_get("/admin/sessions", self._list)
        r.add_get("/admin/sessions/{sid}", self._owned)
        r.add_post("/admin/sessions/{sid}/close", self._owned)
        r.add_get("/admin/sessions/{sid}/calls", self._owned)
        for path in ("/admin/policy", "/admin/pause", "/admin/resume"):  # every worker's fence at once
            r.add_post(path, self._everywhere)
        r.add_get("/admin/policy", self._everywhere)
        r.add_route("*", "/{tail:.*}", self._elsewhere)
        return app

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_secret}"}

    def _admin_ok(self, request: web.Request) -> bool:
        auth = request.headers.get("Authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
        return hmac.compare_digest(key.encode(), self.admin_secret.encode())

    async def _forward(self, k: int, request: web.Request, body: bytes = b"") -> web.Response:
        """The request, answered by worker ``k``; the Host it sees names the worker's port on the
        host the client used, so the session urls it answers with reach that worker."""
        public = URL.build(scheme=request.scheme, authority=request.host).with_port(self.ports[k])
        headers = {
            **self._auth(),
            "Host": str(public.origin()).split("://", 1)[1],
            "Content-Type": "application/json",
        }
        assert self.http is not None
        async with self.http.request(
            request.method, self.urls[k] + request.path_qs, data=body, headers=headers
        ) as resp:
            return web.Response(body=await resp.read(), status=resp.status, content_type=resp.content_type)

    async def _create(self, request: web.Request) -> web.Response:
        if not self._admin_ok(request):
            return _error(401, "admin API requires the admin secret as Bearer token")
        body = await request.read()
        try:
            parsed = fastjson.loads(body or b"{}")
        except ValueError:
            parsed = None  # the worker answers it with its own 400
        sid = parsed.get("session_id") if isinstance(parsed, dict) else None
        sid = sid if isinstance(sid, str) else None
        k = self.owner.get(sid) if sid else None  # a taken id goes to its owner, which refuses it
        assigned = k is None
        if assigned:  # counted before the await, so a burst of creates is spread too
            k = self.load.index(min(self.load))
            self.load[k] += 1
            if sid is not None:
                self.owner[sid] = k  # a concurrent create of the same id goes to the same worker
        response = await self._forward(k, request, body)
        if response.status == 201:
            self.owner[_json(response)["session_id"]] = k
        elif assigned:
            self.load[k] -= 1
            if sid is not None and self.owner.get(sid) == k:
                del self.owner[sid]
        return response

    async def _list(self, request: web.Request) -> web.Response:
        if not self._admin_ok(request):
            return _error(401, "admin API requires the admin secret as Bearer token")
        sessions: list[Any] = []
        for k in range(len(self.urls)):
            response = await self._forward(k, request)
            if response.status != 200:
                return response
            sessions.extend(_json(response))
        return web.Response(body=fastjson.dumps(sessions), content_type="application/json")

    async def _owned(self, request: web.Request) -> web.Response:
        if not self._admin_ok(request):
            return _error(401, "admin API requires the admin secret as Bearer token")
        k = self.owner.get(request.match_info["sid"])
        if k is None:
            return _error(404, "unknown session")
        return await self._forward(k, request, await request.read())

    async def _everywhere(self, request: web.Request) -> web.Response:
        """The policy version and the weight-sync fence are per worker: the request goes to each (at
        once: a pause drains them in parallel); the answer lists theirs, with the worst status."""
        if not self._admin_ok(request):
            return _error(401, "admin API requires the admin secret as Bearer token")
        body = await request.read()
        answers = await asyncio.gather(*(self._forward(k, request, body) for k in range(len(self.urls))))
        status = max(a.status for a in answers)
        workers = [
            WorkerAnswer(url=url, status=a.status, answer=_json(a) if a.body else None)
            for url, a in zip(self.urls, answers, strict=True)
        ]
        return json_response(WorkersAnswer(workers=workers), status)

    async def _health(self, request: web.Request) -> web.Response:
        assert self.http is not None
        workers: list[WorkerAnswer] = []
        sessions, ok = 0, True
        for url in self.urls:
            try:
                async with self.http.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=10)) as resp:
                    health = Health.model_validate_json(await resp.read())
                    workers.append(WorkerAnswer(url=url, status=resp.status, answer=health.model_dump()))
                    sessions += health.sessions
                    ok = ok and resp.status == 200
            except (aiohttp.ClientError, TimeoutError, ValidationError) as exc:
                workers.append(WorkerAnswer(url=url, status=f"unreachable: {type(exc).__name__}"))
                ok = False
        return json_response(
            WorkersHealth(status="ok" if ok else "degraded", sessions=sessions, workers=workers),
            200 if ok else 503,
        )

    async def _elsewhere(self, request: web.Request) -> web.Response:
        if request.path.startswith("/s/"):
            return _error(
                404,
                f"this port is the admin front of {len(self.urls)} proxy workers: send model calls to "
                "the session's own urls (the answer of POST /admin/sessions)",
            )
        return _error(404, f"unknown route {request.method} {request.path}")


def _json(answer: web.Response) -> Any:
    """A worker's JSON answer, as `_forward` holds it (its body: the bytes the worker sent)."""
    return fastjson.loads(cast(bytes, answer.body))


def _error(status: int, message: str) -> web.Response:
    return json_response(openai_error(status, message), status)


async def serve(
    builds: list[Callable[[], Any]],
    *,
    host: str,
    port: int,
    admin_secret: str,
    on_listening: Callable[[str, list[str]], None],
) -> int:
    """Run the front on ``port`` and one worker per ``builds`` entry (each a picklable callable that
    returns a ProxyServer) on ``port`` + 1 + K, ephemeral ports when ``port`` is 0, until SIGINT or
    SIGTERM, or until a worker exits (then the others are stopped too and 1 is returned: a restart
    recovers every session)."""
    ports = [port + 1 + k if port else 0 for k in range(len(builds))]
    workers = Workers(builds, host, ports)
    front = None
    runner = None
    try:
        worker_ports = await asyncio.to_thread(workers.wait_ready)
        front = Front(worker_ports, host, admin_secret)
        await front.open()
        runner = web.AppRunner(front.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port, backlog=4096)
        await site.start()
        front_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        on_listening(
            str(URL.build(scheme="http", host=host, port=front_port)),
            [str(URL.build(scheme="http", host=host, port=p)) for p in worker_ports],
        )
        stop = asyncio.ensure_future(wait_for_stop_signal())
        exited = asyncio.ensure_future(asyncio.to_thread(workers.wait_any_exit))
        await asyncio.wait({stop, exited}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if exited.done():
            codes = {k: p.exitcode for k, p in enumerate(workers.procs) if not p.is_alive()}
            log.error(
                "proxy worker(s) exited (index: exit code) %s: stopping the others; a restart "
                "recovers every session",
                codes,
            )
            print(f"polar proxy: worker(s) exited {codes}; stopping", file=sys.stderr, flush=True)
            return 1
        return 0
    finally:
        if runner is not None:
            await runner.cleanup()
        if front is not None:
            await front.close()
        await asyncio.to_thread(workers.stop)
