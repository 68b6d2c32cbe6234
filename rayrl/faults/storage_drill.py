"""The storage drill: the storage refuses checkpoint uploads for a while; training goes on as far as
the upload back-pressure lets it, and every checkpoint Tune keeps lands, intact, once the storage is back.

Run on a scratch copy of the spec (tiered checkpoints, one every iteration, the newest ``KEEP`` kept
as users keep them, into a local folder under ``RUN_DIR/drills/storage``). After the first
checkpoints the drill makes the next checkpoint destinations unwritable (a file where each
``checkpoint_NNNNNN`` folder would go: even root cannot create a folder there, as a bucket denying
writes or a full disk refuses them) for ``OUTAGE_S``. With ``keep`` 2 the trainable lets at most
``keep - 2`` = 0 uploads wait before the next checkpoint, so training trains on until its next
checkpoint and then waits for the storage, while tier 1 is pruned to the newest ``KEEP``.
It then clears the blockers and times how long until every checkpoint Tune kept when the storage
came back is in storage with its manifest (a copy pruned from tier 1 before it was uploaded never
lands: the drill fails). Once training stopped and its uploads drained, it verifies every checkpoint
in storage against its manifest (not before: mid-run the newest upload is still being written and
Tune may be deleting the oldest) and checks storage holds no checkpoint Tune no longer keeps (an
upload that landed after Tune deleted its folder). A failed drill lists each broken promise.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from rayrl.faults.harness import Monitor, drill_spec, outcome, run_with_fault, say, scratch, wait_for
from rayrl.observe import keys
from rayrl.spec import Spec
from rayrl.storage import manifest

OUTAGE_S = 8.0  #: how long the storage refuses uploads
BLOCKED = 30  #: checkpoint indices kept blocked ahead of the newest registered during the outage
LANDING_POLL_S = 0.01  #: how often storage is looked at for the kept checkpoints' landings
KEEP = 2  #: checkpoint.keep of the drill: what users keep (Tune deletes checkpoint N - KEEP when N registers)


def storage_drill(spec: Spec, storage: Path, timeout_s: float = 600.0) -> dict:
    """Refuse checkpoint uploads for OUTAGE_S mid-training; recovered when training went on during the
    outage and every checkpoint registered by then reached storage intact after it."""
    paths = scratch(storage, "storage")
    base = drill_spec(spec, "storage")
    dspec = dataclasses.replace(
        base,
        checkpoint=dataclasses.replace(
            base.checkpoint, every=1, keep=KEEP, tiered=True, local_dir=str(paths.run_dir / "tier1")
        ),
    )
    monitor = Monitor(timeout_s)

    def trial_dir() -> Path | None:
        found = sorted((paths.run_dir / "tune").glob("*_*/checkpoint_*"))
        return found[0].parent if found else None

    def inject() -> dict:
        if not wait_for(lambda: monitor.count("checkpoint") >= 2 and trial_dir(), monitor.deadline):
            return {"problem": "training produced no checkpoint before the outage"}
        trial = trial_dir()
        if trial is None:
            return {"problem": "the trial's folder went away before the outage"}
        newest = max(int(p.name[11:]) for p in trial.glob("checkpoint_*"))
        blocked: list[Path] = []

        def block_ahead() -> None:
            """Keep BLOCKED indices ahead of the newest registered refused: however fast training
            checkpoints, none registered during the outage is taken (a fixed range is outrun)."""
            top = max(newest + 2, monitor.count("checkpoint")) + BLOCKED
            for i in range(newest + 2 + len(blocked), top):
                b = trial / f"checkpoint_{i:06d}"
                if not b.exists():
                    b.write_text("storage drill: uploads refused here")
                blocked.append(b)

        block_ahead()
        t_out, results_before = time.time(), len(monitor.results())
        say(f"storage: uploads refused from checkpoint_{newest + 2:06d} on for {OUTAGE_S:g}s")
        while time.time() < t_out + OUTAGE_S:
            time.sleep(LANDING_POLL_S)
            block_ahead()
        during = len(monitor.results()) - results_before
        for b in blocked:
            if b.is_file():
                b.unlink()
        t_back_on = time.time()
        registered = monitor.count("checkpoint")
        # What Tune keeps now: the newest KEEP registered (indices count from 0 in a fresh scratch run).
        kept = [f"checkpoint_{i:06d}" for i in range(max(0, registered - KEEP), registered)]
        seen: set[str] = set()  # Tune deletes one of them once two newer ones register: note each landing

        def landed() -> bool:
            seen.update(name for name in kept if manifest.read(trial / name) is not None)
            return seen >= set(kept)

        # Polled every LANDING_POLL_S: a kept checkpoint is in storage only from its landing until two
        # newer ones register (Tune then deletes it), about two training iterations on a fast learner.
        t_landed = wait_for(lambda: time.time() if landed() else None, monitor.deadline, step=LANDING_POLL_S)
        return {
            "trial": trial,
            "t_outage": t_out,
            "t_back_on": t_back_on,
            "t_landed": t_landed,
            "results_during_outage": during,
            "checkpoints_registered": registered,
            "checkpoints_kept": kept,
            "never_landed": sorted(set(kept) - seen),
        }

    result, info = run_with_fault(dspec, paths, monitor, "storage", inject)
    failures = keys.lookup(result.metrics or {}, keys.CHECKPOINT_UPLOAD_FAILURES)
    trial = info.get("trial")
    broken = _verify(trial) if isinstance(trial, Path) else {}
    info["checkpoints_in_storage"] = len(broken)
    info["corrupt"] = [f"{n}: {'; '.join(probs)}" for n, probs in broken.items() if probs]
    stray = _stray(trial, monitor.count("checkpoint")) if isinstance(trial, Path) else []
    problems = _problems(info, stray, failures, result.error)
    ok = not problems
    recovery = info["t_landed"] - info["t_back_on"] if info.get("t_landed") else None
    return outcome(
        "storage",
        ok,
        recovery,
        outage_s=OUTAGE_S,
        results_during_outage=info.get("results_during_outage"),
        upload_failures=failures,
        checkpoints_registered=info.get("checkpoints_registered"),
        checkpoints_kept=info.get("checkpoints_kept"),
        never_landed=info.get("never_landed"),
        checkpoints_in_storage=info.get("checkpoints_in_storage"),
        corrupt=info.get("corrupt"),
        stray=stray,
        problems=problems,
        **({"problem": info["problem"]} if "problem" in info else {}),
    )


def _problems(info: dict, stray: list[str], failures: float | None, error: Any) -> list[str]:
    """Each promise the drill saw broken, in words: a failed drill says which one."""
    if "problem" in info:
        return [str(info["problem"])]
    found = []
    if info.get("t_landed") is None:
        never = ", ".join(info.get("never_landed") or [])
        found.append(f"checkpoints never landed in storage after it came back: {never}")
    if not info.get("results_during_outage"):
        found.append("training reported no result while the storage refused uploads")
    if info.get("corrupt"):
        found.append(f"checkpoints in storage fail their manifest: {', '.join(info['corrupt'])}")
    if stray:
        found.append(f"checkpoints Tune no longer keeps landed in storage: {', '.join(stray)}")
    if not failures:
        found.append("the trial counted no refused upload")
    if error is not None:
        found.append(f"the trial ended in an error: {type(error).__name__}: {error}")
    return found


def _verify(trial: Path) -> dict[str, list[str]]:
    """Each checkpoint in storage and why it is not the complete checkpoint its manifest lists ([] if it is)."""
    return {p.name: manifest.problems(p) for p in sorted(trial.glob("checkpoint_*")) if p.is_dir()}


def _stray(trial: Path, registered: int) -> list[str]:
    """Checkpoints in storage after training stopped that Tune no longer keeps (it keeps the newest KEEP
    of the ``registered``): an upload that landed after Tune had deleted its folder."""
    return sorted(
        p.name for p in trial.glob("checkpoint_*") if p.name[11:].isdigit() and int(p.name[11:]) < registered - KEEP
    )
