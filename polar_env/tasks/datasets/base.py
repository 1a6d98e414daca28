"""What every dataset loader is: a name, where the hub keeps it, how to recognise and map a row, and the
procedure its own harness grades a task by (how far Polar reproduces it)."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from dataclasses import dataclass
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
    hold (a stand-in image in CI), or "" where it was checked against the schema only."""

    activate: str = ""
    reproduced: bool = True
    instead: str = ""
    verified: str = ""

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
