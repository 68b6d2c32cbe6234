"""What the driver prints (rayrl.observe.progress, .live, rayrl.sweep.closing), without Ray."""

from __future__ import annotations

import io
import math
from types import SimpleNamespace

import pytest

from rayrl import runfolder
from rayrl.errors import SpecError
from rayrl.observe import keys
from rayrl.observe import progress as P
from rayrl.observe.live import LiveView, budget_of, live_ok
from rayrl.observe.output import OUTPUT, apply_output, set_output
from rayrl.sweep.closing import closing_summary
from rayrl.sweep.confirm_run import ConfirmStopper


@pytest.fixture(autouse=True)
def normal_output():
    set_output("normal", 30.0)
    yield
    set_output("normal", 30.0)


def result(it: int, steps: float, ret: float = math.nan) -> dict:
    return {
        keys.ITERATION: it,
        keys.ENV_STEPS: steps,
        keys.ENV_STEPS_PER_S: 1000.0,
        "rayrl": {"train_return": ret},
    }


def trial(tid: str) -> SimpleNamespace:
    return SimpleNamespace(trial_id=tid, config={"train_batch_size_per_learner": 256, "lr": 1e-3})


def feed(printer: P.ProgressPrinter, n: int, stop_at: float | None = None) -> None:
    t = trial("a1")
    for i in range(1, n + 1):
        printer.on_trial_result(i, [], t, result(i, 256.0 * i, 20.0 + i))
    if stop_at is not None:
        printer.on_trial_complete(n, [], t)


