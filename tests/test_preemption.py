"""Long-run safety, live: SIGTERM to `rayrl train` checkpoints then exits and the same command resumes
from that checkpoint; a corrupted newest checkpoint is skipped for the newest intact one; an env
whose step() blocks forever on one EnvRunner does not stop the run (the watchdog restarts it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, subprocess_env

from rayrl.observe import keys
from rayrl.storage import manifest

pytestmark = pytest.mark.slow

CONFIG = str(ROOT / "experiments" / "configs" / "cartpole_ppo.yaml")
TINY = [
    "--set",
    "algo.train_batch_per_learner=512",
    "--set",
    "algo.minibatch_size=128",
    "--set",
    "algo.epochs=1",
    "--set",
    "env.envs_per_runner=4",
    "--set",
    "stop.episode_return=null",
    "--set",
    "stop.wall_s=null",
]


def train_cmd(storage: Path, name: str, *sets: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rayrl.cli",
        "train",
        "--config",
        CONFIG,
        *TINY,
        "--storage",
        str(storage),
        "--name",
        name,
        "--num-cpus",
        "2",
        *[a for s in sets for a in ("--set", s)],
    ]


def rows(history: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(history)
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return pd.DataFrame(columns=[keys.ITERATION])


def run_then_sigterm(cmd: list[str], history: Path, new_rows: int, timeout: float = 240) -> tuple[str, int, int]:
    """Start ``cmd``, wait for ``new_rows`` more history rows, SIGTERM the driver alone; (output, rc,
    iteration reached when the signal was sent)."""
    before = len(rows(history))
    proc = subprocess.Popen(
        cmd,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + timeout
        while len(rows(history)) < before + new_rows:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("no progress to interrupt:\n" + (proc.communicate(timeout=30)[0] or "")[-4000:])
            time.sleep(0.3)
        at = int(rows(history)[keys.ITERATION].max())
        proc.send_signal(signal.SIGTERM)  # the driver only, as Kubernetes signals a pod's main process
        out, _ = proc.communicate(timeout=90)
        return out, proc.returncode, at
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the local Ray it started, if anything is left
        except ProcessLookupError:
            pass


def checkpoints(trial: Path) -> dict[str, int | None]:
    """checkpoint folder -> iteration from its manifest (None: no intact manifest)."""
    return {
        p.name: manifest.meta(manifest.read(p)).get("training_iteration") for p in sorted(trial.glob("checkpoint_*"))
    }


def first_resumed_iteration(history: Path, before: int) -> int:
    return int(rows(history)[keys.ITERATION].iloc[before])


def test_sigterm_checkpoints_and_resumes_and_a_corrupt_newest_checkpoint_is_skipped(tmp_path):
    every = 3
    cmd = train_cmd(
        tmp_path,
        "pre",
        "stop.env_steps=100000",
        f"checkpoint.every={every}",
        "checkpoint.keep=4",
        f"checkpoint.local_dir={tmp_path / 'tier1'}",
    )
    history = tmp_path / "pre" / "history.csv"

    # 1. SIGTERM after the periodic checkpoint at iteration 3: a newer checkpoint, exit 143.
    start = time.monotonic()
    out, rc, at = run_then_sigterm(cmd, history, new_rows=every + 2)
    assert rc == 143, out[-4000:]
    assert "stopped by SIGTERM" in out and "with a checkpoint of the last iteration" in out, out[-3000:]
    (trial,) = (tmp_path / "pre" / "tune").glob("PPO_*")
    saved = checkpoints(trial)
    last_periodic = (at - 1) // every * every  # the signal came after result `at` was reported
    newest = max(i for i in saved.values() if i)
    assert newest >= at and newest > last_periodic, (saved, at)
    summary = json.loads((tmp_path / "pre" / "summary.json").read_text())
    assert summary["status"] == "preempted" and summary["preempted"]["checkpointed"] is True
    assert summary["preempted"]["stop_s"] < 25.0
    print(
        f"\n[preemption] SIGTERM at iteration {at}: checkpoint of iteration {newest}, driver stopped "
        f"{summary['preempted']['stop_s']:.1f}s after the signal (first run {time.monotonic() - start:.0f}s)"
    )

    # 2. The same command resumes from that checkpoint; SIGTERM it again.
    before = len(rows(history))
    out, rc, at2 = run_then_sigterm(cmd, history, new_rows=2)
    assert rc == 143, out[-4000:]
    assert first_resumed_iteration(history, before) == newest + 1, out[-3000:]
    saved = checkpoints(trial)
    newest2 = max(i for i in saved.values() if i)
    assert newest2 >= at2 > newest

    # 3. Flip bytes in the newest checkpoint (storage and any tier-1 copy): the run resumes from the
    #    newest intact one, says so, and records it in the trial folder and summary.json.
    newest_name = max(saved)
    corrupt = [trial / newest_name] + list((tmp_path / "tier1").glob(f"*/{newest_name}"))
    for folder in corrupt:
        target = max(
            (p for p in folder.rglob("*") if p.is_file() and p.name != manifest.NAME), key=lambda p: p.stat().st_size
        )
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
    good = max(i for n, i in saved.items() if i and n != newest_name)
    before = len(rows(history))
    out, rc, _ = run_then_sigterm(cmd, history, new_rows=1)
    assert rc == 143, out[-4000:]
    assert first_resumed_iteration(history, before) == good + 1, (saved, out[-3000:])
    recorded = [json.loads(p.read_text()) for p in trial.glob("rayrl_restore_fallback-*.json")]
    assert [(r["registered"], r["restored_iteration"]) for r in recorded] == [(newest_name, good)]
    assert "sha256 differs" in recorded[0]["rejected"][0]["why"]
    summary = json.loads((tmp_path / "pre" / "summary.json").read_text())
    assert summary["checkpoint_fallbacks"][0]["restored_iteration"] == good


@pytest.mark.parametrize("sample_ahead", [False, True], ids=["sample_then_learn", "sample_ahead"])
def test_a_runner_whose_env_step_blocks_forever_is_restarted_and_the_run_goes_on(tmp_path, sample_ahead):
    # Sampling ahead, no ping reaches a runner (each is busy with the next sample): the sample that
    # never arrives is what the watchdog counts as silence.
    marker = tmp_path / "hung"
    proc = subprocess.run(
        train_cmd(
            tmp_path,
            "hang",
            "env.id=tests.hang_env:make",
            f"env.config={{marker: '{marker}', after: 300}}",
            f"algo.sample_ahead={str(sample_ahead).lower()}",
            "resources.env_runners=2",
            "resources.cpus_per_env_runner=0.5",
            "stop.env_steps=8192",
            "checkpoint.every=100",
            "checkpoint.hung_runner_s=4",
            f"checkpoint.local_dir={tmp_path / 'tier1'}",
        ),
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert marker.exists()  # the env did hang once
    summary = json.loads((tmp_path / "hang" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["env_steps"] >= 8192
    assert summary["hung_runner_restarts"] >= 1
    (trial,) = (tmp_path / "hang" / "tune").glob("PPO_*")
    results = [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]
    steps = [r[keys.ENV_STEPS] for r in results]
    assert all(b > a for a, b in zip(steps, steps[1:])), steps  # every iteration gained env steps
    restarted = next(i for i, r in enumerate(results) if r["rayrl"]["hung_runner_restarts"] >= 1)
    last = results[-1]
    assert last["fault_tolerance"]["num_healthy_workers"] == 2  # the restarted runner is back
    print(
        f"\n[preemption] hung runner restarted at iteration {restarted + 1}; "
        f"{len(results)} iterations, {steps[-1]:.0f} env steps"
    )
