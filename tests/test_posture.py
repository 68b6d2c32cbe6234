"""The report's security section: pure verdicts on posture.json, and the posture a real local run records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rayrl.judge import security
from rayrl.judge.acceptance import FAIL, NA, PASS

ROOT = Path(__file__).resolve().parents[1]
LOCAL = {
    "kind": "local",
    "owner_uid": os.getuid(),
    "mode": "0o755",
    "is_owner": True,
    "group_or_world_writable": False,
    "symlink": False,
}


def _verdicts(posture: dict | None) -> dict[str, str]:
    return {c.name: c.verdict for c in security.checks(posture)}


def test_a_loopback_token_run_in_a_private_folder_passes() -> None:
    v = _verdicts(
        {
            "auth_mode": "token",
            "tls": False,
            "storage": LOCAL,
            "listeners": [{"ip": "127.0.0.1", "port": 6379, "process": "gcs_server"}],
        }
    )
    assert v == {
        "token authentication": PASS,
        "TLS between Ray processes": NA,
        "Ray listeners off loopback": PASS,
        "run folder writable only by its owner": PASS,
    }
    assert (
        security.verdict(security.checks({"auth_mode": "token", "tls": False, "storage": LOCAL, "listeners": []}))
        == PASS
    )


def test_auth_off_with_listeners_on_the_network_fails_every_exposure_check() -> None:
    posture = {
        "auth_mode": "disabled",
        "tls": False,
        "storage": {**LOCAL, "group_or_world_writable": True},
        "listeners": [{"ip": "10.0.0.5", "port": 10001, "process": "ray_client_server"}],
    }
    v = _verdicts(posture)
    assert v == {
        "token authentication": FAIL,
        "TLS between Ray processes": FAIL,
        "Ray listeners off loopback": FAIL,
        "run folder writable only by its owner": FAIL,
    }
    assert security.verdict(security.checks(posture)) == FAIL


def test_a_token_cluster_with_tls_leaves_the_firewall_question_open() -> None:
    v = _verdicts(
        {
            "auth_mode": "token",
            "tls": True,
            "storage": {"kind": "object store", "uri": "s3://b/r"},
            "listeners": [{"ip": "0.0.0.0", "port": 8080, "process": "ray::DashboardAgent"}],
        }
    )
    assert v == {
        "token authentication": PASS,
        "TLS between Ray processes": PASS,
        "Ray listeners off loopback": NA,
        "run folder writable only by its owner": NA,
    }


def test_no_posture_is_not_applicable_not_a_pass() -> None:
    assert security.verdict(security.checks(None)) == NA


@pytest.mark.slow
def test_the_posture_of_a_local_ray_says_what_really_listens(tmp_path: Path) -> None:
    """A local Ray (runtime.init_ray) runs with token auth, and its GCS and raylet listen off loopback
    (Ray 2.60 binds them to every interface even on one machine): the posture records them and,
    with token auth on, the report leaves the firewall question open (N/A) rather than passing it."""
    code = (
        "import json, sys; from pathlib import Path; from rayrl import runtime; from rayrl.security import posture; "
        "runtime.init_ray(None, 1); import time; time.sleep(8); "
        f"print(json.dumps(posture.record(Path({str(tmp_path)!r}), {str(tmp_path)!r})))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        start_new_session=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    recorded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert recorded["auth_mode"] == "token" and recorded["storage"]["is_owner"]
    exposed = {r["process"] for r in recorded["listeners"] if not r["ip"].startswith("127.")}
    assert {"gcs_server", "raylet"} <= exposed, recorded["listeners"]
    v = _verdicts(recorded)
    assert v["token authentication"] == PASS and v["Ray listeners off loopback"] == NA
    assert v["TLS between Ray processes"] == FAIL  # off, with listeners on the network
