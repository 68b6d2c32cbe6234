"""Bucket lifecycle rules beside the cluster configs: shipped files pass, each broken variant is named."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ROOT

from rayrl.cluster.cli import validate_file
from rayrl.cluster.storage_rules import ARCHIVE_DAY, HOT_DAYS, validate_lifecycle

STORAGE = ROOT / "cluster_configs" / "storage"


def _load(name: str) -> dict:
    return json.loads((STORAGE / name).read_text())


@pytest.mark.parametrize("name", ["s3-lifecycle.json", "gcs-lifecycle.json"])
def test_shipped_lifecycle_files_are_valid_and_follow_the_guide(name):
    assert validate_file(STORAGE / name) == []
    doc = _load(name)
    days = (
        [t["Days"] for t in doc["Rules"][0]["Transitions"]]
        if "Rules" in doc
        else [r["condition"]["age"] for r in doc["rule"] if r["action"]["type"] == "SetStorageClass"]
    )
    assert days == [HOT_DAYS, ARCHIVE_DAY] == [7, 37]


def _s3(rule: dict) -> dict:
    return rule["Rules"][0]


S3_BREAKS: list[tuple[Callable[[dict], None], str]] = [
    (lambda d: _s3(d)["Transitions"][0].update(StorageClass="STANDARD_IA"), "S3 refuses STANDARD_IA before day 30"),
    (lambda d: _s3(d)["Transitions"][1].update(Days=90), "is day 90"),
    (lambda d: _s3(d)["Transitions"][0].update(Days=14), "the first transition (warm) is day 14"),
    (lambda d: _s3(d)["Transitions"][1].update(StorageClass="GLACIER_IR"), "is not colder than GLACIER_IR"),
    (lambda d: _s3(d).update(Expiration={"Days": 10}), "Expiration.Days: 10 deletes runs"),
    (lambda d: _s3(d).pop("AbortIncompleteMultipartUpload"), "AbortIncompleteMultipartUpload"),
    (lambda d: _s3(d).pop("Filter"), "no Filter"),
    (lambda d: _s3(d).update(Status="On"), "Status: 'On'"),
    (lambda d: _s3(d)["Transitions"][0].update(StorageClass="COLD"), "StorageClass: 'COLD'"),
]
GCS_BREAKS: list[tuple[Callable[[dict], None], str]] = [
    (lambda d: d["rule"][1]["condition"].update(age=60), "is day 60"),
    (
        lambda d: d["rule"].append({"action": {"type": "Delete"}, "condition": {"age": 30, "matchesPrefix": ["r/"]}}),
        "Delete at age 30 deletes runs",
    ),
    (lambda d: d["rule"].pop(2), "no AbortIncompleteMultipartUpload"),
    (lambda d: d["rule"][0]["condition"].pop("matchesPrefix"), "rule.0.condition: no matchesPrefix"),
    (lambda d: d["rule"][0]["action"].update(storageClass="ARCHIVE"), "is not colder than ARCHIVE"),
]


@pytest.mark.parametrize(
    "name, mutate, words",
    [("s3-lifecycle.json", m, w) for m, w in S3_BREAKS] + [("gcs-lifecycle.json", m, w) for m, w in GCS_BREAKS],
)
def test_broken_lifecycle_variants_are_named(name, mutate, words):
    doc = copy.deepcopy(_load(name))
    mutate(doc)
    problems = validate_lifecycle(doc)
    assert any(words in p for p in problems), problems


def test_cluster_validate_exits_2_on_a_bad_lifecycle_file(tmp_path: Path):
    doc = _load("gcs-lifecycle.json")
    doc["rule"][0]["condition"]["age"] = 30
    bad = tmp_path / "gcs.json"
    bad.write_text(json.dumps(doc))
    proc = subprocess.run(
        [sys.executable, "-m", "rayrl.cli", "cluster", "validate", str(bad), str(STORAGE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "the first transition (warm) is day 30" in proc.stderr
    assert f"OK {STORAGE / 's3-lifecycle.json'}" in proc.stdout and "Traceback" not in proc.stderr
