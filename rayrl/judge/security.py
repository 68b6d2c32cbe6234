"""The report's security section: pure verdicts on posture.json (rayrl.security.posture records it).

Not a sixth acceptance part (the guide's five stay five): a separate table with the same
PASS / FAIL / N/A words, so a run that trains well on an open cluster still shows red here.
"""

from __future__ import annotations

from typing import Any

from rayrl.judge.acceptance import FAIL, NA, PASS, Check
from rayrl.security.posture import off_loopback

PART = "security"


def checks(posture: dict[str, Any] | None) -> list[Check]:
    """One check each for auth, TLS, listeners and run-folder permissions; N/A without posture.json."""
    if not posture:
        return [Check(PART, "posture recorded", "posture.json", "missing (run from before rayrl recorded it)", NA)]
    exposed = off_loopback(posture.get("listeners") or [])
    auth = posture.get("auth_mode")
    out = [
        Check(
            PART,
            "token authentication",
            "token",
            str(auth),
            PASS if auth == "token" else NA if auth == "unknown" else FAIL,
        )
    ]
    if posture.get("tls"):
        out.append(Check(PART, "TLS between Ray processes", "on where traffic leaves the node", "on", PASS))
    else:
        out.append(
            Check(
                PART,
                "TLS between Ray processes",
                "on where traffic leaves the node",
                "off",
                NA if not exposed else FAIL,
            )
        )
    ports = sorted({r["port"] for r in exposed})
    shown = ", ".join(map(str, ports[:12])) + (" ..." if len(ports) > 12 else "")
    if not exposed:
        out.append(Check(PART, "Ray listeners off loopback", "none, or inside a firewalled network", "none", PASS))
    else:
        out.append(
            Check(
                PART,
                "Ray listeners off loopback",
                "none, or inside a firewalled network",
                f"{len(exposed)} on ports {shown}; rayrl cannot see the firewall (docs/security.md)",
                NA if auth == "token" else FAIL,
            )
        )
    storage = posture.get("storage") or {}
    if storage.get("kind") == "local":
        bad = storage.get("symlink") or storage.get("group_or_world_writable") or not storage.get("is_owner")
        out.append(
            Check(
                PART,
                "run folder writable only by its owner",
                "owner only, no symlink",
                f"mode {storage.get('mode')}, uid {storage.get('owner_uid')}",
                FAIL if bad else PASS,
            )
        )
    else:
        out.append(
            Check(
                PART,
                "run folder writable only by its owner",
                "owner only, no symlink",
                f"{storage.get('uri', 'object store')}: the bucket policy decides",
                NA,
            )
        )
    return out


def verdict(rows: list[Check]) -> str:
    verdicts = [c.verdict for c in rows]
    return FAIL if FAIL in verdicts else PASS if PASS in verdicts else NA
