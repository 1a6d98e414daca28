"""Multi-SWE-bench (``ByteDance-Seed/Multi-SWE-bench``): pull requests in seven languages (and, in the
``multi-swe-bench`` package's later releases, Python and seven more), each repository graded its own way.

Checked against the ``multi-swe-bench`` package 1.1.2 (PyPI; ``harness/dataset.py``,
``harness/pull_request.py``, ``harness/test_result.py``, ``harness/image.py``, ``harness/instance.py``,
``harness/report.py``, ``harness/gen_report.py``, ``harness/run_evaluation.py``,
``harness/repos/<language>/<org>/<repo>.py``) and github.com/multi-swe-bench/multi-swe-bench@24f493f
(``utils/meta_info.py``). A row (one JSONL line of ``<language>/<org>__<repo>_dataset.jsonl``) has
``instance_id`` (``<org>__<repo>-<number>``), ``org``, ``repo``, ``number``, ``state``, ``title``, ``body``,
``base`` (``{label, ref, sha}``: ``sha`` is the base commit), ``resolved_issues`` (``[{number, title,
body}]``: the issue text), ``fix_patch`` (the gold patch), ``test_patch``, ``fixed_tests``, ``p2p_tests``,
``f2p_tests``, ``s2p_tests``, ``n2p_tests`` (test name -> ``{run, test, fix}`` statuses),
``run_result``/``test_patch_result``/``fix_patch_result`` (``{passed_tests, failed_tests, skipped_tests}``
and their counts), optionally ``tag`` or ``number_interval`` (which of a repository's classes builds and
parses it) and, since 2025-09, ``hints``; the language is the file's directory, not a column.

Each repository (or its tag, or its range of pull requests) is a class of the package
(``Instance.create``): it names the image (``<prefix>/<org>_m_<repo>:pr-<number>``), writes the image's
files into ``/home`` (``fix.patch``, the gold fix; ``test.patch``; ``run.sh``, ``test-run.sh`` and
``fix-run.sh``, the test command on the base, with the test patch, and with both patches, each applying
its patches itself in ``/home/<repo>``), and parses the test output (``parse_log``). Its evaluation writes
the patch under test over ``/home/fix.patch``, runs ``fix-run.sh``, and resolves when the report of the
row's ``run_result`` and ``test_patch_result`` with that run is valid (`resolves`) and each test of the
row's ``p2p_tests``, ``f2p_tests``, ``s2p_tests`` and ``n2p_tests`` is in the same class again.

(The package's ``ReportTask.instance`` rebuilds the pull request without its tag or range, so its report
parses with the repository's class; Polar parses with the class the row names, as its image was built.)

Polar runs that procedure with the package's own classes (its images' names, its parsers): the image's
``/home`` files kept from the agent (the gold fix above all), the patch under test placed at
``/home/fix.patch`` and locked, ``fix-run.sh`` (``test-run.sh`` for the base check) brought back from the
original image, the verdict written from the two files above. The package is installed without its
harness's own dependencies (``PACKAGE``); a row is refused at grading, and named at load, where it is
missing, where it has no class for the row, where the class builds its image on SWE-bench's
(``SWEImageDefault``: the tree at ``/testbed`` and the test patch inside ``fix-run.sh``, a layout Polar does
not grade this way) or keeps the repository elsewhere than ``/home/<repo>``, or where the row lacks its
earlier stages; a row whose lists contradict its own test-patch stage is malformed (the package resolves
none such).
"""

from __future__ import annotations

import contextlib
import functools
import io
import threading
from collections.abc import Callable, Iterator
from typing import Any

from polar_env.tasks.datasets.base import (
    NO_DIRECTIVES,
    DatasetRowError,
    DatasetSpec,
    Procedure,
    field,
    make_task,
    raise_missing,
)
from polar_env.tasks.models import Task

NAME = "multi-swe-bench"
PACKAGE = "pip install dataclasses-json unidiff && pip install --no-deps multi-swe-bench==1.1.2"
PATCH_PATH = "/home/fix.patch"
# the image's /home files, kept from the agent: the gold fix and the hidden tests (in the patch and the
# scripts), the scripts the grader runs brought back from the original image
HIDDEN = {
    PATCH_PATH: "",
    "/home/test.patch": "/home/test.patch",
    "/home/fix-run.sh": "/home/fix-run.sh",
    "/home/test-run.sh": "/home/test-run.sh",
    "/home/run.sh": "",
    "/home/prepare.sh": "",
}
# the package's TestResult sets -> its TestStatus values
STATUSES = (("skipped_tests", "SKIP"), ("failed_tests", "FAIL"), ("passed_tests", "PASS"))


