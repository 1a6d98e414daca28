"""The one place that imports `swebench`'s harness: its log parsers and grading functions.

`swebench.harness` pulls in docker and modal at import time (about 2 s), so the import is
deferred to first use and nothing else in Polar touches `swebench.harness` directly (the name of
the image SWE-bench publishes for an instance, from its light `image_builder`, is a fact about the
task: `polar_env/tasks/runtime.py`). Written against
swebench 5.0.x (`get_logs_eval`, `get_eval_tests_report`, `get_resolution_status`,
`MAP_REPO_TO_PARSER_PY`, `PARSER_REGISTRY`, the `>>>>> Start/End Test Output` markers).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

# The harness markers, duplicated as literals so writing an eval script needs no swebench import;
# `markers_match_swebench()` checks them against the installed package (a unit test calls it).
START_TEST_OUTPUT = ">>>>> Start Test Output"
END_TEST_OUTPUT = ">>>>> End Test Output"
TEST_EXIT_CODE = ">>>>> Test Exit Code"
TESTS_TIMEOUT = ">>>>> Tests Timed Out"
DEFAULT_PARSER = "parse_log_pytest"


@functools.cache
def _sb() -> SimpleNamespace:
    from swebench.harness import constants, grading
    from swebench.harness.log_parsers import PARSER_REGISTRY
    from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY
    from swebench.types import TestSpec

    return SimpleNamespace(
        constants=constants,
        grading=grading,
        registry=PARSER_REGISTRY,
        repo_parsers=MAP_REPO_TO_PARSER_PY,
        TestSpec=TestSpec,
    )


def preload() -> None:
    """Pay the ~2 s swebench import up front (so it does not land in the first grading's timing)."""
    _sb()


def markers_match_swebench() -> bool:
    c = _sb().constants
    return (c.START_TEST_OUTPUT, c.END_TEST_OUTPUT, c.TEST_EXIT_CODE, c.TESTS_TIMEOUT) == (
        START_TEST_OUTPUT,
        END_TEST_OUTPUT,
        TEST_EXIT_CODE,
        TESTS_TIMEOUT,
    )


def parser_name(repo: str) -> str:
    """SWE-bench's registered log parser for `repo` (plain pytest for repos it does not know)."""
    sb = _sb()
    fn = sb.repo_parsers.get(repo)
    if fn is None:
        return DEFAULT_PARSER
    return next(name for name, f in sb.registry.items() if f is fn)


def parse_log(
    log_path: str,
    *,
    instance_id: str,
    repo: str,
    version: str,
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    log_parser: str = "",
) -> tuple[dict[str, str], bool]:
    """(per-test status map, whether the log holds a valid test run) via `get_logs_eval`, by the row's
    ``log_parser`` where swebench registers one of that name (SWE-Gym's, SWE-rebench's), else the repo's."""
    sb = _sb()
    spec = sb.TestSpec(
        instance_id=instance_id,
        image="",
        eval_script_list=[],
        repo=repo,
        version=version,
        FAIL_TO_PASS=fail_to_pass,
        PASS_TO_PASS=pass_to_pass,
        log_parser=log_parser if log_parser in sb.registry else parser_name(repo),
        eval_type=sb.constants.EvalType.PASS_AND_FAIL.value,
    )
    return sb.grading.get_logs_eval(spec, log_path)


def status_map_from_outcomes(statuses: dict[str, str], *, repo: str) -> dict[str, str]:
    """Key structured per-test outcomes the way SWE-bench keys its log lines, via the repo's parser.

    Each outcome becomes a ``STATUS nodeid`` summary line (as ``pytest -rA`` prints it) fed to the
    registered parser, so ids are cut and normalised exactly as in `swebench` mode. Where several
    node ids map to one key, a failing status wins (its lines go last; the parser keeps the last).
    """
    sb = _sb()
    failing = ("FAILED", "ERROR")
    lines = [
        f"{status} {nodeid}" for nodeid, status in sorted(statuses.items(), key=lambda kv: kv[1] in failing)
    ]
    spec = SimpleNamespace(repo=repo, instance_id="", version="")
    return sb.registry[parser_name(repo)]("\n".join(lines), spec)


def tests_report(status_map: dict[str, str], fail_to_pass: list[str], pass_to_pass: list[str]) -> dict:
    """SWE-bench's F2P/P2P success/failure report for one run."""
    sb = _sb()
    c = sb.constants
    gold = {c.FAIL_TO_PASS: fail_to_pass, c.PASS_TO_PASS: pass_to_pass}
    return sb.grading.get_eval_tests_report(status_map, gold, eval_type=c.EvalType.PASS_AND_FAIL)


def fully_resolved(report: dict) -> bool:
    sb = _sb()
    return sb.grading.get_resolution_status(report) == sb.constants.ResolvedStatus.FULL.value


def make_test_spec(row: dict):
    """SWE-bench's TestSpec for a row that carries its eval script (``eval_script``, ``image``,
    ``log_parser``, ``eval_type``: the columns swebench 5 evaluates from); its ``eval_script`` and
    ``image`` are what the harness runs."""
    from swebench.harness.utils import make_test_spec as _make

    _sb()
    return _make(row)


def parse_log_with_spec(spec, log_path: str) -> tuple[dict[str, str], bool]:
    """(per-test status map, valid) for a log of ``spec``'s eval script, by its own parser."""
    return _sb().grading.get_logs_eval(spec, log_path)
