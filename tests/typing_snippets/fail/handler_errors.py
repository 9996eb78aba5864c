"""Handlers mypy rejects at registration: non-model input or output, a wrong context."""

from __future__ import annotations

from typing import Any

from snip import Receipt, SendInvoice, app

from typedq import JobContext


@app.task  # E: type-var "TIn" of "task" of "App" cannot be "int"  # E: arg-type
async def takes_int(n: int) -> Receipt:
    return Receipt(receipt_id=str(n), total_cents=n)


@app.task  # E: type-var cannot be "dict[str, Any]"  # E: arg-type
def takes_dict(payload: dict[str, Any]) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)


# E: type-var "TIn" of "__call__" of "TaskDecorator" cannot be "int"  # E: arg-type
@app.task(retries=3)
async def takes_int_with_options(n: int) -> Receipt:
    return Receipt(receipt_id=str(n), total_cents=n)


# E: type-var "TOut" of "task" of "App" cannot be "str"  # E: arg-type
@app.task  # E: task-result must return a model (msgspec.Struct or pydantic.BaseModel) or None, not "str"
async def returns_str(invoice: SendInvoice) -> str:
    return str(invoice.invoice_id)


# mypy alone says only `expected "Callable[..., Awaitable[Never]]"` here: the plugin
# says what is wrong (issue 29).
# E: arg-type "Callable[[SendInvoice], int]"
@app.task()  # E: task-result A task handler must return a model (msgspec.Struct or pydantic.BaseModel) or None, not "int"
def returns_int(invoice: SendInvoice) -> int:
    return invoice.invoice_id


@app.task  # E: arg-type "Callable[[SendInvoice, int], Coroutine[Any, Any, Receipt]]"
async def wrong_context(invoice: SendInvoice, ctx: int) -> Receipt:
    return Receipt(receipt_id=str(ctx), total_cents=1)


@app.task  # E: arg-type "Callable[[SendInvoice, JobContext[Never], int], Receipt]"
def three_params(invoice: SendInvoice, ctx: JobContext, extra: int) -> Receipt:
    return Receipt(receipt_id=str(extra), total_cents=1)


@app.task  # E: arg-type "Callable[[], Coroutine[Any, Any, Receipt]]"
async def no_params() -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)


# P: reportArgumentType "Literal['3']" cannot be assigned to parameter "retries"
@app.task(retries="3")  # E: call-overload No overload variant  # E: untyped-decorator
async def wrong_option(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)
