"""Shared pieces of the benchmarks: specs, a local Ray, timed iterations, tables, JSON.

Every RLlib-based contender (see contenders.py) is measured in the driver with the same clock
(``time.perf_counter`` around ``Algorithm.train()``), so Tune is not part of any figure.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "experiments" / "configs" / "cartpole_ppo.yaml"
TARGET_RETURN = 450.0
#: Episodes in the mean return that decides "reached the target", for every contender (rayrl's own).
RETURN_WINDOW = 20


def machine() -> dict[str, Any]:
    """The facts a figure needs next to it: cores, CPU model, load, versions, date."""
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import ray
    import torch

    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "torch": torch.__version__,
    }


#: Torch threads of the driver, where every RLlib contender learns (its local learner). A Tune trial
#: holding 1 CPU gets OMP_NUM_THREADS=1 from Ray, so 1 matches how rayrl's trials run; on a busy
#: 2-core machine 2 threads also make small-batch SGD several times slower (docs/benchmarks.md).
TORCH_THREADS = 1


def add_torch_threads(parser: Any) -> None:
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=TORCH_THREADS,
        help="torch threads in the driver, where the contenders learn (default %(default)s: "
        "what a 1-CPU Tune trial gets)",
    )


def mode_default(value: Any, quick_value: Any, full_value: Any, quick: bool) -> Any:
    """A flag's value, else its default for --quick or the full run. Unlike ``value or default``, an
    explicit 0 stays 0, so the range check after it rejects it instead of running the default."""
    if value is not None:
        return value
    return quick_value if quick else full_value


@contextmanager
def local_ray(num_cpus: int = 2, torch_threads: int | None = TORCH_THREADS) -> Iterator[Any]:
    """A private local Ray (never a running cluster's), shut down on exit; the driver's torch threads set."""
    import ray
    import torch

    if torch_threads:
        torch.set_num_threads(torch_threads)
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        yield ray
    finally:
        ray.shutdown()


def quiet() -> None:
    """Fewer warnings from RLlib/Ray in the benchmark's own output."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    for name in ("ray", "ray.rllib", "ray.tune", "ray.train"):
        logging.getLogger(name).setLevel(logging.ERROR)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now (the gloo rendezvous of a measurement)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- specs ------------------------------------------------------------------------------------


def load_spec(path: str | Path, overrides: Sequence[str] = ()) -> Any:
    """A rayrl spec from YAML (a config or a sweep's best_config.yaml), with ``--set`` overrides."""
    from rayrl import spec as spec_mod

    return spec_mod.load(path, list(overrides))


def spec_at_batch(spec: Any, batch: int) -> Any:
    """``spec`` at train batch ``batch``, the minibatch following it as in the sweep's ladder."""
    from rayrl import spec as spec_mod
    from rayrl.sweep import ladder

    a = spec.algo
    return spec_mod.replace(
        spec,
        algo={
            "train_batch_per_learner": batch,
            "minibatch_size": ladder.minibatch_for(batch, a.train_batch_per_learner, a.minibatch_size),
        },
    )


def rayrl_config(spec: Any) -> Any:
    from rayrl.rllib.algo import build_config

    return build_config(spec)


# ---- the knee of a sweep's ladder ------------------------------------------------------------


def read_knee(path: Path) -> tuple[int, list[dict]]:
    """The knee (and the ladder, if there) from a doubling.csv, a summary.json or a run folder."""
    from rayrl import runfolder
    from rayrl.runfolder import read_doubling

    if path.is_dir():
        path = path / "doubling.csv" if (path / "doubling.csv").exists() else path / "summary.json"
    if not path.exists():
        raise SystemExit(
            f"--doubling: {str(path)!r} does not exist; give a sweep's doubling.csv, summary.json or run folder."
        )
    if path.suffix == ".json":
        import json

        summary = json.loads(path.read_text())
        if not summary.get("knee_batch_size"):
            raise SystemExit(f"--doubling: {str(path)!r} has no knee_batch_size; is it a sweep's summary.json?")
        sibling = path.with_name("doubling.csv")
        rows = ladder_dicts(read_doubling(sibling)) if sibling.exists() else []
        return int(summary["knee_batch_size"]), rows
    rows = read_doubling(path)
    knee = runfolder.knee(rows)
    if knee is None:
        raise SystemExit(f"--doubling: {str(path)!r} has no knee (its first rung failed).")
    return knee, ladder_dicts(rows)


def ladder_dicts(rows: list) -> list[dict]:
    return [
        {"batch_size": r.batch_size, "env_steps_per_s": r.env_steps_per_s, "gain": r.gain, "decision": r.decision}
        for r in rows
    ]


# ---- timed iterations -------------------------------------------------------------------------


@dataclass
class Timed:
    """Per-iteration figures of one built algorithm, measured in the driver."""

    build_s: float
    wall_s: list[float] = field(default_factory=list)
    env_steps: list[float] = field(default_factory=list)
    timers: list[dict[str, float]] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)

    @property
    def sps(self) -> list[float]:
        """Env steps per second of each measured iteration (end to end: sample + learn + overhead)."""
        return [s / w for s, w in zip(self.env_steps, self.wall_s) if w > 0]


def run_iterations(config: Any, warmup: int, iters: int, on_result: Callable[[dict], None] | None = None) -> Timed:
    """Build ``config``, run ``warmup`` untimed then ``iters`` timed iterations, stop it."""
    from rayrl.observe import keys

    t0 = time.perf_counter()
    algo = config.build_algo()
    timed = Timed(build_s=time.perf_counter() - t0)
    try:
        last = 0.0
        for i in range(warmup + iters):
            t = time.perf_counter()
            result = algo.train()
            wall = time.perf_counter() - t
            steps = float(keys.lookup(result, keys.ENV_STEPS, 0) or 0)
            if i >= warmup:
                timed.wall_s.append(wall)
                timed.env_steps.append(steps - last)
                timed.timers.append(dict(result.get("timers", {}) or {}))
                timed.returns.append(_num(keys.lookup(result, keys.EPISODE_RETURN)))
            if on_result is not None:
                on_result(result)
            last = steps
    finally:
        algo.stop()
    return timed


# ---- numbers, tables, files -------------------------------------------------------------------


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def median(values: Sequence[float]) -> float:
    """Median of the finite values; NaN when there are none."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return float(statistics.median(finite)) if finite else math.nan


def ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) else math.nan


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (also readable on a terminal)."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            if not math.isfinite(v):
                return "-"
            return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) >= 1 else f"{v:.3g}"
        return str(v)

    cells = [[cell(v) for v in row] for row in rows]
    width = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, width)) + " |"  # noqa: E731
    return "\n".join([line(headers), "| " + " | ".join("-" * w for w in width) + " |", *map(line, cells)])


def jsonable(value: Any) -> Any:
    """NaN/inf -> None, Paths -> str, recursively: the JSON files stay strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def write_json(path: Path | None, data: dict, quiet: bool = False) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(jsonable(data), indent=2, allow_nan=False))
    if not quiet:
        print(f"wrote {path}")


def say(*parts: Any) -> None:
    print(*parts, flush=True)
    sys.stdout.flush()
