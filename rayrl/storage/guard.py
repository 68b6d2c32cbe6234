"""Stop a run cleanly before a full local disk breaks Tune in places rayrl cannot catch.

When the disk holding the run folder fills, Tune's own writes fail first in the trial (a
checkpoint) and then in the driver (reading the trial's error file: ``EOFError`` deep inside
Tune), which ends the run with a traceback. This Tune callback looks at the free space between
Tune's loop steps and, below ``min_free_mb``, ends ``fit()`` with rayrl's one-paragraph
:class:`~rayrl.storage.files.StorageError`; the run resumes with the same command once space is
freed. Object storage has no "free space"; there a failed upload is the error. Between the same
steps it keeps a whole copy of Tune's experiment state (rayrl.storage.tunestate), so a state torn
by the full disk does not stop the resume.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ray.tune import Callback

from rayrl.storage import tunestate
from rayrl.storage.files import MIN_FREE_MB, low_space


class DiskGuard(Callback):
    """Ends ``fit()`` with a StorageError when the run folder's disk has too little free space."""

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
