"""Durable runs on Redis with real worker processes SIGKILLed at every point of a run.

Workers run :mod:`tests.durable_app`: a run of five steps, with a ``do`` block, a
``run.sleep`` or a ``run.wait_for`` in the middle when its input asks. A worker started
with hold points stops there (when the test arms the point) and says so in the ledger
(database 1 of the same redis-server), so the test SIGKILLs it at a known point: inside a
step, in the turn that read a step's outcome before it was logged, between a turn's
enqueue of a step and the append that names it, after a step completed with no worker
left to run its turn, inside a ``do`` block, while the run sleeps or waits (every worker
killed), and while a signal is delivered. A fresh worker process then finishes the run,
and the test checks from outside: the right result, each step recorded once in the run's
log, each step run once (twice only the step the kill interrupted), nothing lost.

The batch test runs a thousand runs on two worker processes, one SIGKILLed and restarted
three times during the batch, with the same checks for every run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from functools import partial

import anyio
import pytest
import redis.asyncio as aioredis

from tests import durable_app
from tests.durable_app import STEPS, TURNS, Go, Outcome, Plan, expected, go, pipeline
from tests.redis_harness import RedisCluster, RedisProcess, flushall
from tests.support import ROOT
from typedq import JobFailed, JobState, RunHandle
from typedq.broker.runs import RunRecord, SignalOutcome
from typedq.durable import (
    DoRecorded,
    LogEntry,
    SignalReceived,
    StepCompleted,
    StepFailed,
    StepScheduled,
    decode_entries,
)
from typedq.task import DEFAULT_QUEUE

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.anyio, pytest.mark.asyncio_only]

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


@asynccontextmanager
async def _scene(server: RedisProcess, cluster: RedisCluster | None = None) -> AsyncIterator[Scene]:
    """Workers on ``server`` (or on ``cluster``, the ledger staying on ``server``)."""
    flushall(server.port)
    if cluster is not None:
        cluster.flushall()
    url = server.url if cluster is None else cluster.url
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


def _cluster(request: pytest.FixtureRequest, where: str) -> RedisCluster | None:
    """The session's Redis Cluster when ``where`` says so."""
    if where != "cluster":
        return None
    cluster: RedisCluster = request.getfixturevalue("redis_cluster")
    return cluster


@pytest.mark.parametrize("k", STEP_INDEXES)
async def test_sigkill_inside_a_step(redis_server: RedisProcess, k: int) -> None:
    """Killed while step K's handler runs: the step runs again (its job stalls, then a
    fresh worker takes it), and is recorded once."""
    async with _scene(redis_server) as scene:
        victim = scene.spawn(holds=[f"step:{k}"])
        await scene.arm(f"step:{k}")
        plan = Plan(n=k + 1)
        handle = await pipeline.start(plan, run_id=f"in-step-{k}")
        await scene.held(f"step:{k}", victim)
        scene.kill(victim)
        scene.spawn()
        await _check(scene, handle, plan, twice=[k])


@pytest.mark.parametrize("k", STEP_INDEXES)
async def test_sigkill_in_the_turn_that_read_a_step_outcome(
    redis_server: RedisProcess, k: int
) -> None:
    """Killed in the turn that has read step K's outcome (the function runs past it) and
    not appended it yet: the next turn records it; no step runs again. For K = 4 the
    turn is the one that would complete the run."""
    async with _scene(redis_server) as scene:
        victim = scene.spawn(holds=[f"after:{k}"])
        await scene.arm(f"after:{k}")
        plan = Plan(n=7)
        handle = await pipeline.start(plan, run_id=f"after-{k}")
        await scene.held(f"after:{k}", victim)
        record = await handle.record()
        assert not _has(StepCompleted, k)(record)  # the outcome is not logged yet
        assert f"{handle.run_id}:{k}" in record.outcomes  # but the broker keeps it
        scene.kill(victim)
        scene.spawn()
        await _check(scene, handle, plan)


