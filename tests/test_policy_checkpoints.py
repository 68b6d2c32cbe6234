"""Which checkpoint `rayrl export` and `rayrl play` take from a sweep (no Ray: folders and CSVs only)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from rayrl import runfolder
from rayrl.errors import SpecError
from rayrl.policy.checkpoints import MODULE_PATH, find_checkpoint


def checkpoint(root: Path, experiment: str, trial: str, n: int = 1) -> Path:
    path = root / experiment / f"PPO_{trial}" / f"checkpoint_{n:06d}"
    (path / MODULE_PATH).mkdir(parents=True)
    return path


def sweep_folder(root: Path, best: str, confirm_rows: list[tuple]) -> Path:
    checkpoint(root, "phase2", "aaaa1111")
    checkpoint(root, "phase2", "bbbb2222")
    for _cand, _p2, trial, _seed, _reached in confirm_rows:
        checkpoint(root, "confirm", trial)
    (root / "summary.json").write_text(json.dumps({"kind": "sweep", "best": {"trial_id": best}}))
    rows = [
        {
            "candidate": c,
            "phase2_trial_id": p2,
            "batch_size": 512,
            "lr": 3e-4,
            "seed": seed,
            "trial_id": t,
            "env_steps": 4000,
            "wall_s": 5.0,
            "usd": 0.001,
            "episode_return_mean": 100.0,
            "reached": reached,
            "stopped": "target" if reached else "budget",
        }
        for c, p2, t, seed, reached in confirm_rows
    ]
    pd.DataFrame(rows, columns=list(runfolder.CONFIRM_COLUMNS)).to_csv(root / runfolder.CONFIRM, index=False)
    return root


ROWS = [
    (1, "aaaa1111", "e4a61_00000", 1000, True),
    (1, "aaaa1111", "e4a61_00001", 2000, False),
    (2, "spec", "e4a61_00002", 1000, False),
    (2, "spec", "e4a61_00003", 2000, True),
]


def test_a_searched_winner_exports_from_its_search_trial(tmp_path):
    trial, path = find_checkpoint(sweep_folder(tmp_path, "aaaa1111", ROWS))
    assert trial == "aaaa1111" and path.parent.parent.name == "phase2"


def test_the_specs_own_config_as_winner_exports_from_its_confirmation_run(tmp_path):
    """It never ran in the search: its first confirmation run at the target (by seed) speaks for it."""
    trial, path = find_checkpoint(sweep_folder(tmp_path, "spec", ROWS))
    assert trial == "e4a61_00003" and path.parent.parent.name == "confirm"
    none_reached = [r[:4] + (False,) for r in ROWS]
    trial, _ = find_checkpoint(sweep_folder(tmp_path / "b", "spec", none_reached))
    assert trial == "e4a61_00002"  # none at the target: its first run by seed


def test_an_unknown_winner_still_names_the_trials_it_has(tmp_path):
    with pytest.raises(SpecError, match="trials with checkpoints: aaaa1111"):
        find_checkpoint(sweep_folder(tmp_path, "gone", ROWS))
