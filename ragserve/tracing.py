"""Optional OpenTelemetry tracing (off by default): one span per request, one per stage.

When off, nothing here allocates spans: `stage_span` returns a shared no-op context manager.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

_tracer: Any = None  # an opentelemetry Tracer once tracing is enabled


def enabled() -> bool:
    return _tracer is not None


def setup_tracing(otlp_endpoint: str = "", exporter: Any = None) -> None:
    """Install a tracer provider. `exporter` (an SpanExporter) wins over the OTLP endpoint;
    with neither, spans are printed to stderr (useful on a workstation)."""
    global _tracer
    import sys

    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "ragserve"}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
    else:
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    _tracer = provider.get_tracer("ragserve")
    trace.set_tracer_provider(provider)


@contextlib.contextmanager
def request_span(name: str, metadata: Sequence[tuple[str, Any]] | None) -> Iterator[None]:
    """The request's root span, continuing the caller's trace from gRPC metadata (W3C traceparent)."""
    if _tracer is None:
        yield
        return
    from opentelemetry.propagate import extract

    carrier: Mapping[str, str] = {k: v for k, v in (metadata or ()) if isinstance(v, str)}
    with _tracer.start_as_current_span(name, context=extract(carrier)):
        yield


def stage_span(name: str) -> contextlib.AbstractContextManager[Any]:
    if _tracer is None:
        return contextlib.nullcontext()
    return _tracer.start_as_current_span(name)  # type: ignore[no-any-return]
