"""Plain data (a parsed YAML file, --set overrides) -> a validated :class:`~rayrl.spec.schema.Spec`.

Every user error raises :class:`~rayrl.errors.SpecError`, whose message names the field, the
value and what would be valid; nothing here starts Ray.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from rayrl.errors import SpecError
from rayrl.spec import preflight, space
from rayrl.spec.schema import MOVED, Spec, is_section

# ---------------------------------------------------------------------------------------------
# Building from plain data


def _describe(tp: Any) -> str:
    if tp is float:
        return "a number"
    if tp is int:
        return "an integer"
    if tp is bool:
        return "true or false"
    if tp is str:
        return "a string"
    if tp is list:
        return "a list"
    if tp is dict:
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _convert(path: str, value: Any, tp: Any, meta: Mapping[str, Any]) -> Any:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (tp,) = [a for a in args if a is not type(None)]
    if is_section(tp):
        return build_section(tp, value, path)
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string; accept what float() does
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(f"{path}: {value!r} is not a number; expected {_describe(tp)}.")
        if isinstance(value, int) and abs(value) >= 2**1023:  # float() would raise OverflowError
            raise SpecError(
                f"{path}: an integer of {len(str(abs(value)))} digits is too large; expected a finite number."
            )
        value = float(value)
        if not math.isfinite(value):
            raise SpecError(f"{path}: {value!r} is not finite; expected a finite number.")
    elif tp is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"{path}: {value!r} is not an integer; expected {_describe(tp)}.")
    elif tp is bool:
        if not isinstance(value, bool):
            raise SpecError(f"{path}: {value!r} is not true or false.")
    elif tp is str:
        if not isinstance(value, str) or not value:
            raise SpecError(f"{path}: {value!r} is not a non-empty string.")
    elif tp is dict:
        if not isinstance(value, dict):
            raise SpecError(f"{path}: {value!r} is not a mapping; expected key: value pairs.")
        value = dict(value)
    elif tp is list:
        if not isinstance(value, (list, tuple)) or not value:
            raise SpecError(f"{path}: {value!r} is not a non-empty list.")
        item = meta.get("item")
        if item is int and any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value):
            raise SpecError(f"{path}: {value!r} must list positive integers, e.g. [64, 64].")
        value = list(value)
    _check_range(path, value, meta)
    return value


def _check_range(path: str, value: Any, meta: Mapping[str, Any]) -> None:
    if "choices" in meta and value not in meta["choices"]:
        near = [c for c in meta["choices"] if c.lower() == str(value).lower()] or difflib.get_close_matches(
            str(value), meta["choices"], n=1, cutoff=0.4
        )
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise SpecError(f"{path}: {value!r} is not valid{hint}; valid: {', '.join(meta['choices'])}.")
    bounds = [
        ("min", ">=", lambda v, b: v >= b),
        ("ge", ">=", lambda v, b: v >= b),
        ("gt", ">", lambda v, b: v > b),
        ("le", "<=", lambda v, b: v <= b),
        ("lt", "<", lambda v, b: v < b),
    ]
    for key, op, ok in bounds:
        if key in meta and isinstance(value, (int, float)) and not ok(value, meta[key]):
            raise SpecError(f"{path}: {value!r} is out of range; it must be {op} {meta[key]}.")


def build_section(cls: type, data: Any, path: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise SpecError(
            f"{path or 'spec'}: {data!r} is not a mapping; expected a section of key: value "
            f"pairs with keys {', '.join(f.name for f in dataclasses.fields(cls))}."
        )
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in fields:
            near = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.5)
            hint = f"did you mean {near[0]!r}? " if near else ""
            if where in MOVED:
                hint = f"it moved to {MOVED[where]}; "
            raise SpecError(
                f"{where}: unknown key; {hint}valid keys{' in ' + path if path else ''}: {', '.join(fields)}."
            )
        kwargs[key] = _convert(where, value, hints[key], fields[key].metadata)
    return cls(**kwargs)


def from_dict(data: Mapping[str, Any] | None) -> Spec:
    """Build and validate a Spec from plain data (a parsed YAML tree)."""
    spec = build_section(Spec, data, "")
    validate(spec)
    return spec


def validate(spec: Spec) -> None:
    """Cross-field rules that single fields cannot express."""
    a, s = spec.algo, spec.search
    if a.minibatch_size > a.train_batch_per_learner:
        raise SpecError(
            f"algo.minibatch_size: {a.minibatch_size} is larger than algo.train_batch_per_learner "
            f"({a.train_batch_per_learner}); it must be at most the train batch."
        )
    if spec.stop.env_steps is None and spec.stop.episode_return is None and spec.stop.wall_s is None:
        raise SpecError("stop: env_steps, episode_return and wall_s are all null; set at least one so the run ends.")
    if s.lr_min >= s.lr_max:
        raise SpecError(
            f"search.lr_min: {s.lr_min} is not below search.lr_max ({s.lr_max}); the lr range must be non-empty."
        )
    if s.doubling.cap < s.doubling.start:
        raise SpecError(
            f"search.doubling.cap: {s.doubling.cap} is below search.doubling.start "
            f"({s.doubling.start}); the cap must admit the first rung."
        )
    if s.grace_env_steps > s.max_env_steps:
        raise SpecError(
            f"search.grace_env_steps: {s.grace_env_steps} exceeds search.max_env_steps "
            f"({s.max_env_steps}); the grace period must fit in the budget."
        )
    if spec.resources.gpus_per_learner > 0 and spec.resources.learners == 0 and spec.resources.gpus_per_learner != 1:
        raise SpecError(
            f"resources.gpus_per_learner: {spec.resources.gpus_per_learner} with learners: 0; "
            "the local learner takes 0 or 1 GPU."
        )
    check_recipe(spec)
    check_sample_ahead(spec)
    space.check(spec, _convert)
    preflight.check_conv_filters(spec.model.conv_filters)
    preflight.check_env(spec.env.id)
    preflight.check_backend(spec.env, spec.env_runner)
    preflight.check_tracking(spec.tracking)
    pop = spec.population
    if pop.size == 1:
        raise SpecError("population.size: 1 is not a population; give 0 (one trial) or 2 or more (PBT).")
    if pop.entropy_min > pop.entropy_max:
        raise SpecError(
            f"population.entropy_min: {pop.entropy_min} is above population.entropy_max "
            f"({pop.entropy_max}); the entropy range must be non-empty."
        )


def check_sample_ahead(spec: Spec) -> None:
    """algo.sample_ahead needs PPO (APPO and IMPALA sample asynchronously already) and a remote runner."""
    if not spec.algo.sample_ahead:
        return
    if spec.algo.name != "PPO":
        raise SpecError(
            f"algo.sample_ahead: true with algo.name {spec.algo.name}; it overlaps PPO's sample-then-learn "
            "step, and APPO and IMPALA already sample while they learn. Use algo.name: PPO or set "
            "algo.sample_ahead: false."
        )
    if spec.resources.env_runners < 1:
        raise SpecError(
            "algo.sample_ahead: true with resources.env_runners: 0; the next batch is sampled by a remote "
            "EnvRunner while the learner trains, so it needs resources.env_runners >= 1 (or set "
            "algo.sample_ahead: false to sample in the trial's process)."
        )


def check_recipe(spec: Spec) -> None:
    """The PPO recipe's fields: which algorithms take them, and that an anneal has a horizon."""
    a, m = spec.algo, spec.model
    ppo_only = {
        "algo.normalize_reward": a.normalize_reward,
        "algo.clip_final": a.clip_final is not None,
        "algo.kl_coeff": a.kl_coeff is not None,
        "model.log_std_init": m.log_std_init is not None,
        "model.init": m.init != "default",
    }
    if a.name != "PPO":
        for name, on in ppo_only.items():
            if on:
                raise SpecError(
                    f"{name}: set with algo.name {a.name}; it is applied by rayrl's PPO learner and module "
                    "only. Use algo.name: PPO or remove the field."
                )
        if a.clip is not None and a.name == "IMPALA":
            raise SpecError("algo.clip: IMPALA has no clipped objective; use PPO or APPO, or set algo.clip: null.")
    for name, final in (
        ("algo.lr_final", a.lr_final),
        ("algo.clip_final", a.clip_final),
        ("algo.entropy_final", a.entropy_final),
    ):
        if final is not None and spec.stop.env_steps is None:
            raise SpecError(
                f"{name}: {final} anneals over stop.env_steps, which is null; set stop.env_steps (the "
                f"schedule's horizon) or set {name}: null for a constant value."
            )


