"""PPO's update without RLlib's per-minibatch overhead: sliced tensors, metrics once per update.

RLlib's ``Learner.update`` re-slices a ``SampleBatch`` for every minibatch (its cyclic iterator
wraps round the batch and counts the padded rows PPO adds to every episode chunk), times each
minibatch into a Prometheus histogram, logs ~20 metric values per minibatch of which the
``window=1`` ones keep only the last, and masks every mean. At small batches (256 env steps, 20
epochs) that overhead costs as much as the SGD itself (docs/benchmarks.md, section 7).

This mixin keeps RLlib's learner connector (GAE), loss and hooks, and changes only the loop:

* the padded rows (``loss_mask`` false) are dropped once per update, so each epoch is one
  shuffled pass over the real samples in ``n // minibatch_size`` near-equal minibatches: 20 epochs
  of a 256-step batch are 20 minibatches of 256, not 22 of 256 rows that include the padding;
* every column is indexed once per minibatch (one ``index_select`` per column);
* the loss metrics, the off-policyness and rayrl's step figures are logged for the last
  minibatch only (the same values RLlib's ``window=1`` keeps), and the trained-step counts once
  per update with their totals.

It applies to stateless modules on one learner (no DDP, no ``num_total_minibatches``); anything
else takes RLlib's loop unchanged. ``learner_config_dict['lean_update'] = False`` turns it off.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from ray.rllib.core.learner.torch.torch_learner import TorchLearner as _LearnerBase
else:
    _LearnerBase = object

#: Learner.update keywords the lean loop understands; any other keyword takes RLlib's loop.
_KNOWN = {
    "batch",
    "episodes",
    "batch_refs",
    "episodes_refs",
    "training_data",
    "timesteps",
    "num_epochs",
    "minibatch_size",
    "shuffle_batch_per_epoch",
    "num_total_minibatches",
    "_no_metrics_reduce",
}


class _MutedMetrics:
    """Stands in for the MetricsLogger during the minibatches whose metrics nobody keeps."""

    def __getattr__(self, name: str) -> Any:
        return _noop


def _noop(*args: Any, **kwargs: Any) -> contextlib.nullcontext:
    return contextlib.nullcontext()


_MUTED = _MutedMetrics()


def muted(metrics: Any) -> bool:
    """Whether ``metrics`` is a quiet minibatch's stand-in: what is logged to it is never kept."""
    return metrics is _MUTED


def minibatch_indices(n: int, size: int | None, epochs: int, shuffle: bool) -> Iterator[np.ndarray]:
    """Row indices of each minibatch: per epoch ``n // size`` near-equal minibatches of all rows.

    Every row is used once per epoch, and no minibatch is a sliver: 264 rows at size 256 are one
    minibatch of 264, not one of 256 and one of 8 (8 envs round a 256-step batch up to 264).
    """
    parts = 1 if not size or size >= n else n // size
    for _ in range(max(1, epochs)):
        order = np.random.permutation(n) if shuffle else np.arange(n)
        yield from np.array_split(order, parts)


def update_plan(n: int, kwargs: dict) -> Iterator[np.ndarray]:
    """One update's minibatch indices over ``n`` rows, read from RLlib's update kwargs.

    One epoch is never shuffled: its single pass sees every row anyway, and the order is RLlib's.
    """
    epochs = int(kwargs.get("num_epochs") or 1)
    shuffle = bool(kwargs.get("shuffle_batch_per_epoch")) and epochs > 1
    return minibatch_indices(n, kwargs.get("minibatch_size"), epochs, shuffle)


def lean_columns(columns: dict[str, Any]) -> dict[str, torch.Tensor] | None:
    """The columns with PPO's padded rows dropped; None where a column is not a row tensor."""
    from ray.rllib.core.columns import Columns

    if not columns:
        return None
    n = None
    for value in columns.values():
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            return None
        n = value.shape[0] if n is None else n
        if value.shape[0] != n:
            return None
    mask = columns.get(Columns.LOSS_MASK)
    out = {k: v for k, v in columns.items() if k != Columns.LOSS_MASK}
    if mask is not None:
        keep = mask.nonzero().squeeze(1)
        if keep.numel() != n:
            out = {k: v.index_select(0, keep) for k, v in out.items()}
    return out


