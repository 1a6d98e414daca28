"""polar_env has no import circles between its files, counting imports inside functions (a lazy import
still ties two modules together) and imports made only for type checkers (``if TYPE_CHECKING:``: the
two files still cannot be read one without the other), so each package can be read, tested and
replaced on its own; and every package keeps its layer (docs/architecture.md, "Layers"): a package
imports only packages of lower layers, at module level or inside a function, and nothing imports the
commands (``cli/``, the top), unless the import is listed in ``UPWARD`` with its reason. A new package
must be given a layer. The layers leave out type checkers' imports: they never run."""

from __future__ import annotations

import graphlib
import re

import grimp
import pytest
from repo_paths import REPO

DOC = REPO / "docs" / "architecture.md"

# bottom first; a top-level module counts as a package of its own
LAYERS: list[set[str]] = [
    {"environment"},
    {
        "cache",
        "event_loop",
        "fastjson",
        "gym_lifespan",
        "janitor",
        "metrics",
        "safe_text",
        "spawn_pool",
        "stop_signal",
    },
    {"chat"},
    {"outcomes", "wire"},
    {"backends", "sandbox"},
    {"grades"},
    {"tasks", "trajectory"},
    {"harness_adapters", "viewer"},
    {"proxy", "rewards"},
    {"episodes"},
    {"resources_server", "rollout"},
    {"agent_server", "training"},
]
TOP = "cli"
# (importer module, imported module) -> why it may cross a layer upward
UPWARD: dict[tuple[str, str], str] = {}


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("polar_env", cache_dir=None, exclude_type_checking_imports=True)


@pytest.fixture(scope="module")
def graph_with_type_imports() -> grimp.ImportGraph:
    return grimp.build_graph("polar_env", cache_dir=None, exclude_type_checking_imports=False)


def package(module: str) -> str:
    """``polar_env.proxy.app`` -> ``proxy``; ``polar_env.outcomes`` -> ``outcomes``."""
    return module.split(".")[1] if module.count(".") else module


def test_polar_env_has_no_file_circles(graph_with_type_imports: grimp.ImportGraph):
    graph = graph_with_type_imports
    imports = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    assert len(imports) > 50, "the graph should cover the whole package"
    try:
        graphlib.TopologicalSorter(imports).prepare()
    except graphlib.CycleError as exc:
        raise AssertionError(f"import circle: {' -> '.join(exc.args[1])}") from None


def test_every_package_imports_only_downward(graph: grimp.ImportGraph):
    layer_of = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    packages = {package(m) for m in graph.modules} - {"polar_env", TOP}
    assert set(layer_of) <= packages, "a layer names a package that does not exist"
    assert packages <= set(layer_of), f"give these packages a layer: {sorted(packages - set(layer_of))}"
    upward = []
    for importer in sorted(graph.modules):
        mine = layer_of.get(package(importer))
        if mine is None:
            continue  # the root package and cli/: the top imports anything
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            theirs, same = layer_of.get(package(imported)), package(imported) == package(importer)
            if not same and (theirs is None or theirs >= mine) and (importer, imported) not in UPWARD:
                upward.append(f"{importer} -> {imported}")
    upward += [
        f"{importer} -> {imported}"
        for importer in sorted(graph.modules)
        if package(importer) != TOP
        for imported in sorted(graph.find_modules_directly_imported_by(importer))
        if package(imported) == TOP and (importer, imported) not in UPWARD
    ]
    assert upward == [], (
        "imports that do not point down a layer (move the code, or list it in UPWARD with why)"
    )
    assert set(UPWARD) <= {(a, b) for a in graph.modules for b in graph.find_modules_directly_imported_by(a)}


def test_the_benchmarks_stay_outside_the_package():
    """``bench/`` measures the product and imports it; nothing in ``polar_env`` imports ``bench``."""
    both = grimp.build_graph("polar_env", "bench", cache_dir=None, exclude_type_checking_imports=True)
    assert any(m.startswith("bench.") for m in both.modules), "bench/ beside the package"
    inward = [
        (a, b)
        for a in sorted(both.modules)
        if a.startswith("polar_env")
        for b in both.find_modules_directly_imported_by(a)
        if b.split(".")[0] == "bench"
    ]
    assert inward == []


def test_the_architecture_page_draws_these_layers():
    block = re.search(r"## Layers\n.*?```\n(.*?)```", DOC.read_text(), re.S)
    assert block, "docs/architecture.md has a '## Layers' section with the layer diagram"
    drawn = [set(line.split("│")[1].split()) for line in block.group(1).splitlines() if line.startswith("│")]
    assert drawn == LAYERS[::-1]  # drawn top first


def test_a_test_file_imports_tests_only_from_its_own_folder():
    """scripts/test.sh runs each test file in its own pytest, where only ``tests/`` (the shared
    helpers) and the file's own folder are importable: a test module of another folder imports only
    when some earlier file in the same process happened to import it first."""
    tests = REPO / "tests"
    reaching = []
    for path in sorted(tests.glob("*/test_*.py")):
        for name in re.findall(r"^\s*(?:from|import) (test_\w+)", path.read_text(), re.MULTILINE):
            if not (path.parent / f"{name}.py").exists():
                reaching.append(f"{path.relative_to(tests)} imports {name}")
    assert not reaching, "move what they share into a helper module in tests/: " + "; ".join(reaching)


def test_no_two_classes_share_a_name_outside_the_per_api_models():
    """A reader who meets a class by name finds one definition (two ``GradingLimits`` on one grading
    path once meant two things). The wire models are the exception by design: one module per API
    (``wire/`` and the codecs' request models), where the same concept (``Usage``, ``FunctionCall``)
    keeps each API's own name."""
    where: dict[str, list[str]] = {}
    for path in sorted((REPO / "polar_env").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(("polar_env/wire/", "polar_env/proxy/codecs/")):
            continue
        for name in re.findall(r"^class (\w+)", path.read_text(), re.MULTILINE):
            where.setdefault(name, []).append(rel)
    assert {name: files for name, files in where.items() if len(files) > 1} == {}
