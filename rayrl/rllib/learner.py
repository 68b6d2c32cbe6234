"""rayrl's Torch learners: precision, gradient accumulation, clipping and a non-finite guard.

RLlib's TorchLearner steps the optimizer once per minibatch, clips inside
``postprocess_gradients`` and has no autocast; its ``_torch_grad_scaler_class`` hook scales the
loss but clips the *scaled* fp16 gradients (``scaler.step`` unscales only after clipping), which
turns "clip at 1.0" into "clip at 1.0 / 65536". So rayrl owns the one method that runs a
minibatch, ``_uncompiled_update``, in a mixin placed in front of RLlib's PPO, APPO and IMPALA
Torch learners:

* every minibatch: forward + loss under ``torch.autocast`` (bf16 or fp16), loss / K, backward;
* every K-th minibatch (and once more at the end of an update for a partial group): average the
  gradients across learners (DDP), unscale (fp16), measure the global norm, skip the step if the
  loss or the norm is not finite, else clip and step.

See docs/learner.md for the settings and the figures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from ray.rllib.algorithms.appo.torch.appo_torch_learner import APPOTorchLearner
from ray.rllib.algorithms.impala.torch.impala_torch_learner import IMPALATorchLearner
from ray.rllib.algorithms.ppo.ppo import (
    LEARNER_RESULTS_KL_KEY,
    LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY,
    LEARNER_RESULTS_VF_LOSS_UNCLIPPED_KEY,
)
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.learner import ENTROPY_KEY, POLICY_LOSS_KEY, VF_LOSS_KEY
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.torch_utils import explained_variance

from rayrl.errors import SpecError
from rayrl.rllib import lean_loss
from rayrl.rllib.lean_update import LeanUpdateMixin, muted
from rayrl.spec import PRECISIONS, Spec, import_callable, schedule

# Per-module learner metrics; rayrl.rllib.callback.RayrlCallback copies them into result["rayrl"].
NONFINITE_STEPS = "rayrl_nonfinite_steps"  #: skipped non-finite steps, lifetime (rank 0 counts)
OVERFLOW_STEPS = "rayrl_overflow_steps"  #: fp16 steps skipped by the loss scaler, lifetime
LOSS_SCALE = "rayrl_loss_scale"  #: fp16 dynamic loss scale after the last step
GRAD_NORM = "rayrl_grad_norm"  #: pre-clip global gradient norm, last finite step
OPTIMIZER_STEPS = "rayrl_optimizer_steps"  #: optimizer steps applied this iteration
CLIP_PARAM = "rayrl_clip_param"  #: PPO's clip after the anneal's latest step (only with algo.clip_final)

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: how each step outcome adds up in results: per iteration, or over the run's life
_TALLY_REDUCE = {OPTIMIZER_STEPS: "sum", OVERFLOW_STEPS: "lifetime_sum", NONFINITE_STEPS: "lifetime_sum"}
logger = logging.getLogger(__name__)


if TYPE_CHECKING:  # the mixins' view of the learner they extend (RLlib is untyped here: Any)
    from ray.rllib.core.learner.torch.torch_learner import TorchLearner as _LearnerBase
else:
    _LearnerBase = object


def _fused_ok(opt: torch.optim.Optimizer, precision: str) -> bool:
    """Torch's fused Adam/AdamW for an optimizer not stepped yet, on CPU or CUDA float parameters
    (fp16's GradScaler path is left on torch's default implementation)."""
    if type(opt) not in (torch.optim.Adam, torch.optim.AdamW) or precision == "fp16" or opt.state:
        return False
    params = [p for g in opt.param_groups for p in g["params"]]
    return all(p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.bfloat16) for p in params)


class NonFiniteTrainingError(RuntimeError):
    """Too many consecutive non-finite steps: the trial must fail so Tune restores a checkpoint."""


@dataclass(frozen=True)
class LearnerSettings:
    """The learner's part of the spec, as carried by RLlib's ``learner_config_dict``."""

    precision: str = "fp32"
    accumulation_steps: int = 1
    grad_clip: float = 1.0
    max_nonfinite_steps: int = 10
    fp16_init_scale: float = 2.0**16
    fp16_growth_interval: int = 2000
    loss_hook: str | None = None
    adam_eps: float = 1e-8
    clip_schedule: Any = None  #: PPO: [[0, clip], [horizon, clip_final]] (rayrl.spec.schedule); None: constant
    reward_norm: dict | None = None  #: PPO: {"gamma": ..., "clip": ...} for NormalizeRewards; None: off
    lean_update: bool = True  #: PPO: rayrl.rllib.lean_update's minibatch loop; False: RLlib's

    @classmethod
    def from_config(cls, data: Mapping[str, Any] | None) -> LearnerSettings:
        """Validate ``learner_config_dict`` (which a user may also write by hand)."""
        data = dict(data or {})
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        s = cls(**known)
        where = "learner_config_dict"
        if s.precision not in PRECISIONS:
            raise SpecError(
                f"{where}['precision'] (precision.mode): {s.precision!r} is not valid; valid: {', '.join(PRECISIONS)}."
            )
        for key, low in (("accumulation_steps", 1), ("max_nonfinite_steps", 1), ("fp16_growth_interval", 1)):
            v = getattr(s, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise SpecError(f"{where}[{key!r}]: {v!r} is not valid; it must be an integer >= {low}.")
        for key, ok, rule in (
            ("grad_clip", lambda v: v >= 0, ">= 0 (0 turns clipping off)"),
            ("fp16_init_scale", lambda v: v > 0, "> 0"),
        ):
            v = getattr(s, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
                raise SpecError(f"{where}[{key!r}]: {v!r} is not valid; it must be a finite number {rule}.")
        if s.loss_hook is not None:
            resolve_hook(s.loss_hook)
        return s


def learner_settings(spec: Spec) -> dict:
    """Spec -> RLlib ``learner_config_dict``: what every learner actor needs to know."""
    settings: dict[str, Any] = {
        "precision": spec.precision.mode,
        "accumulation_steps": spec.precision.accumulation_steps,
        "grad_clip": spec.algo.grad_clip,
        "max_nonfinite_steps": spec.precision.max_nonfinite_steps,
        "fp16_init_scale": LearnerSettings.fp16_init_scale,
        "fp16_growth_interval": LearnerSettings.fp16_growth_interval,
        # Prices travel with the config so each trial can publish its cost per million samples.
        "cost": dataclasses.asdict(spec.cost),
    }
    # The recipe's keys appear only when set: a config without them keeps the keys an older
    # sweep's Tuner saved, so Tune still restores that sweep (it refuses a changed param_space).
    if spec.algo.adam_eps != LearnerSettings.adam_eps:
        settings["adam_eps"] = spec.algo.adam_eps
    if (clip := clip_schedule(spec)) is not None:
        settings["clip_schedule"] = clip
    if spec.algo.normalize_reward:
        settings["reward_norm"] = {"gamma": spec.algo.gamma, "clip": spec.algo.reward_clip}
    return settings


def clip_schedule(spec: Spec) -> schedule.Points | None:
    """PPO's clip anneal (RLlib's clip_param takes no schedule, so rayrl's learner applies it)."""
    a = spec.algo
    if a.clip_final is None:
        return None
    from ray.rllib.algorithms.ppo import PPOConfig

    start = a.clip if a.clip is not None else PPOConfig().clip_param  # null: RLlib's own default
    return schedule.points(start, a.clip_final, spec.stop.env_steps)  # type: ignore[return-value]


