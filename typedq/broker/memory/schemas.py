"""The embedded broker's schema registry (capability ``SchemaRegistry``): the first
record of each ``(task, fingerprint)``, stamped with the broker's time."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ..schemas import SchemaRecord

__all__ = ["SchemaStore"]


class SchemaStore:
    """Schema records by ``(task, fingerprint)``; the first one of each is kept."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], SchemaRecord] = {}

    def record(self, records: Sequence[SchemaRecord], now: float) -> list[bool]:
        """Keep each new record with ``first_seen`` ``now``; True per record kept."""
        out = []
        for record in records:
            key = (record.task, record.fingerprint)
            new = key not in self.records
            if new:
                self.records[key] = msgspec.structs.replace(record, first_seen=now)
            out.append(new)
        return out

    def forget(self, keys: Sequence[tuple[str, str]]) -> list[bool]:
        """Delete the records of ``keys``; True per record deleted."""
        return [self.records.pop(key, None) is not None for key in keys]

    def listed(self) -> list[SchemaRecord]:
        """Every record, by task and then first seen."""
        return sorted(self.records.values(), key=lambda r: (r.task, r.first_seen, r.fingerprint))
