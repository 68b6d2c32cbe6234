"""``search.space``: the spec fields the search varies beside batch x lr, and their ranges.

The ladder bounds the batch and ``search.lr_min``/``lr_max`` the lr; ``search.space`` adds any
numeric or choice field of the ``algo`` and ``model`` sections, e.g.
``{algo.gamma: {low: 0.95, high: 0.999}, algo.epochs: {choices: [4, 10, 20]}}``. Pure functions of
the spec (no Ray, no Optuna import): an entry is checked with the spec, so a bad one exits 2 before
any trial starts, and the names a searched value takes (its trial config key, its CSV column) are
decided here once.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from rayrl.errors import SpecError

SECTIONS = ("algo", "model")  #: the sections whose fields a search may vary
#: fields of those sections the space may not take, and what sets them instead
NOT_SEARCHABLE = {
    "algo.name": "the algorithm is the spec's; sweep each algorithm with its own config",
    "algo.lr": "the lr's range is search.lr_min..search.lr_max",
    "algo.train_batch_per_learner": "the batch comes from the ladder (search.doubling) and search.min_batch",
    "algo.report_env_steps": "it sets how often results are reported, not how the agent learns",
    "algo.sample_ahead": "it needs remote env runners (resources), which a trial cannot change alone",
    "model.lstm": "a recurrent module changes the runner and the batch layout; give it its own spec",
    "model.conv_filters": "the CNN's layers are the spec's; give each architecture its own spec",
}
ENTRY_KEYS = ("low", "high", "log", "choices")
#: trials.csv / confirm.csv columns a searched field's short name must not shadow
RESERVED_COLUMNS = frozenset(
    {"trial_id", "batch_size", "lr", "env_steps", "episode_return_mean", "status", "candidate", "seed"}
)
PARAM_PREFIX = "rayrl_"  #: a searched value's key in a trial's config: rayrl_algo.gamma


@dataclass(frozen=True)
class Dim:
    """One searched field: a range (``low``..``high``, log-uniform when ``log``; integers for an int
    field) or a list of ``choices``."""

    field: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False
    choices: tuple = ()

    @property
    def param(self) -> str:
        return PARAM_PREFIX + self.field

    def suggest(self, trial: Any) -> Any:
        """The value an Optuna trial (or Tune's captor of one) proposes for this field."""
        if self.choices:
            # Optuna's categorical takes scalars only: a list choice ([64, 64]) travels as its JSON.
            encoded = [json.dumps(c) if isinstance(c, list) else c for c in self.choices]
            picked = trial.suggest_categorical(self.param, encoded)
            return json.loads(picked) if isinstance(picked, str) and picked.startswith("[") else picked
        if self.integer:
            return trial.suggest_int(self.param, int(self.low or 0), int(self.high or 0), log=self.log)
        return trial.suggest_float(self.param, float(self.low or 0.0), float(self.high or 0.0), log=self.log)


def _leaves(spec_cls: type) -> dict[str, tuple[Any, Mapping[str, Any]]]:
    """``section.field`` -> (type, metadata) for every leaf of the searchable sections."""
    hints = typing.get_type_hints(spec_cls)
    out: dict[str, tuple[Any, Mapping[str, Any]]] = {}
    for section in SECTIONS:
        cls = hints[section]
        types = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            out[f"{section}.{f.name}"] = (types[f.name], f.metadata)
    return out


def _base_type(tp: Any) -> Any:
    """``int`` for ``int | None`` and so on: the type a value of the field must have."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if typing.get_origin(tp) is not None and len(args) == 1 else tp


def dims(spec: Any) -> list[Dim]:
    """The spec's space as Dims, in the order the spec lists them (checked by :func:`check`)."""
    leaves = _leaves(type(spec))
    out = []
    for name, entry in spec.search.space.items():
        integer = _base_type(leaves[name][0]) is int
        if "choices" in entry:
            out.append(Dim(name, choices=tuple(entry["choices"])))
        else:
            out.append(Dim(name, low=entry["low"], high=entry["high"], log=bool(entry.get("log")), integer=integer))
    return out


def check(spec: Any, convert: Callable[[str, Any, Any, Mapping[str, Any]], Any]) -> None:
    """Refuse a space entry that names no searchable field, has no valid range, or admits a value the
    field itself refuses. ``convert`` is the spec loader's one-field check (type, range, choices)."""
    space = spec.search.space
    leaves = _leaves(type(spec))
    searchable = sorted(n for n in leaves if n not in NOT_SEARCHABLE)
    for name, entry in space.items():
        where = f"search.space.{name}"
        if name in NOT_SEARCHABLE:
            raise SpecError(f"{where}: {name} cannot be searched: {NOT_SEARCHABLE[name]}.")
        if name not in leaves:
            near = difflib.get_close_matches(str(name), searchable, n=1, cutoff=0.5)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise SpecError(
                f"{where}: not a field the search can vary; {hint}searchable fields: {', '.join(searchable)}."
            )
        if not isinstance(entry, Mapping):
            raise SpecError(
                f"{where}: {entry!r} is not a range; give {{low: L, high: H}} (log: true for a log-uniform "
                "range) or {choices: [a, b, ...]}."
            )
        unknown = sorted(set(map(str, entry)) - set(ENTRY_KEYS))
        if unknown:
            raise SpecError(f"{where}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(ENTRY_KEYS)}.")
        tp, meta = leaves[name]
        base = _base_type(tp)
        if "choices" in entry:
            _check_choices(where, entry, tp, meta, convert)
            continue
        if "low" not in entry or "high" not in entry:
            raise SpecError(f"{where}: give both low and high (a range), or choices (a list of values).")
        if base not in (int, float):
            raise SpecError(
                f"{where}: {name} is not a number ({getattr(base, '__name__', base)}); give choices: [...] instead "
                "of low/high."
            )
        low, high = (convert(f"{where}.{k}", entry[k], base, meta) for k in ("low", "high"))
        if not low < high:
            raise SpecError(f"{where}: low {low!r} is not below high {high!r}; the range must be non-empty.")
        log = entry.get("log", False)
        if not isinstance(log, bool):
            raise SpecError(f"{where}.log: {log!r} is not true or false.")
        if log and low <= 0:
            raise SpecError(f"{where}: log: true needs low > 0 (a log-uniform range), got low {low!r}.")


def _check_choices(
    where: str, entry: Mapping[str, Any], tp: Any, meta: Mapping[str, Any], convert: Callable[..., Any]
) -> None:
    if set(entry) & {"low", "high", "log"}:
        raise SpecError(f"{where}: give either choices or low/high, not both.")
    choices = entry["choices"]
    if not isinstance(choices, list) or not choices:
        raise SpecError(f"{where}.choices: {choices!r} is not a non-empty list of values.")
    seen: list[Any] = []
    for i, value in enumerate(choices):
        value = convert(f"{where}.choices[{i}]", value, tp, meta)
        if value in seen:
            raise SpecError(f"{where}.choices: {value!r} is listed twice.")
        seen.append(value)


def columns(fields: Sequence[str]) -> dict[str, str]:
    """field -> its trials.csv / confirm.csv column: the short name (``gamma``) unless two fields share
    it or it is one of the standard columns, then the dotted name."""
    short = [f.rsplit(".", 1)[-1] for f in fields]
    return {
        f: s if short.count(s) == 1 and s not in RESERVED_COLUMNS else f for f, s in zip(fields, short, strict=True)
    }


def parse_cell(text: Any) -> Any:
    """A searched value read back from a CSV cell ("0.97", "10", "[64, 64]", "true"); empty: None; a
    value not read from a file (a row built in this process) as it is."""
    if text in (None, ""):
        return None
    return yaml.safe_load(text) if isinstance(text, str) else text


def cell(value: Any) -> Any:
    """A searched value as a CSV cell (lists as flow YAML, so :func:`parse_cell` reads them back)."""
    return json.dumps(value) if isinstance(value, list) else value


def sections(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"algo.gamma": 0.97, "model.hidden": [..]}`` -> ``{"algo": {"gamma": 0.97}, "model": {...}}``."""
    out: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        section, key = name.split(".", 1)
        out.setdefault(section, {})[key] = value
    return out


def own_values(spec: Any) -> dict[str, Any]:
    """The spec's own value of every searched field (the confirmation's baseline candidate)."""
    out = {}
    for name in spec.search.space:
        section, key = name.split(".", 1)
        out[name] = getattr(getattr(spec, section), key)
    return out