def resolve_hook(target: str) -> Callable[..., torch.Tensor]:
    """Import a loss hook 'module:function' (fault drills and tests inject non-finite losses)."""
    return import_callable(
        target,
        "learner_config_dict['loss_hook']",
        "'package.module:function' taking (loss, *, module_id, step) -> loss",
    )


def check_precision(mode: str, device: torch.device | str) -> torch.dtype | None:
    """The autocast dtype for ``mode`` on ``device``; a clear error where the device cannot do it.

    Autocast silently runs in fp32 where a device lacks a low-precision kernel, so a tiny matmul
    is run and its dtype checked: a user who asked for bf16 never trains in fp32 unknowingly.
    """
    if mode not in PRECISIONS:
        raise SpecError(f"precision.mode: {mode!r} is not valid; valid: {', '.join(PRECISIONS)}.")
    if mode == "fp32":
        return None
    device = torch.device(device)
    dtype = _DTYPES[mode]
    why = ""
    if not torch.amp.autocast_mode.is_autocast_available(device.type):
        why = f"torch has no autocast for device type {device.type!r}"
    elif device.type == "cuda" and mode == "bf16" and not torch.cuda.is_bf16_supported(including_emulation=False):
        why = (
            f"{torch.cuda.get_device_name(device)} has no native bf16 (needs compute capability >= 8.0); "
            "use fp16 (dynamic loss scaling) or fp32"
        )
    else:
        try:
            with torch.autocast(device.type, dtype=dtype):
                x = torch.ones(2, 2, device=device)
                got = torch.nn.functional.linear(x, x).dtype
        except RuntimeError as exc:
            got, why = None, f"autocast failed: {exc}"
        if got is not None and got != dtype:
            why = f"autocast on {device.type} ran a matmul in {got}, not {dtype}"
    if why:
        raise SpecError(
            f"precision.mode: {mode!r} is not supported on this learner's device ({device}): "
            f"{why}. Choose another precision.mode (valid: {', '.join(PRECISIONS)}) or another "
            "device (resources.gpus_per_learner)."
        )
    return dtype


