"""One PPO minibatch: rayrl's learner loop against a bare torch step on a copy of the same module.

At small batches the SGD step is most of an update (RL Zoo's CartPole: 20 epochs of one 256-row
minibatch per 256 env steps), so the question is how much of a minibatch is torch's own work and how
much the machinery around it (RLlib's ``Learner._update``, rayrl's hooks, the non-finite guard, slicing).
Both sides run in one process on one batch captured from a real training iteration, with the same
loss (``rayrl.rllib.lean_loss``: the closed form rayrl's learner takes, checked against RLlib's own in
tests), the same minibatches (sliced by ``index_select`` from the batch, shuffled per epoch), the same
gradient clip (rayrl's ``algo.grad_clip``, global norm) and the same optimizer class and settings.
The bare step is forward, loss, backward, clip, optimizer step: the floor any learner built on
torch pays. Rounds alternate which side runs
first.

    python -m benchmarks.sgd_step                        # RL Zoo's CartPole settings, 10 rounds
    python -m benchmarks.sgd_step --settings spec        # the spec's own settings
    python -m benchmarks.sgd_step --config experiments/configs/mujoco_hopper_ppo.yaml --settings spec
    python -m benchmarks.sgd_step --quick --out step.json
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path
from typing import Any

from benchmarks import common as C

#: columns the bare step reads (the loss's inputs)
_USED = ("obs", "actions", "action_logp", "action_dist_inputs", "advantages", "value_targets")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 rounds of 1 update: a smoke test")
    p.add_argument("--out", type=Path, help="also write the figures as JSON here")
    p.add_argument("--config", type=Path, default=C.DEFAULT_CONFIG, help="rayrl spec (default: %(default)s)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V")
    p.add_argument(
        "--settings",
        choices=("zoo", "spec"),
        default="zoo",
        help="zoo (default): RL Zoo's tuned settings for the env laid over the spec (CartPole-v1, Hopper-v5); "
        "spec: the spec as it is",
    )
    p.add_argument("--rounds", type=int, help="alternated rounds (default 10; quick 2)")
    p.add_argument(
        "--updates", type=int, help="whole updates (every epoch's minibatches) per side per round (default 5; quick 1)"
    )
    p.add_argument("--warmup", type=int, default=3, help="training iterations before the batch is captured")
    p.add_argument("--seed", type=int, default=0)
    C.add_torch_threads(p)
    args = p.parse_args(argv)
    args.rounds = C.mode_default(args.rounds, 2, 10, args.quick)
    args.updates = C.mode_default(args.updates, 1, 5, args.quick)
    if args.rounds < 1 or args.updates < 1 or args.warmup < 1:
        p.error(
            f"--rounds ({args.rounds}), --updates ({args.updates}) and --warmup ({args.warmup}) must be >= 1: "
            "the batch is captured from a training iteration and every side runs at least once"
        )
    return args


def capture(config: Any, warmup: int) -> tuple[Any, Any, dict, dict]:
    """(algorithm, learner, the lean loop's columns, its kwargs) of the last of ``warmup`` iterations."""
    from rayrl.rllib import lean_update

    seen: dict[str, Any] = {}
    loop = lean_update.LeanUpdateMixin._rayrl_lean_loop

    def grab(self: Any, columns: dict, kwargs: dict) -> dict:
        seen.update(learner=self, columns=columns, kwargs=kwargs)
        return loop(self, columns, kwargs)

    algo = config.build_algo()
    lean_update.LeanUpdateMixin._rayrl_lean_loop = grab  # type: ignore[method-assign]
    try:
        for _ in range(warmup):
            algo.train()
    finally:
        lean_update.LeanUpdateMixin._rayrl_lean_loop = loop  # type: ignore[method-assign]
    if not seen:
        algo.stop()
        raise SystemExit(
            "sgd_step: the learner never ran rayrl's lean loop (a remote learner, a stateful module, "
            "algo.lean_update off, or not PPO): there is no rayrl minibatch to time"
        )
    return algo, seen["learner"], seen["columns"], seen["kwargs"]


class Bare:
    """Forward, loss, backward, clip, step on a copy of one module, as a hand-written torch loop would."""

    def __init__(self, learner: Any, module_id: str) -> None:
        from rayrl.rllib import lean_loss

        self.module = copy.deepcopy(learner.module[module_id].unwrapped()).train()
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        (_, opt), *_ = learner.get_optimizers_for_module(module_id)
        # the learner's group settings, not the class defaults: rayrl's learner turns fused Adam on per group
        group = {k: v for k, v in opt.param_groups[0].items() if k in opt.defaults}
        self.optimizer = type(opt)(self.params, **group)
        self.config = learner.config.get_config_for_module(module_id)
        self.terms = lean_loss.terms_for(
            self.module.get_train_action_dist_cls(), self.module.get_exploration_action_dist_cls()
        )
        if self.terms is None:
            raise SystemExit("sgd_step: the bare step knows RLlib's categorical and diagonal Gaussian heads only")
        self.kl_coeff = float(learner.curr_kl_coeffs_per_module[module_id]) if self.config.use_kl_loss else None
        self.entropy_coeff = float(learner.entropy_coeff_schedulers_per_module[module_id].get_current_value())
        # rayrl's clip (algo.grad_clip, global norm; RLlib's own grad_clip is off under rayrl's learner)
        self.grad_clip = float(learner.rayrl.grad_clip)

    def loss(self, mb: dict) -> Any:
        """RLlib's PPO loss of one minibatch (the closed form rayrl's learner takes)."""
        from ray.rllib.core.columns import Columns

        from rayrl.rllib import lean_loss

        out = self.module._forward_train(mb)
        values = self.module.compute_values(mb, embeddings=out.get(Columns.EMBEDDINGS))
        c = self.config
        total, _ = lean_loss.ppo_loss(
            self.terms(  # type: ignore[misc]
                out[Columns.ACTION_DIST_INPUTS],
                mb["action_dist_inputs"],
                mb["actions"],
                kl=self.kl_coeff is not None,
                entropy=self.entropy_coeff != 0,
            ),
            old_logp=mb["action_logp"],
            advantages=mb["advantages"],
            values=values,
            value_targets=mb["value_targets"],
            clip_param=c.clip_param,
            vf_clip_param=c.vf_clip_param,
            vf_loss_coeff=c.vf_loss_coeff,
            entropy_coeff=self.entropy_coeff,
            kl_coeff=self.kl_coeff,
        )
        return total

    def step(self, mb: dict) -> None:
        import torch

        loss = self.loss(mb)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        self.optimizer.step()

    def update(self, columns: dict, plan: list[Any]) -> None:
        """Every minibatch of one update, sliced from the batch as the learner does."""
        for idx in plan:
            self.step({k: columns[k].index_select(0, idx) for k in _USED})


def plan_for(rows: int, kwargs: dict) -> list[Any]:
    """The minibatch index tensors of one update (the learner's own rule, rayrl.rllib.lean_update)."""
    import torch

    from rayrl.rllib.lean_update import update_plan

    return [torch.from_numpy(i) for i in update_plan(rows, kwargs)]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks import contenders as K
    from rayrl import spec as spec_mod

    spec = C.load_spec(args.config, args.overrides)
    spec = spec_mod.replace(spec, resources={"env_runners": 0, "learners": 0})  # the learner in this process
    config = (
        K.rayrl_zoo_settings(spec, seed=args.seed)
        if args.settings == "zoo"
        else K.rayrl(spec, spec.env.runner, args.seed)
    )
    algo, learner, columns, kwargs = capture(config, args.warmup)
    try:
        (mid, cols), *rest = columns.items()
        if rest:
            raise SystemExit("sgd_step: one module only (a multi-agent batch has several)")
        missing = [k for k in _USED if k not in cols]
        if missing:
            raise SystemExit(f"sgd_step: the captured batch has no {', '.join(missing)} column")
        bare = Bare(learner, mid)
        rows = len(cols["obs"])
        per_update = len(plan_for(rows, kwargs))

        def lean() -> None:
            learner.before_gradient_based_update(timesteps={})
            learner._rayrl_lean_loop(columns, kwargs)
            learner.after_gradient_based_update(timesteps={})

        def bare_update() -> None:
            bare.update(cols, plan_for(rows, kwargs))

        sides = {"rayrl": lean, "bare": bare_update}
        rounds = []
        for r in range(args.rounds):
            order = ("rayrl", "bare") if r % 2 == 0 else ("bare", "rayrl")
            row: dict[str, Any] = {"round": r, "first": order[0]}
            for name in order:
                t = time.perf_counter()
                for _ in range(args.updates):
                    sides[name]()
                row[f"{name}_ms"] = (time.perf_counter() - t) / (args.updates * per_update) * 1000
            row["ratio"] = C.ratio(row["rayrl_ms"], row["bare_ms"])
            rounds.append(row)
            C.say(f"round {r}: rayrl {row['rayrl_ms']:.3f} ms, bare {row['bare_ms']:.3f} ms ({row['ratio']:.2f}x)")
    finally:
        algo.stop()
    rayrl_ms = [r["rayrl_ms"] for r in rounds]
    bare_ms = [r["bare_ms"] for r in rounds]
    return {
        "env": spec.env.id,
        "settings": args.settings,
        "rows": rows,
        "minibatch_size": kwargs.get("minibatch_size"),
        "epochs": kwargs.get("num_epochs"),
        "minibatches_per_update": per_update,
        "kl_term": bare.kl_coeff is not None,
        "entropy_term": bare.entropy_coeff != 0,
        "optimizer": type(bare.optimizer).__name__,
        "fused": bool(bare.optimizer.param_groups[0].get("fused")),
        "grad_clip": bare.grad_clip,
        "rounds": rounds,
        "rayrl_ms_median": C.median(rayrl_ms),
        "bare_ms_median": C.median(bare_ms),
        "rayrl_ms_range": [min(rayrl_ms), max(rayrl_ms)],
        "bare_ms_range": [min(bare_ms), max(bare_ms)],
        "ratio_median": C.median([r["ratio"] for r in rounds]),
        "ratio_range": [min(r["ratio"] for r in rounds), max(r["ratio"] for r in rounds)],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    C.quiet()
    started = time.monotonic()
    with C.local_ray(torch_threads=args.torch_threads):
        import torch

        threads = torch.get_num_threads()
        report = measure(args)
    report.update(
        torch_threads=threads,
        machine=C.machine(),
        settings_args={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        wall_s=round(time.monotonic() - started, 1),
    )
    print()
    print(
        f"{report['env']}, {args.settings} settings: {report['rows']} rows, minibatch {report['minibatch_size']}, "
        f"{report['minibatches_per_update']} minibatches an update, torch threads {threads}, "
        f"KL term {'on' if report['kl_term'] else 'off'}, entropy term {'on' if report['entropy_term'] else 'off'}"
    )
    print(
        C.table(
            ["ms a minibatch", "median", "min", "max"],
            [
                ["rayrl (learner loop)", report["rayrl_ms_median"], *report["rayrl_ms_range"]],
                ["bare torch step", report["bare_ms_median"], *report["bare_ms_range"]],
                ["rayrl / bare (per round)", report["ratio_median"], *report["ratio_range"]],
            ],
        )
    )
    C.write_json(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
