"""Apptainer sandbox for clusters without Docker (HPC): SWE-bench images run as SIFs or ``docker://``.

Apptainer keeps no container alive between commands, so each ``run`` is one ``apptainer exec``
with ``--containall`` (own PID/IPC namespaces, clean env) and ``--net --network none``. The task
tree lives on the host (extracted from the image's /testbed at create, or copied from
``task_tree``) and is bound at /testbed, so copy and diff are host-side, as in bubblewrap.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from polar_env.sandbox import gitdiff
from polar_env.sandbox.base import (
    Deadline,
    RunResult,
    SandboxSpec,
    copy_path,
    run_process_tree,
)
from polar_env.sandbox.bubblewrap import FORWARDER_INSIDE, FORWARDER_SRC
from polar_env.sandbox.host_tree import HostTreeSandbox, copy_tree


class ApptainerSandbox(HostTreeSandbox):
    engine = "apptainer"

    def __init__(self, spec: SandboxSpec, image: str, root: Path, extra_ro_mounts: Sequence[tuple[str, str]] = (),
                 isolate_network: bool = True):
        self.spec = spec
        self.image = image  # a .sif path or docker://swebench/sweb.eval...
        self.root = root  # host dir: testbed/ home/ git/
        self.extra_ro_mounts = list(extra_ro_mounts)
        self.isolate_network = isolate_network  # --network none needs root or --fakeroot on most sites
        self.clone = ""  # how the tree was copied from its warm base ("reflink" or "copy")
        self._destroyed = False

    def exec_argv(self, cmd: Sequence[str], env: dict[str, str]) -> list[str]:
        s = self.spec
        argv = [self.engine, "exec", "--containall", "--cleanenv", "--writable-tmpfs", "--no-mount", "cwd",
                "--hostname", s.hostname, "--home", f"{self.root / 'home'}:{s.home}", "--pwd", s.workdir]
        if self.isolate_network:
            argv += ["--net", "--network", "none"]
        binds = [f"{self.testbed}:{s.workdir}", f"{FORWARDER_SRC}:{FORWARDER_INSIDE}:ro"]
        if s.harness_dir is not None:
            binds.append(f"{s.harness_dir}:/opt/harness:ro")
        if s.proxy_socket_dir is not None:
            binds.append(f"{s.proxy_socket_dir}:/run/proxy:ro")
        binds += [f"{src}:{dst}:ro" for src, dst in self.extra_ro_mounts]
        for bind in binds:
            argv += ["--bind", bind]
        for key, value in {**s.base_env(), **env}.items():
            argv += ["--env", f"{key}={value}"]
        return argv + [self.image, *cmd]

    def extract_argv(self, dest: Path) -> list[str]:
        """Copy the image's own /testbed out to the host (the SWE-bench base checkout)."""
        return [self.engine, "exec", "--containall", "--bind", f"{dest}:/polar-out", self.image,
                "cp", "-a", f"{self.spec.workdir}/.", "/polar-out/"]

    @classmethod
    def create(cls, task_tree: Path | None, *, spec: SandboxSpec, image: str = "",
               extra_ro_mounts: Sequence[tuple[str, str]] = (), isolate_network: bool = True,
               snapshot: Path | None = None) -> ApptainerSandbox:
        """A sandbox of ``image`` with a copy of ``task_tree`` (with ``snapshot``: the warm base's git
        dir, borrowed, tasks/base_trees.py), or the image's own tree copied out now."""
        if not image:
            raise ValueError("ApptainerSandbox needs an image (a .sif or docker://...)")
        if spec.scratch_root is not None:
            spec.scratch_root.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="polar-apptainer-", dir=spec.scratch_root))
        sb = cls(spec, image, root, extra_ro_mounts, isolate_network)
        (root / "home").mkdir()
        if task_tree is not None:
            sb.clone = copy_tree(task_tree, sb.testbed)
        else:
            sb.testbed.mkdir()
            try:
                extract_image_tree(image, spec, sb.testbed)
            except RuntimeError:
                shutil.rmtree(root, ignore_errors=True)
                raise
        if snapshot is not None and task_tree is not None:
            gitdiff.borrow_snapshot(snapshot, sb.git_dir)
        else:
            gitdiff.snapshot(sb.testbed, sb.git_dir)
        return sb


    async def run(self, cmd: Sequence[str], *, env: dict[str, str] | None = None, timeout_s: float | Deadline = 600.0,
                  stdin: bytes | None = None, max_output_bytes: int = 1 << 20) -> RunResult:
        return await run_process_tree(self.exec_argv(cmd, env or {}), timeout_s=timeout_s, stdin=stdin,
                                      max_output_bytes=max_output_bytes)

    async def copy_in(self, src: Path, dst: str) -> None:
        copy_path(src, self.host_path(dst))



def extract_image_tree(image: str, spec: SandboxSpec, dest: Path) -> None:
    """``image``'s own tree (``spec.workdir``: the SWE-bench base checkout) copied out to ``dest``, an
    existing empty dir (once per node and image: tasks/base_trees.py ``warm_image_base``)."""
    proc = subprocess.run(ApptainerSandbox(spec, image, dest).extract_argv(dest), capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"apptainer extract failed: {proc.stderr.decode(errors='replace')[-2000:]}")
