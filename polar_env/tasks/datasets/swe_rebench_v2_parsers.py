"""SWE-rebench V2's own log parsers and verdict, as its harness applies them (``scripts/eval.py`` and
``lib/agent/log_parsers.py`` of github.com/SWE-rebench/SWE-rebench-V2@c71902a), rewritten here for the
Python ones: they differ from swebench's parsers of the same names (no skipped-summary filter; ``v2``
keys a line by its second word only), so swebench's would not give V2's verdict on every log.

V2's verdict is exact: the tests the log shows PASSED, timing suffixes stripped, sorted, must equal the
row's PASS_TO_PASS + FAIL_TO_PASS, sorted (an extra passing test, or a listed one missing, fails).
Its 70-odd parsers for other languages are not here: such a row is refused (`parser_for`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from polar_env.tasks.models import Task

STATUSES = ("PASSED", "FAILED", "SKIPPED", "ERROR")  # its TestStatus
_OPTION = re.compile(r"(.*?)\[(.*)\]")
_COLOUR = re.compile(r"\[(\d+)m")
_CONTROL = str.maketrans("", "", "".join(chr(c) for c in range(1, 32)))
# timing a runner may print in a test's name: " [1.3 ms]", " in 2 sec", " (12ms)" (V2 strips them from
# both sides before comparing)
_TIMINGS = (
    re.compile(r"\s*\[\s*\d+(?:\.\d+)?\s*(?:ms|s)\s*\]\s*$", re.IGNORECASE),
    re.compile(r"\s+in\s+\d+(?:\.\d+)?\s+(?:msec|sec)\b", re.IGNORECASE),
    re.compile(r"\s*\(\s*\d+(?:\.\d+)?\s*(?:ms|s)\s*\)\s*$", re.IGNORECASE),
)


def _status_words(line: str) -> list[str] | None:
    """A ``STATUS id ...`` summary line's words (a FAILED line's `` - reason`` joined in), else None."""
    if not line.startswith(STATUSES):
        return None
    if line.startswith("FAILED"):
        line = line.replace(" - ", " ")
    words = line.split()
    return words if len(words) > 1 else None


def parse_pytest(log: str) -> dict[str, str]:
    """``-rA`` summary lines: ``STATUS nodeid``, the last line of an id winning."""
    return {w[1]: w[0] for line in log.split("\n") if (w := _status_words(line))}


def parse_pytest_options(log: str) -> dict[str, str]:
    """As `parse_pytest`, a parameter that is an absolute path cut to its last component (``[/a/b/c]`` ->
    ``[/c]``), so ids do not depend on where the tree is."""
    out: dict[str, str] = {}
    for line in log.split("\n"):
        if not (w := _status_words(line)):
            continue
        name = w[1]
        if m := _OPTION.search(name):
            main, option = m.groups()
            if option.startswith("/") and not option.startswith("//") and "*" not in option:
                option = "/" + option.split("/")[-1]
            name = f"{main}[{option}]"
        out[name] = w[0]
    return out


def parse_pytest_v2(log: str) -> dict[str, str]:
    """Colour codes and control characters dropped; ``STATUS nodeid`` lines, or (older pytest's ``-v``)
    ``nodeid STATUS`` lines."""
    out: dict[str, str] = {}
    for raw in log.split("\n"):
        line = _COLOUR.sub("", raw).translate(_CONTROL)
        if line.startswith(STATUSES):
            if words := _status_words(line):
                out[words[1]] = words[0]
        elif line.endswith(STATUSES) and len(words := line.split()) > 1:
            out[words[0]] = words[1]
    return out


PARSERS: dict[str, Callable[[str], dict[str, str]]] = {
    "parse_log_pytest": parse_pytest,
    "parse_log_pytest_options": parse_pytest_options,
    "parse_log_pytest_v2": parse_pytest_v2,
}


def parser_for(name: str) -> Callable[[str], dict[str, str]] | None:
    """V2's parser ``name`` where Polar has it (its Python ones), else None."""
    return PARSERS.get(name)


def _normalised(names: Iterable[str]) -> list[str]:
    out = []
    for name in names:
        for timing in _TIMINGS:
            name = timing.sub("", name)
        out.append(name.strip())
    return sorted(out)


def exactly_passed(status_map: dict[str, str], fail_to_pass: list[str], pass_to_pass: list[str]) -> bool:
    """V2's verdict: the PASSED tests are exactly PASS_TO_PASS + FAIL_TO_PASS."""
    passed = _normalised(k for k, v in status_map.items() if v == "PASSED")
    return passed == _normalised([*pass_to_pass, *fail_to_pass])


def resolves(status_map: dict[str, str], task: Task) -> bool:
    """V2's verdict on ``task``'s run (`Procedure.resolves`)."""
    return exactly_passed(status_map, task.FAIL_TO_PASS, task.PASS_TO_PASS)
