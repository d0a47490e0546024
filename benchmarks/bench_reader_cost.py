"""What an extractive reader would cost on this host: cost only, never quality.

    python benchmarks/bench_reader_cost.py --out bench-results/reader-cost

A reader (a BERT-shaped model with a start/end span head, trained on SQuAD 2.0, whose no-answer
score decides abstention) is what a highlight that holds the gold span for 80% of questions, and
declining SQuAD 2.0's unanswerable questions, would need (docs/evidence.md). No such weights can be
fetched here, so this builds the two common reader shapes with random weights (MiniLM-L12-H384, the
shape of the small SQuAD 2.0 readers; MiniLM-L6-H384, the shape of the L6 rerank tier), exports
them as the rerank tier is exported (ONNX, int8 dynamic, two intra-op threads, no spinning) and
times passages of the lengths a top passage has. The scores are meaningless and never used.

Writes results.md and results.json to `--out`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import percentile, write_results  # noqa: E402
from ragserve.generate.host import read_host_cpu  # noqa: E402
from ragserve.onnx_export import export_bert, keyword_inputs, quantize_int8  # noqa: E402

SHAPES: dict[str, dict[str, int]] = {
    "MiniLM-L12-H384": {"num_hidden_layers": 12, "hidden_size": 384, "num_attention_heads": 12},
    "MiniLM-L6-H384": {"num_hidden_layers": 6, "hidden_size": 384, "num_attention_heads": 12},
}
# (passages, tokens each): the top passage alone, and the top three, at typical question+passage lengths.
BATCHES = ((1, 192), (1, 256), (3, 256))


def reader_session(shape: dict[str, int], folder: Path, threads: int) -> Any:
    import onnxruntime as ort
    import torch
    from transformers import BertConfig, BertForQuestionAnswering

    torch.manual_seed(0)
    config = BertConfig(
        num_hidden_layers=shape["num_hidden_layers"],
        hidden_size=shape["hidden_size"],
        num_attention_heads=shape["num_attention_heads"],
        intermediate_size=4 * shape["hidden_size"],
        max_position_embeddings=512,
    )
    model = BertForQuestionAnswering(config).eval()  # type: ignore[no-untyped-call]
    full, int8 = folder / "reader.onnx", folder / "reader.int8.onnx"
    export_bert(keyword_inputs(model, "start_logits"), full, "start_logits", {0: "batch", 1: "seq"})
    quantize_int8(full, int8, per_channel=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(int8), sess_options=options, providers=["CPUExecutionProvider"])


def run(args: argparse.Namespace) -> dict[str, list[float]]:
    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {}
    for name, shape in SHAPES.items():
        with tempfile.TemporaryDirectory() as tmp:
            session = reader_session(shape, Path(tmp), args.threads)
            for batch, tokens in BATCHES:
                ids = rng.integers(1000, 29000, size=(batch, tokens), dtype=np.int64)
                feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
                for _ in range(3):
                    session.run(None, feed)
                key = f"{name} | {batch} x {tokens}"
                times[key] = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    session.run(None, feed)
                    times[key].append((time.perf_counter() - start) * 1000)
    return times


def report(times: dict[str, list[float]], args: argparse.Namespace) -> str:
    lines = [
        "# An extractive reader's cost (random weights: cost only)",
        "",
        f"Host: {read_host_cpu().describe()}. ONNX Runtime int8, {args.threads} intra-op threads, "
        f"{args.repeats} runs each after 3 warm-up runs.",
        "",
        "| shape | passages x tokens | p50 ms | p95 ms | p99 ms |",
        "|---|---|---|---|---|",
    ]
    for key, values in times.items():
        lines.append(
            f"| {key} | {percentile(values, 50):.1f} | {percentile(values, 95):.1f} | {percentile(values, 99):.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "reader-cost")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    times = run(args)
    write_results(args.out, report(times, args), times)


if __name__ == "__main__":
    main()
