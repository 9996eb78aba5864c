"""Resources are typed end to end: ``@app.resource`` makes a ``Resource[T]`` from an async
generator or an async context manager factory, and ``ctx.get`` returns ``T``."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncGenerator, AsyncIterator
from typing import reveal_type

from snip import Pool, Receipt, SendInvoice, app

from typedq import JobContext, Resource, Resources
from typedq.testing import job_context, provide, run_worker


@app.resource
async def db() -> AsyncIterator[Pool]:
    yield Pool()


@app.resource
@contextlib.asynccontextmanager
async def settings() -> AsyncGenerator[dict[str, str], None]:
    yield {"currency": "EUR"}


@app.resource
async def ledger(opened: Resources) -> AsyncIterator[tuple[Pool, str]]:
    yield opened.get(db), opened.get(settings)["currency"]


class Client:
    """An async context manager class (like httpx.AsyncClient) is a resource as it is."""

    def __init__(self, base_url: str = "https://api.example") -> None:
        self.base_url = base_url

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass


api = app.resource(Client)
other_api = app.resource(functools.partial(Client, "https://other.example"), name="other")
reveal_type(api)  # R: typedq.resources.Resource[tests.typing_snippets.pass.resources.Client]
reveal_type(other_api)  # R: typedq.resources.Resource[tests.typing_snippets.pass.resources.Client]
reveal_type(db)  # R: typedq.resources.Resource[snip.Pool]
reveal_type(ledger)  # R: typedq.resources.Resource[tuple[snip.Pool, str]]
reveal_type(settings)  # R: typedq.resources.Resource[dict[str, str]]


@app.task
async def send_invoice(invoice: SendInvoice, ctx: JobContext) -> Receipt:
    pool = ctx.get(db)
    reveal_type(pool)  # R: snip.Pool
    total = await pool.fetch_total(invoice.invoice_id)
    currency: str = ctx.get(settings)["currency"]
    return Receipt(receipt_id=currency, total_cents=total)


@app.task
def send_invoice_sync(invoice: SendInvoice, ctx: JobContext) -> None:
    reveal_type(ctx.get(settings))  # R: dict[str, str]


def takes_handle(resource: Resource[Pool]) -> None: ...


takes_handle(db)


async def test_with_doubles() -> None:
    class FakePool(Pool):
        pass

    async with run_worker(app, resources=[provide(db, FakePool())]):
        pass
    ctx = job_context(provide(db, FakePool()), provide(settings, {"currency": "USD"}))
    receipt = await send_invoice(SendInvoice(customer_id=1, invoice_id=2), ctx)
    reveal_type(receipt)  # R: snip.Receipt
