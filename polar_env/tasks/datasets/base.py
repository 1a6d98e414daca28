"""What every dataset loader is: a name, where the hub keeps it, how to recognise and map a row."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from polar_env.tasks.models import Task


class DatasetRowError(ValueError):
    """A row lacks a field its schema requires, or holds the wrong type; the message names the field."""


@dataclass(frozen=True)
class DatasetSpec:
    name: str  # the NAME of --tasks NAME[:split]
    hub_name: str  # the Hugging Face dataset
    default_split: str
    matches: Callable[[dict], bool]  # the row has this dataset's schema (for FILE.jsonl rows)
    to_task: Callable[[dict], Task]
    graded_here: bool = True  # False: Polar cannot run this dataset's log parser (schema only)


def field(row: dict, name: str, kind: type | tuple[type, ...] = str, *, dataset: str) -> Any:
    """``row[name]``, required and of ``kind``; a string stands for a list or dict: JSON (the hub's way) or a
    Python literal (SWE-bench Pro's harness ``eval``s its list columns; read here with ``ast.literal_eval``)."""
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
                raise DatasetRowError(f"{dataset} row {row.get('instance_id', '?')}: field {name!r} is neither JSON "
                                      "nor a Python literal") from None
    if not isinstance(value, kind):
        raise DatasetRowError(f"{dataset} row {row.get('instance_id', '?')}: field {name!r} must be "
                              f"{getattr(kind, '__name__', kind)}, not {type(value).__name__}")
    return value


def raise_missing(dataset: str, iid: str, name: str) -> None:
    raise DatasetRowError(f"{dataset} row {iid}: missing field {name!r}")


# Task fills empty ``test_directives`` from the test patch (SWE-bench's way); a dataset whose test command
# takes no file arguments passes this instead, so nothing is appended to its command.
NO_DIRECTIVES = [""]


def make_task(dataset: str, **fields: Any) -> Task:
    """The Task, a validation failure named by its field."""
    try:
        return Task.model_validate(fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise DatasetRowError(f"{dataset} row {fields.get('instance_id', '?')}: field {loc!r}: {err['msg']}") from None
