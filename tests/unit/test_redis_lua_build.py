"""The Lua library's build (typedq/broker/redis/scripts.py): the constants generated from
the Python values, the shared parts in their fixed order, and no ``.lua`` file restating
a generated value. Pure Python: no redis-server (the Redis suite loads the library)."""

from __future__ import annotations

import re

import pytest

from typedq.broker.base import CLAIM_RECORD_TTL, ERROR_HISTORY, HISTORY_MINUTES, MAX_SPAN_LINKS
from typedq.broker.flow import FLOW_BROKEN_MESSAGE, HELD_AT
from typedq.broker.redis.constants import LUA_CONSTANTS, lua_literal, lua_preamble
from typedq.broker.redis.scripts import (
    PARTS,
    SHARDED_PART,
    Library,
    build_library,
    library,
    main_locals,
    read_scripts,
)

LIBRARY = library()
SHARDED_LIBRARY = library(sharded=True)

_STRING = re.compile(r"'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\"")
_NUMBER = re.compile(r"(?<![\w.])\d+(?![\w.])")

#: Generated strings that a script also uses with another meaning: 'cancelled' is the
#: reason of a cancelled job's record and, apart from it, the answer of cancel.lua (and
#: its request record), which the Python side reads as a CancelOutcome.
_OTHER_MEANING = {"cancelled"}
#: A generated name no script reads: the waiting index's bucket count, which idx_bucket
#: (common/keys.lua) computes with the arithmetic of 2^13 (tests/keys.lua checks the
#: buckets against keys.py), named so its comments can say which number they mean.
_NOT_READ = {"IDX_BUCKETS"}


def _code_and_strings(text: str) -> tuple[str, list[str]]:
    """A Lua file's code with its strings blanked and its comments left out, and the
    contents of its string literals (the scripts hold no long strings or comments)."""
    code: list[str] = []
    strings: list[str] = []
    for line in text.split("\n"):
        if line.lstrip().startswith("--") or line.startswith("#!"):
            continue
        # Strings blanked to the same length: a '--' inside one is not a comment.
        blank = _STRING.sub(lambda m: m.group(0)[0] + " " * (len(m.group(0)) - 2) + "'", line)
        cut = blank.find("--")
        kept = line if cut < 0 else line[:cut]
        strings += [s[1:-1] for s in _STRING.findall(kept)]
        code.append(_STRING.sub("''", kept))
    return "\n".join(code), strings


def test_the_constants_are_the_python_values() -> None:
    assert LUA_CONSTANTS["REQ_TTL_MS"] == str(round(CLAIM_RECORD_TTL * 1000)) == "60000"
    assert LUA_CONSTANTS["ERR_HISTORY"] == ERROR_HISTORY
    assert LUA_CONSTANTS["HISTORY_MINUTES"] == HISTORY_MINUTES
    assert LUA_CONSTANTS["MAX_SPAN_LINKS"] == MAX_SPAN_LINKS
    assert LUA_CONSTANTS["HELD_US"] == HELD_AT * 1_000_000
    assert LUA_CONSTANTS["FLOW_BROKEN"] == FLOW_BROKEN_MESSAGE
    assert LUA_CONSTANTS["FLOW_BROKEN_REASON"] == "flow_broken"
    assert LUA_CONSTANTS["STALLED_FORMAT"] == (
        "the job's lease expired %d times (worker lost %d times, possible poison pill); "
        "limit max_stalls=%d"
    )
    assert lua_literal("it's a \\ test") == "'it\\'s a \\\\ test'"
    with pytest.raises(TypeError):
        lua_literal(1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("lib", [LIBRARY, SHARDED_LIBRARY], ids=["single", "sharded"])
def test_every_generated_constant_is_in_the_built_library(lib: Library) -> None:
    """Each ``local NAME = value`` of the preamble is a line of the library, right after
    its name line and before the first part, and a constant (set once, at load)."""
    lines = lib.source.split("\n")
    preamble = lua_preamble()
    assert len(preamble) == len(LUA_CONSTANTS)
    assert lines[1 : 1 + len(preamble)] == preamble
    assert all(lib.where(n) is None for n in range(2, 2 + len(preamble)))
    first = lib.where(2 + len(preamble))
    assert first is not None
    assert first.startswith(PARTS[0] + ":")
    assert not set(LUA_CONSTANTS) & set(lib.state)
    begin = lib.source[lib.source.index("local function typedq_begin0") :]
    begin = begin[: begin.index("\nend\n")]
    assert not any(re.search(rf"\b{name}\b", begin) for name in LUA_CONSTANTS)


def test_no_lua_file_restates_a_generated_constant() -> None:
    """The values live in Python: a ``.lua`` file uses the names, never declares one of
    them again (a script's ``local`` would shadow it silently) nor writes its value as a
    literal (strings; integers of four digits or more, the smaller ones have other uses
    too)."""
    files = read_scripts()
    read: set[str] = set()
    for name, text in sorted(files.items()):
        code, strings = _code_and_strings(text)
        for constant, value in LUA_CONSTANTS.items():
            assert not re.search(rf"\blocal\s+(?:[\w\s,]*,\s*)?{constant}\b", code), (
                f"{name} declares {constant}, a generated constant (constants.py)"
            )
            if re.search(rf"\b{constant}\b", code):
                read.add(constant)
            if isinstance(value, str) and value not in _OTHER_MEANING:
                assert value not in strings, f"{name} restates {constant} ({value!r})"
            digits = str(value)
            if digits.isdigit() and len(digits) >= 4:
                assert digits not in _NUMBER.findall(code), f"{name} restates {constant}"
    assert read == set(LUA_CONSTANTS) - _NOT_READ


def test_the_parts_are_in_every_library_in_their_order() -> None:
    files = read_scripts()
    assert set(PARTS) == {name for name in files if name.startswith("common/")}
    for lib, sharded in ((LIBRARY, False), (SHARDED_LIBRARY, True)):
        seen: list[str] = []
        for n in range(1, len(lib.lines) + 1):
            where = lib.where(n)
            file = where.partition(":")[0] if where else ""
            if file.startswith("common/") and (not seen or seen[-1] != file):
                seen.append(file)
        assert seen == [p for p in PARTS if sharded or p != SHARDED_PART]
    del files[PARTS[3]]
    with pytest.raises(RuntimeError, match=r"shared parts .* missing"):
        build_library(files)


def _top_level(lib: Library) -> list[tuple[str, int, str]]:
    """The library's lines before its first script (the parts and the reset functions)."""
    lines = [(f, a, t) for (f, a), t in zip(lib.lines, lib.source.split("\n"), strict=True)]
    first = next(i for i, (_, _, t) in enumerate(lines) if "register_function" in t)
    return lines[:first]


def test_both_libraries_leave_room_under_luas_200_locals() -> None:
    # Lua 5.1 refuses a main chunk of more than 200 locals when Redis loads the library;
    # the Redis Cluster variant's wake-ups are assignments, not a second set of locals.
    single = main_locals(_top_level(LIBRARY))
    cluster = main_locals(_top_level(SHARDED_LIBRARY))
    assert cluster == single <= 200


def test_a_library_past_200_locals_is_refused_with_the_fix() -> None:
    files = read_scripts()
    files["common/errors.lua"] += "".join(f"local function extra_{k}() end\n" for k in range(6))
    with pytest.raises(RuntimeError, match=r"single Redis library's top level declares 201 locals"):
        build_library(files)
    with pytest.raises(RuntimeError, match=r"make new helpers fields of a part's table"):
        build_library(files, sharded=True)
