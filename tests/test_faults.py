"""Fault drills on this machine: every failure rayrl promises to survive, killed for real and timed.

An EnvRunner, the trial's actor, the driver (of `rayrl train` and of the sweep in phase 2) and a
worker node of a three-node cluster are SIGKILLed mid-training through `rayrl drill`; a kill that
lands in a checkpoint write is tried directly. Each test prints its measured recovery time and
the checkpoint restore rate on "[faults]" lines, captured output or not. Tiny budgets (batch
512) keep the whole file at about 5 minutes on 2 cores.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, subprocess_env

from rayrl import spec as S
from rayrl.faults import harness as drill_harness
from rayrl.faults import restore
from rayrl.faults.storage_drill import KEEP as STORAGE_DRILL_KEEP
from rayrl.judge import acceptance, evaluation, folder, report
from rayrl.observe import keys
from rayrl.storage import checkpoints as ck
from rayrl.storage import manifest

pytestmark = pytest.mark.slow

CONFIG = str(ROOT / "experiments" / "configs" / "cartpole_ppo.yaml")
TINY = [
    "--set",
    "algo.train_batch_per_learner=512",
    "--set",
    "algo.minibatch_size=128",
    "--set",
    "algo.epochs=2",
    "--set",
    "env.envs_per_runner=4",
    "--set",
    "stop.episode_return=null",
    "--set",
    "stop.wall_s=null",
]
RECOVERY_S_MAX = 300.0  # the source guide's acceptance figure: recovery < 5 minutes
TRAIN = [sys.executable, "-m", "rayrl.cli", "train", "--config", CONFIG, *TINY]
DRILL = [sys.executable, "-m", "rayrl.cli", "drill"]


_CONFIG: list[pytest.Config] = []


@pytest.fixture(scope="module", autouse=True)
def _terminal(pytestconfig: pytest.Config):
    _CONFIG.append(pytestconfig)
    yield
    _CONFIG.clear()


def figure(text: str) -> None:
    """Print a measured figure to the terminal even while pytest captures output."""
    capman = _CONFIG[0].pluginmanager.getplugin("capturemanager") if _CONFIG else None
    if capman is None:
        print(f"[faults] {text}")
        return
    with capman.global_and_fixture_disabled():
        print(f"\n[faults] {text}", flush=True)


def digest(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not str(p.relative_to(root)).startswith(skip)
    }


def run(cmd: list[str], timeout: int, **env: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=subprocess_env(**env), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return proc


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="module")
def train_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny `rayrl train` run: 8 iterations, a checkpoint every 2, the newest 2 kept."""
    storage = tmp_path_factory.mktemp("runs")
    ok(
        run(
            [
                *TRAIN,
                "--storage",
                str(storage),
                "--name",
                "train",
                "--num-cpus",
                "2",
                "--set",
                "stop.env_steps=4096",
                "--set",
                "checkpoint.every=2",
                "--set",
                "checkpoint.keep=2",
            ],
            timeout=600,
        )
    )
    return storage / "train"


@pytest.fixture(scope="module")
def drilled(train_run: Path) -> dict:
    """`rayrl drill` on the train run (env runner, trial, driver, restores), with the run's bytes before
    and after."""
    before = digest(train_run)
    start = time.monotonic()
    proc = run([*DRILL, os.path.relpath(train_run, ROOT)], timeout=1200)  # relative, as users type it
    wall = time.monotonic() - start
    data = json.loads((train_run / "drill.json").read_text()) if (train_run / "drill.json").exists() else {}
    figure(
        f"rayrl drill on a train run took {wall:.0f}s: "
        + "; ".join(f"{d['name']} {d['outcome']} in {d['recovery_s']}s" for d in data.get("drills", []))
    )
    return {
        "proc": proc,
        "data": data,
        "before": before,
        "after": digest(train_run, skip=("drills/", "drill.json")),
        "wall_s": wall,
    }


def by_name(drilled: dict, name: str) -> dict:
    ok(drilled["proc"])
    return next(d for d in drilled["data"]["drills"] if d["name"] == name)


# ---------------------------------------------------------------------------------------------
# `rayrl drill` on a train run: env runner, trial, driver, restores


