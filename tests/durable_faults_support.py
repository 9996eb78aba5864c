"""What the durable-run crash tests share (tests/process/test_durable_faults*.py): the
scene of worker processes, the hold points, and the checks of a run's log and ledger."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
import redis.asyncio as aioredis

from tests import durable_app
from tests.durable_app import STEPS, Outcome, Plan, expected
from tests.pg_harness import PgCluster
from tests.redis_harness import RedisCluster, RedisProcess, flushall
from tests.support import ROOT
from typedq import JobState, RunHandle
from typedq.broker.runs import RunRecord
from typedq.durable import (
    DoRecorded,
    LogEntry,
    SignalReceived,
    StepCompleted,
    StepFailed,
    StepScheduled,
    decode_entries,
)

#: A worker's warnings that it lost a job's lease (typedq/settling.py).
_LOST_LEASE = re.compile(r"lost the lease of job (\S+) ")
_REFUSED_OUTCOME = re.compile(r"job (\S+) \(\S+\) attempt \d+ was finished by the lease owner")

#: Seconds any one condition may take to come true (a stalled job comes back after the
#: 1 s lease; a fresh worker process starts in about a second on a loaded box).
WAIT = 30.0


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _entries(record: RunRecord) -> list[LogEntry]:
    return [e for blob in record.log for e in decode_entries(blob)]


class Scene:
    """Worker processes of tests.durable_app on a broker (``url``), and the ledger (on
    ``server``, which also holds the workers' logs)."""

    def __init__(self, server: RedisProcess, url: str, ledger: aioredis.Redis) -> None:
        self.server = server
        self.url = url
        self.ledger = ledger
        self.procs: list[subprocess.Popen[bytes]] = []
        self.killed: set[int] = set()
        self.logs: list[Path] = []

    def spawn(
        self,
        *,
        holds: Iterable[str] = (),
        queues: str | None = None,
        concurrency: int = 4,
        max_stalls: int = 10,
    ) -> subprocess.Popen[bytes]:
        """A worker process (``--queues`` ``queues``, default all) holding at ``holds``."""
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "TYPEDQ_TEST_LEDGER": f"redis://127.0.0.1:{self.server.port}/1",
            "TYPEDQ_TEST_LEASE": "1.0",
            "TYPEDQ_TEST_HOLD": ",".join(holds),
            "TYPEDQ_TEST_MAX_STALLS": str(max_stalls),
        }
        env.pop("TYPEDQ_BROKER", None)
        args = [sys.executable, "-m", "typedq", "worker", "tests.durable_app:app"]
        args += ["--broker", self.url, "--concurrency", str(concurrency), "--grace", "2"]
        if queues is not None:
            args += ["--queues", queues]
        log_path = self.server.dir / f"durable-worker-{time.monotonic_ns()}.log"
        self.logs.append(log_path)
        with log_path.open("wb") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen(args, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def kill(self, *procs: subprocess.Popen[bytes]) -> None:
        """SIGKILL ``procs`` and reap them."""
        for proc in procs:
            self.killed.add(proc.pid)
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    def stop(self) -> None:
        """SIGTERM every live worker, SIGKILL one not gone within 10 s."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    async def arm(self, *points: str) -> None:
        """Let the workers that hold at ``points`` stop there."""
        for point in points:
            await self.ledger.set(f"arm:{point}", 1)

    async def release(self, point: str) -> None:
        """Let a worker held at ``point`` go on."""
        await self.ledger.set(f"release:{point}", 1)

    async def held(self, point: str, proc: subprocess.Popen[bytes]) -> None:
        """Wait until ``proc`` stands at ``point``."""
        line = f"{point} {proc.pid}"
        with anyio.fail_after(WAIT):
            while line not in [_str(x) for x in await self.ledger.lrange("held", 0, -1)]:
                assert proc.poll() is None, f"the worker meant to hold at {point} has exited"
                await anyio.sleep(0.02)

    async def runs(self) -> dict[str, int]:
        """Executions per step job id."""
        return {_str(k): int(v) for k, v in (await self.ledger.hgetall("runs")).items()}

    async def started_any(self, proc: subprocess.Popen[bytes]) -> bool:
        """Whether ``proc`` has started a step."""
        lines = [_str(x).split() for x in await self.ledger.lrange("started", -200, -1)]
        return any(int(pid) == proc.pid for _, pid in lines)

    async def started_by(self, pids: set[int]) -> set[str]:
        """The step job ids that processes ``pids`` started."""
        lines = [_str(x).split() for x in await self.ledger.lrange("started", 0, -1)]
        return {job_id for job_id, pid in lines if int(pid) in pids}

    async def starters(self) -> dict[str, list[int]]:
        """The processes that started each step job id, in order."""
        lines = [_str(x).split() for x in await self.ledger.lrange("started", 0, -1)]
        out: dict[str, list[int]] = {}
        for job_id, pid in lines:
            out.setdefault(job_id, []).append(int(pid))
        return out

    def lost_leases(self) -> Counter[str]:
        """How many times a worker said it lost the lease of each job (its log's
        warning: the broker reported the lease lost while the job ran, or refused its
        outcome because another claim owns the job): a job another worker then claimed,
        run again without any worker being killed. A 1 s lease renewed late on a loaded
        box is lost this way; the run's log still records the step once."""
        lost: Counter[str] = Counter()
        for path in self.logs:
            text = path.read_text(errors="replace")
            lost.update(_LOST_LEASE.findall(text))
            lost.update(_REFUSED_OUTCOME.findall(text))
        return lost

    async def starts_by(self, pids: set[int]) -> Counter[str]:
        """How many times processes ``pids`` started each step job id."""
        lines = [_str(x).split() for x in await self.ledger.lrange("started", 0, -1)]
        return Counter(job_id for job_id, pid in lines if int(pid) in pids)


@asynccontextmanager
async def _scene(
    server: RedisProcess, cluster: RedisCluster | None = None, *, pg: PgCluster | None = None
) -> AsyncIterator[Scene]:
    """Workers on ``server`` (or on ``cluster``, or in a fresh schema of ``pg``: the
    ledger staying on ``server``)."""
    flushall(server.port)
    if cluster is not None:
        cluster.flushall()
    url = server.url if cluster is None else cluster.url
    if pg is not None:
        url = f"{pg.url}?schema=durable_{time.monotonic_ns()}"
    durable_app.app.use_broker(url)
    ledger = aioredis.Redis.from_url(f"redis://127.0.0.1:{server.port}/1")
    scene = Scene(server, url, ledger)
    try:
        async with durable_app.app:
            yield scene
    finally:
        scene.stop()
        await ledger.aclose()


async def _until(
    handle: RunHandle[Outcome], what: str, ok: Callable[[RunRecord], bool]
) -> RunRecord:
    """Poll the run's record until ``ok`` holds (``what`` names the condition)."""
    with anyio.fail_after(WAIT):
        while True:
            record = await handle.record()
            if ok(record):
                return record
            assert not record.state.is_final, f"run ended ({record.state}) before {what}"
            await anyio.sleep(0.02)


async def _until_true(what: str, ok: Callable[[], Awaitable[bool]]) -> None:
    with anyio.fail_after(WAIT):
        while not await ok():  # noqa: ASYNC110 -- the condition is another process's doing
            await anyio.sleep(0.02)
    assert await ok(), what


def _has(kind: type[LogEntry], position: int | None = None) -> Callable[[RunRecord], bool]:
    """A record whose log holds an entry of ``kind`` (at ``position``, if given)."""
    return lambda r: any(
        isinstance(e, kind) and (position is None or e.position == position) for e in _entries(r)
    )


async def _step_completed(job_id: str) -> bool:
    [job] = await durable_app.app.broker.get([job_id])
    return job is not None and job.state is JobState.COMPLETED


def _check_log(record: RunRecord, plan: Plan) -> list[int]:
    """The run's log records each step once, scheduled and completed, and no failure;
    its ``do`` value and its signal once: the step positions, in order."""
    entries = _entries(record)
    scheduled = [e.position for e in entries if isinstance(e, StepScheduled)]
    completed = [e.position for e in entries if isinstance(e, StepCompleted)]
    assert len(scheduled) == STEPS, entries
    assert sorted(completed) == sorted(set(scheduled)) == scheduled, entries
    assert not [e for e in entries if isinstance(e, StepFailed)], entries
    assert len([e for e in entries if isinstance(e, DoRecorded)]) == int(plan.do), entries
    assert len([e for e in entries if isinstance(e, SignalReceived)]) == int(plan.wait), entries
    return scheduled


async def _check(
    scene: Scene,
    handle: RunHandle[Outcome],
    plan: Plan,
    *,
    bump: int = 0,
    twice: Sequence[int] = (),
) -> RunRecord:
    """The run completes with the right result; its log records each step once; each
    step ran once, the steps ``twice`` (indexes) twice: their first run was killed."""
    with anyio.fail_after(WAIT):
        assert await handle.result() == expected(plan, bump)
    record = await handle.record()
    positions = _check_log(record, plan)
    ids = [f"{handle.run_id}:{p}" for p in positions]
    assert await scene.runs() == {job_id: 2 if k in twice else 1 for k, job_id in enumerate(ids)}
    return record


STEP_INDEXES = list(range(STEPS))
#: Every step on one Redis; the middle one on Redis Cluster too, where a run's turns and
#: its steps are on two slots (the steps' outcomes travel through the outbox).
STEPS_WHERE = [
    *((k, "redis") for k in STEP_INDEXES),
    pytest.param(2, "cluster", marks=pytest.mark.cluster),
]
WHERE = ["redis", pytest.param("cluster", marks=pytest.mark.cluster)]


def _pg(request: pytest.FixtureRequest, where: str) -> PgCluster | None:
    """The session's PostgreSQL server when ``where`` says so."""
    if where != "postgres":
        return None
    pg: PgCluster = request.getfixturevalue("pg_cluster")
    return pg


def _cluster(request: pytest.FixtureRequest, where: str) -> RedisCluster | None:
    """The session's Redis Cluster when ``where`` says so."""
    if where != "cluster":
        return None
    cluster: RedisCluster = request.getfixturevalue("redis_cluster")
    return cluster
