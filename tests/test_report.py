"""`rayrl report`: each acceptance check's PASS / FAIL / N/A, the run folder reader, the CLI (no Ray)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from rayrl import runfolder
from rayrl.judge import acceptance, evaluation, plots, report
from rayrl.judge.acceptance import FAIL, NA, PASS, Thresholds
from rayrl.judge.folder import RunFolderError, best_trial_id, knee_batch, ladder_rows, load, subject_history
from rayrl.observe import keys
from rayrl.runfolder import knee

# ---------------------------------------------------------------------------------------------
# Synthetic run folders (the contract in docs/observability.md); test_doctor.py uses them too.

SPEC = {
    "name": "synthetic",
    "env": {"id": "CartPole-v1"},
    "algo": {"name": "PPO", "lr": 3e-4},
    "resources": {"env_runners": 2, "learners": 0, "gpus_per_learner": 0.0},
    "stop": {"env_steps": 100000, "episode_return": 400.0},
    "search": {"doubling": {"min_gain": 0.15}},
    "cost": {"gpu_hour_usd": 3.0, "cpu_hour_usd": 0.05},
}
LADDER = [(2048, 1000.0, None, "expand"), (4096, 1400.0, 0.40, "expand"), (8192, 1450.0, 0.0357, "stop")]


def history_rows(
    trial_id: str, phase: str, batch: int, lr: float, iters: int, sps: float, final_return: float, **cols: float
) -> list[dict]:
    rows = []
    for i in range(1, iters + 1):
        row = {c: math.nan for c in runfolder.HISTORY_COLUMNS}
        row.update(
            {
                "trial_id": trial_id,
                "phase": phase,
                "batch_size": batch,
                "lr": lr,
                keys.ITERATION: i,
                "env_steps": batch * i,
                "episode_return_mean": final_return * min(1.0, 0.5 + i / (2 * iters)),
                "env_steps_per_s": sps * (1 + 0.01 * (i % 3)),
                "learner_samples_per_s": 5 * sps,
                "total_loss": 1.0 / i + 0.01 * ((i * 7) % 3),
                "grad_norm": 0.5,
                "loss_scale": math.nan,
                "nonfinite_steps": 0,
                "time_total_s": batch * i / sps,
                "cpu_util": 0.5 + 0.01 * (i % 2),
                "mem_util": 0.40,
                "gpu_util": math.nan,
                "gpu_mem_util": math.nan,
                "net_util": math.nan,
                "num_learners": 0,
                "backend": "none",
                "precision": "fp32",
            }
        )
        row.update(cols)
        rows.append(row)
    return rows


# Phase-2 trials (lr, final return, iterations) at batch 4096 against SPEC's target of 400: t1 and t3
# reach it, t3 with the higher return but 4 more iterations (16,384 more env steps). The sweep ships
# the fewest-env-steps trial, t1; a highest-return rule would pick t3.
TRIALS = [(1e-4, 300.0, 12), (3e-4, 450.0, 12), (1e-3, 200.0, 12), (5e-4, 480.0, 16)]


def sweep_history() -> pd.DataFrame:
    rows = []
    for n, (batch, sps, _, _) in enumerate(LADDER):
        rows += history_rows(f"rung{n}", "ladder", batch, 3e-4, 4, sps, 50.0)
    for n, (lr, ret, iters) in enumerate(TRIALS):
        rows += history_rows(f"t{n}", "search", 4096, lr, iters, 1400.0, ret)
    return pd.DataFrame(rows, columns=list(runfolder.HISTORY_COLUMNS))


def write_run(
    root: Path,
    kind: str = "sweep",
    history: pd.DataFrame | None = None,
    spec: dict | None = None,
    drill: dict | None = None,
    ladder: list | None = None,
    summary: dict | None = None,
) -> Path:
    """A complete run folder of ``kind`` (sweep or train) under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "spec.yaml").write_text(yaml.safe_dump(spec or SPEC))
    if kind == "sweep":
        h = sweep_history() if history is None else history
        d = pd.DataFrame(ladder or LADDER, columns=["batch_size", "env_steps_per_s", "gain", "decision"])
        d.to_csv(root / "doubling.csv", index=False)
        search = h[h["phase"] == "search"]
        trials = search.groupby("trial_id").agg(
            batch_size=("batch_size", "first"),
            lr=("lr", "first"),
            env_steps=("env_steps", "max"),
            episode_return_mean=("episode_return_mean", "last"),
        )
        target = ((spec or SPEC).get("stop") or {}).get("episode_return")
        trials["status"] = [
            "reached_target" if target is not None and r >= target else "completed"
            for r in trials["episode_return_mean"]
        ]
        trials = trials.reset_index()
        trials.to_csv(root / "trials.csv", index=False)
        best_row = runfolder.rank_trials(trials.to_dict("records"))[
            0
        ]  # the sweep's own rule: fewest env steps to the target
        summary = summary or {
            "kind": "sweep",
            "knee_batch_size": 4096,
            "best": {
                "batch_size": int(best_row["batch_size"]),
                "lr": float(best_row["lr"]),
                "episode_return_mean": float(best_row["episode_return_mean"]),
            },
            "env_steps_total": int(h.groupby("trial_id")["env_steps"].max().sum()),
            "wall_s": 100.0,
            "trials": len(trials),
            "stopped_early": 1,
            "resources": {"gpus_per_trial": 0, "cpus_per_trial": 3},
        }
        (root / "best_config.yaml").write_text(yaml.safe_dump({**SPEC, "algo": {"lr": 3e-4}}))
    else:
        h = pd.DataFrame(history_rows("train0", "train", 4096, 3e-4, 20, 1400.0, 450.0)) if history is None else history
        summary = summary or {
            "kind": "train",
            "env_steps": int(h["env_steps"].max()),
            "wall_s": 60.0,
            "resources": {"gpus_per_trial": 0, "cpus_per_trial": 3},
        }
    h.to_csv(root / "history.csv", index=False)
    (root / "summary.json").write_text(json.dumps(summary))
    if drill is not None:
        (root / "drill.json").write_text(json.dumps(drill))
    return root