@pytest.mark.parametrize(("k", "where"), STEPS_WHERE)
async def test_sigkill_between_enqueueing_a_step_and_logging_it(
    redis_server: RedisProcess, request: pytest.FixtureRequest, k: int, where: str
) -> None:
    """Killed in the turn after it enqueued step K's job and before the append that
    records the step as scheduled; the step runs meanwhile (a steps-only worker) and
    completes while the log does not name it. The next turn schedules the same job id
    (no second job), finds the outcome kept and records it: the step ran once."""
    async with _scene(redis_server, _cluster(request, where)) as scene:
        victim = scene.spawn(holds=[f"enqueued:{k}"], queues=TURNS, concurrency=1)
        scene.spawn(queues=DEFAULT_QUEUE)
        await scene.arm(f"enqueued:{k}")
        plan = Plan(n=3)
        handle = await pipeline.start(plan, run_id=f"enq-{k}")
        await scene.held(f"enqueued:{k}", victim)
        job_id = f"{handle.run_id}:{k}"
        await _until_true(f"step {k} completed", lambda: _step_completed(job_id))
        record = await _until(handle, "the outcome kept", lambda r: job_id in r.outcomes)
        assert not _has(StepScheduled, k)(record)  # the log does not name the step
        scene.kill(victim)
        scene.spawn(queues=TURNS)
        await _check(scene, handle, plan)


@pytest.mark.parametrize(("k", "where"), STEPS_WHERE)
async def test_sigkill_after_a_step_completed_with_no_turn_worker(
    redis_server: RedisProcess, request: pytest.FixtureRequest, k: int, where: str
) -> None:
    """The turns' worker is killed while step K runs; step K completes (its outcome and
    the run's next turn are written by the step's completion) and its worker is killed
    right after: no process is left that saw the outcome. A fresh worker finishes the
    run; the step is not run again."""
    async with _scene(redis_server, _cluster(request, where)) as scene:
        turns = scene.spawn(queues=TURNS)
        steps = scene.spawn(holds=[f"step:{k}"], queues=DEFAULT_QUEUE)
        await scene.arm(f"step:{k}")
        plan = Plan(n=11)
        handle = await pipeline.start(plan, run_id=f"handoff-{k}")
        await scene.held(f"step:{k}", steps)
        scene.kill(turns)
        await scene.release(f"step:{k}")
        job_id = f"{handle.run_id}:{k}"
        await _until_true(f"step {k} completed", lambda: _step_completed(job_id))
        record = await _until(handle, "the outcome kept", lambda r: job_id in r.outcomes)
        assert not _has(StepCompleted, k)(record)
        scene.kill(steps)
        scene.spawn()
        await _check(scene, handle, plan)


@pytest.mark.cluster
@pytest.mark.parametrize("k", [0, 4])
async def test_sigkill_between_a_steps_completion_and_its_handoff_on_cluster(
    redis_server: RedisProcess, redis_cluster: RedisCluster, k: int
) -> None:
    """On Redis Cluster a run's turns (queue ``turns``) and its steps (``default``) are
    on two slots: step K's completion writes the run's hand-off to the outbox of the
    step's queue, and its worker applies it on the run's slot right after. The worker is
    killed in between: a live worker's reaper pass applies the hand-off (once it is
    HANDOFF_AGE old) and the run goes on; the step is not run again."""
    async with _scene(redis_server, redis_cluster) as scene:
        scene.spawn(queues=TURNS)
        steps = scene.spawn(holds=[f"step:{k}", "handoff"], queues=DEFAULT_QUEUE)
        await scene.arm(f"step:{k}")
        plan = Plan(n=13)
        handle = await pipeline.start(plan, run_id=f"outbox-{k}")
        await scene.held(f"step:{k}", steps)
        await scene.arm("handoff")
        await scene.release(f"step:{k}")
        await scene.held("handoff", steps)
        job_id = f"{handle.run_id}:{k}"
        assert await _step_completed(job_id)
        record = await handle.record()
        assert job_id not in record.outcomes  # the hand-off is not applied yet
        assert not _has(StepCompleted, k)(record)
        scene.kill(steps)
        scene.spawn(queues=DEFAULT_QUEUE)
        await _check(scene, handle, plan)


