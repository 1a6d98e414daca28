"""Search a file tree for a task's answer, inside archives too: the one scan every view is checked with.

A plain-text search misses what matters: pip's wheel store vendors a newer ``requests`` (both
bundled requests tasks' fixes inside a zip), a harness's site-packages holds another release of the
task's own package, an egg or an sdist is a compressed copy, a ``.pyc`` is its code without the
source. So this scan reads every regular file's bytes and, where a file is an archive (zip: wheels,
eggs, jars; tar, gzip, bzip2, xz: sdists), every member's, nested archives too, and looks for:

- ``line``: a line the gold patch adds that the task's base tree does not hold (stripped, so a
  re-indented copy is found too);
- ``package``: the task's own package at any other version: a directory or archive member
  ``<pkg>/__init__.py`` (or its ``.pyc``) whose ``.py`` files are not all the base tree's, a
  ``<pkg>-<version>.dist-info``/``.egg-info``, or a file named like a distribution of it
  (``<pkg>-<version>.whl``, ``.tar.gz``, ``.zip``, ``.egg``); for a Node.js task, a ``package.json``
  (a ``node_modules`` copy, an npm tarball's ``package/package.json``, a harness's bundled copy)
  naming one of the task's npm packages at a version other than the base's.

Stdlib only: the same file runs inside a sandbox as the agent's tools would run it
(``python3 answer_scan.py NEEDLES.json /``), which is how the tests search everything an agent can
read. Callers outside a sandbox use `scan` (and ``tasks/answers.py`` derives a task's needles and
caches results by the content scanned).
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import stat
import sys
import tarfile
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

MIN_LINE = 20  # an added line shorter than this is too common to be evidence of the fix
MAX_DEPTH = 4  # archives inside archives (a wheel in a zip in a tarball) are opened this deep
MAX_MEMBER_BYTES = 512 << 20  # a member larger than this once decompressed is searched up to it
MAX_MANIFEST = 1 << 20  # a package.json larger than this is no manifest
ARCHIVE_SUFFIXES = (
    ".whl",
    ".zip",
    ".egg",
    ".jar",
    ".pyz",
    ".tar",
    ".tar.gz",
    ".tgz",
    ".tar.bz2",
    ".tbz2",
    ".tar.xz",
    ".txz",
    ".gz",
    ".bz2",
    ".xz",
)
SKIP_DIRS = ("/proc", "/sys", "/dev")


@dataclass(frozen=True)
class Needles:
    """What a task's answer looks like: its gold patch's fresh added lines, its package's import names
    and the digests of the base tree's ``.py`` files under each (relative to the package's parent)."""

    lines: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()
    base_digests: dict[str, str] = field(default_factory=dict)  # "requests/models.py" -> sha256
    node_versions: dict[str, str] = field(default_factory=dict)  # npm name -> the base's version ("" unknown)

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    @classmethod
    def from_json(cls, text: str) -> Needles:
        data = json.loads(text)
        return cls(
            tuple(data.get("lines", ())),
            tuple(data.get("packages", ())),
            dict(data.get("base_digests", {})),
            dict(data.get("node_versions", {})),
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@dataclass(frozen=True)
class Hit:
    """``path`` (an archive member as ``archive!member``, nested as ``a!b!c``) holds ``what``."""

    path: str
    kind: str  # "line" | "package"
    what: str

    def __str__(self) -> str:
        shown = self.what if len(self.what) <= 80 else self.what[:77] + "..."
        return f"{self.path}: {'the task package ' if self.kind == 'package' else 'a gold line '}{shown!r}"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


# a distribution's metadata dir or file: requests-2.31.0.dist-info, Flask-2.3.0.tar.gz,
# pytest-7.3.1-py3-none-any.whl
_DIST = re.compile(
    r"^([A-Za-z0-9_.]+?)-(\d[^/]*?)(\.dist-info|\.egg-info|\.whl|\.tar\.gz|\.tgz|\.tar\.bz2|"
    r"\.tar\.xz|\.zip|\.egg)$"
)
METADATA_SUFFIXES = (".dist-info", ".egg-info")
_INIT = re.compile(r"^__init__(\.py|\.pyc|\.[A-Za-z0-9_-]+\.pyc)$")
_ZIP_END = b"PK\x05\x06"


def _parts(name: str) -> tuple[str, ...]:
    return tuple(p for p in name.split("/") if p not in ("", "."))


class _Matcher:
    def __init__(self, needles: Needles):
        self.lines = [line.encode() for line in needles.lines]
        self.names = {_norm(p) for p in needles.packages}
        self.digests = needles.base_digests
        self.node = needles.node_versions

    def line_in(self, data: bytes) -> str | None:
        return next((n.decode() for n in self.lines if n in data), None)

    def node_copy(self, label: str, data: bytes) -> str | None:
        """``name@version`` when ``label`` is a ``package.json`` naming a task's npm package at another
        version than the base's."""
        if not self.node or re.split(r"[/!]", label)[-1] != "package.json" or len(data) > MAX_MANIFEST:
            return None
        try:
            manifest = json.loads(data)
        except ValueError:
            return None
        name = manifest.get("name") if isinstance(manifest, dict) else None
        version = str(manifest.get("version", "")) if isinstance(manifest, dict) else ""
        if isinstance(name, str) and name in self.node and version != self.node[name]:
            return f"{name}@{version}"
        return None

    def is_dist(self, name: str) -> bool:
        found = _DIST.match(name)
        return found is not None and _norm(found.group(1)) in self.names

    def package_at(self, parts: Sequence[str]) -> tuple[int, str] | None:
        """(index of the package dir, its name) when ``parts`` is ``.../<pkg>/__init__.*`` or
        ``.../<pkg>/__pycache__/__init__.*.pyc``."""
        if len(parts) < 2 or not _INIT.match(parts[-1]):
            return None
        at = len(parts) - (3 if parts[-2] == "__pycache__" and len(parts) >= 3 else 2)
        pkg = parts[at]
        return (at, pkg) if _norm(pkg) in self.names and pkg.isidentifier() else None

    def is_base(self, files: dict[str, bytes | None]) -> bool:
        """Whether a package copy's ``.py`` files (path from the package's parent -> content, None
        when unread) are all the base tree's own: the task's package at the base version."""
        py = {p: c for p, c in files.items() if p.endswith(".py")}
        return bool(py) and all(
            c is not None and self.digests.get(p) == hashlib.sha256(c).hexdigest() for p, c in py.items()
        )


