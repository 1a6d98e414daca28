"""`polar view PATH`: write the trajectory page, and optionally serve it on 127.0.0.1."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from polar_env.viewer.data import Loaded
from polar_env.viewer.html import render
from polar_env.viewer.tokens import TokenText


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Write one self-contained HTML page (no network needed) showing the Polar trajectories "
        "under PATH: the episodes, and per chain the token stream coloured by loss mask and "
        "shaded by logprob, tool calls and results, chain breaks and the grading result."
    )
    p.add_argument(
        "path", type=Path, help="a directory of trajectory *.jsonl files (searched recursively) or one file"
    )
    p.add_argument(
        "--out", type=Path, help="the HTML file to write (default: PATH/viewer.html, or PATH.html for a file)"
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="model directory whose tokenizer decodes token ids (default: the embedded model); "
        "'none' shows ids only",
    )
    p.add_argument("--title", help="page title")
    p.add_argument(
        "--serve",
        action="store_true",
        help="also serve the page on 127.0.0.1 (rebuilt when the files change) until Ctrl-C",
    )
    p.add_argument("--port", type=int, default=8765, help="port for --serve (0: any free port)")


def _token_text(option: str | None) -> TokenText:
    if option is not None and option.lower() == "none":
        return TokenText.load(None)
    if option is not None:
        return TokenText.load(Path(option))
    from polar_env.backends.embedded import embedded_model_dir

    return TokenText.load(embedded_model_dir())


class PageSource:
    """The page for a path, rebuilt only when a trajectory file under it changed (for --serve)."""

    def __init__(self, path: Path, text: TokenText, title: str | None = None):
        self.path, self.text, self.title = path, text, title
        self._key: tuple | None = None
        self._page = ""
        self.loaded: Loaded | None = None  # of the last build

    def _fingerprint(self) -> tuple:
        stamps = []
        for f in [self.path] if self.path.is_file() else sorted(self.path.rglob("*.jsonl")):
            try:
                st = f.stat()
            except FileNotFoundError:  # removed while we looked
                continue
            stamps.append((str(f), st.st_mtime_ns, st.st_size))
        return tuple(stamps)

    def page(self) -> str:
        key = self._fingerprint()
        if key != self._key:
            self._page, self.loaded = render(self.path, self.text, title=self.title)
            self._key = key
        return self._page


async def start_server(page: Callable[[], str], port: int = 8765) -> tuple[web.AppRunner, str]:
    """Serve ``page()`` at ``/`` on 127.0.0.1; returns the runner (``await runner.cleanup()``) and URL."""

    async def index(request: web.Request) -> web.Response:
        body = await asyncio.to_thread(page)
        return web.Response(text=body, content_type="text/html", headers={"Cache-Control": "no-store"})

    app = web.Application()
    app.router.add_get("/", index)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{bound}/"


async def _serve_forever(page: Callable[[], str], port: int) -> None:
    runner, url = await start_server(page, port)
    print(f"serving {url} (Ctrl-C to stop)", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def write_view(
    path: Path, out: Path | None = None, tokenizer: str | None = None, title: str | None = None
) -> PageSource | None:
    """Write the page for ``path``; None, after saying why on stderr, when it cannot."""
    if not path.exists():
        print(f"polar view: {path} does not exist", file=sys.stderr)
        return None
    out = out or (path / "viewer.html" if path.is_dir() else path.with_suffix(".html"))
    try:
        text = _token_text(tokenizer)
    except (OSError, ValueError) as exc:
        print(
            f"polar view: cannot load the tokenizer ({exc}); pass --tokenizer MODEL_DIR or --tokenizer none",
            file=sys.stderr,
        )
        return None
    source = PageSource(path, text, title)
    page = source.page()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out)
    loaded = source.loaded
    assert loaded is not None  # page() built it
    for line in loaded.skipped:
        print(f"polar view: skipped {line}", file=sys.stderr)
    print(
        f"wrote {out}: {len(loaded.episodes)} episodes from {len(loaded.sources)} file(s), "
        f"{len(page) / 1e6:.1f} MB, token text by {text.name}"
    )
    if not loaded.episodes:
        print(f"polar view: no Polar trajectories under {path}", file=sys.stderr)
    return source


def run(args: argparse.Namespace) -> int:
    source = write_view(args.path, args.out, args.tokenizer, args.title)
    if source is None:
        return 2
    if args.serve:
        try:
            asyncio.run(_serve_forever(source.page, args.port))
        except KeyboardInterrupt:
            print("stopped")
    return 0