def test_normal_mode_prints_trial_events_not_iterations(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(P.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    printer = P.ProgressPrinter("search", show_config=True, stream=out, stop={keys.ENV_STEPS: 2560})
    printer.setup(total_num_samples=4)
    t = trial("a1")
    for i in range(1, 11):  # a result every 10 s
        now[0] = 10.0 * i
        printer.on_trial_result(i, [], t, result(i, 256.0 * i, 20.0 + i))
    printer.on_trial_complete(10, [], t)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 + 3 + 1, lines  # first result, a progress line at 30, 60, 90 s, the end
    assert "a1 batch 256 lr 1.00e-03 | iter 1 |" in lines[0]
    assert "trials: 1 running, 0 finished of 4" in lines[1] and "best return" in lines[1]
    assert "trial a1 finished: used its 2,560 env-step budget" in lines[-1]


def test_verbose_prints_every_result_and_quiet_nothing():
    out = io.StringIO()
    set_output("verbose")
    feed(P.ProgressPrinter("train", stream=out), 7)
    assert len(out.getvalue().splitlines()) == 7
    out = io.StringIO()
    set_output("quiet")
    feed(P.ProgressPrinter("train", stream=out, stop={}), 7, stop_at=0)
    assert out.getvalue() == ""


def test_stop_reasons_name_the_criterion_that_applied():
    stop = {keys.ENV_STEPS: 1000, keys.TRAIN_RETURN: 450}
    assert P.stop_reason(result(3, 1024, 100.0), stop) == "used its 1,000 env-step budget"
    assert P.stop_reason(result(3, 512, 451.0), stop) == "reached the target return 450"
    assert "stopped early by the scheduler" in P.stop_reason(result(3, 512, 100.0), stop)
    assert P.stop_reason(result(3, 512), {keys.ITERATION: 3}) == "ran its 3 iterations"
    confirm = ConfirmStopper(
        [(1, 256, 1e-3, 7)],
        [7],
        objective="env_steps",
        return_key=keys.TRAIN_RETURN,
        target=450.0,
        budget=4000,
        held=None,  # type: ignore[arg-type]
        prices=None,  # type: ignore[arg-type]
    )
    assert P.stop_reason(result(8, 4100, 90.0), confirm) == "used its 4,000 env-step budget"
    assert "confirmation race" in P.stop_reason(result(2, 900, 30.0), confirm)


def test_the_flags_set_the_mode_and_a_bad_interval_is_refused():
    apply_output(SimpleNamespace(output="quiet", progress_every=5.0))
    assert (OUTPUT.mode, OUTPUT.every_s) == ("quiet", 5.0)
    with pytest.raises(SpecError, match="--progress-every: 0"):
        apply_output(SimpleNamespace(output="normal", progress_every=0))


def test_live_view_only_on_a_terminal_and_its_bar_counts_the_phase_budget():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert not live_ok(io.StringIO()) and live_ok(Tty())
    set_output("verbose")
    assert not live_ok(Tty())  # verbose keeps the per-iteration lines
    assert budget_of({keys.ENV_STEPS: 5000}, None) == (keys.ENV_STEPS, 5000.0)
    assert budget_of({keys.ITERATION: 4}, 9.0) == (keys.ITERATION, 4.0)
    assert budget_of(SimpleNamespace(criteria=lambda: {keys.ENV_STEPS: 4000.0}), 9e5) == (keys.ENV_STEPS, 4000.0)
    set_output("normal")
    screen = Tty()
    view = LiveView("search", show_config=True, stream=screen, stop={keys.ENV_STEPS: 1000})
    view.setup(total_num_samples=2)
    view.on_trial_result(1, [], trial("a1"), result(1, 500, 30.0))
    view.on_trial_complete(1, [], trial("a1"))  # an early stop frees the rest of its budget
    assert view._progress.tasks[0].total == 1500
    view.on_experiment_end([])
    text = " ".join(screen.getvalue().split())
    assert "a1" in text and "ETA" in text and "500/1,500 env steps" in text and "stopped early by" in text


def test_closing_summary_names_every_phase_the_choice_and_the_files(tmp_path):
    summary = {
        "wall_s": 63.7,
        "env_steps_total": 81409,
        "knee_batch_size": 1024,
        "stopped_early": 1,
        "best": {"batch_size": 512, "lr": 8.46e-4, "episode_return_mean": 480.0, "confirmed": True},
        "confirm": {
            "objective": "env_steps",
            "seeds": [1000, 2000],
            "target_return": 450.0,
            "chosen": 2,
            "candidates": [
                {"candidate": 1, "phase2_trial_id": "spec", "batch_size": 2048, "lr": 3e-4, "median": None}
                | {"score": None, "score_k": 2}
                | {"ci_low": None, "ci_high": None, "reached": 0, "runs": 2, "median_return": 120.0},
                {"candidate": 2, "phase2_trial_id": "75e8", "batch_size": 512, "lr": 8.46e-4, "median": 9241}
                | {"score": 9500, "score_k": 2}
                | {"ci_low": 8000, "ci_high": 11000, "reached": 2, "runs": 2, "median_return": 480.0},
            ],
        },
    }
    ladder = [runfolder.LadderRow(512, 2589.8, None, "expand"), runfolder.LadderRow(1024, 3501.5, 0.352, "stop")]
    trials = [
        {"trial_id": "75e8", "batch_size": 512, "lr": 8.46e-4, "env_steps": 9241.0}
        | {"episode_return_mean": 500.0, "status": "reached_target"},
        {"trial_id": "d7e5", "batch_size": 256, "lr": 1.25e-4, "env_steps": 16218.0}
        | {"episode_return_mean": 203.3, "status": "completed"},
    ]
    text = closing_summary(summary, ladder, trials, tmp_path)
    lines = text.splitlines()
    assert lines[0] == "[sweep] done in 64s, 81,409 env steps"
    assert any(line.split() == ["1024", "3,502", "+35%", "stop"] for line in lines)
    assert text.index("75e8") < text.index("d7e5")  # the search's best first
    chosen = next(line for line in lines if line.lstrip().startswith("*"))
    assert "score = the cost within which 2 of 2 seeds got there" in text
    assert chosen.split()[:6] == ["*", "75e8", "512", "8.46e-04", "9500", "9241"] and "8000 .. 1.1e+04" in chosen
    spec_row = next(line for line in lines if line.split()[:1] == ["spec"])
    assert spec_row.split()[3:8] == ["inf", "inf", "inf", "..", "inf"]  # null in summary.json: a cost past a miss
    assert f"train it: rayrl train --config {tmp_path / 'best_config.yaml'}" in text
    assert f"rayrl report {tmp_path}" in text


def test_closing_summary_shows_the_searched_fields_and_a_win_by_the_tie(tmp_path):
    summary = {
        "wall_s": 10.0,
        "env_steps_total": 5000,
        "best": {"batch_size": 2048, "lr": 3e-4, "gamma": 0.99, "hidden": "[64, 64]", "confirmed": True}
        | {"episode_return_mean": 470.0},
        "confirm": {"spec_won_by_tie": True, "tie": 0.1, "candidates": []},
    }
    trials = [
        {"trial_id": "a1", "batch_size": 256, "lr": 1e-3, "env_steps": 9000.0, "episode_return_mean": 480.0}
        | {"status": "reached_target", "gamma": 0.9712345, "hidden": "[64, 64]"},
    ]
    lines = closing_summary(summary, [], trials, tmp_path).splitlines()
    header = next(line for line in lines if line.split()[:3] == ["trial", "batch", "lr"])
    assert header.split()[3:5] == ["gamma", "hidden"]
    row = next(line for line in lines if line.split()[:1] == ["a1"])
    assert row.split()[3:6] == ["0.9712", "[64,", "64]"]
    best = next(line for line in lines if line.startswith("best:"))
    assert "gamma 0.99 hidden [64, 64]" in best and "more than 10% cheaper, so the spec's own ships" in best


def test_a_restored_tuner_gets_this_starts_printer_history_writer_and_disk_guard(tmp_path):
    """Tune restores the callbacks pickled with the experiment, with the old machine's paths and, from
    an older rayrl, fewer fields (tests/test_old_layout.py found both); refresh_callbacks swaps rayrl's
    machine-bound ones for this start's and keeps the rest. A real Tuner, no Ray cluster needed."""
    from ray import tune

    from rayrl.faults.preemption import FailureBudget
    from rayrl.storage.guard import DiskGuard
    from rayrl.tune.tuner import refresh_callbacks

    old_printer = P.ProgressPrinter.__new__(P.ProgressPrinter)
    old_printer.__dict__.update(label="search", show_config=True, stream=None, _start=0.0)  # an older rayrl's
    budget = FailureBudget(10, 3600.0)
    stale = [old_printer, P.HistoryWriter("/elsewhere/history.csv", "search"), DiskGuard(tmp_path / "old"), budget]
    tuner = tune.Tuner(
        lambda config: {"x": 1},
        run_config=tune.RunConfig(name="t", storage_path=str(tmp_path), callbacks=stale),
    )
    fresh = [P.ProgressPrinter("search"), P.HistoryWriter(tmp_path / "history.csv", "search"), DiskGuard(tmp_path)]
    refresh_callbacks(tuner, fresh)
    callbacks = tuner._local_tuner.get_run_config().callbacks
    assert callbacks[:3] == fresh and callbacks[3:] == [budget]  # the failure budget's state is the run's
