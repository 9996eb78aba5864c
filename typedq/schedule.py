"""Schedules: a task enqueued on a cron expression or a fixed interval, once per tick.

Declared next to the app::

    app.schedule(send_digest, Digest(kind="daily"), cron="0 8 * * *", tz="Europe/Paris")
    app.schedule(poll_feeds, PollFeeds(), every=30)

A tick has an identity, the schedule's name and the tick's time; its job id is
``schedule:<name>:<tick in µs>``. Every worker process runs a :class:`Scheduler`; each
tick is enqueued exactly once however many run, because the broker enqueues a tick's
jobs in the same atomic step that moves the schedule's "last tick" record forward,
and only when that record still holds what the worker read (compare and set). Time is
the broker's (Redis ``TIME``), never a worker's clock. See docs/schedules.md for the
policies (missed ticks, lateness, overlap).
"""

from __future__ import annotations

import hashlib
import logging
import math
import numbers
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, NamedTuple, get_origin
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import anyio
import msgspec
from cronsim import CronSim, CronSimError
from typing_extensions import TypedDict, Unpack

from .broker.base import FireOutcome, JobMessage, ScheduleState, TickFiring
from .clock import SYSTEM_CLOCK, Clock
from .errors import BrokerUnavailable, ConfigError
from .names import check_name
from .task import Task, TIn

if TYPE_CHECKING:
    from .broker.base import Broker

__all__ = [
    "MAX_FIRE",
    "Missed",
    "Overlap",
    "Plan",
    "Schedule",
    "ScheduleOptions",
    "Scheduler",
    "plan",
    "tick_job_id",
]

log = logging.getLogger("typedq.schedule")

#: What happens to ticks missed while nothing ran: ``"skip"`` drops them, ``"once"``
#: fires the newest one, an int ``N`` fires the newest ``N`` (oldest first).
Missed = Literal["skip", "once"] | int
#: What a tick does while the previous tick's job is unfinished: ``"allow"`` fires it
#: anyway, ``"skip"`` drops it (counted), ``"queue"`` waits for that job to finish.
Overlap = Literal["skip", "queue", "allow"]


class ScheduleOptions(TypedDict, total=False):
    """How a schedule fires: what :meth:`App.schedule <typedq.App.schedule>` (and
    :class:`Schedule`) take after the task and payload. Exactly one of ``cron`` and
    ``every`` is required; the others are optional (see ``App.schedule`` for each)."""

    cron: str | None
    every: float | timedelta | None
    name: str | None
    tz: str | ZoneInfo | None
    missed: Missed
    grace: float | timedelta | None
    max_lateness: float | timedelta | None
    overlap: Overlap


_US = 1_000_000
#: At most this many ticks are enqueued by one step of a schedule (the newest win).
MAX_FIRE = 100
#: Due ticks counted one by one, at most, when a cron schedule comes back from a long
#: pause (the skipped count is then a lower bound).
_SCAN_CAP = 100_000
_MAX_CATCH_UP = 1000
_DEFAULT_GRACE = 60.0


def tick_job_id(name: str, tick_us: int) -> str:
    """The id of the job of one tick: ``schedule:<name>:<tick in µs>``."""
    return f"schedule:{name}:{tick_us}"


def _seconds(option: str, value: object, subject: str, *, zero: bool = False) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(
            f"{subject}: {option}={value!r} is not a number of seconds or a timedelta"
        )
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero):
        bound = ">= 0" if zero else "> 0"
        raise ConfigError(f"{subject}: {option}={value!r} must be {bound} seconds (finite)")
    return seconds


