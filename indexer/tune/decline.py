"""`ragserve-index tune-decline`: fit the decline's logistic model and its calibration table.

Rows come from indexer/tune/decline_data.py (leave-one-article-out over a SQuAD-format folder);
the model weighs the chosen signals of request/decline.py, absent and covered questions weighted
equally; the calibration table holds, for each share of covered questions declined, the score
threshold that declines that share of the covered questions it was fitted on. The JSON it writes
is what the server loads (`ragserve/request/decline_model.json` ships one).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from indexer.tune.decline_data import Asked
from ragserve.config import EmbedderSettings
from ragserve.request.decline import DeclineModel

# The shares of covered questions declined that the table holds (the setting interpolates).
CALIBRATION_RATES = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3)
DEFAULT_SIGNALS = ("top_dense", "dense_drop", "top_lexical", "coverage", "found", "missing_terms")


def usable(rows: Sequence[Asked], names: Sequence[str]) -> list[Asked]:
    """Absent and covered rows with every named signal measured."""
    return [r for r in rows if r.kind in ("absent", "covered") and all(r.signals.get(n) is not None for n in names)]


def matrix(rows: Sequence[Asked], names: Sequence[str]) -> np.ndarray:
    return np.array([[float(r.signals[n] or 0.0) for n in names] for r in rows], dtype=np.float64)


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-2, steps: int = 50) -> np.ndarray:
    """Weights (bias last) by Newton's method on standardised features, the two classes weighted
    equally whatever their counts."""
    design = np.hstack([x, np.ones((len(x), 1))])
    balance = np.where(y > 0, 0.5 / max(y.sum(), 1.0), 0.5 / max((1 - y).sum(), 1.0)) * len(y)
    weights = np.zeros(design.shape[1])
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ weights, -60, 60)))
        gradient = design.T @ (balance * (p - y)) + l2 * np.r_[weights[:-1], 0.0]
        curvature = balance * p * (1 - p)
        hessian = design.T @ (design * curvature[:, None]) + l2 * np.eye(len(weights))
        weights -= np.linalg.solve(hessian, gradient)
    return weights


def auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """The chance a positive scores above a negative (ties count half)."""
    above = scores[positive][:, None] - scores[~positive][None, :]
    return float((above > 0).mean() + 0.5 * (above == 0).mean())


def fit(rows: Sequence[Asked], names: Sequence[str]) -> dict[str, Any]:
    """The model's JSON (what `DeclineModel.from_json` reads), with the figures it was fitted to."""
    rows = usable(rows, names)
    x = matrix(rows, names)
    y = np.array([1.0 if r.kind == "absent" else 0.0 for r in rows])
    mean, std = x.mean(axis=0), x.std(axis=0) + 1e-9
    weights = fit_logistic((x - mean) / std, y)
    model = {
        "names": list(names),
        "mean": mean.tolist(),
        "std": std.tolist(),
        "weights": weights[:-1].tolist(),
        "bias": float(weights[-1]),
        "embedder": EmbedderSettings().model,
        "calibration": [],
    }
    scores = 1.0 / (1.0 + np.exp(-np.clip(((x - mean) / std) @ weights[:-1] + weights[-1], -60, 60)))
    covered = np.sort(scores[y == 0])
    model["calibration"] = [[rate, float(np.quantile(covered, 1.0 - rate))] for rate in CALIBRATION_RATES]
    positive = y > 0
    model["fitted_on"] = {
        "absent": int(positive.sum()),
        "covered": int((~positive).sum()),
        "groups": sorted({r.group for r in rows}),
        "auc": auc(scores, positive),
        "signal_auc": {n: auc(x[:, i], positive) for i, n in enumerate(names)},
    }
    return model


def write_model(model: dict[str, Any], path: Path) -> None:
    DeclineModel.from_json(model)  # what the server will read, checked before it is written
    path.write_text(json.dumps(model, indent=1) + "\n")


def cross_validate(rows: Sequence[Asked], names: Sequence[str], rates: Sequence[float]) -> dict[float, dict[str, Any]]:
    """Each group left out of the fit in turn and scored at each rate's threshold: the share of its
    absent and covered questions declined, and how many groups meet 0.90 absent at 0.05 covered
    (how the default RAGSERVE_DECLINE_FALSE_RATE was chosen)."""
    groups = sorted({r.group for r in rows})
    models = {g: DeclineModel.from_json(fit([r for r in rows if r.group != g], names)) for g in groups}
    out: dict[float, dict[str, Any]] = {}
    for rate in rates:
        folds = []
        for g in groups:
            model, test = models[g], usable([r for r in rows if r.group == g], names)
            threshold = model.threshold_for(rate)
            shares = [
                float(np.mean([model.score({n: float(r.signals[n] or 0.0) for n in names}) >= threshold for r in kind]))
                for kind in ([r for r in test if r.kind == "absent"], [r for r in test if r.kind == "covered"])
            ]
            folds.append(shares)
        out[rate] = {
            "absent": float(np.mean([f[0] for f in folds])),
            "covered": float(np.mean([f[1] for f in folds])),
            "covered_max": max(f[1] for f in folds),
            "groups_meeting": sum(f[0] >= 0.9 and f[1] <= 0.05 for f in folds),
        }
    return out
