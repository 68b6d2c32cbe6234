"""The GPU code paths in one run: NCCL learners, fp16/bf16 learners on CUDA, NVML sampling; one table.

Why: every other test and benchmark runs on CPUs, where the learners talk gloo, autocast has no
fp16 loss scaling worth the name and NVML is absent. This script exercises what only a GPU machine
can, in a few minutes, and says per check "ok" or "FAIL" with the figure beside it:

1. NCCL learners: rayrl's PPO with remote Learner actors on Ray Train's Torch backend, one GPU each
   (2 learners if the machine has 2 GPUs, else 1 learner and a note: NCCL with world size 1 does no
   all-reduce). Checked: the backend the learners report is ``nccl``, they run on cuda, DDP keeps
   their weights bit-identical, no non-finite step; learner samples/s and env steps/s measured.
2. fp16 and bf16 learners on CUDA against fp32 (rayrl's learner, a fixed synthetic PPO batch, no Ray):
   samples/s, the fp16 dynamic loss scale (a finite power of two; none for bf16), non-finite steps.
3. NVML sampling (rayrl.observe.hardware.HardwareSampler, what every trial's results and gauges carry): GPU
   utilisation idle and under a matmul load, GPU memory, all fractions in 0..1.

    python -m benchmarks.gpu_check                  # on a GPU machine: about 2-4 minutes
    python -m benchmarks.gpu_check --out gpu.json   # also the figures as JSON
    python -m benchmarks.gpu_check --require-gpu    # exit 1 (not 0) where there is no CUDA device

Without a CUDA device it prints "gpu_check: no CUDA device: skipped" and exits 0 (1 with
--require-gpu); the exit status is 1 when any check fails.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import common as C

MID = "default_policy"
OK, FAIL = "ok", "FAIL"
HEADERS = ("check", "settings", "measured", "verdict")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="also write the figures as JSON here")
    p.add_argument("--require-gpu", action="store_true", help="exit 1 where there is no CUDA device")
    p.add_argument("--learners", type=int, help="GPU learners in the NCCL check (default: 2 if 2+ GPUs, else 1)")
    p.add_argument("--iters", type=int, default=4, help="training iterations of the NCCL check (first not timed)")
    p.add_argument("--batch", type=int, default=8192, help="train batch per learner, samples")
    p.add_argument("--minibatch", type=int, default=1024, help="SGD minibatch, samples")
    p.add_argument("--hidden", type=int, nargs="+", default=[512, 512], help="MLP hidden sizes")
    p.add_argument("--rounds", type=int, default=5, help="timed update rounds per precision")
    p.add_argument("--load-s", type=float, default=3.0, help="seconds of matmul load for the NVML check")
    args = p.parse_args(argv)
    for name in ("iters", "batch", "minibatch", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.iters < 2:
        p.error(f"--iters must be >= 2 (the first is not timed), got {args.iters}")
    if args.learners is not None and args.learners < 1:
        p.error(f"--learners must be >= 1, got {args.learners}")
    if args.minibatch > args.batch:
        p.error(f"--minibatch {args.minibatch} is larger than --batch {args.batch}")
    if not 0 < args.load_s <= 60:
        p.error(f"--load-s must be in (0, 60] seconds, got {args.load_s}")
    # What the precision check's learner builder (benchmarks/precision.py) reads.
    args.epochs, args.obs_dim, args.actions, args.accumulation, args.warmup = 1, 64, 6, 1, 1
    return args


def plan_learners(gpus: int, requested: int | None) -> tuple[int, list[str]]:
    """GPU learners for the NCCL check on a machine with ``gpus`` GPUs, and the notes a reader needs."""
    if gpus < 1:
        raise ValueError("no GPU: the NCCL check needs at least one")
    n = requested if requested is not None else min(2, gpus)
    if n > gpus:
        raise ValueError(f"--learners {n}: this machine has {gpus} GPU(s), one learner per GPU")
    notes = (
        []
        if n > 1
        else [
            "one GPU: 1 learner on cuda; NCCL with world size 1 does no all-reduce, so DDP "
            "between GPUs is not exercised (needs 2 GPUs)"
        ]
    )
    return n, notes


# ---- verdicts: pure functions of the measured facts ----------------------------------------------


def nccl_rows(f: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """Table rows of the NCCL check from its facts (see :func:`run_learners`)."""
    n = f["learners"]
    settings = f"{n} learner(s) x 1 GPU, PPO batch {f['batch']}/learner"
    ok = (
        f["backend"] == "nccl"
        and set(f["devices"]) == {"cuda"}
        and f["nonfinite_steps"] == 0
        and f["learner_samples_per_s"] > 0
    )
    measured = (
        f"backend {f['backend']}; devices {','.join(f['devices'])}; {f['learner_samples_per_s']:,.0f} "
        f"learner samples/s; {f['env_steps_per_s']:,.0f} env steps/s; non-finite {f['nonfinite_steps']:g}"
    )
    rows = [("NCCL learners", settings, measured, OK if ok else FAIL)]
    if n > 1:
        rows.append(
            (
                "DDP weights",
                f"{n} learners after {f['iters']} iterations",
                "bit-identical" if f["weights_equal"] else "differ",
                OK if f["weights_equal"] else FAIL,
            )
        )
    util = f["gpu_util"]
    fraction = math.isfinite(util) and 0.0 <= util <= 1.0
    rows.append(
        (
            "NVML in results",
            "result['rayrl'] of the NCCL run (the trial's sampler)",
            f"GPU util {util:.2f}" if math.isfinite(util) else "GPU util not measured",
            OK if fraction else FAIL,
        )
    )
    return rows


def precision_rows(res: dict[str, dict[str, float]], device: str) -> list[tuple[str, str, str, str]]:
    """Table rows of the precision check: throughput vs fp32, loss scale, non-finite steps."""
    rows = []
    for mode, r in res.items():
        scale, bad = r["loss_scale"], r["nonfinite_steps"]
        if mode == "fp16":  # dynamic loss scaling: a finite power of two
            scale_ok = math.isfinite(scale) and scale > 0 and math.log2(scale).is_integer()
        else:  # fp32 and bf16 need no scaler and report none
            scale_ok = math.isnan(scale)
        ok = scale_ok and bad == 0 and r["samples_per_s"] > 0
        measured = (
            f"{r['samples_per_s']:,.0f} samples/s ({r['ratio_vs_fp32']:.2f}x fp32); loss scale "
            f"{'-' if math.isnan(scale) else f'{scale:g}'}; non-finite {bad:g}"
        )
        rows.append((f"{mode} learner", f"{device}, median of rounds", measured, OK if ok else FAIL))
    return rows


def nvml_row(idle: dict[str, float], busy: dict[str, float], load_s: float) -> tuple[str, str, str, str]:
    """The NVML check's row: GPU figures are fractions, and a matmul load shows as utilisation."""
    values = [idle["gpu_util"], busy["gpu_util"], busy["gpu_mem_util"]]
    fractions = all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in values)
    ok = fractions and busy["gpu_util"] > 0 and busy["gpu_util"] >= idle["gpu_util"]
    measured = (
        f"GPU util {idle['gpu_util']:.2f} idle -> {busy['gpu_util']:.2f} busy; GPU memory {busy['gpu_mem_util']:.2f}"
    )
    return (
        "NVML sampling",
        f"rayrl.observe.hardware.HardwareSampler, {load_s:g} s matmul load",
        measured,
        OK if ok else FAIL,
    )


