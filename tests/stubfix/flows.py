"""A worker app with fan-in callbacks: ``list[Model]`` inputs, both model kinds."""

from __future__ import annotations

from typedq import App, Failed, Ok

from . import models_a, models_b

app = App("stubflows")


@app.task
async def check(item: models_a.Item) -> models_a.Outer.Inner:
    return models_a.Outer.Inner(ok=bool(item.sku))


@app.task
async def tally(results: list[models_a.Outer.Inner]) -> models_b.Item:
    return models_b.Item(sku=str(sum(r.ok for r in results)))


@app.task
async def report(outcomes: list[Ok[models_a.Outer.Inner] | Failed]) -> models_b.Gone:
    return models_b.Gone(reason=str(sum(isinstance(o, Failed) for o in outcomes)))


@app.task
async def skus(items: list[models_a.Item]) -> None:
    del items
