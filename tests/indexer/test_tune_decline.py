"""tune-decline's fit: a model the server loads, whose calibration declines the share it names."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from indexer.cli import app
from indexer.tune.decline import cross_validate, fit
from indexer.tune.decline_data import Asked
from ragserve.request.decline import DeclineModel

NAMES = ("top_dense", "found")


def _rows(n: int = 400) -> list[Asked]:
    rng = random.Random(0)
    rows = []
    for i in range(n):
        absent = i % 2 == 0
        centre = (0.25, 0.4) if absent else (0.6, 0.8)
        signals: dict[str, float | None] = {
            "top_dense": rng.gauss(centre[0], 0.1),
            "found": rng.gauss(centre[1], 0.15),
        }
        rows.append(Asked(str(i), f"article{i % 5}", "absent" if absent else "covered", signals))
    return rows


def test_the_fitted_model_loads_and_its_table_declines_the_share_it_names() -> None:
    rows = _rows()
    data = fit(rows, NAMES)
    model = DeclineModel.from_json(data)
    assert data["fitted_on"]["auc"] > 0.95 and all(w < 0 for w in model.weights)  # closer: less declined
    thresholds = [t for _, t in model.calibration]
    assert thresholds == sorted(thresholds, reverse=True)  # a larger share declined: a lower threshold
    covered = [r for r in rows if r.kind == "covered"]
    threshold = model.threshold_for(0.05)
    declined = sum(model.score({n: float(r.signals[n] or 0.0) for n in NAMES}) >= threshold for r in covered)
    assert declined / len(covered) == pytest.approx(0.05, abs=0.02)


def test_cross_validation_reports_each_rate_on_groups_left_out_of_the_fit() -> None:
    held = cross_validate(_rows(), NAMES, (0.02, 0.1))
    assert held[0.02]["covered"] <= held[0.1]["covered"] and held[0.02]["absent"] <= held[0.1]["absent"]
    assert 0 <= held[0.1]["groups_meeting"] <= 5


def test_tune_decline_fits_again_from_the_rows_a_run_kept(tmp_path: Path) -> None:
    """`--rows`: no question asked again, the same model as a fit over those rows; bad rows: exit 2."""
    kept = tmp_path / "rows.json"
    kept.write_text(json.dumps({"rows": [dataclasses.asdict(r) for r in _rows()]}))
    out = tmp_path / "model.json"
    args = ["tune-decline", str(tmp_path / "not-asked"), "--out", str(out), "--signals", ",".join(NAMES)]
    result = CliRunner().invoke(app, [*args, "--rows", str(kept)])
    assert result.exit_code == 0, result.output
    assert DeclineModel.load(out) == DeclineModel.from_json(fit(_rows(), NAMES))
    assert "false rate 0.035, each article left out of the fit" in result.output
    kept.write_text(json.dumps({"rows": [{"qid": "1"}]}))
    result = CliRunner().invoke(app, [*args, "--rows", str(kept)])
    assert result.exit_code == 2 and "holds no decline rows" in result.output
