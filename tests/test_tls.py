"""TLS: cluster_configs/tls/make-certs.sh makes a CA and node certificates Ray's TLS can use, and a head
started with them (token auth on) runs a submitted job and refuses drivers without the cluster's certificates.

The live test starts a head with RAY_USE_TLS=1 and the node certificate, submits a job through the Jobs
API (the dashboard's HTTP: the submitter needs the token, not the certificates) whose driver reaches the
GCS with the node's TLS variables, connects a driver holding the cluster's certificates, and checks
that three drivers are refused at the GCS's TLS handshake: one without TLS (the GCS logs
WRONG_VERSION_NUMBER), one trusting the cluster CA but holding another CA's certificate (the GCS logs
CERTIFICATE_VERIFY_FAILED: client certificates are required) and one of another cluster (it cannot verify
the GCS's certificate). A refused driver retries for minutes; it logs "Failed to connect to GCS" after
RAY_gcs_rpc_server_connect_timeout_s (5 s here) and is killed after 15 s.

An earlier live check timed out because its node certificate named only 127.0.0.1: Ray connects to the
GCS at the node IP it detects (here even with --node-ip-address=127.0.0.1), so `ray start` itself never
connected ("No match found for server name: <node IP>" in gcs_server.err) and every driver timed out.
The certificate must name that IP, as _certs does. Figures: docs/security.md, "TLS between Ray processes".
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import RAY, ROOT, ray_head, submit_job, subprocess_env, wait_for_jobs_api

MAKE_CERTS = ROOT / "cluster_configs" / "tls" / "make-certs.sh"


def _certs(folder: Path) -> dict[str, str]:
    from ray._private.services import get_node_ip_address

    # Ray's processes reach each other at the node IP Ray detects, not only at 127.0.0.1
    for argv in (["ca", str(folder)], ["node", str(folder), "node", "127.0.0.1", get_node_ip_address()]):
        subprocess.run(["bash", str(MAKE_CERTS), *argv], check=True, capture_output=True)
    return {
        "RAY_USE_TLS": "1",
        "RAY_TLS_CA_CERT": str(folder / "ca.crt"),
        "RAY_TLS_SERVER_CERT": str(folder / "node.crt"),
        "RAY_TLS_SERVER_KEY": str(folder / "node.key"),
    }


def test_make_certs_signs_a_node_certificate_with_the_cluster_ca(tmp_path: Path) -> None:
    tls = _certs(tmp_path)
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", tls["RAY_TLS_CA_CERT"], tls["RAY_TLS_SERVER_CERT"]],
        capture_output=True,
        text=True,
    )
    assert verify.returncode == 0 and ": OK" in verify.stdout, verify.stdout + verify.stderr
    text = subprocess.run(
        ["openssl", "x509", "-in", tls["RAY_TLS_SERVER_CERT"], "-noout", "-text"], capture_output=True, text=True
    ).stdout
    assert "IP Address:127.0.0.1" in text and "TLS Web Client Authentication" in text
    assert oct((tmp_path / "ca.key").stat().st_mode & 0o777) == "0o600"
    missing = subprocess.run(
        ["bash", str(MAKE_CERTS), "node", str(tmp_path / "empty"), "n", "10.0.0.1"], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "ca.crt missing" in missing.stderr


# A driver that connects to the GCS at argv[1] and says so; the refused ones never print CONNECTED.
DRIVER = (
    "import sys, ray; ray.init(address=sys.argv[1], log_to_driver=False); "
    "print('CONNECTED', ray.cluster_resources().get('CPU'), flush=True)"
)
JOB = "import os, ray; ray.init(); print('TLS-JOB', os.environ.get('RAY_USE_TLS'), ray.cluster_resources().get('CPU'))"
CONNECT_S = 5  # RAY_gcs_rpc_server_connect_timeout_s of the drivers: a refused one says so after this
REFUSED_LIMIT_S = 15  # a refused driver keeps retrying for minutes; killed after this
STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


def _driver(address: str, env: dict, limit_s: float) -> SimpleNamespace:
    """Run DRIVER in its own process group; kill the group after ``limit_s``. Output is stdout+stderr."""
    start = time.monotonic()
    env = dict(env, RAY_gcs_rpc_server_connect_timeout_s=str(CONNECT_S))
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, address],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=limit_s)
        killed = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        killed = True
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return SimpleNamespace(out=out, seconds=time.monotonic() - start, killed=killed, rc=proc.returncode)


def _refused_after_s(out: str) -> float | None:
    """Seconds from the driver's first log line to its first "Failed to connect to GCS" (Ray's timestamps)."""
    stamps = [(line, STAMP.search(line)) for line in out.splitlines()]
    stamps = [(line, datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")) for line, m in stamps if m]
    failed = [t for line, t in stamps if "Failed to connect to GCS" in line]
    return (failed[0] - stamps[0][1]).total_seconds() if failed else None


def _gcs_err(temp_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in temp_dir.glob("session_2*/logs/gcs_server.err"))


@pytest.mark.slow
def test_a_tls_head_runs_a_submitted_job_and_refuses_drivers_without_its_certificates(tmp_path: Path) -> None:
    """A head started with the four TLS variables (token auth on) runs a `ray job submit` job whose driver
    reaches the GCS over TLS; a driver with the cluster's certificates connects, one without TLS or with
    a certificate from another CA is refused at the GCS's TLS handshake."""
    tls = _certs(tmp_path / "cluster")
    other = _certs(tmp_path / "other")  # another CA, with a certificate naming the same addresses
    env = subprocess_env(RAY_AUTH_MODE="token")
    for name in ("RAY_USE_TLS", "RAY_TLS_CA_CERT", "RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY"):
        env.pop(name, None)
    started = time.monotonic()
    with ray_head(dict(env, **tls), num_cpus=1, tag="tls", block=False) as head:
        assert head.process.returncode == 0, "ray start --head with TLS failed:\n" + _gcs_err(head.temp_dir)[-3000:]
        head_s = time.monotonic() - started

        # The Jobs API is the dashboard's HTTP (not TLS): the submitter needs the token, not the certificates.
        wait_for_jobs_api(head.dashboard, env, "the TLS head")
        submitted = time.monotonic()
        job = submit_job(
            [RAY, "job", "submit", "--address", head.dashboard, "--", sys.executable, "-c", JOB],
            env,
            timeout=150,
            cwd=ROOT,
        )
        job_s = time.monotonic() - submitted
        said = job.stdout + job.stderr
        assert job.returncode == 0 and "succeeded" in said, said[-3000:]
        # The job's driver inherited the node's TLS variables and reached the GCS with them.
        assert "TLS-JOB 1 1.0" in said, said[-3000:]

        good = _driver(head.gcs, dict(env, **tls), limit_s=30)
        assert not good.killed and good.rc == 0 and "CONNECTED 1.0" in good.out, good.out[-3000:]

        plain = _driver(head.gcs, env, limit_s=REFUSED_LIMIT_S)
        after_plain = _gcs_err(head.temp_dir)
        # a client that trusts the cluster's CA but holds a certificate signed by another CA
        foreign = _driver(
            head.gcs,
            {
                **env,
                **tls,
                "RAY_TLS_SERVER_CERT": other["RAY_TLS_SERVER_CERT"],
                "RAY_TLS_SERVER_KEY": other["RAY_TLS_SERVER_KEY"],
            },
            limit_s=REFUSED_LIMIT_S,
        )
        # a client of another cluster altogether
        stranger = _driver(head.gcs, dict(env, **other), limit_s=REFUSED_LIMIT_S)
        after_foreign = _gcs_err(head.temp_dir)

    figures = (
        f"head up {head_s:.1f} s; job submitted to success {job_s:.1f} s; driver with the cluster's "
        f"certificates connected in {good.seconds:.1f} s; refused ('Failed to connect to GCS') after: "
        f"no TLS {_refused_after_s(plain.out)} s, foreign client cert {_refused_after_s(foreign.out)} s, "
        f"other CA {_refused_after_s(stranger.out)} s"
    )
    print(figures)
    for name, refused in (("no TLS", plain), ("foreign client cert", foreign), ("other CA", stranger)):
        assert "CONNECTED" not in refused.out, f"{name}: connected\n{refused.out[-3000:]}"
        after = _refused_after_s(refused.out)
        assert after is not None and after < CONNECT_S + 10, f"{name}: {figures}\n{refused.out[-3000:]}"
    # The refusals were TLS handshakes failing: the GCS saw a plaintext client, then a client certificate it
    # could not verify; the other cluster's driver could not verify the GCS's certificate.
    assert "Handshake failed" in after_plain and "WRONG_VERSION_NUMBER" in after_plain, after_plain[-3000:]
    assert "CERTIFICATE_VERIFY_FAILED" not in after_plain, after_plain[-3000:]
    assert "CERTIFICATE_VERIFY_FAILED" in after_foreign[len(after_plain) :], after_foreign[-3000:]
    assert "CERTIFICATE_VERIFY_FAILED" in stranger.out, stranger.out[-3000:]
