"""The Redis broker's schema registry (capability ``SchemaRegistry``), mixed into
RedisBroker: one app-wide hash, ``typedq:{<namespace>}:schemas`` (see :mod:`.keys`), so
on Redis Cluster it lives in the slot of the app's other registries."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ..schemas import SchemaRecord
from .codec import MICRO
from .core import RedisCore

__all__ = ["SchemaOps"]


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
