"""SWE-smith (``SWE-bench/SWE-smith``): synthetic bugs in a repository snapshot.

Checked against the ``swesmith`` package 0.0.9 (PyPI; ``profiles/base.py``, ``profiles/python.py``,
``harness/utils.py``, ``harness/eval.py``) and github.com/SWE-bench/SWE-smith@cf2e649
(``harness/gather.py``, which writes the rows). A row: ``instance_id``
(``<owner>__<repo>.<sha8>.<strategy>``), ``repo`` (the mirror, ``swesmith/<owner>__<repo>.<sha8>``),
``patch`` (the diff that *introduces* the bug), ``FAIL_TO_PASS``, ``PASS_TO_PASS`` (lists),
``created_at``, ``image_name``, ``base_commit``, ``problem_statement``. ``image_name`` is the
profile's image, ``<org>/swesmith.x86_64.<owner>_1776_<repo>.<sha8>`` (``jyangballin/`` on the
published rows, ``swebench/`` for newer builds); the repository is at ``/testbed``.

The harness runs ``git fetch; git checkout <instance_id>``: each instance is a branch of that name (the
bug commit, then a commit removing the FAIL_TO_PASS test files), so the branch is this task's
``base_commit``; grading goes to ``HEAD~1`` (the tests back), applies the patch, resets the test files
and runs the profile's ``test_cmd`` (the whole suite unless ``--f2p_only``), parsed by the profile's
``log_parser`` (``<test> STATUS`` lines of pytest's ``--verbose`` output, not SWE-bench's ``-rA``
summary). The gold fix is the bug patch reversed (``git apply --reverse``). So the branch's ancestors
are the answer, and the agent gets its tree alone (``runtime.history_target``, sandbox/history.py). Only
Python profiles' test command is known here (``SWE-bench/SWE-smith`` is the Python set; SWE-smith-go and
others are not).

Polar grades it SWE-smith's way on the tree the agent had (the branch's tip): its test files
(FAIL_TO_PASS's and PASS_TO_PASS's) as ``HEAD~1`` has them, read by the grader from the original image
(`TESTS_AT_BUG`, a test patch of tip -> ``HEAD~1``: the files the tip removed come back), the conda
environment activated, the profile's pytest command over the whole suite, its ``--verbose`` parser, and
SWE-bench's verdict (SWE-smith's ``get_eval_tests_report``: PASSED or XFAIL passes); the strict mode runs
too (the command is one pytest run).
"""

from __future__ import annotations

import re

from polar_env.tasks.datasets.base import (
    CONDA_TESTBED,
    NO_DIRECTIVES,
    DatasetSpec,
    Procedure,
    field,
    make_task,
)
from polar_env.tasks.models import Task

NAME = "swe-smith"
PARSER = "swesmith:pytest-verbose"
# swesmith/profiles/python.py: PythonProfile.test_cmd (ENV_NAME = "testbed"): the activation is the
# procedure's (`CONDA_TESTBED`), the command one pytest run
TEST_CMD = "pytest --disable-warnings --color=no --tb=no --verbose"
# the test patch, printed in a container of the original image (root, no network): tip -> HEAD~1 of the
# instance branch, for the F2P and P2P test files (what SWE-smith's eval checks out of HEAD~1)
TESTS_AT_BUG = (
    'cd "$1" && branch="$2" && shift 2 && '
    "git -c core.hooksPath=/dev/null -c safe.directory='*' diff --binary --no-color --no-ext-diff "
    '"$branch" "$branch~1" -- "$@"'
)
_STATUSES = ("FAILED", "PASSED", "SKIPPED", "ERROR", "XFAIL")  # swebench's TestStatus, in its order


_SWAPPED_HEADERS = {
    "new file mode": "deleted file mode",
    "deleted file mode": "new file mode",
    "old mode": "new mode",
    "new mode": "old mode",
    "rename from": "rename to",
    "rename to": "rename from",
    "copy from": "copy to",
    "copy to": "copy from",
}


def _side(path: str, prefix: str) -> str:
    return path if path == "/dev/null" else prefix + path.split("/", 1)[1]