class Schedule(Generic[TIn]):
    """One declared schedule (made by :meth:`App.schedule <typedq.App.schedule>`).

    :ivar name: its identity (key of its broker state and part of its job ids)
    :ivar task: the task it enqueues
    :ivar payload: the input every tick enqueues
    :ivar cron: the cron expression, or None
    :ivar every: the interval in seconds, or None (ticks are multiples of it since the
        Unix epoch, so every process agrees on them: ``every=30`` fires at :00 and :30)
    :ivar tz: the time zone the cron expression is read in
    :ivar missed: the policy for ticks missed while nothing ran
    :ivar grace: seconds after its time within which a tick counts as on time (default:
        the interval, at most 60 s; 60 s for cron)
    :ivar max_lateness: ticks later than this are never fired (skipped and counted)
    :ivar overlap: the policy for a tick while the previous tick's job is unfinished
    :ivar queue: the queue every tick's job goes to (of a partitioned task, the one
        partition its schedule hashes to: see :func:`~typedq.names.partition_queue`)
    :ivar digest: a hash of the definition; a change restarts the schedule's state
    """

    __slots__ = (
        "_every_us",
        "_payload_bytes",
        "_template",
        "cron",
        "digest",
        "every",
        "grace",
        "max_lateness",
        "missed",
        "name",
        "overlap",
        "payload",
        "queue",
        "task",
        "tz",
    )

    def __init__(
        self, task: Task[TIn, Any], payload: TIn, **options: Unpack[ScheduleOptions]
    ) -> None:
        cron, every, name = options.get("cron"), options.get("every"), options.get("name")
        tz, grace, max_lateness = (
            options.get("tz"),
            options.get("grace"),
            options.get("max_lateness"),
        )
        missed, overlap = options.get("missed", "once"), options.get("overlap", "allow")
        label = f"schedule {name!r}" if name else f"schedule of task {task.name!r}"
        if (cron is None) == (every is None):
            raise ConfigError(
                f"{label}: give exactly one of cron='<expression>' or every=<seconds>, "
                f"not {'both' if cron is not None else 'neither'}"
            )
        self.task = task
        self.cron: str | None = None
        self.every: float | None = None
        self._every_us = 0
        if every is not None:
            seconds = _seconds("every", every, label)
            self._every_us = round(seconds * _US)
            if self._every_us < 1000:
                raise ConfigError(f"{label}: every={every!r} must be at least 0.001 seconds")
            self.every = self._every_us / _US
            # Plain decimals (no exponent: "1e+06" is not a name).
            spec = f"every-{self.every:.6f}".rstrip("0").rstrip(".") + "s"
        else:
            if not isinstance(cron, str):
                raise ConfigError(f"{label}: cron={cron!r} must be a string like '0 8 * * *'")
            self.cron = " ".join(cron.split())
            fields = len(self.cron.split())
            if fields != 5:
                # (cronsim would read a sixth field as seconds: not the documented form)
                hint = " (no seconds field: for ticks in seconds use every=SECONDS)"
                raise ConfigError(
                    f"{label}: cron expression {cron!r} has {fields} fields; use five fields "
                    "'minute hour day-of-month month day-of-week', e.g. '0 8 * * *'"
                    + (hint if fields == 6 else "")
                )
            try:
                # Parsed against a fixed time: validity does not depend on when.
                CronSim(self.cron, datetime(2000, 1, 1, tzinfo=UTC))
            except CronSimError as exc:
                raise ConfigError(
                    f"{label}: invalid cron expression {cron!r} ({exc}); use five fields "
                    "'minute hour day-of-month month day-of-week', e.g. '0 8 * * *'"
                ) from None
            spec = "cron-" + hashlib.blake2b(self.cron.encode(), digest_size=4).hexdigest()
        self.name = check_name("schedule", name if name is not None else f"{task.name}.{spec}")
        label = f"schedule {self.name!r}"
        if tz is None:
            self.tz = ZoneInfo("UTC")
        elif isinstance(tz, ZoneInfo):
            self.tz = tz
        else:
            try:
                self.tz = ZoneInfo(tz)
            except (ZoneInfoNotFoundError, ValueError):
                raise ConfigError(
                    f"{label}: unknown time zone {tz!r}; use an IANA name like 'Europe/Paris'"
                ) from None
        if self.every is not None and tz is not None:
            raise ConfigError(f"{label}: tz= applies to cron schedules; drop it for every=")
        expected = task.input.type
        # (an input such as list[Model] is checked as a list here, its items by encoding)
        if not isinstance(payload, get_origin(expected) or expected):
            wanted = getattr(expected, "__name__", str(expected))
            raise ConfigError(
                f"{label}: the payload is a {type(payload).__name__}, but task {task.name!r} "
                f"takes a {wanted}; pass a {wanted}"
            )
        # Encoded once, now: a payload that does not encode fails at declaration. The
        # template is the task's own envelope of it (limit keys included); each tick
        # gives it its id and tick time.
        self._template = task.message(payload)
        self._payload_bytes = self._template.payload
        self.payload = payload
        if missed not in ("skip", "once") and not (
            isinstance(missed, int)
            and not isinstance(missed, bool)
            and 1 <= missed <= _MAX_CATCH_UP
        ):
            raise ConfigError(
                f"{label}: missed={missed!r}: use 'skip', 'once', or an int from 1 to "
                f"{_MAX_CATCH_UP} (catch up that many missed ticks)"
            )
        self.missed: Missed = missed
        if grace is None:
            # One interval at most: a worker back from a pause fires the ticks of that
            # pause by the `missed` policy, not as a burst of "on time" ones.
            self.grace = min(_DEFAULT_GRACE, self.every) if self.every else _DEFAULT_GRACE
        else:
            self.grace = _seconds("grace", grace, label, zero=True)
        self.max_lateness = (
            None if max_lateness is None else _seconds("max_lateness", max_lateness, label)
        )
        if overlap not in ("skip", "queue", "allow"):
            raise ConfigError(f"{label}: overlap={overlap!r}: use 'skip', 'queue' or 'allow'")
        self.overlap: Overlap = overlap
        self.queue = task.queue_for(tick_job_id(self.name, 0))
        partitions = task.options.partitions
        self.digest = hashlib.blake2b(
            repr(
                (
                    self.task.name,
                    # Partitions change where the ticks go (and, on Redis Cluster, where
                    # the firing runs): a new definition. (Unsplit queues hash as before.)
                    self.task.queue if partitions == 1 else f"{self.task.queue}/{partitions}",
                    self._payload_bytes,
                    self.cron,
                    self._every_us,
                    str(self.tz),
                    self.missed,
                    self.grace,
                    self.max_lateness,
                    self.overlap,
                )
            ).encode(),
            digest_size=8,
        ).hexdigest()

    def __repr__(self) -> str:
        spec = f"cron={self.cron!r}, tz={str(self.tz)!r}" if self.cron else f"every={self.every:g}"
        return f"Schedule({self.name!r}, task={self.task.name!r}, {spec})"

    # -- ticks ---------------------------------------------------------------------

    def ticks_down(self, at_or_before_us: int) -> Iterator[int]:
        """The ticks at or before a time, newest first (epoch µs)."""
        if self.cron is None:
            tick = at_or_before_us // self._every_us * self._every_us
            while True:
                yield tick
                tick -= self._every_us
        else:
            start = datetime.fromtimestamp((at_or_before_us + 1) / _US, self.tz)
            for when in CronSim(self.cron, start, reverse=True):
                yield round(when.timestamp() * _US)

    def next_tick(self, after_us: int) -> int:
        """The first tick strictly after a time (epoch µs)."""
        if self.cron is None:
            return (after_us // self._every_us + 1) * self._every_us
        start = datetime.fromtimestamp(after_us / _US, self.tz)
        for when in CronSim(self.cron, start):
            tick = round(when.timestamp() * _US)
            if tick > after_us:
                return tick
        raise AssertionError("a cron expression always has a next tick")  # pragma: no cover

    def message(self, tick_us: int) -> JobMessage:
        """The job of one tick: a deterministic id, and the tick time it was for."""
        job_id = tick_job_id(self.name, tick_us)
        return msgspec.structs.replace(
            self._template,
            id=job_id,
            queue=self.queue,
            scheduled_for=tick_us / _US,
        )


class Plan(NamedTuple):
    """What one step of a schedule does: fire these ticks, count these as skipped, and
    record ``last`` (the newest due tick) as handled."""

    fire: list[int]
    skipped: int
    last: int


def plan(schedule: Schedule[Any], last_us: int, now_us: int) -> Plan | None:
    """The ticks due in ``(last_us, now_us]`` and what the policies make of them, or None
    when none is due.

    A due tick is *on time* while ``now - tick <= grace``; older ones were *missed*
    (nothing ran at their time). Missed ticks follow ``missed`` (skip / the newest one /
    the newest N), then every tick to fire later than ``max_lateness`` is dropped. All
    due ticks not fired are counted as skipped. At most :data:`MAX_FIRE` ticks fire.
    """
    grace_us = round(schedule.grace * _US)
    missed_policy = schedule.missed
    keep = 0 if missed_policy == "skip" else 1 if missed_policy == "once" else int(missed_policy)
    on_time: list[int] = []
    missed: list[int] = []
    total = 0
    newest: int | None = None
    every = schedule._every_us
    for tick in schedule.ticks_down(now_us):
        if tick <= last_us:
            break
        if newest is None:
            newest = tick
        if now_us - tick <= grace_us:
            if len(on_time) < MAX_FIRE:
                on_time.append(tick)
            total += 1
            continue
        if len(missed) < keep:
            missed.append(tick)
            total += 1
            continue
        # Only counting is left: arithmetic for intervals, a bounded scan for cron.
        if every:
            total += (tick - last_us - 1) // every + 1
            break
        total += 1
        if total >= _SCAN_CAP:
            break
    if newest is None:
        return None
    fire = sorted(missed + on_time)[-MAX_FIRE:]
    if schedule.max_lateness is not None:
        bound = round(schedule.max_lateness * _US)
        fire = [t for t in fire if now_us - t <= bound]
    return Plan(fire, total - len(fire), newest)


class Scheduler:
    """Fires an app's schedules from inside a worker; any number may run at once.

    Each round reads the broker's time, plans every schedule whose next tick is due,
    and sends the plans in one call; the broker applies each atomically only if the
    schedule's state is still what this scheduler read (else another worker did it,
    and the broker answers with the state as it is now). Between rounds it sleeps until the next tick by the
    broker's clock (waking early when a held tick's previous job finishes, or on
    shutdown: cancel the task running :meth:`run`).

    :param broker: the app's broker
    :param schedules: the schedules to run
    :param prune: delete the broker state of schedules not in ``schedules`` at start
        (the app's full set); False when running only some of them
    :param worker_id: for log lines
    :param clock: what the backoff after a failed step sleeps on (the wait for the next
        tick is the broker's own, by the broker's clock)
    """

    def __init__(
        self,
        broker: Broker,
        schedules: Sequence[Schedule[Any]],
        *,
        prune: bool,
        worker_id: str = "",
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.broker = broker
        self.clock = clock
        self.schedules = {s.name: s for s in schedules}
        self.prune = prune
        self.worker_id = worker_id
        self.states: dict[str, ScheduleState] = {}
        #: Jobs of previous ticks a "queue" schedule waits for, by schedule name.
        self.held: dict[str, str] = {}
        self.fired = 0

    async def run(self) -> None:
        """Reconcile, then fire ticks until cancelled. Broker errors are logged and
        retried with a capped backoff; they never end the worker."""
        backoff = 0.0
        synced = False
        while True:
            try:
                if not synced:
                    await self.sync()
                    synced = True
                wake = await self.step()
                backoff = 0.0
            except Exception as exc:
                backoff = min(5.0, backoff * 2 or 0.1)
                level = logging.DEBUG if isinstance(exc, BrokerUnavailable) else logging.WARNING
                log.log(
                    level,
                    "worker %s: scheduler step failed (%s); retrying in %.1fs",
                    self.worker_id,
                    exc,
                    backoff,
                )
                await self.clock.sleep(backoff)
                continue
            try:
                await self._sleep(wake)
            except Exception as exc:
                # The clock or a finish could not be asked for (an outage): look again
                # soon; the next step reports a lasting failure.
                log.debug("worker %s: scheduler sleep failed (%s)", self.worker_id, exc)
                await self.clock.sleep(0.5)

    async def sync(self) -> None:
        """Reconcile the broker's schedule states with these definitions (by digest)."""
        states = await self.broker.sync_schedules(
            [(s.name, s.digest) for s in self.schedules.values()], prune=self.prune
        )
        self.states = {s.name: s for s in states}

    async def step(self) -> int:
        """Fire what is due now; return when (broker µs) the next tick is due."""
        now = await self.broker.broker_time_us()
        firings: list[TickFiring] = []
        for name, schedule in self.schedules.items():
            state = self.states.get(name)
            if state is None or state.digest != schedule.digest:
                # Another definition holds the state (a worker of another version reset
                # it): that version fires it, never this one from a stale definition.
                continue
            if schedule.next_tick(state.last_tick_us) > now:
                continue
            p = plan(schedule, state.last_tick_us, now)
            if p is None:
                continue
            firings.append(
                TickFiring(
                    name=name,
                    digest=schedule.digest,
                    expected_last_us=state.last_tick_us,
                    new_last_us=p.last,
                    messages=[schedule.message(t) for t in p.fire],
                    skipped=p.skipped,
                    overlap=schedule.overlap,
                    queue=schedule.queue,
                )
            )
        if firings:
            results = await self.broker.fire_schedules(firings)
            for firing, (outcome, answered) in zip(firings, results, strict=True):
                self._log(firing, outcome, answered)
                if answered is None:
                    # Pruned by a worker whose app no longer declares it: never fire it.
                    log.warning(
                        "schedule %r: its broker state is gone (removed by a worker of "
                        "another version of the app?); this worker stops firing it",
                        firing.name,
                    )
                    del self.schedules[firing.name]
                    self.states.pop(firing.name, None)
                    self.held.pop(firing.name, None)
                    continue
                self.states[firing.name] = answered
                if outcome is FireOutcome.HELD and answered.last_job:
                    self.held[firing.name] = answered.last_job
                else:
                    self.held.pop(firing.name, None)
        return min(
            (
                self.schedules[name].next_tick(max(state.last_tick_us, now))
                for name, state in self.states.items()
                if name in self.schedules
                and name not in self.held
                and state.digest == self.schedules[name].digest
            ),
            default=now + 60 * _US,
        )

    def _log(self, firing: TickFiring, outcome: FireOutcome, state: ScheduleState | None) -> None:
        if outcome is FireOutcome.FIRED:
            self.fired += len(firing.messages)
            if firing.skipped:
                log.warning(
                    "schedule %r: skipped %d tick(s) (missed while nothing ran, or later "
                    "than max_lateness); fired %d",
                    firing.name,
                    firing.skipped,
                    len(firing.messages),
                )
        elif outcome is FireOutcome.OVERLAP_SKIPPED:
            log.info(
                "schedule %r: skipped %d tick(s): the previous tick's job %s is unfinished "
                "(overlap='skip')",
                firing.name,
                len(firing.messages),
                state.last_job if state else "?",
            )
        elif outcome is FireOutcome.FULL:
            log.warning(
                "schedule %r: skipped %d tick(s): queue %r is full (max_queue_length)",
                firing.name,
                len(firing.messages),
                self.schedules[firing.name].task.queue,
            )

    async def _sleep(self, wake_us: int) -> None:
        """Sleep until ``wake_us`` (broker clock), or until a held tick's job finishes."""
        async with anyio.create_task_group() as tg:

            async def until(coro: Any) -> None:
                await coro
                tg.cancel_scope.cancel()

            tg.start_soon(until, self.broker.sleep_until_us(wake_us))
            for job_id in self.held.values():
                tg.start_soon(until, self.broker.wait_finished(job_id, None))
