"""The base of every wire model."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Loose(BaseModel):
    """A wire model that keeps fields it does not name: APIs grow, and a harness's extra field is no error."""

    model_config = ConfigDict(extra="allow")
