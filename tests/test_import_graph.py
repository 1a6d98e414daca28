"""polar_env has no import circles, counting imports inside functions too (a lazy import still ties
two modules together), so each package can be read, tested and replaced on its own. Imports made
only for type checkers (``if TYPE_CHECKING:``) are left out: they never run."""

from __future__ import annotations

import graphlib

import grimp


def test_polar_env_has_no_import_circles():
    graph = grimp.build_graph("polar_env", cache_dir=None, exclude_type_checking_imports=True)
    imports = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    assert len(imports) > 50, "the graph should cover the whole package"
    try:
        graphlib.TopologicalSorter(imports).prepare()
    except graphlib.CycleError as exc:
        raise AssertionError(f"import circle: {' -> '.join(exc.args[1])}") from None

