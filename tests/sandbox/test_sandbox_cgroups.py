"""cgroup limits without a sandbox around them, so the check runs wherever cgroups can be delegated
(a pure cgroup v2 host without bubblewrap too): which version limits each controller, and that the
limit holds. The sandbox's own test (test_sandbox_bubblewrap.py) proves the same through bwrap."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from polar_env.sandbox.cgroups import CgroupLimits

HOG = "b = bytearray(256 << 20); b[::4096] = b'x' * len(b[::4096]); print('survived')"
FORKS = (
    "import subprocess\nkids = []\nfor _ in range(40):\n    try:\n"
    "        kids.append(subprocess.Popen(['sleep', '30']))\n    except OSError:\n        break\n"
    "print(len(kids))\nfor k in kids:\n    k.kill()\n"
)


def _probe() -> CgroupLimits:
    probe = CgroupLimits(f"probe-{os.getpid()}", 1 << 30, 64)
    probe.remove()
    return probe


PROBE = _probe()


@pytest.mark.skipif(PROBE.mode is None, reason=f"neither cgroup v2 nor v1 limits work here: {PROBE.skipped}")
def test_the_active_cgroup_version_enforces_each_limit(record_property):
    limits = CgroupLimits(f"test-{os.getpid()}", 64 << 20, 16)
    record_property("cgroup_mode", limits.mode)
    print(
        f"cgroup limits: {limits.mode} {limits.versions}; not limited: {limits.skipped or 'none'}; "
        f"v2 not used: {limits.v2_unavailable or '-'}"
    )
    groups = list(limits.dirs)
    try:
        assert limits.applied and set(limits.applied) | set(limits.skipped) == {"memory", "pids"}
        assert [int(limits.knob(c).read_text()) for c in limits.applied] == [
            {"memory": 64 << 20, "pids": 16}[c] for c in limits.applied
        ]
        if "memory" in limits.applied:
            hog = subprocess.run(
                [sys.executable, "-c", HOG], preexec_fn=limits.join, capture_output=True, text=True
            )
            assert hog.returncode != 0 and "survived" not in hog.stdout, hog
            fine = subprocess.run(
                [sys.executable, "-c", "b = bytearray(8 << 20); print('fine')"],
                preexec_fn=limits.join,
                capture_output=True,
                text=True,
            )
            assert fine.stdout.strip() == "fine", fine
        if "pids" in limits.applied:
            forks = subprocess.run(
                [sys.executable, "-c", FORKS], preexec_fn=limits.join, capture_output=True, text=True
            )
            assert 0 < int(forks.stdout.strip()) < 16, forks
    finally:
        limits.remove()
    assert not any(g.exists() for g in groups)
