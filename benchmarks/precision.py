"""Learner throughput in fp32, bf16 and fp16, side by side, on this machine's CPU (and CUDA if present).

Why: the source guide promises about +30% throughput from fp16 with dynamic loss scaling on GPUs;
this measures what rayrl's learner (autocast, loss scaling, accumulation, clipping and the
non-finite guard, all included) actually gains on the hardware at hand, before a sweep relies on it.

It builds rayrl's PPO learner directly (no Ray, no env runners) and times ``Learner.update`` on a
fixed synthetic PPO batch. Precisions are interleaved round by round so load drift on a shared
machine hits all three alike. Two figures per precision: the median round and the best round
(on a machine shared with other jobs the best round is the steadier estimate of what the
hardware can do; the median says what a busy node delivers).

    python -m benchmarks.precision                 # full run
    python -m benchmarks.precision --quick         # smoke test, seconds
    python -m benchmarks.precision --out precision.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from benchmarks import common as C

MODES = ("fp32", "bf16", "fp16")


def build_learner(mode: str, device: str, args: argparse.Namespace) -> Any:
    """rayrl's PPO learner for ``mode`` on ``device``, from a spec like any run's."""
    from rayrl.rllib import algo
    from rayrl.spec import from_dict

    spec = from_dict(
        {
            "algo": {"train_batch_per_learner": args.batch, "minibatch_size": args.minibatch, "epochs": args.epochs},
            "model": {"hidden": args.hidden},
            "resources": {"env_runners": 0, "gpus_per_learner": 1.0 if device == "cuda" else 0.0},
            "precision": {"mode": mode, "accumulation_steps": args.accumulation},
        }
    )
    config = algo.build_config(spec)
    spaces = {
        "default_policy": (gym.spaces.Box(-1.0, 1.0, (args.obs_dim,), np.float32), gym.spaces.Discrete(args.actions))
    }
    return config.build_learner(spaces=spaces)


def make_batch(n: int, obs_dim: int, actions: int, seed: int = 0) -> Any:
    from ray.rllib.core.columns import Columns
    from ray.rllib.evaluation.postprocessing import Postprocessing
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, actions)).astype(np.float32)
    acts = rng.integers(0, actions, size=n)
    logp = logits[np.arange(n), acts] - np.log(np.exp(logits).sum(1))
    data = {
        Columns.OBS: rng.uniform(-1, 1, size=(n, obs_dim)).astype(np.float32),
        Columns.ACTIONS: acts,
        Columns.ACTION_LOGP: logp.astype(np.float32),
        Columns.ACTION_DIST_INPUTS: logits,
        Postprocessing.ADVANTAGES: rng.normal(size=n).astype(np.float32),
        Postprocessing.VALUE_TARGETS: rng.normal(size=n).astype(np.float32),
    }
    return MultiAgentBatch({"default_policy": SampleBatch(data)}, env_steps=n)


def measure(device: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Median learner samples/s per precision on ``device`` (precisions interleaved per round)."""
    batch = make_batch(args.batch, args.obs_dim, args.actions)
    learners = {mode: build_learner(mode, device, args) for mode in MODES}
    times: dict[str, list[float]] = {mode: [] for mode in MODES}

    def one_update(mode: str) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        learners[mode].update(
            batch=batch,
            minibatch_size=args.minibatch,
            num_epochs=args.epochs,
            shuffle_batch_per_epoch=False,
            timesteps={},
        )
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    for _ in range(args.warmup):
        for mode in MODES:
            one_update(mode)
    for _ in range(args.rounds):
        for mode in MODES:
            times[mode].append(one_update(mode))
    samples = args.batch * args.epochs
    out = {}
    for mode in MODES:
        med = C.median(times[mode])
        out[mode] = {
            "samples_per_s": samples / med,
            "best_samples_per_s": samples / min(times[mode]),
            "median_update_s": med,
            "min_update_s": min(times[mode]),
            "max_update_s": max(times[mode]),
        }
    for mode in MODES:
        out[mode]["ratio_vs_fp32"] = out[mode]["samples_per_s"] / out["fp32"]["samples_per_s"]
        out[mode]["best_ratio_vs_fp32"] = out[mode]["best_samples_per_s"] / out["fp32"]["best_samples_per_s"]
    return out


