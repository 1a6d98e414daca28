"""A task's answer and where it must not be: the needles of the answer scan, and the views checked at warm
time.

Every byte an agent's processes (or, in grading, its tested code) can read is potential answer: the
sandbox root, a harness install its tools can read (a Node.js one; a Python one is sealed as host
root: ``sandbox/views.py``), the task's grading environment, the task's image (sandbox/answer_scan.py
reads all of it, archives included). When a workspace of a task with a gold patch is opened
(`check_bubblewrap_views`, `answer_free_image`), each view it shows is scanned for the task's needles
(`task_needles`: its gold patch's fresh added lines, its package at another version). In a task's
image, a hit outside the task's own tree is removed (`answer_free_image`: the episode and its grading
run the image without it); any other hit, or one that cannot be removed, refuses the task with one
line naming the file (`AnswerReadable`). Results are cached by the content scanned (a fingerprint of
every file's path, size and mtime, or an image's id) and the needles, on disk and for the process, so
a warm node scans nothing twice and a warm process does not even fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from polar_env.cache import cache_root, write_atomic
from polar_env.sandbox.answer_scan import MIN_LINE, Hit, Needles, scan
from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.bwrap_argv import can_seal
from polar_env.sandbox.image_files import image_files
from polar_env.sandbox.views import holds_python_packages
from polar_env.tasks.models import Task
from polar_env.tasks.runtime import WorkspaceUnavailable

log = logging.getLogger(__name__)
SCANS_DIR = "answer-scans"
LAYOUT = "3"  # bump when the scan's rules change: every cached result is redone


class AnswerReadable(WorkspaceUnavailable):
    """A view the task's episodes or grading would read holds its answer: the task is refused."""


def _added_lines(patch: str) -> list[str]:
    return [ln[1:].strip() for ln in patch.splitlines() if ln.startswith("+") and not ln.startswith("+++")]


def _packages(tree: Path) -> list[Path]:
    """The import packages a repository ships: ``<pkg>/__init__.py`` at its root or under ``src/``."""
    found = []
    for parent in (tree, tree / "src"):
        if parent.is_dir():
            found += [
                d
                for d in sorted(parent.iterdir())
                if d.is_dir()
                and not d.is_symlink()
                and (d / "__init__.py").is_file()
                and d.name.isidentifier()
                and not d.name.startswith("test")
            ]
    return found


