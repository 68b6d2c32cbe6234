"""Bucket lifecycle rules (S3, GCS) checked offline against the guide's tiers: hot 7 days, warm 30, then archive.

rayrl keeps a run's files under the storage URI forever (run-folder files are kilobytes; Tune
keeps ``checkpoint.keep`` checkpoints per trial). What ages them is the bucket's lifecycle
configuration, shipped in cluster_configs/storage/ and applied with the cloud's own tool. These
rules catch the mistakes that cost money or data: tiers on other days than the guide's, a
transition the cloud refuses, an expiration that deletes runs before they are archived, and no
clean-up of interrupted multipart uploads (a preempted checkpoint upload is billed forever).
"""

from __future__ import annotations

from typing import Any

HOT_DAYS = 7  # objects stay in the standard class this long
WARM_DAYS = 30  # then this long in a cheaper, still instantly readable class; then archive
ARCHIVE_DAY = HOT_DAYS + WARM_DAYS

# Colder to the right; the value is the class's rank.
S3_CLASSES = {
    "STANDARD_IA": 1,
    "ONEZONE_IA": 1,
    "INTELLIGENT_TIERING": 1,
    "GLACIER_IR": 2,
    "GLACIER": 3,
    "DEEP_ARCHIVE": 4,
}
S3_ARCHIVE = ("GLACIER", "DEEP_ARCHIVE")
S3_MIN_DAYS = {"STANDARD_IA": 30, "ONEZONE_IA": 30}  # S3 refuses earlier transitions to these
GCS_CLASSES = {"STANDARD": 0, "NEARLINE": 1, "COLDLINE": 2, "ARCHIVE": 3}
GCS_ACTIONS = ("SetStorageClass", "Delete", "AbortIncompleteMultipartUpload")


def kind(doc: Any) -> str | None:
    """'s3' or 'gcs' for a lifecycle configuration, else None (not a lifecycle file)."""
    if isinstance(doc, dict) and "Rules" in doc:
        return "s3"
    if isinstance(doc, dict) and ("rule" in doc or "lifecycle" in doc):
        return "gcs"
    return None


def _tiers(steps: list[tuple[int, str, int]], archive: tuple[str, ...], where: str) -> list[str]:
    """Problems with (day, class, rank) transitions against the guide's tiers."""
    problems = []
    steps = sorted(steps)
    for (d1, c1, r1), (d2, c2, r2) in zip(steps, steps[1:]):
        if r2 <= r1:
            problems.append(
                f"{where}: {c2} on day {d2} is not colder than {c1} on day {d1}; each transition must "
                "move to a colder class."
            )
    if not steps or steps[0][0] != HOT_DAYS:
        first = f"day {steps[0][0]}" if steps else "none"
        problems.append(
            f"{where}: the first transition (warm) is {first}; the guide keeps runs hot for {HOT_DAYS} "
            f"days, so make it day {HOT_DAYS}."
        )
    at_archive = [s for s in steps if s[1] in archive]
    if not at_archive or at_archive[0][0] != ARCHIVE_DAY:
        found = f"day {at_archive[0][0]}" if at_archive else "none"
        problems.append(
            f"{where}: the transition to an archive class ({' or '.join(archive)}) is {found}; the guide "
            f"archives after {HOT_DAYS} hot + {WARM_DAYS} warm days, i.e. day {ARCHIVE_DAY}."
        )
    return problems