_QUIET = threading.Lock()


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The package's classes print as they please (one prints its test-file map when it is made): kept off
    Polar's stdout while one is made, one thread at a time (``sys.stdout`` is the process's)."""
    with _QUIET, contextlib.redirect_stdout(io.StringIO()):
        yield


@functools.cache
def registry() -> dict[str, Any] | None:
    """The package's classes by ``Instance.create``'s name, each repository's registered on import; None
    where the package is not installed."""
    try:
        import multi_swe_bench.harness.repos  # noqa: F401 - registers every repository's class
        from multi_swe_bench.harness.instance import Instance
    except ImportError:
        return None
    return Instance._registry


def class_name(org: str, repo: str, tag: str = "", number_interval: str = "") -> str:
    """The class ``Instance.create`` picks for a pull request: its range, else its tag, else its
    repository."""
    if number_interval:
        return f"{org}/{number_interval}"
    return f"{org}/{repo}_{tag.replace('.', '_')}" if tag else f"{org}/{repo}"


@functools.cache
def instance(name: str, org: str, repo: str, number: int, sha: str = "") -> Any:
    """The package's class ``name`` for pull request ``number`` (what its image name and parser read of it);
    the reason there is none, where there is none."""
    classes = registry()
    if classes is None:
        return f"the multi-swe-bench package is not installed ({PACKAGE})"
    if name not in classes:
        return f"the multi-swe-bench package has no class {name!r}"
    from multi_swe_bench.harness.image import Config, SWEImageDefault
    from multi_swe_bench.harness.pull_request import Base, PullRequest

    pr = PullRequest(
        org=org,
        repo=repo,
        number=number,
        state="",
        title="",
        body="",
        base=Base(label="", ref="", sha=sha),
        resolved_issues=[],
        fix_patch="",
        test_patch="",
    )
    try:
        with quiet():
            made = classes[name](pr, Config(need_clone=False, global_env=None, clear_env=False))
            base_image = made.dependency()
            scripts = {f.name: f.content for f in base_image.files()}
    except Exception as exc:  # noqa: BLE001 - the package's code: a class that cannot be made grades nothing
        return f"its class {name!r} cannot be made: {type(exc).__name__}: {exc}"[:300]
    if isinstance(base_image, SWEImageDefault):
        return f"its class {name!r} builds on SWE-bench's image (/testbed, the test patch in fix-run.sh)"
    if f"/home/{repo}" not in scripts.get("fix-run.sh", ""):
        return f"its class {name!r} keeps the repository elsewhere than /home/{repo}"
    return made


def _task_instance(task: Task) -> Any:
    org, repo = task.repo.split("/", 1)
    return instance(
        task.log_parser.removeprefix(f"{NAME}:"), org, repo, int(task.instance_id.rsplit("-", 1)[1])
    )


def task_parser(task: Task) -> Callable[[str], dict[str, str]] | str:
    """``task``'s repository's ``parse_log``, its result as test -> PASS/FAIL/SKIP; or why there is none."""
    made = _task_instance(task)
    if isinstance(made, str):
        return made
    if not task.expected_statuses:  # its verdict needs the row's earlier stages (a row written without them)
        return "its row carries no run_result/test_patch_result"

    def parse(log: str) -> dict[str, str]:
        result = made.parse_log(log)
        return {name: status for attr, status in STATUSES for name in getattr(result, attr)}

    return parse


def _stage(row: dict, name: str) -> dict[str, str]:
    """The row's stage ``name`` (a TestResult: its test-name sets) as test -> PASS/FAIL/SKIP."""
    result = field(row, name, dict, dataset=NAME)
    return {t: status for attr, status in STATUSES for t in result.get(attr) or ()}


# each of the row's lists, and the class its tests have at the test-patch stage (report.py's classes)
CLASSES = (("p2p_tests", "PASS"), ("f2p_tests", "FAIL"), ("s2p_tests", "SKIP"), ("n2p_tests", "NONE"))


def _check_classes(row: dict, iid: str, tested: dict[str, str]) -> None:
    """Each listed test in its class at the row's test-patch stage (``p2p`` passed, ``f2p`` failed, ...):
    the package's evaluation resolves no row whose lists contradict its results (``gen_eval_reports``)."""
    for name, status in CLASSES:
        wrong = [t for t in _tests(row, name) if tested.get(t, "NONE") != status]
        if wrong:
            raise DatasetRowError(
                f"{NAME} row {iid}: {name} lists {wrong[0]!r}, which its test_patch_result has as "
                f"{tested.get(wrong[0], 'NONE')}, not {status}"
            )


