"""Build a backend from its kind name (config files and the CLI name backends by string).

Backend modules are imported only when their kind is asked for, so choosing an HTTP backend does
not load torch or transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polar_env.backends.base import Backend

BACKEND_KINDS = ("local", "vllm", "nemo-rl", "sglang", "scripted", "instant")
_HTTP_KINDS = {
    "vllm": ("polar_env.backends.vllm", "VllmBackend"),
    "nemo-rl": ("polar_env.backends.nemo_rl", "NemoRLBackend"),
    "sglang": ("polar_env.backends.sglang", "SGLangBackend"),
}


def split_urls(url: str | list[str] | None) -> list[str]:
    """Accept one URL, a list, or a comma-separated string (handy on a command line)."""
    if url is None:
        return []
    items = url.split(",") if isinstance(url, str) else url
    return [u.strip() for u in items if u and u.strip()]


def make_backend(
    kind: str,
    *,
    url: str | list[str] | None = None,
    model: str = "",
    model_dir: Path | None = None,
    **opts: Any,
) -> Backend:
    """Return a ready backend of ``kind``; ``opts`` go to that backend's constructor.

    ``url`` is required by the HTTP kinds (several URLs spread sessions over servers; their opts:
    ``timeout_s``, ``api_key``, and ``chat_template_kwargs`` for nemo-rl); ``model_dir`` is the
    local model directory of local and scripted (default: the embedded SmolLM2).
    """
    import importlib

    kind = kind.strip().lower().replace("_", "-")
    if kind == "nemorl":
        kind = "nemo-rl"
    if kind in _HTTP_KINDS:
        urls = split_urls(url)
        if not urls:
            raise ValueError(f"backend {kind!r} needs url= (the server's base URL)")
        module, cls = _HTTP_KINDS[kind]
        return getattr(importlib.import_module(module), cls)(urls, model=model, **opts)
    if kind == "local":
        from polar_env.backends.local import LocalBackend

        if model:
            opts.setdefault("model_name", model)
        return LocalBackend.from_pretrained(model_dir, **opts)
    if kind == "scripted":  # opts: policy (required), local (a LocalBackend to reuse), context_window
        from polar_env.backends.local import LocalBackend
        from polar_env.backends.scripted import ScriptedBackend

        if "policy" not in opts:
            raise ValueError("backend 'scripted' needs policy=(session_id, call_number, prompt_text) -> text")
        local = opts.pop("local", None) or LocalBackend.from_pretrained(
            model_dir, **({"model_name": model} if model else {})
        )
        return ScriptedBackend(local, opts.pop("policy"), **opts)
    if kind == "instant":  # opts: token_ids (required), logprob
        from polar_env.backends.instant import InstantBackend

        if "token_ids" not in opts:
            raise ValueError("backend 'instant' needs token_ids=[...] (the fixed answer)")
        return InstantBackend(opts.pop("token_ids"), model=model or "instant", **opts)
    raise ValueError(f"unknown backend kind {kind!r}; expected one of {', '.join(BACKEND_KINDS)}")
