"""bench/redis_bench.py's app with tracing set by ``$TYPEDQ_BENCH_TRACING``, for
bench/tracing_overhead.py's worker process.

``off``: no tracing (the default). ``noop``: ``tracing=True`` with no TracerProvider
configured (the API's no-op spans). ``sdk``: the OpenTelemetry SDK with a
BatchSpanProcessor exporting to nowhere (what a real setup costs, less the network),
recording every span. ``sampled``: the same with the sampler docs/observability.md
recommends for busy queues, ``ParentBased(TraceIdRatioBased(0.1))`` (one trace in ten
recorded, decided where the trace starts and followed by the worker); ``sampled:R``
samples a ratio R of the traces (``sampled:0.01``: one in a hundred). ``installed``:
the SDK provider of ``sdk`` installed, but the app not traced (what the SDK costs a
process by being there).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from bench.redis_bench import app, noop

__all__ = ["app", "configure", "noop"]


def configure(mode: str, *, install: bool = True) -> None:
    """Turn ``app``'s tracing to ``mode`` (off, noop or sdk); before its worker starts.

    :param install: in ``sdk`` mode, make the SDK provider the global one (once per
        process); False keeps it to ``app``
    """
    if mode == "off":
        app.client.tracing = None
        return
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from typedq.tracing import Tracing

    class Nowhere(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = None
    if mode == "installed":
        configure("sdk", install=install)
        app.client.tracing = None
        return
    if mode == "sdk" or mode.startswith("sampled"):
        ratio = float(mode.partition(":")[2] or 0.1)
        sampler = ParentBased(TraceIdRatioBased(ratio)) if mode != "sdk" else None
        provider = TracerProvider(sampler=sampler)
        provider.add_span_processor(BatchSpanProcessor(Nowhere()))
        if install:
            trace.set_tracer_provider(provider)
    app.client.tracing = Tracing(provider)


configure(os.environ.get("TYPEDQ_BENCH_TRACING", "off"))
