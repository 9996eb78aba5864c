"""The Lua of the Redis broker as one Redis Functions library, built from ``lua/``.

Every state transition is one function of the library. The sources stay one file per
script (``lua/*.lua``), each starting with a ``#!lua`` shebang whose flags
(``allow-oom``, ``no-writes``) become the function's flags. The shared helpers
(``lua/common/*.lua``, the parts) are in the library once, ahead of the scripts: their
functions are made once, at ``FUNCTION LOAD``, instead of on every call as when each
script carried a copy (7.7 µs of Redis CPU per call against 0.5 µs, measured with an
empty script on Redis 7.0).

The library's name and its functions' names carry a hash of its source
(``typedq_<hash>``, ``typedq_<hash>_claim``): function names are global in Redis, so two
versions of typedq (a rolling deploy) each call their own code side by side.

The build (:func:`build_library`; ``lua/README.md`` says the same for the Lua side):

1. **The library's text, in this order**: the ``#!lua name=typedq_<hash>`` line; the
   generated constants (:func:`.constants.lua_preamble`: one ``local NAME = value`` per
   entry of :data:`.constants.LUA_CONSTANTS`, the values the Python side keeps, so no
   ``.lua`` file restates them); the parts of :data:`PARTS`, whole, in that order (a part
   uses only what the parts before it define: Lua locals are seen from their declaration
   on), ``common/sharded.lua`` only in the Redis Cluster variant; the per-call reset
   functions (step 3); then each script (``lua/*.lua`` but the parts, by name), its
   shebang line replaced by the line that registers its function, its body the
   function's, closed by a line ``end}``. Nothing is included on demand: every part is
   in every library.
2. **Comments**: a line whose first non-blank characters are ``--`` becomes an empty
   line (the source stays in Redis's memory; the comments would be most of it). A
   trailing comment stays. (The scripts hold no long strings, where such a line would be
   text.)
3. **Per-call state**: a library's top level runs once, at load, where Redis gives it no
   globals (not even ``string`` or ``tonumber``), and its locals outlive each call. So a
   top-level ``local name = value`` of a part (a statement at column 0 starting with
   ``local`` that is not ``local function``, with its continuation lines: open brackets
   or a trailing operator or comma; the app prefix ``P`` from ``ARGV[1]``, caches,
   per-call accumulators) is only declared there, and its assignment moves into
   ``typedq_begin``, which every function calls first, in the parts' order (40
   statements per helper function: Lua 5.1 allows 60 upvalues per function). Three kinds
   stay at the top instead:

   - a **constant**, a value of literals only (numbers, strings, operators; the
     generated ones are of this kind): set once, at load;
   - a **table** ``local name = {}``: made at load, and made again at the start of a
     call only when the call before put something in it;
   - a **kept cache** ``local name = {}  --@keep``: made once, at load, and kept from
     call to call (its helpers decide what it holds and bound it), for values derived
     from a call's arguments alone that every call would otherwise build again
     (``common/keys.lua``'s ``app``: the app prefix's strings).

   A bare ``local name`` is per-call state too (reset to nil), unless the top level
   assigns it later (``name = function ...``: a forward declaration).
4. **Refusals** (a ``RuntimeError`` naming the file and line, at import): a top-level
   name of state declared twice (a helper may be defined again: ``common/sharded.lua``'s
   wake-ups replace ``common/bookkeeping.lua``'s for every later use); a constant or
   kept cache assigned anywhere (it would outlive the call that assigned it); a helper
   that reads ``ARGV`` or ``KEYS`` (the library has them only as each function's
   parameters: a script passes them); a script name other than ``[a-z0-9_]+``; a shebang
   option other than ``flags=`` or an unknown flag; a missing part.

Line numbers: the library keeps every file's lines in place (the shebang line becomes
the line that registers the function; the generated lines, the reset functions and the
closing lines are added between files), so a line of the library is one line of one
file; :meth:`Library.where` maps it back (``common/keys.lua:57``) and the broker adds it
to Redis's error messages.

Redis Cluster runs the sharded variant (``library(sharded=True)``): ``common/sharded.lua``
comes after ``common/bookkeeping.lua``, so the wake-ups go to each queue's own channels
with ``SPUBLISH``. The standalone library carries none of it.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

from .constants import lua_preamble

__all__ = [
    "PARTS",
    "SHARDED_PART",
    "Library",
    "build_library",
    "library",
    "read_scripts",
]

#: The folder of ``lua/`` that holds the shared parts.
_COMMON = "common"
#: The shared parts, in the order the library holds them: a part uses only what the parts
#: before it define (Lua locals are seen from their declaration on).
PARTS = (
    "common/keys.lua",
    "common/values.lua",
    "common/lanes.lua",
    "common/bookkeeping.lua",
    "common/sharded.lua",
    "common/finish.lua",
    "common/flows.lua",
    "common/flow_settle.lua",
    "common/flow_handoffs.lua",
    "common/runs.lua",
    "common/errors.lua",
    "common/schedules.lua",
    "common/gates.lua",
    "common/claiming.lua",
)
#: The part only the Redis Cluster variant holds (its wake-ups replace the ones before).
SHARDED_PART = "common/sharded.lua"
#: Stands for the library's name while its hash is computed.
_NAME_MARK = "typedq_@@"
#: Marks a top-level ``local name = {}`` of the shared part as a cache kept across calls.
_KEEP = "--@keep"
#: Names of the generated per-call reset functions (not used by the Lua files).
_BEGIN = "typedq_begin"
#: At most this many names per reset function (Lua 5.1 allows 60 upvalues per function).
_BEGIN_CHUNK = 40
#: The most locals one Lua 5.1 function holds (LUAI_MAXVARS): the library's top level is
#: one function, its main chunk, so the parts' top-level locals and the reset functions
#: share this bound.
_MAX_LOCALS = 200
#: Shebang flags Redis functions accept (``#!lua flags=...``).
_FLAGS = ("no-writes", "allow-oom", "allow-stale", "no-cluster", "allow-cross-slot-keys")

_LOCAL = re.compile(
    r"local\s+([A-Za-z_][A-Za-z0-9_]*(?:\s*,\s*[A-Za-z_][A-Za-z0-9_]*)*)\s*(=|--|$)"
)
_LOCAL_FUNCTION = re.compile(r"local\s+function\s+([A-Za-z_][A-Za-z0-9_]*)")
_ASSIGN_FUNCTION = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*function\b")
_STRING = re.compile(r"'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\"")
_USER_LINE = re.compile(r"user_function:(\d+)")
_NUMBER = re.compile(r"\b(?:0[xX][0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: ``name =`` (an assignment, not ``==``).
_ASSIGNED = re.compile(r"(?<![.\w])([A-Za-z_][A-Za-z0-9_]*)\s*=(?!=)")


@dataclass(frozen=True)
class Library:
    """One Redis Functions library: its source, and each script's function name."""

    #: ``typedq_<hash>`` (the hash of the source).
    name: str
    #: The source for ``FUNCTION LOAD``.
    source: str
    #: Script name (its file name without ``.lua``) -> function name.
    functions: Mapping[str, str]
    #: Per library line (index 0: line 1): (file name, line in that file); ("", 0) for a
    #: generated line.
    lines: tuple[tuple[str, int], ...]
    #: The shared part's top-level names set again at the start of every call.
    state: tuple[str, ...]

    def where(self, line: int) -> str | None:
        """``'claim.lua:57'`` for line ``line`` of the library; None for a generated line."""
        if not 1 <= line <= len(self.lines):
            return None
        file, at = self.lines[line - 1]
        return f"{file}:{at}" if file else None

    def locate(self, message: str) -> str:
        """Redis's error ``message`` with the file and line its library line is from (Redis
        names the library's own lines, ``user_function:<n>``)."""
        found = _USER_LINE.search(message)
        place = self.where(int(found.group(1))) if found else None
        return f"{message} (typedq/broker/redis/lua/{place})" if place else message


