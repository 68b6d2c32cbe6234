"""Which checkpoint a run folder's policy comes from, and the RLModule in it (no Ray cluster needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rayrl import runfolder
from rayrl.errors import SpecError

MODULE_PATH = Path("learner_group", "learner", "rl_module", "default_policy")


def find_checkpoint(run_dir: str | Path, trial: str | None = None) -> tuple[str, Path]:
    """(trial id, newest checkpoint folder): of ``trial`` if given, else the sweep's best trial
    (summary.json's best) or a `rayrl train` run's one trial. Raises SpecError naming the fix."""
    root = Path(run_dir)
    if not root.is_dir():
        raise SpecError(
            f"RUN_DIR: {str(root)!r} is not a run folder; give the folder a sweep or `rayrl train` "
            "wrote, {storage}/{name} (default storage: ./runs)."
        )
    trial_dirs = {d.name.split("_", 1)[1]: d for d in root.glob("*/*_*") if d.is_dir() and any(d.glob("checkpoint_*"))}
    if trial is None:
        trial = _default_trial(root, trial_dirs)
    match = [d for tid, d in trial_dirs.items() if tid == trial or d.name == trial]
    if not match:
        known = ", ".join(sorted(trial_dirs)) or "none"
        raise SpecError(f"--trial: {trial!r} has no checkpoint in {root}; trials with checkpoints: {known}.")
    newest = max(match[0].glob("checkpoint_*"), key=lambda p: p.name)
    if not (newest / MODULE_PATH).is_dir():
        raise SpecError(
            f"{newest}: holds no RLModule ({MODULE_PATH} is missing); it is not an RLlib new-API-stack checkpoint."
        )
    return trial, newest


def _default_trial(root: Path, trial_dirs: dict[str, Path]) -> str:
    summary_path = root / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    best = (summary.get("best") or {}).get("trial_id")
    if summary.get("kind") == "sweep" and best:
        confirm = root / runfolder.CONFIRM
        if str(best) not in trial_dirs and confirm.is_file():
            # the winner never ran in the search (the spec's own config): its confirmation run
            speaker = runfolder.speaking_run(runfolder.read_confirm(confirm), str(best))
            if speaker is not None:
                return speaker
        return str(best)
    member = (summary.get("population") or {}).get("best_trial_id")
    if member:  # a PBT population: its best member
        return str(member)
    train = [tid for tid, d in trial_dirs.items() if d.parent.name == "tune"]
    if len(train) == 1:
        return train[0]
    raise SpecError(
        f"RUN_DIR: {str(root)!r} names no best trial (summary.json) and has "
        f"{len(trial_dirs)} trials with checkpoints; pick one with --trial "
        f"({', '.join(sorted(trial_dirs)) or 'none'})."
    )


def load_module(checkpoint: Path) -> Any:
    """The trained RLModule of an Algorithm checkpoint, on CPU, in eval mode."""
    from ray.rllib.core.rl_module.rl_module import RLModule

    module = RLModule.from_checkpoint(str((checkpoint / MODULE_PATH).resolve()))
    module.eval()
    return module


def connector_names(checkpoint: Path) -> list[str]:
    """The env-to-module connectors the env runners applied to observations (the preprocessing)."""
    from ray.rllib.connectors.connector_pipeline_v2 import ConnectorPipelineV2

    path = checkpoint / "env_runner" / "env_to_module_connector"
    if not path.is_dir():
        return []
    return [type(c).__name__ for c in ConnectorPipelineV2.from_checkpoint(str(path.resolve())).connectors]
