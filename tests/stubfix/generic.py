"""A handler whose input is a parametrized generic model: the generator must refuse."""

from __future__ import annotations

from typedq import App

from .generic_models import Page

app = App("generic")


@app.task
async def count(page: Page[int]) -> None:
    del page
