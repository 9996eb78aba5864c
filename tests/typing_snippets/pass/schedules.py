"""Schedules: the payload is the task's input model; options are typed."""

from __future__ import annotations

from datetime import timedelta
from typing import reveal_type
from zoneinfo import ZoneInfo

from snip import Image, SendInvoice, Thumb, app

from typedq import JobContext


@app.task
async def send_digest(invoice: SendInvoice, ctx: JobContext) -> None:
    tick: float | None = ctx.scheduled_for
    del tick


@app.task
def thumbnail(image: Image) -> Thumb:
    return Thumb(url=image.url, width=64)


INVOICE = SendInvoice(customer_id=1, invoice_id=7)

daily = app.schedule(send_digest, INVOICE, cron="0 8 * * *", tz="Europe/Paris")
reveal_type(daily)  # R: typedq.schedule.Schedule[snip.SendInvoice]
app.schedule(thumbnail, Image(url="u"), every=30, name="thumbs", missed="skip", overlap="skip")
app.schedule(thumbnail, Image(url="v"), every=timedelta(minutes=5), missed=3, grace=10.0)
app.schedule(
    send_digest,
    INVOICE,
    cron="*/5 * * * *",
    tz=ZoneInfo("UTC"),
    max_lateness=timedelta(minutes=1),
    overlap="queue",
    name="digest.often",
)
