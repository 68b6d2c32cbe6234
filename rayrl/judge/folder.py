"""Read a run folder (``{storage}/{name}/``) into pandas, or say clearly what is wrong with it.

The report, the doctor and the notebooks all read runs through :func:`load`, so the run folder
contract (see docs/observability.md) is checked in one place. Nothing here writes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from rayrl import runfolder
from rayrl.errors import SpecError
from rayrl.observe import cost, keys
from rayrl.runfolder import CONFIRM_COLUMNS, DECISIONS, DOUBLING_COLUMNS, HISTORY_COLUMNS, TRIALS_COLUMNS
from rayrl.spec import judged_by
from rayrl.storage.mirror import fetch
from rayrl.storage.uri import is_uri
from rayrl.tune.resources import trial_resources

# confirm.csv's ``stopped`` came later: a run folder from before it still reads (as empty)
CONFIRM_REQUIRED = tuple(c for c in CONFIRM_COLUMNS if c != "stopped")
STRING_COLUMNS = (
    "trial_id",
    "phase",
    "backend",
    "precision",
    "decision",
    "status",
    "phase2_trial_id",
    "reached",
    "stopped",
)
# history.csv columns read as counts: NaN (not reported) is fine, an infinity is damage.
WHOLE_HISTORY_COLUMNS = ("batch_size", keys.ITERATION, "env_steps", "nonfinite_steps", "num_learners")


class RunFolderError(Exception):
    """A run folder is missing or damaged; the message names the file, the problem and the fix."""


@dataclass
class RunFolder:
    """One run's files, parsed. ``kind`` is "sweep" or "train"."""

    path: Path
    kind: str
    spec: dict
    history: pd.DataFrame
    summary: dict = field(default_factory=dict)
    doubling: pd.DataFrame | None = None
    trials: pd.DataFrame | None = None
    confirm: pd.DataFrame | None = None  # confirm.csv: the search's top configs re-run on fresh seeds
    best_config: dict | None = None
    drill: dict | None = None
    posture: dict | None = None  # posture.json: auth, TLS, listeners, run-folder permissions
    notes: list[str] = field(default_factory=list)
    sections: dict[str, Any] = field(default_factory=dict)  # spec sections as rayrl.spec dataclasses
    source: str | None = None  # the storage URI when the run folder is in object storage (path: a local copy)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def prices(self) -> cost.CostSpec:
        """The spec's prices (defaults where the spec has no cost section)."""
        return self.sections["cost"]

    @property
    def resources(self) -> cost.TrialResources:
        """Resources one trial holds: summary.json's ``resources`` if written, else from the spec."""
        res = self.summary.get("resources") or {}
        if "gpus_per_trial" in res and "cpus_per_trial" in res:
            return cost.TrialResources(gpus=float(res["gpus_per_trial"]), cpus=float(res["cpus_per_trial"]))
        ev = self.sections["evaluation"]
        return trial_resources(self.sections["resources"], ev.env_runners if ev.interval > 0 else 0)

    @property
    def target_return(self) -> float | None:
        """The spec's stop.episode_return (the reward acceptance target), or None."""
        return self.sections["stop"].episode_return

    @property
    def judged_by(self) -> str:
        """The return the run was ranked and stopped by (see rayrl.spec.EvaluationSpec.judge)."""
        return judged_by(self.sections["evaluation"])

    @property
    def return_column(self) -> str:
        """history.csv's column of the judged return."""
        return "eval_return_mean" if self.judged_by == "evaluation" else "episode_return_mean"


