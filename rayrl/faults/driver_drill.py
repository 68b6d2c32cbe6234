"""The driver drill: `kill -9` of `rayrl train` or the sweep mid-run, then the same command again.

Unlike the other drills it cannot run under this process's Tune (it kills the driver), so it runs
the command in a subprocess and judges the resume from the run folder: what was kept byte for byte,
where training started again, and whether the folder still loads.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rayrl import runfolder
from rayrl import spec as spec_mod
from rayrl.faults.harness import KILL_AFTER_ITERS, drill_spec, outcome, say, scratch, wait_for
from rayrl.judge.folder import RunFolderError
from rayrl.judge.folder import load as load_run
from rayrl.observe import keys
from rayrl.spec import Spec
from rayrl.storage.files import write_local

_SWEEP_MAIN = "import sys; from rayrl.sweep.cli import main; sys.exit(main(sys.argv[1:]))"


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _newest_state(exp: Path) -> list[dict]:
    """Trial states in Tune's newest experiment_state file ([] while missing or mid-write)."""
    files = sorted(exp.glob("experiment_state-*.json"))
    if not files:
        return []
    try:
        return [json.loads(t[0]) for t in json.loads(files[-1].read_text())["trial_data"]]
    except (ValueError, KeyError, IndexError, TypeError, OSError):
        return []


def state_names_a_checkpoint(text: str) -> bool:
    """Whether the text of a Tune experiment state records a trial checkpoint (plain or hex-pickled)."""
    return "checkpoint_00000" in text or b"checkpoint_00000".hex() in text


def tune_state_names_a_checkpoint(exp: Path) -> bool:
    """Whether Tune's newest experiment state in ``exp`` records a trial checkpoint: what a resume
    reads (Tune writes it every 10 s or after checkpoint.keep checkpoints)."""
    files = sorted(exp.glob("experiment_state-*.json"))
    try:
        return bool(files) and state_names_a_checkpoint(files[-1].read_text(errors="replace"))
    except OSError:  # replaced as we read it: look again
        return False


