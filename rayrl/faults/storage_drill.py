"""The storage drill: the storage refuses checkpoint uploads for a while; training must not wait, and
every checkpoint must land, intact, once the storage is back.

Run on a scratch copy of the spec (tiered checkpoints, one every iteration, into a local folder
under ``RUN_DIR/drills/storage``). After the first checkpoints the drill makes the next checkpoint
destinations unwritable (a file where each ``checkpoint_NNNNNN`` folder would go: even root cannot
create a folder there, as a bucket denying writes or a full disk refuses them) for ``OUTAGE_S``.
It then clears them and times how long the pending uploads take to land (every registered
checkpoint's manifest present in storage), and verifies every one against its manifest.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from rayrl.faults.harness import Monitor, drill_spec, outcome, run_with_fault, say, scratch, wait_for
from rayrl.observe import keys
from rayrl.spec import Spec
from rayrl.storage import manifest

OUTAGE_S = 8.0  #: how long the storage refuses uploads
BLOCKED = 30  #: checkpoint indices blocked ahead (more than the outage can produce)


def storage_drill(spec: Spec, storage: Path, timeout_s: float = 600.0) -> dict:
    """Refuse checkpoint uploads for OUTAGE_S mid-training; recovered when training went on during the
    outage and every checkpoint registered by then reached storage intact after it."""
    paths = scratch(storage, "storage")
    base = drill_spec(spec, "storage")
    dspec = dataclasses.replace(
        base,
        checkpoint=dataclasses.replace(
            base.checkpoint, every=1, keep=100, tiered=True, local_dir=str(paths.run_dir / "tier1")
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
        blockers = [trial / f"checkpoint_{i:06d}" for i in range(newest + 2, newest + 2 + BLOCKED)]
        for b in blockers:
            if not b.exists():
                b.write_text("storage drill: uploads refused here")
        t_out, results_before = time.time(), len(monitor.results())
        say(f"storage: uploads refused from checkpoint_{newest + 2:06d} on for {OUTAGE_S:g}s")
        time.sleep(OUTAGE_S)
        during = len(monitor.results()) - results_before
        for b in blockers:
            if b.is_file():
                b.unlink()
        t_back_on = time.time()
        registered = monitor.count("checkpoint")

        def landed() -> bool:
            folders = [p for p in trial.glob("checkpoint_*") if p.is_dir()]
            return len(folders) >= registered and all(manifest.read(p) is not None for p in folders)

        t_landed = wait_for(lambda: time.time() if landed() else None, monitor.deadline)
        broken = {p.name: manifest.problems(p) for p in sorted(trial.glob("checkpoint_*")) if p.is_dir()}
        return {
            "t_outage": t_out,
            "t_back_on": t_back_on,
            "t_landed": t_landed,
            "results_during_outage": during,
            "checkpoints_registered": registered,
            "checkpoints_in_storage": len(broken),
            "corrupt": sorted(n for n, probs in broken.items() if probs),
        }

    result, info = run_with_fault(dspec, paths, monitor, "storage", inject)
    failures = keys.lookup(result.metrics or {}, keys.CHECKPOINT_UPLOAD_FAILURES)
    ok = (
        info.get("t_landed") is not None
        and info.get("results_during_outage", 0) > 0
        and not info.get("corrupt")
        and (failures or 0) > 0
        and result.error is None
    )
    recovery = info["t_landed"] - info["t_back_on"] if info.get("t_landed") else None
    return outcome(
        "storage",
        ok,
        recovery,
        outage_s=OUTAGE_S,
        results_during_outage=info.get("results_during_outage"),
        upload_failures=failures,
        checkpoints_registered=info.get("checkpoints_registered"),
        checkpoints_in_storage=info.get("checkpoints_in_storage"),
        corrupt=info.get("corrupt"),
        **({"problem": info["problem"]} if "problem" in info else {}),
    )