@pytest.mark.parametrize("point", ["step:3", "step:4", "gathered"])
async def test_sigkill_in_a_gather(redis_server: RedisProcess, point: str) -> None:
    """Steps 3 and 4 run at once (``run.gather``); the worker is killed inside one of
    them while the other completes, or in the turn that read both outcomes. The run
    waits for the one it still needs (the turn that logs the first outcome waits on the
    pending one), and records each once; only the interrupted step runs again."""
    async with _scene(redis_server) as scene:
        victim = scene.spawn(holds=[point])
        await scene.arm(point)
        plan = Plan(n=9, gather=True)
        handle = await pipeline.start(plan, run_id=f"gather-{point.replace(':', '-')}")
        await scene.held(point, victim)
        if point.startswith("step:"):
            other = 4 if point == "step:3" else 3
            # The other step completes while this one is held (positions are the indexes).
            job_id = f"{handle.run_id}:{other}"
            await _until_true(f"step {other} completed", lambda: _step_completed(job_id))
        scene.kill(victim)
        scene.spawn()
        twice = [int(point[5:])] if point.startswith("step:") else []
        await _check(scene, handle, plan, twice=twice)


async def test_sigkill_inside_a_do_block(redis_server: RedisProcess) -> None:
    """Killed inside the ``do`` block: it runs again (at-least-once) and its value is
    recorded once."""
    async with _scene(redis_server) as scene:
        victim = scene.spawn(holds=["do"])
        await scene.arm("do")
        plan = Plan(n=5, do=True)
        handle = await pipeline.start(plan, run_id="do")
        await scene.held("do", victim)
        scene.kill(victim)
        scene.spawn()
        await _check(scene, handle, plan)
        assert int(await scene.ledger.hget("do", handle.run_id) or 0) == 2


async def test_every_worker_sigkilled_while_the_run_sleeps(redis_server: RedisProcess) -> None:
    """Every worker is killed while the run sleeps; its sleep ends with no worker alive
    (nothing happens), and a fresh worker wakes it where it slept."""
    async with _scene(redis_server) as scene:
        workers = [scene.spawn(), scene.spawn()]
        plan = Plan(n=2, sleep=1.5)
        handle = await pipeline.start(plan, run_id="asleep")
        record = await _until(handle, "asleep", lambda r: r.wake_at is not None)
        until = record.wake_at
        assert until is not None
        scene.kill(*workers)
        broker = durable_app.app.broker

        async def woke() -> bool:
            return await broker.broker_time_us() / 1e6 > until + 0.2

        await _until_true("the sleep's end", woke)
        assert (await handle.record()).log == record.log  # nobody ran its turn
        scene.spawn()
        await _check(scene, handle, plan)


async def test_sigkill_in_the_turn_a_sleep_woke(redis_server: RedisProcess) -> None:
    """Killed in the turn that the sleep's timer started, after the sleep returned and
    before anything was appended: the timer's turn job stalls and comes back; the run
    goes on from its sleep, no step runs again."""
    async with _scene(redis_server) as scene:
        victim = scene.spawn(holds=["woke"])
        await scene.arm("woke")
        plan = Plan(n=8, sleep=0.5)
        handle = await pipeline.start(plan, run_id="woke")
        await scene.held("woke", victim)
        scene.kill(victim)
        scene.spawn()
        await _check(scene, handle, plan)


async def test_every_worker_sigkilled_while_the_run_waits_for_a_signal(
    redis_server: RedisProcess,
) -> None:
    """Every worker is killed while the run waits for ``go``; the signal is sent with no
    worker alive (kept in the inbox), and a fresh worker delivers it."""
    async with _scene(redis_server) as scene:
        workers = [scene.spawn(), scene.spawn()]
        plan = Plan(n=4, wait=True)
        handle = await pipeline.start(plan, run_id="waiting")
        await _until(handle, "waiting", lambda r: r.wait_signal == go.name)
        scene.kill(*workers)
        assert await handle.send(go, Go(bump=50)) is SignalOutcome.DELIVERED
        scene.spawn()
        await _check(scene, handle, plan, bump=50)


@pytest.mark.parametrize("point", ["signal", "signalled"])
async def test_sigkill_during_a_signal_delivery(redis_server: RedisProcess, point: str) -> None:
    """Killed in the turn the signal woke: before it took the signal (``signal``: the
    payload is still in the inbox) or after its append took it (``signalled``: the log
    holds it, the function has not gone on yet). The payload is delivered once."""
    async with _scene(redis_server) as scene:
        victim = scene.spawn(holds=[point])
        plan = Plan(n=6, wait=True)
        handle = await pipeline.start(plan, run_id=f"deliver-{point}")
        await _until(handle, "waiting", lambda r: r.wait_signal == go.name)
        await scene.arm(point)
        assert await handle.send(go, Go(bump=9)) is SignalOutcome.DELIVERED
        await scene.held(point, victim)
        record = await handle.record()
        taken = _has(SignalReceived)(record)
        assert taken == (point == "signalled")
        assert bool(record.inbox.get(go.name)) == (point == "signal")
        scene.kill(victim)
        scene.spawn()
        record = await _check(scene, handle, plan, bump=9)