def _history_rows(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _parse_rows(lines: list[str]) -> list[dict]:
    """history.csv lines (header first) as dicts."""
    import csv

    return list(csv.DictReader(lines)) if len(lines) > 1 else []


def driver_drill(
    spec: Spec, kind: str, storage: Path, *, address: str | None, num_cpus: int | None, timeout_s: float = 900.0
) -> dict:
    """SIGKILL the driver's process group mid-run (a sweep in the search, or `rayrl train` after a
    checkpoint), run the same command again, and check what was kept."""
    sweep = kind == "sweep"
    dspec = drill_spec(spec, "driver", kind="sweep" if sweep else "driver")
    paths = scratch(storage, "driver")
    config = storage / "driver.yaml"
    write_local(config, spec_mod.dumps(dspec).encode())
    args = ["--config", str(config), "--storage", str(storage), "--name", "driver"]
    if address is None:
        args += ["--num-cpus", str(num_cpus or os.cpu_count() or 2)]
    cmd = [sys.executable, "-c", _SWEEP_MAIN, *args] if sweep else [sys.executable, "-m", "rayrl.cli", "train", *args]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    env.pop("RAY_ADDRESS", None)
    if address is not None:
        env["RAY_ADDRESS"] = address
    run_dir, history = paths.run_dir, paths.run_dir / "history.csv"
    deadline = time.time() + timeout_s

    def ready() -> dict | None:
        if sweep:
            states = [s.get("status") for s in _newest_state(run_dir / "phase2")]
            done = states.count("TERMINATED")
            if done >= 1 and "RUNNING" in states and done < dspec.search.num_samples:
                return {"killed_at": f"the search, {done} of {dspec.search.num_samples} trials finished"}
            return None
        # Tune's saved state, what the rerun resumes from, must name a checkpoint (a checkpoint folder
        # alone is not enough: Tune saves its state after checkpoint.keep of them, or every 10 s)
        rows = len(_history_rows(history)) - 1
        ready = rows >= KILL_AFTER_ITERS and tune_state_names_a_checkpoint(run_dir / "tune")
        return {"killed_at": f"iteration {rows}"} if ready else None

    say(
        f"driver: started {'the sweep' if sweep else 'rayrl train'} on a scratch spec; waiting for "
        f"{'a finished search trial' if sweep else 'a checkpoint'}"
    )
    with (storage / "driver.log").open("w") as log:
        first = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            where = wait_for(
                lambda: ready() or (first.poll() is not None and {"exited": first.returncode}), deadline, step=0.1
            )
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    if not where or "exited" in where:
        return outcome(
            "driver",
            False,
            None,
            problem=f"the {kind} ended (exit {where and where.get('exited')}) "
            f"or timed out before the kill point; see {storage / 'driver.log'}",
        )
    say(f"driver: kill -9 of the driver at {where['killed_at']}; running the same command again")
    before = _digest(run_dir)
    rows_before = _history_rows(history)
    finished = (
        {s["trial_id"] for s in _newest_state(run_dir / "phase2") if s.get("status") == "TERMINATED"}
        if sweep
        else set()
    )

    t_restart = time.time()
    with (storage / "driver.resume.log").open("w") as log:
        second = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            t_back = wait_for(
                lambda: len(_history_rows(history)) > len(rows_before) and time.time(), deadline, step=0.1
            )
            rc = second.wait(timeout=max(deadline - time.time(), 1))
        except subprocess.TimeoutExpired:
            os.killpg(second.pid, signal.SIGKILL)
            second.wait()
            rc = None
    rerun_s = time.time() - t_restart
    out = (storage / "driver.resume.log").read_text(errors="replace")
    after = _digest(run_dir)
    rows_after = _history_rows(history)
    new_rows = rows_after[len(rows_before) :]
    problems = _kept_problems(before, after, rows_before, rows_after, finished, sweep)
    new = _parse_rows(rows_after[:1] + new_rows)
    detail: dict[str, Any] = {
        "kind": kind,
        "killed_at": where["killed_at"],
        "exit_status": rc,
        "rerun_s": round(rerun_s, 1),
        "files_checked": len(before),
    }
    if sweep:
        rerun = sorted({r["trial_id"] for r in new} & finished)
        phase1_rerun = sum(runfolder.OLD_PHASE_NAMES.get(r["phase"], r["phase"]) == runfolder.LADDER for r in new)
        detail.update(
            finished_before_kill=len(finished),
            finished_trials_rerun=len(rerun),
            phase1_kept="ladder already finished" in out and phase1_rerun == 0,
        )
        if rerun:
            problems.append(f"finished trials ran again: {', '.join(rerun)}")
        if not detail["phase1_kept"]:
            problems.append("the ladder ran again")
    else:
        killed_iter = max((int(float(r[keys.ITERATION])) for r in _parse_rows(rows_before)), default=0)
        first_iter = int(float(new[0][keys.ITERATION])) if new else None
        detail.update(killed_at_iteration=killed_iter, first_iteration_after=first_iter)
        if first_iter is None or not 1 < first_iter <= killed_iter + 1:
            problems.append(
                f"the resumed run started at iteration {first_iter}, not from a checkpoint (killed at {killed_iter})"
            )
    try:
        load_run(run_dir)
    except RunFolderError as exc:
        problems.append(f"the run folder no longer loads: {exc}")
    if rc != 0:
        problems.append(f"the second run exited {rc}; see {storage / 'driver.resume.log'}")
    if problems:
        detail["problems"] = problems
    return outcome("driver", not problems and t_back is not None, t_back - t_restart if t_back else None, **detail)


def _kept_problems(
    before: dict[str, str],
    after: dict[str, str],
    rows_before: list[str],
    rows_after: list[str],
    finished: set[str],
    sweep: bool,
) -> list[str]:
    """Files the resume must leave exactly as they were (rayrl's, the ladder, finished trials)."""

    def frozen(rel: str) -> bool:
        parts = rel.split("/")
        if rel in ("spec.yaml", "doubling.csv") or parts[0] == "phase1":
            return True
        return sweep and parts[0] == "phase2" and len(parts) > 2 and parts[1].rsplit("_", 1)[-1] in finished

    changed = sorted(rel for rel, digest in before.items() if frozen(rel) and after.get(rel) != digest)
    problems = [f"changed or lost: {', '.join(changed[:8])}"] if changed else []
    if rows_after[: len(rows_before)] != rows_before:
        problems.append("history.csv: rows written before the kill changed")
    return problems
