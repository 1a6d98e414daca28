"""R2E-Gym (``R2E-Gym/R2E-Gym-Subset``): commits mined into tasks, graded by expected test outcomes.

Checked against github.com/R2E-Gym/R2E-Gym@69bc953 (``agenthub/runtime/docker.py``,
``agenthub/__init__.py``, ``repo_analysis/execution_log_parser.py``, ``commit_models/diff_classes.py``,
``repo_analysis/base_dockerfiles/``) and the Subset's published features (``repo_name``,
``docker_image``, ``commit_hash``, ``parsed_commit_content`` and ``execution_result_content`` as JSON
strings, ``modified_files``, ``modified_entity_summaries``, ``relevant_files``, ``num_non_test_*``,
``prompt``, ``problem_statement``, ``expected_output_json``: test name -> status, a JSON string).

- The row has no instance id: Polar names the task ``<repo_name>__<commit_hash[:12]>``.
- The image (``namanjain12/<repo>_final:<commit_hash>``, the row's ``docker_image``) is named after the
  fix's commit but has the repository at ``/testbed`` checked out at its parent (``OLD_COMMIT``, the
  parsed commit's ``old_commit_hash``: the task's base), the fix reachable in the clone's history; its
  Python in ``/testbed/.venv`` (on PATH); ``run_tests.sh`` in the tree and the tests in ``/r2e_tests``.
- R2E-Gym's harness keeps the tests from the agent (``SKIP_FILES_NEW``: ``run_tests.sh`` and
  ``r2e_tests`` moved to ``/root``, ``/testbed/r2e_tests`` a link to them) and grades by running
  ``bash /root/run_tests.sh`` in ``/testbed`` (``.venv/bin/python -m pytest -rA r2e_tests``): its parser
  reads pytest's short summary (a test named by its node id after the file, ``Class.test``), and the
  reward is 1 only when every test's status equals ``expected_output_json``'s, failing ones too.
- The gold patch is the parsed commit's non-test Python file diffs (``ParsedCommit.get_patch(
  test_file=False)``).

Polar: the hidden files are gone from every workspace's image (not moved: the agent here cannot read
``/root`` either way, but a link in the tree would show where), the grader brings them from the original
image, the tests at ``/testbed/r2e_tests`` and the script at ``/run_tests.sh`` (the tests run as the
sandbox uid, who cannot read ``/root``). R2E-Gym's parser is the same pytest parser for each of its
repositories: Polar applies it to every row (``r2e:pytest``).
"""

from __future__ import annotations

import re

from polar_env.tasks.datasets.base import NO_DIRECTIVES, DatasetSpec, Procedure, field, make_task
from polar_env.tasks.models import Task

NAME = "r2e-gym"
PARSER = "r2e:pytest"
_TEST_DIRS = {"tests", "Tests", "test", "Test"}
# files an R2E-Gym image keeps from the agent (SKIP_FILES of older images among them: the parsed commit,
# the expected output) -> where the grader's run reads them ("": not brought back)
HIDDEN = {
    "/r2e_tests": "{workdir}/r2e_tests",
    "{workdir}/run_tests.sh": "/run_tests.sh",
    "{workdir}/r2e_tests": "",
    **{
        f"{{workdir}}/{name}": ""
        for name in (
            "syn_issue.json",
            "expected_test_output.json",
            "execution_result.json",
            "parsed_commit.json",
            "modified_files.json",
            "modified_entities.json",
        )
    },
}


def _is_test_file(path: str) -> bool:
    """R2E-Gym's ``FileDiff.is_test_file``."""
    parts = path.split("/")
    return path.endswith("_test.py") or parts[-1].startswith("test_") or bool(_TEST_DIRS & set(parts))


def _range(r: dict) -> str:
    return f"{r['start']}" if r.get("length") is None else f"{r['start']},{r['length']}"


_MARK = {"context": " ", "added": "+", "deleted": "-", "note": "\\ "}


