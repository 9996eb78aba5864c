"""Tooling tier: docs, packaging, typing (mypy, basedpyright), stubs, the browser, benchmarks.

What it checks does not depend on the interpreter that runs the suite: `make test` runs it on
the first interpreter only, the other tiers on each."""