def verdicts(checks):
    return {c.name: c.verdict for c in checks}


# ---------------------------------------------------------------------------------------------
# Hardware


def test_gpu_utilisation_pass_fail_na():
    assert acceptance.check_gpu_util([0.95, 0.91, 0.93]).verdict == PASS
    c = acceptance.check_gpu_util([0.95, 0.70, 0.80])
    assert c.verdict == FAIL and c.measured == "81.7%" and c.threshold == ">= 90.0%"
    na = acceptance.check_gpu_util([math.nan, math.nan])
    assert na.verdict == NA and "no GPU" in na.measured


def test_memory_judges_the_worse_of_gpu_and_host():
    assert acceptance.check_memory([0.80, 0.90], [0.40]).verdict == PASS
    c = acceptance.check_memory([0.80, 0.96], [0.40])
    assert c.verdict == FAIL and c.measured == "GPU 96.0%, host 40.0%"
    assert acceptance.check_memory([math.nan], [0.97]).verdict == FAIL  # host memory alone, no GPU
    assert acceptance.check_memory([math.nan], [math.nan]).verdict == NA


def test_network_pass_fail_na():
    assert acceptance.check_network([0.10, 0.79]).verdict == PASS
    assert acceptance.check_network([0.10, 0.81]).verdict == FAIL
    assert acceptance.check_network([math.nan]).verdict == NA


# ---------------------------------------------------------------------------------------------
# Training


def test_throughput_against_the_expected_figure():
    assert acceptance.check_throughput(950.0, 1000.0, "ladder rung 4096").verdict == PASS  # within 10%
    c = acceptance.check_throughput(850.0, 1000.0, "ladder rung 4096")
    assert c.verdict == FAIL and c.measured == "850" and c.threshold.startswith(">= 900")
    assert acceptance.check_throughput(850.0, None, "no expected figure: set it").verdict == NA
    assert acceptance.check_throughput(850.0, 1000.0, "x", Thresholds(env_steps_per_s_tolerance=0.2)).verdict == PASS


