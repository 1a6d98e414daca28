"""The gold patch's strict runs, once per task and node: the evidence every strict grade is judged by.

A gold run costs as much as a grade (minutes on a real task), and grading runs in worker processes
(`rewards/workers.py`): a memo in one process would repeat it in every worker and every ``polar``
command. So a run is kept on disk, in the grader's own folder (`gold_dir`, mode 0700,
which no sandbox mounts), keyed by everything it depends on: the whole task (its tests, gold patch
and base), where it ran (the base tree or the image) and the grader's own code (a changed grader
runs its gold again). A file lock per key makes concurrent workers run each gold once. An entry that
does not parse is run again (never half-trusted); only a run ``keep`` accepts is stored, so a sandbox
hiccup does not stick.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import re
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from polar_env.cache import cache_root
from polar_env.environment import EnvSettings
from polar_env.tasks.models import Task

Run = TypeVar("Run", bound=BaseModel)

_MEMO: dict[str, BaseModel] = {}  # entry path -> what this process has read or run already
_MEMO_LOCK = threading.Lock()


def gold_dir() -> Path:
    """``$POLAR_GOLD_CACHE``, else ``$POLAR_CACHE/gold``."""
    return EnvSettings.read().gold_cache or cache_root() / "gold"


@functools.cache
def grader_digest() -> str:
    """The grader's code, as it runs here: every module of polar_env (grading reaches into sandbox, tasks
    and outcomes too) and the swebench package's version."""
    import swebench

    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256(str(getattr(swebench, "__version__", "")).encode())
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def gold_key(task: Task, where: str) -> str:
    """The entry of ``task``'s gold run at ``where`` (``tree:<base key>`` or ``image:<name>``)."""
    digest = hashlib.sha256("\0".join((task.model_dump_json(), where, grader_digest())).encode())
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', task.instance_id)[:80]}-{digest.hexdigest()[:32]}"


def cached(key: str, model: type[Run]) -> Run | None:
    """The stored run of ``key``, or None (never stored, or unreadable)."""
    path = gold_dir() / f"{key}.json"
    with _MEMO_LOCK:
        found = _MEMO.get(str(path))
    if isinstance(found, model):
        return found
    try:
        return model.model_validate_json(path.read_bytes())
    except (OSError, ValidationError, ValueError):
        return None


def gold_run(key: str, model: type[Run], run: Callable[[], Run], *, keep: Callable[[Run], bool]) -> Run:
    """The stored gold run of ``key``, or ``run()`` under the key's lock (stored when ``keep`` accepts it).
    What ``run`` raises passes through, nothing stored."""
    if (found := cached(key, model)) is not None:
        return _remember(key, found)
    folder = gold_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(folder / f"{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker running the same gold: wait for its entry
        if (found := cached(key, model)) is not None:
            return _remember(key, found)
        fresh = run()
        if not keep(fresh):
            return fresh
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}-")
        with os.fdopen(fd, "w") as f:
            f.write(fresh.model_dump_json())
        os.replace(tmp, folder / f"{key}.json")
        return _remember(key, fresh)


def _remember(key: str, run: Run) -> Run:
    with _MEMO_LOCK:
        _MEMO[str(gold_dir() / f"{key}.json")] = run
    return run