@pytest.mark.parametrize("given, drilled_with", [(-1, -1), (0, 3), (3, 3), (10, 10)])
def test_a_drill_keeps_at_least_three_retries_and_retry_forever_stays(given, drilled_with):
    spec = S.load(ROOT / "experiments" / "configs" / "cartpole_ppo.yaml", [f"checkpoint.max_failures={given}"])
    assert drill_harness.drill_spec(spec, "trial").checkpoint.max_failures == drilled_with


def test_drill_writes_drill_json_and_leaves_the_run_untouched(drilled, train_run):
    proc = ok(drilled["proc"])
    data = drilled["data"]
    assert [d["name"] for d in data["drills"]] == ["env_runner", "trial", "driver", "storage"]
    assert data["skipped"] == [{"name": "node", "reason": "the cluster has 1 node"}]
    assert "[drill] env_runner: killed EnvRunner pid" in proc.stdout
    assert "[drill] trial: recovered in" in proc.stdout and "restore 2/2" in proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("rayrl drill: env_runner recovered in")
    # the drills trained scratch copies under RUN_DIR/drills; the run itself is byte-identical
    assert drilled["after"] == drilled["before"]
    assert sorted(p.name for p in (train_run / "drills").iterdir() if p.is_dir()) == [
        "driver",
        "env_runner",
        "storage",
        "trial",
    ]
    scratch = S.load(train_run / "drills" / "trial" / "spec.yaml")
    assert scratch.algo.train_batch_per_learner == drill_harness.BATCH and scratch.name == "trial"


def test_env_runner_death_is_survived_and_counted(drilled):
    d = by_name(drilled, "env_runner")
    figure(
        f"EnvRunner killed at iteration {d['killed_at_iteration']}: back (restarted, resynced, "
        f"{d['restarts']} restart counted) in {d['recovery_s']}s"
    )
    assert d["outcome"] == "recovered" and 0 < d["recovery_s"] < RECOVERY_S_MAX
    assert d["restarts"] >= 1 and d["trial_failures"] == 0  # RLlib restarted the runner; Tune saw no failure
    assert d["final_iteration"] >= d["killed_at_iteration"] + drill_harness.AFTER_RECOVERY  # training went on


def test_trial_death_retries_from_the_latest_checkpoint(drilled):
    d = by_name(drilled, "trial")
    figure(
        f"trial actor killed at iteration {d['killed_at_iteration']}: retried from the checkpoint of iteration "
        f"{d['resumed_from_checkpoint_iteration']} in {d['recovery_s']}s"
    )
    assert d["outcome"] == "recovered" and 0 < d["recovery_s"] < RECOVERY_S_MAX
    assert d["retries"] == 1
    # from the latest checkpoint: with one every iteration, that of the last result seen before the
    # kill or (its save still in flight) the one before
    assert d["resumed_from_checkpoint_iteration"] >= d["killed_at_iteration"] - 1
    # counters continue from the checkpoint, not from zero
    assert d["first_iteration_after"] == d["resumed_from_checkpoint_iteration"] + 1 > 1
    assert d["first_env_steps_after"] >= 0.9 * drill_harness.BATCH * d["first_iteration_after"]
    assert d["final_iteration"] > d["first_iteration_after"]  # and the trial finished


def test_driver_death_of_rayrl_train_resumes_from_a_checkpoint(drilled):
    d = by_name(drilled, "driver")
    figure(
        f"`rayrl train` killed -9 at iteration {d['killed_at_iteration']}: the same command trains again "
        f"{d['recovery_s']}s after it starts (whole rerun {d['rerun_s']}s)"
    )
    assert d["outcome"] == "recovered" and 0 < d["recovery_s"] < RECOVERY_S_MAX
    assert d["exit_status"] == 0 and "problems" not in d
    assert 1 < d["first_iteration_after"] <= d["killed_at_iteration"] + 1
    assert d["files_checked"] > 10


