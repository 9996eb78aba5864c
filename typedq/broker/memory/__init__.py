"""The embedded broker (``memory://``): in-process, same semantics as Redis.

Everything lives in dicts, deques and heaps owned by one event loop, in small state
objects that :class:`MemoryBroker` composes: :mod:`.core` moves jobs through them (the
job path: enqueue, claim, settle, recover), :mod:`.broker` adds the operator side.
Read it in this order:

- :mod:`.jobs`: the job table, counts per state, versions (lazy deletion);
- :mod:`.lines`: the waiting lines by priority, the scheduled jobs' heap;
- :mod:`.leases`: the claim, the active jobs, their leases (on the clock's monotonic
  time) and claim records;
- :mod:`.limits`: rate windows, concurrency slots and ghosts, the gates that park jobs;
- :mod:`.flows`: running workflows;
- :mod:`.schedules`: schedule states;
- :mod:`.runs`: durable runs (their records, logs, inboxes, and the turns they enqueue);
- :mod:`.retention`: finished jobs and their bounds;
- :mod:`.observe`: throughput rollups, event streams, the worker and queue registry;
- :mod:`.listing`: listing and paging a state's jobs;
- :mod:`.core` then :mod:`.broker`.

Time comes from one injected :class:`~typedq.clock.Clock`: delays, ETAs, timestamps and
retention read its wall time, leases and worker registrations its monotonic time.
"""

from __future__ import annotations

from .broker import MemoryBroker
from .lines import WaitLine

__all__ = ["MemoryBroker"]

#: The name the waiting line had when this package was one module (its tests use it).
_WaitLine = WaitLine
