"""Models of the generator test app; ``Item`` also exists in ``models_b``."""

from __future__ import annotations

import msgspec
import pydantic


class Item(msgspec.Struct, frozen=True):
    """An input model whose name collides with ``models_b.Item``."""

    sku: str


class Outer:
    """A namespace class: models nested in it are imported through it."""

    class Inner(pydantic.BaseModel):
        """A nested output model."""

        ok: bool


class Oops(msgspec.Struct, frozen=True):
    """A declared domain error."""

    code: int
