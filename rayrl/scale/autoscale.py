"""Apply the elastic policy to a live cluster through Ray's autoscaler.

    python -m rayrl.scale.autoscale RUN_DIR --address auto --bundle '{"GPU": 8}' [--util gpu_util]

Polls the run folder's history.csv (the utilisation and env steps/s every trial already reports),
asks :func:`rayrl.scale.elastic.decide` for the next size, and holds that many ``--bundle`` s with
``ray.autoscaler.sdk.request_resources``: the autoscaler starts nodes to fit them and, when the
request shrinks, lets the idle ones go after its idle timeout. Each decision is appended to
RUN_DIR/elastic.jsonl. Ray is touched only in :func:`request_nodes` and :func:`main`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from rayrl.scale.elastic import Decision, Policy, Sample, State, decide

UTIL_COLUMNS = ("gpu_util", "cpu_util")


class HistoryTail:
    """New rows of a run folder's history.csv since the last look, as policy samples."""

    def __init__(self, run_dir: str | Path, util: str = "gpu_util") -> None:
        self.path = Path(run_dir) / "history.csv"
        self.util = util
        self._seen = 0

    def new_samples(self, now: float) -> list[Sample]:
        if not self.path.exists():
            return []
        try:
            rows = pd.read_csv(self.path)
        except (pd.errors.EmptyDataError, pd.errors.ParserError):
            return []  # being written: read it next time
        fresh, self._seen = rows.iloc[self._seen :], len(rows)
        return [
            Sample(t=now, util=_num(r.get(self.util)), env_steps_per_s=_num(r.get("env_steps_per_s")))
            for r in fresh.to_dict("records")
        ]


class ElasticRunner:
    """One policy loop: feed samples, decide, apply a changed size, log the decision."""

    def __init__(
        self,
        source: HistoryTail,
        apply: Callable[[int], None],
        policy: Policy,
        start_nodes: int,
        log_path: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source, self.apply, self.policy, self.clock = source, apply, policy, clock
        self.samples: list[Sample] = []
        self.state = State(nodes=start_nodes)
        self.log_path = log_path
        self.apply(start_nodes)

    def step(self) -> Decision:
        now = self.clock()
        self.samples = (self.samples + self.source.new_samples(now))[-1000:]
        d = decide(self.samples, self.state, now, self.policy)
        if d.nodes != self.state.nodes:
            self.apply(d.nodes)
        self.state = d.state
        if self.log_path is not None:
            with self.log_path.open("a") as f:
                f.write(
                    json.dumps(
                        {"t": now, "action": d.action, "nodes": d.nodes, "reason": d.reason, "state": asdict(d.state)},
                        default=str,
                    )
                    + "\n"
                )
        return d


def request_nodes(bundle: dict[str, float]) -> Callable[[int], None]:
    """An ``apply`` that holds ``n`` copies of ``bundle`` through Ray's autoscaler (needs ray.init)."""
    from ray.autoscaler.sdk import request_resources

    def apply(n: int) -> None:
        request_resources(bundles=[dict(bundle) for _ in range(n)])

    return apply


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rayrl.scale.autoscale", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--address", default="auto", help="Ray cluster to join (default: auto)")
    p.add_argument("--bundle", default='{"GPU": 8}', help="one node's worth of resources, JSON (default a GPU node)")
    p.add_argument("--util", default="gpu_util", choices=UTIL_COLUMNS, help="history.csv column to act on")
    p.add_argument("--start-nodes", type=int, default=1)
    p.add_argument("--min-nodes", type=int, default=1)
    p.add_argument("--max-nodes", type=int, default=1_000_000)
    p.add_argument("--interval", type=float, default=10.0, help="seconds between looks")
    p.add_argument("--cooldown", type=float, default=300.0, help="seconds after a change before acting again")
    p.add_argument("--sustain", type=int, default=3, help="samples beyond a threshold before acting")
    p.add_argument("--duration", type=float, default=math.inf, help="stop after this many seconds")
    args = p.parse_args(argv)
    try:
        bundle = json.loads(args.bundle)
        if (
            not isinstance(bundle, dict)
            or not bundle
            or not all(isinstance(v, (int, float)) and v > 0 for v in bundle.values())
        ):
            raise ValueError("not an object of positive numbers")
        policy = Policy(
            cooldown_s=args.cooldown, sustain=args.sustain, min_nodes=args.min_nodes, max_nodes=args.max_nodes
        )
    except ValueError as exc:
        sys.stderr.write(
            f"rayrl autoscale: error: --bundle {args.bundle!r} / policy flags: {exc}. Give e.g. "
            "--bundle '{\"GPU\": 8}' and 1 <= --min-nodes <= --max-nodes.\n"
        )
        return 2
    import ray

    ray.init(address=args.address, log_to_driver=False)
    runner = ElasticRunner(
        HistoryTail(args.run_dir, args.util),
        request_nodes(bundle),
        policy,
        max(args.start_nodes, args.min_nodes),
        Path(args.run_dir) / "elastic.jsonl",
    )
    end = time.monotonic() + args.duration
    while time.monotonic() < end:
        d = runner.step()
        print(f"[elastic] {d.action} -> {d.nodes} node(s): {d.reason}", flush=True)
        time.sleep(args.interval)
    return 0


def _num(value: object) -> float:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
    return v


if __name__ == "__main__":
    sys.exit(main())
