"""A worker app whose tasks emit (``@app.task(emits=...)``): the stub declares them."""

from __future__ import annotations

from typedq import App, JobContext

from . import models_a, models_b

app = App("stubstreams")


@app.task(emits=models_b.Item)
async def spell(item: models_a.Item, ctx: JobContext[models_b.Item]) -> models_b.Gone:
    for letter in item.sku:
        await ctx.emit(models_b.Item(sku=letter))
    return models_b.Gone(reason="done")


@app.task(emits=models_a.Outer.Inner)
async def maybe(item: models_a.Item, ctx: JobContext[models_a.Outer.Inner]) -> models_b.Gone | None:
    await ctx.emit(models_a.Outer.Inner(ok=True))
    return None