class RayrlTorchLearnerMixin(_LearnerBase):
    """Put in front of an RLlib Torch learner; replaces its per-minibatch update (see module doc)."""

    #: set by lean_update's loop while the module stays in train mode for all its minibatches
    _rayrl_in_train_mode: bool = False

    # ---- set-up ---------------------------------------------------------------------------------

    def build(self) -> None:
        """Validate the settings and the device's precision now, so a bad run fails at start."""
        self.rayrl = LearnerSettings.from_config(self.config.learner_config_dict)
        self._rayrl_hook = resolve_hook(self.rayrl.loss_hook) if self.rayrl.loss_hook else None
        self._rayrl_scalers: dict[str, torch.amp.GradScaler] = {}
        self._rayrl_pending = 0  # minibatches whose gradients wait in .grad
        self._rayrl_minibatches = 0  # minibatches seen by this learner, lifetime (hook's `step`)
        self._rayrl_loss_bad: dict[str, torch.Tensor] = {}
        self._rayrl_streak: dict[str, int] = defaultdict(int)
        self._rayrl_error: NonFiniteTrainingError | None = None
        # Step outcomes and last figures, logged once per update (_rayrl_flush), not per step.
        self._rayrl_tally: dict[tuple[str, str], int] = defaultdict(int)
        self._rayrl_last: dict[tuple[str, str], float] = {}
        super().build()
        self._rayrl_dtype = check_precision(self.rayrl.precision, self._device)
        if self.rayrl.precision == "fp16" and self._device.type == "cpu":
            # Correct but slow: CPUs without AVX512-FP16/AMX-FP16 run fp16 matmuls through
            # reference kernels (docs/learner.md has the measured slowdown).
            logger.warning(
                "precision.mode 'fp16' on a CPU learner: correct, but torch's CPU fp16 "
                "matmuls are much slower than fp32; use bf16 on CPUs and fp16 on GPUs."
            )
        self._rayrl_ddp = self.config.num_learners > 1 and dist.is_available() and dist.is_initialized()
        self._rayrl_rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        #: module -> (its config, our unfrozen copy carrying the scheduled clip_param)
        self._rayrl_clip_config: dict[str, tuple[Any, Any]] = {}
        if self.rayrl.reward_norm is not None and self._learner_connector is not None:
            from rayrl.rllib.connectors import NormalizeRewards

            # First in the pipeline: before RLlib's one-step elongation (which marks every chunk
            # truncated) and GAE, so the piece still sees which episodes ended.
            self._learner_connector.prepend(NormalizeRewards(**self.rayrl.reward_norm))

    def _rayrl_reward_norm(self) -> Any:
        from rayrl.rllib.connectors import NormalizeRewards

        pipeline = self._learner_connector
        pieces = [c for c in (pipeline.connectors if pipeline is not None else []) if isinstance(c, NormalizeRewards)]
        return pieces[0] if pieces else None

    def configure_optimizers_for_module(self, module_id: str, config: Any = None) -> None:
        super().configure_optimizers_for_module(module_id, config)
        for _, opt in self.get_optimizers_for_module(module_id):
            fused = _fused_ok(opt, self.rayrl.precision)
            for group in opt.param_groups:
                if "eps" in group:
                    group["eps"] = self.rayrl.adam_eps
                if fused:  # one kernel per step, not a loop over tensors (docs/learner.md)
                    group["foreach"], group["fused"] = False, True

    def _rayrl_scaler(self, module_id: str) -> torch.amp.GradScaler:
        if module_id not in self._rayrl_scalers:
            self._rayrl_scalers[module_id] = torch.amp.GradScaler(
                self._device.type,
                init_scale=self.rayrl.fp16_init_scale,
                growth_interval=self.rayrl.fp16_growth_interval,
            )
        return self._rayrl_scalers[module_id]

    # ---- one minibatch --------------------------------------------------------------------------

    def _uncompiled_update(self, batch: dict, **kwargs: Any) -> tuple[Any, Any, Any]:
        """Forward + loss under autocast, backward of loss / K; every K-th minibatch one step."""
        s = self.rayrl
        if not muted(self.metrics):  # a quiet minibatch (lean_update) keeps none of its figures
            self._compute_off_policyness(batch)
        with contextlib.ExitStack() as stack:
            if self._rayrl_ddp:
                # Gradients are averaged once per optimizer step in _rayrl_step, not per backward.
                for mod in self.module.values():
                    if isinstance(mod, torch.nn.parallel.DistributedDataParallel):
                        stack.enter_context(mod.no_sync())
            autocast = (
                torch.autocast(self._device.type, dtype=self._rayrl_dtype)
                if self._rayrl_dtype is not None
                else contextlib.nullcontext()
            )
            with autocast:
                fwd_out = self._rayrl_forward_train(batch)
                loss_per_module = self.compute_losses(fwd_out=fwd_out, batch=batch)
            loss_per_module = {mid: loss.float() for mid, loss in loss_per_module.items()}
            if self._rayrl_hook is not None:
                loss_per_module = {
                    mid: self._rayrl_hook(loss, module_id=mid, step=self._rayrl_minibatches)
                    for mid, loss in loss_per_module.items()
                }
            total = None
            for mid, loss in loss_per_module.items():
                bad = ~torch.isfinite(loss.detach())
                self._rayrl_loss_bad[mid] = bad | self._rayrl_loss_bad[mid] if mid in self._rayrl_loss_bad else bad
                if loss.grad_fn is None:  # all of this module's parameters are frozen
                    continue
                term = loss / s.accumulation_steps
                if s.precision == "fp16":
                    term = self._rayrl_scaler(mid).scale(term)
                total = term if total is None else total + term
            if total is not None:
                total.backward()
        self._rayrl_pending += 1
        self._rayrl_minibatches += 1
        if self._rayrl_pending >= s.accumulation_steps:
            self._rayrl_step()
        return fwd_out, loss_per_module, {}

    def _rayrl_forward_train(self, batch: dict) -> dict:
        """RLlib's forward_train; inside the lean loop (module already in train mode) without the
        per-call walk that sets train mode on every submodule."""
        if not self._rayrl_in_train_mode:
            return self.module.forward_train(batch)
        return {mid: self.module[mid]._forward_train(b) for mid, b in batch.items() if mid in self.module}

    def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        # No gradient survives from an earlier update (or from before a set_state / restore).
        self._rayrl_zero_grad()
        super().before_gradient_based_update(timesteps=timesteps)

    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        # A partial group at the end of the train batch is stepped now (before APPO's target-net
        # update), so no gradient from old weights leaks into the next batch.
        if self._rayrl_pending:
            self._rayrl_step()
        self._rayrl_flush()
        super().after_gradient_based_update(timesteps=timesteps)

    def _rayrl_flush(self) -> None:
        """Log this update's step outcomes (sums) and last norm/scale once."""
        for key, value in self._rayrl_tally.items():
            self.metrics.log_value(key, value, reduce=_TALLY_REDUCE[key[1]])
        for key, last in self._rayrl_last.items():
            self.metrics.log_value(key, last, window=1)
        self._rayrl_tally.clear()
        self._rayrl_last.clear()

    # ---- one optimizer step ---------------------------------------------------------------------

    def _rayrl_groups(self) -> dict[str, tuple[list, list]]:
        groups = {}
        for mid in self.module.keys():
            optims = [opt for _, opt in self.get_optimizers_for_module(mid)]
            params = list({id(p): p for o in optims for g in o.param_groups for p in g["params"]}.values())
            if optims:
                groups[mid] = (optims, params)
        return groups

    def _rayrl_zero_grad(self) -> None:
        for optim in self._optimizer_parameters:
            optim.zero_grad(set_to_none=True)
        self._rayrl_pending = 0
        self._rayrl_loss_bad = {}

    def _rayrl_allreduce(self, groups: dict[str, tuple[list, list]], loss_bad: dict[str, torch.Tensor]) -> None:
        """Average gradients over learners and OR the loss flags, in one collective.

        Every rank then holds the same gradients and flags, so all ranks take the same
        step-or-skip decision and the weights stay identical. A module no rank had a loss for
        is dropped from ``loss_bad`` (it is not stepped: a zero gradient would still move Adam).
        """
        parts, params = [], []
        for _, ps in groups.values():
            for p in ps:
                if p.grad is None:  # unused here: zeros keep the collective the same on every rank
                    p.grad = torch.zeros_like(p)
                parts.append(p.grad.reshape(-1))
                params.append(p)
        flags = []  # per module: [loss not finite here, module had a loss here]
        for mid in groups:
            flag = loss_bad.get(mid, torch.zeros((), dtype=torch.bool, device=self._device)).float().reshape(1)
            flags += [flag, torch.full((1,), float(mid in loss_bad), device=self._device)]
        buf = torch.cat(parts + flags)
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        n_grad = buf.numel() - len(flags)
        buf[:n_grad] /= dist.get_world_size()
        offset = 0
        for p in params:
            p.grad.copy_(buf[offset : offset + p.numel()].view_as(p.grad))
            offset += p.numel()
        present = buf[n_grad + 1 :: 2].tolist()  # one sync for every module; the bad flags stay on the device
        for i, mid in enumerate(groups):
            if present[i] > 0:
                loss_bad[mid] = buf[n_grad + 2 * i] > 0
            else:
                loss_bad.pop(mid, None)

    def _rayrl_step(self) -> None:
        """Unscale, check, clip and step each module; skip (and count) a non-finite step."""
        s = self.rayrl
        n, loss_bad = self._rayrl_pending, dict(self._rayrl_loss_bad)
        groups = self._rayrl_groups()
        if self._rayrl_ddp:
            self._rayrl_allreduce(groups, loss_bad)
        for mid, (optims, params) in groups.items():
            grads = [p.grad for p in params if p.grad is not None]
            if not grads or mid not in loss_bad:  # frozen, or no loss for it in this group
                continue
            if n < s.accumulation_steps:  # partial group: the mean over the n minibatches it has
                torch._foreach_mul_(grads, s.accumulation_steps / n)
            scaler = self._rayrl_scaler(mid) if s.precision == "fp16" else None
            if scaler is not None:
                for optim in optims:
                    scaler.unscale_(optim)
            norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm([g.detach() for g in grads])))
            bad_value, norm_value = torch.stack([loss_bad[mid].float(), norm.float()]).tolist()  # one sync
            loss_ok = bad_value == 0.0
            outcome = OPTIMIZER_STEPS
            if loss_ok and math.isfinite(norm_value):
                if s.grad_clip > 0:
                    torch.nn.utils.clip_grads_with_norm_(params, s.grad_clip, norm)
                for optim in optims:
                    optim.step()
                if scaler is not None:
                    scaler.update()
                self._rayrl_streak[mid] = 0
                self._rayrl_last[(mid, GRAD_NORM)] = norm_value
            elif scaler is not None and loss_ok and scaler.get_scale() > 1.0:
                # Overflow of the scaled gradients: the scaler's business (skip + back off).
                scaler.update()
                outcome = OVERFLOW_STEPS
            else:
                if scaler is not None:  # keep the scale; only clear the scaler's per-step state
                    scaler.update(new_scale=scaler.get_scale())
                self._rayrl_streak[mid] += 1
                outcome = NONFINITE_STEPS
            self._rayrl_count(mid, outcome)
            if scaler is not None:
                self._rayrl_last[(mid, LOSS_SCALE)] = scaler.get_scale()
            if self._rayrl_streak[mid] >= s.max_nonfinite_steps:
                self._rayrl_fail(self._rayrl_message(mid, loss_ok, norm_value))
        self._rayrl_zero_grad()

    def _rayrl_count(self, module_id: str, outcome: str) -> None:
        """Count the step's outcome; zeros for the others keep every key present in results."""
        # Every rank takes the same decision; only rank 0 counts, so the sum over learners is right.
        if self._rayrl_rank != 0:
            return
        for key in _TALLY_REDUCE:
            self._rayrl_tally[(module_id, key)] += int(key == outcome)

    def _rayrl_message(self, module_id: str, loss_ok: bool, norm: float) -> str:
        s = self.rayrl
        what = f"gradient norm {norm}" if loss_ok else "loss"
        fp16 = "; with fp16, activations may overflow in the forward pass (try bf16)" if s.precision == "fp16" else ""
        return (
            f"rayrl learner: {self._rayrl_streak[module_id]} consecutive optimizer steps of module "
            f"{module_id!r} had a non-finite (NaN/Inf) loss or gradient norm (last: non-finite {what}); each "
            f"was skipped with the weights left unchanged. Likely causes: the learning rate is too high "
            f"(lr={self.config.lr}), the reward scale is too large (normalise or clip rewards), or gradient "
            f"clipping is missing (algo.grad_clip={s.grad_clip}; 0 is off, rayrl's default is 1.0){fp16}. "
            f"The trial fails now (precision.max_nonfinite_steps={s.max_nonfinite_steps}) so Tune's retry "
            f"restores the last good checkpoint."
        )

    def _rayrl_fail(self, message: str) -> None:
        self._rayrl_error = NonFiniteTrainingError(message)
        raise self._rayrl_error

    # ---- checkpoints: the fp16 loss scale survives a restore ------------------------------------

    def get_state(self, *args: Any, **kwargs: Any) -> dict:
        state = super().get_state(*args, **kwargs)
        if self._rayrl_scalers:
            state["rayrl_grad_scalers"] = {mid: sc.state_dict() for mid, sc in self._rayrl_scalers.items()}
        norm = self._rayrl_reward_norm()
        if norm is not None:
            state["rayrl_reward_norm"] = norm.get_state()
        return state

    def set_state(self, state: dict) -> None:
        state = dict(state)
        scalers = state.pop("rayrl_grad_scalers", None) or {}
        reward_norm = state.pop("rayrl_reward_norm", None)
        super().set_state(state)
        for mid, sd in scalers.items():
            self._rayrl_scaler(mid).load_state_dict(sd)
        norm = self._rayrl_reward_norm()
        if norm is not None and reward_norm:
            norm.set_state(reward_norm)


