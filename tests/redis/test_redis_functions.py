"""The Redis broker's Lua as one Functions library: per-call state never outlives a call,
two apps share the library, errors name their file and line, two versions side by side,
the ACL a typedq user needs.

Every test talks to a real redis-server spawned by the suite (never :6379).
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis

from tests.redis_harness import RedisProcess
from tests.redis_support import broker_at, message, raw_redis
from typedq import BrokerError, ConfigError
from typedq.broker.base import BrokerSettings, Completion, FinishOutcome, JobState
from typedq.broker.redis import RedisBroker
from typedq.broker.redis.keys import Keys
from typedq.broker.redis.scripts import (
    PARTS,
    build_library,
    library,
    read_scripts,
)

LIBRARY = library()
SHARDED_LIBRARY = library(sharded=True)

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]


def _probe(state: tuple[str, ...]) -> str:
    """A script that marks every per-call state name (ARGV[2] 'fill' or 'fail': then
    fails) or answers, as JSON, which names still hold a mark ('look'), with the key
    names the helpers derive from this call's prefix."""
    fill = [f"if type({n}) == 'table' then {n}['leak'] = 1 else {n} = 'leak' end" for n in state]
    look = [
        f"if {n} == 'leak' or (type({n}) == 'table' and {n}['leak']) then "
        f"left[#left + 1] = '{n}' end"
        for n in state
    ]
    return "\n".join(
        [
            "#!lua",
            "local mode = ARGV[2]",
            "if mode ~= 'look' then",
            # The helpers fill their own state first (caches, accumulators, clock).
            "  k_q('q1'); k_job('q1', 'a'); now_us(); count('q1', 'w', 1); roll('q1', 'c')",
            "  note_done('q1', 'a'); work_queues['q1'] = true",
            *fill,
            "  if mode == 'fail' then error('probe failed on purpose') end",
            "  return 'filled'",
            "end",
            "local left = {}",
            *look,
            "return cjson.encode({left = left, q = k_q('q1'), job = k_job('q1', 'a'),"
            " done = CH_DONE, deltas = next(deltas) == nil, now = last_now == nil})",
        ]
    )


@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
async def test_no_state_outlives_a_call(redis_url: str, sharded: bool) -> None:
    """Every top-level name of the shared parts (common/*.lua) that a call may change is set
    again when the next call starts: after a call that filled it and failed, after one
    that filled it and returned, and across two apps' prefixes."""
    base = SHARDED_LIBRARY if sharded else LIBRARY
    assert {"P", "qprefix", "jprefix", "deltas", "rollups", "work_queues", "last_now"} <= set(
        base.state
    )
    parts = read_scripts()
    lib = build_library(
        {**{name: parts[name] for name in PARTS}, "probe.lua": _probe(base.state)},
        sharded=sharded,
    )
    assert lib.state == base.state
    a, b = Keys("appa"), Keys("appb")
    async with raw_redis(redis_url) as raw:
        execute: Any = raw.execute_command  # untyped in redis-py
        await execute("FUNCTION", "LOAD", "REPLACE", lib.source)
        probe = lib.functions["probe"]
        try:
            with pytest.raises(aioredis.ResponseError, match="probe failed on purpose"):
                await execute("FCALL", probe, 0, a.prefix, "fail")
            for prefix, keys in ((b.prefix, b), (a.prefix, a)):
                seen = json.loads(await execute("FCALL", probe, 0, prefix, "look"))
                assert seen == {
                    "left": {},  # cjson: an empty table is an object
                    "q": keys.levels("q1").removesuffix("p"),
                    "job": keys.job("q1", "a"),
                    "done": keys.done_channel,
                    "deltas": True,
                    "now": True,
                }
                assert await execute("FCALL", probe, 0, prefix, "fill") == b"filled"
        finally:
            await execute("FUNCTION", "DELETE", lib.name)


