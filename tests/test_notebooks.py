"""The analysis notebooks and `rayrl report` / `rayrl doctor` against real smoke runs.

A session fixture runs the smoke sweep (experiments/sweep.py --smoke, about 3 minutes on 2 cores)
and a short `rayrl train` of the sweep's best config once; the slow tests share those folders.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
NAMES = ("sweep_analysis.ipynb", "training_analysis.ipynb")


def _run(cmd: list[str], log: Path, timeout: int) -> None:
    env = {**os.environ, "RAYRL_DASHBOARD": "0", "PYTHONUNBUFFERED": "1"}
    with log.open("w") as out:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-40:])
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}:\n{tail}")


@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"sweep": folder, "train": folder}: a smoke sweep, then its best config trained briefly."""
    storage = tmp_path_factory.mktemp("runs")
    _run(
        [
            sys.executable,
            "experiments/sweep.py",
            "--smoke",
            "--name",
            "sweep",
            "--storage",
            str(storage),
            "--num-cpus",
            "2",
        ],
        storage / "sweep.log",
        timeout=1200,
    )
    _run(
        [
            sys.executable,
            "-m",
            "rayrl.cli",
            "train",
            "--config",
            str(storage / "sweep" / "best_config.yaml"),
            "--name",
            "train",
            "--storage",
            str(storage),
            "--num-cpus",
            "2",
            "--set",
            "stop.env_steps=12000",
            "--set",
            "stop.episode_return=null",
        ],
        storage / "train.log",
        timeout=900,
    )
    return {"sweep": storage / "sweep", "train": storage / "train"}


def expected_verdicts(run_dir: Path, baseline_dir: Path | None = None) -> dict[str, str]:
    """Three acceptance verdicts worked out by hand from the run folder's files and spec.yaml's thresholds.

    memory: the peak of host and GPU memory against mem_util_max. Throughput: the median env steps/s of
    the judged rows (the best trial of a sweep, a train run's trial; past the warm-up) against the
    ladder's rung at that batch size, less the tolerance. Cost: USD per sample = hourly price of the
    trial's resources / env steps per second; a sweep's best batch (from its ladder) or a train run's
    median against the first rung of the sweep's ladder.
    """
    import json

    import pandas as pd
    import yaml

    spec = yaml.safe_load((run_dir / "spec.yaml").read_text())
    t, prices = spec["acceptance"], spec["cost"]
    summary = json.loads((run_dir / "summary.json").read_text())
    h = pd.read_csv(run_dir / "history.csv")
    if summary["kind"] == "sweep":
        best = str(summary["best"]["trial_id"])
        if best == "spec":  # the spec's own config won the confirmation: its first run at the target speaks
            runs = pd.read_csv(run_dir / "confirm.csv")
            runs = runs[runs["phase2_trial_id"].astype(str) == best].sort_values(
                ["reached", "seed"], ascending=[False, True]
            )
            best = str(runs.iloc[0]["trial_id"])
        h = h[h["trial_id"].astype(str) == best]
    later = h[h["training_iteration"] > t["warmup_iters"]]
    h = later if not later.empty else h
    ladder = pd.read_csv((baseline_dir or run_dir) / "doubling.csv")
    res = summary["resources"]
    hourly = (res["gpus_per_trial"] * prices["gpu_hour_usd"] + res["cpus_per_trial"] * prices["cpu_hour_usd"]) * (
        1 - prices["spot_discount"]
    )

    memory = pd.concat([h["mem_util"], h["gpu_mem_util"]]).dropna()
    rung = ladder.set_index("batch_size")["env_steps_per_s"]
    measured = h["env_steps_per_s"].median()
    # Phase 2 also searches batches below the ladder (search.min_batch): no rung there, no expected figure.
    expected = rung.get(int(h["batch_size"].mode().iloc[0]))
    ours = rung.get(int(summary["best"]["batch_size"])) if summary["kind"] == "sweep" else measured
    base = hourly / rung.iloc[0]
    cost = hourly / ours if ours is not None else None
    return {
        "memory (peak)": "PASS" if memory.max() < t["mem_util_max"] else "FAIL",
        "env steps/s (median)": "N/A"
        if expected is None
        else "PASS"
        if measured >= expected * (1 - t["env_steps_per_s_tolerance"])
        else "FAIL",
        "cost per effective sample vs baseline": "N/A"
        if cost is None
        else "PASS"
        if (cost - base) / base <= -t["cost_reduction_min"]
        else "FAIL",
    }


