"""Per-iteration stall of a checkpoint, synchronous vs tiered, side by side, against S3-compatible storage.

Why: a synchronous checkpoint (Tune's own path: copy to storage, then train on) makes training wait
on the upload every checkpoint; rayrl's tiered checkpoints write tier 1 (a local folder) and upload
in the background. This runs the same `rayrl train` trial twice per round, ``checkpoint.tiered``
false then true (the order alternates each round), checkpointing every iteration into an S3 server
on 127.0.0.1 (moto, started here; ``--storage`` takes any other URI or a local folder instead), and
reports per mode:

- ``stall_s``: the time the trial spent in ``save()`` per checkpoint (training waits this long),
  median over checkpoints, from ``rayrl/checkpoint_stall_s``;
- ``gap_s``: the wall time between consecutive results seen by the driver (train + save + Tune),
  median; the difference between the modes is what a user sees per iteration.

    python -m benchmarks.checkpoint_stall                # 2 rounds, 10 iterations each
    python -m benchmarks.checkpoint_stall --quick        # 1 round, 4 iterations
    python -m benchmarks.checkpoint_stall --hidden 1024,1024 --out stall.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common as C

MODES = ("sync", "tiered")


def start_s3() -> tuple[Any, str]:
    """A moto S3 server on a free 127.0.0.1 port; the environment points every S3 client at it."""
    import logging
    import socket

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )
    import boto3

    boto3.client("s3").create_bucket(Bucket="bench")
    return server, "s3://bench/runs"


def one_run(mode: str, storage: str, round_: int, args: argparse.Namespace, scratch: Path) -> dict:
    """One `rayrl train` trial in this process (Tune, the tiered trainable), checkpointing every iteration."""
    from ray import tune

    from rayrl import runtime
    from rayrl.observe import keys
    from rayrl.tune.tuner import make_tuner

    spec = C.load_spec(
        C.DEFAULT_CONFIG,
        [
            f"algo.train_batch_per_learner={args.batch}",
            f"algo.minibatch_size={min(args.batch, 256)}",
            "algo.epochs=1",
            f"model.hidden=[{args.hidden}]",
            "env.envs_per_runner=4",
            "stop.episode_return=null",
            f"stop.env_steps={args.batch * args.iters}",
            "checkpoint.every=1",
            "checkpoint.keep=3",
            f"checkpoint.tiered={'true' if mode == 'tiered' else 'false'}",
            f"checkpoint.local_dir={scratch / 'tier1'}",
        ],
    )
    name = f"stall-{mode}-{round_}"
    run_dir = scratch / name
    run_dir.mkdir(parents=True)
    paths = runtime.RunPaths(storage.rstrip("/"), name, run_dir, "://" in storage)
    seen: list[tuple[float, dict]] = []

    class Record(tune.Callback):
        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            seen.append((time.perf_counter(), result))

    start = time.perf_counter()
    make_tuner(spec, paths, extra_callbacks=[Record()], verbose_label=f"{mode} {round_}").fit()
    wall = time.perf_counter() - start
    stalls = [r["rayrl"]["checkpoint_stall_s"] for _, r in seen[1:]]  # each result carries the save before it
    gaps = [b - a for (a, _), (b, _) in zip(seen, seen[1:])]
    last = seen[-1][1]["rayrl"] if seen else {}
    return {
        "mode": mode,
        "round": round_,
        "iterations": len(seen),
        "stall_s": C.median(stalls),
        "stall_max_s": max(stalls) if stalls else None,
        "gap_s": C.median(gaps),
        "wall_s": wall,
        "uploads": last.get("checkpoint_uploads"),
        "upload_s": last.get("checkpoint_upload_s"),
        "env_steps": seen[-1][1].get(keys.ENV_STEPS) if seen else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--storage", default=None, help="storage URI or folder (default: a moto S3 server here)")
    p.add_argument("--rounds", type=int, default=None, help="rounds; each runs both modes (default 2; --quick 1)")
    p.add_argument("--iters", type=int, default=None, help="iterations per run (default 10; --quick 4)")
    p.add_argument("--batch", type=int, default=512, help="train batch (default %(default)s)")
    p.add_argument(
        "--hidden",
        default="512,512",
        help="policy MLP sizes: the checkpoint's size (default %(default)s, about 4 MB with the optimizer state)",
    )
    p.add_argument("--quick", action="store_true", help="1 round of 4 iterations: a smoke test")
    p.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    args = p.parse_args(argv)
    args.rounds = C.mode_default(args.rounds, 1, 2, args.quick)
    args.iters = C.mode_default(args.iters, 4, 10, args.quick)
    if args.rounds < 1 or args.iters < 3 or args.batch < 64:
        p.error("--rounds must be >= 1, --iters >= 3 and --batch >= 64")
    server, storage = (None, args.storage) if args.storage else start_s3()
    C.quiet()
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="rayrl-stall-") as tmp, C.local_ray(num_cpus=2):
            for r in range(args.rounds):
                for mode in MODES if r % 2 == 0 else MODES[::-1]:
                    rows.append(one_run(mode, storage, r, args, Path(tmp)))
                    C.say(f"{mode} round {r}: stall {rows[-1]['stall_s']:.3f}s, gap {rows[-1]['gap_s']:.2f}s")
    finally:
        if server is not None:
            server.stop()
    by = {m: [row for row in rows if row["mode"] == m] for m in MODES}
    summary = {
        m: {
            "stall_s": C.median([r["stall_s"] for r in by[m]]),
            "gap_s": C.median([r["gap_s"] for r in by[m]]),
            "upload_s": C.median([r["upload_s"] or 0.0 for r in by[m]]),
        }
        for m in MODES
    }
    print(
        C.table(
            ["mode", "stall per checkpoint (s)", "result gap (s)", "upload (s)"],
            [
                [m, f"{summary[m]['stall_s']:.3f}", f"{summary[m]['gap_s']:.2f}", f"{summary[m]['upload_s']:.3f}"]
                for m in MODES
            ],
        )
    )
    print(
        f"tiered / sync stall: {C.ratio(summary['tiered']['stall_s'], summary['sync']['stall_s']):.2f}; "
        f"storage {storage if args.storage else 'moto S3 on 127.0.0.1'}, hidden {args.hidden}, batch {args.batch}, "
        f"{args.iters} iterations x {args.rounds} round(s), checkpoint every iteration"
    )
    C.write_json(
        args.out,
        {"machine": C.machine(), "settings": vars(args) | {"out": str(args.out)}, "runs": rows, "summary": summary},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
