"""Domain errors are typed: matched by type, optional until checked, raised as models."""

from __future__ import annotations

from snip import CardDeclined, OutOfStock, Receipt, SendInvoice, app

from typedq import JobFailed, Retry


@app.task(errors=(CardDeclined,))
async def charge(invoice: SendInvoice) -> Receipt:
    raise Retry(delay="5")  # E: arg-type "str"; expected "float | None"


# P: reportArgumentType "type[CardDeclined]" cannot be assigned to parameter "errors"
@app.task(errors=CardDeclined)  # E: call-overload No overload variant  # E: untyped-decorator
async def errors_not_a_tuple(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)


async def produce() -> None:
    job = await charge.enqueue(SendInvoice(customer_id=1, invoice_id=2))
    try:
        await job.result()
    except JobFailed as exc:
        # E: union-attr Item "None" of "CardDeclined | None" has no attribute "code"
        print(exc.domain_error(CardDeclined).code)
        # E: assignment "CardDeclined | None", variable has type "CardDeclined"
        declined: CardDeclined = exc.domain_error(CardDeclined)
        stock: OutOfStock | None = exc.domain_error(CardDeclined)  # E: assignment
        print(declined, stock)
