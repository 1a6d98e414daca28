"""Server processes the benchmarks talk to over real HTTP on 127.0.0.1.

``backend``: an OpenAI-compatible server that answers ``/v1/chat/completions`` (text, for the
direct path and LiteLLM) and vLLM-style ``/v1/completions`` (token ids in, token ids and logprobs
out, shaped by the request's flags as vLLM shapes them, for Polar's ``vllm`` backend). With
``--instant`` it answers at once with a fixed completion, so only proxy cost is measured; with
``--local`` it runs the embedded SmolLM2 greedily. ``proxy``: Polar's proxy in front of either
(``--workers N``: N proxy processes behind an admin front, as ``polar proxy serve --workers N``).
Each prints ``READY <port>`` on stdout once listening and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from aiohttp import web
from yarl import URL

from bench.common import ADMIN_SECRET, ANSWER_TEXT
from polar_env import event_loop, fastjson
from polar_env.backends.vllm import completion_choice
from polar_env.stop_signal import wait_for_stop_signal


class BenchBackend:
    """Answers both wire shapes; ``generate(ids, max_tokens)`` -> (sampled ids, logprobs, text)."""

    def __init__(self, answer_ids: list[int] | None = None, local: Any = None, renderer: Any = None):
        self.answer_ids = answer_ids or []
        self.local = local
        self.renderer = renderer

    async def _generate(self, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], list[float], str]:
        if self.local is None:
            ids = self.answer_ids[:max_tokens]
            return ids, [-0.5] * len(ids), ANSWER_TEXT
        from polar_env.backends.base import SamplingParams

        gen = await self.local.generate(
            prompt_ids,
            SamplingParams(
                temperature=0.0, max_tokens=max_tokens, stop_token_ids=self.renderer.eos_token_ids
            ),
        )
        return gen.token_ids, gen.logprobs, self.renderer.parse_output(gen.token_ids).content

    async def chat(self, request: web.Request) -> web.Response:
        body = fastjson.loads(await request.read())
        if self.local is None:
            prompt_ids: list[int] = []
        else:
            from polar_env.chat.messages import Message

            prompt_ids = self.renderer.render_prompt(
                [Message(role=m["role"], content=m.get("content") or "") for m in body["messages"]], []
            )
        ids, _, text = await self._generate(prompt_ids, int(body.get("max_tokens") or 64))
        return _json(
            {
                "id": "chatcmpl-bench",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "bench"),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                ],
                "usage": {
                    "prompt_tokens": len(prompt_ids),
                    "completion_tokens": len(ids),
                    "total_tokens": len(prompt_ids) + len(ids),
                },
            }
        )

    async def completions(self, request: web.Request) -> web.Response:
        body = fastjson.loads(await request.read())
        prompt = body["prompt"]
        ids, logprobs, text = await self._generate(prompt, int(body.get("max_tokens") or 64))
        return _json(
            {
                "id": "cmpl-bench",
                "object": "text_completion",
                "created": int(time.time()),
                "model": body.get("model", "bench"),
                "choices": [completion_choice(body, ids, logprobs, "stop", text)],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)},
            }
        )

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "bench", "object": "model"}]})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 2**20)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.models)
        return app


def _json(data: Any) -> web.Response:
    return web.Response(body=fastjson.dumps(data), content_type="application/json")


async def _serve(app: web.Application, on_stop: Any = None) -> None:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"READY {port}", flush=True)
    await wait_for_stop_signal()
    if on_stop is not None:
        await on_stop()
    await runner.cleanup()


def _renderer() -> Any:
    from polar_env.backends.embedded import embedded_model_dir
    from polar_env.chat.template import ChatRenderer

    return ChatRenderer.from_pretrained(embedded_model_dir())


async def _backend_main(args: argparse.Namespace) -> None:
    if args.local:
        from polar_env.backends.embedded import embedded_model_dir
        from polar_env.backends.local import LocalBackend

        backend = BenchBackend(local=LocalBackend.from_pretrained(embedded_model_dir()), renderer=_renderer())
    else:
        backend = BenchBackend(answer_ids=[int(x) for x in args.answer_ids.split(",")])
    await _serve(backend.app())


def _proxy(args: argparse.Namespace, data_dir: Path) -> Any:
    from polar_env.proxy.settings import ProxySettings, build_proxy

    if args.backend_url:
        settings = ProxySettings(
            backend="vllm", url=args.backend_url, model_name="bench", max_context=args.max_context
        )
    else:
        settings = ProxySettings(
            backend="instant",
            max_context=args.max_context,
            backend_options={"token_ids": [int(x) for x in args.answer_ids.split(",")]},
        )
    return build_proxy(settings, data_dir=data_dir, admin_secret=ADMIN_SECRET, default_max_tokens=64)


async def _proxy_main(args: argparse.Namespace) -> None:
    if args.workers > 1:  # the layout of `polar proxy serve --workers N` (proxy/workers.py)
        from polar_env.proxy.workers import serve, worker_dir

        await serve(
            [partial(_proxy, args, worker_dir(Path(args.data_dir), k)) for k in range(args.workers)],
            host="127.0.0.1",
            port=0,
            admin_secret=ADMIN_SECRET,
            on_listening=lambda front, _workers: print(f"READY {URL(front).port}", flush=True),
        )
        return
    proxy = _proxy(args, Path(args.data_dir))
    await _serve(proxy.app(), on_stop=proxy.engine.backend.aclose)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.servers")
    sub = parser.add_subparsers(dest="kind", required=True)
    b = sub.add_parser("backend")
    b.add_argument("--answer-ids", default="")
    b.add_argument("--local", action="store_true")
    p = sub.add_parser("proxy")
    p.add_argument(
        "--backend-url", default=None, help="vllm-kind backend URL (else in-process InstantBackend)"
    )
    p.add_argument("--answer-ids", default="")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--max-context", type=int, default=200_000)
    p.add_argument("--workers", type=int, default=1, help="worker processes behind an admin front")
    args = parser.parse_args(argv)
    event_loop.run(_backend_main(args) if args.kind == "backend" else _proxy_main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
