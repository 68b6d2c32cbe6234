"""`rayrl plan RUN_DIR`: a capacity plan from a measured run, for 1, 2, 4, ... up to N GPUs.

Reads the run folder (rayrl.scale.measure), applies the scaling model (rayrl.scale.model) on a
cluster description (rayrl.scale.cluster), and prints a table plus the scale-out schedule
(rayrl.scale.schedule); writes plan.json (one row per size, the schedule, every input and where
it came from) and plan.png. Nothing here starts Ray.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from rayrl.errors import EXIT_USAGE, SpecError
from rayrl.judge.folder import RunFolderError
from rayrl.observe import cost
from rayrl.scale import cluster as cluster_mod
from rayrl.scale import model, schedule
from rayrl.scale.measure import measure

SHORTER = 0.10  # the design's figure: what a run made 10% shorter saves


def build(
    m: model.Measured,
    cl: cluster_mod.ClusterSpec,
    run_prices: cost.CostSpec,
    gpus: int,
    deadline_h: float | None = None,
    min_gain: float = schedule.MIN_GAIN,
) -> dict[str, Any]:
    """plan.json's content: rows for 1, 2, 4, ... ``gpus``, the schedule, the fleet figure."""
    prices = model.prices_for(cl, run_prices)
    points = [model.predict(m, cl, prices, n) for n in model.sizes(gpus)]
    rows = [_clean({**asdict(p), "meets_deadline": _meets(p, deadline_h)}) for p in points]
    steps = schedule.schedule(points, min_gain=min_gain)
    held = math.ceil(gpus / cl.gpus_per_node) * cl.gpus_per_node
    hours = deadline_h if deadline_h is not None else 24.0 * 30
    fleet = cost.fleet_cost(held, hours, prices.gpu_hour_usd, prices.spot_discount)
    fastest = next((p.gpus for p in points if _meets(p, deadline_h)), None) if deadline_h is not None else None
    return {
        "measured": {
            **asdict(m),
            "env_steps_per_s_per_runner": m.runner_steps_per_s,
            "learner_samples_per_s_per_gpu": m.learner_samples_per_s,
            "optimizer_steps": m.optimizer_steps,
        },
        "cluster": asdict(cl),
        "prices": asdict(prices),
        "rows": rows,
        "schedule": [s.as_dict() for s in steps],
        "fleet": {
            "gpus": held,
            "hours": hours,
            "usd": fleet,
            "usd_saved_if_shorter": cost.savings(fleet, SHORTER),
            "shorter_fraction": SHORTER,
            "hours_from": "--deadline" if deadline_h is not None else "30 days",
        },
        "deadline_h": deadline_h,
        "fewest_gpus_meeting_deadline": fastest,
    }


def render(plan: dict[str, Any]) -> str:
    """The table, the schedule and the fleet line, as the terminal shows them."""
    head = (
        f"{'gpus':>7} {'nodes':>6} {'runners':>8} {'env steps/s':>12} {'eff':>5} {'$/hour':>10} "
        f"{'$/M samples':>11} {'h to target':>11} {'$ to target':>12}"
    )
    lines = [
        f"capacity plan on {plan['cluster']['name']} ({plan['cluster']['gpu']}, "
        f"{plan['cluster']['gpus_per_node']}/node), ${plan['prices']['gpu_hour_usd']:g}/GPU-hour",
        head,
    ]
    for r in plan["rows"]:
        lines.append(
            f"{r['gpus']:>7} {r['nodes']:>6} {r['env_runners']:>8} {r['env_steps_per_s']:>12,.0f} "
            f"{r['efficiency']:>5.2f} {r['usd_per_hour']:>10,.2f} {r['usd_per_million_samples']:>11.4f} "
            f"{_fmt(r['hours_to_target'], '.3g'):>11} {_fmt(r['usd_to_target'], ',.2f'):>12}"
        )
    lines.append("scale-out schedule (each step <= 2x; keep a step only if its measured gain >= the gate):")
    for s in plan["schedule"]:
        lines.append(
            f"  {s['step']:>2}. {s['from_gpus']} -> {s['to_gpus']} GPUs: predicted gain "
            f"{s['predicted_gain']:+.0%} in {s['gain_of']} -> {s['decision']}"
        )
    if not plan["schedule"]:
        lines.append("  (one size only: nothing to schedule)")
    f = plan["fleet"]
    lines.append(
        f"fleet: {f['gpus']:,} GPUs for {f['hours']:g} h cost ${f['usd']:,.0f}; a run "
        f"{f['shorter_fraction']:.0%} shorter saves ${f['usd_saved_if_shorter']:,.0f}"
    )
    if plan["deadline_h"] is not None:
        n = plan["fewest_gpus_meeting_deadline"]
        lines.append(
            f"deadline {plan['deadline_h']:g} h: "
            + (f"{n} GPUs is the smallest size that meets it" if n else "no size in the plan meets it")
        )
    return "\n".join(lines)


