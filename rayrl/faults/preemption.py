"""Preemption and the failure budget: a SIGTERM becomes a checkpoint, failures are budgeted by rate.

Spot reclaim and Kubernetes send SIGTERM first and SIGKILL after a grace period (AWS spot: a
2-minute notice; GCP preemptible/spot: 30 s; Kubernetes: ``terminationGracePeriodSeconds``, 30 s
by default). rayrl answers it on both sides:

- in a trial (:class:`TrialPreemption`): the iteration in progress finishes, the trainable asks
  Tune for a checkpoint (``should_checkpoint``), uploads it synchronously, then exits; Tune retries
  the trial from it elsewhere. If no checkpoint is done ``grace_s`` after the signal it exits anyway.
- in the driver (:class:`DriverPreemption`, a Tune callback): the next result of each trial asks
  for a checkpoint; once it is registered, Tune is interrupted the way Ctrl-C does (experiment state
  saved, trials resumable) and `rayrl train` exits 143; the same command resumes from that checkpoint.

Tune's ``FailureConfig.max_failures`` counts failures over a trial's whole life, so a run on spot
nodes dies at its N+1-th preemption however long it ran. :class:`FailureBudget` counts them in a
sliding window instead (``over_budget``, a pure rule): a crash loop still ends the run quickly.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ray.tune import Callback

EXIT_PREEMPTED = 128 + signal.SIGTERM  #: 143, the shell's status for "ended by SIGTERM"


def over_budget(failure_times: Sequence[float], now: float, max_failures: int, window_s: float) -> bool:
    """True when more than ``max_failures`` failures fell in the last ``window_s`` seconds (-1: never)."""
    if max_failures < 0:
        return False
    return sum(1 for t in failure_times if now - t <= window_s) > max_failures


def _interrupt_tune() -> None:
    """Ask the Tune loop in this process to stop as Ctrl-C does (it listens on SIGUSR1 too)."""
    os.kill(os.getpid(), signal.SIGUSR1)


class TrialPreemption:
    """SIGTERM in a trial's process: remember it, and exit ``grace_s`` later whatever happens."""

    def __init__(self, grace_s: float, exit: Callable[[int], None] = os._exit) -> None:
        self.grace_s = grace_s
        self.requested_at: float | None = None
        self.saved = False
        self._exit = exit

    def install(self) -> bool:
        """Take over SIGTERM (only possible on the main thread); False where it cannot."""
        if threading.current_thread() is not threading.main_thread():
            return False
        signal.signal(signal.SIGTERM, self._on_signal)
        return True

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.requested_at is None:
            self.requested_at = time.time()
            print(f"[rayrl] SIGTERM: checkpointing after this iteration (exit within {self.grace_s:g}s)", flush=True)
            timer = threading.Timer(self.grace_s, self.exit_now)
            timer.daemon = True
            timer.start()

    @property
    def requested(self) -> bool:
        return self.requested_at is not None

    def exit_now(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self._exit(EXIT_PREEMPTED)


_DRIVER: dict = {"requested_at": None, "done": False, "timed_out": False, "grace_s": 25.0}


def install_driver_handler(grace_s: float) -> None:
    """Take over SIGTERM in the driver (main thread only); state is per process, not per callback,
    because Tuner.restore brings back the callbacks pickled when the run began."""
    _DRIVER.update(requested_at=None, done=False, timed_out=False, grace_s=grace_s)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_driver_signal)


def driver_preempted() -> dict:
    """What happened to this driver: requested_at (None: no SIGTERM) and timed_out."""
    return dict(_DRIVER)


def _on_driver_signal(signum: int, frame: Any) -> None:
    if _DRIVER["requested_at"] is not None:
        return
    _DRIVER["requested_at"] = time.time()
    print(
        f"[rayrl] SIGTERM: checkpointing every running trial, then stopping (within {_DRIVER['grace_s']:g}s)",
        flush=True,
    )
    timer = threading.Timer(_DRIVER["grace_s"], _driver_give_up)
    timer.daemon = True
    timer.start()


def _driver_give_up() -> None:
    if not _DRIVER["done"]:
        _DRIVER["timed_out"] = True
        _driver_stop()


def _driver_stop() -> None:
    if not _DRIVER["done"]:
        _DRIVER["done"] = True
        _interrupt_tune()


def _wait_until_stored(checkpoint: Any, deadline: float) -> None:
    """Wait (until ``deadline``) for a tiered checkpoint's background upload: its manifest in storage.

    The node may go with the driver, and tier 1 with it; only storage survives a preemption.
    """
    from rayrl.storage.checkpoints import remote_manifest

    checkpoint = getattr(checkpoint, "checkpoint", checkpoint)  # a _TrainingResult or the Checkpoint itself
    fs, path = getattr(checkpoint, "filesystem", None), getattr(checkpoint, "path", None)
    while fs is not None and path and time.time() < deadline and remote_manifest(fs, path) is None:
        time.sleep(0.2)


class DriverPreemption(Callback):
    """After a SIGTERM to the driver: one more checkpoint of every running trial, then a clean Tune stop."""

    def __init__(self) -> None:
        self.asked: set[str] = set()
        self.checkpointed: set[str] = set()

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if _DRIVER["requested_at"] is not None and trial.trial_id not in self.asked:
            self.asked.add(trial.trial_id)
            result["should_checkpoint"] = True  # Tune reads it after the callbacks (tune_controller)

    def on_checkpoint(self, iteration: int, trials: list, trial: Any, checkpoint: Any, **info: Any) -> None:
        if _DRIVER["requested_at"] is None or trial.trial_id not in self.asked:
            return
        self.checkpointed.add(trial.trial_id)
        _wait_until_stored(checkpoint, _DRIVER["requested_at"] + _DRIVER["grace_s"] - 2.0)
        running = {t.trial_id for t in trials if t.status == "RUNNING"}
        if running <= self.checkpointed:
            print("[rayrl] SIGTERM: checkpoint written; stopping", flush=True)
            _driver_stop()


_BUDGET: dict = {"failures": [], "exceeded": ""}  # per process: Tuner.restore brings back pickled callbacks


def budget_exceeded() -> str:
    """Why this process's failure budget ended the run ('' when it did not)."""
    return _BUDGET["exceeded"]


class FailureBudget(Callback):
    """Stop the run (resumably) when trials fail more than ``max_failures`` times in ``window_s``.

    Tune itself is told to retry forever (``FailureConfig(max_failures=-1)``); this callback is the
    budget. :func:`budget_exceeded` says whether it ended the run.
    """

    def __init__(self, max_failures: int, window_s: float) -> None:
        self.max_failures = max_failures
        self.window_s = window_s

    def _failed(self) -> None:
        now = time.time()
        _BUDGET["failures"].append(now)
        if not _BUDGET["exceeded"] and over_budget(_BUDGET["failures"], now, self.max_failures, self.window_s):
            _BUDGET["exceeded"] = (
                f"{len(_BUDGET['failures'])} trial failures, more than {self.max_failures} within {self.window_s:g}s"
            )
            print(f"[rayrl] {_BUDGET['exceeded']}: stopping the run (it stays resumable)", flush=True)
            _interrupt_tune()

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._failed()

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._failed()