def _file_patch(diff: dict) -> str:
    """One ``FileDiff`` as the unified diff R2E-Gym writes for it."""
    header, path = diff["header"], diff["header"]["file"]["path"]
    out = [f"diff --git a/{path} b/{path}"]
    if header.get("misc_line"):
        out.append(header["misc_line"])
    if index := diff.get("index_line"):
        mode = f" {index['mode']}" if index.get("mode") else ""
        out.append(f"index {index['old_commit_hash']}..{index['new_commit_hash']}{mode}")
    if diff.get("is_binary_file"):
        out.append(diff.get("binary_line") or "")
    if diff.get("minus_file") and diff.get("plus_file"):
        out += [f"--- {diff['minus_file']['path']}", f"+++ {diff['plus_file']['path']}"]
    for hunk in diff.get("hunks") or []:
        d = hunk["descriptor"]
        out.append(
            f"@@ -{_range(d['old_range'])} +{_range(d['new_range'])} @@"
            + (f" {d['section']}" if d.get("section") else "")
        )
        out += [_MARK[line["type"]] + line["content"] for line in hunk["line_group"]["all_lines"]]
    return "\n".join(out) + "\n"


def gold_patch(parsed: dict) -> str:
    """The fix: the parsed commit's non-test Python files (``get_patch(test_file=False)``)."""
    return "".join(
        _file_patch(d)
        for d in parsed.get("file_diffs") or []
        if d["header"]["file"]["path"].endswith(".py") and not _is_test_file(d["header"]["file"]["path"])
    )


def to_task(row: dict) -> Task:
    repo = field(row, "repo_name", dataset=NAME)
    commit = field(row, "commit_hash", dataset=NAME)
    expected = field(row, "expected_output_json", dict, dataset=NAME)
    expected = {str(t).split(" - ")[0]: str(s) for t, s in expected.items()}  # as R2E-Gym compares them
    has_commit = bool(row.get("parsed_commit_content"))
    parsed = field(row, "parsed_commit_content", dict, dataset=NAME) if has_commit else {}
    return make_task(
        NAME,
        instance_id=f"{repo}__{commit[:12]}",
        repo=repo,
        # the image is checked out at the fix's parent; "" (what it has checked out) where the row lacks it
        base_commit=parsed.get("old_commit_hash") or "",
        problem_statement=field(row, "problem_statement", dataset=NAME),
        patch=gold_patch(parsed),
        test_patch="",
        FAIL_TO_PASS=sorted(t for t, s in expected.items() if s.upper() == "PASSED"),
        expected_statuses=expected,
        image=field(row, "docker_image", dataset=NAME),
        workdir="/testbed",
        test_cmd="bash /run_tests.sh",
        test_directives=NO_DIRECTIVES,
        log_parser=PARSER,
    )


_COLOUR = re.compile(r"\x1b\[\d+m")


def parse_log(log: str) -> dict[str, str]:
    """R2E-Gym's ``parse_log_pytest``: after pytest's "short test summary info", a line naming PASSED,
    FAILED or ERROR (in that order) gives its test's status, the test named by the node id's parts after
    the file joined with ``.``, without a `` - reason``; colour codes dropped (``decolor_dict_keys``)."""
    if "short test summary info" not in log:
        return {}
    out: dict[str, str] = {}
    for line in log.split("short test summary info", 1)[1].strip().split("\n"):
        status = next((s for s in ("PASSED", "FAILED", "ERROR") if s in line), None)
        if status is not None:
            name = ".".join(line.split("::")[1:]).split(" - ")[0]
            out[_COLOUR.sub("", name)] = status
    return out


def resolves(status_map: dict[str, str], task: Task) -> bool:
    """R2E-Gym's reward: as many tests as expected, each with its expected status."""
    got = {k.split(" - ")[0]: v for k, v in status_map.items()}
    want = {_COLOUR.sub("", k): v for k, v in task.expected_statuses.items()}
    return len(got) == len(want) and all(want.get(k) == v for k, v in got.items())


PROCEDURE = Procedure(
    parsers={PARSER: parse_log},
    resolves=resolves,
    hidden=HIDDEN,
    verified="a stand-in image in R2E-Gym's layout (/testbed with its .venv, the tests in /r2e_tests and "
    "run_tests.sh kept from the agent), gold 1.0 and no-op 0 by `polar rollout`, its procedure only (the "
    "test command is the image's script: no strict mode) (tests/tasks/test_dataset_standins.py)",
)
SPEC = DatasetSpec(
    NAME,
    "R2E-Gym/R2E-Gym-Subset",
    "train",
    to_task=to_task,
    procedure=PROCEDURE,
    matches=lambda row: "expected_output_json" in row and "docker_image" in row,
)
