"""A run folder written before the layout move (modules rayrl.algo, rayrl.confirm_stop, ...; history
phase "doubling") resumes with today's code and reads in the report.

tests/data/old-layout.tar.xz is a `--smoke` sweep made by the code of commit a39a195 and interrupted
in the confirmation (its Tune state pickles the old module paths); the search's checkpoints, the
ladder's Tune experiment and event files were pruned to keep it small: the finished ladder is read
back from doubling.csv and the finished search trials are kept by Tune's restore.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, subprocess_env

FIXTURE = Path(__file__).parent / "data" / "old-layout.tar.xz"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_old_layout_run_folder_resumes_and_reads(tmp_path):
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    run = tmp_path / "oldfix"
    assert not (run / "summary.json").exists() and not (run / "confirm.csv").exists()  # interrupted in confirm
    trials_before = (run / "trials.csv").read_text()
    old_phases = set(pd.read_csv(run / "history.csv")["phase"])
    assert "doubling" in old_phases  # the old name for the ladder

    cmd = [
        sys.executable,
        "experiments/sweep.py",
        "--smoke",
        "--storage",
        str(tmp_path),
        "--name",
        "oldfix",
        "--num-cpus",
        "2",
    ]
    proc = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=540, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ladder already finished" in proc.stdout and "[ladder" not in proc.stdout
    assert "[search" not in proc.stdout  # the search's finished trials were not rerun
    assert "[confirm" in proc.stdout  # the interrupted confirmation went on, through Tune's restore
    assert sorted((run / "trials.csv").read_text().splitlines()) == sorted(trials_before.splitlines())
    confirm = pd.read_csv(run / "confirm.csv")
    assert len(confirm) == 6 and set(confirm["stopped"]) <= {"target", "budget", "race", "error"}
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best"] is not None and summary["knee_batch_size"] == 2048

    report = subprocess.run(
        [sys.executable, "-m", "rayrl.cli", "report", str(run)],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert report.returncode == 0, report.stderr[-2000:]
    assert (run / "report.md").exists()
    from rayrl.judge.folder import load

    assert set(load(run).history["phase"]) == {"ladder", "search", "confirm"}
    # the winner's policy out, whichever candidate won (the spec's own config has only confirmation runs)
    for argv in (["export", str(run)], ["play", str(run), "--episodes", "1"]):
        out = subprocess.run(
            [sys.executable, "-m", "rayrl.cli", *argv],
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=180,
            cwd=ROOT,
        )
        assert out.returncode == 0, argv[0] + ": " + out.stdout[-1500:] + out.stderr[-1500:]
    assert (run / "policy.onnx").is_file()