def _without_comment(line: str) -> str:
    """``line`` left empty when it is a whole-line comment (the library's source stays in
    Redis's memory; the comments would be most of it). The scripts hold no long strings,
    where a line starting with ``--`` would be text."""
    return "" if line.lstrip().startswith("--") else line


#: ARGV or KEYS as a word (what a shared helper may not read).
_CALL_ARGS = re.compile(r"\b(?:ARGV|KEYS)\b")


def _depth(line: str) -> int:
    """How many brackets ``line`` opens and leaves open (negative: closes), its strings
    and trailing comment left out."""
    code = _STRING.sub("''", line).split("--", 1)[0]
    return sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")


def _continues(line: str) -> bool:
    """Whether a statement goes on past ``line`` (it ends with an operator or a comma)."""
    code = _STRING.sub("''", line).split("--", 1)[0].rstrip()
    return code.endswith(("..", ",", "=", "+", "-", "*", "/", " and", " or", " not"))


def _prelude(
    lines: list[tuple[str, int, str]],
) -> tuple[list[tuple[str, int, str]], list[str], list[str], dict[str, str]]:
    """The shared part's lines with every top-level ``local`` statement (per-call state)
    left as a bare declaration; those statements as assignments, in order; their names;
    the constants (literal values, set at load: name -> where)."""
    forward = {
        m.group(1)
        for _, _, text in lines
        if not text.startswith("local") and (m := _ASSIGN_FUNCTION.match(text))
    }
    out: list[tuple[str, int, str]] = []
    resets: list[str] = []
    state: list[str] = []
    declared: dict[str, tuple[str, bool]] = {}  # top-level name -> (file:line, is state)
    constants: dict[str, str] = {}  # name -> file:line
    i = 0
    while i < len(lines):
        file, at, text = lines[i]
        i += 1
        names, m = _declared(text)
        for name in names:
            # A helper may be defined again (a second local: common/sharded.lua assigns
            # its wake-ups instead, to stay under Lua's 200); state may not: one reset
            # would miss the other copy.
            if name in declared and (m or declared[name][1]):
                raise RuntimeError(
                    f"typedq/broker/redis/lua/{file}:{at}: {name!r} is declared again at the top "
                    f"level (first at {declared[name][0]}): per-call state needs one name each"
                )
            declared[name] = (f"{file}:{at}", m is not None)
        if not m:
            if _CALL_ARGS.search(_STRING.sub("''", text).split("--", 1)[0]):
                # A helper runs in whichever call uses it, with no ARGV or KEYS of its
                # own: the library has them only as each function's parameters.
                raise RuntimeError(
                    f"typedq/broker/redis/lua/{file}:{at}: a shared helper reads ARGV or KEYS; "
                    "pass them from the script as a parameter instead"
                )
            out.append((file, at, text))
            continue
        statement = [text]
        depth = _depth(text)
        cont = _continues(text)
        while (depth > 0 or cont) and i < len(lines):
            more = lines[i][2]
            statement.append(more)
            depth += _depth(more)
            cont = _continues(more)
            i += 1
        value = "\n".join(statement).split("=", 1)[1] if m.group(2) == "=" else ""
        if m.group(2) == "=" and _code(value).strip() == "{}" and _KEEP in text:
            # A cache kept across calls: made once, at load; its helpers bound it.
            for name in names:
                constants[name] = f"{file}:{at}"
            out.append((file, at, text))
            continue
        if m.group(2) == "=" and _is_literal(value):
            # A constant: set once, at load (a literal needs no globals there).
            for name in names:
                constants[name] = f"{file}:{at}"
            out.append((file, at, text))
            out.extend(lines[i - len(statement) + 1 : i])
            continue
        table = m.group(2) == "=" and len(names) == 1 and _code(value).strip() == "{}"
        # A table is made at load and made again only after a call that used it (most
        # calls leave most of them empty): fewer tables per call for the GC.
        out.append((file, at, "local " + ", ".join(names) + (" = {}" if table else "")))
        out.extend((f, a, "") for f, a, _ in lines[i - len(statement) + 1 : i])
        if table:
            resets.append(f"if next({names[0]}) ~= nil then {names[0]} = {{}} end")
            state += names
        elif m.group(2) == "=":
            resets.append("\n".join(statement).removeprefix("local").lstrip())
            state += names
        elif not set(names) <= forward:
            resets.append(", ".join(names) + " = nil")
            state += names
    _check_constants(constants, lines)
    return out, resets, state, constants