class LeanUpdateMixin(_LearnerBase):
    """Put in front of rayrl's PPO learner (see the module docstring)."""

    _rayrl_ddp: bool
    _rayrl_in_train_mode: bool  #: the module is in train mode for the whole loop (default: learner.py)
    rayrl: Any  #: rayrl.rllib.learner.LearnerSettings
    metrics: Any  #: RLlib's MetricsLogger, swapped for _MUTED during a quiet minibatch

    def _rayrl_lean_ok(self, args: tuple, kwargs: dict) -> bool:
        if args or not self.rayrl.lean_update or self._rayrl_ddp or set(kwargs) - _KNOWN:
            return False
        if kwargs.get("num_total_minibatches", 0):
            return False
        return not any(self.module[mid].is_stateful() for mid in self.module.keys())

    def update(self, *args: Any, **kwargs: Any) -> Any:
        if not self._rayrl_lean_ok(args, kwargs):
            return super().update(*args, **kwargs)
        from ray.rllib.core.learner.training_data import TrainingData

        self._check_is_built()
        timesteps = kwargs.get("timesteps") or {}
        self.before_gradient_based_update(timesteps=timesteps)
        data = kwargs.get("training_data") or TrainingData(
            **{k: kwargs.get(k) for k in ("batch", "batch_refs", "episodes", "episodes_refs")}
        )
        data.validate()
        data.solve_refs()
        self._weights_seq_no += 1
        batch = self._make_batch_if_necessary(training_data=data)
        columns = {
            mid: lean_columns(dict(b))
            for mid, b in batch.policy_batches.items()
            if self.should_module_be_updated(mid, batch)
        }
        if unknown := set(columns) - set(self.module.keys()):
            raise ValueError(f"Batch contains ModuleIDs {sorted(unknown)}, which are not in this Learner!")
        if any(cols is None for cols in columns.values()):  # a column the lean loop cannot slice
            losses = self._rayrl_rllib_loop(batch, kwargs)
        else:
            losses = self._rayrl_lean_loop(columns, kwargs) if columns else {}  # type: ignore[arg-type]
        for mid, loss in losses.items():
            self.metrics.log_value(key=(mid, self.TOTAL_LOSS_KEY), value=loss, window=1)
        self.after_gradient_based_update(timesteps=timesteps)
        return None if kwargs.get("_no_metrics_reduce") else self.metrics.reduce()

    def _rayrl_lean_loop(self, columns: dict[str, dict[str, torch.Tensor]], kwargs: dict) -> dict:
        """The minibatches over the real rows; returns the last minibatch's losses."""
        first = {mid: next(iter(cols.values())) for mid, cols in columns.items()}  # row count and device
        plans = {
            mid: [torch.from_numpy(i).to(first[mid].device) for i in update_plan(len(first[mid]), kwargs)]
            for mid in columns
        }
        count = max(len(p) for p in plans.values())
        rows: dict[str, int] = dict.fromkeys(columns, 0)
        env_rows, losses = 0, {}
        start = time.perf_counter()
        # RLlib's forward_train puts every submodule in train mode on each call (a walk over the
        # module tree per minibatch); the lean loop does it once and calls _forward_train.
        for mid in columns:
            self.module[mid].train()
        self._rayrl_in_train_mode = True
        try:
            for i in range(count):
                minibatch = {}
                for mid, cols in columns.items():
                    idx = plans[mid][i % len(plans[mid])]
                    minibatch[mid] = {k: v.index_select(0, idx) for k, v in cols.items()}
                    rows[mid] += len(idx)
                env_rows += max(len(plans[mid][i % len(plans[mid])]) for mid in columns)
                losses = self._rayrl_minibatch(minibatch, quiet=i < count - 1)
        finally:
            self._rayrl_in_train_mode = False
        self._metrics_learner_inner_update.observe((time.perf_counter() - start) / max(1, count))
        self._rayrl_log_trained(rows, env_rows, count)
        return losses

    def _rayrl_rllib_loop(self, batch: Any, kwargs: dict) -> dict:
        """RLlib's minibatch iterator over a batch the lean loop cannot slice (metrics as RLlib's)."""
        from ray.rllib.core.learner.training_data import TrainingData

        batch_iter = self._create_iterator_if_necessary(
            training_data=TrainingData(batch=batch),
            num_epochs=int(kwargs.get("num_epochs") or 1),
            minibatch_size=kwargs.get("minibatch_size"),
            shuffle_batch_per_epoch=bool(kwargs.get("shuffle_batch_per_epoch")),
        )
        losses: dict = {}
        for tensor_minibatch in batch_iter:
            losses = self._rayrl_minibatch(tensor_minibatch.policy_batches, quiet=False)
            self._log_metrics(batch=tensor_minibatch)
            self._log_steps_trained_metrics(tensor_minibatch)
            self._set_slicing_by_batch_id(tensor_minibatch, value=False)
        return losses

    def _rayrl_minibatch(self, minibatch: dict, *, quiet: bool) -> dict:
        """One minibatch through RLlib's ``_update``; a quiet one logs nothing."""
        metrics: Any = self.metrics
        if quiet:
            self.metrics = _MUTED
        try:
            _, loss_per_module, _ = self._update(minibatch)
        finally:
            self.metrics = metrics
        return loss_per_module

    def _rayrl_log_trained(self, rows: dict[str, int], env_rows: int, minibatches: int) -> None:
        """The trained-step counts RLlib logs per minibatch, logged once with their totals."""
        from ray.rllib.core import ALL_MODULES
        from ray.rllib.utils.metrics import (
            MODULE_TRAIN_BATCH_SIZE_MEAN,
            NUM_ENV_STEPS_TRAINED,
            NUM_ENV_STEPS_TRAINED_LIFETIME,
            NUM_MODULE_STEPS_TRAINED,
            NUM_MODULE_STEPS_TRAINED_LIFETIME,
            WEIGHTS_SEQ_NO,
        )

        log = self.metrics.log_value
        for mid, n in rows.items():
            log((mid, WEIGHTS_SEQ_NO), self._weights_seq_no, window=1)
            log((mid, MODULE_TRAIN_BATCH_SIZE_MEAN), n / max(1, minibatches), reduce="mean")
            log((mid, NUM_MODULE_STEPS_TRAINED), n, reduce="sum")
            log((mid, NUM_MODULE_STEPS_TRAINED_LIFETIME), n, reduce="lifetime_sum", with_throughput=True)
        total = sum(rows.values())
        log((ALL_MODULES, NUM_MODULE_STEPS_TRAINED), total, reduce="sum", with_throughput=True)
        log((ALL_MODULES, NUM_MODULE_STEPS_TRAINED_LIFETIME), total, reduce="lifetime_sum", with_throughput=True)
        log((ALL_MODULES, NUM_ENV_STEPS_TRAINED), env_rows, reduce="sum", with_throughput=True)
        log((ALL_MODULES, NUM_ENV_STEPS_TRAINED_LIFETIME), env_rows, reduce="lifetime_sum", with_throughput=True)
        if env_rows > 0:
            self._metrics_all_modules_num_env_steps_trained.inc(value=env_rows)
            self._metrics_all_modules_num_module_steps_trained.inc(value=total)
