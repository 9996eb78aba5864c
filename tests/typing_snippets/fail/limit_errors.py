"""Limit key functions are checked against the handler's input model (typedq.mypy_plugin),
and the limits' numbers by their signatures.

Key lambdas only by mypy with the plugin (``# P: ok``, docs/typing.md).
"""

from __future__ import annotations

from snip import Image, Receipt, SendInvoice, app

from typedq import ConcurrencyLimit, RateLimit


# E: attr-defined "SendInvoice" has no attribute "tenant"  # P: ok key= needs the mypy plugin
@app.task(rate_limit=RateLimit(5, per=1.0, key=lambda inv: inv.tenant))
async def unknown_field(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)


# E: attr-defined "Image" has no attribute "customer"  # P: ok key= needs the mypy plugin
@app.task(concurrency=ConcurrencyLimit(2, key=lambda image: image.customer))
async def unknown_field_concurrency(image: Image) -> None:
    pass


# A limit typed for another model.
WRONG: RateLimit[Image] = RateLimit(3, key=lambda image: image.url)


@app.task(rate_limit=WRONG)  # E: arg-type "RateLimit[Image]"  # P: ok key= needs the mypy plugin
async def wrong_model(invoice: SendInvoice) -> None:
    pass


RateLimit("5", per=1.0)  # E: arg-type "str"  # P: reportArgumentType "Literal['5']"
RateLimit(5, per="1s")  # E: arg-type "str"  # P: reportArgumentType "Literal['1s']"
RateLimit(5, burst=1.5)  # E: arg-type "float"  # P: reportArgumentType "float"
ConcurrencyLimit(None)  # E: arg-type "None"  # P: reportArgumentType "None"


# P: reportArgumentType "Literal[5]"
@app.task(rate_limit=5)  # E: call-overload  # E: untyped-decorator
async def not_a_limit(invoice: SendInvoice) -> None:
    pass
