"""`polar proxy serve`: the proxy as a standalone server in front of any backend."""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

from pydantic import ValidationError

from polar_env import event_loop
from polar_env.cli.settings import add_proxy_arguments, add_settings_argument, settings_from_args
from polar_env.proxy.app import ProxyServer
from polar_env.proxy.settings import ProxySettings, admin_secret, build_proxy
from polar_env.proxy.workers import LayoutError, WorkerStartError, check_data_dir, serve, worker_dir
from polar_env.stop_signal import wait_for_stop_signal


class ServeSettings(ProxySettings):
    """`polar proxy serve`: the proxy's settings and where it listens and keeps its ledger."""

    host: str = "127.0.0.1"
    port: int = 8787
    workers: int = 1  # proxy processes, each owning a share of the sessions (docs/proxy.md)
    unix_socket: Path | None = None  # also listen on this Unix socket (one process only)
    data_dir: Path = Path("runs/proxy")  # the ledger; a restart on the same directory recovers every session


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Serve OpenAI Chat Completions, OpenAI Responses and Anthropic Messages at "
        "/s/<session>/v1/... in front of an inference backend, recording every call token by "
        "token. Create sessions with POST /admin/sessions (Bearer admin secret); each "
        "harness then uses its session key as its API key."
    )
    d = ServeSettings()
    add_settings_argument(parser, ServeSettings)
    add_proxy_arguments(parser, d)
    parser.add_argument("--host", default=d.host)
    parser.add_argument("--port", type=int, default=d.port)
    parser.add_argument(
        "--workers",
        type=int,
        default=d.workers,
        help="proxy processes, each owning a share of the sessions (docs/proxy.md): the admin "
        "API on --port, worker K on --port + 1 + K, its ledger in DATA_DIR/worker-K",
    )
    parser.add_argument(
        "--unix-socket", type=Path, default=d.unix_socket, help="also listen on this Unix socket"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=d.data_dir,
        help="ledger directory; a restart on the same directory recovers every session "
        "(the admin secret, unless given, is generated into DATA_DIR/admin_secret)",
    )


def _build(settings: ServeSettings) -> ProxyServer:
    """One proxy process over ``settings.data_dir`` (a worker's: picklable, built in the worker)."""
    secret = admin_secret(settings, settings.data_dir / "admin_secret")
    return build_proxy(settings, data_dir=settings.data_dir, admin_secret=secret)


async def _serve(args: ServeSettings) -> int:
    if args.workers > 1:
        return await _serve_workers(args)
    proxy = _build(args)
    await proxy.start(args.host, args.port, args.unix_socket)
    where = proxy.base_url + (f" and unix:{proxy.unix_socket}" if proxy.unix_socket else "")
    print(
        f"polar proxy listening on {where}; backend={proxy.engine.backend.name} "
        f"model={proxy.engine.backend.model}; admin secret in {args.data_dir}/admin_secret "
        f"unless POLAR_ADMIN_SECRET is set",
        flush=True,
    )
    await wait_for_stop_signal()
    await proxy.stop()
    return 0


async def _serve_workers(args: ServeSettings) -> int:
    secret = admin_secret(args, args.data_dir / "admin_secret")
    builds = [
        partial(
            _build, args.model_copy(update={"data_dir": worker_dir(args.data_dir, k), "admin_secret": secret})
        )
        for k in range(args.workers)
    ]

    def listening(front: str, workers: list[str]) -> None:
        print(
            f"polar proxy listening on {front} (admin API; {len(workers)} workers: {' '.join(workers)}); "
            f"backend={args.backend}; admin secret in {args.data_dir}/admin_secret unless POLAR_ADMIN_SECRET "
            "is set",
            flush=True,
        )

    return await serve(builds, host=args.host, port=args.port, admin_secret=secret, on_listening=listening)


def run(parsed: argparse.Namespace) -> int:
    try:
        args = settings_from_args(ServeSettings, parsed)
        if args.workers < 1:
            raise LayoutError("--workers must be at least 1")
        if args.workers > 1 and args.unix_socket is not None:
            raise LayoutError("--unix-socket serves one process: use it without --workers")
        check_data_dir(args.data_dir, args.workers)
    except (LayoutError, ValidationError) as exc:
        print(f"polar proxy serve: error: {exc}", file=sys.stderr)
        return 2
    try:
        return event_loop.run(_serve(args))
    except WorkerStartError as exc:
        print(f"polar proxy serve: error: {exc}", file=sys.stderr)
        return 1
