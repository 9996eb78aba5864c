"""Resources keep their type: a value used as the wrong type, a double of the wrong type,
and factories that could not be closed are mypy errors."""

from __future__ import annotations

from collections.abc import AsyncIterator

from snip import Pool, SendInvoice, app

from typedq import JobContext, Resource, Resources
from typedq.testing import provide


@app.resource
async def db() -> AsyncIterator[Pool]:
    yield Pool()


@app.task
async def charge(invoice: SendInvoice, ctx: JobContext) -> None:
    name: str = ctx.get(db)  # E: assignment "Pool", variable has type "str"
    ctx.get(db).execute("SELECT 1")  # E: attr-defined "Pool" has no attribute "execute"
    ctx.get(Pool)  # E: arg-type "type[Pool]"; expected "Resource[Never]"
    assert name


# E: assignment "Resource[Pool]", variable has type "Resource[str]"
wrong_handle: Resource[str] = db
# A double must be a Pool: mypy cannot make "str" the Pool that db's type demands.
wrong_double = provide(db, "not a pool")  # E: misc Cannot infer value of type parameter "T"


# A coroutine function returns its value and could never close it: not a resource.
@app.resource  # E: arg-type "Callable[[], Coroutine[Any, Any, Pool]]"
async def returns() -> Pool:
    return Pool()


# A factory takes no parameters.
@app.resource  # E: arg-type "Callable[[str], AsyncIterator[Pool]]"
async def takes(dsn: str) -> AsyncIterator[Pool]:
    yield Pool()


# A factory's one parameter is the resources opened before it.
@app.resource
async def repo(opened: Resources) -> AsyncIterator[str]:
    yield opened.get(db)  # E: misc "Pool", expected type "str"
