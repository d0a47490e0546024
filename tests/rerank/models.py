"""Architecture-identical TEST models for the reranker: random weights, random classification heads
(why, and how the server refuses them by default: benchmarks/workloads.py, which builds them for the
tests and the latency benchmarks).

    python -m tests.rerank.models OUT_DIR   # writes OUT_DIR/minilm-l2-random and OUT_DIR/minilm-l6-random
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.workloads import build_all
from benchmarks.workloads import build_test_model as build_test_model

if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m tests.rerank.models OUT_DIR")
    for name, path in build_all(Path(sys.argv[1])).items():
        print(f"{name}: {path}")
