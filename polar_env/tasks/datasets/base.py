"""What every dataset loader is: a name, where the hub keeps it, how to recognise and map a row, and the
procedure its own harness grades a task by (how far Polar reproduces it)."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from typing import Any, NoReturn

from pydantic import ValidationError

from polar_env.tasks.models import Task


class DatasetRowError(ValueError):
    """A row lacks a field its schema requires, or holds the wrong type; the message names the field."""


@dataclass(frozen=True)
class Procedure:
    """How a dataset's own harness runs a task's tests in its image, as far as Polar's image grading
    (rewards/image_grading.py, image_strict.py) reproduces it. ``activate``: the shell lines its eval
    script runs first, so the image's Python is the task environment's (SWE-bench's images keep it in a
    conda ``testbed`` environment, not on PATH); ``reproduced``: Polar grades the way the dataset's
    harness does (its test command, parser and verdict), else ``instead`` says what Polar does in its
    place (said once at run time, and by ``polar tasks validate``); ``verified``: how it was seen to
    hold (a stand-in image in CI), or "" where it was checked against the schema only. ``parsers``: the
    dataset's own log parsers by the row's ``log_parser`` name (None: swebench's, by that name or the
    repository's), a row naming one not there is not gradable; ``resolves``: its harness's verdict on a
    status map, where it is not SWE-bench's (each FAIL_TO_PASS and PASS_TO_PASS test passes), e.g.
    SWE-rebench V2's: the tests that passed are exactly those; ``hidden``: files of the image its harness
    keeps from the agent (R2E-Gym's tests and test script: the image path -> where the tests read them,
    ``{workdir}`` the task's tree), gone from every workspace's image and brought back by the grader from
    the original image; ``grader_files``: the files its tests run with that come from beside its rows
    (`Task.grader_files`), a task lacking one not gradable; ``script_parser``: the one of them its harness
    parses the test output with (``python <it> <stdout> <stderr> <output.json>``, SWE-bench Pro's);
    ``task_parser``: the parser its harness picks per repository and pull request (Multi-SWE-bench's
    classes), or why the task has none; ``patch_path``: where its harness puts the patch under test for the
    test command (the image's own script) to apply with the test patch, neither applied by the grader;
    ``base_test_cmd``: that harness's command for the base with the tests applied (the base check)."""

    activate: str = ""
    reproduced: bool = True
    instead: str = ""
    verified: str = ""
    parsers: Mapping[str, Callable[[str], dict[str, str]]] | None = None
    resolves: Callable[[dict[str, str], Task], bool] | None = None
    # argv (after ``sh -c``) printing the task's test patch in a container of its original image, where
    # the row has none (SWE-smith's tests are at the instance branch's ``HEAD~1``)
    image_tests: Callable[[Task], list[str]] | None = None
    hidden: Mapping[str, str] = dataclass_field(default_factory=dict)
    grader_files: tuple[str, ...] = ()
    script_parser: str = ""
    task_parser: Callable[[Task], Callable[[str], dict[str, str]] | str] | None = None
    patch_path: str = ""
    base_test_cmd: str = ""
    gradable: bool = True

    def hidden_paths(self, task: Task) -> dict[str, str]:
        """``hidden`` for ``task``: its image's path -> the path its tests read it at."""
        return {
            src.format(workdir=task.workdir): dest.format(workdir=task.workdir)
            for src, dest in self.hidden.items()
        }

    def parser(self, task: Task) -> Callable[[str], dict[str, str]] | None:
        """The dataset's own parser of ``task``'s log, where it has its own (`parsers`, `task_parser`)."""
        if self.task_parser is not None:
            found = self.task_parser(task)
            return None if isinstance(found, str) else found
        return None if self.parsers is None else self.parsers.get(task.log_parser)

    def for_task(self, task: Task) -> Procedure:
        """This procedure as it applies to ``task``: not reproduced, and not gradable, where its row names
        a parser of the dataset's that Polar does not have, or lacks a file its tests run with."""
        why = ""
        if self.task_parser is not None and isinstance(found := self.task_parser(task), str):
            why = found
        elif self.parsers is not None and task.log_parser not in self.parsers:
            why = (
                f"its log parser {task.log_parser!r} is not one Polar has ({', '.join(sorted(self.parsers))})"
            )
        elif missing := [f for f in self.grader_files if f not in task.grader_files]:
            why = f"its row came without {', '.join(missing)}"
        if not why:
            return self
        return replace(
            self,
            reproduced=False,
            gradable=False,
            instead=f"none: {why}; the task is refused at grading",
            verified="",
        )

    def in_environment(self, script: str) -> str:
        """``script`` (bash) run after the activation: its output goes to stderr (a grader reading stdout
        reads the script's only) and it sees no arguments (conda's ``activate`` reads ``"$@"``), the script
        its own."""
        if not self.activate:
            return script
        return (
            f'polar_argv=("$@"); set --\n{{ {self.activate.replace(chr(10), "; ")}; }} 1>&2\n'
            f'set -- "${{polar_argv[@]}}"\n{script}'
        )

    def summary(self) -> str:
        """One line: what is verified for a task graded by this procedure."""
        if not self.reproduced:
            return f"procedure not reproduced ({self.instead}); schema only"
        return f"procedure reproduced; verified: {self.verified or 'schema only (no image run here)'}"


# SWE-bench's eval script (and the forks SWE-Gym and SWE-rebench grade with) activates the image's conda
# environment first: ``source /opt/miniconda3/bin/activate`` then ``conda activate testbed``.
CONDA_TESTBED = "source /opt/miniconda3/bin/activate\nconda activate testbed"


@dataclass(frozen=True)
class DatasetSpec:
    name: str  # the NAME of --tasks NAME[:split]
    hub_name: str  # the Hugging Face dataset
    default_split: str
    matches: Callable[[dict], bool]  # the row has this dataset's schema (for FILE.jsonl rows)
    to_task: Callable[[dict], Task]
    procedure: Procedure = Procedure()


def field(row: dict, name: str, kind: type | tuple[type, ...] = str, *, dataset: str) -> Any:
    """``row[name]``, required and of ``kind``; a string stands for a list or dict: JSON (the hub's way) or a
    Python literal (SWE-bench Pro's harness ``eval``s its list columns; read here with
    ``ast.literal_eval``)."""
    if name not in row or row[name] is None:
        raise DatasetRowError(f"{dataset} row {row.get('instance_id', '?')}: missing field {name!r}")
    value = row[name]
    wants_container = kind in (list, dict) or (isinstance(kind, tuple) and (list in kind or dict in kind))
    if isinstance(value, str) and wants_container:
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            try:
                value = ast.literal_eval(value)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                raise DatasetRowError(
                    f"{dataset} row {row.get('instance_id', '?')}: field {name!r} is neither JSON "
                    "nor a Python literal"
                ) from None
    if not isinstance(value, kind):
        raise DatasetRowError(
            f"{dataset} row {row.get('instance_id', '?')}: field {name!r} must be "
            f"{getattr(kind, '__name__', kind)}, not {type(value).__name__}"
        )
    return value


def raise_missing(dataset: str, iid: str, name: str) -> NoReturn:
    raise DatasetRowError(f"{dataset} row {iid}: missing field {name!r}")


# Task fills empty ``test_directives`` from the test patch (SWE-bench's way); a dataset whose test command
# takes no file arguments passes this instead, so nothing is appended to its command.
NO_DIRECTIVES = [""]


def make_task(dataset: str, **fields: Any) -> Task:
    """The Task, a validation failure named by its field."""
    try:
        return Task.model_validate({**fields, "dataset": dataset})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise DatasetRowError(
            f"{dataset} row {fields.get('instance_id', '?')}: field {loc!r}: {err['msg']}"
        ) from None
