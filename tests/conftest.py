"""Shared fixtures; keep each small."""

from __future__ import annotations

import functools
import getpass
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import own_containers  # noqa: F401  (labels this process's containers first)
import pytest
from outside_reads import OutsideReadGuard, install
from vllm_server import VllmServer, running_vllm_server

from polar_env.backends.embedded import embedded_model_dir
from polar_env.cache import cache_root
from polar_env.sandbox.rootfs import rootfs_dir

REPO = Path(__file__).resolve().parents[1]
# installed before any test module is imported, so reads at collection time are seen too
GUARD = install(
    OutsideReadGuard(
        REPO,
        allowed=(
            cache_root(),
            Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"),
            Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}",
        ),
    )
)


def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp and not REPO.is_relative_to(Path(config.option.basetemp).resolve()):
        GUARD.allowed += (Path(config.option.basetemp).resolve(),)


def pytest_collection_finish(session: pytest.Session) -> None:
    if reads := GUARD.take():
        raise pytest.UsageError(
            f"collecting the tests read paths outside the repository: {sorted(set(reads))}"
        )


# what ``@pytest.mark.needs(...)`` may name: the one place a test's sandbox prerequisites are checked
NEEDS = {
    "bwrap": lambda: shutil.which("bwrap") is not None,
    "npm": lambda: shutil.which("npm") is not None,  # the npm harnesses' installs
    "sandbox-root": lambda: (rootfs_dir() / ".polar-rootfs-ready").is_file(),  # built by scripts/setup.sh
}


@functools.cache
def has(name: str) -> bool:
    return NEEDS[name]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.needs("bwrap", "npm")`` skips a test whose machine lacks one of them."""
    for item in items:
        wanted = [name for mark in item.iter_markers("needs") for name in mark.args]
        if unknown := set(wanted) - set(NEEDS):
            raise pytest.UsageError(f"{item.nodeid}: needs {sorted(unknown)}: not one of {sorted(NEEDS)}")
        if missing := [name for name in dict.fromkeys(wanted) if not has(name)]:
            item.add_marker(pytest.mark.skip(reason=f"needs {' and '.join(missing)}"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    GUARD.take()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A test that read a file beside the clone fails: a fresh clone would not have it."""
    result = yield
    if reads := GUARD.take():
        pytest.fail(f"read paths outside the repository: {sorted(set(reads))}", pytrace=False)
    return result


@pytest.fixture(scope="session", autouse=True)
def own_gold_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """This test process's gold runs (rewards/gold_runs.py) apart from the node's and every other test
    process's: a test that bends the grader on purpose never stores the gold a later run believes."""
    os.environ["POLAR_GOLD_CACHE"] = str(tmp_path_factory.mktemp("gold"))
    yield
    os.environ.pop("POLAR_GOLD_CACHE", None)


@pytest.fixture(scope="session")
def embedded_dir() -> Path:
    """The embedded SmolLM2 model as a float32 HF directory (converted from the GGUF on first use)."""
    return embedded_model_dir()


@pytest.fixture(scope="session")
def renderer(embedded_dir: Path):
    """The real SmolLM2 tokenizer with Polar's tools-aware Hermes template."""
    from polar_env.chat.template import ChatRenderer

    return ChatRenderer.from_pretrained(embedded_dir)


@pytest.fixture(scope="session")
def local_backend(embedded_dir: Path):
    """The real embedded model, in process (float32, CPU)."""
    from polar_env.backends.local import LocalBackend

    return LocalBackend.from_pretrained(embedded_dir)


@pytest.fixture
def scripted_backend_factory(local_backend):
    """``factory(policy)``: a backend whose text the policy picks and whose logprobs the real model scores."""
    from polar_env.backends.scripted import ScriptedBackend

    return lambda policy, **kw: ScriptedBackend(local_backend, policy, **kw)


@pytest.fixture
def proxy_factory(renderer, tmp_path: Path):
    """``proxy_factory(backend, data_dir=tmp_path / "ledger", **settings)``: a proxy over ``backend`` with
    the embedded model's renderer, assembled by ``build_proxy`` as every command assembles one
    (tests/proxy_client.py ``make_proxy``; ``settings``: ``ProxySettings`` fields)."""
    from proxy_client import make_proxy

    def factory(backend, data_dir: Path | None = None, **settings):
        return make_proxy(renderer, backend, data_dir or tmp_path / "ledger", **settings)

    return factory


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    """A real vLLM CPU server on the embedded model: defined here so every module that uses it
    (tests/backends/test_backend_vllm.py, tests/proxy/test_proxy_vllm.py) shares the one server of the
    process."""
    with running_vllm_server() as server:
        yield server


@pytest.fixture
def apptainer_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """apptainer cannot be installed here: ``apptainer`` on PATH is a stand-in that runs each exec as a
    ``podman run`` of the same image with the same binds, user, env and network
    (tests/apptainer_standin.py), so what is tested is how Polar drives apptainer, not apptainer. Its
    calls are logged to the returned file; the image's tree is copied out into this test's base cache."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text(Path(__file__).with_name("apptainer_standin.py").read_text())
    (bin_dir / "apptainer").chmod(0o755)
    log = tmp_path / "apptainer.log"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_APPTAINER_LOG", str(log))
    monkeypatch.setenv("POLAR_BASE_CACHE", str(tmp_path / "bases"))
    return log
