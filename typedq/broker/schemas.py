"""The values of the ``SchemaRegistry`` capability: the schemas a broker has seen.

Every producer and worker process records, once per process and fingerprint, the
JSON Schemas of each of its tasks' input and output (:class:`SchemaRecord`); the broker
keeps the first record of each ``(task, fingerprint)`` with the time it first saw it.
``typedq verify`` (:mod:`typedq.verify`) reads them back to tell whether a new release's
models still decode the payloads that older producers write. The broker treats the
schemas as opaque text.

Capability ``FingerprintCounts`` answers the other half of that question, how many jobs
still carry each fingerprint: :class:`FingerprintPage` is one page of those counts,
aggregated where the jobs are stored (no job leaves the broker to be counted).
"""

from __future__ import annotations

import msgspec

__all__ = ["FingerprintPage", "SchemaRecord"]


class SchemaRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One task's schemas as some process of the app knew them.

    ``input_schema`` is the JSON Schema whose fingerprint travels in the envelope
    (:attr:`typedq.serde.Codec.fingerprint` is computed over it); ``output_schema`` the
    schema of what the task returns (Pydantic's serialization mode).
    """

    task: str
    #: The input schema's fingerprint (16 hex digits).
    fingerprint: str
    #: The input's JSON Schema, as JSON text.
    input_schema: str
    #: The output's JSON Schema, as JSON text.
    output_schema: str
    #: When the broker first recorded it (broker clock, epoch seconds); the broker sets
    #: it, a recording process leaves it 0.
    first_seen: float = 0.0


class FingerprintPage(msgspec.Struct, frozen=True, kw_only=True):
    """One page of ``count_fingerprints``: the jobs of one queue in one state, counted by
    the task and input fingerprint their envelopes carry."""

    #: ``(task, fingerprint)`` -> jobs of this page carrying it (fingerprint ``""``: a
    #: job enqueued without one; task ``""``: a stored body the broker could not read).
    counts: dict[tuple[str, str], int]
    #: Jobs counted in this page (the sum of ``counts``).
    jobs: int
    #: Where the next page starts; None after the state's last job.
    cursor: str | None
