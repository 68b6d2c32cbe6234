"""What the launcher checks, the KubeRay checks and the fake cluster share.

Both kinds of cluster file name a Docker image whose Ray must equal the installed Ray, and
both kinds of check quote keys and values in one-line messages; keeping those here means the
launcher and KubeRay modules word the same mistake the same way, and nothing is copied.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import yaml

LEARNER_LABEL = ("rayrl.io/role", "learner")  # node types that host learners carry this label


def dotted(path: Sequence[Any]) -> str:
    """A key path as the user writes it in YAML: ('a', 0, 'b') -> 'a.0.b'."""
    return ".".join(str(p) for p in path)


def one_line(value: Any) -> str:
    """``value`` as text with its whitespace runs folded to single spaces, so a message stays one line."""
    return " ".join(str(value).split())


def short(value: Any, limit: int = 110) -> str:
    """``value`` as one line of flow-style YAML, cut to ``limit`` characters, for quoting it in a message."""
    text = one_line(yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("..."))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def image_ray_version(image: str) -> str | None:
    """The Ray version an image tag names: 'rayproject/ray:2.60.0-py311-gpu' -> '2.60.0'.

    Ray's own images (ray, ray-ml, ray-llm) start the tag with it; other images must say
    ``ray2.60.0`` somewhere in the tag (e.g. 'acme/rayrl:0.1.0-ray2.60.0-gpu').
    """
    last = image.rsplit("/", 1)[-1]
    if "@" in last or ":" not in last:
        return None
    repo, tag = last.split(":", 1)
    match = re.search(r"ray-?(\d+\.\d+\.\d+)(?![\d.])", tag)
    if match is None and repo in ("ray", "ray-ml", "ray-llm"):  # rayproject images: the tag starts with it
        match = re.match(r"(\d+\.\d+\.\d+)(?![\d.])", tag)
    return match.group(1) if match else None


def image_version_problem(key: str, image: Any, ray_version: str) -> str | None:
    """A problem when the image at ``key`` does not run ``ray_version``: nodes and driver must agree on Ray."""
    found = image_ray_version(str(image))
    if found == ray_version:
        return None
    if found is None:
        return (
            f"{key}: {image!r} does not say which Ray it runs; use a tag that starts with the Ray version "
            f"(rayproject/ray:{ray_version}-py311-gpu) or contains ray{ray_version}."
        )
    return (
        f"{key}: {image!r} runs Ray {found} but this machine has Ray {ray_version} (pyproject.toml); pin "
        f"the tag to {ray_version}."
    )
