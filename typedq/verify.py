"""``typedq verify``: may this release's models meet what the broker still holds?

:func:`verify` compares an app's current task models with every input schema
fingerprint the broker knows of: the schema registry's records (every fingerprint a
producer or worker process of the app recorded, :mod:`typedq.broker.schemas`) and the
fingerprints the jobs still in the broker carry. Per ``(task, fingerprint)`` a
:class:`Row`: how many jobs carry it, and a verdict by the rules of
:mod:`typedq.compat` (old schema from the registry against the current model):

- ``compatible``: the current schema itself, or one whose payloads the current model
  decodes (and whose readers decode the current results);
- ``incompatible``: with the reason naming the field; a job of a task the app no longer
  has is incompatible too;
- ``unknown``: jobs carry a fingerprint the registry has no schema for (enqueued by a
  producer older than the registry), or the rules cannot compare the schemas.

The jobs counted are every queue's waiting, scheduled (held workflow steps and
retrying jobs too), active, failed and cancelled jobs (the last two run again when
retried). A broker with capability ``FingerprintCounts`` (memory, Redis) counts them
itself, exactly (:func:`count_exact`): page by page, each page a bounded call that
reads the stored envelopes where they are and answers only ``(task, fingerprint) ->
jobs`` (on Redis, one script call of a few milliseconds per ~1,000 jobs, so a million
jobs are counted in seconds without blocking Redis for long: bench/verify_scale.py).
Without it, the jobs are read: a bounded, paged scan round-robin over queues and
states, through ``page_jobs`` and ``get``, at most ``sample`` jobs in all
(:func:`count_fingerprints`); a scan cut short reports its counts as lower bounds
(:attr:`Row.at_least`, :attr:`Report.capped`). The broker keeps no running count per
fingerprint: that would cost every enqueue and every way out of a state
(bench/results/issue28-count-cost.txt). Completed jobs never run again and are not
counted. A schedule's payload is the app's code, not the broker's; workflow steps not
yet started are ``scheduled`` jobs whose envelope carries their fingerprint. A run's
turns (jobs typedq enqueues for a durable run, without a fingerprint) are not counted:
what the run holds is (below).

A fingerprint the task upcasts from (``@task.upcast``, :mod:`typedq.upcast`) is
compatible: the worker decodes it with the upcaster's model of that very schema.

Durable runs (capability ``Runs``, :mod:`typedq.durable`) hold payloads a replay
decodes again, and no job carries them: :func:`count_runs` reads the running runs
(``page_runs``, then ``get_runs``, bounded like the job scan). A run's input carries its
fingerprint (:attr:`~typedq.broker.runs.RunSpec.fingerprint`), checked as a job's is,
under ``run:<name>`` (the registry records each durable function's schemas so). What a
run holds without a fingerprint is decoded with the model that will read it, and its
row (fingerprint ``-``) says whether every payload decoded: the signals in its inbox and
those its log recorded (``signal:<name>``, the process's :class:`~typedq.Signal` of that
name), its steps' results recorded or kept for the next turn (``result:<task>``), and
the input of a run created before runs kept the fingerprint.

``--against`` a producer stub module (:mod:`typedq.producer`) adds a row per stub: its
declared input model against the app's (a producer deployed from an old stub).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import msgspec

from .app import App
from .broker.base import Broker, JobState
from .broker.capabilities import FingerprintCounts, Runs, supports
from .broker.runs import RUN_SCHEMA_PREFIX, RunRecord
from .broker.schemas import SchemaRecord
from .compat import Verdict, check, decoding_schema
from .durable.host import TURN_PREFIX
from .durable.log import SignalReceived, StepCompleted, StepScheduled, decode_entries
from .durable.types import Signal, known_signals
from .errors import BrokerDataError, Unsupported
from .producer import Producer
from .serde import Codec

__all__ = [
    "SCANNED_STATES",
    "Report",
    "Row",
    "RunCounts",
    "count_exact",
    "count_fingerprints",
    "count_runs",
    "verify",
]

#: The states whose jobs may still be decoded by a worker (failed and cancelled ones
#: when an operator retries them).
SCANNED_STATES = (
    JobState.WAITING,
    JobState.SCHEDULED,
    JobState.ACTIVE,
    JobState.FAILED,
    JobState.CANCELLED,
)

#: Ids per page of the scan (one ``page_jobs``, then ``get`` calls of GET_CHUNK ids).
PAGE = 500

#: Jobs per ``count_fingerprints`` call of the exact count: on Redis one script call,
#: ~13k server instructions per waiting job counted (callgrind; ~34k while stale
#: entries need checking), so about a millisecond of CPU a call on a loaded 2-core box
#: (bench/results/issue28-verify-scale.txt).
COUNT_PAGE = 500

#: Queue states the exact count pages at once (one call of each in flight).
COUNT_WALKS = 4

#: Runs per ``get_runs`` of the run scan (a run's record carries its log).
RUN_CHUNK = 20

#: The fingerprint column of a row checked by decoding payloads that carry none.
DECODED = "-"

#: Ids per ``get`` of the scan: on Redis, reading a waiting job that lives only in its
#: queue's list is a search of that list, ~0.1 ms per id at 100,000 waiting jobs; 20 ids
#: keep each call near 2 ms, so the scan never blocks Redis for long
#: (bench/verify_scale.py).
GET_CHUNK = 20


class Row(msgspec.Struct, frozen=True, kw_only=True):
    """One ``(task, fingerprint)`` and its verdict."""

    task: str
    fingerprint: str
    #: Jobs found carrying it (a lower bound when :attr:`at_least`); on a row of
    #: durable runs (``run:``, ``signal:``, ``result:``), the running runs holding it.
    jobs: int
    #: compatible, incompatible or unknown.
    verdict: str
    reason: str = ""
    #: Where the fingerprint was seen: ``current`` (the app's own), ``registry``,
    #: ``jobs`` (carried by jobs, not in the registry), ``stub`` (``--against``),
    #: ``runs`` (payloads durable runs hold without a fingerprint, decoded: ``-``).
    source: str = "registry"
    #: When the registry first saw it (broker clock, epoch seconds); 0: not recorded.
    first_seen: float = 0.0
    #: ``jobs`` is a lower bound: the scan that counted it stopped at its limit (the
    #: sampled job scan, or the run scan for a row of runs).
    at_least: bool = False


class Report(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`verify` found."""

    app: str
    rows: list[Row]
    #: Jobs counted (exact) or read by the sample scan.
    scanned: int
    #: A scan stopped at its limit: some counts are lower bounds (the rows' ``at_least``).
    capped: bool
    #: Why some fingerprint could not be checked, in a line (empty: everything was).
    note: str = ""
    #: Running durable runs read (their rows count runs, not jobs); ``capped`` covers
    #: this scan too.
    runs: int = 0
    #: The broker counted every job (capability ``FingerprintCounts``): job counts are
    #: exact. False: they come from a sample scan (``scanned`` jobs read).
    exact: bool = False

    @property
    def exit_code(self) -> int:
        """0 every row compatible, 1 any incompatible, 2 any unknown (and none worse)."""
        verdicts = {row.verdict for row in self.rows}
        if "incompatible" in verdicts:
            return 1
        if "unknown" in verdicts:
            return 2
        return 0


