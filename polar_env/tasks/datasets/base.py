"""What every dataset loader is: a name, where the hub keeps it, how to recognise and map a row."""

from __future__ import annotations

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
    """``row[name]``, required and of ``kind``; a JSON string stands for a list or dict (the hub's way)."""
    if name not in row or row[name] is None:
        raise DatasetRowError(f"{dataset} row {row.get('instance_id', '?')}: missing field {name!r}")
    value = row[name]
    wants_container = kind in (list, dict) or (isinstance(kind, tuple) and (list in kind or dict in kind))
    if isinstance(value, str) and wants_container:
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise DatasetRowError(f"{dataset} row {row.get('instance_id', '?')}: field {name!r} is not JSON") from None
    if not isinstance(value, kind):
        raise DatasetRowError(f"{dataset} row {row.get('instance_id', '?')}: field {name!r} must be "
                              f"{getattr(kind, '__name__', kind)}, not {type(value).__name__}")
    return value


def make_task(dataset: str, **fields: Any) -> Task:
    """The Task, a validation failure named by its field."""
    try:
        return Task.model_validate(fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise DatasetRowError(f"{dataset} row {fields.get('instance_id', '?')}: field {loc!r}: {err['msg']}") from None
