"""Where a Redis worker (drain) or producer (bulk enqueue) spends its CPU: py-spy's top frames.

Run: ``.venv/bin/python -m bench.profile_worker [--tree DIR] [--jobs 100000] [--seconds 6]``.

Needs py-spy (``.venv/bin/pip install py-spy``; not a typedq dependency) and redis-server.
``--tree`` is the checkout whose code is profiled (default: this one), so an old commit can
be profiled with this script: ``git worktree add /tmp/old <commit>`` and ``--tree /tmp/old``.
Only names that every commit since the first Redis benchmark has are used: the app, task
and payload of ``bench/redis_bench.py``, ``TYPEDQ_BROKER`` and ``python -m typedq worker``.

- *worker*: ``--jobs`` jobs are pre-filled (bulk path), a worker process at concurrency 16
  starts, and after ``--warmup`` seconds py-spy samples it for ``--seconds`` (the drain is
  then in its steady state; start-up and imports are not in the profile).
- *producer*: one process enqueues ``--jobs`` jobs with ``enqueue_many`` in batches of 100;
  py-spy samples it from its connect to its exit (imports are not in the profile).

Prints, for each, the top frames by self time (the function on top of the stack) and by
inclusive time (anywhere on the stack; frames on 95% of the stacks left out), in percent
of the samples. py-spy leaves out idle samples (``--idle`` off), so the shares are of the
time the process was on the CPU; the socket write's share is the kernel's send path.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.redis_bench import redis_server
from bench.redis_server import command

ROOT = Path(__file__).resolve().parent.parent

PREFILL = """
import anyio, sys
from bench.redis_bench import app, noop, payload
async def main(n):
    async with app:
        for start in range(0, n, 1000):
            await noop.enqueue_many(payload(i) for i in range(start, min(n, start + 1000)))
anyio.run(main, int(sys.argv[1]))
"""

PRODUCE = """
import anyio, sys
from bench.redis_bench import app, noop, payload
async def main(n):
    async with app:
        print("ready", flush=True)
        await anyio.sleep(1.0)  # py-spy attaches
        for start in range(0, n, 100):
            await noop.enqueue_many(payload(i) for i in range(start, min(n, start + 100)))
anyio.run(main, int(sys.argv[1]))
"""


def _py_spy() -> str:
    """py-spy beside this interpreter (a venv's bin/), else on the PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else (shutil.which("py-spy") or "")


def _env(tree: Path, url: str) -> dict[str, str]:
    return {**os.environ, "TYPEDQ_BROKER": url, "PYTHONPATH": str(tree)}


def _flush(url: str) -> None:
    command(int(url.rsplit(":", 1)[1].split("/")[0]), "FLUSHALL")


def profile_worker(tree: Path, url: str, jobs: int, warmup: float, seconds: float) -> Path:
    """Samples a draining worker; returns py-spy's raw (collapsed stacks) output file."""
    _flush(url)
    env = _env(tree, url)
    subprocess.run([sys.executable, "-c", PREFILL, str(jobs)], cwd=tree, env=env, check=True)
    out = Path(tempfile.mkstemp(prefix="worker-", suffix=".txt")[1])
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "typedq",
            "--log-level",
            "WARNING",
            "worker",
            "bench.redis_bench:app",
            "--concurrency",
            "16",
        ],
        cwd=tree,
        env=env,
    )
    try:
        time.sleep(warmup)
        subprocess.run(
            [
                _py_spy(),
                "record",
                "--pid",
                str(worker.pid),
                "--format",
                "raw",
                "--rate",
                "250",
                "--duration",
                str(int(seconds)),
                "--output",
                str(out),
            ],
            check=True,
            capture_output=True,
        )
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    return out


def profile_producer(tree: Path, url: str, jobs: int) -> Path:
    """Samples a process while it bulk-enqueues ``jobs`` jobs (after its imports and
    connect); returns py-spy's raw output."""
    _flush(url)
    out = Path(tempfile.mkstemp(prefix="producer-", suffix=".txt")[1])
    producer = subprocess.Popen(
        [sys.executable, "-c", PRODUCE, str(jobs)],
        cwd=tree,
        env=_env(tree, url),
        stdout=subprocess.PIPE,
    )
    try:
        assert producer.stdout is not None
        if producer.stdout.readline().strip() != b"ready":
            sys.exit("the producer did not start")
        # py-spy's recording ends when the process exits.
        subprocess.run(
            [
                _py_spy(),
                "record",
                "--pid",
                str(producer.pid),
                "--format",
                "raw",
                "--rate",
                "250",
                "--output",
                str(out),
            ],
            check=True,
            capture_output=True,
        )
    finally:
        producer.wait(timeout=300)
    return out


def _frame(frame: str) -> str:
    """``name (path/to/file.py:123)`` -> ``name (file.py)``: one row per function."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({Path(path).name})" if path else name


def top_frames(raw: Path, count: int) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """(samples, top self frames, top inclusive frames) of a py-spy raw profile."""
    own: collections.Counter[str] = collections.Counter()
    anywhere: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, weight = line.rpartition(" ")
        if not stack or not weight.isdigit():
            continue
        n = int(weight)
        frames = [_frame(f) for f in stack.split(";") if f]
        if not frames:
            continue
        total += n
        own[frames[-1]] += n
        for name in set(frames):
            anywhere[name] += n
    # Frames on (almost) every stack (the module, the event loop's run) say nothing.
    telling = [(name, n) for name, n in anywhere.most_common() if n < 0.95 * total]
    return total, own.most_common(count), telling[:count]


def report(title: str, raw: Path, count: int) -> None:
    total, own, anywhere = top_frames(raw, count)
    print(f"\n## {title}: {total} samples ({raw})")
    print("self:")
    for name, n in own:
        print(f"  {100 * n / total:5.1f}%  {name}")
    print("inclusive:")
    for name, n in anywhere:
        print(f"  {100 * n / total:5.1f}%  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="checkout to profile")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--only", choices=("worker", "producer"), default=None)
    args = parser.parse_args()
    if not _py_spy():
        sys.exit("py-spy is not installed: .venv/bin/pip install py-spy")
    tree = args.tree.resolve()
    with redis_server() as url:
        if args.only in (None, "worker"):
            raw = profile_worker(tree, url, args.jobs, args.warmup, args.seconds)
            report(f"worker, drain C=16 ({tree})", raw, args.top)
        if args.only in (None, "producer"):
            raw = profile_producer(tree, url, args.jobs)
            report(f"producer, enqueue_many batches of 100 ({tree})", raw, args.top)


if __name__ == "__main__":
    main()