# ---- the measurements ------------------------------------------------------------------------------


def _value(stat: Any) -> float:
    value = stat.peek() if hasattr(stat, "peek") else stat
    return math.nan if value is None else float(value)


def measure_precision(device: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Median learner samples/s, loss scale and non-finite steps per precision on ``device``."""
    import torch

    from benchmarks import precision as P

    modes = ("fp32", "bf16", "fp16")
    batch = P.make_batch(args.batch, args.obs_dim, args.actions)
    learners = {mode: P.build_learner(mode, device, args) for mode in modes}
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    last: dict[str, dict] = {}
    for n in range(args.warmup + args.rounds):
        for mode in modes:  # interleaved, so drift hits all three alike
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            last[mode] = learners[mode].update(
                batch=batch,
                minibatch_size=args.minibatch,
                num_epochs=args.epochs,
                shuffle_batch_per_epoch=False,
                timesteps={},
            )[MID]
            if device == "cuda":
                torch.cuda.synchronize()
            if n >= args.warmup:
                times[mode].append(time.perf_counter() - t0)
    from rayrl.rllib import learner as L

    out = {}
    for mode in modes:
        out[mode] = {
            "samples_per_s": args.batch * args.epochs / C.median(times[mode]),
            "loss_scale": _value(last[mode].get(L.LOSS_SCALE, math.nan)),
            "nonfinite_steps": _value(last[mode].get(L.NONFINITE_STEPS, 0.0)),
        }
    for mode in modes:
        out[mode]["ratio_vs_fp32"] = out[mode]["samples_per_s"] / out["fp32"]["samples_per_s"]
    return out


def check_nvml(load_s: float, load: Callable[[float], None] | None = None) -> tuple[dict, dict]:
    """rayrl's sampler idle, then over ``load_s`` seconds of ``load`` (default: fp16 matmuls on cuda:0)."""
    from rayrl.observe.hardware import HardwareSampler

    idle_sampler = HardwareSampler()
    time.sleep(0.5)
    idle = idle_sampler.sample()
    busy_sampler = HardwareSampler()
    (load or _matmul_load)(load_s)
    return idle, busy_sampler.sample()


def _matmul_load(seconds: float) -> None:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(10):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()


def run_learners(args: argparse.Namespace, learners: int) -> dict[str, Any]:
    """rayrl's PPO with ``learners`` GPU learners (Ray Train's Torch backend): the facts of a few iterations."""
    from rayrl.rllib.algo import build_config
    from rayrl.spec import from_dict

    spec = from_dict(
        {
            "seed": 0,
            "env": {"envs_per_runner": 8},
            "algo": {"train_batch_per_learner": args.batch, "minibatch_size": args.minibatch, "epochs": 1},
            "model": {"hidden": args.hidden},
            "resources": {"env_runners": 2, "learners": learners, "gpus_per_learner": 1.0},
        }
    )
    algorithm = build_config(spec).build_algo()
    try:
        sections = [algorithm.train()["rayrl"] for _ in range(args.iters)]
        per_learner = [r.get() for r in algorithm.learner_group.foreach_learner(_learner_facts)]
    finally:
        algorithm.stop()
    timed = sections[1:]
    return {
        "learners": learners,
        "batch": args.batch,
        "iters": args.iters,
        "backend": sections[-1]["backend"],
        "devices": sorted({d for d, _ in per_learner}),
        "weights_equal": len({digest for _, digest in per_learner}) == 1,
        "learner_samples_per_s": C.median([s["learner_samples_per_s"] for s in timed]),
        "env_steps_per_s": C.median([s["env_steps_per_s"] for s in timed]),
        "nonfinite_steps": float(sections[-1]["nonfinite_steps"]),
        "gpu_util": C.median([s.get("gpu_util", math.nan) for s in timed]),
    }


def _learner_facts(learner: Any) -> tuple[str, str]:
    """(device type, a digest of the module's weights) of one Learner actor."""
    state = learner.module[MID].unwrapped().state_dict()
    digest = hashlib.sha256(b"".join(v.detach().cpu().numpy().tobytes() for v in state.values())).hexdigest()
    return learner._device.type, digest


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch

    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device: skipped (torch {torch.__version__} sees none; run it on a GPU machine)")
        return 1 if args.require_gpu else 0
    gpus = torch.cuda.device_count()
    try:
        learners, notes = plan_learners(gpus, args.learners)
    except ValueError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    C.quiet()
    report: dict[str, Any] = {
        "machine": C.machine(),
        "gpus": gpus,
        "gpu": torch.cuda.get_device_name(0),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "notes": notes,
    }
    rows: list[tuple[str, str, str, str]] = []
    C.say(f"gpu_check: {gpus} x {report['gpu']}; NVML sampling, fp32/bf16/fp16 learners, {learners} NCCL learner(s)")
    # One private Ray for every stage: building a learner with a GPU asks Ray's runtime context for its
    # device, which starts a default Ray of its own when none is running (found on the first GPU run:
    # the NCCL stage's ray.init then failed with "called ray.init twice").
    with C.local_ray(num_cpus=os.cpu_count() or 2, torch_threads=None):
        idle, busy = check_nvml(args.load_s)
        report["nvml"] = {"idle": idle, "busy": busy}
        rows.append(nvml_row(idle, busy, args.load_s))
        report["precision"] = measure_precision("cuda", args)
        rows += precision_rows(report["precision"], "cuda")
        torch.cuda.empty_cache()
        report["nccl"] = run_learners(args, learners)
    rows += nccl_rows(report["nccl"])
    report["rows"] = rows
    print(C.table(HEADERS, rows))
    for note in notes:
        print("note:", note)
    C.write_json(args.out, report)
    return 0 if all(r[3] == OK for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