def execute(name: str, run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> nbformat.NotebookNode:
    from nbclient import NotebookClient

    monkeypatch.setenv("RAYRL_RUN_DIR", str(run_dir))
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return nb


def outputs(nb: nbformat.NotebookNode, kind: str) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if kind in o.get("data", {})]


def errors(nb: nbformat.NotebookNode) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]


@pytest.mark.parametrize("name", NAMES)
def test_notebooks_are_committed_without_outputs_and_read_rayrl_run_dir(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert 'os.environ.get("RAYRL_RUN_DIR"' in code[0].source and "RUN_DIR =" in code[0].source
    assert "from rayrl.judge import" in code[0].source  # uses rayrl's functions, not copies
    assert sum(c.cell_type == "markdown" for c in nb.cells) >= 3


@pytest.mark.slow
def test_sweep_notebook_on_a_smoke_sweep(smoke_runs, monkeypatch):
    nb = execute("sweep_analysis.ipynb", smoke_runs["sweep"], monkeypatch)
    assert errors(nb) == []
    assert len(outputs(nb, "image/png")) >= 4  # doubling curve, ASHA curves, lr against return, confirmation
    tables = " ".join(o["data"]["text/html"] for o in outputs(nb, "text/html"))
    assert "usd_per_m_samples" in tables and "episode_return_mean" in tables
    assert "ci_high" in tables and "phase2_trial_id" in tables  # the confirmation: intervals, every seed's run


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["train", "sweep"])
def test_training_notebook_on_a_train_run_and_a_sweeps_best_trial(smoke_runs, monkeypatch, kind):
    nb = execute("training_analysis.ipynb", smoke_runs[kind], monkeypatch)
    assert errors(nb) == []
    assert len(outputs(nb, "image/png")) >= 1
    text = " ".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert ("the best trial of a sweep" if kind == "sweep" else "a train run") in text
    assert "rayrl doctor:" in text


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sweep", "train"])
def test_report_and_doctor_on_smoke_runs(smoke_runs, kind, tmp_path):
    from rayrl.judge import acceptance, doctor, evaluation, report
    from rayrl.judge.folder import load

    run_dir = smoke_runs[kind]
    run = load(run_dir)
    assert run.kind == kind
    # The hardware figures reached the run folder through the callback.
    for col in ("cpu_util", "mem_util"):  # every row: the sampler starts when the algorithm is built
        assert run.history[col].notna().all() and run.history[col].between(0, 1).all(), col
    assert run.history["learner_samples_per_s"].gt(0).all()
    args = [str(run_dir), "--out", str(tmp_path)]
    if kind == "train":
        args += ["--baseline", str(smoke_runs["sweep"])]
    assert report.main(args) == 0
    text = (tmp_path / "report.md").read_text()
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
        assert f"| {part} | " in text
    assert (tmp_path / "plots" / "training.png").stat().st_size > 5000
    checks = {c.name: c for c in evaluation.evaluate(run, load(smoke_runs["sweep"]) if kind == "train" else None)}
    expected = expected_verdicts(run_dir, smoke_runs["sweep"] if kind == "train" else None)
    assert {name: checks[name].verdict for name in expected} == expected, {n: checks[n] for n in expected}
    assert "host" in checks["memory (peak)"].measured
    assert doctor.main([str(run_dir)]) == 0
