"""The page: ``page.html`` (inline CSS and JS) with the data embedded as JSON script blocks.

Nothing is fetched at view time, so the file works offline and can be mailed or archived with the
run. Each episode is its own JSON block, parsed only when selected, so a page of many long
episodes opens as fast as its episode list.
"""

from __future__ import annotations

import html
import json
import math
import re
import time
from pathlib import Path
from typing import Any

from polar_env.viewer import data
from polar_env.viewer.tokens import TokenText

_TEMPLATE = Path(__file__).with_name("page.html")
_SLOT = re.compile(r"@@([A-Z]+)@@")


def _json_block(value: Any) -> str:
    """JSON that cannot end its ``<script>`` element early (``<`` is written as ``\\u003c``)."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:  # a NaN or infinity somewhere (metadata, timings): JSON has no such numbers
        text = json.dumps(_finite(value), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def build_page(loaded: data.Loaded, text: TokenText, *, title: str = "Polar trajectories") -> str:
    """The whole HTML page for the trajectories in ``loaded``."""
    blocks = [
        f'<script type="application/json" id="polar-ep-{k}">{_json_block(ep)}</script>'
        for k, ep in enumerate(data.episodes(loaded, text))
    ]
    slots = {
        "TITLE": html.escape(title),
        "INDEX": _json_block(data.index(loaded, text, title=title, generated_at=time.time())),
        "EPISODES": "\n".join(blocks),
    }
    # one pass: text inserted into a slot is never scanned for other slots
    return _SLOT.sub(lambda m: slots[m.group(1)], _TEMPLATE.read_text(encoding="utf-8"))


def render(path: Path, text: TokenText, *, title: str | None = None) -> tuple[str, data.Loaded]:
    """Load the trajectories under ``path`` and build their page."""
    loaded = data.load(path)
    return build_page(loaded, text, title=title or f"Polar trajectories · {Path(path).name}"), loaded
