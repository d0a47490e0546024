"""The one line each tuner's command prints when it is done: what it published, what it measured."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from indexer.tune.embedder import TuneReport
    from indexer.tune.reader import ReaderTuneReport
    from indexer.tune.reranker import RerankTuneReport


def tune_summary(report: TuneReport) -> str:
    fit = ""
    if report.fit_after is not None:
        fit = (
            f"; held-back {report.fit_queries} queries nDCG@10 {report.fit_before:.4f} "
            f"(untuned, w={report.weight_before}) -> {report.fit_after:.4f} (tuned, fitted w={report.weight_after})"
        )
    what = f"published version {report.version} at {report.folder}" if report.published else "not published"
    return (
        f"{what}: {report.examples} examples ({report.method}), training {report.train_seconds:.0f} s, "
        f"re-embedding {report.reembed_seconds:.0f} s, total {report.seconds:.0f} s{fit}"
    )


def rerank_summary(report: RerankTuneReport) -> str:
    depths = ", ".join(f"depth {d} {v:.4f}" for d, v in report.by_depth.items())
    verdict = (
        f"beats the fused order (mean gain {report.mean_gain:+.4f}): on by default"
        if report.beats_fused
        else f"mean gain {report.mean_gain:+.4f} over the fused order is not enough: off by default "
        "(RAGSERVE_RERANK_MODE=tuned turns it on)"
    )
    return (
        f"published version {report.version} at {report.folder}: {report.groups} groups, training "
        f"{report.train_seconds:.0f} s, total {report.seconds:.0f} s; held-back {report.fit_queries} queries "
        f"nDCG@10 fused {report.fused:.4f}, blended (ce_weight {report.ce_weight}) {depths}; {verdict}"
    )


def reader_summary(report: ReaderTuneReport) -> str:
    held = ""
    if report.int8 is not None:
        f = report.int8
        held = (
            f"; held-out ({f.answerable} answerable, {f.unanswerable} unanswerable): EM {f.exact_match:.3f}, "
            f"F1 {f.f1:.3f}, no-answer AUC {f.no_answer_auc}, threshold {report.threshold:.3f} declines "
            f"{f.declined_answerable:.1%} / {f.declined_unanswerable:.1%}"
        )
    return (
        f"wrote reader {report.out} ({report.size_bytes / 1e6:.1f} MB): {report.stats.examples} examples, "
        f"{report.stats.steps} steps, training {report.stats.seconds:.0f} s, total {report.seconds:.0f} s{held}"
    )