def test_loss_spikes_ignore_a_trend_and_catch_a_jump():
    trend = [10.0 - 0.5 * i + 0.05 * ((i * 7) % 5) for i in range(20)]
    assert acceptance.loss_spikes(trend) == []
    spiked = list(trend)
    spiked[12] += 5.0
    assert acceptance.loss_spikes(spiked) == [12]
    assert acceptance.loss_spikes([1.0, 1.0, math.inf, 1.0, 1.0, 1.0]) == [2]
    assert acceptance.loss_spikes([1.0, math.nan, 1.0, 1.0, 1.0, 1.0]) == []  # NaN: not reported
    # A real PPO CartPole loss curve from a smoke sweep: noisy, no spike.
    ppo = [0.042, 0.088, 0.11, 0.108, 0.11, 0.074, 0.091, 0.119, 0.064, 0.031, 0.032, 0.112, 0.099, 0.135, 0.148]
    assert acceptance.loss_spikes(ppo) == []
    ppo[9] = 0.9
    assert acceptance.loss_spikes(ppo) == [9]


def test_loss_check_pass_fail_na():
    smooth = [1.0 / i for i in range(1, 15)]
    assert acceptance.check_loss({"a": smooth}).verdict == PASS
    bad = list(smooth)
    bad[8] = 3.0
    c = acceptance.check_loss({"a": smooth, "b": bad})
    assert c.verdict == FAIL and c.measured.startswith("1 spikes in 28 points") and "b: points [8]" in c.measured
    assert acceptance.check_loss({"a": [1.0, 2.0]}).verdict == NA


# ---------------------------------------------------------------------------------------------
# Reward


def test_return_against_target():
    assert acceptance.check_return(451.0, 450.0).verdict == PASS
    assert acceptance.check_return(449.0, 450.0).verdict == FAIL
    assert acceptance.check_return(449.0, None).verdict == NA
    assert acceptance.check_return(math.nan, 450.0).verdict == NA


def test_stability_coefficient_of_variation():
    assert acceptance.return_cv([100.0, 100.0, 100.0])[0] == 0.0
    cv, n = acceptance.return_cv([0.0] * 5 + [90.0, 110.0] * 5, window=10)
    assert n == 10 and cv == pytest.approx(0.1)
    assert acceptance.check_stability([450.0, 455.0, 448.0, 452.0]).verdict == PASS
    c = acceptance.check_stability([100.0, 300.0, 200.0, 400.0])
    assert c.verdict == FAIL and c.measured.startswith("0.447")
    assert acceptance.check_stability([100.0, math.nan]).verdict == NA


# ---------------------------------------------------------------------------------------------
# Cost and fault tolerance


def test_cost_needs_ten_percent_below_baseline():
    assert acceptance.check_cost(0.89e-6, 1e-6, "knee vs first").verdict == PASS
    c = acceptance.check_cost(0.95e-6, 1e-6, "knee vs first")
    assert c.verdict == FAIL and c.measured.startswith("-5.0%")
    assert acceptance.check_cost(None, None, "no baseline: pass --baseline").verdict == NA


def test_fault_tolerance_from_drills():
    good = {
        "drills": [
            {"name": "kill_trial", "recovery_s": 42.0, "outcome": "recovered"},
            {"name": "kill_node", "recovery_s": 180.0, "outcome": "recovered"},
        ],
        "restore_rate": 1.0,
    }
    assert acceptance.check_recovery(good).verdict == PASS and acceptance.check_recovery(good).measured == "180.0 s"
    assert acceptance.check_restore(good).verdict == PASS
    slow = {"drills": [{"name": "kill_node", "recovery_s": 301.0, "outcome": "recovered"}], "restore_rate": 1.0}
    assert acceptance.check_recovery(slow).verdict == FAIL
    failed = {
        "drills": [
            {"name": "a", "recovery_s": 10.0, "outcome": "recovered"},
            {"name": "b", "recovery_s": None, "outcome": "failed"},
        ]
    }
    c = acceptance.check_recovery(failed)
    assert c.verdict == FAIL and "failed: b" in c.measured
    r = acceptance.check_restore(failed)  # no restore_rate: recovered / run = 50%
    assert r.verdict == FAIL and r.measured == "50.0%"
    assert acceptance.check_recovery(None).verdict == NA and "rayrl drill" in acceptance.check_recovery(None).measured
    assert acceptance.check_restore(None).verdict == NA


