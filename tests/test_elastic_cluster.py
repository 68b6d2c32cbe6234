"""The elastic runner on Ray's fake multinode cluster: utilisation high -> a node is added;
low -> one is removed (through ray.autoscaler.sdk.request_resources).

The cluster is tests/test_autoscaling.py's (gpu.yaml's learner node types, GPUs replaced by a
custom resource, one worker per type, 15 s idle timeout). The runner runs as its own process
(`python -m rayrl.scale.autoscale`) and reads the run folder's history.csv, which the test writes
as a training run would: rows with the GPU utilisation each iteration measured.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_autoscaling import STAND_IN, FakeCluster, _wait, fake_cluster  # noqa: F401 - the fixture

from rayrl import runfolder
from rayrl.scale.autoscale import ElasticRunner, HistoryTail
from rayrl.scale.elastic import Policy


def _append(run: Path, util: float, rows: int = 3) -> None:
    new = not (run / "history.csv").exists()
    with open(run / "history.csv", "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=runfolder.HISTORY_COLUMNS)
        if new:
            w.writeheader()
        for _ in range(rows):
            w.writerow({"trial_id": "t1", "phase": "train", "gpu_util": util, "env_steps_per_s": 1000.0})


def test_runner_applies_only_changes_and_logs_decisions(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    asked: list[int] = []
    clock = iter(float(t) for t in range(0, 1000, 10))
    runner = ElasticRunner(
        HistoryTail(run),
        asked.append,
        Policy(cooldown_s=15, sustain=2),
        1,
        run / "elastic.jsonl",
        clock=lambda: next(clock),
    )
    assert runner.step().action == "hold" and asked == [1]  # no history yet
    _append(run, 0.95)
    assert (runner.step().action, asked) == ("grow", [1, 2])
    _append(run, 0.95)
    assert runner.step().action == "hold" and asked == [1, 2]  # cool-down
    runner.step()
    _append(run, 0.1)
    assert (runner.step().action, asked) == ("shrink", [1, 2, 1])
    log = [json.loads(line) for line in (run / "elastic.jsonl").read_text().splitlines()]
    assert [d["action"] for d in log] == ["hold", "grow", "hold", "hold", "shrink"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_high_utilisation_adds_a_node_and_low_removes_it(fake_cluster: FakeCluster, tmp_path: Path) -> None:
    fc = fake_cluster
    run = tmp_path / "run"
    run.mkdir()
    log = (tmp_path / "runner.log").open("w")
    runner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rayrl.scale.autoscale",
            str(run),
            "--address",
            fc.gcs_address,
            "--bundle",
            json.dumps({STAND_IN: 8}),
            "--start-nodes",
            "1",
            "--max-nodes",
            "2",
            "--interval",
            "1",
            "--cooldown",
            "3",
            "--sustain",
            "2",
            "--duration",
            "240",
        ],
        env=fc.env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def count(n: int):
            return lambda: len(fc.worker_nodes()) == n or runner.poll() is not None

        def check() -> None:
            assert runner.poll() is None, (tmp_path / "runner.log").read_text()[-3000:]

        _wait("the first requested node", count(1), 90, fc.head)
        check()
        _append(run, 0.95)
        _wait("a second node after high utilisation", count(2), 90, fc.head)
        check()
        _append(run, 0.10)
        _wait("a node removed after low utilisation", count(1), 90, fc.head)
        check()
        actions = [json.loads(line)["action"] for line in (run / "elastic.jsonl").read_text().splitlines()]
        assert "grow" in actions and "shrink" in actions
        assert actions.index("grow") < actions.index("shrink")
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait()
        log.close()
