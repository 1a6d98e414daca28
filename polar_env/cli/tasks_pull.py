"""``polar tasks pull FILE``: every image a task file names, on this node, before the episodes need them.

An episode never pulls (a missing image is refused before anything starts: docs/tasks.md), so a
node is prepared once. An image already there is left alone; the others are pulled a few at a
time (``--concurrency``: a registry throttles a node that asks for everything at once), and a
pull the registry refuses for its rate limit (HTTP 429, ``toomanyrequests`` in the engine's
stderr) is retried after 2, 4, 8... s (``--backoff``, at most ``--retries`` times); any other
failure is reported at once. What Polar pulled is listed in ``$POLAR_CACHE/images.json`` (size,
last use: a container workspace's open counts as a use), and ``--disk-budget GB`` removes the
least recently used of those images until they fit; images Polar did not pull, and those the
file names, are never removed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from polar_env.sandbox.container import image_exists
from polar_env.sandbox.pulled_images import PulledImages
from polar_env.tasks.models import Task

RATE_LIMITED = re.compile(r"\b429\b|toomanyrequests|too many requests", re.IGNORECASE)


class PullFailed(RuntimeError):
    """An image could not be pulled (the message is the engine's last words)."""


@dataclass(frozen=True)
class PullPolicy:
    concurrency: int = 2
    retries: int = 5
    backoff_s: float = 2.0  # the first wait after a 429; doubled each time
    max_backoff_s: float = 120.0
    timeout_s: float = 3600.0  # one pull


def task_images(tasks: list[Task]) -> list[str]:
    """The images ``tasks`` run in, once each: those a task names, and SWE-bench's for a task with
    neither an image nor a base tree (a Harbor task's own image is built here, never pulled)."""
    from polar_env.tasks.runtime import task_image

    images = [task_image(t) for t in tasks if t.image or (not t.base_archive and t.harbor is None)]
    return list(dict.fromkeys(images))


def image_size(engine: str, image: str) -> int:
    proc = subprocess.run(
        [engine, "image", "inspect", "--format", "{{.Size}}", image],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return int(proc.stdout.strip() or 0) if proc.returncode == 0 else 0


def pull_image(
    engine: str, image: str, policy: PullPolicy, *, sleep: Callable[[float], None] = time.sleep
) -> int:
    """``engine pull image``, retried with exponential backoff while the registry rate-limits;
    returns how many attempts it took. Raises PullFailed on any other failure or when retries run out."""
    attempt = 0
    while True:
        try:
            proc = subprocess.run(
                [engine, "pull", image], capture_output=True, text=True, timeout=policy.timeout_s
            )
        except subprocess.TimeoutExpired:
            raise PullFailed(f"{image}: {engine} pull did not finish in {policy.timeout_s:g}s") from None
        if proc.returncode == 0:
            return attempt + 1
        words = (proc.stderr.strip() or proc.stdout.strip())[-500:]
        if not RATE_LIMITED.search(words):
            raise PullFailed(f"{image}: {engine} pull failed: {words}")
        if attempt == policy.retries:
            raise PullFailed(f"{image}: still rate-limited after {attempt + 1} attempts: {words}")
        sleep(min(policy.max_backoff_s, policy.backoff_s * 2**attempt))
        attempt += 1


def pull_all(
    engine: str,
    images: list[str],
    policy: PullPolicy,
    ledger: PulledImages,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, str]:
    """Every image present or pulled, ``policy.concurrency`` pulls at a time: image -> what happened."""

    def one(image: str) -> str:
        if image_exists(engine, image):
            ledger.touch(image)
            return "present"
        try:
            attempts = pull_image(engine, image, policy, sleep=sleep)
        except PullFailed as exc:
            return f"failed: {exc}"
        ledger.record(image, image_size(engine, image))
        return f"pulled ({attempts} attempt{'s' if attempts > 1 else ''})"

    with ThreadPoolExecutor(max(1, policy.concurrency)) as pool:
        return dict(zip(images, pool.map(one, images), strict=True))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (__doc__ or "").split("\n\n", 1)[1]
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "file", help="a task file (JSONL), a Harbor task folder (or a folder of them), or a dataset"
    )
    parser.add_argument(
        "--engine",
        choices=("podman", "docker"),
        default=None,
        help="the engine to pull with (default: podman if it runs, else docker)",
    )
    parser.add_argument("--concurrency", type=int, default=PullPolicy.concurrency, help="pulls at a time")
    parser.add_argument(
        "--retries", type=int, default=PullPolicy.retries, help="retries of a rate-limited pull"
    )
    parser.add_argument(
        "--backoff",
        type=float,
        default=PullPolicy.backoff_s,
        help="seconds before the first retry, doubled each time (at most 120)",
    )
    parser.add_argument(
        "--disk-budget",
        type=float,
        default=None,
        metavar="GB",
        help="afterwards, remove the least recently used images Polar pulled until they fit",
    )


def run(args: argparse.Namespace) -> int:
    from polar_env.episodes.workspace import check_engine, default_engine
    from polar_env.tasks.loader import TaskLoadError, load_tasks
    from polar_env.tasks.runtime import WorkspaceUnavailable

    try:
        images = task_images(load_tasks(args.file))
        engine = args.engine or default_engine()
        if engine not in ("podman", "docker"):
            raise WorkspaceUnavailable(
                f"{engine} pulls a docker:// image into its own cache on first use: "
                f"polar tasks pull takes podman or docker"
            )
        check_engine(engine)  # type: ignore[arg-type]
    except (TaskLoadError, WorkspaceUnavailable) as exc:
        print(f"polar tasks pull: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    ledger = PulledImages()
    policy = PullPolicy(concurrency=args.concurrency, retries=args.retries, backoff_s=args.backoff)
    results = pull_all(engine, images, policy, ledger)
    for image, outcome in results.items():
        print(f"{image}: {outcome}")
    if args.disk_budget is not None:
        for image in ledger.prune(engine, int(args.disk_budget * 2**30), keep=set(images)):
            print(f"{image}: removed (least recently used past the {args.disk_budget:g} GB budget)")
    failed = sum(o.startswith("failed") for o in results.values())
    print(f"{len(images)} images: {len(images) - failed} ready, {failed} failed", file=sys.stderr)
    return 1 if failed else 0
