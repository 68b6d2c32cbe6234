"""`rayrl plan` on a run folder with known timers: the measured inputs, plan.json and the errors (no Ray)."""

import json

import plan_run
import pytest
import yaml

from rayrl import cli
from rayrl.scale import measure

ROW_KEYS = (
    "gpus",
    "nodes",
    "env_steps_per_s",
    "efficiency",
    "usd_per_hour",
    "usd_per_million_samples",
    "hours_to_target",
    "usd_to_target",
)


def test_measure_reads_the_steady_timers_and_the_target(tmp_path):
    run = plan_run.write_run(tmp_path / "run")
    m, sources = measure.measure(run)
    # The warm-up iteration (5 s, 3 s) is left out; RLlib's EMA is undone.
    assert m.sample_s == pytest.approx(plan_run.SAMPLE_S) and m.learn_s == pytest.approx(plan_run.LEARN_S)
    assert (m.batch_per_learner, m.minibatch, m.epochs, m.env_runners) == (1000, 250, 2, 2)
    assert m.grad_bytes == 9155 * 4 and sources["trial"] == plan_run.TRIAL
    # One point (batch 1000, 3000 steps) and the default critical batch (search.doubling.cap).
    assert m.env_steps_to_target == pytest.approx(plan_run.STEPS_AT_TARGET) and m.critical_batch == 16384
    # Two iterations: the warm-up one must still be left out (a median of both would say 2.75 s).
    short, _ = measure.measure(plan_run.write_run(tmp_path / "short", iterations=2))
    assert short.sample_s == pytest.approx(plan_run.SAMPLE_S)


def test_plan_writes_rows_and_a_schedule_that_never_exceeds_2x(tmp_path, capsys):
    run = plan_run.write_run(tmp_path / "run")
    (tmp_path / "hand.yaml").write_text(yaml.safe_dump(plan_run.CLUSTER))
    code = cli.main(
        [
            "plan",
            str(run),
            "--gpus",
            "6",
            "--cluster",
            str(tmp_path / "hand.yaml"),
            "--grad-bytes",
            "1e9",
            "--deadline",
            "1",
        ]
    )
    assert code == 0
    plan = json.loads((run / "plan.json").read_text())
    assert [r["gpus"] for r in plan["rows"]] == [1, 2, 4, 6]
    assert all(set(ROW_KEYS) <= set(r) for r in plan["rows"])
    assert plan["measured"]["env_steps_per_s_per_runner"] == pytest.approx(1000.0)
    assert plan["measured"]["learner_samples_per_s_per_gpu"] == pytest.approx(1000.0)
    one, two = plan["rows"][0], plan["rows"][1]
    assert one["env_steps_per_s"] == pytest.approx(500.0) and one["usd_per_hour"] == pytest.approx(4.0)
    assert two["env_steps_per_s"] == pytest.approx(2000 / 2.08016)
    assert one["hours_to_target"] == pytest.approx(3000 / 500 / 3600)
    assert one["usd_to_target"] == pytest.approx(4.0 * 3000 / 500 / 3600)
    steps = plan["schedule"]
    assert steps and all(s["to_gpus"] <= 2 * s["from_gpus"] for s in steps)
    assert [s["decision"] for s in steps] == ["grow", "stop"]  # 2 -> 4 crosses nodes at 10 GB/s: slower
    assert plan["fewest_gpus_meeting_deadline"] == 1 and (run / "plan.png").stat().st_size > 0
    # Time to target: 1.92x the throughput, but 1.12207/1.06104 x the env steps (critical batch 16384).
    assert steps[0]["predicted_gain"] == pytest.approx(
        (2000 / 2.08016 / 500) * (1 + 1000 / 16384) / (1 + 2000 / 16384) - 1
    )
    assert "1 -> 2 GPUs: predicted gain +82% in hours_to_target -> grow" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gpus", "0"], "--gpus: 0 is not a size"),
        (["--deadline", "-1"], "--deadline: -1.0 must be a finite number > 0"),
        (["--cluster", "tpu-pod"], "neither a file nor a preset"),
    ],
)
def test_plan_bad_input_exits_2_with_one_paragraph(tmp_path, capsys, argv, message):
    run = plan_run.write_run(tmp_path / "run")
    assert cli.main(["plan", str(run), *argv]) == 2
    assert message in capsys.readouterr().err.replace("\n", " ")
    assert not (run / "plan.json").exists()


def test_plan_on_a_folder_without_tune_files_says_what_is_missing(tmp_path, capsys):
    run = plan_run.write_run(tmp_path / "run")
    (run / "tune" / f"PPO_{plan_run.TRIAL}" / "progress.csv").unlink()
    assert cli.main(["plan", str(run)]) == 2
    assert "no Tune progress.csv with RLlib's iteration timers" in capsys.readouterr().err.replace("\n", " ")
    assert cli.main(["plan", str(tmp_path / "nowhere")]) == 2