async def test_two_apps_take_turns_on_one_library(redis_url: str) -> None:
    """Two apps (two prefixes) with a queue of the same name, their calls interleaved on
    the one library: each sees only its own jobs, counts and wake-ups."""
    async with (
        broker_at(redis_url, "appa") as one,
        broker_at(redis_url, "appb") as two,
        raw_redis(redis_url) as raw,
    ):
        pubsub: Any = raw.pubsub()  # untyped in redis-py
        await pubsub.subscribe(one.keys.done_channel, two.keys.done_channel)
        try:
            for i in range(3):
                await one.enqueue([message(f"a{i}")])
                await two.enqueue([message(f"b{i}"), message(f"b{i}x")])
            ja = await one.claim(["q"], 10, worker_id="w", lease=30)
            jb = await two.claim(["q"], 10, worker_id="w", lease=30)
            assert sorted(j.message.id for j in ja) == ["a0", "a1", "a2"]
            assert sorted(j.message.id for j in jb) == ["b0", "b0x", "b1", "b1x", "b2", "b2x"]
            for x, y in zip(ja, jb, strict=False):
                assert await one.complete([Completion(x.message.id, x.token, b"\xc0")]) == [
                    FinishOutcome.OK
                ]
                assert await two.complete([Completion(y.message.id, y.token, b"\xc0")]) == [
                    FinishOutcome.OK
                ]
            done: dict[str, list[str]] = {}
            with anyio.fail_after(5):
                while sum(len(v) for v in done.values()) < 6:
                    got = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                    if got is not None:
                        channel = got["channel"].decode()
                        done.setdefault(channel, []).extend(got["data"].decode().split())
        finally:
            await pubsub.aclose()
        assert sorted(done[one.keys.done_channel]) == ["a0", "a1", "a2"]
        assert sorted(done[two.keys.done_channel]) == ["b0", "b0x", "b1"]
        ca, cb = await one.counts("q"), await two.counts("q")
        assert (ca[JobState.COMPLETED], ca[JobState.ACTIVE]) == (3, 0)
        assert (cb[JobState.COMPLETED], cb[JobState.ACTIVE]) == (3, 3)
        # Every key is under its own app's names.
        names = [k.decode() async for k in raw.scan_iter("*")]
        assert names
        assert all(("appa" in n) != ("appb" in n) for n in names)


async def test_an_error_in_the_library_names_the_script_and_the_file_line(redis_url: str) -> None:
    async with broker_at(redis_url, "errline") as broker, raw_redis(redis_url) as raw:
        # A queue's counts hash that is a string: enqueue's HINCRBY on it fails.
        await raw.set(broker.keys.counts("q"), "not a hash")
        with pytest.raises(BrokerError) as failed:
            await broker.enqueue([message("a")])
    text = str(failed.value)
    assert "enqueue" in text
    assert "WRONGTYPE" in text
    # "(typedq/broker/redis/lua/<file>:<line>)": that line of that file makes the call.
    where = text.rpartition("(typedq/broker/redis/lua/")[2].rstrip(")")
    file, _, line = where.partition(":")
    source = read_scripts()[file].split("\n")[int(line) - 1]
    assert "rcall('HINCRBY'" in source  # (a shared part's redis.call)


def test_a_shared_helper_reading_argv_is_refused_when_the_library_is_built() -> None:
    """A helper of a shared part runs in whichever call uses it, where ARGV and KEYS are only
    the function's parameters: reading them there would fail at run time ("nonexistent
    global variable 'ARGV'"), so the build refuses it, naming the file and line."""
    files = read_scripts()
    common = files["common/values.lua"].split("\n")
    at = next(i for i, line in enumerate(common) if line.startswith("local function now_us"))
    common.insert(at, "local function arg_count() return #ARGV end")
    files["common/values.lua"] = "\n".join(common)
    with pytest.raises(RuntimeError, match=rf"values.lua:{at + 1}: a shared helper reads ARGV"):
        build_library(files)
    # The state lines at the top may read them (they run at the start of every call).
    keys = read_scripts()["common/keys.lua"].split("\n")
    assert any(line.startswith("local P = ARGV[1]") for line in keys)
    build_library()


