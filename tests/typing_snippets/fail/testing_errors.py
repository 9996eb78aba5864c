"""What mypy rejects in a user's test with typedq.testing."""

from __future__ import annotations

from snip import Receipt, SendInvoice, app

from typedq.testing import FakeClock, run_worker


@app.task
async def send_invoice(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=100)


async def test_wrongly() -> None:
    async with run_worker(app, clock=FakeClock(start="0")) as harness:  # E: arg-type "str"
        await harness.advance("60")  # E: arg-type "str"; expected "float"
        await harness.idle(timeout=None)  # E: arg-type "None"; expected "float"
        job = await send_invoice.enqueue(SendInvoice(customer_id=1, invoice_id=2))
        late: int = await job.result()  # E: assignment "Receipt", variable has type "int"
        print(late)
    async with run_worker(app, workers=2):  # E: call-arg Unexpected keyword argument "workers"
        pass
    run_worker(send_invoice)  # E: arg-type "Task[SendInvoice, Receipt]"; expected "App"
