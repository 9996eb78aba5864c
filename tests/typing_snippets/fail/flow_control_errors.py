"""Debounce key functions are checked against the handler's input model (typedq.mypy_plugin),
and the options' types by their signatures.

Key lambdas only by mypy with the plugin (``# P: ok``, docs/typing.md).
"""

from __future__ import annotations

from snip import Image, SendInvoice, app

from typedq import Debounce


# E: attr-defined "SendInvoice" has no attribute "doc"  # P: ok key= needs the mypy plugin
@app.task(debounce=Debounce(key=lambda inv: inv.doc, wait=2.0))
async def unknown_field(invoice: SendInvoice) -> None:
    pass


# E: attr-defined "Image" has no attribute "order_id"  # P: ok key= needs the mypy plugin
@app.task(key=lambda image: image.order_id, unique_for=60)
async def unknown_unique_field(image: Image) -> None:
    pass


# A debounce typed for another model.
WRONG: Debounce[Image] = Debounce(key=lambda image: image.url, wait=1.0)


@app.task(debounce=WRONG)  # E: arg-type "Debounce[Image]"  # P: ok key= needs the mypy plugin
async def wrong_model(invoice: SendInvoice) -> None:
    pass


Debounce(key=lambda m: "k", wait="2s")  # E: arg-type "str"  # P: reportArgumentType "Literal['2s']"


# P: reportArgumentType "Literal['1h']"
@app.task(key=str, unique_for="1h")  # E: call-overload  # E: untyped-decorator
async def not_a_window(invoice: SendInvoice) -> None:
    pass