async def count_fingerprints(
    broker: Broker, queues: Sequence[str], *, sample: int
) -> tuple[Counter[tuple[str, str]], int, bool]:
    """Count ``(task, fingerprint)`` over the jobs of ``queues`` in :data:`SCANNED_STATES`:
    ``(counts, jobs read, capped)``. Pages go round-robin over every queue and state, so
    a cap leaves no state unread while another is read deep; at most ``sample`` jobs
    are read, each once (a job met again while it moves is not counted twice)."""
    counts: Counter[tuple[str, str]] = Counter()
    streams: list[tuple[str, JobState, str | None]] = [
        (q, s, None) for q in queues for s in SCANNED_STATES
    ]
    seen: set[tuple[str, str]] = set()
    read = 0
    while streams and read < sample:
        share = max(1, min(PAGE, (sample - read) // len(streams)))
        following: list[tuple[str, JobState, str | None]] = []
        for queue, state, cursor in streams:
            if read >= sample:
                following.append((queue, state, cursor))
                continue
            page = await broker.page_jobs(
                queue, state, cursor=cursor, limit=min(share, sample - read)
            )
            fresh = [i for i in page.ids if (queue, i) not in seen]
            seen.update((queue, i) for i in fresh)
            for at in range(0, len(fresh), GET_CHUNK):
                for record in await broker.get(fresh[at : at + GET_CHUNK], queue=queue):
                    if record is None:
                        continue  # gone since it was listed
                    message = record.message
                    if not message.fingerprint and message.task.startswith(TURN_PREFIX):
                        # A run's turn, which the broker enqueues without a fingerprint:
                        # its payload is typedq's own (the run's id); what the run holds
                        # is read from the run (count_runs).
                        continue
                    counts[(message.task, message.fingerprint)] += 1
            read += len(fresh)
            if page.cursor is not None:
                following.append((queue, state, page.cursor))
        streams = following
    return counts, read, bool(streams)


async def count_exact(
    broker: Broker, queues: Sequence[str]
) -> tuple[Counter[tuple[str, str]], int]:
    """Count ``(task, fingerprint)`` over every job of ``queues`` in
    :data:`SCANNED_STATES`, by the broker (capability ``FingerprintCounts``): ``(counts,
    jobs counted)``. Each call counts a bounded page where the jobs are stored, so no
    job is transferred and no call holds the broker for long; :data:`COUNT_WALKS`
    queue states are paged at once (one call of each in flight), so the broker is not
    left idle between a reply and the next call, and a Redis Cluster counts its shards'
    queues side by side. A run's turns are left out (see :func:`count_fingerprints`).
    On a broker at rest every job is counted once; one that moves meanwhile may be
    counted in two states or in none."""
    counts: Counter[tuple[str, str]] = Counter()
    total = 0
    walks = anyio.CapacityLimiter(COUNT_WALKS)

    async def walk(queue: str, state: JobState) -> None:
        nonlocal total
        async with walks:
            cursor: str | None = None
            while True:
                page = await broker.count_fingerprints(
                    queue, state, cursor=cursor, limit=COUNT_PAGE
                )
                total += page.jobs
                for (task, fingerprint), jobs in page.counts.items():
                    if not fingerprint and task.startswith(TURN_PREFIX):
                        total -= jobs  # a run's turn (see count_fingerprints)
                        continue
                    counts[(task, fingerprint)] += jobs
                if page.cursor is None:
                    return
                cursor = page.cursor

    async with anyio.create_task_group() as group:
        for queue in queues:
            for state in SCANNED_STATES:
                group.start_soon(walk, queue, state)
    return counts, total


class _Decoded:
    """Payloads of one row decoded with the model that will read them (``missing``: no
    model to read them with, and why: the row's verdict)."""

    __slots__ = ("bad", "count", "first", "missing", "runs")

    def __init__(self, missing: Verdict | None = None) -> None:
        self.count = 0
        self.bad = 0
        self.first = ""
        self.missing = missing
        self.runs: set[str] = set()

    def add(self, run_id: str, codec: Codec[Any] | None, payload: bytes) -> None:
        self.count += 1
        self.runs.add(run_id)
        if codec is None:
            return
        try:
            codec.decode(payload)
        except Exception as exc:  # the codec's own error, whichever library
            self.bad += 1
            if not self.first:
                self.first = f"{type(exc).__name__}: {exc}".splitlines()[0]

    def verdict(self) -> Verdict:
        if self.missing is not None:
            return self.missing
        if self.bad:
            return Verdict(
                "incompatible", f"{self.bad} of {self.count} payloads do not decode: {self.first}"
            )
        return Verdict("compatible", f"{self.count} payloads decode")


class RunCounts(msgspec.Struct, kw_only=True):
    """What :func:`count_runs` found: the running runs' input fingerprints, and the
    payloads they hold without one, decoded."""

    #: ``(run:<name>, input fingerprint)`` -> runs.
    fingerprints: Counter[tuple[str, str]]
    #: Row name (``signal:<name>``, ``result:<task>``, ``run:<name>``) -> its verdict
    #: and how many runs hold such payloads.
    decoded: dict[str, tuple[Verdict, int]]
    read: int
    capped: bool


async def count_runs(broker: Broker, app: App, *, sample: int) -> RunCounts:
    """Read the running durable runs: count their input fingerprints, and decode what
    they hold without one (see the module). At most ``sample`` runs are looked at,
    ended ones (skipped: never replayed) included, so the work stays bounded however
    many ended runs retention keeps. A broker without runs has none."""
    counts: Counter[tuple[str, str]] = Counter()
    decoded: dict[str, _Decoded] = {}
    if not supports(broker, Runs):
        return RunCounts(fingerprints=counts, decoded={}, read=0, capped=False)
    signals = known_signals()
    seen: set[str] = set()
    read = 0
    # Runs looked at, ended ones too (retention keeps many): the bound of the work.
    fetched = 0
    cursor: str | None = None
    left: list[str] = []  # ids listed and not read yet (a page may hold more than asked)
    while fetched < sample:
        if not left:
            if cursor is None and seen:
                break
            ids, cursor = await broker.page_runs(cursor=cursor, limit=min(PAGE, sample - fetched))
            left = [i for i in ids if i not in seen]
            seen.update(left)
            if not left and cursor is None:
                break
        chunk = left[: min(RUN_CHUNK, sample - fetched)]
        del left[: len(chunk)]
        fetched += len(chunk)
        for record in await broker.get_runs(chunk):
            if record is None or record.state.is_final:
                continue  # gone, or ended: never replayed again
            read += 1
            _count_run(app, record, signals, counts, decoded)
    verdicts = {name: (found.verdict(), len(found.runs)) for name, found in decoded.items()}
    capped = bool(left) or (cursor is not None and fetched >= sample)
    return RunCounts(fingerprints=counts, decoded=verdicts, read=read, capped=capped)


def _count_run(
    app: App,
    record: RunRecord,
    signals: Mapping[str, Signal[Any]],
    counts: Counter[tuple[str, str]],
    decoded: dict[str, _Decoded],
) -> None:
    spec = record.spec
    run_id = spec.id

    def decode(row: str, codec: Codec[Any] | None, payload: bytes, missing: Verdict) -> None:
        found = decoded.get(row)
        if found is None:
            found = decoded[row] = _Decoded(None if codec is not None else missing)
        found.add(run_id, codec, payload)

    def signal(name: str, payload: bytes) -> None:
        model = signals.get(name)
        decode(
            f"signal:{name}",
            None if model is None else model.codec,
            payload,
            Verdict("unknown", f"no Signal `{name}` in the app's modules to decode it with"),
        )

    def result(name: str, payload: bytes) -> None:
        task = app.tasks.get(name)
        decode(
            f"result:{name}",
            None if task is None else task.output,
            payload,
            Verdict("incompatible", f"task `{name}` is not in the app; runs hold its results"),
        )

    if spec.fingerprint:
        counts[(f"{RUN_SCHEMA_PREFIX}{spec.name}", spec.fingerprint)] += 1
    else:  # created before runs kept their input's fingerprint
        durable = app.durables.get(spec.name)
        decode(
            f"{RUN_SCHEMA_PREFIX}{spec.name}",
            None if durable is None else durable.input,
            spec.input,
            Verdict("incompatible", f"durable function `{spec.name}` is not in the app"),
        )
    for name, payloads in record.inbox.items():
        for payload in payloads:
            signal(name, payload)
    steps: dict[int, str] = {}
    for blob in record.log:
        try:
            entries = decode_entries(blob)
        except BrokerDataError:
            continue  # not a log typedq wrote: its next turn reports it
        for entry in entries:
            if isinstance(entry, StepCompleted):
                result(entry.task, entry.output)
            elif isinstance(entry, SignalReceived):
                signal(entry.signal, entry.payload)
            elif isinstance(entry, StepScheduled):
                steps[entry.position] = entry.task
    # Step outcomes kept for the next turn (not in the log yet): their results too.
    for job_id, outcome in record.outcomes.items():
        position = job_id.rpartition(":")[2]
        task_name = steps.get(int(position)) if position.isdigit() else None
        if outcome.result is not None and task_name is not None:
            result(task_name, outcome.result)


async def verify(
    app: App,
    broker: Broker,
    *,
    against: Producer | None = None,
    sample: int = 10_000,
    queues: Sequence[str] | None = None,
) -> Report:
    """Compare ``app``'s models with the broker's fingerprints (see the module).

    :param broker: connected
    :param against: a producer stub module's Producer whose declared models to check too
    :param sample: the most jobs the sample scan reads (a broker that counts jobs
        itself counts them all), and the most durable runs read
    :param queues: the queues to scan (default: the broker's queue registry and the app's)
    :raises Unsupported: the broker has no schema registry
    """
    records = await broker.schema_records()
    if queues is None:
        try:
            registered = await broker.list_queues()
        except Unsupported:
            registered = []
        queues = sorted(set(registered) | set(app.queues))
    exact = supports(broker, FingerprintCounts)
    if exact:
        counts, scanned = await count_exact(broker, queues)
        capped = False
    else:
        counts, scanned, capped = await count_fingerprints(broker, queues, sample=sample)
    runs = await count_runs(broker, app, sample=sample)
    counts.update(runs.fingerprints)
    by_key = {(r.task, r.fingerprint): r for r in records}
    current = [(t.name, t.input.fingerprint) for t in app.tasks.values()]
    current += [
        (f"{RUN_SCHEMA_PREFIX}{d.name}", d.input.fingerprint) for d in app.durables.values()
    ]
    keys = sorted({*by_key, *counts, *current})
    rows = [_row(app, key, by_key.get(key), counts.get(key, 0)) for key in keys]
    rows += [
        _make(name, DECODED, held, verdict, "runs", 0.0)
        for name, (verdict, held) in sorted(runs.decoded.items())
    ]
    rows = [_bounded(row, jobs=capped, runs=runs.capped) for row in rows]
    if against is not None:
        rows += _stub_rows(app, against)
    unknown = sum(1 for r in rows if r.verdict == "unknown" and r.source == "jobs")
    note = (
        f"{unknown} fingerprint(s) carried by jobs have no recorded schema (enqueued "
        "before the registry, or by a producer that could not record)"
        if unknown
        else ""
    )
    return Report(
        app=app.name,
        rows=rows,
        scanned=scanned,
        capped=capped or runs.capped,
        note=note,
        runs=runs.read,
        exact=exact,
    )


def _bounded(row: Row, *, jobs: bool, runs: bool) -> Row:
    """``row`` marked :attr:`Row.at_least` when the scan that counted it stopped short:
    the run scan for a row of runs, else the job scan."""
    of_runs = row.source == "runs" or row.task.startswith(RUN_SCHEMA_PREFIX)
    if not (runs if of_runs else jobs):
        return row
    return msgspec.structs.replace(row, at_least=True)


class _Models(msgspec.Struct, frozen=True):
    """What reads a row's payloads: a task's models, or a durable function's."""

    input: Codec[Any]
    output: Codec[Any]
    upcasters: Mapping[str, Any]


def _models(app: App, name: str) -> _Models | None:
    if name.startswith(RUN_SCHEMA_PREFIX):
        durable = app.durables.get(name[len(RUN_SCHEMA_PREFIX) :])
        return None if durable is None else _Models(durable.input, durable.output, {})
    task = app.tasks.get(name)
    return None if task is None else _Models(task.input, task.output, task.upcasters)


def _row(app: App, key: tuple[str, str], record: SchemaRecord | None, jobs: int) -> Row:
    name, fingerprint = key
    first_seen = record.first_seen if record is not None else 0.0
    task = _models(app, name)
    source = "registry" if record is not None else "jobs"
    if task is None:
        holders = "runs hold" if name.startswith(RUN_SCHEMA_PREFIX) else "jobs carry"
        if jobs:
            verdict = Verdict("incompatible", f"task `{name}` is not in the app; {holders} it")
        else:
            none = "no run holds" if name.startswith(RUN_SCHEMA_PREFIX) else "no job carries"
            verdict = Verdict("compatible", f"task `{name}` is not in the app; {none} it")
        return _make(name, fingerprint, jobs, verdict, source, first_seen)
    current = fingerprint == task.input.fingerprint
    upcaster = task.upcasters.get(fingerprint)
    if upcaster is not None:
        # The worker turns these payloads into the current model (typedq.upcast); the
        # upcaster's model has this very fingerprint, so it decodes them.
        verdict = Verdict("compatible", f"upcast by {upcaster.name}")
        if record is not None:
            back = check(decoding_schema(task.output), json.loads(record.output_schema))
            if not back.ok:
                verdict = Verdict(back.verdict, f"result: {back.reason}")
        return _make(name, fingerprint, jobs, verdict, source, first_seen)
    if record is None:
        verdict = (
            Verdict("compatible")
            if current
            else Verdict("unknown", "no schema recorded for this fingerprint")
        )
        return _make(name, fingerprint, jobs, verdict, "current" if current else source, 0.0)
    verdict = _both_ways(
        json.loads(record.input_schema),
        decoding_schema(task.input),
        decoding_schema(task.output),
        json.loads(record.output_schema),
    )
    return _make(name, fingerprint, jobs, verdict, "current" if current else source, first_seen)


def _both_ways(
    old_input: Mapping[str, Any],
    new_input: Mapping[str, Any],
    new_output: Mapping[str, Any],
    old_output: Mapping[str, Any],
) -> Verdict:
    """The old payloads into the new input model; then the new results into the old
    output model (a producer of the old release waiting for a result decodes it)."""
    verdict = check(old_input, new_input)
    if not verdict.ok:
        return verdict
    back = check(new_output, old_output)
    if not back.ok:
        return Verdict(back.verdict, f"result: {back.reason}")
    return verdict


def _make(
    task: str, fingerprint: str, jobs: int, verdict: Verdict, source: str, first_seen: float
) -> Row:
    return Row(
        task=task,
        fingerprint=fingerprint,
        jobs=jobs,
        verdict=verdict.verdict,
        reason=verdict.reason,
        source=source,
        first_seen=first_seen,
    )


def _stub_rows(app: App, producer: Producer) -> list[Row]:
    rows = []
    for name, stub in sorted(producer.tasks.items()):
        task = app.tasks.get(name)
        if task is None:
            verdict = Verdict("incompatible", f"the stub's task `{name}` is not in the app")
        else:
            verdict = _both_ways(
                decoding_schema(stub.input),
                decoding_schema(task.input),
                decoding_schema(task.output),
                decoding_schema(stub.output),
            )
        rows.append(_make(name, stub.input.fingerprint, 0, verdict, "stub", 0.0))
    return rows
