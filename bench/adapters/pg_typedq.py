"""typedq on its PostgreSQL broker (bench/pg_peers.py): the Redis adapter's app and tasks
(bench/adapters/typedq.py), its broker URL the run's fresh database (``$BENCH_TYPEDQ_BROKER``,
set by the runner). Producer: ``await noop.enqueue(Payload(...))`` (concurrent calls are
auto-batched into one ``enqueue`` function call) and ``noop.enqueue_many``. Worker: the
``typedq worker`` CLI, ``--concurrency C``.
"""

from __future__ import annotations

from . import common
from .typedq import TypedqAdapter


class PgTypedqAdapter(TypedqAdapter):
    notes = (
        "postgresql:// broker (asyncpg, schema typedq, LISTEN/NOTIFY wake-ups); worker: "
        "`typedq worker --concurrency C`, one process; default retention except in the "
        "history rows (kept: see the fixture)."
    )


if __name__ == "__main__":
    common.main(PgTypedqAdapter())
