"""The Redis broker's schema registry (capability ``SchemaRegistry``), mixed into
RedisBroker: one app-wide hash, ``typedq:{<namespace>}:schemas`` (see :mod:`.keys`), so
on Redis Cluster it lives in the slot of the app's other registries; and the count of a
queue's jobs by fingerprint (capability ``FingerprintCounts``), list.lua's walk of a
state counting the jobs it passes instead of listing them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import msgspec

from ...names import check_name
from ..base import JobState
from ..schemas import FingerprintPage, SchemaRecord
from .codec import MICRO, as_int, text
from .core import RedisCore
from .inspection import check_cursor
from .keys import STATE_LETTERS

__all__ = ["COUNT_PAGE_MAX", "SchemaOps"]

#: The most jobs one ``count_fingerprints`` call counts: one list.lua call, whose cost
#: grows with the jobs it passes (callgrind: ~13k server instructions a waiting job,
#: its entry read in place, ~34k while stale entries make each one's liveness check in
#: the index needed; ~20k a scheduled one), so that no call holds Redis for long
#: (bench/verify_scale.py; verify asks for COUNT_PAGE).
COUNT_PAGE_MAX = 2000


class _Stored(msgspec.Struct, array_like=True):
    """A record as the hash keeps it (``first_seen`` is the field value's prefix)."""

    task: str
    fingerprint: str
    input_schema: str
    output_schema: str


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Stored)


class SchemaOps(RedisCore):
    """``record_schemas`` (one script call: HSETNX per record, the Redis clock's time)
    ``schema_records`` (HGETALL) and ``forget_schemas`` (HDEL, pipelined)."""

    async def record_schemas(self, records: Sequence[SchemaRecord]) -> list[bool]:
        if not records:
            return []
        args: list[object] = [self.keys.prefix]
        for r in records:
            args += [
                f"{r.task}|{r.fingerprint}",
                _encoder.encode(_Stored(r.task, r.fingerprint, r.input_schema, r.output_schema)),
            ]
        reply = await self._eval("schemas", [self.keys.schemas], args)
        return [bool(int(flag)) for flag in reply]

    async def schema_records(self) -> list[SchemaRecord]:
        fields = await self._hgetall(self.keys.schemas)
        out = []
        for value in fields.values():
            raw = value if isinstance(value, bytes) else str(value).encode()
            seen, _, body = raw.partition(b"|")
            try:
                stored = _decoder.decode(body)
            except msgspec.DecodeError:
                continue  # a record of another typedq version
            out.append(
                SchemaRecord(
                    task=stored.task,
                    fingerprint=stored.fingerprint,
                    input_schema=stored.input_schema,
                    output_schema=stored.output_schema,
                    first_seen=int(seen) / MICRO,
                )
            )
        return sorted(out, key=lambda r: (r.task, r.first_seen, r.fingerprint))

    async def count_fingerprints(
        self, queue: str, state: JobState, *, cursor: str | None = None, limit: int = 1000
    ) -> FingerprintPage:
        check_name("queue", queue)
        # Counting walks the active jobs in their set's order (list.lua): its cursor is a
        # place '<score>|<id>', as a scheduled or final state's is.
        form = JobState.SCHEDULED if state is JobState.ACTIVE else state
        start = "" if cursor is None else check_cursor(cursor, form)
        limit = max(1, min(limit, COUNT_PAGE_MAX))
        k = self.keys
        reply = await self._eval(
            "list",
            [k.active(queue)],
            [k.prefix, queue, STATE_LETTERS[state.value], start, 0, limit, "n"],
        )
        counts: Counter[tuple[str, str]] = Counter()
        for at in range(3, len(reply) - 2, 3):
            counts[(text(reply[at]), text(reply[at + 1]))] += as_int(reply[at + 2])
        return FingerprintPage(
            counts=dict(counts), jobs=as_int(reply[2]), cursor=text(reply[0]) or None
        )

    async def forget_schemas(self, keys: Sequence[tuple[str, str]]) -> list[bool]:
        if not keys:
            return []
        with self._translate("forget_schemas"):
            # One key: a Redis Cluster pipeline sends it to one node in one round trip.
            async with self._conn().pipeline(transaction=False) as pipe:
                for task, fingerprint in keys:
                    pipe.hdel(self.keys.schemas, f"{task}|{fingerprint}")
                replies = await pipe.execute()
        return [bool(n) for n in replies]
