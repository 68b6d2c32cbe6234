"""Launcher YAMLs (`ray up`): what Ray's own launcher makes of the file, then rayrl's rules.

Ray's launcher hides some mistakes: it fills every top-level key a file leaves out from its own
defaults.yaml (a missing `setup_commands` installs a nightly development wheel of Ray). So the
file goes through Ray's own default-filling and schema (`prepare_config`, `validate_config`)
here, every key Ray would fill behind the user's back is named, and then the rules in
`rayrl.cluster.launcher_rules` run. Nothing here starts Ray or reaches a cloud.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import functools
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rayrl.cluster import credentials, exposure
from rayrl.cluster import launcher_rules as rules
from rayrl.cluster.common import dotted, one_line, short

# Ray builds the one node type of an on-premise (provider: local) cluster itself.
LOCAL_BUILT_KEYS = {"available_node_types", "head_node_type"}


def validate_launcher(config: dict) -> list[str]:
    """Problems with a launcher config: Ray's default-filling and schema first, then rayrl's rules."""
    import ray

    provider = config.get("provider")
    if not isinstance(provider, dict) or not isinstance(provider.get("type"), str):
        return [
            "provider.type: missing; name the cloud (provider: {type: aws, region: ...}), or give "
            "apiVersion and kind for a KubeRay manifest."
        ]
    from ray.autoscaler._private.providers import _DEFAULT_CONFIGS

    known = sorted(set(_DEFAULT_CONFIGS) | {"external"})
    if provider["type"] not in known:
        near = difflib.get_close_matches(provider["type"], known, n=1, cutoff=0.5)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        return [
            f"provider.type: {provider['type']!r} is not a provider Ray's launcher knows{hint}; valid: "
            f"{', '.join(known)}."
        ]
    if provider["type"] == "local" and (written := sorted(LOCAL_BUILT_KEYS & set(config))):
        return [
            f"{key}: not allowed with provider local (Ray builds the single on-premise node type itself); "
            "remove it and list the machines in provider.head_ip and provider.worker_ips."
            for key in written
        ]
    problems, prepared = _ray_checks(config)
    if prepared is None:
        return problems
    checks = (
        lambda: _filled_keys(config, prepared),
        lambda: rules.image_problems(config, ray.__version__),
        lambda: rules.auth_problems(config),
        lambda: rules.start_flag_problems(config),
        lambda: rules.gpu_problems(config),
        lambda: rules.worker_count_problems(config, prepared),
        lambda: rules.security_problems(config),
        lambda: credentials.credential_problems(config),
        lambda: rules.setup_problems(config),
        lambda: exposure.core_dump_problems(config),
        lambda: exposure.public_ip_problems(config),
        lambda: exposure.port_problems(config),
    )
    schema_failed = bool(problems)
    for check in checks:
        try:
            problems += check()
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            if not schema_failed:  # a shape Ray's schema allows but rayrl's rules do not expect
                problems.append(
                    f"a section has an unexpected shape ({type(exc).__name__}: {one_line(exc)}); "
                    "compare it with cluster_configs/gpu.yaml."
                )
    return problems


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Swallow what Ray's launcher code prints and logs while it reads a config."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(previous)


@functools.lru_cache(maxsize=1)
def _ray_schema() -> dict:
    import ray.autoscaler

    return json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())


def _ray_checks(config: dict) -> tuple[list[str], dict | None]:
    """Ray's prepare_config, then Ray's schema (every error) and Ray's validate_config."""
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    try:
        with _quiet():
            prepared = prepare_config(copy.deepcopy(config))
    except Exception as exc:  # Ray raises KeyError, AssertionError, click exceptions ... here
        return [
            f"Ray's launcher cannot read it ({type(exc).__name__}: {one_line(exc)}); fix the key it "
            "names (compare with cluster_configs/gpu.yaml)."
        ], None
    if (where := _non_string_key(prepared)) is not None:  # Ray's schema check raises TypeError on them
        return [
            f"{where}: a key that is not a string; YAML reads unquoted 0:, 1.5: or true: as numbers and "
            "booleans, quote it."
        ], None
    errors = sorted(
        jsonschema.Draft7Validator(_ray_schema()).iter_errors(prepared), key=lambda e: [str(p) for p in e.path]
    )
    problems = [
        f"{dotted(e.absolute_path) or 'top level'}: {one_line(e.message)} (Ray's cluster schema); fix or remove it."
        for e in errors
    ]
    if not problems:
        try:
            with _quiet():
                validate_config(prepared)
        except Exception as exc:
            problems.append(f"Ray's launcher rejects it: {one_line(exc)}")
    return problems, prepared


def _non_string_key(node: Any, path: tuple = ()) -> str | None:
    """Dotted path of the first mapping key that is not a string, else None."""
    if isinstance(node, dict):
        for key, value in node.items():
            if not isinstance(key, str):
                return dotted((*path, key))
            if (found := _non_string_key(value, (*path, key))) is not None:
                return found
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if (found := _non_string_key(value, (*path, i))) is not None:
                return found
    return None


def _filled_keys(config: dict, prepared: dict) -> list[str]:
    """Keys Ray's defaults would fill in: every key the launcher reads must be written out."""
    local = config["provider"]["type"] == "local"
    unknown = [k for k in config if k not in _ray_schema()["properties"]]
    problems = []
    for key in prepared:
        if key not in config and not (local and key in LOCAL_BUILT_KEYS):
            near = difflib.get_close_matches(key, unknown, n=1, cutoff=0.7)
            hint = f" (is {near[0]!r} a misspelling of it?)" if near else ""
            problems.append(
                f"{key}: missing{hint}, so Ray's launcher silently fills it from its "
                f"{config['provider']['type']} defaults with {short(prepared[key])}; write the key "
                "explicitly (an empty value if you want none)."
            )
    if local:
        return problems
    for name, node in prepared.get("available_node_types", {}).items():
        raw = (config.get("available_node_types") or {}).get(name) or {}
        for key in node:
            if key not in raw:
                problems.append(
                    f"available_node_types.{name}.{key}: missing, so Ray fills it with "
                    f"{short(node[key])}; write it explicitly."
                )
    return problems