def test_checkpoints_kept_reads_the_train_summarys_counts():
    """summary.json's ``checkpoints`` (the tiered trainable's counts): a skipped checkpoint or a restart
    from iteration 0 fails the fault-tolerance part; retried upload failures alone do not."""
    from rayrl.train.run import checkpoint_counts

    metrics = {"rayrl": {"checkpoint_uploads": 12, "checkpoint_upload_failures": 4, "checkpoints_skipped": 0}}
    counts = checkpoint_counts(metrics)
    assert counts == {
        "uploaded": 12,
        "upload_failures": 4,
        "skipped": 0,
        "pending": 0,
        "tier1_reuploads": 0,
        "restarted_fresh": 0,
        "restored_newer_than_registered": 0,
    }
    c = acceptance.check_checkpoints(counts)
    assert c.verdict == PASS and c.part == "fault tolerance"
    assert c.measured == "12 uploaded, 4 failed attempts (retried), 0 skipped, 0 re-uploaded from tier 1"
    assert acceptance.check_checkpoints({**counts, "skipped": 2}).verdict == FAIL
    fresh = acceptance.check_checkpoints({**counts, "restarted_fresh": 1})
    assert fresh.verdict == FAIL and "started over from iteration 0" in fresh.measured
    assert checkpoint_counts({"training_iteration": 3}) is None  # Tune's own persistence: not counted
    assert acceptance.check_checkpoints(None).verdict == NA


def test_part_verdicts():
    C = acceptance.Check
    checks = [
        C("hardware", "a", "", "", NA),
        C("hardware", "b", "", "", PASS),
        C("training", "c", "", "", FAIL),
        C("training", "d", "", "", PASS),
        C("reward", "e", "", "", NA),
    ]
    assert acceptance.part_verdicts(checks) == {
        "hardware": PASS,
        "training": FAIL,
        "reward": NA,
        "cost": NA,
        "fault tolerance": NA,
    }


def test_thresholds_from_the_spec_acceptance_block(tmp_path):
    def thresholds(block):
        spec = dict(SPEC, acceptance=block) if block is not None else SPEC
        return load(write_run(tmp_path / f"r{len(list(tmp_path.iterdir()))}", spec=spec)).sections["acceptance"]

    assert thresholds(None) == Thresholds()
    t = thresholds({"gpu_util_min": 0.8, "env_steps_per_s": 5000, "return_cv_window": 5})
    assert t.gpu_util_min == 0.8 and t.env_steps_per_s == 5000 and t.return_cv_window == 5
    with pytest.raises(RunFolderError, match="gpu_utilization.*valid"):
        thresholds({"gpu_utilization": 0.8})
    with pytest.raises(RunFolderError, match="not a number"):
        thresholds({"gpu_util_min": "high"})


# ---------------------------------------------------------------------------------------------
# Reading run folders


def test_load_a_sweep_and_find_its_best_trial(tmp_path):
    run = load(write_run(tmp_path / "s"))
    assert run.kind == "sweep" and len(run.doubling) == 3 and len(run.trials) == 4
    # t3 returned most (480) but needed 65,536 env steps; t1 reached the target (400) in 49,152.
    assert run.trials.set_index("trial_id")["status"].to_dict() == {
        "t0": "completed",
        "t1": "reached_target",
        "t2": "completed",
        "t3": "reached_target",
    }
    assert run.summary["best"] == {"batch_size": 4096, "lr": 3e-4, "episode_return_mean": 450.0}
    assert best_trial_id(run) == "t1"  # matched on batch size and lr
    run.summary["best"]["trial_id"] = "t0"
    assert best_trial_id(run) == "t0"  # the summary's trial_id wins
    run.summary["best"] = {}
    assert (
        best_trial_id(run) == "t1"
    )  # no summary: runfolder.rank_trials over trials.csv, fewest env steps to the target
    # the spec's own config won the confirmation (it never ran in phase 2): its first run at the target
    run.summary["best"] = {"trial_id": "spec", "batch_size": 2048, "lr": 1e-3}
    run.confirm = pd.DataFrame(
        {
            "phase2_trial_id": ["t1", "spec", "spec", "spec"],
            "seed": [1000, 1000, 2000, 3000],
            "trial_id": ["c0", "c1", "c2", "c3"],
            "reached": [True, False, True, True],
        }
    )
    assert best_trial_id(run) == "c2"
    run.summary["best"] = {}
    assert knee_batch(run) == 4096 and knee(ladder_rows(run.doubling)) == 4096
    assert set(subject_history(run)["trial_id"]) == {"t1"}
    assert run.resources.cpus == 3 and run.target_return == 400.0