def cpu_facts() -> dict[str, Any]:
    """The machine (common.machine) plus what decides CPU bf16/fp16 speed: native low-precision
    instructions or emulation."""
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    native = {"avx512_bf16", "amx_bf16", "amx_fp16", "avx512_fp16", "avx512f", "avx2"}
    return {**C.machine(), "torch_threads": torch.get_num_threads(), "native": sorted(flags & native)}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes and few rounds: a smoke test")
    p.add_argument("--out", type=Path, help="also write the figures as JSON here")
    p.add_argument("--batch", type=int, help="train batch per update, samples (default 4096; quick 512)")
    p.add_argument("--minibatch", type=int, help="SGD minibatch (default 512; quick 128)")
    p.add_argument("--epochs", type=int, default=1, help="passes over the batch per update")
    p.add_argument("--hidden", type=int, nargs="+", help="MLP hidden sizes (default 512 512; quick 64 64)")
    p.add_argument("--obs-dim", type=int, default=64, help="observation size of the synthetic batch")
    p.add_argument("--actions", type=int, default=6, help="discrete actions of the synthetic batch")
    p.add_argument("--accumulation", type=int, default=1, help="precision.accumulation_steps")
    p.add_argument("--rounds", type=int, help="timed rounds per precision (default 7; quick 2)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument(
        "--devices", nargs="+", choices=("cpu", "cuda"), help="default: cpu, plus cuda when torch sees a GPU"
    )
    args = p.parse_args(argv)
    quick = args.quick
    args.batch = C.mode_default(args.batch, 512, 4096, quick)
    args.minibatch = C.mode_default(args.minibatch, 128, 512, quick)
    args.hidden = C.mode_default(args.hidden, [64, 64], [512, 512], quick)
    args.rounds = C.mode_default(args.rounds, 2, 7, quick)
    args.devices = args.devices or (["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    for name in ("batch", "minibatch", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if "cuda" in args.devices and not torch.cuda.is_available():
        p.error("--devices cuda: torch sees no CUDA device here")
    if args.minibatch > args.batch:
        p.error(f"--minibatch {args.minibatch} is larger than --batch {args.batch}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    report: dict[str, Any] = {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "torch": torch.__version__,
        "cpu": cpu_facts(),
        "results": {},
    }
    if torch.cuda.is_available():
        report["cuda"] = torch.cuda.get_device_name(0)
    print(
        f"learner samples/s, PPO update: batch {args.batch}, minibatch {args.minibatch}, epochs {args.epochs}, "
        f"hidden {args.hidden}, obs {args.obs_dim}, accumulation {args.accumulation}, "
        f"{args.rounds} rounds"
    )
    print(f"{'device':<8}{'precision':<11}{'median/s':>11}{'x fp32':>8}{'best/s':>11}{'x fp32':>8}{'median s':>10}")
    for device in args.devices:
        res = measure(device, args)
        report["results"][device] = res
        for mode in MODES:
            r = res[mode]
            print(
                f"{device:<8}{mode:<11}{r['samples_per_s']:>11.0f}{r['ratio_vs_fp32']:>8.2f}"
                f"{r['best_samples_per_s']:>11.0f}{r['best_ratio_vs_fp32']:>8.2f}{r['median_update_s']:>10.4f}"
            )
    c = report["cpu"]
    print(
        f"cpu: {c['cpu_model']}; torch threads {c['torch_threads']}; load {c['load_avg_1m']}; "
        f"native: {', '.join(c['native']) or 'none listed'}"
    )
    C.write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