# ---------------------------------------------------------------------------------------------
# Files and overrides


def load(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Spec:
    """Read a YAML spec, apply ``--set a.b=value`` overrides, validate."""
    return from_dict(apply_overrides(read_yaml(path), overrides))


def read_yaml(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise SpecError(
            f"--config: {str(p)!r} does not exist or is not a file; give a YAML spec such as "
            "experiments/configs/cartpole_ppo.yaml."
        )
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"--config: {str(p)!r} is not valid YAML: {' '.join(str(exc).split())}") from None
    except UnicodeDecodeError:
        raise SpecError(f"--config: {str(p)!r} is not a text file; give a YAML spec.") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(
            f"--config: {str(p)!r} holds {type(data).__name__}, not a mapping of sections "
            f"({', '.join(f.name for f in dataclasses.fields(Spec))})."
        )
    return data


def apply_overrides(data: Mapping[str, Any], overrides: list[str] | tuple[str, ...]) -> dict:
    """Apply dotted ``key.path=value`` overrides; values are parsed as YAML (1e-4, true, [64, 64])."""
    out = _deep_copy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise SpecError(f"--set: {item!r} is not of the form section.key=value (e.g. algo.lr=1e-4).")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise SpecError(f"--set {key}: {raw!r} is not a YAML value.") from None
        node: dict = out
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise SpecError(f"--set {key}: {'.'.join(parts[: i + 1])} is a value, not a section.")
            node = child
        node[parts[-1]] = value
    return out


def _deep_copy(data: Any) -> Any:
    if isinstance(data, Mapping):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data


def to_dict(spec: Any) -> dict:
    """Plain data that :func:`from_dict` turns back into an equal Spec."""
    return dataclasses.asdict(spec)


def dumps(spec: Spec) -> str:
    """The spec as the YAML text `rayrl train --config` reads."""
    return yaml.safe_dump(to_dict(spec), sort_keys=False)


def replace(spec: Spec, **sections: Any) -> Spec:
    """A copy of ``spec`` with some fields of some sections changed (a mapping per section, or a value
    for a top-level field such as ``name``), validated again."""
    data = to_dict(spec)
    for section, changes in sections.items():
        if isinstance(changes, Mapping):
            data[section].update(changes)
        else:
            data[section] = changes
    return from_dict(data)
