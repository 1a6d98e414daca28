"""Canaries the tested code cannot tell from the task's tests (rewards/canaries.py).

The mutants are written into the F2P test files, the plugin is told nothing of them, and only the
grader knows that each must fail where its original passes. A forgery that reports the truth for
whatever a plugin defines in memory (the canaries of the last round) and `passed` for the rest now
lies about a mutant too, and gets 0, with no static flag to help.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from repo_paths import REDTEAM

from polar_env.rewards.canaries import CanaryPlan, plan_canaries
from polar_env.rewards.flags import tampering_flags
from polar_env.rewards.grading import grade
from polar_env.tasks.loader import load_tasks

TASKS = {t.instance_id: t for t in load_tasks("bundled")}
needs_bwrap = pytest.mark.needs("bwrap")

SOURCE = """import pytest


@pytest.mark.parametrize("n", [1, 2])
def test_double_value(n):
    value = sum([n, n])
    assert value == n + n


class TestParser:
    def test_parse_empty(self):
        with pytest.raises(ValueError):
            int("")

    def test_parse_number(self):
        assert int("3") == 3
"""


def test_every_test_renamed_and_canonical_and_only_the_grader_knows_the_mutants():
    f2p = ["tests/test_x.py::test_double_value[1]", "tests/test_x.py::TestParser::test_parse_empty"]
    plan = plan_canaries({"tests/test_x.py": SOURCE}, f2p, extra=1)
    text = plan.files["tests/test_x.py"]
    tree = ast.parse(text)
    defs = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert len(plan.expect) == 3 and not defs & {"test_double_value", "test_parse_empty", "test_parse_number"}
    assert {plan.task_id(w) for w in plan.renamed} == {
        "tests/test_x.py::test_double_value",
        "tests/test_x.py::TestParser::test_parse_empty",
        "tests/test_x.py::TestParser::test_parse_number",
    }
    words = {"double", "value", "parse", "empty", "number"}
    for canary, source in plan.expect.items():
        name = canary.rpartition("::")[2]
        parts = name.removeprefix("test_").split("_")
        assert name in defs and {w for w in parts if not w.isdigit()} <= words, name  # the file's own words
        assert (
            canary.rpartition("::")[0] == source.rpartition("::")[0]
        )  # same module or class as its original
        assert source in plan.renamed  # the original runs under a fresh name too
    assert text.count("@pytest.mark.parametrize('n', [1, 2])") == 2  # the decorator came along, canonical
    assert (
        "    assert value == n + n" in text and '"' not in text.split("import pytest", 1)[1].split("class")[0]
    )
    # the ids the run reports map back to the task's; a directive naming a test names its written twin
    assert (
        plan.task_id(plan.written("tests/test_x.py::test_double_value[1]"))
        == "tests/test_x.py::test_double_value[1]"
    )
    # what a run must show: each canary FAILED wherever its original PASSED, collected at all
    ids = [c + "[1]" if "double" in plan.task_id(s) else c for c, s in plan.expect.items()]
    src_ids = [s + "[1]" if "double" in plan.task_id(s) else s for s in plan.expect.values()]
    honest = {**{s: "PASSED" for s in src_ids}, **{c: "FAILED" for c in ids}}
    assert plan.violations(honest, [*src_ids, *ids]) == []
    assert plan.violations({**honest, ids[0]: "PASSED"}, [*src_ids, *ids])  # forged: a mutant passed
    assert plan.violations(honest, src_ids)  # a canary deselected
    assert plan.violations({**honest, src_ids[0]: "FAILED", ids[0]: "PASSED"}, [*src_ids, *ids]) == []


def test_mutations_are_literals_or_a_raises_toggle_never_a_flip():
    """Over many plans: every mutant differs from its original by a same-typed literal or a raises block
    added or removed, never by ``==``/``!=``, ``in``/``not in`` or a negation."""
    kinds = set()
    for i in range(60):
        f2p = ["tests/test_x.py::TestParser::" + ("test_parse_number", "test_parse_empty")[i % 2]]
        plan = plan_canaries({"tests/test_x.py": SOURCE}, f2p, extra=0)
        tree = ast.parse(plan.files["tests/test_x.py"])
        funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        ((canary, source),) = plan.expect.items()
        mutant, original = funcs[canary.rpartition("::")[2]], funcs[source.rpartition("::")[2]]
        ops = [type(n).__name__ for f in (mutant, original) for n in ast.walk(f) if isinstance(n, ast.cmpop)]
        assert set(ops) <= {"Eq"}, ops
        withs = [sum(isinstance(n, ast.With) for n in ast.walk(f)) for f in (mutant, original)]
        consts = [[n.value for n in ast.walk(f) if isinstance(n, ast.Constant)] for f in (mutant, original)]
        kinds.add("raises" if withs[0] != withs[1] else "literal" if consts[0] != consts[1] else "?")
    assert kinds == {"raises", "literal"}, kinds


def test_file_with_nothing_to_invert_still_gets_a_failing_canary():
    plan = plan_canaries({"t.py": "def test_smoke():\n    print('x')\n"}, ["t.py::test_smoke"])
    assert list(plan.expect.values()) == [None]
    assert list(plan.expect) == ["t.py::test_smoke_2"]  # its own word, numbered: never the original's name
    assert plan.violations({}, []) and plan.violations({c: "PASSED" for c in plan.expect}, list(plan.expect))


def test_the_bundled_f2p_tests_all_get_mutants():
    """Every bundled task's F2P files yield real mutants (not the fallback), and the files still parse."""
    from polar_env.tasks.tree import git, materialize

    for task in TASKS.values():
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            tree = materialize(task, Path(tmp) / "tree")
            git(tree, "apply", "-", input=task.test_patch.encode())
            files = {t.split("::")[0] for t in task.FAIL_TO_PASS}
            plan = plan_canaries({f: (tree / f).read_text() for f in files}, task.FAIL_TO_PASS)
        f2p_funcs = {t.partition("[")[0] for t in task.FAIL_TO_PASS}
        twinned = {plan.task_id(v) for v in plan.expect.values() if v}
        # an F2P test with no site to mutate for certain (requests-6028's one plain comparison) has no twin
        # in every plan (the planner draws; some of its plans have none, and its canary is then the fallback)
        if task.instance_id != "psf__requests-6028":
            assert f2p_funcs <= twinned and twinned, task.instance_id
        for text in plan.files.values():
            ast.parse(text)


def test_plugin_config_names_no_canary():
    from polar_env.rewards import report_plugin

    assert "canar" not in Path(report_plugin.__file__).read_text().split('"""', 2)[2].lower()
    assert isinstance(CanaryPlan().expect, dict)


@needs_bwrap
def test_outcome_forgery_that_spares_plugin_canaries_gets_zero():
    """Failed before the grader wrote its canaries into the files (the forgery got 1.0: only the
    static check could have stopped it, and it raises no flag); now a mutant it reports passed is 0."""
    task = TASKS["pallets__flask-5014"]
    entry = next(
        e
        for e in json.loads((REDTEAM / "manifest.json").read_text())
        if e["id"] == "outcome-property-spares-canaries"
    )
    patch = (REDTEAM / entry["patch"]).read_text()
    assert tampering_flags(patch, task.repo, task.problem_statement) == {}
    result = grade(task, patch)
    assert result.reward == 0.0 and not result.failure_kind.outside_policy, (result.error, result.flags)
    assert "canary" in result.flags, result.flags
    assert grade(task, task.patch).reward == 1.0
