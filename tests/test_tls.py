"""TLS for real: a head started with certificates from cluster_configs/tls/make-certs.sh runs a job
submitted through it, and refuses drivers without the cluster CA's certificates."""

from __future__ import annotations

import os
import secrets
import signal
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import RAY, ROOT, free_port, head_port_flags, submit_job, subprocess_env

MAKE_CERTS = ROOT / "cluster_configs" / "tls" / "make-certs.sh"


def _certs(folder: Path) -> dict[str, str]:
    for argv in (["ca", str(folder)], ["node", str(folder), "node", "127.0.0.1"]):
        subprocess.run(["bash", str(MAKE_CERTS), *argv], check=True, capture_output=True)
    return {"RAY_USE_TLS": "1", "RAY_TLS_CA_CERT": str(folder / "ca.crt"),
            "RAY_TLS_SERVER_CERT": str(folder / "node.crt"), "RAY_TLS_SERVER_KEY": str(folder / "node.key")}


def test_make_certs_signs_a_node_certificate_with_the_cluster_ca(tmp_path: Path) -> None:
    tls = _certs(tmp_path)
    verify = subprocess.run(["openssl", "verify", "-CAfile", tls["RAY_TLS_CA_CERT"], tls["RAY_TLS_SERVER_CERT"]],
                            capture_output=True, text=True)
    assert verify.returncode == 0 and ": OK" in verify.stdout, verify.stdout + verify.stderr
    text = subprocess.run(["openssl", "x509", "-in", tls["RAY_TLS_SERVER_CERT"], "-noout", "-text"],
                          capture_output=True, text=True).stdout
    assert "IP Address:127.0.0.1" in text and "TLS Web Client Authentication" in text
    assert oct((tmp_path / "ca.key").stat().st_mode & 0o777) == "0o600"
    missing = subprocess.run(["bash", str(MAKE_CERTS), "node", str(tmp_path / "empty"), "n", "10.0.0.1"],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "ca.crt missing" in missing.stderr


def _driver(gcs: str, env: dict, timeout: float = 150) -> subprocess.CompletedProcess:
    code = f"import ray; ray.init(address={gcs!r}); print('CONNECTED', ray.cluster_resources()['CPU'], flush=True)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout,
                          start_new_session=True)


@pytest.mark.slow
def test_a_tls_head_runs_a_submitted_job_and_refuses_drivers_without_the_cluster_certificates(tmp_path: Path) -> None:
    token = tmp_path / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    tls = _certs(tmp_path / "certs")
    rogue = _certs(tmp_path / "rogue")            # a valid certificate from another CA
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    env = subprocess_env(**auth, **tls)
    gcs, dash = free_port(), free_port()
    temp_dir = Path("/tmp") / f"rayrl-tls-{os.getpid()}"
    head = subprocess.Popen([RAY, "start", "--head", "--block", "--num-cpus=1", f"--port={gcs}",
                             "--node-ip-address=127.0.0.1", f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1",
                             "--include-dashboard=true", *head_port_flags(), f"--temp-dir={temp_dir}"],
                            env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ok = _driver(f"127.0.0.1:{gcs}", env)
        assert "CONNECTED 1.0" in ok.stdout, ok.stdout + ok.stderr[-2000:]
        job = submit_job([RAY, "job", "submit", f"--address=http://127.0.0.1:{dash}", "--", sys.executable, "-c",
                          "import ray; ray.init(); print('TLS-JOB', ray.get(ray.remote(lambda: 41 + 1).remote()))"],
                         env, timeout=300)
        assert "TLS-JOB 42" in job.stdout, job.stdout[-2000:] + job.stderr[-2000:]
        no_tls = subprocess_env(**auth, RAY_USE_TLS="0")
        for name, client_env in (("no certificates", no_tls), ("another CA's certificate", subprocess_env(**auth, **rogue))):
            t0 = time.monotonic()
            refused = _driver(f"127.0.0.1:{gcs}", client_env)
            text = refused.stdout + refused.stderr
            assert "CONNECTED" not in refused.stdout and refused.returncode != 0, (name, text[-2000:])
            # the driver fails at the GCS connection (the TLS handshake), not on anything else
            assert "GCS" in text or "gcs" in text, (name, text[-2000:])
            print(f"{name}: refused after {time.monotonic() - t0:.0f}s")
    finally:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)