def _check_constants(constants: Mapping[str, str], lines: list[tuple[str, int, str]]) -> None:
    """Refuse an assignment to a constant (it would outlive the call that made it)."""
    for file, at, text in lines:
        if text.lstrip().startswith("local"):
            continue
        for name in _ASSIGNED.findall(_code(text)):
            if name in constants:
                raise RuntimeError(
                    f"typedq/broker/redis/lua/{file}:{at}: {name!r} is a constant (set once, at "
                    f"{constants[name]}) and may not be assigned"
                )


def _declared(text: str) -> tuple[list[str], re.Match[str] | None]:
    """The names a top-level line declares (``local function f``, ``local a, b = ...``;
    none for any other line), and the match of a ``local`` that is not a function."""
    fn = _LOCAL_FUNCTION.match(text)
    if fn:
        return [fn.group(1)], None
    m = _LOCAL.match(text)
    return ([n.strip() for n in m.group(1).split(",")] if m else []), m


def main_locals(lines: list[tuple[str, int, str]]) -> int:
    """How many locals the library's main chunk declares: one per name of each top-level
    ``local`` statement (a helper defined again by ``local function`` is a second one)."""
    return sum(len(_declared(text)[0]) for _, _, text in lines)


def _check_main_locals(lines: list[tuple[str, int, str]], *, sharded: bool) -> None:
    """Refuse a library whose main chunk Redis would refuse to load (Lua's message names
    no file: 'main function has more than 200 local variables')."""
    n = main_locals(lines)
    if n > _MAX_LOCALS:
        variant = "Redis Cluster" if sharded else "single Redis"
        raise RuntimeError(
            f"typedq/broker/redis/lua/common/: the {variant} library's top level declares {n} "
            f"locals, Lua allows {_MAX_LOCALS}: make new helpers fields of a part's table "
            "(flow_ops, run_ops, claim_ops; lua/README.md) instead of top-level locals"
        )


