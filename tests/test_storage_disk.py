"""A full disk under a running `rayrl train`: one clear error, every file readable, resume once freed."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import time

import pandas as pd
import pytest
import yaml
from conftest import ROOT, small_disk, subprocess_env

from rayrl.faults.driver_drill import tune_state_names_a_checkpoint
from rayrl.observe import keys

pytestmark = pytest.mark.slow

#: iterations the run would train: enough that the full disk stops it first, however fast it learns
ITERS = 40


def test_a_full_disk_stops_train_with_a_clear_error_and_it_resumes_once_freed(tmp_path):
    disk = tmp_path / "disk"
    with small_disk(disk, "64m") as mounted:
        if not mounted:
            pytest.skip("mounting a tmpfs needs root; tests/test_storage.py injects ENOSPC at the write instead")
        cmd = [
            sys.executable,
            "-m",
            "rayrl.cli",
            "train",
            "--config",
            str(ROOT / "experiments/configs/cartpole_ppo.yaml"),
            "--storage",
            str(disk),
            "--name",
            "full",
            "--num-cpus",
            "2",
            "--set",
            "env.envs_per_runner=2",
            "--set",
            "algo.train_batch_per_learner=512",
            "--set",
            "algo.minibatch_size=256",
            "--set",
            "algo.epochs=1",
            "--set",
            "resources.env_runners=0",
            "--set",
            "checkpoint.every=1",
            "--set",
            "stop.episode_return=100000",
            "--set",
            f"stop.env_steps={512 * ITERS}",
        ]
        run = disk / "full"
        first = subprocess.Popen(cmd, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 240
        while not (
            (run / "history.csv").exists()
            and len(pd.read_csv(run / "history.csv")) >= 2
            and tune_state_names_a_checkpoint(run / "tune")
        ):
            assert first.poll() is None and time.monotonic() < deadline, "no progress: " + first.stderr.read()[-3000:]
            time.sleep(0.2)
        filler = disk / "filler"
        with filler.open("wb") as f:  # the disk is full from here on
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        out, err = first.communicate(timeout=240)
        assert first.returncode == 1, out[-2000:] + err[-2000:]
        said = " ".join(err.split())
        assert "rayrl train: error: could not" in said and "the disk (or quota) is full" in said
        assert "run the same command again" in said
        # Every file there is whole: the spec loads, history.csv parses to complete rows.
        assert yaml.safe_load((run / "spec.yaml").read_text())["algo"]["train_batch_per_learner"] == 512
        history = pd.read_csv(run / "history.csv")
        stopped_at = int(history[keys.ITERATION].max())
        assert history[keys.ITERATION].notna().all() and stopped_at < ITERS

        filler.unlink()  # space freed: the same command resumes and finishes
        again = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
        after = pd.read_csv(run / "history.csv")
        resumed = after.iloc[len(history) :]
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "finished" and summary["env_steps"] >= 512 * ITERS
        first = int(resumed[keys.ITERATION].iloc[0])
        assert 1 < first <= stopped_at + 1  # from a checkpoint, not from the start