def reverse_patch(patch: str) -> str:
    """``patch`` undone (what ``git apply --reverse`` applies) as a git diff: each file's sides, modes, index
    ids, hunk ranges and line signs swapped, each run of changed lines its removals first (git's order)."""
    out: list[str] = []
    run: list[list[str]] = []  # the changed lines being swapped, each with a "\ No newline" note after it
    minus = ""
    in_hunk = False

    def flush() -> None:
        out.extend(x for sign in "-+" for lines in run if lines[0][0] == sign for x in lines)
        run.clear()

    for line in patch.splitlines(keepends=True):
        body = line.rstrip("\n")
        end = line[len(body) :]
        if in_hunk and body[:1] in ("+", "-"):
            run.append([("-" if body[0] == "+" else "+") + body[1:] + end])
            continue
        if in_hunk and body.startswith("\\") and run:
            run[-1].append(line)
            continue
        flush()
        if body.startswith("diff --git "):
            in_hunk = False
            a, _, b = body[len("diff --git ") :].partition(" b/")
            body = f"diff --git a/{b} b/{a[2:]}"
        elif m := re.match(r"@@ -(\S+) \+(\S+) @@(.*)$", body):
            in_hunk = True
            body = f"@@ -{m[2]} +{m[1]} @@{m[3]}"
        elif not in_hunk and body.startswith("--- "):
            minus = body[4:]
            continue  # written with its +++ line, the sides swapped
        elif not in_hunk and body.startswith("+++ "):
            body = f"--- {_side(body[4:], 'a/')}{end}+++ {_side(minus, 'b/')}"
        elif not in_hunk and (m := re.match(r"index (\w+)\.\.(\w+)(.*)$", body)):
            body = f"index {m[2]}..{m[1]}{m[3]}"
        elif not in_hunk:
            head = next((h for h in _SWAPPED_HEADERS if body.startswith(h + " ")), None)
            if head is not None:
                body = _SWAPPED_HEADERS[head] + body[len(head) :]
        out.append(body + end)
    flush()
    return "".join(out)


def parse_verbose(log: str) -> dict[str, str]:
    """The Python profile's ``log_parser``: ``<test id> STATUS`` lines of pytest's ``--verbose`` output."""
    found: dict[str, str] = {}
    for line in log.split("\n"):
        for status in _STATUSES:
            if m := re.match(rf"^(\S+)(\s+){status}", line):
                found[m[1]] = status
    return found


def to_task(row: dict) -> Task:
    iid = field(row, "instance_id", dataset=NAME)
    return make_task(
        NAME,
        instance_id=iid,
        repo=field(row, "repo", dataset=NAME),
        base_commit=iid,
        problem_statement=field(row, "problem_statement", dataset=NAME),
        patch=reverse_patch(field(row, "patch", dataset=NAME)),
        test_patch="",  # the grader's, from the image (`TESTS_AT_BUG`)
        FAIL_TO_PASS=field(row, "FAIL_TO_PASS", list, dataset=NAME),
        PASS_TO_PASS=field(row, "PASS_TO_PASS", list, dataset=NAME),
        image=field(row, "image_name", dataset=NAME),
        workdir="/testbed",
        test_cmd=TEST_CMD,
        test_directives=NO_DIRECTIVES,
        log_parser=PARSER,
    )


def tests_at_bug(task: Task) -> list[str]:
    """argv (after ``sh -c``) printing the test patch in the original image (`Procedure.image_tests`)."""
    files = sorted({t.split("::", 1)[0] for t in [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]})
    return [TESTS_AT_BUG, "sh", task.workdir, task.base_commit, *files]


PROCEDURE = Procedure(
    activate=CONDA_TESTBED,
    parsers={PARSER: parse_verbose},
    image_tests=tests_at_bug,
    verified="a stand-in image in SWE-smith's layout (one image, the instance a branch: the bug, then its "
    "F2P test files removed; conda `testbed`), gold 1.0 and no-op 0 by `polar rollout`, strict mode "
    "(tests/tasks/test_dataset_standins.py)",
)
SPEC = DatasetSpec(
    NAME,
    "SWE-bench/SWE-smith",
    "train",
    to_task=to_task,
    procedure=PROCEDURE,
    matches=lambda row: "image_name" in row and str(row.get("repo", "")).startswith("swesmith/"),
)
