"""`polar proxy serve`: the proxy as a standalone server in front of any backend."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from functools import partial
from pathlib import Path

from polar_env import event_loop
from polar_env.proxy.app import DEFAULT_MAX_BODY, ProxyServer
from polar_env.proxy.engine import EngineConfig, add_agent_calls_argument, add_thinking_arguments
from polar_env.proxy.workers import LayoutError, WorkerStartError, check_data_dir, serve, worker_dir
from polar_env.stop_signal import wait_for_stop_signal


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Serve OpenAI Chat Completions, OpenAI Responses and Anthropic Messages at "
                          "/s/<session>/v1/... in front of an inference backend, recording every call token by "
                          "token. Create sessions with POST /admin/sessions (Bearer admin secret); each "
                          "harness then uses its session key as its API key.")
    parser.add_argument("--backend", default="local",
                        choices=["local", "vllm", "nemo-rl", "sglang", "instant"],
                        help="inference backend (default: local in-process transformers model)")
    parser.add_argument("--url", action="append", default=[],
                        help="backend base URL (repeat to spread sessions over several servers)")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="HF model/tokenizer dir used for chat templates (default: the embedded SmolLM2)")
    parser.add_argument("--model-name", default=None, help="model name sent to the backend")
    parser.add_argument("--tool-format", choices=["hermes", "qwen3_coder"], default=None,
                        help="tool-call format of the model's output (default: from the template)")
    add_thinking_arguments(parser)
    add_agent_calls_argument(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8787)
    parser.add_argument("--workers", type=int, default=1,
                        help="proxy processes, each owning a share of the sessions (docs/proxy.md): the admin "
                             "API on --port, worker K on --port + 1 + K, its ledger in DATA_DIR/worker-K")
    parser.add_argument("--unix-socket", type=Path, default=None, help="also listen on this Unix socket")
    parser.add_argument("--data-dir", type=Path, default=Path("runs/proxy"),
                        help="ledger directory; a restart on the same directory recovers every session")
    parser.add_argument("--admin-secret", default=os.environ.get("POLAR_ADMIN_SECRET"),
                        help="secret for /admin (env POLAR_ADMIN_SECRET; generated into DATA_DIR/admin_secret if unset)")
    parser.add_argument("--max-context", type=int, default=None,
                        help="context window to enforce (default: the backend's own, e.g. vLLM's max_model_len)")
    parser.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY / 2**20)
    parser.add_argument("--fsync", action="store_true", help="fsync every ledger append (power-loss safe)")
    parser.add_argument("--verify-prompt-echo", action="store_true",
                        help="vllm backend: have the server echo every prompt's ids and compare them id by id "
                             "(debugging; by default its prompt token count is checked)")


def build_proxy(args: argparse.Namespace) -> ProxyServer:
    from polar_env.backends.embedded import embedded_model_dir
    from polar_env.backends.registry import make_backend
    from polar_env.chat.template import ChatRenderer

    model_dir = args.model_dir or embedded_model_dir()
    renderer = ChatRenderer.from_pretrained(model_dir, tool_format=args.tool_format,
                                            enable_thinking=args.enable_thinking)
    opts: dict = {}
    if args.verify_prompt_echo:
        if args.backend != "vllm":
            raise SystemExit("--verify-prompt-echo applies to --backend vllm only")
        opts["verify_prompt_echo"] = True
    if args.backend == "instant":  # a fixed short answer: measures the proxy alone (load, crash tests)
        opts["token_ids"] = renderer.tokenizer.encode("OK", add_special_tokens=False) + renderer.eos_token_ids[:1]
    backend = make_backend(args.backend, url=args.url or None, model=args.model_name or model_dir.name,
                           model_dir=model_dir, **opts)
    return ProxyServer.create(renderer=renderer, backend=backend, data_dir=args.data_dir,
                              admin_secret=_admin_secret(args), config=EngineConfig(max_context=args.max_context,
                                                                                   history_thinking=args.history_thinking,
                                                                                   agent_calls=args.agent_calls),
                              fsync=args.fsync, max_body_bytes=int(args.max_body_mb * 2**20))


def _admin_secret(args: argparse.Namespace) -> str:
    if args.admin_secret:
        return args.admin_secret
    path = Path(args.data_dir) / "admin_secret"
    secret = path.read_text().strip() if path.exists() else ""
    if not secret:  # missing, or left empty by a crash between create and write
        path.parent.mkdir(parents=True, exist_ok=True)
        secret = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # never readable by others
        with os.fdopen(fd, "w") as handle:
            handle.write(secret)
    return secret


async def _serve(args: argparse.Namespace) -> int:
    if args.workers > 1:
        return await _serve_workers(args)
    proxy = build_proxy(args)
    await proxy.start(args.host, args.port, args.unix_socket)
    where = proxy.base_url + (f" and unix:{proxy.unix_socket}" if proxy.unix_socket else "")
    print(f"polar proxy listening on {where}; backend={proxy.engine.backend.name} "
          f"model={proxy.engine.backend.model}; admin secret in {args.data_dir}/admin_secret "
          f"unless POLAR_ADMIN_SECRET is set", flush=True)
    await wait_for_stop_signal()
    await proxy.stop()
    return 0


async def _serve_workers(args: argparse.Namespace) -> int:
    secret = _admin_secret(args)
    builds = [partial(build_proxy, argparse.Namespace(**{**vars(args), "data_dir": worker_dir(args.data_dir, k),
                                                         "admin_secret": secret, "run": None}))
              for k in range(args.workers)]

    def listening(front: str, workers: list[str]) -> None:
        print(f"polar proxy listening on {front} (admin API; {len(workers)} workers: {' '.join(workers)}); "
              f"backend={args.backend}; admin secret in {args.data_dir}/admin_secret unless POLAR_ADMIN_SECRET "
              "is set", flush=True)

    return await serve(builds, host=args.host, port=args.port, admin_secret=secret, on_listening=listening)


def run(args: argparse.Namespace) -> int:
    try:
        if args.workers < 1:
            raise LayoutError("--workers must be at least 1")
        if args.workers > 1 and args.unix_socket is not None:
            raise LayoutError("--unix-socket serves one process: use it without --workers")
        check_data_dir(args.data_dir, args.workers)
    except LayoutError as exc:
        print(f"polar proxy serve: error: {exc}", file=sys.stderr)
        return 2
    try:
        return event_loop.run(_serve(args))
    except WorkerStartError as exc:
        print(f"polar proxy serve: error: {exc}", file=sys.stderr)
        return 1
