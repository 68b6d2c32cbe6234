"""A real Prometheus, with the shipped scrape job, reads a rayrl gauge from a live Ray (issue 15)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, free_port, ray_head, subprocess_env

SD_FILE = "prom_metrics_service_discovery.json"  # Ray's service discovery file, in its temp dir
GAUGE = "ray_rayrl_env_steps_per_s"


def _get_json(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read().decode())
    except (OSError, ValueError):
        return None


def _wait_for_targets(path: Path, head: subprocess.Popen, timeout_s: float) -> list[str]:
    """The targets Ray's head wrote to its service discovery file (its dashboard writes it every 5 s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert head.poll() is None, "the Ray head exited"
        with contextlib.suppress(OSError, ValueError):
            targets = [t for group in json.loads(path.read_text()) for t in group["targets"]]
            if targets:
                return targets
        time.sleep(1)
    pytest.fail(f"Ray's head wrote no targets to {path} within {timeout_s:.0f} s")


def _config_for(sd_file: Path) -> str:
    """monitoring/prometheus.yml with only its service discovery path moved to this test's Ray."""
    cfg = yaml.safe_load((ROOT / "monitoring" / "prometheus.yml").read_text())
    (job,) = cfg["scrape_configs"]
    (sd,) = job["file_sd_configs"]
    assert sd["files"] == ["/tmp/ray/" + SD_FILE]  # the shipped job; only the temp dir differs here
    sd["files"] = [str(sd_file)]
    return yaml.safe_dump(cfg)


@pytest.mark.slow
def test_prometheus_reads_a_rayrl_gauge_from_a_live_training_run(tmp_path):
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("no `prometheus` binary on PATH (Debian/Ubuntu: apt-get install prometheus)")
    token = tmp_path / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = subprocess_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    env.pop("RAY_AUTH_TOKEN", None)
    with ray_head(env, num_cpus=2, tag="prom") as head:
        # The head's dashboard keeps this file current (a link into the session dir), as under /tmp/ray.
        sd_file = head.temp_dir / SD_FILE
        targets = _wait_for_targets(sd_file, head.process, timeout_s=120)
        config = tmp_path / "prometheus.yml"
        config.write_text(_config_for(sd_file))
        port = free_port()
        api = f"http://127.0.0.1:{port}/api/v1"
        prom_log = open(tmp_path / "prometheus.log", "w")
        prom = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config}",
                f"--web.listen-address=127.0.0.1:{port}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            ],
            start_new_session=True,
            stdout=prom_log,
            stderr=subprocess.STDOUT,
        )
        train = None
        try:
            name = "promlive"
            train_log = open(tmp_path / "train.log", "w")
            train = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rayrl.cli",
                    "train",
                    "--config",
                    "experiments/configs/cartpole_ppo.yaml",
                    "--name",
                    name,
                    "--storage",
                    str(tmp_path / "runs"),
                    "--address",
                    head.gcs,
                    "--set",
                    "resources.env_runners=0",
                    "--set",
                    "env.envs_per_runner=2",
                    "--set",
                    "algo.train_batch_per_learner=256",
                    "--set",
                    "algo.minibatch_size=128",
                    "--set",
                    "algo.epochs=1",
                    "--set",
                    "checkpoint.every=1000",
                    "--set",
                    f"checkpoint.local_dir={tmp_path / 'ckpt'}",
                    # no early stop (CartPole is solved in ~25 s here): it trains until killed below
                    "--set",
                    "stop.episode_return=null",
                    "--set",
                    "stop.env_steps=null",
                    "--set",
                    "stop.wall_s=150",
                ],
                env=env,
                cwd=ROOT,
                start_new_session=True,
                stdout=train_log,
                stderr=subprocess.STDOUT,
            )
            query = f'{GAUGE}{{job="ray",experiment="{name}/tune"}}'
            url = f"{api}/query?" + urllib.parse.urlencode({"query": query})
            deadline, series = time.monotonic() + 150, []
            while time.monotonic() < deadline:
                assert prom.poll() is None, "prometheus exited: " + (tmp_path / "prometheus.log").read_text()[-2000:]
                answer = _get_json(url)
                series = answer["data"]["result"] if answer and answer.get("status") == "success" else []
                if series or train.poll() is not None:
                    break
                time.sleep(2)
            health = _get_json(f"{api}/targets") or {}
            seen = [
                (t.get("scrapeUrl"), t.get("health"), t.get("lastError"))
                for t in health.get("data", {}).get("activeTargets", [])
            ]
            assert series, (
                f"Prometheus returned no {query} within 150 s; Ray's targets {targets}; Prometheus' "
                f"targets {seen}; train exit {train.poll()}: " + (tmp_path / "train.log").read_text()[-1500:]
            )
            (sample,) = series
            value = float(sample["value"][1])
            print(f"Prometheus read {GAUGE} = {value:.1f} env steps/s, labels {sample['metric']}")
            assert sample["metric"]["trial"] not in ("", "none")
            assert 0.0 < value < 1e6
        finally:
            for proc in (train, prom):
                if proc is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