def test_constants_are_set_once_and_may_not_be_assigned() -> None:
    """A top-level value of literals only is a constant: set when the library loads, not
    reset by every call (cheaper calls), so the build refuses an assignment to it in any
    file. A table is per-call state, made again only after a call that used it."""
    assert "REQ_TTL_MS" not in LIBRARY.state
    assert "deltas" in LIBRARY.state
    begin = LIBRARY.source[LIBRARY.source.index("local function typedq_begin0") :]
    begin = begin[: begin.index("\nend\n")]
    assert "REQ_TTL_MS" not in begin
    assert "if next(deltas) ~= nil then deltas = {} end" in begin
    files = read_scripts()
    files["claim.lua"] = files["claim.lua"].replace(
        "local now = now_us()", "local now = now_us()\nREQ_TTL_MS = '1'", 1
    )
    at = files["claim.lua"].split("\n").index("REQ_TTL_MS = '1'") + 1
    with pytest.raises(RuntimeError, match=rf"claim.lua:{at}: 'REQ_TTL_MS' is a constant"):
        build_library(files)


def test_a_kept_cache_is_made_at_load_and_may_not_be_assigned() -> None:
    """A ``local name = {}  --@keep`` (common/keys.lua's ``app``: the app prefix's strings) is
    made once, at load, and not reset by the calls; the build refuses an assignment to
    it, like to a constant (only its helpers fill it)."""
    assert "app" not in LIBRARY.state
    assert "local app = {}  --@keep" in LIBRARY.source.split("\n")
    begin = LIBRARY.source[LIBRARY.source.index("local function typedq_begin0") :]
    begin = begin[: begin.index("\nend\n")]
    assert "app = " not in begin
    assert "= app_names(P)" in begin  # the per-call names are taken from it every call
    files = read_scripts()
    files["claim.lua"] = files["claim.lua"].replace(
        "local now = now_us()", "local now = now_us()\napp = {}", 1
    )
    at = files["claim.lua"].split("\n").index("app = {}") + 1
    with pytest.raises(RuntimeError, match=rf"claim.lua:{at}: 'app' is a constant"):
        build_library(files)


async def test_the_kept_key_prefixes_follow_the_app_and_stay_bounded(redis_url: str) -> None:
    """The per-queue key prefixes kept across calls: a call of another app (prefix) gets
    its own, and once a call made more than KEEP_QUEUES of them the next call starts
    over (bounded memory), every key still right."""
    parts = read_scripts()
    probe = "\n".join(
        [
            "#!lua",
            "local n = tonumber(ARGV[2])",
            "local fresh = next(qprefix) == nil",
            "for i = 1, n do k_q('q' .. i) end",
            "return cjson.encode({fresh = fresh, q = k_q('q1'), job = k_job('q1', 'a')})",
        ]
    )
    lib = build_library({**{name: parts[name] for name in PARTS}, "p.lua": probe})
    a, b = Keys("appa"), Keys("appb")
    async with raw_redis(redis_url) as raw:
        execute: Any = raw.execute_command  # untyped in redis-py
        await execute("FUNCTION", "LOAD", "REPLACE", lib.source)
        fn = lib.functions["p"]
        try:
            seen = []
            for prefix, n in ((a.prefix, 5), (a.prefix, 1), (b.prefix, 1), (a.prefix, 1500)):
                seen.append(json.loads(await execute("FCALL", fn, 0, prefix, n)))
            seen.append(json.loads(await execute("FCALL", fn, 0, a.prefix, 1)))
            # Kept for the same app; made again for another app and past the bound.
            assert [s["fresh"] for s in seen] == [True, False, True, True, True]
            for s, keys in zip(seen, (a, a, b, a, a), strict=True):
                assert s["q"] == keys.levels("q1").removesuffix("p")
                assert s["job"] == keys.job("q1", "a")
        finally:
            await execute("FUNCTION", "DELETE", lib.name)