def load(path: str | Path) -> RunFolder:
    """Parse and check a run folder; raise :class:`RunFolderError` naming what is wrong."""
    source = None
    if is_uri(path):  # object storage: read a local copy of the run folder's files
        source = str(path)
        try:
            path, _ = fetch(source)
        except (FileNotFoundError, SpecError) as exc:
            raise RunFolderError(
                f"{source}: no run folder there ({exc}). Give the URI a sweep or `rayrl train` "
                "wrote to, i.e. STORAGE/NAME."
            ) from None
        except OSError as exc:
            raise RunFolderError(
                f"{source}: cannot read it ({exc}); check the credentials and the endpoint "
                "(AWS_ENDPOINT_URL or ?endpoint_override=)."
            ) from None
    root = Path(path)
    if not root.exists():
        raise RunFolderError(
            f"{root}: no such run folder. Give the folder a sweep or `rayrl train` wrote, "
            "i.e. {storage}/{name} (default storage: ./runs)."
        )
    if not root.is_dir():
        raise RunFolderError(f"{root}: is a file, not a run folder; give the folder {{storage}}/{{name}}.")
    spec = _read_yaml(root / "spec.yaml", required=True)
    summary = _read_json(root / "summary.json", required=False)
    kind = summary.get("kind") if summary else None
    if kind is None:
        kind = "sweep" if (root / runfolder.DOUBLING).exists() else "train"
    if kind not in ("sweep", "train"):
        raise RunFolderError(f"{root / 'summary.json'}: kind {kind!r} is unknown; expected 'sweep' or 'train'.")
    notes: list[str] = []
    run = RunFolder(
        path=root,
        kind=kind,
        spec=spec,
        summary=summary or {},
        source=source,
        history=_read_csv(root / runfolder.HISTORY, HISTORY_COLUMNS),
        notes=notes,
    )
    run.history["phase"] = run.history["phase"].replace(runfolder.OLD_PHASE_NAMES)
    _check_numbers(root / "history.csv", run.history, WHOLE_HISTORY_COLUMNS, required=False)
    _check_summary(root / "summary.json", run.summary)
    run.sections = _spec_sections(root / "spec.yaml", spec)
    if kind == "sweep":
        if not summary:
            raise RunFolderError(
                f"{root / 'summary.json'}: missing; the sweep did not finish (or crashed before "
                "writing it). Run the same sweep command again to resume it."
            )
        for needed in ("knee_batch_size", "best"):
            if needed not in summary:
                raise RunFolderError(
                    f"{root / 'summary.json'}: has no {needed!r}; a sweep's summary names the "
                    "knee batch size and the best trial. The file is damaged or from another tool."
                )
        run.doubling = _read_csv(root / "doubling.csv", DOUBLING_COLUMNS)
        _check_numbers(root / "doubling.csv", run.doubling, ("batch_size",), required=True)
        bad = sorted(set(run.doubling["decision"].dropna()) - set(DECISIONS))
        if bad or run.doubling["decision"].isna().any():
            raise RunFolderError(
                f"{root / 'doubling.csv'}: decision {bad or ['(empty)']} is not one of "
                f"{', '.join(DECISIONS)}; the file is damaged."
            )
        run.trials = _read_csv(root / "trials.csv", TRIALS_COLUMNS, allow_empty=True)
        _check_numbers(root / "trials.csv", run.trials, ("batch_size", "lr"), required=True)
        if (root / "confirm.csv").exists():
            run.confirm = _read_csv(root / "confirm.csv", CONFIRM_REQUIRED, allow_empty=True)
            _check_numbers(root / "confirm.csv", run.confirm, ("candidate", "batch_size", "lr", "seed"), required=True)
            run.confirm["reached"] = run.confirm["reached"].eq("True")
        run.best_config = _read_yaml(root / "best_config.yaml", required=False) or None
        if run.best_config is None:
            notes.append("best_config.yaml is missing: no search trial finished.")
    elif not summary:
        notes.append("summary.json is missing: the run is still going or stopped before finishing.")
    run.drill = _read_drill(root / "drill.json")
    run.posture = _read_json(root / "posture.json", required=False) or None
    return run