def resolves(status_map: dict[str, str], task: Task) -> bool:
    """Multi-SWE-bench's verdict: the report of the row's run and test-patch stages with this run is valid
    (``Report.check``: some test ran; none the test stage passed fails; one the test stage did not pass now
    passes; none skipped or absent at the test stage fails where the run stage passed it), and every listed
    test passes (each in its class again: the classes' earlier stages are the row's)."""
    before = {t: s.split("/") for t, s in task.expected_statuses.items()}
    names = set(status_map) | set(before)

    def stages(test: str) -> tuple[str, str, str]:
        run, tested = before.get(test, ("NONE", "NONE"))
        return run, tested, status_map.get(test, "NONE")

    rows = [stages(t) for t in names]
    return (
        bool(status_map)
        and not any(tested == "PASS" and fix == "FAIL" for _, tested, fix in rows)
        and any(tested != "PASS" and fix == "PASS" for _, tested, fix in rows)
        and not any(
            run == "PASS" and tested in ("NONE", "SKIP") and fix == "FAIL" for run, tested, fix in rows
        )
        and all(status_map.get(t) == "PASS" for t in [*task.FAIL_TO_PASS, *task.PASS_TO_PASS])
    )


def _tests(row: dict, name: str) -> dict:
    return field(row, name, dict, dataset=NAME) if row.get(name) is not None else {}


def to_task(row: dict) -> Task:
    org, repo = field(row, "org", dataset=NAME), field(row, "repo", dataset=NAME)
    number = field(row, "number", int, dataset=NAME)
    iid = f"{org}__{repo}-{number}"
    base = field(row, "base", dict, dataset=NAME)
    if not isinstance(base.get("sha"), str) or not base["sha"]:
        raise_missing(NAME, iid, "base.sha")
    issues = field(row, "resolved_issues", list, dataset=NAME)
    statement = (
        "\n\n".join(
            f"{i.get('title', '')}\n{i.get('body') or ''}".strip() for i in issues if isinstance(i, dict)
        )
        or f"{row.get('title', '')}\n{row.get('body') or ''}".strip()
    )
    name = class_name(org, repo, str(row.get("tag") or ""), str(row.get("number_interval") or ""))
    made = instance(name, org, repo, number, base["sha"])
    run, tested = _stage(row, "run_result"), _stage(row, "test_patch_result")
    _check_classes(row, iid, tested)
    with quiet():
        image_name = made.name() if not isinstance(made, str) else f"mswebench/{org}_m_{repo}:pr-{number}"
    return make_task(
        NAME,
        instance_id=iid,
        repo=f"{org}/{repo}",
        base_commit=base["sha"],
        problem_statement=statement,
        hints_text=str(row.get("hints") or ""),
        patch=field(row, "fix_patch", dataset=NAME),
        test_patch=field(row, "test_patch", dataset=NAME),
        FAIL_TO_PASS=sorted(
            {
                *field(row, "f2p_tests", dict, dataset=NAME),
                *_tests(row, "s2p_tests"),
                *_tests(row, "n2p_tests"),
            }
        ),
        PASS_TO_PASS=sorted(field(row, "p2p_tests", dict, dataset=NAME)),
        # run/test-patch stage statuses of every test the row's two earlier runs saw (`resolves`)
        expected_statuses={t: f"{run.get(t, 'NONE')}/{tested.get(t, 'NONE')}" for t in {*run, *tested}},
        image=image_name.lower(),
        workdir=f"/home/{repo}",
        test_cmd="bash /home/fix-run.sh 2>&1",  # one log, in order, as the package parses it
        test_directives=NO_DIRECTIVES,
        log_parser=f"{NAME}:{name}",
    )


PROCEDURE = Procedure(
    task_parser=task_parser,
    resolves=resolves,
    hidden=HIDDEN,
    patch_path=PATCH_PATH,
    base_test_cmd="bash /home/test-run.sh 2>&1",
    verified="a stand-in image in Multi-SWE-bench's layout (/home/<repo> cloned with its history, the "
    "package's own /home scripts and the gold fix kept from the agent), gold 1.0 and no-op 0 by `polar "
    "rollout`, its procedure only (the test command is the image's script: no strict mode) "
    "(tests/tasks/test_dataset_standins.py)",
)
SPEC = DatasetSpec(
    NAME,
    "ByteDance-Seed/Multi-SWE-bench",
    "train",
    to_task=to_task,
    procedure=PROCEDURE,
    matches=lambda row: "fix_patch" in row and "org" in row and "number" in row,
)
