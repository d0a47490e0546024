"""The tuners' resumable checkpoint: its trainer state is loaded as data only. A state file that
would run code when unpickled (anyone who can write `INDEX_ROOT/.tune/` can plant one) is refused,
logged, and training starts from the base model; an honest checkpoint still resumes."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from indexer.tune.training import _META, _STATE, CHECKPOINT, FINAL, TrainingRun, resumable_training


def _plant(marker: str) -> dict[str, Any]:
    Path(marker).write_text("code ran")
    return {}


class _Payload:
    """Unpickling this calls `_plant`: what a hostile checkpoint would do with any function."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _plant, (str(self.marker),)


class _Builds:
    """A tiny real optimizer and linear warm-up schedule (as the tuners use) around one weight."""

    def __init__(self, steps_per_epoch: int = 2, epochs: int = 2) -> None:
        self.calls: list[tuple[str, bool]] = []
        self.steps_per_epoch, self.epochs = steps_per_epoch, epochs

    def __call__(self, path: str, resume: bool) -> TrainingRun:
        import torch
        from transformers import get_linear_schedule_with_warmup

        self.calls.append((path, resume))
        weight = torch.nn.Parameter(torch.ones(3))
        optimizer = torch.optim.AdamW([{"params": [weight], "lr": 1e-2}, {"params": [], "lr": 1e-3}])
        total = self.steps_per_epoch * self.epochs
        scheduler = get_linear_schedule_with_warmup(optimizer, 1, total)  # type: ignore[no-untyped-call]

        def save(folder: Path) -> None:
            folder.mkdir(parents=True)
            (folder / "weights.txt").write_text(repr(weight.tolist()))

        def loss_at(epoch: int, offset: int) -> Any:
            return (weight * (epoch + offset + 1)).sum()

        return TrainingRun(loss_at, optimizer, scheduler, save, self.steps_per_epoch, self.epochs)


def _train(work: Path, build: _Builds, on_step: Any = None) -> Path:
    return resumable_training(work, "fp", {}, "base-model", build, 1, "test", progress=False, on_step=on_step)


def test_a_state_file_that_would_run_code_is_refused_and_training_starts_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import torch

    work, marker = tmp_path / "work", tmp_path / "marker"
    (work / CHECKPOINT).mkdir(parents=True)
    (work / _META).write_text(json.dumps({"fingerprint": "fp", "done": False, "options": {}}))
    torch.save({"optimizer": _Payload(marker), "scheduler": {}, "step": 3}, work / CHECKPOINT / _STATE)
    build = _Builds()
    seen: list[int] = []
    with caplog.at_level(logging.WARNING, logger="indexer.tune.training"):
        try:
            final = _train(work, build, seen.append)
        finally:  # checked even when resuming fails on what the payload left behind
            assert not marker.exists(), "the checkpoint's pickle ran code"
    assert build.calls == [("base-model", False)] and seen == [1, 2, 3, 4]  # from the start
    assert any("refused" in r.getMessage() and "training from the start" in r.getMessage() for r in caplog.records)
    assert final == work / FINAL and (final / "weights.txt").is_file()
    # The planted state was replaced by an honest one.
    assert torch.load(work / CHECKPOINT / _STATE, weights_only=True)["step"] == 4
    # And the payload is live: a full unpickle would have run it (the test is not vacuous).
    torch.save({"optimizer": _Payload(marker)}, tmp_path / "live.pt")
    torch.load(tmp_path / "live.pt", weights_only=False)
    assert marker.exists()


def test_a_garbled_state_file_starts_over(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / CHECKPOINT).mkdir(parents=True)
    (work / _META).write_text(json.dumps({"fingerprint": "fp", "done": False, "options": {}}))
    (work / CHECKPOINT / _STATE).write_bytes(b"PK\x03\x04 not a checkpoint")
    build = _Builds()
    _train(work, build)
    assert build.calls == [("base-model", False)]


def test_an_honest_checkpoint_still_resumes_with_its_optimizer_and_schedule(tmp_path: Path) -> None:
    work = tmp_path / "work"

    def stop_at_3(step: int) -> None:
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _train(work, _Builds(), stop_at_3)
    build = _Builds()
    seen: list[int] = []
    _train(work, build, seen.append)
    assert build.calls == [(str(work / CHECKPOINT), True)] and seen == [4]
