"""A fan-out app for the tests of large flows on Redis: ``double`` mapped over members,
``add`` as the fan-in callback (tests/redis/test_redis_flow_end.py, test_redis_purge_chunks.py)."""

from __future__ import annotations

from typing import Any

import msgspec

from typedq import App


class N(msgspec.Struct, frozen=True):
    """A member's input and output."""

    n: int


def fanout_app(name: str, url: str) -> tuple[App, Any, Any]:
    """An app named ``name`` on ``url`` and its tasks ``double`` (a member) and ``add``
    (the callback over the members' results)."""
    app = App(name, broker=url)

    @app.task
    async def double(x: N) -> N:
        return N(x.n * 2)

    @app.task
    async def add(xs: list[N]) -> N:
        return N(sum(x.n for x in xs))

    return app, double, add