def _code(text: str) -> str:
    """``text`` without its strings' contents and its trailing comment."""
    return _STRING.sub("''", text).split("--", 1)[0]


def _is_literal(value: str) -> bool:
    """Whether a top-level ``local``'s value is made of literals only (numbers, strings,
    operators): a constant, set once when the library loads instead of on every call."""
    code = _NUMBER.sub("0", "\n".join(_code(line) for line in value.split("\n")))
    return "{" not in code and not set(_WORD.findall(code)) - {"true", "false"}


def _begin(resets: list[str]) -> list[str]:
    """The per-call reset functions' lines, ``typedq_begin(KEYS, ARGV)`` last."""
    lines: list[str] = []
    parts: list[str] = []
    for n, start in enumerate(range(0, len(resets), _BEGIN_CHUNK)):
        part = f"{_BEGIN}{n}"
        parts.append(part)
        lines.append(f"local function {part}(KEYS, ARGV)")
        for statement in resets[start : start + _BEGIN_CHUNK]:
            lines.extend(statement.split("\n"))
        lines.append("end")
    calls = " ".join(f"{p}(KEYS, ARGV)" for p in parts)
    lines.append(f"local function {_BEGIN}(KEYS, ARGV) {calls} end")
    return lines


def _flags(name: str, shebang: str) -> list[str]:
    """The function flags of a script's ``#!lua [flags=a,b]`` shebang."""
    if not shebang.startswith("#!lua"):
        raise RuntimeError(f"typedq/broker/redis/lua/{name} must start with a #!lua shebang")
    flags: list[str] = []
    for option in shebang[len("#!lua") :].split():
        key, _, value = option.partition("=")
        if key != "flags":
            raise RuntimeError(f"typedq/broker/redis/lua/{name}: unknown shebang option {option!r}")
        flags += [f for f in value.split(",") if f]
    unknown = [f for f in flags if f not in _FLAGS]
    if unknown:
        raise RuntimeError(f"typedq/broker/redis/lua/{name}: unknown flags {unknown}")
    return flags