_DECOMPRESS_ERRORS = (
    OSError,
    EOFError,
    lzma.LZMAError,
    zlib.error,
    tarfile.TarError,
    zipfile.BadZipFile,
    NotImplementedError,
    RuntimeError,
    ValueError,
)


def _is_archive(data: bytes, name: str) -> bool:
    head = data[:512]
    return (
        head[:4] in (b"PK\x03\x04", _ZIP_END)
        or head[:2] == b"\x1f\x8b"
        or head[:3] == b"BZh"
        or head[:6] == b"\xfd7zXZ\x00"
        or head[257:262] == b"ustar"
        or name.endswith(ARCHIVE_SUFFIXES)
        or (head[:4] == b"\x7fELF" or head[:2] == b"#!")  # a zip appended to a program (self-extracting)
        and data.find(_ZIP_END, max(0, len(data) - (1 << 16) - 22)) >= 0
    )


def _members(data: bytes) -> list[tuple[str, bytes]] | None:
    """(name, content) of every regular member, or None when ``data`` is no archive this scan reads."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            return [(i.filename, _read(lambda i=i: zf.open(i))) for i in zf.infolist() if not i.is_dir()]
    except _DECOMPRESS_ERRORS:
        pass
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
            return [(m.name, _read(lambda m=m: tf.extractfile(m))) for m in tf if m.isfile()]
    except _DECOMPRESS_ERRORS:
        pass
    for opener in (lambda f: gzip.GzipFile(fileobj=f), bz2.BZ2File, lzma.LZMAFile):
        try:
            with opener(io.BytesIO(data)) as handle:
                return [("", handle.read(MAX_MEMBER_BYTES))]
        except _DECOMPRESS_ERRORS:
            continue
    return None


def _read(open_member) -> bytes:
    try:
        with open_member() as handle:
            return handle.read(MAX_MEMBER_BYTES)
    except _DECOMPRESS_ERRORS:
        return b""


class _Scan:
    def __init__(self, needles: Needles):
        self.match = _Matcher(needles)
        self.hits: set[Hit] = set()

    def content(self, label: str, data: bytes, depth: int) -> None:
        """One file's bytes (a file on disk or a member): its lines, and its members when an archive."""
        if (line := self.match.line_in(data)) is not None:
            self.hits.add(Hit(label, "line", line))
        if (copy := self.match.node_copy(label, data)) is not None:
            self.hits.add(Hit(label, "package", copy))
        if depth >= MAX_DEPTH or not _is_archive(data, label.lower()):
            return
        members = _members(data)
        if members is None:
            return
        entries = [(_parts(name), name, member) for name, member in members]
        copies: dict[tuple[str, ...], dict[str, bytes | None]] = {}  # <prefix>/<pkg> -> its files
        for parts, _, _ in entries:
            for i, part in enumerate(parts):
                if self.match.is_dist(part):
                    self.hits.add(Hit(f"{label}!{'/'.join(parts[: i + 1])}", "package", part))
            if (found := self.match.package_at(parts)) is not None:
                copies.setdefault(parts[: found[0] + 1], {})
        for parts, name, member in entries:
            for top, files in copies.items():
                if parts[: len(top)] == top:
                    files["/".join(parts[len(top) - 1 :])] = member
            self.content(f"{label}!{name}", member, depth + 1)
        for top, files in copies.items():
            if not self.match.is_base(files):
                self.hits.add(Hit(f"{label}!{'/'.join(top)}", "package", top[-1]))

    def tree(self, root: Path, skip: Sequence[Path]) -> None:
        skipped = {os.path.normpath(str(p)) for p in skip}
        stack = [str(root)]
        while stack:
            top = stack.pop()
            if os.path.normpath(top) in skipped:
                continue
            try:
                entries = sorted(os.scandir(top), key=lambda e: e.name)
            except OSError:
                continue
            self._package_dir(top, [e.name for e in entries])
            for entry in entries:
                try:
                    mode = entry.stat(follow_symlinks=False).st_mode
                except OSError:
                    continue
                # an installed distribution's metadata holds no code (a copy's code is found as a
                # package dir): ``pip install .`` of the task leaves one at the base version beside it
                if (
                    (stat.S_ISDIR(mode) or stat.S_ISREG(mode))
                    and self.match.is_dist(entry.name)
                    and not entry.name.endswith(METADATA_SUFFIXES)
                ):
                    self.hits.add(Hit(entry.path, "package", entry.name))
                if stat.S_ISDIR(mode):
                    stack.append(entry.path)
                elif stat.S_ISREG(mode):
                    self.file(entry.path)

    def _package_dir(self, top: str, names: list[str]) -> None:
        """``top`` reported when it is a copy of the task's package that is not the base's."""
        inside = [*names]
        if "__pycache__" in names:
            try:
                inside += [f"__pycache__/{n}" for n in os.listdir(os.path.join(top, "__pycache__"))]
            except OSError:
                pass
        base = os.path.basename(top.rstrip("/"))
        if not any(self.match.package_at((base, *_parts(n))) for n in inside):
            return
        files: dict[str, bytes | None] = {}
        for dirpath, _, filenames in os.walk(top):
            for name in filenames:
                path = os.path.join(dirpath, name)
                rel = os.path.join(base, os.path.relpath(path, top))
                try:
                    files[rel] = Path(path).read_bytes() if name.endswith(".py") else None
                except OSError:
                    files[rel] = None
        if not self.match.is_base(files):
            self.hits.add(Hit(top, "package", base))

    def file(self, path: str) -> None:
        try:
            with open(path, "rb", buffering=0) as handle:
                data = handle.read()
        except OSError:
            return
        self.content(path, data, 0)


def scan(roots: Sequence[Path], needles: Needles, *, skip: Sequence[Path] = ()) -> list[Hit]:
    """Every hit of ``needles`` under ``roots`` (symlinks never followed; ``skip``: paths left out)."""
    job = _Scan(needles)
    for root in roots:
        if Path(root).is_dir():
            job.tree(Path(root), skip)
        elif Path(root).is_file():
            job.file(str(root))
    return sorted(job.hits, key=lambda h: (h.path, h.kind))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("needles", help="a JSON file of Needles (lines, packages, base_digests)")
    ap.add_argument("roots", nargs="+")
    ap.add_argument("--skip", action="append", default=[], help="a path left out (repeatable)")
    args = ap.parse_args(argv)
    needles = Needles.from_json(Path(args.needles).read_text())
    skip = [Path(p) for p in (*SKIP_DIRS, *args.skip)]
    hits = scan([Path(r) for r in args.roots], needles, skip=skip)
    print(json.dumps({"hits": [asdict(h) for h in hits]}))
    return 1 if hits else 0


if __name__ == "__main__":
    sys.exit(main())