def test_storage_refusing_uploads_does_not_stall_training_and_every_checkpoint_lands(drilled):
    """With keep 2, as users keep them: Tune deletes checkpoint N - 2 when N registers and tier 1 is
    pruned to 2, so a checkpoint pruned before it was uploaded, or an upload landing after Tune
    deleted its folder, shows here (never_landed, stray)."""
    d = by_name(drilled, "storage")
    figure(
        f"storage refused uploads for {d['outage_s']}s: {d['results_during_outage']} iterations trained meanwhile, "
        f"{d['upload_failures']} failed upload attempts retried; the {len(d['checkpoints_kept'])} checkpoints Tune "
        f"kept ({', '.join(d['checkpoints_kept'])} of {d['checkpoints_registered']} registered) intact in storage "
        f"{d['recovery_s']}s after it came back; {d['checkpoints_in_storage']} in storage then"
    )
    assert d["outcome"] == "recovered" and 0 < d["recovery_s"] < RECOVERY_S_MAX
    assert d["results_during_outage"] >= 1 and d["upload_failures"] >= 1
    assert STORAGE_DRILL_KEEP == 2 and len(d["checkpoints_kept"]) == 2
    assert d["checkpoints_registered"] > 2  # the outage came after pruning had started
    assert d["never_landed"] == [] and d["corrupt"] == [] and d["stray"] == []


def test_every_kept_checkpoint_restores_and_plays(drilled, train_run):
    ok(drilled["proc"])
    data = drilled["data"]
    kept = restore.kept_checkpoints(train_run)
    assert len(kept) == 2  # checkpoint.keep
    assert [r["checkpoint"] for r in data["restores"]] == [str(p.relative_to(train_run)) for p in kept]
    figure(
        f"restore rate {data['restore_rate']:.0%} of {len(kept)} checkpoints; restore times "
        f"{[r['restore_s'] for r in data['restores']]} s, episode returns "
        f"{[r['episode_return'] for r in data['restores']]}"
    )
    assert data["restore_rate"] == 1.0
    for r in data["restores"]:
        assert r["ok"] and r["episode_len"] >= 1 and r["episode_return"] == r["episode_len"]  # CartPole: +1/step


