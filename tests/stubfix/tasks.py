"""A worker app whose stub needs aliases, a nested model, ``None`` output, two errors."""

from __future__ import annotations

from typedq import App, Backoff

from . import models_a, models_b

app = App("stubfix", max_payload_bytes=4096, max_queue_length=100)


@app.task(name="a.item", queue="q-1", retries=2, errors=(models_a.Oops, models_b.Gone))
async def class_(item: models_a.Item) -> models_a.Outer.Inner:
    """A handler whose name is a keyword with a trailing underscore; the docstring is long enough that the generator must cut its first line down to fit a comment."""
    return models_a.Outer.Inner(ok=bool(item.sku))


@app.task(
    queue="q-2",
    partitions=4,
    priority=5,
    timeout=2.5,
    backoff=Backoff(kind="fixed", base=0.5, jitter=0.0),
    key=lambda i: i.sku,
)
def b_item(item: models_b.Item) -> None:
    del item


@app.task(queue="q-1")
async def maybe(item: models_a.Item) -> models_b.Gone | None:
    """May find nothing."""
    return None if item.sku else models_b.Gone(reason="empty sku")
