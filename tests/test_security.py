"""Security: token authentication on every Ray rayrl starts, nothing exposed, no secret in the repo or logs.

Anyone who can submit a job to a Ray cluster runs code on every node, so a head without token
auth is remote code execution for whoever reaches its ports. The slow tests start real heads in
their own process groups (with their own token file, never ~/.ray/auth_token) and show that a
caller without the token is refused on every door rayrl uses: the Jobs API and a driver's
connection to the GCS.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import RAY, ROOT, head_log_tails, ray_head, submit_job, subprocess_env


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / p for p in out.decode().split("\0") if p and (ROOT / p).is_file()]


# ---------------------------------------------------------------------------------------------
# No secrets in the repository


# Token-like strings: Ray's own tokens (secrets.token_hex(32)), cloud keys, private keys, and any
# token/secret/password key given a literal value.
SECRET_PATTERNS = {
    "private key": re.compile(r"-----BEGIN (?:RSA |EC |DSA |OPENSSH |ENCRYPTED )?PRIVATE KEY-----"),
    "AWS access key": re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    "GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),
    "Slack token": re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    "GCP service-account key": re.compile(r'"private_key_id"\s*:\s*"[0-9a-f]{20,}"'),
    "Ray auth token literal": re.compile(r"RAY_AUTH_TOKEN\s*[=:]\s*['\"]?(?!\$)[A-Za-z0-9]{16,}"),
    "hard-coded credential": re.compile(
        r"(?i)\b(?:token|secret|password|passwd|api_key|apikey|access_key)\b[\"']?\s*[:=]\s*[\"']"
        r"(?![$<{])[A-Za-z0-9+/_\-]{20,}[\"']"
    ),
    "64-hex token": re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])"),
}
# Binary or generated files where long hex runs are content hashes, not secrets.
HEX_OK = {".ipynb", ".json", ".lock"}
# Obvious placeholders that tests plant on purpose (e.g. a token written into a cluster YAML to check
# that `rayrl cluster validate` rejects it).
FAKE = re.compile(r"^(?:0123456789abcdef)+|^(.)\1+$|^(?:ab|a1|x)+$", re.I)


def test_no_token_like_string_in_any_tracked_file():
    found = []
    own_token = Path.home() / ".ray" / "auth_token"
    real = own_token.read_text().strip() if own_token.is_file() else None
    for path in tracked_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if real and real in text:
            found.append(f"{path.relative_to(ROOT)}: contains this machine's Ray token")
        for name, pattern in SECRET_PATTERNS.items():
            if name == "64-hex token" and path.suffix in HEX_OK:
                continue
            if path.name == "test_security.py":  # the patterns themselves
                continue
            for m in pattern.finditer(text):
                value = re.split(r"[=:]\s*[\"']?", m.group(0), maxsplit=1)[-1].strip("\"'")
                if FAKE.match(value):
                    continue
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"{path.relative_to(ROOT)}:{line}: {name}: {m.group(0)[:40]}...")
    assert not found, "secrets in tracked files:\n" + "\n".join(found)


def test_the_scanner_catches_what_it_looks_for():
    """The patterns above are not vacuous: each flags a planted example."""
    planted = {
        "private key": "-----BEGIN OPENSSH PRIVATE KEY-----",
        "AWS access key": "aws_key_id = AKIAABCDEFGHIJKLMNOP",
        "Ray auth token literal": "export RAY_AUTH_TOKEN=" + "a1" * 16,
        "hard-coded credential": 'api_key: "' + "Zx9" * 8 + '"',
        "64-hex token": secrets.token_hex(32),
    }
    for name, text in planted.items():
        assert SECRET_PATTERNS[name].search(text), name
    assert not SECRET_PATTERNS["Ray auth token literal"].search("RAY_AUTH_TOKEN_PATH=$HOME/.ray/auth_token")
    assert not SECRET_PATTERNS["hard-coded credential"].search('token: "${RAY_TOKEN}"')


@pytest.mark.parametrize(
    "name",
    [
        "auth_token",
        ".ray/auth_token",
        "cluster_configs/auth_token",
        "ray.token",
        "secrets/cluster.token",
        "tls/server.key",
        "tls/ca.pem",
        "tls/server.pem",
        ".env",
        "runs/x/history.csv",
    ],
)
def test_gitignore_keeps_token_and_key_files_out(name):
    ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", name], cwd=ROOT)
    assert ignored.returncode == 0, f"{name} is not covered by .gitignore"


def test_no_token_or_key_file_is_tracked():
    bad = [
        p
        for p in tracked_files()
        if p.name == "auth_token" or p.suffix in (".token", ".pem", ".key") or p.name == ".env"
    ]
    assert not bad, bad


def test_shipped_configs_read_the_token_from_a_file_and_expose_no_port():
    """Launcher YAMLs mount the token file, bind the dashboard (and its Jobs API) to localhost and open
    nothing to 0.0.0.0/0; KubeRay manifests use token auth from a Secret and reach the head only
    through a ClusterIP service (a pod binding 0.0.0.0 is inside the pod network), with no host ports."""
    for path in sorted((ROOT / "cluster_configs").rglob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
        values = json.dumps(docs)  # values only, not the comments
        # an Ingress resource or a LoadBalancer/NodePort service would publish ports (a NetworkPolicy's
        # policyTypes [Ingress] is the opposite: it fences pods in)
        assert not re.search(
            r"\b(LoadBalancer|NodePort)\b|\"kind\": \"Ingress\"|hostPort|\"hostNetwork\": true", values
        ), path
        # Ray 2.60 starts the Ray Client server whenever grpc is installed; the configs name its port
        # so the firewall / security group can keep it inside the cluster (docs/security.md)
        if "head_start_ray_commands" in docs[0]:
            assert "--ray-client-server-port=10001" in values, path
        for doc in docs:
            if doc.get("kind") in ("RayCluster", "RayJob"):
                spec = doc["spec"].get("rayClusterSpec", doc["spec"])
                assert spec["authOptions"]["mode"] == "token" and spec["authOptions"].get("secretName"), path
                assert spec["headGroupSpec"].get("serviceType", "ClusterIP") == "ClusterIP", path
            elif "head_start_ray_commands" in doc:
                assert "0.0.0.0" not in json.dumps(doc) and "::/0" not in json.dumps(doc), path
                head = " ".join(doc["head_start_ray_commands"])
                assert re.search(r"--dashboard-host[= ]127\.0\.0\.1", head), path
                assert any(str(k).endswith(".ray/auth_token") for k in doc["file_mounts"]), path


def test_rayrl_code_never_turns_token_auth_off():
    """No code or config rayrl ships sets RAY_AUTH_MODE to anything but token."""
    offenders = []
    for path in tracked_files():
        rel = path.relative_to(ROOT)
        if rel.parts[0] not in ("rayrl", "experiments", "cluster_configs", "benchmarks", "notebooks", ".ci"):
            continue
        for m in re.finditer(r"RAY_AUTH_MODE[\"']?\s*(?:=|:|\]\s*=)\s*[\"']?(\w+)", path.read_text()):
            if m.group(1) != "token":
                offenders.append(f"{rel}: {m.group(0)}")
    assert not offenders, offenders


# ---------------------------------------------------------------------------------------------
# Live heads: the token is required


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    """A fresh token of Ray's format (never this user's ~/.ray/auth_token), readable by the owner only."""
    path = tmp_path / "auth_token"
    path.write_text(secrets.token_hex(32))
    path.chmod(0o600)
    return path


def _connect(address: str, env: dict) -> subprocess.CompletedProcess:
    code = f"import ray; ray.init(address={address!r}); print('CONNECTED', ray.cluster_resources()['CPU'])"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)


#: What the GCS answers a driver whose token is missing or wrong (Ray 2.60, gcs_client.cc).
GCS_REFUSAL = "Unauthenticated: RPC error: InvalidAuthToken: Authentication token is missing or incorrect"


def assert_refused(proc: subprocess.CompletedProcess) -> None:
    """The driver failed because the GCS refused its token, not for any other reason (timeout, import)."""
    assert proc.returncode != 0 and "CONNECTED" not in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert GCS_REFUSAL in proc.stderr and "Failed to connect to GCS" in proc.stderr, proc.stderr[-3000:]


def _http(url: str, token: str | None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0  # not up yet


@pytest.mark.slow
def test_a_head_refuses_jobs_and_drivers_without_the_token(tmp_path, token_file):
    """`ray start --head` with token auth: the Jobs API answers 401/403 and a driver cannot connect
    without the token; with it (read from RAY_AUTH_TOKEN_PATH) a job runs and a driver connects.
    No log of the head or the job contains the token."""
    token = token_file.read_text()
    with_token = subprocess_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_file))
    with_token.pop("RAY_AUTH_TOKEN", None)
    without = subprocess_env(RAY_AUTH_MODE="disabled")
    without.pop("RAY_AUTH_TOKEN", None)
    wrong = subprocess_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    with ray_head(with_token, num_cpus=1, tag="sec") as head:
        jobs = f"{head.dashboard}/api/jobs/"
        deadline = time.monotonic() + 120
        while _http(jobs, token) != 200:
            if time.monotonic() > deadline:
                pytest.fail("the head's Jobs API did not come up within 120 s")
            time.sleep(2)
        assert _http(jobs, None) == 401  # no token
        assert _http(jobs, secrets.token_hex(32)) == 403  # a wrong token

        submit = [RAY, "job", "submit", "--address", head.dashboard, "--", "python", "-c", "print('rayrl-auth-ok')"]
        refused = subprocess.run(submit, env=without, capture_output=True, text=True, timeout=120)
        assert refused.returncode != 0 and "Unauthorized" in refused.stdout + refused.stderr
        refused = subprocess.run(submit, env=wrong, capture_output=True, text=True, timeout=120)
        assert refused.returncode != 0 and "Invalid authentication token" in refused.stdout + refused.stderr
        accepted = submit_job(submit, with_token, timeout=300)
        assert accepted.returncode == 0 and "rayrl-auth-ok" in accepted.stdout, (
            f"{accepted.stdout}{accepted.stderr}\nhead process: exit {head.process.poll()}\n"
            + head_log_tails(head.temp_dir)
        )

        assert_refused(_connect(head.gcs, without))
        assert_refused(_connect(head.gcs, wrong))
        ok = _connect(head.gcs, with_token)
        assert "CONNECTED 1.0" in ok.stdout, ok.stdout + ok.stderr

        leaked = [
            str(p)
            for p in head.temp_dir.rglob("*")
            if p.is_file() and p.stat().st_size < 50_000_000 and token.encode() in p.read_bytes()
        ]
        assert not leaked and token not in accepted.stdout + accepted.stderr, leaked


@pytest.mark.slow
def test_the_local_ray_rayrl_starts_has_token_auth_on(tmp_path, token_file):
    """runtime.init_ray (what `rayrl train`, the sweep and the drills call) starts a local Ray that
    refuses a driver without the token."""
    env = subprocess_env(RAY_AUTH_TOKEN_PATH=str(token_file))
    env.pop("RAY_AUTH_MODE", None)  # rayrl's default, not the caller's choice, is under test
    env.pop("RAY_AUTH_TOKEN", None)
    code = (
        "import json, sys, time, ray; from rayrl import runtime; runtime.init_ray(None, 1); "
        "from ray._raylet import get_authentication_mode, AuthenticationMode; "
        "print(json.dumps({'gcs': ray.get_runtime_context().gcs_address, "
        "'token': get_authentication_mode() == AuthenticationMode.TOKEN}), flush=True); time.sleep(600)"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        info = json.loads(owner.stdout.readline())
        assert info["token"] is True
        without = subprocess_env(RAY_AUTH_MODE="disabled")
        without.pop("RAY_AUTH_TOKEN", None)
        assert_refused(_connect(info["gcs"], without))
        ok = _connect(info["gcs"], subprocess_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_file)))
        assert "CONNECTED 1.0" in ok.stdout, ok.stdout + ok.stderr
    finally:
        os.killpg(owner.pid, signal.SIGKILL)
        owner.wait()