def test_ladder_knee_reading():
    def d(rows: list[tuple]) -> list[runfolder.LadderRow]:
        return ladder_rows(pd.DataFrame(rows, columns=list(runfolder.DOUBLING_COLUMNS)))

    assert knee(d([(2048, 1, None, "expand"), (4096, 1.1, 0.1, "stop")])) == 2048
    assert knee(d([(2048, 1, None, "expand"), (4096, 2, 1.0, "expand"), (8192, 4, 1.0, "cap")])) == 8192
    assert knee(d([(2048, 1, None, "expand"), (4096, None, None, "failed")])) == 2048
    assert d([(2048, 1, None, "expand")]) == [runfolder.LadderRow(2048, 1.0, None, "expand")]


def test_history_written_before_the_phase_rename_reads_with_todays_names(tmp_path):
    """history.csv from before the layout move calls the ladder "doubling": read as "ladder"."""
    rows = history_rows("rung0", "doubling", 2048, 3e-4, 4, 1000.0, 50.0)
    rows += history_rows("t0", "search", 2048, 3e-4, 4, 1000.0, 300.0)
    run = load(write_run(tmp_path / "old", history=pd.DataFrame(rows, columns=list(runfolder.HISTORY_COLUMNS))))
    assert set(run.history["phase"]) == {"ladder", "search"}


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: (p / "spec.yaml").unlink(), "spec.yaml: missing"),
        (lambda p: (p / "summary.json").write_text("{not json"), "summary.json: is not valid JSON"),
        (lambda p: (p / "history.csv").write_text("trial_id,phase\nx,train\n"), "history.csv: lacks column"),
        (lambda p: (p / "history.csv").write_text(""), "history.csv: is empty"),
        (
            lambda p: (p / "doubling.csv").write_text("batch_size,env_steps_per_s,gain,decision\n2048,1,,grow\n"),
            "decision.*grow",
        ),
        (lambda p: (p / "trials.csv").unlink(), "trials.csv: missing"),
        (lambda p: (p / "spec.yaml").write_text("a: [1"), "spec.yaml: is not valid YAML"),
        (lambda p: (p / "drill.json").write_text('{"drills": [{"name": "x", "outcome": "ok"}]}'), "drills\\[0\\]"),
        (lambda p: (p / "summary.json").write_text('{"kind": "sweep"}'), "knee_batch_size"),
    ],
)
def test_damaged_folders_raise_a_clear_error(tmp_path, damage, message):
    root = write_run(tmp_path / "s")
    damage(root)
    with pytest.raises(RunFolderError, match=message):
        load(root)


def test_missing_folder(tmp_path):
    with pytest.raises(RunFolderError, match="no such run folder"):
        load(tmp_path / "nope")


# ---------------------------------------------------------------------------------------------
# evaluate(): the five parts on whole run folders


def test_evaluate_a_sweep(tmp_path):
    run = load(write_run(tmp_path / "s"))
    checks = evaluation.evaluate(run)
    v = verdicts(checks)
    assert v["GPU utilisation (mean)"] == NA  # CPU run
    assert v["memory (peak)"] == PASS  # host 40%
    assert v["network (peak of link speed)"] == NA
    thr = next(c for c in checks if c.part == "training" and "env steps" in c.name)
    assert thr.verdict == PASS and "ladder rung 4096" in thr.threshold
    assert v["loss without spikes"] == PASS
    assert v["episode return (final)"] == PASS  # 450 >= 400
    assert v["return stability (CV, last 10)"] == FAIL  # the synthetic curve still climbs: CV ~0.15
    costc = next(c for c in checks if c.part == "cost")
    # The best trial's batch 4096 ran 1400 env steps/s on the ladder vs the first rung's 1000 at the
    # same resources: -28.6%.
    assert costc.verdict == PASS and costc.measured.startswith("-28.6%")
    assert "best batch 4096 vs first rung 2048" in costc.measured
    assert [c.verdict for c in checks if c.part == "fault tolerance"] == [NA, NA]


