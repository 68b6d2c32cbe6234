"""Tune callbacks in the driver: what a person watching sees (trial events, progress), and history.csv."""

from __future__ import annotations

import csv
import io
import math
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from ray.tune import Callback

from rayrl import runfolder
from rayrl.observe import keys
from rayrl.observe.output import OUTPUT, output_mode
from rayrl.storage import files
from rayrl.storage.files import StorageError


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
    is one fsync'd append, cut back on failure, so the file never ends in half a row.

    The upload (the whole file, one object) runs at most every ``upload_s`` seconds in a background
    thread, and once more at the end: a slow or unreachable bucket must not stall Tune's loop or end
    the run (the checkpoints' uploader decides when storage trouble stops training). A failed upload
    is printed once per distinct error; rows not yet in the bucket are marked in the mirror
    (``mirror.UNSENT``), so the next start sends the local file instead of letting the bucket's older
    copy replace it.

    A failed local write (a full disk) must not surface as a traceback from inside Tune: the error is
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
        self.upload_failures = 0
        self._failing = False  #: the last upload failed (its line printed; the next success says so)
        self._lock = threading.Lock()
        self._sender: threading.Thread | None = None

    def __getstate__(self) -> dict:  # Tune pickles callbacks with the experiment: no thread or lock
        state = dict(self.__dict__)
        state["_lock"], state["_sender"] = None, None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self.__dict__.setdefault("upload_failures", 0)
        self.__dict__.setdefault("_failing", False)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if self.failed is not None:
            return
        batch, lr = trial_batch_lr(trial)
        row = history_row(result, trial.trial_id, self.phase, batch, lr)
        try:
            with self._lock:
                files.append_line(
                    self.path,
                    _csv_line(row.get(c) for c in runfolder.HISTORY_COLUMNS),
                    header=_csv_line(runfolder.HISTORY_COLUMNS),
                )
                if self.store is not None and self.store.remote:
                    self.store.mark_unsent(self.path.name)
        except StorageError as exc:
            self.failed = exc
            return
        busy = self._sender is not None and self._sender.is_alive()
        if self.store is not None and not busy and time.monotonic() - self._uploaded >= self.upload_s:
            self._uploaded = time.monotonic()
            self._sender = threading.Thread(target=self._upload, name="rayrl-history-upload", daemon=True)
            self._sender.start()

    def _upload(self) -> bool:
        """Send the file as it is now; marked sent only if no row was appended meanwhile."""
        name = self.path.name
        with self._lock:
            try:
                data = self.path.read_bytes()
            except OSError:
                return False
        try:
            self.store.send(name, data)
        except OSError as exc:
            self.upload_failures += 1
            if not self._failing:  # one line per outage, not one per attempt
                self._failing = True
                text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                print(
                    f"[rayrl] {name} could not be uploaded ({text}); training goes on, the local copy keeps "
                    f"every row and is sent again {self.upload_s:g}s after the last try, on a result, and at the "
                    "next start (a line says when it is through)",
                    flush=True,
                )
            return False
        with self._lock:
            if self.path.stat().st_size == len(data):
                self.store.mark_sent(name)
        if self._failing:
            self._failing = False
            print(f"[rayrl] {name} uploaded again ({self.upload_failures} failed attempts so far)", flush=True)
        return True

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        if self.failed is not None:
            raise self.failed

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        if self.store is None or self.failed is not None:
            return
        if self._sender is not None:
            self._sender.join(FINAL_UPLOAD_WAIT_S)
        if not self._upload():
            print(
                f"[rayrl] {self.path.name} is complete in {self.path.parent} but not in the bucket yet; "
                "the next start of this run sends it",
                flush=True,
            )


#: how long the end of a run waits for an upload of history.csv already under way
FINAL_UPLOAD_WAIT_S = 60.0


def _csv_line(values: Any) -> str:
    buf = io.StringIO()
    csv.writer(buf).writerow(list(values))
    return buf.getvalue()


#: Tune stop keys -> how a finished trial's line names the one that applied
_STOP_WORDS = {
    keys.ENV_STEPS: "used its {v:,.0f} env-step budget",
    keys.TRAIN_RETURN: "reached the target return {v:g}",
    keys.EVAL_RETURN: "reached the target evaluation return {v:g}",
    keys.TIME_TOTAL: "hit the {v:,.0f} s wall-time limit",
    keys.ITERATION: "ran its {v:.0f} iterations",
}


def stop_reason(result: dict, stop: Any) -> str:
    """The stop criterion a finished trial's last result met, else what is left: an early stop.

    ``stop`` is Tune's stop dict, or a Stopper with ``criteria()`` (and ``early_stop_reason``).
    """
    early = getattr(stop, "early_stop_reason", None) or (
        "ended before any stop criterion (stopped early by the scheduler or a stopper)"
    )
    if not isinstance(stop, dict) and hasattr(stop, "criteria"):
        stop = stop.criteria()
    if not isinstance(stop, dict):
        return "stopped"
    for key, limit in stop.items():
        value = keys.number(keys.lookup(result, key))
        if math.isfinite(value) and value >= float(limit):
            return _STOP_WORDS.get(key, f"reached {key} >= {{v:g}}").format(v=float(limit))
    return early


class ProgressPrinter(Callback):
    """What a person watching the driver sees: trial events and a progress line (see OUTPUT_MODES).

    A log (``ray job submit``, CI, a file) must fit on a few screens, so "normal" prints a trial's
    first result (where it starts, or resumes), its end with the reason, and one summary line every
    ``every_s`` seconds; "verbose" adds today's line per result.
    """

    def __init__(
        self,
        label: str = "",
        show_config: bool = False,
        stream: TextIO | None = None,
        stop: Any = None,
        env_budget: float | None = None,
    ) -> None:
        self.label = label
        self.show_config = show_config
        self.stream = stream
        self.stop = stop
        self.env_budget = env_budget  #: env steps per trial where ``stop`` does not say (the live view's bar)
        self._start = time.monotonic()
        self._last_line = self._start
        self._last: dict[str, dict] = {}  # trial id -> its latest result
        self._done: set[str] = set()
        self._total: int | None = None

    def setup(self, total_num_samples: int | None = None, **info: Any) -> None:
        self._start = self._last_line = time.monotonic()  # also after a resume: time since this process began
        self._total = total_num_samples

    def _print(self, text: str, err: bool = False) -> None:
        print(text, file=self.stream or (sys.stderr if err else sys.stdout), flush=True)

    def _prefix(self) -> str:
        return f"[{self.label}{' ' if self.label else ''}{time.monotonic() - self._start:6.0f}s]"

    def _result_line(self, trial: Any, result: dict) -> str:
        get = lambda key: keys.number(keys.lookup(result, key))  # noqa: E731
        parts = [self._prefix()]
        if self.show_config:
            batch, lr = trial_batch_lr(trial)
            parts.append(f"{trial.trial_id} batch {batch} lr {keys.number(lr):.2e}")
        parts.append(f"iter {int(get(keys.ITERATION))}")
        parts.append(f"env steps {get(keys.ENV_STEPS):,.0f}")
        parts.append(f"{get(keys.ENV_STEPS_PER_S):,.0f} steps/s")
        parts.append(f"return {get(keys.TRAIN_RETURN):.1f}")  # nan: no episode finished yet
        if math.isfinite(get(keys.EVAL_RETURN)):
            parts.append(f"eval return {get(keys.EVAL_RETURN):.1f}")
        return " | ".join(parts)

    def progress_line(self) -> str:
        """One line for the whole phase: trials, env steps, throughput, the best return so far."""
        results = list(self._last.values())
        steps = sum(keys.number(keys.lookup(r, keys.ENV_STEPS)) for r in results)
        running = [tid for tid in self._last if tid not in self._done]
        sps = sum(keys.number(keys.lookup(self._last[t], keys.ENV_STEPS_PER_S)) for t in running)
        returns = [(keys.number(keys.lookup(r, keys.TRAIN_RETURN)), tid) for tid, r in self._last.items()]
        returns = [(v, tid) for v, tid in returns if math.isfinite(v)]
        of = f" of {self._total}" if self._total and self._total < 10**6 else ""
        parts = [
            self._prefix(),
            f"trials: {len(running)} running, {len(self._done)} finished{of}",
            f"env steps {steps:,.0f}",
            f"{sps:,.0f} steps/s",
        ]
        if returns:
            best, tid = max(returns)
            parts.append(f"best return {best:.1f}" + (f" ({tid})" if self.show_config else ""))
        return " | ".join(parts)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        first = trial.trial_id not in self._last
        self._last[trial.trial_id] = result
        mode = output_mode()
        if mode == "verbose" or (mode == "normal" and first):
            self._print(self._result_line(trial, result))
        now = time.monotonic()
        if mode == "normal" and not first and now - self._last_line >= OUTPUT.every_s:
            self._print(self.progress_line())
            self._last_line = now

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._done.add(trial.trial_id)
        if output_mode() == "quiet":
            return
        result = self._last.get(trial.trial_id) or getattr(trial, "last_result", None) or {}
        get = lambda key: keys.number(keys.lookup(result, key))  # noqa: E731
        who = f"trial {trial.trial_id}" if self.show_config else "run"
        self._print(
            f"{self._prefix()} {who} finished: {stop_reason(result, self.stop)} | iter "
            f"{int(get(keys.ITERATION)) if math.isfinite(get(keys.ITERATION)) else 0} | env steps "
            f"{get(keys.ENV_STEPS):,.0f} | return {get(keys.TRAIN_RETURN):.1f}"
        )

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._print(
            f"[{self.label}] trial {trial.trial_id} failed; Tune retries it from its latest checkpoint "
            f"if retries remain (error file: {getattr(trial, 'error_file', None)})",
            err=True,
        )
