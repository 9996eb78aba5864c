"""``key=`` is checked against the handler's input model (typedq.mypy_plugin).

Valid keys pass here; fail/dedup_key_errors.py proves the lambda bodies are really checked
(mypy first checks a lambda argument of an overloaded call with ``Any`` parameters, so
``reveal_type`` inside the lambda would show ``Any`` and prove nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, reveal_type

from snip import Image, Receipt, SendInvoice, Thumb, app

from typedq import App, JobContext


@app.task(retries=3, key=lambda inv: f"{inv.customer_id}:{inv.invoice_id}")
async def send_invoice(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=100)


@app.task(key=lambda image: image.url)
def resize(image: Image, ctx: JobContext) -> Thumb:
    return Thumb(url=image.url, width=ctx.attempt)


def receipt_key(receipt: Receipt) -> str:
    return receipt.receipt_id


@app.task(key=receipt_key)
async def notify(receipt: Receipt) -> None:
    pass


# A key function over a base class of the input is fine (parameters are contravariant).
def any_model_key(model: object) -> str:
    return repr(model)


@app.task(key=any_model_key, name="resize2")
async def resize2(image: Image) -> Thumb:
    return Thumb(url=image.url, width=1)


async def make_thumb(image: Image) -> Thumb:
    return Thumb(url=image.url, width=1)


# Applied without decorator syntax.
direct = App("direct").task(key=lambda image: image.url)(make_thumb)
reveal_type(direct)  # R: typedq.task.Task[snip.Image, snip.Thumb]


class BillingApp(App):
    """Subclasses of App get the same checking."""


billing = BillingApp("billing2")


@billing.task(key=lambda inv: str(inv.invoice_id))
async def send_invoice2(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)


def nested() -> None:
    @app.task(key=lambda inv: str(inv.invoice_id))
    def inner(invoice: SendInvoice) -> None:
        pass


class Handlers:
    @staticmethod
    def build() -> None:
        @app.task(key=lambda image: image.url)
        def in_method(image: Image) -> None:
            pass


# Where the plugin cannot tell the input type it leaves `key` as declared (any -> str).
F = TypeVar("F", bound=Callable[..., Any])


def traced(fn: F) -> F:
    return fn


@app.task(key=lambda inv: str(inv))  # not the innermost decorator
@traced
async def traced_handler(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)


@app.task(key=lambda anything: str(anything))
async def any_input(payload: Any) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)


decorate = app.task(key=lambda inv: str(inv), name="stored")  # applied later: unknown handler
stored = decorate(make_thumb)