def best_trial_id(run: RunFolder) -> str | None:
    """The trial that speaks for summary.json's best: its search trial (by trial_id, else batch size and lr),
    a confirmation run when the winner never ran in the search, else the top of runfolder.rank_trials."""
    trials = run.trials
    if trials is None or trials.empty:
        return None
    best = run.summary.get("best") or {}
    if best.get("trial_id") is not None and str(best["trial_id"]) in set(trials["trial_id"].astype(str)):
        return str(best["trial_id"])
    if best.get("trial_id") is not None and run.confirm is not None:
        # a config the search never ran (the spec's own, search.confirm_baseline) won the confirmation:
        # its first run that reached the target (by seed), else its first run, speaks for it
        speaker = runfolder.speaking_run(run.confirm.to_dict("records"), str(best["trial_id"]))
        if speaker is not None:
            return speaker
    if "batch_size" in best and "lr" in best:
        match = trials[(trials["batch_size"] == best["batch_size"])]
        if not match.empty:
            gap = (match["lr"] - float(best["lr"])).abs()
            row = match.loc[gap.idxmin()]
            if math.isclose(float(row["lr"]), float(best["lr"]), rel_tol=1e-6, abs_tol=1e-12):
                return str(row["trial_id"])
    # No usable summary: the sweep's own rule over trials.csv.
    numeric = trials.assign(
        **{c: pd.to_numeric(trials[c], errors="coerce") for c in ("env_steps", "episode_return_mean")}
    )
    ranked = runfolder.rank_trials(numeric.astype(object).where(numeric.notna(), None).to_dict("records"))
    return str(ranked[0]["trial_id"]) if ranked else None


def subject_history(run: RunFolder) -> pd.DataFrame:
    """The rows the acceptance checks judge: a train run's history, or a sweep's best trial."""
    h = run.history
    if run.kind == "train":
        member = (run.summary.get("population") or {}).get("best_trial_id")
        if member is not None:  # a PBT population (rayrl.train.population): its best member
            h = h[h["trial_id"].astype(str) == str(member)]
        return h.sort_values(keys.ITERATION, kind="stable").reset_index(drop=True)
    trial = best_trial_id(run)
    if trial is None:
        return h.iloc[0:0]
    return h[h["trial_id"] == trial].sort_values(keys.ITERATION, kind="stable").reset_index(drop=True)


def knee_batch(run: RunFolder) -> int | None:
    """The knee of the doubling ladder: summary.json's figure, else the ladder's last paying rung."""
    if run.summary.get("knee_batch_size") is not None:
        return int(run.summary["knee_batch_size"])
    return runfolder.knee(ladder_rows(run.doubling)) if run.doubling is not None else None


def ladder_rows(doubling: pd.DataFrame) -> list[runfolder.LadderRow]:
    """doubling.csv's frame as the ladder rules' rows."""

    def num(v: Any) -> float | None:
        return None if pd.isna(v) else float(v)

    return [
        runfolder.LadderRow(int(r["batch_size"]), num(r["env_steps_per_s"]), num(r["gain"]), str(r["decision"]))
        for _, r in doubling.iterrows()
    ]


def _read_yaml(path: Path, required: bool) -> dict:
    if not path.exists():
        if required:
            raise RunFolderError(
                f"{path}: missing; every run folder has the resolved spec.yaml. This is not a "
                "run folder, or the run crashed before it started."
            )
        return {}
    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise RunFolderError(
            f"{path}: is not valid YAML ({' '.join(str(exc).split())[:200]}); the file is damaged."
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RunFolderError(f"{path}: holds {type(data).__name__}, not a mapping; the file is damaged.")
    return data


def _read_json(path: Path, required: bool) -> dict:
    if not path.exists():
        if required:
            raise RunFolderError(f"{path}: missing.")
        return {}
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RunFolderError(f"{path}: is not valid JSON ({exc}); the file is damaged or was cut short.") from None
    if not isinstance(data, dict):
        raise RunFolderError(f"{path}: holds {type(data).__name__}, not a JSON object; the file is damaged.")
    return data


def _read_csv(path: Path, columns: tuple[str, ...], allow_empty: bool = False) -> pd.DataFrame:
    if not path.exists():
        raise RunFolderError(
            f"{path}: missing; a run folder of this kind has it. The run crashed before "
            "writing it, or files were removed."
        )
    try:
        df = pd.read_csv(path, dtype={c: "string" for c in STRING_COLUMNS if c in columns})
    except pd.errors.EmptyDataError:
        raise RunFolderError(f"{path}: is empty (no header); the file is damaged.") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise RunFolderError(
            f"{path}: is not a readable CSV ({' '.join(str(exc).split())[:200]}); the file is damaged."
        ) from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise RunFolderError(
            f"{path}: lacks column(s) {', '.join(missing)}; expected {', '.join(columns)}. The "
            "file is damaged or from another version of rayrl."
        )
    if df.empty and not allow_empty:
        raise RunFolderError(f"{path}: has a header but no rows; the run reported no iteration yet.")
    for c in columns:
        if c not in STRING_COLUMNS:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def _check_numbers(path: Path, df: pd.DataFrame, columns: tuple[str, ...], required: bool) -> None:
    """Columns the readers turn into integers or sizes: finite (and present in every row if required)."""
    for c in columns:
        values = df[c]
        bad = ~np.isfinite(values) if required else np.isinf(values)
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0]) + 2  # 1-based, after the header line
            raise RunFolderError(
                f"{path}: line {row}: {c} is {df[c].iloc[row - 2]!r}, not a finite number; the file is damaged."
            )