def test_report_reads_drill_json(drilled, train_run, tmp_path):
    ok(drilled["proc"])
    assert report.main([str(train_run), "--out", str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    checks = {c.name: c for c in evaluation.evaluate(folder.load(train_run))}
    assert checks["recovery time (worst drill)"].verdict == acceptance.PASS
    assert checks["checkpoint restore rate"].verdict == acceptance.PASS
    assert checks["checkpoint restore rate"].measured == "100.0%"
    worst = max(d["recovery_s"] for d in drilled["data"]["drills"])
    assert f"{worst:.1f} s" in checks["recovery time (worst drill)"].measured
    assert "| env_runner |" in text and "| driver |" in text


# ---------------------------------------------------------------------------------------------
# The sweep's driver killed in phase 2


SWEEP_TINY = [
    "--set",
    "search.doubling.start=512",
    "--set",
    "search.doubling.cap=1024",
    "--set",
    "search.doubling.warmup_iters=0",
    "--set",
    "search.doubling.measure_iters=1",
    "--set",
    "search.num_samples=2",
    "--set",
    "search.max_env_steps=2048",
    "--set",
    "search.grace_env_steps=2048",
    "--set",
    "resources.env_runners=0",
    "--set",
    "checkpoint.every=2",
    "--set",
    "search.min_batch=512",
    "--set",
    "search.confirm_top_k=0",
]


def test_driver_death_during_sweep_phase2_resumes_without_rerunning(tmp_path):
    storage = tmp_path / "runs"
    ok(
        run(
            [
                sys.executable,
                str(ROOT / "experiments" / "sweep.py"),
                "--config",
                CONFIG,
                *TINY,
                *SWEEP_TINY,
                "--storage",
                str(storage),
                "--name",
                "sweep",
                "--num-cpus",
                "2",
            ],
            timeout=600,
        )
    )
    sweep = storage / "sweep"
    before = digest(sweep)
    proc = ok(run([*DRILL, str(sweep), "--only", "driver"], timeout=900))
    data = json.loads((sweep / "drill.json").read_text())
    d = data["drills"][0]
    figure(
        f"sweep driver killed -9 in {d['killed_at']}: the same command trains again {d['recovery_s']}s after "
        f"it starts (whole rerun {d['rerun_s']}s); restore rate {data['restore_rate']:.0%} of "
        f"{len(data['restores'])}"
    )
    assert d["name"] == "driver" and d["kind"] == "sweep" and d["outcome"] == "recovered", proc.stdout
    assert 0 < d["recovery_s"] < RECOVERY_S_MAX and d["exit_status"] == 0
    assert d["finished_before_kill"] >= 1 and d["finished_trials_rerun"] == 0 and d["phase1_kept"] is True
    assert "problems" not in d and d["files_checked"] > 20
    scratch = sweep / "drills" / "driver"
    trials = pd.read_csv(scratch / "trials.csv")
    assert len(trials) == 4 and set(trials["status"]) <= {"completed", "reached_target", "stopped_early"}
    assert json.loads((scratch / "summary.json").read_text())["kind"] == "sweep"
    # every phase-2 trial of the user's sweep kept a checkpoint, and all of them restore
    assert len(data["restores"]) >= 2 and data["restore_rate"] == 1.0
    assert digest(sweep, skip=("drills/", "drill.json")) == before


# ---------------------------------------------------------------------------------------------
# A node dies: a head and two worker nodes on this machine

CLUSTER = """
import time
from ray.cluster_utils import Cluster
c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
for _ in range(2):
    c.add_node(num_cpus=3)
c.wait_for_nodes()
print(c.address, flush=True)
time.sleep(3600)
"""


def test_node_death_is_survived_on_a_three_node_cluster(train_run, tmp_path):
    """`rayrl drill --only node --address` against ray.cluster_utils.Cluster: the raylet of the worker node
    that hosts the drill's actors is killed; the trial carries on on the other worker."""
    run_dir = tmp_path / "train"
    shutil.copytree(train_run, run_dir, ignore=shutil.ignore_patterns("drills", "drill.json"))
    earlier = {"name": "trial", "outcome": "recovered", "recovery_s": 9.0}
    (run_dir / "drill.json").write_text(json.dumps({"drills": [earlier], "restore_rate": 1.0}))
    token = tmp_path / "auth_token"
    token.write_text(secrets.token_hex(32))
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    env = subprocess_env(**auth)
    env.pop("RAY_AUTH_TOKEN", None)
    head = subprocess.Popen(
        [sys.executable, "-c", CLUSTER],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        address = head.stdout.readline().strip()
        assert address, "the cluster did not start"
        proc = subprocess.run(
            [*DRILL, str(run_dir), "--only", "node", "--no-restore", "--address", address],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
        )
    finally:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()
    ok(proc)
    data = json.loads((run_dir / "drill.json").read_text())
    node = next(d for d in data["drills"] if d["name"] == "node")
    figure(
        f"worker node killed (hosting {', '.join(node['hosted'])}) at iteration {node['killed_at_iteration']}: "
        f"training back in {node['recovery_s']}s"
    )
    assert "[drill] cluster: 3 node(s)" in proc.stdout
    assert node["outcome"] == "recovered" and 0 < node["recovery_s"] < RECOVERY_S_MAX
    assert {"FastEnvRunner", "SingleAgentEnvRunner", "PPO"} & set(node["hosted"]), node["hosted"]
    assert node["final_iteration"] > node["killed_at_iteration"]
    assert next(d for d in data["drills"] if d["name"] == "trial") == earlier  # --only keeps earlier drills


# ---------------------------------------------------------------------------------------------
# A kill during a checkpoint write


def _registered(exp_dir: Path) -> int | None:
    """The index of the checkpoint Tune's newest experiment state in storage names as the trial's latest
    (what a resume restores), or None while there is none or the state is mid-write."""
    from ray.tune.utils.serialization import TuneFunctionDecoder

    states = sorted(exp_dir.glob("experiment_state-*.json"))
    if not states:
        return None
    try:
        trial = json.loads(states[-1].read_text())["trial_data"][0]
        # The test's own run folder: the pickled checkpoint manager inside is trusted.
        manager = TuneFunctionDecoder(allow_cloudpickle=True).decode(trial[1])["checkpoint_manager"]
        latest = manager.latest_checkpoint_result
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError, EOFError):
        return None
    return None if latest is None else int(Path(latest.checkpoint.path).name[len("checkpoint_") :])


def _kill_once_registered(proc: subprocess.Popen, exp_dir: Path, index: int, deadline: float) -> dict:
    """SIGKILL the process group as soon as Tune's saved state registers checkpoint ``index`` or a later
    one (its upload to storage under way or just done); which one, and its storage copy's files then."""
    while time.monotonic() < deadline and proc.poll() is None:
        registered = _registered(exp_dir)
        if registered is not None and registered >= index:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            # Tune may have saved a newer state between the look and the kill: the resume reads the last.
            registered = _registered(exp_dir) or registered
            torn = next(exp_dir.glob("PPO_*")) / f"checkpoint_{registered:06d}"
            files = sorted(str(p.relative_to(torn)) for p in torn.rglob("*") if p.is_file())
            return {"dir": torn, "index": registered, "files_at_kill": files}
        time.sleep(0.02)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return {}


def _tear(folder: Path, files: list[str], keep_manifest: bool) -> None:
    """Leave ``folder`` as a cut-short copy: every other file gone, the rest halved; its manifest gone
    too (a copy cut short before the manifest, written last, landed) or kept whole (data that never
    reached the disk under a manifest that did): only the manifest's sizes and hashes tell then."""
    for i, rel in enumerate(files):
        path = folder / rel
        if rel == manifest.NAME:
            if not keep_manifest:
                path.unlink(missing_ok=True)
        elif i % 2 and path.exists():
            path.unlink()
        elif path.exists():
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


#: Iterations long enough (about 0.3 s here) for Tune's saved state to name a checkpoint while
#: tier 1 still holds it: at batch 512 a whole 12-iteration run took 1 s and the state named only
#: its last checkpoint, whose tier-1 copy was gone with the finished trial.
KILL_BATCH = 2048
#: Tune's saved state can lag its deletions by a registration: with 3 kept, the checkpoint before the
#: one the state names is still in storage when the kill lands (with 2 it was sometimes deleted already).
KILL_KEEP = 3


def test_kill_during_a_checkpoint_write_leaves_a_resumable_run(tmp_path, ray_local, monkeypatch):
    """A kill while the newest checkpoint is being written, with both of its copies torn (storage and
    the node-local tier 1), resumes from the previous intact checkpoint, and says so."""
    # Tier 1 under this test's own RAYRL_HOME ($RAYRL_HOME/checkpoints), so the test can find and tear it;
    # Tune's experiment state saved on every loop step, so the kill lands just after the newest is registered.
    monkeypatch.setenv("RAYRL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "0")
    storage = tmp_path / "runs"
    cmd = [
        *TRAIN,
        "--storage",
        str(storage),
        "--name",
        "ckpt",
        "--num-cpus",
        "2",
        "--set",
        f"algo.train_batch_per_learner={KILL_BATCH}",
        "--set",
        f"stop.env_steps={KILL_BATCH * 16}",
        "--set",
        "checkpoint.every=1",
        "--set",
        f"checkpoint.keep={KILL_KEEP}",
        "--set",
        "resources.env_runners=0",
    ]
    run_dir = storage / "ckpt"
    first = subprocess.Popen(
        cmd,
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd=ROOT,
    )
    killed = _kill_once_registered(first, run_dir / "tune", 3, time.monotonic() + 300)
    assert killed, "Tune registered no fourth checkpoint before the run ended or within 300 s"
    torn = killed["dir"]
    previous = torn.parent / f"checkpoint_{killed['index'] - 1:06d}"
    complete = sorted(str(p.relative_to(previous)) for p in previous.rglob("*") if p.is_file())
    assert manifest.NAME in complete, complete
    settings = ck.TierSettings(local_dir=S.load(run_dir / "spec.yaml").checkpoint.local_dir)
    tier1 = ck.local_root(settings, str(torn.parent)) / torn.name
    assert str(tier1).startswith(str(tmp_path / "home")), tier1
    assert manifest.read(tier1) is not None, f"no manifested tier-1 copy of {torn.name} at {tier1}"
    figure(
        f"killed once Tune registered {torn.name}: {len(killed['files_at_kill'])} of {len(complete)} files "
        "of its storage copy on disk; its tier-1 copy complete"
    )
    # A checkpoint newer than the registered one (a loaded machine's late kill) was never registered:
    # remove it, as if the kill had landed a moment earlier, so the resume meets the torn one first.
    for root in (torn.parent, tier1.parent):
        for newer in root.glob("checkpoint_*"):
            if int(newer.name.rsplit("_", 1)[1]) > killed["index"]:
                shutil.rmtree(newer)
    # Whatever the race gave, leave the torn state: the storage copy cut short before its manifest, and
    # the node-local copy with its manifest whole but its data cut short (only verification rejects it).
    _tear(torn, complete, keep_manifest=False)
    _tear(tier1, complete, keep_manifest=True)
    assert manifest.problems(tier1), "the tier-1 copy was not torn"
    history = run_dir / "history.csv"
    rows_before = len(pd.read_csv(history))

    start = time.monotonic()
    ok(run(cmd, timeout=600))
    figure(f"the same command resumed and finished in {time.monotonic() - start:.0f}s")
    (fallback,) = ck.fallbacks(run_dir)
    figure(f"restore fell back: {fallback['rejected']}")
    assert fallback["registered"] == torn.name and fallback["restored"] == previous.name
    assert {r["checkpoint"] for r in fallback["rejected"]} == {torn.name}
    assert [r["why"].split(":")[0] for r in fallback["rejected"]] == ["local copy", "storage copy"]
    after = pd.read_csv(history)
    first_resumed = int(after[keys.ITERATION].iloc[rows_before])
    assert fallback["restored_iteration"] == killed["index"]  # checkpoint_00000N holds iteration N + 1
    assert first_resumed == fallback["restored_iteration"] + 1  # from the intact one, not the torn one
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["env_steps"] >= KILL_BATCH * 16

    spec = S.load(run_dir / "spec.yaml")
    restores, rate = restore.restore_checkpoints(run_dir, spec)
    figure(f"restore rate after the resume: {rate:.0%} of {len(restores)}")
    assert rate == 1.0 and len(restores) == KILL_KEEP


def test_a_torn_experiment_state_is_repaired_from_the_kept_copy_else_a_clear_error(tmp_path):
    """Tune copies its experiment state non-atomically; a kill or a full disk mid-copy cuts it short, and
    Tune would then restart the run with no trial and wait forever. rayrl keeps a whole copy and puts it
    back (the torn file kept beside it); without that copy it says what happened, exits 2, changes nothing."""
    storage = tmp_path / "runs"
    cmd = [
        *TRAIN,
        "--storage",
        str(storage),
        "--name",
        "torn",
        "--num-cpus",
        "2",
        "--set",
        "stop.env_steps=1024",
        "--set",
        "resources.env_runners=0",
    ]
    ok(run(cmd, timeout=600))
    state = sorted((storage / "torn" / "tune").glob("experiment_state-*.json"))[-1]
    kept = state.with_name(".rayrl-good-" + state.name)
    assert json.loads(kept.read_text())  # DiskGuard kept a whole copy while the run went on
    torn_text = state.read_text()[: len(state.read_text()) // 3]
    state.write_text(torn_text)
    kept.rename(tmp_path / "kept.json")
    before = digest(storage / "torn")
    proc = run(cmd, timeout=180)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    err = proc.stderr
    assert "cut short" in " ".join(err.split()) and "Traceback" not in err
    assert state.name in "".join(err.split())  # the paragraph is wrapped at 100 columns, long paths too
    assert digest(storage / "torn") == before

    (tmp_path / "kept.json").rename(kept)  # with the kept copy the same command resumes
    proc = ok(run(cmd, timeout=300))
    assert "resumed from the last whole copy" in " ".join(proc.stdout.split())
    assert json.loads(state.read_text()) and state.with_name(state.name + ".torn").read_text() == torn_text
    assert json.loads((storage / "torn" / "summary.json").read_text())["status"] == "finished"