def _manifest(path: Path) -> dict:
    """A ``package.json``'s object ({} where there is none or it is no object)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _node_packages(tree: Path) -> dict[str, str]:
    """The npm packages a repository ships, name -> version: its root ``package.json`` and those of the
    workspaces it declares (``"workspaces": ["packages/*"]``, or ``{"packages": [...]}``)."""
    root = _manifest(tree / "package.json")
    spaces = root.get("workspaces")
    spaces = spaces.get("packages") if isinstance(spaces, dict) else spaces
    patterns = [p for p in spaces if isinstance(p, str)] if isinstance(spaces, list) else []
    manifests = [root] + [
        _manifest(path)
        for pattern in patterns
        if ".." not in pattern and not pattern.startswith("/")
        for path in sorted(tree.glob(f"{pattern.rstrip('/')}/package.json"))
    ]
    return {m["name"]: str(m.get("version", "")) for m in manifests if isinstance(m.get("name"), str)}


def task_needles(task: Task, base: Path) -> Needles:
    """``task``'s needles against its base tree ``base``: the gold patch's added lines of at least
    ``MIN_LINE`` characters that ``base`` does not hold, its packages and their files' digests, its npm
    packages and their versions."""
    text = b"\n".join(
        p.read_bytes()
        for p in base.rglob("*")
        if p.is_file() and not p.is_symlink() and ".git" not in p.relative_to(base).parts
    )
    lines = sorted({ln for ln in _added_lines(task.patch) if len(ln) >= MIN_LINE and ln.encode() not in text})
    packages = _packages(base)
    digests = {
        str(f.relative_to(pkg.parent)): hashlib.sha256(f.read_bytes()).hexdigest()
        for pkg in packages
        for f in pkg.rglob("*.py")
        if f.is_file() and not f.is_symlink()
    }
    names = {pkg.name for pkg in packages} | {task.repo.rsplit("/", 1)[-1]}
    return Needles(tuple(lines), tuple(sorted(names)), digests, _node_packages(base))


def fingerprint(root: Path, skip: Sequence[Path] = ()) -> str:
    """What a tree holds, cheaply: every entry's path (from ``root``: a renamed tree keeps its
    fingerprint), type, size and mtime (no content read)."""
    h = hashlib.sha256(LAYOUT.encode())
    skipped = {os.path.normpath(str(p)) for p in skip}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if os.path.normpath(os.path.join(dirpath, d)) not in skipped)
        for name in sorted(filenames):
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            h.update(
                f"{rel}\0{stat.S_IFMT(st.st_mode)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode(
                    errors="surrogateescape"
                )
            )
    return h.hexdigest()[:24]


@dataclass(frozen=True)
class View:
    """A tree an episode or its grading shows, as the host sees it; ``skip``: what is the task's own
    (its tree in an image); ``identity``: a content id when there is one (an image's), else a fingerprint."""

    label: str
    root: Path
    skip: tuple[Path, ...] = ()
    identity: str = ""


def scanned(view: View, needles: Needles) -> list[Hit]:
    """``view``'s hits, from the cache when this content was scanned for these needles before."""
    identity = view.identity or fingerprint(view.root, view.skip)
    cached = cache_root() / SCANS_DIR / f"{identity}-{needles.key}.json"
    if cached.is_file():
        return [Hit(**h) for h in json.loads(cached.read_text())]
    hits = scan([view.root], needles, skip=view.skip)
    write_atomic(cached, json.dumps([h.__dict__ for h in hits]).encode())
    return hits


def _refuse(task: Task, where: str, hits: list[Hit]) -> None:
    if hits:
        more = f" (and {len(hits) - 1} more)" if len(hits) > 1 else ""
        raise AnswerReadable(f"{task.instance_id}: refused: {where} holds its answer: {hits[0]}{more}")


_checked: dict[tuple[str, str], list[Hit]] = {}  # (view, needles) this process scanned: no fingerprint again


def refuse_readable_answers(task: Task, needles: Needles, views: Sequence[View]) -> None:
    """Refuse ``task`` (`AnswerReadable`, one line) when any of ``views`` holds its answer (each view
    scanned once per process; `scanned` caches across processes)."""
    for view in views:
        key = (f"{view.label}\0{view.root}\0{view.identity}", needles.key)
        if key not in _checked:
            _checked[key] = scanned(view, needles)
        _refuse(task, view.label, _checked[key])


_needles: dict[tuple[str, str], Needles] = {}


def needles_of(task: Task, base: Path) -> Needles:
    """`task_needles`, once per process and base."""
    key = (task.instance_id, str(base))
    if key not in _needles:
        _needles[key] = task_needles(task, base)
    return _needles[key]


def readable_harness(spec: SandboxSpec) -> list[View]:
    """The harness install as a view, when the agent's tools can read it: not sealed (``sandbox/views.py``),
    or sealed from a root agent, whose tools may take the harness group (``forwarder.py``)."""
    install = spec.harness_dir
    if install is None or (can_seal() and holds_python_packages(install) and spec.uid != 0):
        return []
    return [View(f"the harness install {install.name}", install)]


def check_bubblewrap_views(task: Task, spec: SandboxSpec, base: Path, env: Path | None) -> None:
    """A bubblewrap episode of ``task`` shows the sandbox root, its harness install and, in grading,
    its environment ``env`` (when built): refuse the task when any holds its answer."""
    from polar_env.sandbox.rootfs import sandbox_root

    if not task.patch:
        return
    views = [View("the sandbox root", sandbox_root()), *readable_harness(spec)]
    if env is not None:
        views.append(View("its grading environment", env))
    refuse_readable_answers(task, needles_of(task, base), views)


def answer_free_image(task: Task, engine: str, image: str, spec: SandboxSpec) -> str:
    """The image a container episode (or grading) of ``task`` runs, ``image`` being its warm image. As host
    root on podman the image is mounted read-only, elsewhere (docker, rootless podman) exported
    (`image_files`), and scanned (its workdir, the task's own tree, left out), once per image id and gold
    patch; copies of the answer outside that tree (a wheel store, a vendored copy, an archive: never the
    task's) are removed, in a layer of their own (`warm_images.without_paths`, said once), and that image is
    scanned again: a hit left, or a copy that cannot be removed, refuses the task. The harness install it
    shows refuses the task on a hit: it is Polar's, and no task's answer belongs there."""
    if not task.patch:
        return image
    needles, hits = _image_scan(task, engine, image, spec.workdir)
    if hits:
        image = _pruned(task, engine, image, hits)
        needles, hits = _image_scan(task, engine, image, spec.workdir)
        _refuse(task, f"its image {image}, pruned", hits)
    refuse_readable_answers(task, needles, readable_harness(spec))
    return image


# (task, image) -> its pruned image, made or found by this process (said once): each grading box asks again
_pruned_images: dict[tuple[str, str], str] = {}


def _pruned(task: Task, engine: str, image: str, hits: list[Hit]) -> str:
    """``image`` without the files ``hits`` name (an archive as a whole), logged once per process."""
    from polar_env.sandbox.container import ContainerError, image_exists
    from polar_env.sandbox.warm_images import outermost, without_paths

    known = (task.instance_id, image)
    if (pruned := _pruned_images.get(known)) is not None and image_exists(engine, pruned):
        return pruned
    paths = outermost([hit.path.split("!", 1)[0] for hit in hits])
    try:
        pruned = without_paths(engine, image, paths)
    except (ContainerError, OSError) as exc:
        raise AnswerReadable(
            f"{task.instance_id}: refused: its image {image} holds its answer: {hits[0]}, which cannot be "
            f"removed: {exc}"
        ) from None
    if known not in _pruned_images:
        shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        log.warning(
            "%s: its image %s holds its answer outside its tree (%s): removed (%s), its containers run %s",
            task.instance_id,
            image,
            hits[0],
            shown,
            pruned,
        )
    _pruned_images[known] = pruned
    return pruned


_images: dict[tuple[str, str, str], tuple[Needles, list[Hit]]] = {}  # (image, workdir, patch): this process's


def _image_scan(task: Task, engine: str, image: str, workdir: str) -> tuple[Needles, list[Hit]]:
    """The needles from the image's own tree and the hits in the rest of it, cached by the image's id
    (a warm image's name names its content: remembered by name for the process)."""
    from polar_env.sandbox.container import engine_run

    known = (image, workdir, task.patch)
    if known in _images:
        return _images[known]
    image_id = engine_run([engine, "image", "inspect", "--format", "{{.Id}}", image]).decode().strip()
    digest = hashlib.sha256(f"{LAYOUT}\0{image_id}\0{workdir}\0{task.patch}".encode()).hexdigest()[:24]
    cached = cache_root() / SCANS_DIR / f"image-{digest}.json"
    if cached.is_file():
        data = json.loads(cached.read_text())
        _images[known] = Needles.from_json(data["needles"]), [Hit(**h) for h in data["hits"]]
        return _images[known]
    with image_files(engine, image) as root:
        tree = root / workdir.lstrip("/")
        needles = task_needles(task, tree) if tree.is_dir() else Needles()
        hits = [
            Hit(h.path.replace(str(root), "", 1), h.kind, h.what) for h in scan([root], needles, skip=[tree])
        ]
    write_atomic(
        cached, json.dumps({"needles": needles.to_json(), "hits": [h.__dict__ for h in hits]}).encode()
    )
    _images[known] = needles, hits
    return needles, hits
