"""``within=`` (SPEC section 10) on the brokers whose jobs do not live in the caller's
database: refused in one line that names the PostgreSQL broker and what to do instead,
and nothing stored."""

from __future__ import annotations

import pytest

from tests.support import In, Out
from typedq import App, Unsupported

pytestmark = pytest.mark.anyio


async def test_within_is_refused_in_one_line_and_stores_nothing(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def work(x: In) -> Out:
        return Out(x.n)

    @app.task
    async def double(x: Out) -> Out:
        return Out(x.n * 2)  # pragma: no cover

    connection = object()  # what a caller's database connection would be
    async with app:
        with pytest.raises(Unsupported) as refused:
            await work.enqueue(In(1), within=connection)
        message = str(refused.value)
        assert "\n" not in message
        assert "within=" in message
        assert "postgresql://" in message
        assert "enqueue after your transaction commits" in message
        with pytest.raises(Unsupported, match="needs the PostgreSQL broker"):
            await work.enqueue_many([In(2), In(3)], within=connection)
        with pytest.raises(Unsupported, match="needs the PostgreSQL broker"):
            await work.then(double).enqueue(In(5), within=connection)
        with pytest.raises(Unsupported, match="needs the PostgreSQL broker"):
            await work.map([In(6)]).enqueue(within=connection)
        counts = await app.broker.counts("default")
        assert sum(counts.values()) == 0
        # Without within= the same task enqueues as usual.
        job = await work.enqueue(In(4))
        assert job.created
