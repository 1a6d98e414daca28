"""``ProxyServer.stop`` stops every thread and process the proxy started.

A proxy runs its tokenizer, its ledger writer and the model of a backend it owns on worker threads,
and parses large bodies in worker processes; a trainer or a test suite starts and stops many
proxies in one process, so each stop must leave none of them behind.
"""

from __future__ import annotations

import multiprocessing
import threading

import aiohttp
from proxy_client import make_proxy, post

from polar_env.backends.local import LocalBackend
from polar_env.proxy.app import OFF_LOOP_BYTES


def _ours(before: set[threading.Thread]) -> list[str]:
    """Threads started since ``before``, but the event loop's own default executor (asyncio joins it)."""
    return sorted(
        t.name for t in threading.enumerate() if t not in before and not t.name.startswith("asyncio_")
    )


async def test_stop_leaves_no_worker_thread_or_process(renderer, embedded_dir, tmp_path):
    backend = LocalBackend.from_pretrained(embedded_dir)  # its worker thread starts with the first call
    before = set(threading.enumerate())  # after loading: tqdm leaves a monitor thread of its own
    proxy = make_proxy(renderer, backend, tmp_path, max_context=2048, default_max_tokens=4)
    await proxy.start("127.0.0.1", 0)
    sid, key = proxy.create_session()
    url = f"{proxy.base_url}/s/{sid}/v1/chat/completions"
    async with aiohttp.ClientSession() as http:
        status, reply = await post(
            http, url, {"model": "m", "messages": [{"role": "user", "content": "Hi."}]}, key
        )
        assert status == 200, reply
        # a body past OFF_LOOP_BYTES is parsed in a worker process (its answer: the context overflows)
        huge = {"model": "m", "messages": [{"role": "user", "content": "word " * (OFF_LOOP_BYTES // 4)}]}
        status, reply = await post(http, url, huge, key)
        assert status == 400 and "context" in reply["error"]["message"], reply
    started = _ours(before)
    for worker in ("polar-tokenize_0", "polar-ledger_0", "polar-local_0"):
        assert worker in started
    assert multiprocessing.active_children()  # the parse worker
    await proxy.stop()
    assert _ours(before) == []
    assert multiprocessing.active_children() == []


async def test_a_stopped_proxy_and_its_backend_are_freed(renderer, embedded_dir, tmp_path):
    """Nothing keeps a stopped proxy alive: not aiohttp's module-level cache of middleware chains
    (keyed by the proxy's bound handlers), which used to hold every proxy a process ever served, with
    its engine, ledger and a local model's weights (the test suite in one process outgrew 24 GB)."""
    import gc
    import weakref

    backend = LocalBackend.from_pretrained(embedded_dir)
    proxy = make_proxy(renderer, backend, tmp_path, max_context=2048, default_max_tokens=4, owns_backend=True)
    await proxy.start("127.0.0.1", 0)
    sid, key = proxy.create_session()
    async with aiohttp.ClientSession() as http:
        status, reply = await post(
            http,
            f"{proxy.base_url}/s/{sid}/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "Hi."}]},
            key,
        )
        assert status == 200, reply
        async with http.get(f"{proxy.base_url}/no/such/route") as missing:  # the error middleware's chain too
            assert missing.status == 404
    await proxy.stop()
    gone_proxy, gone_model = weakref.ref(proxy), weakref.ref(backend.module)
    del proxy, backend
    gc.collect()
    assert gone_proxy() is None and gone_model() is None