class _AsyncGuardMixin(_LearnerBase):
    """IMPALA/APPO update in a learner thread: a failure there must reach the caller, not hang it."""

    _rayrl_error: NonFiniteTrainingError | None

    def _rayrl_fail(self, message: str) -> None:
        # Raising in the learner thread would kill it and leave `update()` waiting forever on the
        # aggregation event; record the error, wake the waiter, raise from `update()` instead.
        self._rayrl_error = NonFiniteTrainingError(message)
        event = getattr(self, "_agg_event", None)
        if event is not None:
            event.set()

    def _uncompiled_update(self, batch: dict, **kwargs: Any) -> tuple[Any, Any, Any]:
        if self._rayrl_error is not None:  # failed: learn nothing more until the trial is torn down
            return {}, {}, {}
        return super()._uncompiled_update(batch, **kwargs)

    def update(self, *args: Any, **kwargs: Any) -> Any:
        if self._rayrl_error is not None:
            raise self._rayrl_error
        result = super().update(*args, **kwargs)
        if self._rayrl_error is not None:
            raise self._rayrl_error
        return result


class RayrlPPOLearner(LeanUpdateMixin, RayrlTorchLearnerMixin, PPOTorchLearner):
    """PPO with rayrl's precision, accumulation, clipping, non-finite guard and clip anneal."""

    def build(self) -> None:
        #: per module: lean_loss's closed form for its distributions, or None (RLlib's loss)
        self._rayrl_terms: dict[str, Callable[..., lean_loss.Terms] | None] = {}
        super().build()

    def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        super().before_gradient_based_update(timesteps=timesteps)
        points = self.rayrl.clip_schedule
        if points is None:
            return
        from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

        clip = schedule.value_at(points, timesteps.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, 0))
        for mid in self.module.keys():
            # One copy per module's config, made once: copying an AlgorithmConfig is a deepcopy of
            # about a millisecond, paid on every update before.
            base = self.config.get_config_for_module(mid)
            made = self._rayrl_clip_config.get(mid)
            if made is None or made[0] is not base:
                made = self._rayrl_clip_config[mid] = (base, base.copy(copy_frozen=False))
            made[1].clip_param = clip
            self.metrics.log_value((mid, CLIP_PARAM), clip, window=1)

    def compute_loss_for_module(self, *, module_id: str, config: Any, batch: dict, fwd_out: dict) -> Any:
        if module_id in self._rayrl_clip_config:
            config = self._rayrl_clip_config[module_id][1]
        terms = self._rayrl_lean_terms(module_id, batch)
        if terms is None:
            return super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)
        return self._rayrl_lean_loss(terms, module_id, config, batch, fwd_out)

    def _rayrl_lean_terms(self, module_id: str, batch: dict) -> Callable[..., lean_loss.Terms] | None:
        """The closed-form loss terms where they give RLlib's loss (lean_loss); None: RLlib's own."""
        if not self.rayrl.lean_update or Columns.LOSS_MASK in batch:
            return None
        cache = self._rayrl_terms
        if module_id not in cache:
            module = self.module[module_id].unwrapped()
            cache[module_id] = (
                None
                if module.is_stateful()
                else lean_loss.terms_for(module.get_train_action_dist_cls(), module.get_exploration_action_dist_cls())
            )
        return cache[module_id]

    def _rayrl_lean_loss(
        self, terms: Callable[..., lean_loss.Terms], module_id: str, config: Any, batch: dict, fwd_out: dict
    ) -> torch.Tensor:
        """RLlib's PPO loss and its logged figures, from lean_loss's terms."""
        module = self.module[module_id].unwrapped()
        values = module.compute_values(batch, embeddings=fwd_out.get(Columns.EMBEDDINGS)) if config.use_critic else None
        quiet = muted(self.metrics)
        entropy_coeff = self.entropy_coeff_schedulers_per_module[module_id].get_current_value()
        total, pieces = lean_loss.ppo_loss(
            terms(
                fwd_out[Columns.ACTION_DIST_INPUTS],
                batch[Columns.ACTION_DIST_INPUTS],
                batch[Columns.ACTIONS],
                # a quiet minibatch builds only the terms its loss uses (a fixed 0.0 is no schedule)
                kl=config.use_kl_loss or not quiet,
                entropy=not (quiet and isinstance(entropy_coeff, (int, float)) and entropy_coeff == 0),
            ),
            old_logp=batch[Columns.ACTION_LOGP],
            advantages=batch[Postprocessing.ADVANTAGES],
            values=values,
            value_targets=batch[Postprocessing.VALUE_TARGETS],
            clip_param=config.clip_param,
            vf_clip_param=config.vf_clip_param,
            vf_loss_coeff=config.vf_loss_coeff,
            entropy_coeff=entropy_coeff,
            kl_coeff=self.curr_kl_coeffs_per_module[module_id] if config.use_kl_loss else None,
        )
        if not quiet:  # a quiet minibatch's figures are never kept: not computed
            targets = batch[Postprocessing.VALUE_TARGETS]
            self.metrics.log_dict(
                {
                    POLICY_LOSS_KEY: -pieces["surrogate"].mean(),
                    VF_LOSS_KEY: pieces["vf_loss_clipped"].mean(),
                    LEARNER_RESULTS_VF_LOSS_UNCLIPPED_KEY: pieces["vf_loss"].mean(),
                    LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY: explained_variance(
                        targets, values if values is not None else torch.zeros((), device=targets.device)
                    ),
                    ENTROPY_KEY: pieces["entropy"].mean(),
                    LEARNER_RESULTS_KL_KEY: pieces["mean_kl"],
                },
                key=module_id,
                window=1,
            )
        return total


class RayrlAPPOLearner(_AsyncGuardMixin, RayrlTorchLearnerMixin, APPOTorchLearner):
    """APPO with rayrl's learner additions (target-net update after the last step of a batch)."""


class RayrlIMPALALearner(_AsyncGuardMixin, RayrlTorchLearnerMixin, IMPALATorchLearner):
    """IMPALA with rayrl's learner additions."""


_LEARNERS = {"PPO": RayrlPPOLearner, "APPO": RayrlAPPOLearner, "IMPALA": RayrlIMPALALearner}


def learner_class(name: str) -> type:
    """The rayrl learner for RLlib algorithm ``name`` (module-level, so learner actors unpickle it)."""
    if name not in _LEARNERS:
        raise SpecError(f"algo.name: {name!r} has no rayrl learner; valid: {', '.join(_LEARNERS)}.")
    return _LEARNERS[name]
