"""The scaling model against measurement: predict 2 and 4 CPU learners (gloo) and 2 and 4 env
runners from a 1-learner / 1-runner run, then run them and compare side by side.

The model's inputs are what `rayrl plan` would read: the 1/1 run's sampling and learner-update
times per iteration (RLlib's timers, un-smoothed as rayrl.scale.measure does) and a gloo
all-reduce micro-benchmark at 2 ranks (the nccl-tests of this machine: latency from a 4-byte
all-reduce, bus bandwidth from a 4 MB one). Predictions use rayrl.scale.model.predict with the
env runners fixed to the measured configuration. Each configuration runs in one local Ray,
measured in the driver (benchmarks/common.py). On a small shared machine the learners and
runners contend for the same cores, which the model does not know: the error column says how
much that costs.

    python -m benchmarks.scale_validation [--batch 1024] [--iters 5] [--out scale_validation.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import common as C

#: (learners, env runners). The 1/1 input is measured first and last (order effects: warm-up, the
#: machine's load drifting); the model reads the mean of the two.
CONFIGS = ((1, 1), (2, 1), (4, 1), (1, 2), (1, 4), (1, 1))


def gloo_allreduce_s(sizes: tuple[int, ...], ranks: int, reps: int = 50) -> list[float]:
    """Mean seconds of one gloo all-reduce of each of ``sizes`` bytes across ``ranks`` local processes."""
    import torch.multiprocessing as mp

    port = C.free_port()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_allreduce_worker, args=(r, ranks, port, sizes, reps, out)) for r in range(ranks)]
    for p in procs:
        p.start()
    times = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    return [max(t[i] for t in times) for i in range(len(sizes))]


def _allreduce_worker(rank: int, ranks: int, port: int, sizes: tuple[int, ...], reps: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks)
    result = []
    for nbytes in sizes:
        t = torch.ones(max(nbytes // 4, 1))
        for _ in range(5):
            dist.all_reduce(t)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(t)
        result.append((time.perf_counter() - start) / reps)
    out.put(result)
    dist.destroy_process_group()


def measure_config(spec: Any, learners: int, runners: int, warmup: int, iters: int) -> dict:
    from rayrl import spec as spec_mod
    from rayrl.scale.measure import LEARN_TIMER, SAMPLE_TIMER, unsmooth

    s = spec_mod.replace(spec, resources={"learners": learners, "env_runners": runners})
    timers: list[dict] = []
    timed = C.run_iterations(
        C.rayrl_config(s), warmup, iters, on_result=lambda r: timers.append(dict(r.get("timers", {}) or {}))
    )
    sample = unsmooth([t[SAMPLE_TIMER.split("/")[1]] for t in timers])
    learn = unsmooth([t[LEARN_TIMER.split("/")[1]] for t in timers])
    return {
        "learners": learners,
        "env_runners": runners,
        "env_steps_per_s": C.median(timed.sps),
        "sps": timed.sps,
        "sample_s": C.median(sample[warmup:]),
        "learn_s": C.median(learn[warmup:]),
        "env_steps_per_iter": C.median(timed.env_steps),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(C.DEFAULT_CONFIG))
    p.add_argument("--batch", type=int, default=1024, help="env steps per learner per iteration")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    C.quiet()
    from rayrl import spec as spec_mod
    from rayrl.scale import cluster as cluster_mod
    from rayrl.scale import model
    from rayrl.scale.measure import mlp_params, space_dims

    spec = C.load_spec(args.config)
    spec = spec_mod.replace(
        spec,
        algo={"train_batch_per_learner": args.batch, "minibatch_size": args.batch // 4, "epochs": 4},
        env={"envs_per_runner": 8},
    )
    grad_bytes = 4 * mlp_params(*space_dims(spec.env.id), list(spec.model.hidden))
    small, big = gloo_allreduce_s((4, 4 << 20), 2)
    latency_us = small / 2 * 1e6  # ring at 2 ranks: 2(n-1) = 2 latency steps
    busbw = (4 << 20) / max(big - 2 * small / 2, 1e-9) / 1e9  # 2(n-1)/n = 1 at 2 ranks
    C.say(
        f"gloo at 2 ranks: latency {latency_us:.0f} us/step, bus bandwidth {busbw:.2f} GB/s; "
        f"gradient {grad_bytes} bytes"
    )
    measured = []
    with C.local_ray(num_cpus=8):  # logical CPUs: 4 learners + runners + driver fit; the cores are shared
        for learners, runners in CONFIGS:
            C.say(f"measuring {learners} learner(s), {runners} env runner(s) ...")
            measured.append(measure_config(spec, learners, runners, args.warmup, args.iters))
            C.say(f"  {measured[-1]['env_steps_per_s']:.0f} env steps/s")
    bases = [r for r in measured if (r["learners"], r["env_runners"]) == (1, 1)]
    sample_s = sum(b["sample_s"] * args.batch / b["env_steps_per_iter"] for b in bases) / len(bases)
    m = model.Measured(
        algo=spec.algo.name,
        batch_per_learner=args.batch,
        minibatch=args.batch // 4,
        epochs=4,
        learners=1,
        env_runners=1,
        sample_s=sample_s,
        learn_s=sum(b["learn_s"] for b in bases) / len(bases),
        grad_bytes=grad_bytes,
    )
    here = cluster_mod.ClusterSpec(
        name="this machine (gloo)",
        gpu="CPU",
        gpus_per_node=64,
        cpus_per_node=64,
        intra_node_busbw_gbs=busbw,
        intra_node_latency_us=latency_us,
    )
    rows = []
    for r in measured:
        pred = model.predict(m, here, spec.cost, r["learners"], env_runners=r["env_runners"]).env_steps_per_s
        rows.append(
            [
                r["learners"],
                r["env_runners"],
                pred,
                r["env_steps_per_s"],
                (pred - r["env_steps_per_s"]) / r["env_steps_per_s"],
            ]
        )
    C.say(C.table(["learners", "env runners", "predicted env steps/s", "measured env steps/s", "error"], rows))
    C.write_json(
        args.out,
        {
            "machine": C.machine(),
            "model_inputs": {"sample_s": m.sample_s, "learn_s": m.learn_s},
            "batch_per_learner": args.batch,
            "gloo_latency_us": latency_us,
            "gloo_busbw_gbs": busbw,
            "grad_bytes": grad_bytes,
            "measured": measured,
            "rows": [dict(zip(("learners", "env_runners", "predicted", "measured", "error"), r)) for r in rows],
            "load_avg_1m": os.getloadavg()[0],
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
