"""The resumable training loop both tuners drive (the bi-encoder: embedder_model.py; the
cross-encoder: reranker_model.py).

Every `checkpoint_every` steps (and at the end of each epoch) the model, optimizer, scheduler and
step are written to `<work>/checkpoint` (a new folder renamed into place, so a kill never leaves
half a checkpoint). A restart with the same examples and options continues from the last
checkpoint; the per-epoch shuffle is seeded, so the remaining batches are the ones it would have
seen.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint"
FINAL = "final"
_STATE = "trainer_state.pt"
_META = "meta.json"


def _save_checkpoint(work: Path, save_model: Callable[[Path], None], optimizer: Any, scheduler: Any, step: int) -> None:
    """Model (written by `save_model` into a folder), optimizer, scheduler and step, replaced whole."""
    import torch

    tmp = work / f".{CHECKPOINT}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_model(tmp)
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "step": step}, tmp / _STATE)
    old = work / f".{CHECKPOINT}.old"
    shutil.rmtree(old, ignore_errors=True)
    if (work / CHECKPOINT).exists():
        (work / CHECKPOINT).rename(old)
    tmp.rename(work / CHECKPOINT)
    shutil.rmtree(old, ignore_errors=True)


def _resume_state(work: Path, fingerprint: str) -> dict[str, Any] | None:
    """The saved trainer state when the checkpoint belongs to this run (same examples and options);
    None (train from the base model) when there is none, or it cannot be read safely."""
    import pickle

    import torch

    meta = work / _META
    state = work / CHECKPOINT / _STATE
    if not state.is_file() or not meta.is_file() or json.loads(meta.read_text()).get("fingerprint") != fingerprint:
        return None
    try:
        # weights_only: tensors and plain containers only. Anyone who can write the work folder
        # could otherwise run code in this process through a pickled object.
        loaded = torch.load(state, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as exc:
        log.warning("checkpoint %s refused (%s: %s): training from the start", state, type(exc).__name__, exc)
        return None
    if not (isinstance(loaded, dict) and {"optimizer", "scheduler", "step"} <= loaded.keys()):
        log.warning("checkpoint %s is not a trainer state: training from the start", state)
        return None
    return loaded


@dataclass(frozen=True)
class TrainingRun:
    """One model's training, as the resumable loop drives it: the loss of step (epoch, offset)."""

    loss_at: Callable[[int, int], Any]
    optimizer: Any
    scheduler: Any
    save_model: Callable[[Path], None]
    steps_per_epoch: int
    epochs: int


def resumable_training(
    work: Path,
    fingerprint: str,
    options: dict[str, Any],
    base_model: str,
    build: Callable[[str, bool], TrainingRun],
    checkpoint_every: int,
    desc: str,
    progress: bool = True,
    on_step: Callable[[int], None] | None = None,
) -> Path:
    """Train from `base_model`, or continue from this run's last checkpoint (`build` gets the model
    folder and whether it is a checkpoint); returns the final model's folder."""
    work.mkdir(parents=True, exist_ok=True)
    final = work / FINAL
    if final.is_dir() and _meta_matches(work, fingerprint, done=True):
        log.info("already trained: %s", final)
        return final
    state = _resume_state(work, fingerprint)
    run = build(base_model if state is None else str(work / CHECKPOINT), state is not None)
    step = 0
    if state is not None:
        run.optimizer.load_state_dict(state["optimizer"])
        run.scheduler.load_state_dict(state["scheduler"])
        step = int(state["step"])
    else:
        _write_meta(work, fingerprint, False, options)
    total = run.steps_per_epoch * run.epochs
    bar = tqdm(total=total, initial=step, unit="step", desc=desc, disable=not progress)
    while step < total:
        epoch, offset = divmod(step, run.steps_per_epoch)
        loss = run.loss_at(epoch, offset)
        loss.backward()
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}", epoch=epoch + 1)
        if step % checkpoint_every == 0 or step % run.steps_per_epoch == 0:
            _save_checkpoint(work, run.save_model, run.optimizer, run.scheduler, step)
        if on_step is not None:
            on_step(step)
    bar.close()
    return _save_final(work, run.save_model, fingerprint, options)


def _save_final(work: Path, save_model: Callable[[Path], None], fingerprint: str, options: dict[str, Any]) -> Path:
    """The trained model in `<work>/final` (renamed into place) and the run marked done."""
    final = work / FINAL
    tmp = work / f".{FINAL}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_model(tmp)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    _write_meta(work, fingerprint, True, options)
    return final


def _write_meta(work: Path, fingerprint: str, done: bool, options: dict[str, Any]) -> None:
    (work / _META).write_text(json.dumps({"fingerprint": fingerprint, "done": done, "options": options}))


def _meta_matches(work: Path, fingerprint: str, done: bool) -> bool:
    meta = work / _META
    if not meta.is_file():
        return False
    data = json.loads(meta.read_text())
    return bool(data.get("fingerprint") == fingerprint and data.get("done") == done)
