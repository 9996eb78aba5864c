"""What an :class:`~typedq.App` and a producer-only :class:`~typedq.Producer` share: a
checked namespace and the :class:`~typedq.client.Client` they send through, which
``async with`` connects and ``use_broker`` / ``using_broker`` swap while disconnected.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from .broker.base import Broker, BrokerSettings
from .client import Client
from .errors import ConfigError
from .names import check_name

if TYPE_CHECKING:
    from .events import EventStream
    from .serde import Codec
    from .task import TaskBase, TOut
    from .tracing import Tracing

__all__ = ["DEFAULT_MAX_PAYLOAD", "AppBase"]

#: The default cap on an encoded payload, in bytes (1 MiB).
DEFAULT_MAX_PAYLOAD = 1024 * 1024


class AppBase:
    """What :class:`~typedq.App` and :class:`~typedq.Producer` share: a namespace and a client.

    :param name: the namespace of every key and queue
    :param broker: a URL or a Broker; ``None`` uses ``$TYPEDQ_BROKER``, else ``memory://``
    :param settings: broker-wide settings for this namespace
    :param max_payload_bytes: the largest encoded input accepted by ``enqueue``
    :param tracing: OpenTelemetry spans (see :class:`~typedq.client.Client`)
    """

    def __init__(
        self,
        name: str,
        *,
        broker: str | Broker | None,
        settings: BrokerSettings,
        max_payload_bytes: int,
        tracing: bool | Tracing = False,
    ) -> None:
        self.name = check_name("app", name)
        self.settings = settings
        self.max_payload_bytes = max_payload_bytes
        self._client = Client(broker, name=name, settings=settings, tracing=tracing)
        self._client.requirements = self._requirements
        self._client.schema_sources = self._schema_sources

    @property
    def client(self) -> Client:
        """The producer-side client (connected inside ``async with``)."""
        return self._client

    @property
    def broker(self) -> Broker:
        """The broker this namespace talks to."""
        return self._client.broker

    def use_broker(self, broker: str | Broker) -> None:
        """Point at another broker; only while not connected."""
        if self._client.connected:
            raise ConfigError(f"cannot change the broker of a connected {type(self).__name__}")
        self._client = Client(
            broker, name=self.name, settings=self.settings, tracing=self._client.tracing or False
        )
        self._client.requirements = self._requirements
        self._client.schema_sources = self._schema_sources
        self._declare_partitions({})

    def _requirements(self) -> dict[type[Any], str]:
        """The broker capabilities this namespace's declarations need (capability ->
        what needs it), checked when its client connects; a producer needs none."""
        return {}

    def _schema_sources(self) -> list[tuple[str, Codec[Any], Codec[Any]]]:
        """This namespace's tasks as the schema registry records them (once per process,
        at connect, see :class:`~typedq.client.Client`): name, input and output codecs."""
        tasks = getattr(self, "_tasks", {})
        return [(t.name, t.input, t.output) for t in tasks.values()]

    def _declare_partitions(self, more: Mapping[str, int]) -> None:
        """Tell the broker the partitioned queues (they share ``max_queue_length``: see
        :meth:`Broker.queue_cap <typedq.broker.base.Broker.queue_cap>`): ``more`` and
        those of the tasks declared before."""
        tasks = getattr(self, "_tasks", {})
        known = {t.options.queue: t.options.partitions for t in tasks.values()}
        self.broker.set_partitions({**known, **more})

    @contextlib.contextmanager
    def using_broker(self, broker: str | Broker) -> Iterator[Self]:
        """Point at ``broker`` for the block (only while not connected), then back at the
        one before: ``with app.using_broker(MemoryBroker(...)): async with app: ...``."""
        previous = self._client
        self.use_broker(broker)
        try:
            yield self
        finally:
            self._client = previous
            self._declare_partitions({})

    def events(
        self, task: TaskBase[Any, TOut], *, after: int | None = None, replay: bool = False
    ) -> EventStream[TOut]:
        """The completion events of ``task``, typed by it: ``async for event in
        app.events(send_invoice)`` yields :class:`~typedq.events.CompletedEvent` (with
        the typed result), :class:`~typedq.events.FailedEvent` (with the record) and
        :class:`~typedq.events.EventGap` (fell behind the stream's cap). See
        :mod:`typedq.events`.

        :param task: a task (or stub) of this app
        :param after: resume after this event number (``event.seq``)
        :param replay: start at the oldest event the stream still holds, not now
        """
        from .events import EventStream

        return EventStream(self._client, task, after=after, replay=replay)

    async def __aenter__(self) -> Self:
        await self._client.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._client.__aexit__(exc_type, exc, tb)
