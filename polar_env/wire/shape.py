"""Outgoing wire bodies as typed structs, encoded in one place.

Every answer, stream event and error the proxy sends is a :class:`Shape` (a ``msgspec.Struct``)
declared beside its API's other shapes in ``polar_env/wire/``; the codecs in ``polar_env/proxy/``
only fill them. msgspec rather than pydantic because building and encoding a struct costs half
what the dict literals it replaced did, and a pydantic model six times what a struct does (measured
side by side: ``polar bench --only shapes``; figures in docs/architecture.md). Incoming bodies stay pydantic
models: there validation, and its 400 naming the field, is the point.
"""

from __future__ import annotations

from typing import Any, dataclass_transform

import msgspec
from msgspec import UNSET, UnsetType
from pydantic import BaseModel

from polar_env import fastjson

__all__ = ["UNSET", "Shape", "UnsetType", "encode", "to_builtins"]


@dataclass_transform(kw_only_default=True, field_specifiers=(msgspec.field,))
class _KeywordFields(msgspec.StructMeta):
    """Every shape's fields are keyword-only, so they are declared in the order they go on the wire
    whichever have defaults (msgspec's ``kw_only`` is not inherited; ``dataclass_transform`` tells
    type checkers so)."""

    def __new__(mcls, name: str, bases: tuple, namespace: dict, **options: Any):
        options.setdefault("kw_only", True)
        return super().__new__(mcls, name, bases, namespace, **options)


class Shape(msgspec.Struct, metaclass=_KeywordFields):
    """A wire body. A field typed ``X | UnsetType = UNSET`` is left out when unset; ``None`` is sent
    as ``null`` (several SDKs require the key to be present)."""


def _pydantic_as_json(value: Any) -> Any:
    if isinstance(value, BaseModel):  # the admin API's models (proxy/admin_api.py)
        return value.model_dump(mode="json")
    raise NotImplementedError(f"cannot encode {type(value).__name__} on the wire")


_ENCODER = msgspec.json.Encoder(enc_hook=_pydantic_as_json)


def encode(shape: Shape | BaseModel | list[Any] | Any) -> bytes:
    """Compact UTF-8 JSON of a shape, or of a pydantic model (or of the builtins either holds).
    Text with a lone UTF-16 surrogate (a tool argument the model sampled, cut mid-emoji) is encoded
    by the standard library's rules instead, as before."""
    try:
        return _ENCODER.encode(shape)
    except UnicodeEncodeError:
        return fastjson.dumps(msgspec.to_builtins(shape, enc_hook=_pydantic_as_json))


def to_builtins(shape: Any) -> Any:
    """The shape as dicts and lists, exactly as :func:`encode` would write it (exports, tests)."""
    return msgspec.to_builtins(shape)
