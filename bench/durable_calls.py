"""What a durable run's step costs on Redis: round trips, commands, server CPU (issue 26).

Runs ``bench.adapters.durable_typedq`` (the durable benchmark's workload: ``--runs`` runs of
``--steps`` no-op steps, ``--concurrency`` at a time, worker in the same process) against a
fresh redis-server of its own, and reports per step:

- ``round_trips``: writes to a Redis connection (one command, or one pipeline), counted
  in the client (the mixin's ``_write``);
- ``commands``: ``INFO commandstats`` calls (each script call is one ``evalsha``; the
  Redis commands a script runs are counted as their own commands too: ``cmds_in_scripts``
  is those), by command;
- ``redis_cpu_us``: the server's ``used_cpu_user + used_cpu_sys`` over the batch;
- ``process_cpu_us``: this process's (worker and producer) user + system CPU over it;
- ``functions``: script calls by function, counted in the client.

The throughput of a loaded 2-core box swings widely; the CPU per step does much less.
``python bench/durable_calls.py`` with ``PYTHONPATH=<other checkout>`` measures that
checkout's code with this script.

Run: ``PYTHONPATH=. .venv/bin/python -m bench.durable_calls [--runs 200 --steps 5]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import resource
from typing import Any

import anyio

from bench.adapters import durable_typedq
from bench.redis_server import redis_server
from typedq.broker.redis import connection

FCALL = re.compile(rb"\$5\r\nFCALL\r\n\$\d+\r\n([^\r]+)", re.IGNORECASE)
SCRIPT_COMMANDS = ("evalsha", "eval", "fcall", "evalsha_ro", "eval_ro")


def _stats(info: dict[str, str]) -> dict[str, tuple[int, float]]:
    out = {}
    for key, value in info.items():
        if key.startswith("cmdstat_"):
            fields = dict(part.split("=", 1) for part in value.split(","))
            out[key.removeprefix("cmdstat_")] = (int(fields["calls"]), float(fields["usec"]))
    return out


def _cpu(info: dict[str, str]) -> float:
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    opts = parser.parse_args()
    writes = collections.Counter[str]()
    functions = collections.Counter[str]()
    original = connection._LostSendIsConnectionError._write

    def counted(self: Any, command: Any) -> Any:
        writes["round_trips"] += 1
        for part in command:
            for name in FCALL.findall(bytes(part)):
                functions[name.decode()] += 1
        return original(self, command)

    connection._LostSendIsConnectionError._write = counted  # type: ignore[method-assign]
    with redis_server() as redis:
        redis.command("CONFIG", "RESETSTAT")
        cpu0 = _cpu(redis.info("cpu"))
        own0 = resource.getrusage(resource.RUSAGE_SELF)
        params = {
            "broker": redis.url,
            "runs": opts.runs,
            "steps": opts.steps,
            "concurrency": opts.concurrency,
        }
        result = anyio.run(durable_typedq.main, params)
        cpu1 = _cpu(redis.info("cpu"))
        own1 = resource.getrusage(resource.RUSAGE_SELF)
        stats = _stats(redis.info("commandstats"))
    steps = opts.runs * opts.steps
    scripts = sum(calls for name, (calls, _) in stats.items() if name in SCRIPT_COMMANDS)
    inner = sum(calls for name, (calls, _) in stats.items() if name not in SCRIPT_COMMANDS)
    report = {
        "steps_per_s": round(float(str(result["steps_per_s"])), 1),
        "run_p50_ms": round(float(str(result["run_p50_ms"])), 1),
        "round_trips_per_step": round(writes["round_trips"] / steps, 2),
        "calls_per_step": round(sum(c for c, _ in stats.values()) / steps, 2),
        "script_calls_per_step": round(scripts / steps, 2),
        "redis_cpu_us_per_step": round(1e6 * (cpu1 - cpu0) / steps, 1),
        "process_cpu_us_per_step": round(
            1e6 * (own1.ru_utime + own1.ru_stime - own0.ru_utime - own0.ru_stime) / steps, 1
        ),
        "by_command_per_step": {
            name: round(calls / steps, 2)
            for name, (calls, _) in sorted(stats.items(), key=lambda kv: -kv[1][0])
        },
        "functions_per_step": {
            name: round(calls / steps, 3) for name, calls in functions.most_common()
        },
        "cmds_in_scripts_or_plain_per_step": round(inner / steps, 2),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