async def test_a_run_whose_turn_keeps_killing_its_worker_ends(redis_server: RedisProcess) -> None:
    """A turn that kills its worker every time (a poison turn: the replay runs out of
    memory, say) fails its job once it has stalled past ``max_stalls``, as any job does.
    The run must not be lost with it: it should end (failed, with the stalled record),
    as a run whose step job stalled past ``max_stalls`` does (the step's failure is
    raised in the function): the broker fails a run whose turn job failed for good."""
    async with _scene(redis_server) as scene:
        await scene.arm("after:0")
        plan = Plan(n=1)
        handle = await pipeline.start(plan, run_id="poison")
        for _ in range(2):  # max_stalls=1: the second stall fails the turn's job
            victim = scene.spawn(holds=["after:0"], max_stalls=1)
            await scene.held("after:0", victim)
            scene.kill(victim)
        scene.spawn(max_stalls=1)
        # The turn that read step 0's outcome is the run's second (t1 started it).
        turn = f"{handle.run_id}:t2"

        async def turn_failed() -> bool:
            [job] = await durable_app.app.broker.get([turn])
            return job is not None and job.state is JobState.FAILED

        await _until_true("the turn's job failed", turn_failed)
        with anyio.fail_after(5), pytest.raises(JobFailed) as failed:
            await handle.result()
        assert failed.value.reason.value == "stalled"


# -- the batch --------------------------------------------------------------------------

#: Runs of the batch test (5 steps each), and how often its victim is killed.
BATCH = 1000
KILLS = 3


@pytest.mark.parametrize("where", WHERE)
async def test_a_batch_of_runs_survives_repeated_sigkills(
    redis_server: RedisProcess, request: pytest.FixtureRequest, where: str
) -> None:
    """BATCH runs of five steps on two worker processes, one SIGKILLed and restarted
    KILLS times while they run: every run completes with its result, each step is
    recorded once in its run's log, and a step ran more than once only if a killed
    worker had started it."""
    async with _scene(redis_server, _cluster(request, where)) as scene:
        scene.spawn(concurrency=16)
        victim = scene.spawn(concurrency=16)
        started = time.monotonic()
        plans = {f"b{i}": Plan(n=i) for i in range(BATCH)}
        for run_id, plan in plans.items():
            await pipeline.start(plan, run_id=run_id)
        total = BATCH * STEPS
        for kill in range(KILLS):
            # Kill at a quarter, a half, three quarters of the steps.
            mark = total * (kill + 1) // (KILLS + 1)

            async def past(mark: int = mark) -> bool:
                return int(await scene.ledger.hlen("runs")) >= mark

            await _until_true(f"{mark} steps run", past)
            # (and the victim has started steps: a restarted one is not killed at birth)
            await _until_true("the victim at work", partial(scene.started_any, victim))
            scene.kill(victim)
            victim = scene.spawn(concurrency=16)
        broker = durable_app.app.broker
        ids = list(plans)
        with anyio.fail_after(120):
            while True:
                records = await broker.get_runs(ids)
                if all(r is not None and r.state.is_final for r in records):
                    break
                await anyio.sleep(0.1)
        elapsed = time.monotonic() - started
        runs = await scene.runs()
        rerun_allowed = await scene.started_by(scene.killed)
    step_ids: list[str] = []
    for run_id, record in zip(ids, records, strict=True):
        assert record is not None
        assert record.result is not None, (run_id, record.state, record.failure)
        assert pipeline.output.decode(record.result) == expected(plans[run_id])
        step_ids += [f"{run_id}:{p}" for p in _check_log(record, plans[run_id])]
    assert set(runs) == set(step_ids)  # every step ran; no other job ran as a step
    twice = {job_id for job_id, n in runs.items() if n > 1}
    # Only what a killed worker had started ran again.
    assert twice <= rerun_allowed, sorted(twice - rerun_allowed)
    assert set(Counter(runs.values())) <= {1, 2}
    print(f"{BATCH} runs x {STEPS} steps, {KILLS} kills: {elapsed:.1f}s, {len(twice)} reruns")
