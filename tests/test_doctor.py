"""`rayrl doctor`: each rule fires on synthetic results that show its symptom, and only then (no Ray)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from test_report import LADDER, history_rows, sweep_history, write_run

from rayrl import runfolder
from rayrl.judge import doctor
from rayrl.judge.doctor import Evidence


def frame(*groups: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([row for g in groups for row in g], columns=list(runfolder.HISTORY_COLUMNS))


def healthy() -> pd.DataFrame:
    return frame(history_rows("a", "train", 4096, 3e-4, 10, 1000.0, 400.0, num_learners=1))


def ladder(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["batch_size", "env_steps_per_s", "gain", "decision"])


# ---------------------------------------------------------------------------------------------
# communication bound


def test_communication_bound_fires_when_more_learners_add_little():
    h = frame(
        history_rows("n1", "train", 4096, 3e-4, 8, 1000.0, 400.0, num_learners=1),
        history_rows("n2", "train", 4096, 3e-4, 8, 1100.0, 400.0, num_learners=2),
    )
    f = doctor.communication_bound(Evidence(history=h))
    assert f is not None and f.rule == "communication bound"
    assert "1 -> 2 learners" in f.symptom and "+10%" in f.symptom
    assert "NCCL" in f.fix and "fewer learners" in f.fix and "larger batch" in f.fix


def test_communication_bound_silent_when_learners_scale_or_only_one_count():
    h = frame(
        history_rows("n1", "train", 4096, 3e-4, 8, 1000.0, 400.0, num_learners=1),
        history_rows("n2", "train", 4096, 3e-4, 8, 1900.0, 400.0, num_learners=2),
    )
    assert doctor.communication_bound(Evidence(history=h)) is None
    assert doctor.communication_bound(Evidence(history=healthy())) is None


# ---------------------------------------------------------------------------------------------
# non-finite loss


def test_nonfinite_loss_fires_on_skipped_steps_or_infinite_loss():
    rows = history_rows("a", "train", 4096, 3e-4, 6, 1000.0, 400.0)
    rows[-1]["nonfinite_steps"] = 7
    f = doctor.nonfinite_loss(Evidence(history=frame(rows)))
    assert f is not None and "trial a: 7 non-finite steps skipped" in f.symptom
    assert "1.0" in f.fix and "lower the lr" in f.fix
    rows = history_rows("b", "train", 4096, 3e-4, 6, 1000.0, 400.0)
    rows[3]["total_loss"] = math.inf
    f = doctor.nonfinite_loss(Evidence(history=frame(rows)))
    assert f is not None and "1 iterations with an infinite loss" in f.symptom


def test_nonfinite_loss_silent_on_clean_results_and_unreported_loss():
    rows = history_rows("a", "train", 4096, 3e-4, 6, 1000.0, 400.0, total_loss=math.nan)
    assert doctor.nonfinite_loss(Evidence(history=frame(rows))) is None
    assert doctor.nonfinite_loss(Evidence(history=healthy())) is None


# ---------------------------------------------------------------------------------------------
# uneven scheduling


def test_uneven_scheduling_fires_on_gpu_swings_over_20_percent():
    rows = history_rows("a", "train", 4096, 3e-4, 10, 1000.0, 400.0)
    for i, row in enumerate(rows):
        row["gpu_util"] = 0.95 if i % 2 else 0.55
    f = doctor.uneven_scheduling(Evidence(history=frame(rows)))
    assert f is not None and "GPU utilisation swings by 40%" in f.symptom
    assert "fair-share" in f.fix and "fewer" in f.fix


def test_uneven_scheduling_uses_cpu_without_gpus_and_ignores_warmup_and_small_swings():
    rows = history_rows("a", "train", 4096, 3e-4, 10, 1000.0, 400.0)
    for i, row in enumerate(rows):
        row["cpu_util"] = 0.1 if i == 0 else 0.80 + 0.05 * (i % 3)  # only the warm-up iteration is low
    assert doctor.uneven_scheduling(Evidence(history=frame(rows))) is None
    for i, row in enumerate(rows):
        row["cpu_util"] = [0.3, 0.9, 0.6][i % 3]
    f = doctor.uneven_scheduling(Evidence(history=frame(rows)))
    assert f is not None and "CPU utilisation" in f.symptom


# ---------------------------------------------------------------------------------------------
# slow or failed restores


def test_slow_restores_fires_on_slow_failed_or_incomplete_restores():
    slow = Evidence(history=healthy(), drills=[{"name": "kill_node", "recovery_s": 420.0, "outcome": "recovered"}])
    f = doctor.slow_restores(slow)
    assert f is not None and "kill_node took 420 s" in f.symptom
    assert "local SSD" in f.fix and "asynchronously" in f.fix
    failed = Evidence(history=healthy(), drills=[{"name": "kill_trial", "recovery_s": None, "outcome": "failed"}])
    assert "failed: kill_trial" in doctor.slow_restores(failed).symptom
    assert doctor.slow_restores(Evidence(history=healthy(), restore_rate=0.5)) is not None


def test_slow_restores_silent_on_fast_recoveries_or_no_drills():
    fast = Evidence(
        history=healthy(), drills=[{"name": "kill_trial", "recovery_s": 40.0, "outcome": "recovered"}], restore_rate=1.0
    )
    assert doctor.slow_restores(fast) is None
    assert doctor.slow_restores(Evidence(history=healthy())) is None


# ---------------------------------------------------------------------------------------------
# ladder stopping at its first rung


def test_env_runner_bound_fires_when_the_first_doubling_did_not_pay():
    d = ladder([(2048, 1000.0, None, "expand"), (4096, 1050.0, 0.05, "stop")])
    f = doctor.env_runner_bound(Evidence(history=healthy(), doubling=d))
    assert f is not None and "batch 2048 -> 4096 gained +5%" in f.symptom
    assert "env runners" in f.fix and "envs per runner" in f.fix


def test_env_runner_bound_silent_when_the_ladder_climbed_or_failed():
    assert doctor.env_runner_bound(Evidence(history=healthy(), doubling=ladder(LADDER))) is None
    failed = ladder([(2048, 1000.0, None, "expand"), (4096, None, None, "failed")])
    assert doctor.env_runner_bound(Evidence(history=healthy(), doubling=failed)) is None
    assert doctor.env_runner_bound(Evidence(history=healthy(), doubling=None)) is None


# ---------------------------------------------------------------------------------------------
# the table and the CLI


def test_every_rule_is_in_the_table_and_a_healthy_run_has_no_finding():
    assert len(doctor.RULES) == 5
    assert doctor.diagnose(Evidence(history=healthy(), doubling=ladder(LADDER))) == []
    assert "no problem found by the 5 rules" in doctor.render([])


def test_doctor_cli_on_run_folders(tmp_path, capsys):
    one = write_run(
        tmp_path / "n1",
        kind="train",
        history=frame(history_rows("x", "train", 4096, 3e-4, 8, 1000.0, 400.0, num_learners=1)),
    )
    two = write_run(
        tmp_path / "n2",
        kind="train",
        history=frame(history_rows("x", "train", 4096, 3e-4, 8, 1020.0, 400.0, num_learners=2)),
        drill={"drills": [{"name": "kill_node", "recovery_s": 600.0, "outcome": "recovered"}], "restore_rate": 1.0},
    )
    assert doctor.main([str(one), str(two)]) == 0
    out = capsys.readouterr().out
    assert "2 finding(s)" in out and "communication bound" in out and "slow or failed checkpoint restores" in out
    # Same trial id in two runs stays two trials.
    assert set(doctor.evidence([str(one), str(two)]).history["trial_id"]) == {"n1/x", "n2/x"}


def test_doctor_cli_sweep_stalled_at_first_rung(tmp_path, capsys):
    root = write_run(
        tmp_path / "s", history=sweep_history(), ladder=[(2048, 1000.0, None, "expand"), (4096, 1010.0, 0.01, "stop")]
    )
    assert doctor.main([str(root)]) == 0
    assert "env runners are the bottleneck" in capsys.readouterr().out


def test_doctor_cli_bad_folder_exits_2(tmp_path, capsys):
    assert doctor.main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rayrl doctor: error:") and "Traceback" not in err
    from rayrl import cli

    assert cli.main(["doctor", str(tmp_path / "missing")]) == 2


@pytest.mark.parametrize("name, rule", doctor.RULES)
def test_rules_are_pure(name, rule):
    ev = Evidence(history=healthy(), doubling=ladder(LADDER))
    before = ev.history.copy()
    rule(ev)
    pd.testing.assert_frame_equal(ev.history, before)