def test_evaluate_a_train_run_with_a_sweep_baseline_and_drills(tmp_path):
    sweep = load(write_run(tmp_path / "s"))
    h = pd.DataFrame(
        history_rows("tr", "train", 4096, 3e-4, 20, 800.0, 450.0, gpu_util=0.95, gpu_mem_util=0.5, net_util=0.9)
    )
    drill = {"drills": [{"name": "kill_trial", "recovery_s": 30.0, "outcome": "recovered"}], "restore_rate": 1.0}
    train = load(write_run(tmp_path / "t", kind="train", history=h, drill=drill))
    v = verdicts(evaluation.evaluate(train, baseline=sweep))
    assert v["GPU utilisation (mean)"] == PASS
    assert v["network (peak of link speed)"] == FAIL
    assert v["env steps/s (median)"] == FAIL  # 800 vs the ladder's 1400 at batch 4096
    assert v["cost per effective sample vs baseline"] == FAIL  # slower at the same price: dearer
    assert v["recovery time (worst drill)"] == PASS and v["checkpoint restore rate"] == PASS
    costc = next(c for c in evaluation.evaluate(train, baseline=sweep) if c.part == "cost")
    # Same resources: a median 808 steps/s against the first rung's 1000 steps/s is 23.8% dearer.
    assert costc.measured.startswith("+23.8%") and "t at 808 steps/s vs first rung 2048 of s" in costc.measured
    alone = verdicts(evaluation.evaluate(train))
    assert alone["env steps/s (median)"] == NA and alone["cost per effective sample vs baseline"] == NA
    # Against another train run: 1400 steps/s vs 1000 at the same resources is 28.6% cheaper.
    slow = load(
        write_run(
            tmp_path / "slow",
            kind="train",
            history=pd.DataFrame(history_rows("x", "train", 4096, 3e-4, 20, 1000.0, 450.0)),
        )
    )
    fast = load(write_run(tmp_path / "fast", kind="train"))
    c = next(c for c in evaluation.evaluate(fast, baseline=slow) if c.part == "cost")
    assert c.verdict == PASS and c.measured.startswith("-28.")


def test_acceptance_block_overrides_the_expected_throughput(tmp_path):
    spec = {**SPEC, "acceptance": {"env_steps_per_s": 2000}}
    run = load(write_run(tmp_path / "s", spec=spec))
    c = next(c for c in evaluation.evaluate(run) if c.name == "env steps/s (median)")
    assert c.verdict == FAIL and "acceptance.env_steps_per_s" in c.threshold


# ---------------------------------------------------------------------------------------------
# The CLI


