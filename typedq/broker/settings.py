"""The broker-wide settings an App chooses: :class:`BrokerSettings` and its
:class:`Retention` of finished jobs.

Every backend is built with one (:func:`typedq.broker.broker_from_url`) and keeps it as
:attr:`Broker.settings <typedq.broker.base.Broker.settings>`.
"""

from __future__ import annotations

import msgspec

__all__ = ["BrokerSettings", "Retention"]


class Retention(msgspec.Struct, frozen=True, kw_only=True):
    """How long, and how many, finished jobs are kept (so memory stays bounded).

    Whichever bound is hit first removes the oldest finished jobs of that state.
    """

    completed_ttl: float = 24 * 3600.0
    completed_max: int = 10_000
    failed_ttl: float = 7 * 24 * 3600.0
    failed_max: int = 100_000


class BrokerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Broker-wide behaviour chosen by the App.

    :param namespace: the App's name; every key of a networked broker is inside it
    :param max_stalls: lease expiries after which a job fails with reason ``stalled``
    :param retention: bounds on finished jobs
    :param max_queue_length: enqueues beyond this many waiting+scheduled jobs per queue
        are refused with QueueFull (0 = unbounded; the partitions of a queue declared
        with :meth:`~typedq.broker.base.Broker.set_partitions` share it:
        :meth:`~typedq.broker.base.Broker.queue_cap`)
    :param events_max: about how many events a queue's event stream keeps (typedq.events)
    """

    namespace: str = "typedq"
    max_stalls: int = 3
    retention: Retention = Retention()
    max_queue_length: int = 0
    events_max: int = 10_000
