"""Tune callbacks in the driver: a live progress line per result, and the run folder's history.csv."""

from __future__ import annotations

import csv
import io
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from ray.tune import Callback

from rayrl import runfolder
from rayrl.observe import keys
from rayrl.storage import files
from rayrl.storage.files import StorageError


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def history_row(result: dict, trial_id: str, phase: str, batch_size: Any, lr: Any) -> dict:
    """One history.csv row (columns: rayrl.observe.runfolder.HISTORY_COLUMNS) from one Tune result."""
    get = lambda key: keys.lookup(result, key)  # noqa: E731
    return {
        "trial_id": trial_id,
        "phase": phase,
        "batch_size": batch_size,
        "lr": lr,
        keys.ITERATION: get(keys.ITERATION),
        "env_steps": get(keys.ENV_STEPS),
        "episode_return_mean": get(keys.TRAIN_RETURN),
        "eval_return_mean": get(keys.EVAL_RETURN),
        "env_steps_per_s": get(keys.ENV_STEPS_PER_S),
        "learner_samples_per_s": get(keys.LEARNER_SAMPLES_PER_S),
        "total_loss": get(keys.TOTAL_LOSS),
        "grad_norm": get(keys.GRAD_NORM),
        "loss_scale": get(keys.LOSS_SCALE),
        "nonfinite_steps": get(keys.NONFINITE_STEPS),
        "time_total_s": get(keys.TIME_TOTAL),
        "cpu_util": get(keys.CPU_UTIL),
        "mem_util": get(keys.MEM_UTIL),
        "gpu_util": get(keys.GPU_UTIL),
        "gpu_mem_util": get(keys.GPU_MEM_UTIL),
        "net_util": get(keys.NET_UTIL),
        "num_learners": get(keys.NUM_LEARNERS),
        "backend": get(keys.BACKEND),
        "precision": get(keys.PRECISION),
    }


def trial_batch_lr(trial: Any) -> tuple[Any, Any]:
    """The batch size and lr a trial runs with, from its (RLlib) config."""
    return keys.config_batch_lr(getattr(trial, "config", {}) or {})


class HistoryWriter(Callback):
    """Appends one row per trial result to ``history.csv``; on object storage, uploads it as it grows.

    After a recovery Tune replays iterations from the last checkpoint, so an iteration can appear
    twice: the last row for a (trial_id, training_iteration) pair is the one that counts. Each row
    is one fsync'd append, cut back on failure, so the file never ends in half a row. The upload
    (the whole file, one object) happens at most every ``upload_s`` seconds and at the end.

    A failed write (a full disk) must not surface as a traceback from inside Tune: the error is
    kept and raised from ``on_step_end`` of the next loop, where Tune lets it end ``fit()``
    unchanged; `rayrl train` and the sweep print it as one paragraph and exit 1, every file intact.
    """

    def __init__(self, path: str | Path, phase: str, store: Any = None, upload_s: float = 10.0) -> None:
        self.path = Path(path)
        self.phase = phase
        self.store = store
        self.upload_s = upload_s
        self._uploaded = 0.0
        self.failed: StorageError | None = None

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if self.failed is not None:
            return
        batch, lr = trial_batch_lr(trial)
        row = history_row(result, trial.trial_id, self.phase, batch, lr)
        try:
            files.append_line(
                self.path,
                _csv_line(row.get(c) for c in runfolder.HISTORY_COLUMNS),
                header=_csv_line(runfolder.HISTORY_COLUMNS),
            )
            if self.store is not None and time.monotonic() - self._uploaded >= self.upload_s:
                self._upload()
        except StorageError as exc:
            self.failed = exc

    def _upload(self) -> None:
        self.store.upload(self.path.name)
        self._uploaded = time.monotonic()

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        if self.failed is not None:
            raise self.failed

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        if self.store is not None and self.failed is None:
            self._upload()


def _csv_line(values: Any) -> str:
    buf = io.StringIO()
    csv.writer(buf).writerow(list(values))
    return buf.getvalue()


class ProgressPrinter(Callback):
    """One line per result: iteration, env steps, env steps/s, return (and batch, lr when sweeping)."""

    def __init__(self, label: str = "", show_config: bool = False, stream: TextIO | None = None) -> None:
        self.label = label
        self.show_config = show_config
        self.stream = stream
        self._start = time.monotonic()

    def setup(self, **info: Any) -> None:
        self._start = time.monotonic()  # also after a resume: time since this process began

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        get = lambda key: _num(keys.lookup(result, key))  # noqa: E731
        parts = [f"[{self.label}{' ' if self.label else ''}{time.monotonic() - self._start:6.0f}s]"]
        if self.show_config:
            batch, lr = trial_batch_lr(trial)
            parts.append(f"{trial.trial_id} batch {batch} lr {_num(lr):.2e}")
        parts.append(f"iter {int(get(keys.ITERATION))}")
        parts.append(f"env steps {get(keys.ENV_STEPS):,.0f}")
        parts.append(f"{get(keys.ENV_STEPS_PER_S):,.0f} steps/s")
        parts.append(f"return {get(keys.TRAIN_RETURN):.1f}")  # nan: no episode finished yet
        if math.isfinite(get(keys.EVAL_RETURN)):
            parts.append(f"eval return {get(keys.EVAL_RETURN):.1f}")
        print(" | ".join(parts), file=self.stream or sys.stdout, flush=True)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        print(
            f"[{self.label}] trial {trial.trial_id} failed; Tune retries it from its latest checkpoint "
            f"if retries remain (error file: {getattr(trial, 'error_file', None)})",
            file=self.stream or sys.stderr,
            flush=True,
        )
