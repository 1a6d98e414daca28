"""`polar tasks pull`: images pulled once, a few at a time, retried on rate limits, pruned to a budget.

No registry is reachable here, and a real one cannot be made to answer 429 on purpose, so the
engine is a test double: a `podman` script on PATH that keeps its images in a folder, answers
`image inspect`/`rmi` from it, and fails `pull` with the registry's rate-limit message as often
as the test says (the failure the retry exists for, which cannot be provoked otherwise).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from polar_env.cli.tasks_pull import PullFailed, PullPolicy, pull_all, pull_image
from polar_env.sandbox.pulled_images import PulledImages

FAKE_PODMAN = textwrap.dedent('''\
    #!{python}
    """A podman that pulls from nowhere (tests/tasks/test_tasks_pull.py)."""
    import os, sys, time
    from pathlib import Path
    state = Path(os.environ["FAKE_ENGINE_STATE"])
    args = sys.argv[1:]
    image = args[-1] if args else ""
    have = state / "images" / image.replace("/", "_")
    if args[:1] == ["info"]:
        print("{{}}")
    elif args[:2] == ["image", "inspect"]:
        if not have.exists():
            sys.exit(125)
        print(have.read_text() if "--format" in args else "[{{}}]")
    elif args[:1] == ["rmi"]:
        have.unlink()
    elif args[:1] == ["pull"]:
        tries = state / "tries" / image.replace("/", "_")
        n = int(tries.read_text()) + 1 if tries.exists() else 1
        tries.write_text(str(n))
        active = state / "active" / f"{{image.replace('/', '_')}}"
        active.touch()
        state.joinpath("peak", f"{{len(list((state / 'active').iterdir()))}}").touch()
        time.sleep(0.3)
        active.unlink()
        fails = int(os.environ.get("FAKE_RATE_LIMITED", "0"))
        if image.startswith("missing/"):
            sys.exit(print("Error: initializing source docker://" + image + ": manifest unknown", \
file=sys.stderr) or 125)
        if n <= fails:  # docker's words, then podman's
            sys.exit(print(\
"Error response from daemon: toomanyrequests: You have reached your pull rate limit."
                           if n % 2 else \
"Error: reading manifest 1 in docker.io/library/x: received unexpected "
                           "HTTP status: 429 Too Many Requests", file=sys.stderr) or 125)
        have.write_text(os.environ.get("FAKE_IMAGE_SIZE", "1000"))
    else:
        sys.exit(2)
''')


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir, state = tmp_path / "bin", tmp_path / "engine"
    for d in (bin_dir, state / "images", state / "tries", state / "active", state / "peak"):
        d.mkdir(parents=True)
    podman = bin_dir / "podman"
    podman.write_text(FAKE_PODMAN.format(python=sys.executable))
    podman.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ENGINE_STATE", str(state))
    monkeypatch.setenv("POLAR_CACHE", str(tmp_path / "cache"))
    return state


def test_a_rate_limited_pull_is_retried_with_exponential_backoff(
    engine: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("FAKE_RATE_LIMITED", "2")
    waits: list[float] = []
    assert pull_image("podman", "docker.io/library/x:1", PullPolicy(backoff_s=0.5), sleep=waits.append) == 3
    assert waits == [0.5, 1.0] and (engine / "images" / "docker.io_library_x:1").exists()


def test_a_pull_that_is_not_rate_limited_fails_at_once(engine: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FAKE_RATE_LIMITED", "9")
    waits: list[float] = []
    with pytest.raises(PullFailed, match="manifest unknown"):
        pull_image("podman", "missing/y:1", PullPolicy(), sleep=waits.append)
    assert waits == [] and (engine / "tries" / "missing_y:1").read_text() == "1"
    with pytest.raises(PullFailed, match="still rate-limited after 3 attempts"):
        pull_image("podman", "docker.io/library/z:1", PullPolicy(retries=2), sleep=waits.append)


def test_pulls_are_bounded_and_each_image_is_pulled_once(engine: Path, tmp_path: Path):
    images = [f"docker.io/polar/i{n}:1" for n in range(5)]
    ledger = PulledImages(tmp_path / "images.json")
    first = pull_all("podman", images, PullPolicy(concurrency=2), ledger)
    assert all(v.startswith("pulled") for v in first.values()), first
    assert max(int(p.name) for p in (engine / "peak").iterdir()) <= 2  # never more than 2 pulls at once
    assert set(ledger.entries()) == set(images) and {e["size"] for e in ledger.entries().values()} == {1000}
    again = pull_all("podman", images, PullPolicy(concurrency=2), ledger)
    assert set(again.values()) == {"present"}
    assert {(engine / "tries" / i.replace("/", "_")).read_text() for i in images} == {"1"}


def test_the_disk_budget_removes_the_least_recently_used_images_polar_pulled(engine: Path, tmp_path: Path):
    ledger = PulledImages(tmp_path / "images.json")
    pull_all("podman", ["old:1", "mid:1", "new:1"], PullPolicy(concurrency=1), ledger)
    (engine / "images" / "theirs:1").write_text("5000")  # on the node before: not Polar's to remove
    entries = ledger.entries()
    for age, image in enumerate(["new:1", "mid:1", "old:1"]):
        entries[image]["last_used"] = 1000.0 - age
    ledger.path.write_text(json.dumps(entries))
    ledger.touch("old:1")  # an episode just used it: now the most recent
    assert ledger.prune("podman", budget_bytes=2000, keep={"new:1"}) == ["mid:1"]
    assert sorted(p.name for p in (engine / "images").iterdir()) == ["new:1", "old:1", "theirs:1"]
    assert ledger.prune("podman", budget_bytes=0, keep={"new:1"}) == ["old:1"]  # what the file names stays
    assert set(ledger.entries()) == {"new:1"}


def test_the_cli_pulls_what_a_task_file_names(engine: Path, tmp_path: Path):
    rows = [
        {
            "instance_id": f"a__b-{n}",
            "repo": "a/b",
            "image": f"localhost/polar-test/t{n % 2}:1",
            "problem_statement": "x",
            "patch": "",
            "test_patch": "",
            "FAIL_TO_PASS": "[]",
            "PASS_TO_PASS": "[]",
        }
        for n in range(3)
    ]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**os.environ, "FAKE_RATE_LIMITED": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "polar_env.cli",
            "tasks",
            "pull",
            str(tasks),
            "--engine",
            "podman",
            "--backoff",
            "0.01",
            "--disk-budget",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "localhost/polar-test/t0:1: pulled (2 attempts)",
        "localhost/polar-test/t1:1: pulled (2 attempts)",
    ]
    assert "2 images: 2 ready, 0 failed" in proc.stderr
    assert set(json.loads((tmp_path / "cache" / "images.json").read_text())) == {
        "localhost/polar-test/t0:1",
        "localhost/polar-test/t1:1",
    }


@pytest.mark.parametrize("spelling", ["NAME:FILE", "FILE"])
def test_the_cli_pulls_each_datasets_own_image(engine: Path, tmp_path: Path, spelling: str):
    """A file of every dataset's rows (each in its published schema), given as ``NAME:FILE.jsonl`` or as a
    plain ``FILE.jsonl`` recognised by schema: each row's image is the one its dataset's loader names
    (SWE-Gym's own, not SWE-bench's), pulled once."""
    from repo_paths import FIXTURES

    from polar_env.tasks.datasets import DATASETS

    files = sorted((FIXTURES / "datasets").glob("*.jsonl"))
    assert sorted(f.stem for f in files) == sorted(DATASETS)  # one row file per loader
    for source in files:
        name = source.stem
        (row,) = [json.loads(line) for line in source.read_text().splitlines()]
        want = DATASETS[name].to_task(row).image
        assert want, name
        rows = tmp_path / f"{name}.jsonl"
        rows.write_text(json.dumps(row) + "\n")
        spec = f"{name}:{rows}" if spelling == "NAME:FILE" else str(rows)
        proc = subprocess.run(
            [sys.executable, "-m", "polar_env.cli", "tasks", "pull", spec, "--engine", "podman"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, (name, proc.stderr)
        assert proc.stdout.splitlines() == [f"{want}: pulled (1 attempt)"], (name, proc.stdout)
