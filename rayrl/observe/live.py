"""The live view on a terminal: a phase's progress bar with ETA and a table of its trials, in place.

Only where stdout is a terminal and the output mode is "normal" (rayrl.observe.output); logs and
files get rayrl.observe.progress's event lines instead. rich's Live redraws a few times a second
and carries any other print (Ray's worker logs) above the view.
"""

from __future__ import annotations

import atexit
import math
import sys
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from rayrl.observe import keys
from rayrl.observe.output import output_mode
from rayrl.observe.progress import ProgressPrinter, stop_reason, trial_batch_lr

MAX_ROWS = 12  #: trials shown: the running ones first, then the best finished


def live_ok(stream: TextIO | None = None) -> bool:
    """The live view is for a person at a terminal in the normal output mode."""
    s = stream or sys.stdout
    return output_mode() == "normal" and hasattr(s, "isatty") and s.isatty()


def budget_of(stop: Any, fallback_env_steps: float | None) -> tuple[str, float | None]:
    """(unit, per-trial budget) the bar counts in: env steps, else iterations (the ladder)."""
    if not isinstance(stop, dict) and hasattr(stop, "criteria"):  # the confirmation's Stopper
        stop = stop.criteria()
    if isinstance(stop, dict) and keys.ENV_STEPS in stop:
        return keys.ENV_STEPS, float(stop[keys.ENV_STEPS])
    if isinstance(stop, dict) and keys.ITERATION in stop:
        return keys.ITERATION, float(stop[keys.ITERATION])
    return keys.ENV_STEPS, fallback_env_steps


class LiveView(ProgressPrinter):
    """ProgressPrinter's bookkeeping, drawn as one live frame instead of lines."""

    _progress: Progress  #: made in setup, like the Live: rich's objects hold locks Tune cannot pickle
    _task: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unit, self.per_trial = budget_of(self.stop, self.env_budget)
        self._status: dict[str, str] = {}
        self._trials: dict[str, Any] = {}
        self._live: Live | None = None

    def _new_progress(self) -> Progress:
        unit = "env steps" if self.unit == keys.ENV_STEPS else "iters"
        return Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.completed:,.0f}/{task.total:,.0f} " + unit),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
        )

    def __getstate__(self) -> dict:
        # Tune pickles its callbacks with the experiment state; rich's objects hold locks.
        state = {k: v for k, v in self.__dict__.items() if k not in ("_progress", "_task")}
        return {**state, "_live": None}

    def setup(self, total_num_samples: int | None = None, **info: Any) -> None:
        super().setup(total_num_samples=total_num_samples, **info)
        trials = total_num_samples if total_num_samples and total_num_samples < 10**6 else 1
        total = self.per_trial * trials if self.per_trial else None
        self._progress = self._new_progress()
        self._task = self._progress.add_task(self.label or "run", total=total)
        console = Console(file=self.stream or sys.stdout)
        self._live = Live(self._render(), console=console, refresh_per_second=2, transient=False)
        self._live.start()
        atexit.register(self._stop)

    def _stop(self) -> None:
        if self._live is not None:
            self._live.update(self._render(), refresh=True)
            self._live.stop()
            self._live = None

    def _done_so_far(self) -> float:
        return sum(max(0.0, keys.number(keys.lookup(r, self.unit))) for r in self._last.values())

    def _render(self) -> Group:
        table = Table(expand=False, box=None, header_style="bold", pad_edge=False)
        for col in (["trial", "batch", "lr"] if self.show_config else ["run"]) + [
            "env steps",
            "return",
            "steps/s",
            "status",
        ]:
            table.add_column(col, justify="left" if col in ("trial", "run", "status") else "right")
        running = [t for t in self._last if t not in self._done]
        finished = sorted(
            (t for t in self._last if t in self._done),
            key=lambda t: -keys.number(keys.lookup(self._last[t], keys.TRAIN_RETURN)),
        )
        for tid in (running + finished)[:MAX_ROWS]:
            r = self._last[tid]
            cells = [tid]
            if self.show_config:
                batch, lr = trial_batch_lr(self._trials.get(tid))
                cells += [str(batch), f"{keys.number(lr):.2e}"]
            ret = keys.number(keys.lookup(r, keys.TRAIN_RETURN))
            cells += [
                f"{keys.number(keys.lookup(r, keys.ENV_STEPS)):,.0f}",
                f"{ret:.1f}" if math.isfinite(ret) else "-",
                f"{keys.number(keys.lookup(r, keys.ENV_STEPS_PER_S)):,.0f}",
                self._status.get(tid, "running"),
            ]
            table.add_row(*cells)
        hidden = len(self._last) - min(len(self._last), MAX_ROWS)
        parts: list[Any] = [self._progress, table]
        if hidden:
            parts.append(f"... and {hidden} more (history.csv has every result)")
        return Group(*parts)

    def _redraw(self) -> None:
        self._progress.update(self._task, completed=self._done_so_far())
        if self._live is not None:
            self._live.update(self._render())

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        self._last[trial.trial_id] = result
        self._trials[trial.trial_id] = trial
        self._redraw()

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._done.add(trial.trial_id)
        self._status[trial.trial_id] = stop_reason(self._last.get(trial.trial_id) or {}, self.stop)
        if self.per_trial and trial.trial_id in self._last:  # an early stop frees the rest of its budget
            total = self._progress.tasks[0].total
            used = max(0.0, keys.number(keys.lookup(self._last[trial.trial_id], self.unit)))
            if total is not None and used < self.per_trial:
                self._progress.update(self._task, total=max(self._done_so_far(), total - (self.per_trial - used)))
        self._redraw()

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._status[trial.trial_id] = "error (Tune retries if it can)"
        self._redraw()

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self._stop()
