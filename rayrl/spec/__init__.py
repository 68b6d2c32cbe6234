"""The experiment spec: one YAML file -> frozen dataclasses, validated before any Ray work.

``schema`` declares the sections and documents every field, ``load`` turns YAML and --set overrides
into a validated :class:`Spec`, ``preflight`` checks what the spec names outside itself (env ids,
factories, extras). This package's names are the spec's public interface.
"""

from rayrl.errors import SpecError
from rayrl.spec.load import (apply_overrides, build_section, dumps, from_dict, load, read_yaml, replace,
                             to_dict, validate)
from rayrl.spec.preflight import import_callable, resolve_factory
from rayrl.spec.schema import (ACTIVATIONS, ALGORITHMS, ENV_BACKENDS, JUDGES, LR_SCALING, OBJECTIVES, PRECISIONS,
                               RUNNERS, SCHEDULERS, WANDB_MODES, AcceptanceSpec, AlgoSpec, CheckpointSpec, CostSpec,
                               DoublingSpec, EnvSpec, EvaluationSpec, MlflowSpec, ModelSpec, PopulationSpec,
                               PrecisionSpec, ResourcesSpec, SearchSpec, Spec, StopSpec, TrackingSpec, WandbSpec,
                               doc, field_table, judged_by, scaled_lr)

__all__ = [
    "ACTIVATIONS", "ALGORITHMS", "ENV_BACKENDS", "JUDGES", "LR_SCALING", "OBJECTIVES", "PRECISIONS", "RUNNERS",
    "SCHEDULERS", "WANDB_MODES", "AcceptanceSpec", "AlgoSpec", "CheckpointSpec", "CostSpec", "DoublingSpec",
    "EnvSpec", "EvaluationSpec", "MlflowSpec", "ModelSpec", "PopulationSpec", "PrecisionSpec", "ResourcesSpec",
    "SearchSpec", "Spec", "SpecError", "StopSpec", "TrackingSpec", "WandbSpec", "apply_overrides", "build_section",
    "doc", "dumps", "field_table", "from_dict", "import_callable", "judged_by", "load", "read_yaml",
    "replace", "resolve_factory", "scaled_lr", "to_dict", "validate",
]
