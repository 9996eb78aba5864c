"""The other ``Item``, and a second error model."""

from __future__ import annotations

import msgspec
import pydantic


class Item(pydantic.BaseModel):
    """Same class name as ``models_a.Item``, another module: imported under an alias."""

    sku: str
    qty: int = 1


class Gone(msgspec.Struct, frozen=True):
    """A second declared domain error."""

    reason: str
