"""new_job_id: ULID-shaped ids, counted up within a millisecond from a random start.

Ids must stay unique across threads, across processes (forks included) and across a clock
that steps back, fit the id grammar, and sort in creation order within a process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from typedq import names
from typedq.broker.base import check_claim_id, new_claim_id
from typedq.errors import InvalidName
from typedq.names import check_job_id, check_job_ids, new_job_id, new_job_ids

CROCKFORD = set("0123456789ABCDEFGHJKMNPQRSTVWXYZ")


@pytest.fixture
def frozen_ms(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the id clock read the nanoseconds in the returned one-item list."""
    now = [1_800_000_000_000 * 1_000_000]
    monkeypatch.setattr(names, "_time_ns", lambda: now[0])
    monkeypatch.setattr(names, "_id_block", names._IdBlock(-1))
    return now


def test_ids_fit_the_grammar_and_are_ulid_shaped() -> None:
    ids = [new_job_id() for _ in range(5000)]
    for job_id in ids:
        assert check_job_id(job_id) == job_id
        assert len(job_id) == 26
        assert set(job_id) <= CROCKFORD
    assert len(set(ids)) == len(ids)


def test_ids_sort_in_creation_order_and_carry_the_time(frozen_ms: list[int]) -> None:
    ids = []
    for step in range(3):
        ids += [new_job_id() for _ in range(3000)]  # several runs of 1024 within a ms
        frozen_ms[0] += 1_000_000 * (step + 1)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    ms = 1_800_000_000_000
    decoded = 0
    for char in ids[0][:10]:
        decoded = decoded * 32 + "0123456789ABCDEFGHJKMNPQRSTVWXYZ".index(char)
    assert decoded == ms  # the first 10 characters are the milliseconds, like a ULID


def test_a_clock_that_steps_back_still_gives_new_ids(frozen_ms: list[int]) -> None:
    first = [new_job_id() for _ in range(100)]
    frozen_ms[0] -= 5_000_000
    back = [new_job_id() for _ in range(100)]
    frozen_ms[0] += 5_000_000  # the first millisecond again: a fresh random start
    again = [new_job_id() for _ in range(100)]
    assert len(set(first + back + again)) == 300
    assert again[0][:10] == first[0][:10]


def test_threads_sharing_a_millisecond_never_share_an_id(frozen_ms: list[int]) -> None:
    made: list[list[str]] = [[] for _ in range(4)]

    def make(out: list[str]) -> None:
        for _ in range(20_000):
            out.append(new_job_id())

    threads = [threading.Thread(target=make, args=(out,)) for out in made]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = [job_id for out in made for job_id in out]
    assert len(everything) == 80_000
    assert len(set(everything)) == 80_000


def test_a_batch_of_ids_is_what_one_at_a_time_would_make(frozen_ms: list[int]) -> None:
    """new_job_ids(n) counts on from the block as n new_job_id calls would, across a run
    of 1024 (the shared-prefix shortcut stops there) and mixed with single ids."""
    block = names._id_block = names._IdBlock(frozen_ms[0] // 1_000_000)
    block.start = (block.start & ~1023) + 1000  # 24 ids before the run ends
    made = [new_job_id(), *new_job_ids(50), new_job_id(), *new_job_ids(0), *new_job_ids(3)]
    expected = [names._job_id_of(block, block.start + i) for i in range(55)]
    assert made == expected
    assert made == sorted(made)
    assert len(set(made)) == 55
    assert made[1][:24] != made[50][:24]  # the batch crossed a run
    for job_id in made:
        assert check_job_id(job_id) == job_id
        assert len(job_id) == 26
        assert set(job_id) <= CROCKFORD


def test_threads_making_batches_of_ids_never_share_one(frozen_ms: list[int]) -> None:
    made: list[list[str]] = [[] for _ in range(4)]

    def make(out: list[str]) -> None:
        for i in range(2_000):
            out.extend(new_job_ids(1 + i % 100) if i % 3 else [new_job_id()])

    threads = [threading.Thread(target=make, args=(out,)) for out in made]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = [job_id for out in made for job_id in out]
    assert len(set(everything)) == len(everything)
    for out in made:
        # In creation order within each thread, block by block: two threads starting the
        # millisecond's block at once each make one (another random head), and a thread's
        # next ids may come from the other's; ids of one block count up.
        by_block: dict[str, list[str]] = {}
        for job_id in out:
            by_block.setdefault(job_id[:18], []).append(job_id)
        assert len(by_block) <= len(made) + 1  # the frozen millisecond's blocks
        for ids in by_block.values():
            assert ids == sorted(ids)


@pytest.mark.parametrize("bad", ["", "-x", "a b", "a|b", "x" * 201, "ok\nok", 7, None, "é"])
def test_check_job_ids_raises_what_check_job_id_raises(bad: object) -> None:
    ids: list[object] = ["a", "b:c", bad, "d"]
    with pytest.raises(InvalidName) as one:
        check_job_id(bad)
    with pytest.raises(InvalidName) as many:
        check_job_ids(ids)  # type: ignore[arg-type]
    assert str(many.value) == str(one.value)


def test_check_job_ids_accepts_good_ids() -> None:
    ids = ["a", "b:c", "x" * 200, *new_job_ids(100)]
    check_job_ids(ids)
    check_job_ids([])


def test_two_blocks_of_one_millisecond_start_apart() -> None:
    one, two = names._IdBlock(42), names._IdBlock(42)
    assert one.head[:10] == two.head[:10]  # the same millisecond
    assert (one.head, one.start) != (two.head, two.start)  # 80 fresh random bits each


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    # In a fresh interpreter (no threads, so fork is safe) with a clock that never moves:
    # without the fork hook, parent and child would count on from the same block.
    script = textwrap.dedent(
        """
        import os
        from typedq import names
        names._time_ns = lambda: 1_800_000_000_000 * 1_000_000
        names.new_job_id()  # the parent starts its block before the fork
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, "\\n".join(names.new_job_id() for _ in range(50)).encode())
            os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        child = set(os.read(read, 1 << 16).decode().split())
        parent = {names.new_job_id() for _ in range(50)}
        print(len(child), len(parent), len(child & parent))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["50", "50", "0"]


@pytest.mark.parametrize("good", ["0" * 8, "0123456789abcdef", "f" * 64])
def test_check_claim_id_accepts_8_to_64_lowercase_hex_digits(good: str) -> None:
    assert check_claim_id(good) == good


def test_new_claim_ids_pass_check_claim_id() -> None:
    for _ in range(100):
        claim_id = new_claim_id()
        assert check_claim_id(claim_id) == claim_id


@pytest.mark.parametrize(
    "bad", ["", "0" * 7, "f" * 65, "0123456789ABCDEF", "0123456789abcdeg", "01234567 ", "é" * 8]
)
def test_check_claim_id_refuses_anything_else(bad: str) -> None:
    with pytest.raises(ValueError, match="lowercase hex"):
        check_claim_id(bad)