def test_report_writes_every_section_and_plots(tmp_path, capsys):
    root = write_run(tmp_path / "s")
    assert report.main([str(root)]) == 0
    text = (root / "report.md").read_text()
    for section in (
        "## Summary",
        "## Acceptance",
        "## Cost",
        "## Throughput ladder",
        "## Trials",
        "## Training",
        "## Fault tolerance",
        "## Plots",
    ):
        assert section in text
    for part in acceptance.PARTS:
        assert f"| {part} |" in text
    for png in ("doubling.png", "trials.png", "lr_return.png", "training.png"):
        data = (root / "plots" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        assert f"(plots/{png})" in text
    assert (
        capsys.readouterr()
        .out.strip()
        .endswith("report.md: hardware PASS, training PASS, reward FAIL, cost PASS, fault tolerance N/A")
    )
    assert report.main([str(root), "--strict"]) == 1  # stability fails on the synthetic run


def test_report_on_a_train_run_says_what_does_not_apply(tmp_path):
    root = write_run(tmp_path / "t", kind="train")
    out = tmp_path / "elsewhere"
    assert report.main([str(root), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert "Not applicable: a train run has no doubling ladder" in text and (out / "plots/training.png").exists()
    assert not (root / "report.md").exists()


def test_report_on_a_bad_folder_exits_2_writes_nothing(tmp_path, capsys):
    root = write_run(tmp_path / "s")
    (root / "report.md").write_text("previous report")
    (root / "history.csv").write_text("trial_id\n1\n")
    before = sorted(p.name for p in root.rglob("*"))
    assert report.main([str(root)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("rayrl report: error:") and "history.csv: lacks column" in err and "Traceback" not in err
    assert (root / "report.md").read_text() == "previous report"
    assert sorted(p.name for p in root.rglob("*")) == before
    assert report.main([str(tmp_path / "missing")]) == 2
    assert "no such run folder" in " ".join(capsys.readouterr().err.split())


def test_cli_dispatches_report(tmp_path):
    from rayrl import cli

    assert cli.main(["report", str(write_run(tmp_path / "s"))]) == 0
    assert cli.main(["report", str(tmp_path / "missing")]) == 2


def test_nonfinite_numbers_do_not_break_the_report(tmp_path):
    h = sweep_history()
    h.loc[h["trial_id"] == "t1", "total_loss"] = np.inf
    root = write_run(tmp_path / "s", history=h)
    assert report.main([str(root)]) == 0
    text = (root / "report.md").read_text()
    # 11 points: the warm-up iteration is not judged.
    assert "| training | loss without spikes | 0 rises > median + 6 MAD of changes | 11 spikes in 11 points" in text
    assert "| iterations | 12 |" in text


def test_report_without_matplotlib_still_writes_the_tables(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    root = write_run(tmp_path / "s")
    assert report.main([str(root)]) == 0
    text = (root / "report.md").read_text()
    assert "no plots: matplotlib is not installed" in text and "## Acceptance" in text
    assert not (root / "plots" / "doubling.png").exists()


def test_plots_of_data_a_run_lacks_say_so(tmp_path):
    run = load(write_run(tmp_path / "t", kind="train"))
    for plot, message in (
        (plots.plot_doubling, "no doubling ladder (not a sweep)"),
        (plots.plot_lr_return, "no search trials"),
    ):
        ax = plot(run)
        assert [t.get_text() for t in ax.texts] == [message] and not ax.lines and not ax.collections


def test_lr_plot_tick_labels_do_not_collide_and_the_legend_names_what_matters(tmp_path):
    """A narrow lr range (what a smoke sweep searches) once printed every minor tick's label on the log
    axis, running into each other; the legend names each batch size, the best trial and the target."""
    rows = history_rows("rung0", "doubling", 2048, 3e-4, 4, 1000.0, 50.0)
    for n, lr in enumerate((1.2e-4, 1.6e-4, 2.7e-4)):
        rows += history_rows(f"t{n}", "search", 2048 * (1 + n % 2), lr, 6, 1000.0, 100.0 + 50 * n)
    spec = {**SPEC, "search": {"doubling": {"min_gain": 0.15}, "lr_min": 1e-4, "lr_max": 3e-4}}
    run = load(
        write_run(tmp_path / "s", history=pd.DataFrame(rows, columns=list(runfolder.HISTORY_COLUMNS)), spec=spec)
    )
    ax = plots.plot_lr_return(run)
    ax.figure.draw_without_rendering()
    lo, hi = ax.get_xlim()
    labels = [
        t
        for t in ax.get_xticklabels(which="both")
        if t.get_visible() and t.get_text() and lo <= t.get_position()[0] <= hi
    ]
    assert len(labels) >= 2, [t.get_text() for t in labels]
    boxes = sorted((t.get_window_extent() for t in labels), key=lambda b: b.x0)
    assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:])), [t.get_text() for t in labels]
    assert lo <= 1e-4 and hi >= 3e-4  # the whole searched range is shown
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["batch 2048", "batch 4096", "best t2", "target return 400"], legend


def test_trial_and_training_plots_name_every_line_and_what_was_not_measured(tmp_path):
    run = load(write_run(tmp_path / "s"))
    legend = [t.get_text() for t in plots.plot_trial_curves(run).get_legend().get_texts()]
    assert legend == [
        "t0: lr 1.0e-04, batch 4096",
        "t1: lr 3.0e-04, batch 4096 (best)",
        "t2: lr 1.0e-03, batch 4096",
        "t3: lr 5.0e-04, batch 4096",
        "target return 400",
    ], legend
    fig = plots.figures(run)["training.png"]
    ret, rate, _, hardware = fig.axes
    assert [t.get_text() for t in rate.get_legend().get_texts()] == [
        "env steps/s (end to end)",
        "learner samples/s (epochs included)",
    ]
    assert "target return 400" in [t.get_text() for t in ret.get_legend().get_texts()]
    assert [t.get_text() for t in hardware.texts] == ["not measured: GPU, GPU memory, network (of link speed)"]
    assert hardware.get_ylabel() == "utilisation (fraction, 0..1)"