def plot(plan: dict[str, Any], path: Path) -> None:
    """plan.png: throughput and efficiency against GPUs (log2 axis)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 4.0), layout="constrained")
    ax = fig.add_subplot()
    gpus = [r["gpus"] for r in plan["rows"]]
    ax.plot(gpus, [r["env_steps_per_s"] for r in plan["rows"]], "o-", label="env steps/s (predicted)")
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    whole = FuncFormatter(lambda v, _pos: f"{v:,.0f}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(whole)  # 1, 2, 4, ... not 2^k
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(whole)
    ax.yaxis.set_minor_formatter(NullFormatter())  # no crowded minor labels on the log axis
    ax.set_xlabel("GPUs (learners)")
    ax.set_ylabel("env steps per second")
    eff = ax.twinx()
    eff.plot(gpus, [r["efficiency"] for r in plan["rows"]], "s--", color="tab:orange", label="scaling efficiency")
    eff.set_ylabel("scaling efficiency (fraction)")
    eff.set_ylim(0, 1.05)
    handles = ax.get_legend_handles_labels()[0] + eff.get_legend_handles_labels()[0]
    ax.legend(handles, [str(h.get_label()) for h in handles], loc="lower right")
    ax.set_title(f"capacity plan on {plan['cluster']['name']}")
    fig.savefig(path, dpi=100)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `rayrl plan`; exit 2 with one paragraph on bad input."""
    p = argparse.ArgumentParser(
        prog="rayrl plan",
        description=__doc__.split("\n\n")[0] + " Cluster fields "
        "(YAML, `preset: NAME` plus overrides): "
        + ", ".join(f.name for f in fields(cluster_mod.ClusterSpec))
        + ". See docs/scale.md.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder a sweep or `rayrl train` wrote")
    p.add_argument("--gpus", type=int, default=1024, help="plan up to this many GPUs (default 1024)")
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        metavar="H",
        help="hours to reach the target: names the smallest size that meets it, and prices the fleet for H hours",
    )
    p.add_argument(
        "--cluster",
        default=None,
        metavar="FILE",
        help=f"cluster YAML or a preset: {', '.join(cluster_mod.PRESETS)} (default {cluster_mod.DEFAULT_PRESET})",
    )
    p.add_argument("--out", default=None, help="plan.json path (default RUN_DIR/plan.json; plan.png beside it)")
    p.add_argument(
        "--grad-bytes", type=float, default=None, help="bytes all-reduced per step (default: the MLP's parameters x 4)"
    )
    p.add_argument(
        "--target",
        type=float,
        default=None,
        metavar="RETURN",
        help="episode return to plan for (default: the run's stop.episode_return)",
    )
    p.add_argument(
        "--critical-batch",
        type=float,
        default=None,
        help="critical batch, env steps (default: "
        "fitted over the trials that reached the target, else search.doubling.cap)",
    )
    args = p.parse_args(argv)
    try:
        _check(args)
        cl = cluster_mod.load(args.cluster)
        from rayrl.judge import folder

        m, sources = measure(args.run_dir, args.grad_bytes, args.critical_batch, args.target)
        plan = build(m, cl, folder.load(args.run_dir).prices, args.gpus, args.deadline)
    except (SpecError, RunFolderError) as exc:
        sys.stderr.write(textwrap.fill(f"rayrl plan: error: {exc}", width=100) + "\n")
        return EXIT_USAGE
    plan["sources"] = sources
    out = Path(args.out) if args.out else Path(args.run_dir) / "plan.json"
    out.write_text(json.dumps(plan, indent=2) + "\n")
    print(render(plan))
    try:
        plot(plan, out.with_suffix(".png"))
    except ImportError:
        print("no plot: matplotlib is not installed (pip install matplotlib).")
    print(f"wrote {out}")
    return 0


def _check(args: argparse.Namespace) -> None:
    if args.gpus < 1:
        raise SpecError(f"--gpus: {args.gpus} is not a size; give a whole number of GPUs >= 1.")
    for flag, value in (
        ("--deadline", args.deadline),
        ("--grad-bytes", args.grad_bytes),
        ("--critical-batch", args.critical_batch),
    ):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise SpecError(f"{flag}: {value} must be a finite number > 0.")
    if args.target is not None and not math.isfinite(args.target):
        raise SpecError(f"--target: {args.target} must be a finite episode return.")
    if args.out and not Path(args.out).resolve().parent.is_dir():
        raise SpecError(f"--out: {args.out}: its folder does not exist; give a path in an existing folder.")


def _meets(p: model.Point, deadline_h: float | None) -> bool | None:
    if deadline_h is None or p.hours_to_target is None:
        return None
    return p.hours_to_target <= deadline_h


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    """JSON-safe: NaN/inf become null."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
