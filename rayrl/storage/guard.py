"""Stop a run cleanly before a full local disk breaks Tune in places rayrl cannot catch.

When the disk holding the run folder fills, Tune's own writes fail first in the trial (a
checkpoint) and then in the driver (reading the trial's error file: ``EOFError`` deep inside
Tune), which ends the run with a traceback. This Tune callback looks at the free space between
Tune's loop steps and, below ``min_free_mb``, ends ``fit()`` with rayrl's one-paragraph
:class:`~rayrl.storage.files.StorageError`; the run resumes with the same command once space is
freed. Object storage has no "free space"; there a failed upload is the error. Between the same
steps it keeps a whole copy of Tune's experiment state (rayrl.storage.tunestate), so a state torn
by the full disk does not stop the resume.

A trial's own disk is the trial's to judge: when a trial fails because its tier-1 checkpoint disk is
full (:class:`~rayrl.storage.checkpoints.Tier1Full`) or storage refuses its uploads for good
(:class:`~rayrl.storage.upload.StorageRefused`), every retry would fail the same way, so this callback
ends ``fit()`` with that paragraph as a StorageError instead of letting Tune retry the trial until
the failure budget runs out.
"""

from __future__ import annotations

import errno
import time
from pathlib import Path
from typing import Any

from ray.tune import Callback

from rayrl.storage import tunestate
from rayrl.storage.checkpoints import Tier1Full
from rayrl.storage.files import MIN_FREE_MB, StorageError, low_space
from rayrl.storage.upload import StorageRefused

#: trial errors no retry can fix, and the errno the run stops with
FINAL = ((Tier1Full, errno.ENOSPC), (StorageRefused, errno.EACCES))


def final_error(trial: Any) -> StorageError | None:
    """The StorageError to end the run with when ``trial`` failed with a FINAL error, else None.

    Read from the trial's pickled error, which Tune writes into the driver's local staging folder
    before it calls the callbacks (never from storage: nothing is unpickled from a bucket here).
    Anything unreadable counts as not final, so Tune retries as before."""
    try:
        import cloudpickle

        name = trial.run_metadata.pickled_error_filename
        path = Path(trial.local_path, name) if name and trial.local_path else None
        if path is None or not path.is_file():
            return None
        seen = cloudpickle.loads(path.read_bytes())
    except Exception:  # noqa: BLE001 - a guard must never break Tune's own failure handling
        return None
    for _ in range(8):  # RayTaskError(Cause) is an instance of the cause's class and holds it as .cause
        for kind, code in FINAL:
            if isinstance(seen, kind):
                cause = getattr(seen, "cause", None)
                text = str(cause if isinstance(cause, kind) else seen).strip()
                return StorageError(code, text)
        seen = getattr(seen, "cause", None) or getattr(seen, "__cause__", None)
        if seen is None:
            break
    return None


class DiskGuard(Callback):
    """Ends ``fit()`` with a StorageError when the run folder's disk has too little free space, or a
    trial failed in a way no retry can fix (:data:`FINAL`)."""

    def __init__(
        self,
        folder: str | Path,
        min_free_mb: float = MIN_FREE_MB,
        every_s: float = 0.5,
        experiment: str | Path | None = None,
    ) -> None:
        self.folder, self.min_free_mb, self.every_s = Path(folder), min_free_mb, every_s
        self.experiment = Path(experiment) if experiment is not None else None
        self._last = 0.0
        self._seen: dict[Path, float] = {}

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        if time.monotonic() - self._last < self.every_s:
            return
        self._last = time.monotonic()
        if self.experiment is not None:
            tunestate.keep(self.experiment, self._seen)
        err = low_space(self.folder, self.min_free_mb)
        if err is not None:
            raise err

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        err = final_error(trial)
        if err is not None:
            raise err

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        err = final_error(trial)
        if err is not None:
            raise err