def read_scripts() -> dict[str, str]:
    """The files of ``typedq/broker/redis/lua/``: path in that folder (``claim.lua``,
    ``common/keys.lua``) -> text."""
    folder = resources.files("typedq.broker.redis").joinpath("lua")
    files: dict[str, str] = {}
    for entry in folder.iterdir():
        if entry.name.endswith(".lua"):
            files[entry.name] = entry.read_text("utf-8")
    for entry in folder.joinpath(_COMMON).iterdir():
        if entry.name.endswith(".lua"):
            files[f"{_COMMON}/{entry.name}"] = entry.read_text("utf-8")
    return files


def _part_lines(name: str, text: str) -> list[tuple[str, int, str]]:
    """A part's lines, numbered in its file (the newline that ends the file adds none)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [(name, k, _without_comment(t)) for k, t in enumerate(lines, 1)]


def build_library(files: Mapping[str, str] | None = None, *, sharded: bool = False) -> Library:
    """The library of ``files`` (path in ``lua/`` -> text; default: :func:`read_scripts`),
    which hold every part of :data:`PARTS`; every other ``*.lua`` of the top folder is one
    function.

    :param sharded: the Redis Cluster variant (wake-ups by ``SPUBLISH`` on per-queue
        channels)
    """
    files = dict(read_scripts() if files is None else files)
    missing = [name for name in PARTS if name not in files]
    if missing:
        raise RuntimeError(f"typedq/broker/redis/lua/: the shared parts {missing} are missing")
    # The generated constants first: every part and script may read them.
    shared: list[tuple[str, int, str]] = [("", 0, line) for line in lua_preamble()]
    for name in PARTS:
        if name != SHARDED_PART or sharded:
            shared += _part_lines(name, files[name])
    prelude, resets, state, constants = _prelude(shared)
    lines: list[tuple[str, int, str]] = [("", 0, f"#!lua name={_NAME_MARK}")]
    lines += prelude
    lines += [("", 0, text) for text in _begin(resets)]
    _check_main_locals(lines, sharded=sharded)
    functions: dict[str, str] = {}
    for name in sorted(files):
        if name in PARTS or "/" in name or not name.endswith(".lua"):
            continue
        script = name.removesuffix(".lua")
        if not re.fullmatch(r"[a-z0-9_]+", script):
            raise RuntimeError(f"typedq/broker/redis/lua/{name}: a script's name is [a-z0-9_]+")
        shebang, *body = files[name].split("\n")
        flags = ", ".join(f"'{f}'" for f in _flags(name, shebang))
        functions[script] = f"{_NAME_MARK}_{script}"
        # The shebang's line registers the function: the body keeps its own line numbers.
        lines.append(
            (
                name,
                1,
                f"redis.register_function{{function_name='{_NAME_MARK}_{script}', "
                f"flags={{{flags}}}, callback=function(KEYS, ARGV) {_BEGIN}(KEYS, ARGV)",
            )
        )
        script_lines = [(name, k, _without_comment(t)) for k, t in enumerate(body, 2)]
        _check_constants(constants, script_lines)
        lines += script_lines
        lines.append(("", 0, "end}"))
    text = "\n".join(t for _, _, t in lines)
    digest = hashlib.sha1(text.encode("utf-8"), usedforsecurity=False).hexdigest()[:16]
    lib = f"typedq_{digest}"
    return Library(
        name=lib,
        source=text.replace(_NAME_MARK, lib),
        functions={s: f.replace(_NAME_MARK, lib) for s, f in functions.items()},
        lines=tuple((f, a) for f, a, _ in lines),
        state=tuple(state),
    )


@functools.cache
def library(*, sharded: bool = False) -> Library:
    """The library for a single Redis, or with ``sharded`` the Redis Cluster variant
    (sharded pub/sub wake-ups), built on first use and kept for the process.

    Built on first use, not at import: each build reads, checks and rewrites ~7,000 lines
    (40-100 ms of CPU), which a process that never talks to Redis, or only to one kind of
    Redis, would pay for nothing (every CLI command and worker start paid for both)."""
    return build_library(sharded=sharded)