def validate_s3(doc: dict) -> list[str]:
    """Problems with an S3 lifecycle configuration (`aws s3api put-bucket-lifecycle-configuration` JSON)."""
    rules = doc.get("Rules")
    if not isinstance(rules, list) or not rules or not all(isinstance(r, dict) for r in rules):
        return ["Rules: must be a non-empty list of rules (see cluster_configs/storage/s3-lifecycle.json)."]
    problems: list[str] = []
    enabled = [r for r in rules if r.get("Status") == "Enabled"]
    for i, rule in enumerate(rules):
        where = f"Rules.{i}"
        if rule.get("Status") not in ("Enabled", "Disabled"):
            problems.append(f"{where}.Status: {rule.get('Status')!r} is not 'Enabled' or 'Disabled'.")
        if "Filter" not in rule and "Prefix" not in rule:
            problems.append(
                f"{where}: no Filter; give Filter.Prefix (e.g. 'rayrl-runs/') so the rule ages only "
                "the runs' prefix, not the whole bucket."
            )
        steps = []
        for j, t in enumerate(rule.get("Transitions") or []):
            days, cls = (
                t.get("Days") if isinstance(t, dict) else None,
                t.get("StorageClass") if isinstance(t, dict) else None,
            )
            if not isinstance(days, int) or isinstance(days, bool) or days < 0:
                problems.append(f"{where}.Transitions.{j}.Days: {days!r} is not a whole number of days >= 0.")
                continue
            if cls not in S3_CLASSES:
                problems.append(f"{where}.Transitions.{j}.StorageClass: {cls!r} is not one of {', '.join(S3_CLASSES)}.")
                continue
            if days < S3_MIN_DAYS.get(cls, 0):
                problems.append(
                    f"{where}.Transitions.{j}: S3 refuses {cls} before day {S3_MIN_DAYS[cls]} (day {days}); "
                    "use GLACIER_IR for a warm tier on day 7."
                )
            steps.append((days, cls, S3_CLASSES[cls]))
        if rule.get("Status") == "Enabled":
            problems += _tiers(steps, S3_ARCHIVE, f"{where}.Transitions")
        expire = (rule.get("Expiration") or {}).get("Days")
        if isinstance(expire, int) and expire <= ARCHIVE_DAY:
            problems.append(
                f"{where}.Expiration.Days: {expire} deletes runs before they are archived (day "
                f"{ARCHIVE_DAY}); rayrl's results and checkpoints would be lost. Remove it or make it later."
            )
        abort = (rule.get("AbortIncompleteMultipartUpload") or {}).get("DaysAfterInitiation")
        if rule.get("Status") == "Enabled" and not isinstance(abort, int):
            problems.append(
                f"{where}: no AbortIncompleteMultipartUpload.DaysAfterInitiation; an upload cut off by a "
                "preemption stays billed forever. Add it (1 day)."
            )
    if not enabled:
        problems.append("Rules: no rule has Status 'Enabled'; nothing would age.")
    return problems


def validate_gcs(doc: dict) -> list[str]:
    """Problems with a GCS lifecycle configuration (`gcloud storage buckets update --lifecycle-file` JSON)."""
    rules = doc.get(
        "rule", (doc.get("lifecycle") or {}).get("rule") if isinstance(doc.get("lifecycle"), dict) else None
    )
    if not isinstance(rules, list) or not rules or not all(isinstance(r, dict) for r in rules):
        return [
            "rule: must be a non-empty list of {action, condition} (see cluster_configs/storage/gcs-lifecycle.json)."
        ]
    problems: list[str] = []
    steps, aborts = [], 0
    for i, rule in enumerate(rules):
        where = f"rule.{i}"
        action, cond = rule.get("action") or {}, rule.get("condition") or {}
        typ, age = action.get("type"), cond.get("age")
        if typ not in GCS_ACTIONS:
            problems.append(f"{where}.action.type: {typ!r} is not one of {', '.join(GCS_ACTIONS)}.")
            continue
        if not isinstance(age, int) or isinstance(age, bool) or age < 0:
            problems.append(f"{where}.condition.age: {age!r} is not a whole number of days >= 0.")
            continue
        if not cond.get("matchesPrefix"):
            problems.append(
                f"{where}.condition: no matchesPrefix; give the runs' prefix (e.g. ['rayrl-runs/']) so "
                "the rule ages only runs, not the whole bucket."
            )
        if typ == "SetStorageClass":
            cls = action.get("storageClass")
            if cls not in GCS_CLASSES or cls == "STANDARD":
                problems.append(f"{where}.action.storageClass: {cls!r} is not one of NEARLINE, COLDLINE, ARCHIVE.")
                continue
            steps.append((age, cls, GCS_CLASSES[cls]))
        elif typ == "Delete" and age <= ARCHIVE_DAY:
            problems.append(
                f"{where}: Delete at age {age} deletes runs before they are archived (day "
                f"{ARCHIVE_DAY}); rayrl's results and checkpoints would be lost. Remove it or make it later."
            )
        else:
            aborts += typ == "AbortIncompleteMultipartUpload"
    problems += _tiers(steps, ("ARCHIVE",), "rule")
    if not aborts:
        problems.append(
            "rule: no AbortIncompleteMultipartUpload action; an upload cut off by a preemption stays "
            "billed forever. Add one (age 1)."
        )
    return problems


def validate_lifecycle(doc: dict) -> list[str]:
    """Problems with a lifecycle file of either cloud."""
    return validate_s3(doc) if kind(doc) == "s3" else validate_gcs(doc)