async def test_two_versions_of_the_library_run_side_by_side(redis_url: str) -> None:
    """A rolling deploy: an older library (another hash, other function names) stays
    loaded and callable while this version's broker runs; neither replaces the other."""
    files = read_scripts()
    files[PARTS[-1]] += "\nlocal OLDER_VERSION = 1\n"
    older = build_library(files)
    assert older.name != LIBRARY.name
    assert set(older.functions.values()).isdisjoint(LIBRARY.functions.values())
    async with raw_redis(redis_url) as raw:
        execute: Any = raw.execute_command  # untyped in redis-py
        await execute("FUNCTION", "LOAD", older.source)
        async with broker_at(redis_url, "twover") as broker:
            await broker.enqueue([message("a"), message("b")])
            # The older version's code on the same data, then this version's.
            (job,) = await execute(
                "FCALL",
                older.functions["get"],
                1,
                broker.keys.counts("q"),
                broker.keys.prefix,
                "q",
                "a",
            )
            assert job
            assert len(await broker.claim(["q"], 2, worker_id="w", lease=30)) == 2
        # RESP2: each library is a flat list of field, value.
        loaded = {
            dict(zip(lib[::2], lib[1::2], strict=True))[b"library_name"]
            for lib in await raw.function_list()
        }
        assert {older.name.encode(), LIBRARY.name.encode()} <= loaded


async def test_function_load_and_fcall_are_all_the_scripting_a_user_needs(
    redis_url: str, redis_server: RedisProcess
) -> None:
    """An ACL user with FCALL and FUNCTION LOAD but no other scripting command (no
    FUNCTION FLUSH/DELETE, no EVAL) runs the broker, and loads the library itself after
    an admin flushed it."""
    async with raw_redis(redis_url) as raw:
        execute: Any = raw.execute_command  # untyped in redis-py
        await execute("FUNCTION", "FLUSH")
        await execute(
            "ACL", "SETUSER", "fn1", "reset", "on", ">pw1", "~typedq:{fn1}:*", "~tq:{fn1:*",
            "&typedq:{fn1}:*", "-@all", "+@read", "+@write", "+@connection", "+@pubsub",
            "-@dangerous", "+time", "+info", "+fcall", "+function|load", "-function|flush",
            "-function|delete", "-function|restore",
        )  # fmt: skip
        try:
            user_url = f"redis://fn1:pw1@127.0.0.1:{redis_server.port}/0"
            async with broker_at(user_url, "fn1") as broker:
                await broker.enqueue([message("a")])
                await execute("FUNCTION", "FLUSH")
                (job,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
                assert await broker.complete([Completion("a", job.token, b"ok")]) == [
                    FinishOutcome.OK
                ]
                conn: Any = broker._conn().execute_command  # untyped in redis-py
                for command in (("FUNCTION", "FLUSH"), ("EVAL", "return 1", "0")):
                    with pytest.raises(aioredis.ResponseError, match="permission"):
                        await conn(*command)
        finally:
            await execute("ACL", "DELUSER", "fn1")


async def test_a_redis_without_functions_is_refused_at_connect_in_one_line() -> None:
    """Redis before 7.0 has no FUNCTION command (here: renamed away on a 7.x server)."""
    server = RedisProcess(extra=("--rename-command", "FUNCTION", ""))
    server.start()
    try:
        broker = RedisBroker(server.url, BrokerSettings(namespace="old"))
        with pytest.raises(ConfigError) as refused:
            await broker.connect()
        await broker.close()
    finally:
        server.stop()
    text = str(refused.value)
    assert "\n" not in text
    assert "Redis 7.0 or later" in text
    assert f"127.0.0.1:{server.port}" in text
