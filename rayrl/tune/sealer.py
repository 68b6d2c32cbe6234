"""A Tune callback that seals the experiment state rayrl's driver writes to remote storage.

Tune saves its state into the driver's staging folder and uploads that folder every few minutes and
at the end; a resume downloads and unpickles it. After each save this callback hashes the staging
folder's state files and writes a signed seal (rayrl.storage.tunestate.seal_of) straight to storage,
right after Tune launched the upload of the same bytes (the seal, a few KB, usually lands first; a
crash between the two landings is the one case a resume refuses a state rayrl wrote). It never
writes the seal into the staging folder, and removes one a resume brought there: Tune's next upload
would put that stale seal over the current one.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from ray.tune import Callback

from rayrl.security import signing
from rayrl.storage import tunestate

TUNER_PKL = "tuner.pkl"


class StateSealer(Callback):
    """Seal the state on every change; ``fs``/``exp_path``: the experiment's storage (remote only)."""

    def __init__(self, fs: Any, exp_path: str, key_file: str = "") -> None:
        self.fs, self.exp_path, self.key_file = fs, exp_path, key_file
        self.key = signing.load(key_file)
        self.seen: dict[str, float] = {}
        self.seal: dict | None = None
        self.failures = 0
        self.cleared = False
        if self.key is None:
            print(
                "[rayrl] no signing key on the driver (no RAYRL_STORAGE_KEY_FILE, no Ray auth token): Tune's "
                f"experiment state in {exp_path} is not sealed, and a resume refuses it unless {signing.ALLOW_ENV}=1",
                flush=True,
            )
        else:
            try:  # a resumed run goes on from the seal in storage: the versions already uploaded stay accepted
                _, self.seal = tunestate.read_remote(fs, exp_path)
            except OSError:
                self.seal = None

    def __getstate__(self) -> dict:
        # Tune pickles its callbacks into tuner.pkl, which goes to the bucket: never the key with them.
        return {**self.__dict__, "key": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.key = signing.load(self.key_file)

    def staging(self, trials: list) -> Path | None:
        for trial in trials:
            path = getattr(getattr(trial, "storage", None), "experiment_driver_staging_path", None)
            if path:
                return Path(path)
        return None

    def seal_tuner(self, tuner: Any) -> None:
        """Write and seal ``tuner.pkl``: Tune writes it straight to storage when the Tuner is made, not
        through the staging folder, so rayrl writes those bytes again itself and seals what it wrote."""
        inner = getattr(tuner, "_local_tuner", None)
        if self.key is None or inner is None:
            return
        from ray import cloudpickle  # what Tune pickles tuner.pkl with

        data = cloudpickle.dumps(inner.__getstate__())
        with self.fs.open_output_stream(f"{self.exp_path}/{TUNER_PKL}") as f:
            f.write(data)
        self.write({TUNER_PKL: hashlib.sha256(data).hexdigest()})

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if not self.cleared:
            folder = self.staging(trials)
            if folder is not None:
                (folder / tunestate.SEAL).unlink(missing_ok=True)
                self.cleared = True

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        self.update(trials)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        for attempt in range(3):  # Tune uploaded its final state just before: the seal must follow it
            if self.update(trials, force=True):
                return
            time.sleep(2.0 * (attempt + 1))
        print(f"[rayrl] could not write the experiment state's seal to {self.exp_path}: a resume will refuse it")

    def update(self, trials: list, force: bool = False) -> bool:
        """Seal the staging folder's state if it changed; True when the seal in storage is current."""
        folder = self.staging(trials)
        if self.key is None or folder is None or not folder.is_dir():
            return False
        files = {p.name: p for p in folder.iterdir() if p.is_file() and tunestate.sealed(p.name)}
        try:
            mtimes = {n: p.stat().st_mtime for n, p in files.items()}
            if mtimes == self.seen and not force:
                return True
            hashes = {n: hashlib.sha256(p.read_bytes()).hexdigest() for n, p in files.items()}
        except OSError:
            return False
        if not self.write(hashes):
            return False
        self.seen = mtimes
        return True

    def write(self, hashes: dict[str, str]) -> bool:
        """Seal ``hashes`` (and the versions sealed before) and put the seal in storage."""
        assert self.key is not None
        seal = tunestate.seal_of(hashes, self.seal, time.time(), self.key)
        try:
            with self.fs.open_output_stream(f"{self.exp_path}/{tunestate.SEAL}") as f:
                f.write(json.dumps(seal, indent=1).encode())
        except OSError as exc:
            self.failures += 1
            if self.failures == 1:
                print(f"[rayrl] writing the experiment state's seal failed ({exc}); retried on the next change")
            return False
        self.seal = seal
        return True
