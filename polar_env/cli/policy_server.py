"""A stand-in policy server for CI and laptops: vLLM's ``/v1/completions`` wire over a Polar backend.

NeMo Gym gives the agent a policy base URL; in training that is NeMo-RL's vLLM. Locally this
server plays that part so the agent's unmodified ``vllm`` backend has something real to talk to:
token ids in (``prompt`` as a list of ids), token ids and per-token logprobs out
(``choices[0].token_ids``, ``logprobs.token_logprobs``), exactly the fields the vllm backend reads.

Backends: ``local`` (the embedded SmolLM2 sampling for real) or ``scripted`` with a named policy
whose text the real model scores. The ``gold`` policy makes CI deterministic and still exercises
everything: on its first call it answers with a bash tool call that applies the task's gold patch
(found by the problem statement in the prompt), then a final message once a tool result is in.

The weights' version is served as vLLM serves it to a trainer that syncs weights (its RL API):
``GET /weight_info`` reports the label (``default`` until one is set), ``POST /update_weight_version``
``{"new_version": "7"}`` sets it, so the proxy's version reading is tested against this server's wire
as against vLLM's own.

    polar policy-server --backend scripted --policy gold --port 8011
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from pathlib import Path

from aiohttp import web

from polar_env.backends.base import Backend, BackendError, SamplingParams
from polar_env.backends.vllm import completion_choice
from polar_env.harness_adapters.policies import POLICIES, Policy, make_policy
from polar_env.stop_signal import wait_for_stop_signal


def gold_policy(tasks_spec: str = "bundled") -> Policy:
    """The shared gold-replay policy over ``tasks_spec`` (polar_env/harness_adapters/policies.py)."""
    from polar_env.tasks.loader import load_tasks

    return make_policy("gold", load_tasks(tasks_spec))


class PolicyServer:
    """aiohttp app: ``POST /v1/completions``, ``GET /v1/models``, ``GET /health``, and vLLM's
    ``GET /weight_info`` / ``POST /update_weight_version``."""

    def __init__(self, backend: Backend, *, model_name: str):
        self.backend = backend
        self.model_name = model_name
        self.weight_version = "default"  # vLLM's label before a trainer sets one
        self.requests = 0
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/weight_info", self._weight_info)
        app.router.add_post("/update_weight_version", self._update_weight_version)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _weight_info(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": self.weight_version})

    async def _update_weight_version(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "body must be JSON")
        version = body.get("new_version") if isinstance(body, dict) else None
        if not isinstance(version, str) or not version:
            return _error(422, "new_version must be a non-empty string")
        self.weight_version = version
        return web.json_response({"success": True, "new_version": version})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model_name, "object": "model"}]})

    async def _completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = body.get("prompt")
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            return _error(400, "prompt must be a non-empty list of token ids")
        try:
            sampling = SamplingParams(
                temperature=body.get("temperature", 1.0),
                top_p=body.get("top_p", 1.0),
                max_tokens=body.get("max_tokens") or 256,
                stop_token_ids=body.get("stop_token_ids") or [],
                seed=body.get("seed"),
            )
        except ValueError as exc:
            return _error(400, f"bad sampling parameters: {exc}")
        self.requests += 1
        try:
            gen = await self.backend.generate(prompt, sampling)
        except BackendError as exc:
            return _error(exc.status or 500, str(exc))
        return web.json_response(
            {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": body.get("model") or self.model_name,
                "choices": [completion_choice(body, gen.token_ids, gen.logprobs, gen.finish_reason)],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(gen.token_ids),
                    "total_tokens": len(prompt) + len(gen.token_ids),
                },
            }
        )


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)


def build_backend(kind: str, policy: str, tasks: str, model_dir: Path | None, context_window: int) -> Backend:
    from polar_env.backends.embedded import embedded_model_dir
    from polar_env.backends.local import LocalBackend

    local = LocalBackend.from_pretrained(model_dir or embedded_model_dir())
    if kind == "local":
        return local
    from polar_env.backends.scripted import ScriptedBackend
    from polar_env.tasks.loader import load_tasks

    return ScriptedBackend(local, make_policy(policy, load_tasks(tasks)), context_window=context_window)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (__doc__ or "").splitlines()[0]
    parser.add_argument("--backend", choices=["local", "scripted"], default="scripted")
    parser.add_argument("--policy", choices=sorted(POLICIES), default="gold", help="scripted policy")
    parser.add_argument("--tasks", default="bundled", help="task set the gold policy looks answers up in")
    parser.add_argument(
        "--model-dir", type=Path, default=None, help="HF model dir (default: embedded SmolLM2)"
    )
    parser.add_argument("--model-name", default="polar-policy")
    parser.add_argument("--context-window", type=int, default=256, help="scripted: prompt tokens scored")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011)


def run(args: argparse.Namespace) -> int:

    async def serve() -> None:
        backend = build_backend(args.backend, args.policy, args.tasks, args.model_dir, args.context_window)
        server = PolicyServer(backend, model_name=args.model_name)
        await server.start(args.host, args.port)
        print(
            f"policy server ready on http://{args.host}:{server.port} ({args.backend}/{args.policy})",
            flush=True,
        )
        await wait_for_stop_signal()
        await server.stop()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":  # the same as `polar policy-server ...`
    import sys

    from polar_env.cli import main

    raise SystemExit(main(["policy-server", *sys.argv[1:]]))
