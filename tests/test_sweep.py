"""The sweep end to end: the run folder contract, the rule in doubling.csv, resume, HyperBand, Ray Jobs."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import RAY, ROOT, ray_head, submit_job, subprocess_env

from rayrl import runfolder
from rayrl import spec as S
from rayrl.sweep import config as sweep
from rayrl.sweep import confirm_run

SWEEP = [sys.executable, str(ROOT / "experiments" / "sweep.py")]
SMOKE_MIN_RETURN = 60.0  #: random play scores about 22; see check_confirmation


def readme_sweep() -> list[str]:
    """The README quick start's main job, as the user types it (`python experiments/sweep.py`)."""
    from test_readme import main_job_command

    program, *args = main_job_command()
    assert program == "python"
    return [sys.executable, *args]


def run_sweep(storage: Path, name: str, *extra: str, timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [*readme_sweep(), "--smoke", "--storage", str(storage), "--name", name, "--num-cpus", "2", *extra],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


def check_run_folder(run: Path, *, scheduler: str = "asha", confirmed: bool = True) -> dict:
    """Every file and column of the run folder contract, and the doubling rule in doubling.csv."""
    doubling = pd.read_csv(run / "doubling.csv", keep_default_na=False)
    assert list(doubling.columns) == ["batch_size", "env_steps_per_s", "gain", "decision"]
    assert doubling["gain"].iloc[0] == ""
    assert set(doubling["decision"]) <= {"expand", "stop", "cap", "failed"}
    spec = S.load(run / "spec.yaml")
    d = spec.search.doubling
    assert doubling["batch_size"].iloc[0] == d.start
    assert list(doubling["batch_size"]) == [d.start * d.factor**i for i in range(len(doubling))]
    decisions = list(doubling["decision"])
    assert all(x == "expand" for x in decisions[:-1]) and decisions[-1] in ("stop", "cap", "failed")
    for _, row in doubling.iloc[1:].iterrows():
        if row["decision"] == "expand":
            assert float(row["gain"]) >= d.min_gain
    last = doubling.iloc[-1]
    if last["decision"] == "stop":
        assert float(last["gain"]) < d.min_gain
    if last["decision"] == "cap":
        assert last["batch_size"] * d.factor > d.cap
    kept = doubling[doubling["decision"].isin(["expand", "cap"])]
    knee = int(kept["batch_size"].iloc[-1])
    history = pd.read_csv(run / "history.csv")
    check_ladder_against_history(doubling, history, d)

    trials = pd.read_csv(run / "trials.csv")
    assert list(trials.columns) == ["trial_id", "batch_size", "lr", "env_steps", "episode_return_mean", "status"]
    assert len(trials) == spec.search.num_samples
    assert trials["batch_size"].max() <= knee
    below = [b for b in (d.start // d.factor**i for i in range(1, 12)) if b >= spec.search.min_batch]
    assert set(trials["batch_size"]) <= set(doubling["batch_size"]) | set(below)
    assert ((trials["lr"] >= spec.search.lr_min) & (trials["lr"] <= spec.search.lr_max)).all()
    assert set(trials["status"]) <= {"reached_target", "completed", "stopped_early", "error"}
    assert (trials["env_steps"] <= spec.search.max_env_steps + 4 * knee).all()

    summary = json.loads((run / "summary.json").read_text())
    assert summary["knee_batch_size"] == knee
    assert summary["scheduler"] == scheduler
    best = summary["best"]
    assert set(best) >= {"batch_size", "lr", "episode_return_mean"}
    if confirmed:
        check_confirmation(run, spec, trials, summary)
    else:  # no confirmation: phase 2's single best run is shipped
        assert not (run / "confirm.csv").exists() and summary["confirm"] is None
        reached = trials[trials["status"] == "reached_target"]
        if len(reached):  # the fewest env steps to the target wins
            assert best["env_steps"] == reached["env_steps"].min() and best["trial_id"] in set(reached["trial_id"])
        else:
            usable = trials[trials["status"] != "error"]  # errored trials are never shipped
            assert best["episode_return_mean"] == pytest.approx(usable["episode_return_mean"].max())
    assert summary["trials"] == len(trials)
    assert summary["stopped_early"] == int((trials["status"] == "stopped_early").sum())
    assert summary["env_steps_total"] >= trials["env_steps"].sum()
    assert summary["wall_s"] > 0

    best_spec = S.load(run / "best_config.yaml")  # a full spec `rayrl train --config` accepts
    assert best_spec.algo.train_batch_per_learner == best["batch_size"]
    assert best_spec.algo.lr == pytest.approx(best["lr"])

    assert set(history["phase"]) == {"ladder", "search", *(["confirm"] if confirmed else [])}
    assert (history["env_steps_per_s"] > 0).all()

    from ray.tune import ExperimentAnalysis

    assert len(ExperimentAnalysis(str(run / "phase2")).trials) == len(trials)
    return summary


def check_ladder_against_history(doubling: pd.DataFrame, history: pd.DataFrame, d: S.DoublingSpec) -> None:
    """Each rung's figure is the median env steps/s of its measured iterations, recomputed here from
    history.csv (not read from the gain column the sweep wrote), and each decision follows from it."""
    rungs = history[history["phase"] == "ladder"].drop_duplicates(["trial_id", "training_iteration"], keep="last")
    medians = []
    for row in doubling.itertuples():
        h = rungs[rungs["batch_size"] == row.batch_size].sort_values("training_iteration")
        measured = h[
            (h["training_iteration"] > d.warmup_iters) & (h["training_iteration"] <= d.warmup_iters + d.measure_iters)
        ]["env_steps_per_s"]
        assert len(measured) == d.measure_iters, f"rung {row.batch_size}: {len(measured)} measured iterations"
        medians.append(float(measured.median()))
        assert float(row.env_steps_per_s) == pytest.approx(medians[-1], abs=0.01)
    for i, row in enumerate(doubling.itertuples()):
        fits = row.batch_size * d.factor <= d.cap
        if i == 0:
            expected = "expand" if fits else "cap"
        else:
            gain = medians[i] / medians[i - 1] - 1.0
            assert float(row.gain) == pytest.approx(gain, abs=1e-4)
            expected = "stop" if gain < d.min_gain else ("expand" if fits else "cap")
        assert row.decision == expected, (row.batch_size, medians, row.decision, expected)


def check_confirmation(run: Path, spec: S.Spec, trials: pd.DataFrame, summary: dict) -> None:
    """Phase 2's top configs re-ran on seeds phase 2 never used; the lowest score (the cost within which
    ceil(search.confirm_quantile x n) of the n seeds reached the target, recomputed here from confirm.csv)
    is the shipped config; with no score, the lowest median, then the median return."""
    from ray.tune import ExperimentAnalysis

    s = spec.search
    runs = pd.read_csv(run / "confirm.csv")
    phase2_seeds = {t.config.get("seed") for t in ExperimentAnalysis(str(run / "phase2")).trials}
    assert phase2_seeds == {spec.seed}
    assert set(runs["seed"]).isdisjoint(phase2_seeds) and runs["seed"].nunique() == s.confirm_seeds
    usable = trials[(trials["status"] != "error") & trials["episode_return_mean"].notna()]
    reached = usable[usable["status"] == "reached_target"].sort_values(
        ["env_steps", "episode_return_mean"], ascending=[True, False]
    )
    rest = usable[usable["status"] != "reached_target"].sort_values("episode_return_mean", ascending=False)
    top = pd.concat([reached, rest]).drop_duplicates(["batch_size", "lr"]).head(s.confirm_top_k)
    expected = list(top["trial_id"])
    own = (top["batch_size"] == spec.algo.train_batch_per_learner) & (top["lr"] - spec.algo.lr).abs().lt(1e-12)
    if s.confirm_baseline and not own.any():  # the spec's own config runs on the same fresh seeds, last
        expected.append("spec")
        base = runs[runs["phase2_trial_id"] == "spec"]
        assert set(base["batch_size"]) == {spec.algo.train_batch_per_learner}
        assert base["lr"].tolist() == pytest.approx([spec.algo.lr] * s.confirm_seeds)
    assert list(runs.groupby("candidate")["phase2_trial_id"].first()) == expected
    assert len(runs) == len(expected) * s.confirm_seeds
    assert (runs.groupby("candidate")["seed"].nunique() == s.confirm_seeds).all()
    target = spec.stop.episode_return
    assert (runs["reached"] == (runs["episode_return_mean"] >= target)).all()
    budget = s.confirm_env_steps or s.max_env_steps
    assert (runs["env_steps"] <= budget + 4 * runs["batch_size"]).all()
    # why each run ended: at the target, the budget, or the race (its config could no longer win)
    assert set(runs["stopped"]) <= set(runfolder.CONFIRM_STOPPED)
    assert ((runs["stopped"] == "target") == runs["reached"]).all()
    assert (runs.loc[runs["stopped"] == "budget", "env_steps"] >= budget).all()
    assert (runs.loc[runs["stopped"] == "race", "env_steps"] < budget).all()
    assert summary["confirm"]["runs_cut_by_race"] == int((runs["stopped"] == "race").sum())
    assert summary["confirm"]["race"] == s.confirm_race
    costs = runs[s.objective].where(runs["reached"], float("inf"))
    k = math.ceil(s.confirm_quantile * s.confirm_seeds - 1e-9)
    med = (
        runs.assign(cost=costs)
        .groupby("candidate")
        .agg(
            cost=("cost", "median"),
            score=("cost", lambda c: sorted(c)[k - 1]),
            ret=("episode_return_mean", "median"),
        )
    )
    if math.isfinite(med["score"].min()):
        chosen = med.sort_values("score", kind="stable").index[0]
    else:
        chosen = med.sort_values(["cost", "ret"], ascending=[True, False], kind="stable").index[0]
    pick = runs[runs["candidate"] == chosen].iloc[0]
    best = summary["best"]
    assert best["confirmed"] and summary["confirm"]["chosen"] == chosen
    assert (best["batch_size"], best["lr"]) == (pick["batch_size"], pytest.approx(pick["lr"]))
    assert best["episode_return_mean"] == pytest.approx(med.loc[chosen, "ret"])
    lo, hi = best["ci95_cost"]
    if math.isfinite(med.loc[chosen, "cost"]):
        assert best["median_cost"] == pytest.approx(med.loc[chosen, "cost"]) and lo <= best["median_cost"] <= hi
    else:
        assert best["median_cost"] is None
    score = med.loc[chosen, "score"]
    assert best["score_cost"] == (pytest.approx(score) if math.isfinite(score) else None)
    assert best["score_seeds"] == f"{k}/{s.confirm_seeds}"
    # The sweep learns: its best phase-2 trial (16,000 env steps in the smoke) scores far above random
    # play (about 22 on CartPole), so a sweep that never learns fails here.
    # The bar is CartPole's; other envs' smoke sweeps (MuJoCo, Atari, long episodes) have their own tests.
    if spec.env.id == "CartPole-v1":
        assert trials["episode_return_mean"].max() >= SMOKE_MIN_RETURN, trials


def _trial(tid: str, steps: int | None, ret: float | None, status: str) -> dict:
    return {
        "trial_id": tid,
        "batch_size": 2048,
        "lr": 1e-4,
        "env_steps": steps,
        "episode_return_mean": ret,
        "status": status,
    }


def test_best_is_the_fewest_env_steps_to_the_target():
    trials = [
        _trial("a", 90_000, 478.0, "reached_target"),
        _trial("b", 60_000, 452.0, "reached_target"),
        _trial("c", 100_000, 499.0, "completed"),
        _trial("d", 40_000, 500.0, "error"),
    ]
    assert runfolder.rank_trials(trials)[0]["trial_id"] == "b"
    trials.append(_trial("e", 60_000, 460.0, "reached_target"))  # same env steps: the higher return
    assert runfolder.rank_trials(trials)[0]["trial_id"] == "e"


def test_best_without_a_trial_at_the_target_is_the_highest_return():
    trials = [
        _trial("a", 100_000, 210.0, "completed"),
        _trial("b", 30_000, 95.0, "stopped_early"),
        _trial("c", 100_000, 330.0, "completed"),
        _trial("d", 10_000, None, "stopped_early"),
        _trial("e", 50_000, 480.0, "error"),
    ]
    assert runfolder.rank_trials(trials)[0]["trial_id"] == "c"
    assert runfolder.rank_trials([_trial("x", None, None, "error")]) == [] and runfolder.rank_trials([]) == []


@pytest.mark.slow
def test_smoke_sweep_writes_the_contract_and_resumes(tmp_path):
    first = run_sweep(tmp_path, "smoke")
    assert "[sweep] done" in first.stdout and "[ladder" in first.stdout
    run = tmp_path / "smoke"
    # What a log of the sweep holds (stdout is a pipe here, as under `ray job submit` or CI): trial
    # events and progress lines, not one line per iteration; nothing points into Ray's session folder.
    lines = first.stdout.splitlines()
    assert len(lines) <= 120, f"{len(lines)} lines:\n" + "\n".join(lines[:40])
    assert not [line for line in lines if "/ray/session_" in line or "invalid value" in line]
    assert "invalid value" not in first.stderr and "on the new API stack" not in first.stdout + first.stderr
    assert "max_concurrent_trials" not in first.stderr  # the confirmation's limit is its generator's own
    assert f"train it: rayrl train --config {run / 'best_config.yaml'}" in first.stdout
    assert "finished: " in first.stdout and "ladder (env steps/s per batch size" in first.stdout
    summary = check_run_folder(run)
    trials_before = (run / "trials.csv").read_text()
    confirm_before = (run / "confirm.csv").read_text()
    doubling_before = (run / "doubling.csv").read_text()

    again = run_sweep(tmp_path, "smoke", timeout=300)
    assert "ladder already finished" in again.stdout
    assert "[ladder" not in again.stdout  # no rung ran again
    assert "[search" not in again.stdout  # finished trials are not rerun
    assert "confirm already finished" in again.stdout and "[confirm" not in again.stdout
    assert (run / "confirm.csv").read_text() == confirm_before
    assert json.loads((run / "summary.json").read_text())["best"] == summary["best"]
    assert (run / "doubling.csv").read_text() == doubling_before
    assert sorted((run / "trials.csv").read_text().splitlines()) == sorted(trials_before.splitlines())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_smoke_sweep_on_a_terminal_shows_the_live_view(tmp_path):
    import os
    import pty

    leader, follower = pty.openpty()
    cmd = [*readme_sweep(), "--smoke", "--storage", str(tmp_path), "--name", "tty", "--num-cpus", "2"]
    env = {**subprocess_env(), "COLUMNS": "120", "TERM": "xterm"}
    proc = subprocess.Popen(cmd, env=env, stdin=follower, stdout=follower, stderr=follower, cwd=ROOT)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the terminal closed: the sweep exited
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    screen = b"".join(chunks).decode(errors="replace")
    assert screen.count("ETA") >= 3 and "\u2501" in screen  # redrawn frames with rich's progress bar
    assert "\x1b[" in screen  # drawn in place (cursor movement), not appended as lines
    for phase in ("ladder", "search", "confirm"):
        assert phase in screen
    assert "train it: rayrl train --config" in screen  # the closing summary after the last frame


@pytest.mark.slow
def test_smoke_sweep_with_hyperband(tmp_path):
    run_sweep(
        tmp_path,
        "hb",
        "--set",
        "search.scheduler=hyperband",
        "--set",
        "search.confirm_top_k=0",
        "--set",
        "search.num_samples=2",
        "--set",
        "search.doubling.cap=1024",
    )
    check_run_folder(tmp_path / "hb", scheduler="hyperband", confirmed=False)


def test_smoke_overrides_are_validated_on_the_smoke_budgets():
    """--smoke --set search.doubling.cap=1024 is valid (the smoke ladder starts at 512), and still checked."""
    config = str(ROOT / "experiments" / "configs" / "cartpole_ppo.yaml")
    spec = sweep.load_spec(config, ["search.doubling.cap=1024", "search.confirm_top_k=0"], tiny=True)
    assert (spec.search.doubling.start, spec.search.doubling.cap, spec.search.confirm_top_k) == (512, 1024, 0)
    assert spec.search.max_env_steps == 16000 and confirm_run.confirm_budget(spec.search) == 4000
    with pytest.raises(S.SpecError, match="search.doubling.cap"):
        sweep.load_spec(config, ["search.doubling.cap=256"], tiny=True)
    with pytest.raises(S.SpecError, match="search.doubling.cap"):  # without --smoke the file's ladder starts at 2048
        sweep.load_spec(config, ["search.doubling.cap=1024"])
    unbudgeted = sweep.load_spec(config, ["search.max_env_steps=50000", "search.grace_env_steps=10000"])
    assert unbudgeted.search.confirm_env_steps is None and confirm_run.confirm_budget(unbudgeted.search) == 50000


def test_smoke_samples_and_evaluates_in_the_trial_so_the_pong_gpu_preset_fits_two_cpus():
    config = str(ROOT / "experiments" / "configs" / "atari_pong_appo_gpu.yaml")
    cpu = ["resources.learners=0", "resources.gpus_per_learner=0", "resources.env_runners=1"]
    assert sweep.load_spec(config, cpu).evaluation.env_runners == 2  # the preset's own evaluation runners
    spec = sweep.load_spec(config, cpu, tiny=True)
    assert (spec.resources.env_runners, spec.evaluation.env_runners) == (1, 0)
    assert spec.evaluation.interval == 20  # evaluation stays on: only where it runs changes
    assert sweep.load_spec(config, [*cpu, "evaluation.env_runners=1"], tiny=True).evaluation.env_runners == 1


def test_sweep_rejects_bad_input_before_ray(tmp_path):
    proc = subprocess.run(
        [*SWEEP, "--set", "search.doubling.min_gain=-1", "--storage", str(tmp_path)],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert "search.doubling.min_gain" in proc.stderr and "Traceback" not in proc.stderr
    assert "Started a local Ray" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_ray_job_submit_runs_the_smoke_sweep(tmp_path):
    """`ray start --head` in its own process group, then `ray job submit --working-dir .`."""
    env = subprocess_env(RAY_AUTH_MODE="token")
    with ray_head(env, num_cpus=2, tag="job") as head:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            ping = subprocess.run(
                [RAY, "job", "list", "--address", head.dashboard], env=env, capture_output=True, text=True, timeout=60
            )
            if ping.returncode == 0:
                break
            time.sleep(2)
        else:
            pytest.fail(f"the head's Jobs API did not come up within 300 s (head alive: {head.process.poll() is None})")
        storage = tmp_path / "runs"
        submit = [
            RAY,
            "job",
            "submit",
            "--address",
            head.dashboard,
            "--working-dir",
            ".",
            "--",
            "python",
            "experiments/sweep.py",
            "--smoke",
            "--storage",
            str(storage),
            "--name",
            "job",
            "--set",
            "search.confirm_top_k=0",
            "--set",
            "search.num_samples=2",
            "--set",
            "search.doubling.cap=1024",
        ]
        proc = submit_job(submit, env, timeout=600, cwd=ROOT)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        job_id = re.search(r"raysubmit_\w+", proc.stdout + proc.stderr).group(0)
        status = subprocess.run(
            [RAY, "job", "status", "--address", head.dashboard, job_id],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert re.search(r"job '\w+' succeeded", status.stdout + status.stderr, re.I), status.stdout
        assert "Started a local Ray" not in proc.stdout  # it joined the cluster
        check_run_folder(storage / "job", confirmed=False)


@pytest.mark.slow
def test_first_rung_failure_is_a_clear_error(tmp_path):
    """A ladder whose first rung fails ends the sweep with a message, not a traceback."""
    (tmp_path / "bad").mkdir()
    proc = subprocess.run(
        [
            *SWEEP,
            "--smoke",
            "--storage",
            str(tmp_path),
            "--name",
            "bad",
            "--num-cpus",
            "2",
            "--set",
            f"env.id={'tests.broken_env:make'}",
        ],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Tune logs the trial's own traceback; the sweep's last word is one clear paragraph.
    final = proc.stderr[proc.stderr.rindex("sweep: error:") :]
    assert "first rung" in final and "Traceback" not in final
    ladder = pd.read_csv(tmp_path / "bad" / "doubling.csv", keep_default_na=False)
    assert list(ladder["decision"]) == ["failed"]
    yaml.safe_load((tmp_path / "bad" / "spec.yaml").read_text())


@pytest.mark.slow
def test_a_trial_larger_than_the_local_ray_is_a_clear_error_not_a_wait(tmp_path):
    """Tune would wait forever for 3 CPUs on a 2-CPU local Ray; the sweep says so and exits 1 (~15 s)."""
    proc = subprocess.run(
        [
            *SWEEP,
            "--smoke",
            "--storage",
            str(tmp_path),
            "--name",
            "big",
            "--num-cpus",
            "2",
            "--set",
            "evaluation.interval=1",
            "--set",
            "evaluation.env_runners=2",
        ],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    said = " ".join(proc.stderr.split())
    assert "one trial needs 3 CPUs (the cluster has 2)" in said and "Traceback" not in proc.stderr
    assert not (tmp_path / "big" / "phase1").exists()  # no trial was queued
