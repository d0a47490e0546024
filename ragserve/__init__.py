"""ragserve: a low-latency RAG serving sidecar."""

__version__ = "0.1.0"
