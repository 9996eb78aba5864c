"""``key=`` is checked against the handler's input model (typedq.mypy_plugin).

Only by mypy with the plugin: to pyright, ``key`` is any ``Callable[[Any], str]`` (the handler
it belongs to comes after it), so none of these lines fails there (``# P: ok``, docs/typing.md).
"""

from __future__ import annotations

from snip import Image, Receipt, SendInvoice, Thumb, app

from typedq import App, JobContext


# P: ok key= needs the mypy plugin
@app.task(key=lambda inv: inv.nope)  # E: attr-defined "SendInvoice" has no attribute "nope"
async def unknown_field(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)


# E: return-value got "int", expected "str"  # E: arg-type "Callable[[SendInvoice], int]"
# P: ok key= needs the mypy plugin
@app.task(key=lambda inv: inv.invoice_id)
async def returns_int(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)


# E: attr-defined "Image" has no attribute "receipt_id"  # P: ok key= needs the mypy plugin
@app.task(retries=2, key=lambda image: image.receipt_id)
def sync_with_context(image: Image, ctx: JobContext) -> Thumb:
    return Thumb(url=image.url, width=ctx.attempt)


def receipt_key(receipt: Receipt) -> str:
    return receipt.receipt_id


# E: arg-type "Callable[[Receipt], str]"; expected "Callable[[SendInvoice], str] | None"
# P: ok key= needs the mypy plugin
@app.task(key=receipt_key)
async def wrong_key_function(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)


@app.task(key=str.upper)  # E: arg-type  # P: ok key= needs the mypy plugin
async def not_even_a_model(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)


async def make_thumb(image: Image) -> Thumb:
    return Thumb(url=image.url, width=1)


# Applied without decorator syntax.
# P: ok key= needs the mypy plugin
direct = App("direct").task(key=lambda image: image.nope)(make_thumb)  # E: attr-defined "Image"


class BillingApp(App):
    """Subclasses of App get the same checking."""


billing = BillingApp("billing2")


# P: ok key= needs the mypy plugin
@billing.task(key=lambda inv: inv.nope)  # E: attr-defined "SendInvoice" has no attribute "nope"
async def on_subclass(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)


def nested() -> None:
    # P: ok key= needs the mypy plugin
    @app.task(key=lambda inv: inv.nope)  # E: attr-defined "SendInvoice" has no attribute "nope"
    def inner(invoice: SendInvoice) -> None:
        pass


class Handlers:
    def register(self) -> None:
        # P: ok key= needs the mypy plugin
        @app.task(key=lambda image: image.nope)  # E: attr-defined "Image" has no attribute "nope"
        def in_method(image: Image) -> None:
            pass
