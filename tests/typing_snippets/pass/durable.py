"""Durable runs (preview, typedq.durable): a run's calls are typed by the task, the signal
and the ``do`` block they name."""

from __future__ import annotations

from datetime import timedelta
from typing import reveal_type

from snip import CardDeclined, Image, Receipt, SendInvoice, Thumb, app

from typedq import JobFailed
from typedq.durable import Completed, Run, RunTimeout, Signal, StepCall, replay


@app.task
async def send_invoice(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=100)


@app.task
def resize(image: Image) -> Thumb:
    return Thumb(url=image.url, width=64)


approval = Signal("approval", CardDeclined)
reveal_type(approval)  # R: typedq.durable.types.Signal[snip.CardDeclined]


async def bill(run: Run, invoice: SendInvoice) -> Receipt:
    call = run.step(send_invoice, invoice)
    reveal_type(call)  # R: typedq.durable.replay.StepCall[snip.Receipt]
    receipt = await call
    reveal_type(receipt)  # R: snip.Receipt
    await run.sleep(timedelta(days=1))
    try:
        declined = await run.wait_for(approval, timeout=timedelta(days=7))
        reveal_type(declined)  # R: snip.CardDeclined
    except RunTimeout:
        pass
    total = await run.do("total", lambda: receipt.total_cents * 2)
    reveal_type(total)  # R: int

    async def fetch() -> Image:
        return Image(url="u")

    image = await run.do("fetch", fetch, type=Image)
    reveal_type(image)  # R: snip.Image
    sent, thumb = await run.gather(run.step(send_invoice, invoice), run.step(resize, image))
    reveal_type(sent)  # R: snip.Receipt
    reveal_type(thumb)  # R: snip.Thumb
    calls: list[StepCall[Thumb]] = [run.step(resize, Image(url=u)) for u in ("a", "b")]
    thumbs = await run.gather(*calls)
    reveal_type(thumbs)  # R: tuple[snip.Thumb, ...]
    await run.emit(thumb)
    if run.patched("v2"):
        try:
            await run.step(send_invoice, invoice)
        except JobFailed as exc:
            print(exc.domain_error(CardDeclined))
    return receipt


async def host() -> None:
    decision = await replay(bill, SendInvoice(customer_id=1, invoice_id=2), [], run_id="r", now=0.0)
    if isinstance(decision, Completed):
        reveal_type(decision.result)  # R: snip.Receipt
    approval.encode(CardDeclined(code="no"))
