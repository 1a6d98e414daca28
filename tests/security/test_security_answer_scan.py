"""No bundled task's answer is readable by an agent's tools, inside archives too, in every harness's view.

The answer scan (``sandbox/answer_scan.py``) reads inside wheels, eggs, zips, sdists and ``.pyc``;
a plain-text search missed pip's wheel store (its vendored ``requests`` holds both requests tasks'
fixes) and the Python harnesses' site-packages (``requests`` 2.32 among them). Here: the scan's own
rules on planted archives; the sandbox root without the wheel store; in each harness's view, the
scan run as the agent's tools run (a shell the sealed harness starts) finds nothing but the wheel a
control planted in HOME (a Node.js install, which the tools can read, included; the sandbox root's
``/usr``, the same in every view, searched in Pi's), and cannot enter a Python install, whose
site-packages the harness itself finds ``requests`` in (the seal is what hides it); and a
task whose environment holds its answer is refused at warm time, the scan cached by content.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import py_compile
import shutil
import subprocess
import tarfile
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from polar_env.harness_adapters import adapter_names, get_adapter
from polar_env.harness_adapters.runner import SANDBOX_PYTHON
from polar_env.sandbox import answer_scan
from polar_env.sandbox.answer_scan import Needles, scan
from polar_env.sandbox.base import Sandbox, SandboxSpec
from polar_env.sandbox.bubblewrap import FORWARDER_INSIDE, BubblewrapSandbox
from polar_env.sandbox.bwrap_argv import can_seal
from polar_env.sandbox.rootfs import WHEEL_STORE, sandbox_root
from polar_env.tasks.answers import (
    AnswerReadable,
    View,
    readable_harness,
    refuse_readable_answers,
    task_needles,
)
from polar_env.tasks.base_trees import base_cache_dir, warm_base
from polar_env.tasks.loader import load_bundled

TASKS = {t.instance_id: t for t in load_bundled()}
FIX = "netloc = '@'.join([auth, netloc])"  # a line psf__requests-6028's gold patch adds
needs_root_fs = pytest.mark.needs("bwrap", "sandbox-root")


@pytest.fixture(scope="module")
def needles() -> Needles:
    return task_needles(
        TASKS["psf__requests-6028"], warm_base(TASKS["psf__requests-6028"], base_cache_dir()).tree
    )


@pytest.fixture(scope="module")
def every_task() -> Needles:
    """Every bundled task's lines and packages at once; no base digests: any copy outside the task's
    own tree is another version."""
    each = [task_needles(t, warm_base(t, base_cache_dir()).tree) for t in TASKS.values()]
    return Needles(
        tuple(sorted({ln for n in each for ln in n.lines})),
        tuple(sorted({p for n in each for p in n.packages})),
    )


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _tar_gz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def planted_wheel() -> bytes:
    """A wheel of a newer requests holding the fix (what pip's wheel store and a pip cache hold)."""
    return _zip(
        {
            "requests/__init__.py": b"__version__ = '2.99.0'\n",
            "requests/utils.py": f"def f(auth, netloc):\n    {FIX}\n".encode(),
            "requests-2.99.0.dist-info/METADATA": b"Name: requests\nVersion: 2.99.0\n",
        }
    )


def test_the_needles_are_the_gold_lines_and_the_package(needles: Needles):
    assert FIX in needles.lines and needles.packages == ("requests",)
    assert "requests/utils.py" in needles.base_digests


def test_archives_are_read_inside(tmp_path: Path, needles: Needles):
    """Every container a copy hides in, and a copy at the base version that is not a hit."""
    tree = tmp_path / "tree"
    (tree / "wheels").mkdir(parents=True)
    (tree / "wheels" / "any-name.whl").write_bytes(planted_wheel())
    (tree / "sdist.bin").write_bytes(_tar_gz({"requests-2.99.0/requests/utils.py": f"    {FIX}\n".encode()}))
    (tree / "nested.zip").write_bytes(_zip({"inner/vendor.zip": _zip({"lib/notes.txt": FIX.encode()})}))
    (tree / "lib.so").write_bytes(b"\x7fELF" + b"\0" * 64 + _zip({"requests/__init__.py": b"x = 1\n"}))
    pyc_only = tree / "site" / "requests" / "__pycache__"
    pyc_only.mkdir(parents=True)
    src = tmp_path / "__init__.py"
    src.write_text("VERSION = '2.99.0'\n")
    py_compile.compile(str(src), cfile=str(pyc_only / "__init__.cpython-311.pyc"))
    base = warm_base(TASKS["psf__requests-6028"], base_cache_dir()).tree
    shutil.copytree(base / "requests", tree / "same" / "requests")  # the base version, installed: not a hit
    # an installed distribution's metadata (``pip install .`` of the task; an old egg-info file): no code
    (tree / "same" / "requests-2.27.0.dist-info").mkdir()
    (tree / "same" / "requests-2.27.0.dist-info" / "METADATA").write_text("Name: requests\nVersion: 2.27.0\n")
    (tree / "same" / "requests-2.26.0-py3.9.egg-info").write_text("Name: requests\nVersion: 2.26.0\n")
    hits = {(h.path.removeprefix(str(tree) + "/"), h.kind) for h in scan([tree], needles)}
    assert hits == {
        ("wheels/any-name.whl!requests", "package"),
        ("wheels/any-name.whl!requests/utils.py", "line"),
        ("wheels/any-name.whl!requests-2.99.0.dist-info", "package"),
        ("sdist.bin!requests-2.99.0/requests/utils.py", "line"),
        ("nested.zip!inner/vendor.zip!lib/notes.txt", "line"),
        ("lib.so!requests", "package"),
        ("site/requests", "package"),
    }, hits
    # control: the plain-text search this replaced finds none of them
    text_hits = [p for p in tree.rglob("*") if p.is_file() and FIX.encode() in p.read_bytes()]
    assert text_hits == [], text_hits


def test_a_node_package_at_another_version_is_found(tmp_path: Path):
    """A Node.js task's npm packages (its root's and its declared workspaces') at another version: a
    ``node_modules`` copy and an npm tarball's ``package/package.json`` are hits, a copy at the base's
    version is not (the scan's Python rules alone find none of them: the control)."""
    base = tmp_path / "base"
    (base / "packages" / "core").mkdir(parents=True)
    (base / "package.json").write_text(
        json.dumps({"name": "left-pad", "version": "1.1.0", "workspaces": ["packages/*"]})
    )
    (base / "packages" / "core" / "package.json").write_text('{"name": "@left/core", "version": "1.1.0"}')
    (base / "test" / "fixture").mkdir(parents=True)  # not a declared workspace: not the task's
    (base / "test" / "fixture" / "package.json").write_text('{"name": "fixture", "version": "0.0.1"}')
    task = TASKS["psf__requests-6028"].model_copy(update={"repo": "left/left-pad", "patch": ""})
    needles = task_needles(task, base)
    assert needles.node_versions == {"left-pad": "1.1.0", "@left/core": "1.1.0"}
    tree = tmp_path / "tree"
    newer = json.dumps({"name": "left-pad", "version": "1.3.0"}).encode()
    for where, manifest in (
        ("harness/node_modules/left-pad", newer),
        ("harness/node_modules/@left/core", b'{"name": "@left/core", "version": "1.1.0"}'),  # the base's
        ("other/node_modules/fixture", b'{"name": "fixture", "version": "9.9.9"}'),
    ):
        (tree / where).mkdir(parents=True)
        (tree / where / "package.json").write_bytes(manifest)
    (tree / "cache" / "blob").parent.mkdir(parents=True)
    (tree / "cache" / "blob").write_bytes(_tar_gz({"package/package.json": newer, "package/index.js": b"x"}))
    hits = {(h.path.removeprefix(str(tree) + "/"), h.what) for h in scan([tree], needles)}
    assert hits == {
        ("harness/node_modules/left-pad/package.json", "left-pad@1.3.0"),
        ("cache/blob!package/package.json", "left-pad@1.3.0"),
    }, hits
    assert scan([tree], replace(needles, node_versions={})) == []  # the control


@needs_root_fs
def test_the_sandbox_root_holds_no_wheel_store_and_no_answer(every_task: Needles):
    root = sandbox_root()
    assert not (root / WHEEL_STORE).exists()
    assert list(root.rglob("*.whl")) == []
    assert scan([root], every_task) == []


async def _as_harness(sb: Sandbox, argv: list[str]) -> str:
    """``argv`` started by the forwarder as it starts a harness (sealed, as host root)."""
    res = await sb.run(
        [SANDBOX_PYTHON, FORWARDER_INSIDE, "--socket", "/run/proxy/none", "--port", "18080", "--", *argv],
        timeout_s=600,
    )
    return res.stdout_tail


def _hits(out: str) -> list[dict]:
    return json.loads(next(ln for ln in out.splitlines() if ln.startswith("{")))["hits"]


REQUESTS_INSIDE = (
    "import glob; print('REQUESTS', len(glob.glob('/opt/harness/lib/python3*/site-packages/requests/*.py')))"
)
FULL_VIEW = (
    "pi"  # /usr (the sandbox root with the host's node), the same in every view, is searched in this one's
)


@pytest.mark.slow
@needs_root_fs
@pytest.mark.parametrize("harness", adapter_names())
async def test_every_harness_view_holds_no_answer_for_its_tools(
    harness: str, every_task: Needles, tmp_path: Path
):
    adapter = get_adapter(harness)
    if not adapter.is_installed():
        pytest.skip(f"{harness} is not installed (POLAR_SETUP_HARNESSES=1 scripts/setup.sh)")
    python = adapter.source.kind != "npm"
    task = TASKS["psf__requests-6028"]
    sb = BubblewrapSandbox.create(
        warm_base(task, base_cache_dir()).tree,
        spec=SandboxSpec(
            harness_dir=adapter.install_dir(), scratch_root=tmp_path / "s", disk_bytes=256 << 20
        ),
    )
    probe = tmp_path / "probe"
    probe.mkdir()
    shutil.copy(answer_scan.__file__, probe / "answer_scan.py")
    (probe / "needles.json").write_text(every_task.to_json())
    plant = tmp_path / "requests-2.99.0-py3-none-any.whl"
    plant.write_bytes(planted_wheel())
    skip = "--skip /testbed --skip /tmp/polar-probe" + ("" if harness == FULL_VIEW else " --skip /usr")
    try:
        await sb.copy_in(probe, "/tmp/polar-probe")
        await sb.copy_in(
            plant, "/home/agent/.cache/pip/wheels/requests-2.99.0-py3-none-any.whl"
        )  # the control
        # the agent's tools: a shell the harness starts (it drops the harness's group), searching everything
        tools = await _as_harness(
            sb,
            [
                "bash",
                "-c",
                f"python3 /tmp/polar-probe/answer_scan.py "
                f"/tmp/polar-probe/needles.json / {skip}; "
                "ls /opt/harness >/dev/null 2>&1 && echo INSTALL listed || echo INSTALL denied",
            ],
        )
        own = await _as_harness(sb, ["python3", "-c", REQUESTS_INSIDE])  # the harness itself, its own install
    finally:
        await sb.destroy()
    hits = _hits(tools)
    planted = "/home/agent/.cache/pip/wheels/requests-2.99.0-py3-none-any.whl"
    assert hits and all(h["path"].startswith(planted) for h in hits), hits  # the planted wheel alone: caught
    assert {h["kind"] for h in hits} == {"package", "line"}, hits
    if (
        can_seal() and python
    ):  # sealed: its site-packages hold requests; the harness reads them, its tools do not
        assert "INSTALL denied" in tools, tools
        assert int(own.split("REQUESTS ")[1].split()[0]) > 0, own
    else:  # a Node.js install is the tools' to read: searched above with the rest, nothing in it
        assert "INSTALL listed" in tools, tools


def test_a_task_whose_environment_holds_its_answer_is_refused_and_the_scan_is_cached(
    tmp_path: Path, needles, monkeypatch
):
    from polar_env.tasks import answers

    monkeypatch.setenv("POLAR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(answers, "_checked", {})
    task = TASKS["psf__requests-6028"]
    clean, planted = tmp_path / "clean", tmp_path / "planted"
    for env in (clean, planted):
        (env / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
        (env / "lib" / "python3.11" / "site-packages" / "urllib3.py").write_text("x = 1\n")
    (planted / "pip-cache.whl").write_bytes(planted_wheel())
    refuse_readable_answers(task, needles, [View("its grading environment", clean)])  # nothing raised
    with pytest.raises(
        AnswerReadable,
        match=r"^psf__requests-6028: refused: its grading environment holds its "
        r"answer: .*planted/pip-cache\.whl!requests.* \(and 2 more\)$",
    ):
        refuse_readable_answers(task, needles, [View("its grading environment", planted)])
    assert len(list((tmp_path / "cache" / "answer-scans").iterdir())) == 2
    # another process (no memo): the same content is read from the cache, not scanned again
    monkeypatch.setattr(answers, "_checked", {})
    monkeypatch.setattr(answers, "scan", lambda *a, **k: pytest.fail("scanned the same content twice"))
    refuse_readable_answers(task, needles, [View("its grading environment", clean)])
    with pytest.raises(AnswerReadable):
        refuse_readable_answers(task, needles, [View("its grading environment", planted)])
    # changed content is scanned anew (by the next process)
    (clean / "new.py").write_text("y = 2\n")
    monkeypatch.setattr(answers, "_checked", {})
    with pytest.raises(pytest.fail.Exception, match="scanned the same content twice"):
        refuse_readable_answers(task, needles, [View("its grading environment", clean)])


@needs_root_fs
async def test_polar_tasks_audit_says_a_readable_answer_controls_the_reward(tmp_path: Path, monkeypatch):
    """``polar tasks audit``'s ``answer-readable`` check (cli/tasks_audit.py) opens the task's workspace as an
    episode does: a sandbox root holding a wheel with the fix refuses it, and the check says ``controls``;
    the real root ``resists``. (The planted root is a copy's stand-in: the real one must stay clean.)"""
    from polar_env.cli.tasks_audit import workspace_checks
    from polar_env.sandbox import rootfs
    from polar_env.tasks import answers

    task = TASKS["psf__requests-6028"]
    clean = await workspace_checks(task, "bubblewrap")
    assert clean["answer-readable"].verdict == "resists", clean
    planted = tmp_path / "root"
    (planted / "usr" / "share" / "python-wheels").mkdir(parents=True)
    (planted / "usr" / "share" / "python-wheels" / "requests-2.99.0-py3-none-any.whl").write_bytes(
        planted_wheel()
    )
    monkeypatch.setattr(rootfs, "sandbox_root", lambda: planted)
    monkeypatch.setattr(answers, "_checked", {})
    found = await workspace_checks(task, "bubblewrap")
    assert found["answer-readable"].verdict == "controls", found
    assert "the sandbox root holds its answer" in found["answer-readable"].detail, found


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("podman") is None or os.geteuid() != 0, reason="needs podman as host root")
@pytest.mark.parametrize("agent", ["uid", "userns", "root"])
async def test_a_python_harness_install_is_the_harness_alone_in_a_container(agent: str, tmp_path: Path):
    """In an episode's podman container: the sealed harness reads its Python install, a shell it starts
    (the agent's tools) does not; the same install is listed by a tool when it is not sealed (control:
    a grading container, which starts no sealed harness, binds it as it is). So too in a container of a
    user namespace of its own (the seal's group the host gid its harness group maps to), for the image's
    user and for its root; a root agent may take any group there, so its install is also scanned."""
    from polar_env.sandbox.container import ContainerSandbox
    from polar_env.tasks.images import ensure_base_image

    adapter = get_adapter("mini-swe-agent")
    if not adapter.is_installed():
        pytest.skip("mini-swe-agent is not installed (POLAR_SETUP_HARNESSES=1 scripts/setup.sh)")
    base = ensure_base_image("podman")
    spec = SandboxSpec(
        disk_bytes=64 << 20,
        workdir="/var/tmp",
        harness_dir=adapter.install_dir(),
        proxy_socket_dir=tmp_path,
        scratch_root=tmp_path / "scratch",
        userns=agent != "uid",
        **({"uid": 0, "home": "/root"} if agent == "root" else {}),
    )
    assert bool(readable_harness(spec)) == (agent == "root")  # what the answer check scans
    listing = "ls /opt/harness/lib >/dev/null 2>&1 && echo TOOLS listed || echo TOOLS denied"
    episode = ContainerSandbox.create(None, spec=spec, image=base, engine="podman", snapshot=False)
    plain = ContainerSandbox.create(
        None, spec=replace(spec, proxy_socket_dir=None), image=base, engine="podman", snapshot=False
    )
    try:
        sealed = await _as_harness(episode, ["bash", "-c", listing])
        own = await _as_harness(
            episode, ["python3", "-c", "import os; print('HARNESS', len(os.listdir('/opt/harness/lib')))"]
        )
        control = (await plain.run(["bash", "-c", listing], timeout_s=60)).stdout_tail
        view = episode.harness_view
    finally:
        await episode.destroy()
        await plain.destroy()
    assert "TOOLS denied" in sealed, sealed
    assert "HARNESS 1" in own, own
    assert "TOOLS listed" in control, control
    assert view is not None and not view.exists()  # its view was mounted on the host and is gone with it


# Run as root in the image build, in the task's workdir: the copies of a newer release a real image's
# environment holds beside the task's tree (pip's vendored copy, an sdist in a cache) and the metadata
# ``pip install .`` of the task leaves at its base version (no code: kept).
PLANT = r"""set -eu
cp -r /testbed /tmp/newer && cd /tmp/newer && git apply /tmp/layer/fix.patch
vendor=/usr/lib/python3/dist-packages/pip/_vendor && mkdir -p "$vendor" && cp -r requests "$vendor/"
mkdir -p /var/cache/pip-sdists && tar czf /var/cache/pip-sdists/requests-2.99.0.tar.gz requests
meta=/usr/local/lib/python3/site-packages/requests-2.27.0.dist-info
mkdir -p "$meta" && printf 'Name: requests\nVersion: 2.27.0\n' > "$meta/METADATA"
rm -rf /tmp/newer
"""
PLANTED = (
    "/usr/lib/python3/dist-packages/pip/_vendor/requests",
    "/var/cache/pip-sdists/requests-2.99.0.tar.gz",
)
KEPT = "/usr/local/lib/python3/site-packages/requests-2.27.0.dist-info/METADATA"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("podman") is None or os.geteuid() != 0, reason="needs podman as host root")
async def test_copies_of_the_answer_outside_the_tree_are_removed_from_the_image(tmp_path: Path, caplog):
    """A task image whose environment holds a newer release with the fix (what a real SWE-bench image of
    a requests task holds: pip's vendored ``requests``): the episode opens, its container and the grading
    container hold neither copy (the metadata of the task's own install is kept), and gold still earns
    1.0. The control: the warm image itself holds both, and the scan sees them there."""
    from dataset_standins import build_layer

    from polar_env.episodes.workspace import open_workspace
    from polar_env.rewards.grader import grade_task
    from polar_env.sandbox.warm_images import warm_image
    from polar_env.tasks import answers
    from polar_env.tasks.images import ensure_task_image
    from polar_env.tasks.runtime import container_spec, history_target, task_spec

    task = TASKS["psf__requests-5414"]
    task = task.model_copy(update={"image": ensure_task_image(task, "podman"), "base_archive": None})
    planting = {"plant.sh": PLANT, "fix.patch": task.patch}
    image = build_layer("podman", task.image, "polar-test-answers/5414", planting, "sh /tmp/layer/plant.sh")
    task = task.model_copy(update={"image": image})
    spec = container_spec(task, task_spec(task, SandboxSpec()), "podman")
    warm = warm_image("podman", image, spec, history_target(task))
    _, hits = answers._image_scan(task, "podman", warm, spec.workdir)
    under = {next((p for p in PLANTED if h.path.split("!")[0].startswith(p)), h.path) for h in hits}
    assert under == set(PLANTED), hits  # the control: both copies seen, nothing else

    ws = await open_workspace(task, SandboxSpec(scratch_root=tmp_path), sandbox="podman")
    try:
        listing = " ".join([*PLANTED, KEPT])
        seen = await ws.sandbox.run(
            ["sh", "-c", f"for p in {listing}; do [ -e $p ] && echo present $p || echo gone $p; done"]
        )
        assert seen.stdout_tail.split("\n")[:3] == [*(f"gone {p}" for p in PLANTED), f"present {KEPT}"], seen
    finally:
        await ws.close()
    removed = [r.getMessage() for r in caplog.records if "its answer outside its tree" in r.getMessage()]
    assert removed and PLANTED[0] in removed[0], removed  # said, naming what was removed

    grade = await asyncio.to_thread(grade_task, task, task.patch, kind="podman")
    assert (grade.reward, grade.failure_kind.value) == (1.0, "none"), grade


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("podman") is None or os.geteuid() != 0, reason="needs podman as host root")
def test_an_image_no_engine_mounts_is_exported_scanned_and_pruned(tmp_path: Path, monkeypatch):
    """Docker, and podman without root, cannot mount an image from the host: there the image is exported,
    scanned, and its copies of the answer removed by its own ``sh`` as root. That route, forced here on
    podman (`mountable` patched to False: a test double standing for docker, which does not run here), finds
    the planted copies in the exported files (the control: a plain listing of the image shows them), and
    its pruned image holds neither while the task's own install metadata stays."""
    from dataset_standins import build_layer, in_image

    from polar_env.sandbox import image_files, warm_images
    from polar_env.sandbox.container import engine_run
    from polar_env.tasks import answers
    from polar_env.tasks.images import ensure_task_image

    task = TASKS["psf__requests-5414"]
    task = task.model_copy(update={"image": ensure_task_image(task, "podman"), "base_archive": None})
    planting = {"plant.sh": PLANT, "fix.patch": task.patch}
    image = build_layer("podman", task.image, "polar-test-answers/5414", planting, "sh /tmp/layer/plant.sh")
    task = task.model_copy(update={"image": image})
    listing = " ".join([*PLANTED, KEPT])
    probe = f"for p in {listing}; do [ -e $p ] && echo present $p || echo gone $p; done"
    shown = subprocess.run(in_image("podman", image, probe), capture_output=True, text=True, check=True)
    assert shown.stdout.split("\n")[:3] == [f"present {p}" for p in [*PLANTED, KEPT]], shown.stdout

    for module in (image_files, warm_images):
        monkeypatch.setattr(module, "mountable", lambda engine: False)
    monkeypatch.setenv("POLAR_CACHE", str(tmp_path))  # scanned afresh, not read from an earlier scan
    answers._images.clear()
    _, hits = answers._image_scan(task, "podman", image, "/testbed")
    under = {next((p for p in PLANTED if h.path.split("!")[0].startswith(p)), h.path) for h in hits}
    assert under == set(PLANTED), hits

    pruned = warm_images.without_paths("podman", image, [h.path.split("!")[0] for h in hits])
    engine_run(["podman", "rmi", "-f", pruned])  # made again below, by this route
    pruned = warm_images.without_paths("podman", image, [h.path.split("!")[0] for h in hits])
    left = subprocess.run(in_image("podman", pruned, probe), capture_output=True, text=True, check=True)
    assert left.stdout.split("\n")[:3] == [*(f"gone {p}" for p in PLANTED), f"present {KEPT}"], left.stdout
