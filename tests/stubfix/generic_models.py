"""A generic Pydantic model; ``Page[int]`` is a class, but has no importable name."""

from __future__ import annotations

from typing import Generic, TypeVar

import pydantic

T = TypeVar("T")


class Page(pydantic.BaseModel, Generic[T]):
    """A page of items."""

    items: list[T]