def _spec_sections(path: Path, spec: dict) -> dict[str, Any]:
    """The sections the readers use, validated and built as the spec builds them.

    Only these: the spec as a whole is not re-validated, so an env factory need not import on the
    analysis machine.
    """
    from rayrl import spec as spec_mod

    for section, value in spec.items():
        if section not in ("name", "seed") and value is not None and not isinstance(value, dict):
            raise RunFolderError(
                f"{path}: {section} = {value!r} is not a section of key: value pairs; the file is damaged."
            )
    classes = {
        "resources": spec_mod.ResourcesSpec,
        "stop": spec_mod.StopSpec,
        "search": spec_mod.SearchSpec,
        "cost": spec_mod.CostSpec,
        "acceptance": spec_mod.AcceptanceSpec,
        "evaluation": spec_mod.EvaluationSpec,
    }
    try:
        return {name: spec_mod.build_section(cls, spec.get(name), name) for name, cls in classes.items()}
    except SpecError as exc:
        raise RunFolderError(f"{path}: {exc} The file is damaged.") from None


def _check_summary(path: Path, summary: dict) -> None:
    """The summary fields the readers use have the types rayrl writes."""
    best, knee = summary.get("best"), summary.get("knee_batch_size")
    if best is not None and not (
        isinstance(best, dict) and all(_is_number(best.get(k)) for k in ("batch_size", "lr", "episode_return_mean"))
    ):
        raise RunFolderError(
            f"{path}: best = {best!r} is not an object with numeric batch_size, lr and "
            "episode_return_mean; the file is damaged."
        )
    if not _is_number(knee) or (knee is not None and not math.isfinite(knee)):
        raise RunFolderError(f"{path}: knee_batch_size = {knee!r} is not a number; the file is damaged.")
    res = summary.get("resources")
    if res is not None and not (
        isinstance(res, dict)
        and all(res[k] is not None and _is_number(res[k]) for k in ("gpus_per_trial", "cpus_per_trial") if k in res)
    ):
        raise RunFolderError(
            f"{path}: resources = {res!r} is not an object with numeric gpus_per_trial and "
            "cpus_per_trial; the file is damaged."
        )


def _read_drill(path: Path) -> dict | None:
    if not path.exists():
        return None
    data = _read_json(path, required=True)
    drills = data.get("drills")
    rate = data.get("restore_rate")
    if not isinstance(drills, list) or not all(isinstance(d, dict) for d in drills):
        raise RunFolderError(f"{path}: 'drills' is not a list of objects; the file is damaged.")
    for i, d in enumerate(drills):
        if d.get("outcome") not in ("recovered", "failed") or not _is_number(d.get("recovery_s", 0)):
            raise RunFolderError(
                f"{path}: drills[{i}] = {d!r} needs outcome 'recovered' or 'failed' and a "
                "numeric recovery_s; the file is damaged."
            )
    if rate is not None and (not _is_number(rate) or not 0.0 <= float(rate) <= 1.0):
        raise RunFolderError(f"{path}: restore_rate {rate!r} is not a fraction 0..1; the file is damaged.")
    return data


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))
