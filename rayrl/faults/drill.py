"""`rayrl drill RUN_DIR`: fault drills on a scratch copy of a run's spec, and a restore of every checkpoint.

A long run is only as good as its recovery, and recovery that is never exercised rots. The drills
kill real processes the way a cluster loses them and time how long training takes to come back:

- ``env_runner``: SIGKILL one EnvRunner actor; RLlib restarts it, resyncs its weights and counts
  the restart (``fault_tolerance/num_remote_worker_restarts``), and training never stops.
- ``trial``: SIGKILL the trial's own actor; Tune retries it from its latest checkpoint and the
  counters (iteration, env steps) go on from that checkpoint, not from zero.
- ``driver``: ``kill -9`` the driver (the sweep during the search, or ``rayrl train``) and run the same
  command again: it resumes, the ladder and finished trials are kept, no file already written changes.
- ``node`` (only on a cluster with more than one node): kill the raylet of a worker node that hosts
  the drill's actors; training survives on the remaining nodes.
- ``storage``: the storage refuses checkpoint uploads for a while (`rayrl.faults.storage_drill`);
  training goes on meanwhile and every checkpoint lands intact once the storage is back.

Drills never touch the user's run: they train a copy of its spec with tiny budgets under
``RUN_DIR/drills/`` (wiped before each drill). The restore check then loads every kept checkpoint
of the run itself with ``Algorithm.from_checkpoint`` (read only) and plays one greedy episode with
each. Results go to ``RUN_DIR/drill.json``, which `rayrl report` and `rayrl doctor` read.

This module is the orchestration: it checks RUN_DIR, runs the drills in order (the driver drill
before this process starts its own Ray), writes drill.json and is the CLI. The drills live in
`rayrl.faults.drills` (env_runner, trial, node) and `rayrl.faults.driver_drill`, their shared machinery in
`rayrl.faults.harness`, the restore check in `rayrl.faults.restore`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

from rayrl import runtime
from rayrl import spec as spec_mod
from rayrl.args import Parser, fail
from rayrl.errors import EXIT_USAGE, SpecError
from rayrl.faults.drills import env_runner_drill, node_drill, trial_drill
from rayrl.faults.driver_drill import driver_drill
from rayrl.faults.harness import SCRATCH, drill_runners, say
from rayrl.faults.restore import restore_checkpoints
from rayrl.faults.storage_drill import storage_drill
from rayrl.judge.folder import RunFolderError
from rayrl.judge.folder import load as load_run
from rayrl.spec import Spec
from rayrl.storage.mirror import fetch, publish
from rayrl.storage.uri import is_uri
from rayrl.tune import resources

DRILLS = ("env_runner", "trial", "driver", "node", "storage")


class DrillError(Exception):
    """A drill cannot be set up here (bad run folder, unreachable cluster); the message says why."""


def check_run_dir(path: str | Path) -> tuple[Path, Spec, str]:
    """The run folder, its spec and its kind; DrillError naming the problem when it is not usable."""
    try:
        run = load_run(path)
    except RunFolderError as exc:
        raise DrillError(str(exc)) from None
    try:
        spec = spec_mod.from_dict(run.spec)  # the whole spec this time: the drills train it
    except SpecError as exc:
        raise DrillError(
            f"{run.path / 'spec.yaml'}: not a valid rayrl spec ({exc}); the run folder is damaged "
            "or from another version of rayrl."
        ) from None
    return run.path, spec, run.kind


def run_drills(
    run_dir: Path,
    spec: Spec,
    kind: str,
    names: Sequence[str],
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    restore: bool = True,
    timeout_s: float = 600.0,
) -> dict:
    """Run the named drills and the restore check; write and return drill.json's content."""
    import ray

    if address is None:  # a cluster's autoscaler adds GPU nodes on demand; this machine cannot
        _check_local_gpus(spec)
    storage = run_dir / SCRATCH
    storage.mkdir(exist_ok=True)
    local_cpus = None if address else max(num_cpus or os.cpu_count() or 2, _cpus_needed(spec))
    results: dict[str, dict] = {}
    skipped: list[dict] = []

    def driver() -> None:  # always the first drill: a process of its own, killed and rerun
        results["driver"] = _logged(
            driver_drill(spec, kind, storage, address=address, num_cpus=local_cpus, timeout_s=timeout_s * 1.5)
        )

    if "driver" in names and address is None:  # it starts its own local Ray: before this process starts one
        driver()
    runtime.init_ray(address, local_cpus)  # on a cluster: the reachability check, before any drill
    if "driver" in names and address is not None:
        driver()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    say(f"cluster: {len(nodes)} node(s), {ray.cluster_resources().get('CPU', 0):g} CPUs")
    for name in DRILLS:
        if name not in names or name in results:
            continue
        if name == "node" and len(nodes) < 2:
            skipped.append({"name": "node", "reason": f"the cluster has {len(nodes)} node"})
            say("node: skipped (a one-node cluster; give --address of a multi-node cluster)")
        else:
            say(f"{name}: training a scratch copy of the spec under {storage / name}")
            fn = {"env_runner": env_runner_drill, "trial": trial_drill, "node": node_drill, "storage": storage_drill}[
                name
            ]
            results[name] = _logged(fn(spec, storage, timeout_s))
    data = _merge(run_dir / "drill.json", kind, results, skipped)
    if restore:
        rows, rate = restore_checkpoints(run_dir, spec)
        data["restores"], data["restore_rate"] = rows, rate
        if not rows:
            say("restore: the run keeps no checkpoint (the ladder's and measurement trials keep none)")
    runtime.write_json(run_dir / "drill.json", data)
    return data


def _cpus_needed(spec: Spec) -> int:
    """CPUs a local Ray needs for the widest drill (drill_runners EnvRunners)."""
    held = resources.trial_resources(
        dataclasses.replace(spec.resources, env_runners=drill_runners(spec)),
        spec.evaluation.env_runners if spec.evaluation.interval > 0 else 0,
    )
    return math.ceil(held.cpus)


def _check_local_gpus(spec: Spec) -> None:
    """Refuse before any drill runs when this machine lacks the GPUs one trial of the spec holds."""
    needed = resources.of_spec(spec).gpus
    if needed <= 0:
        return
    import torch

    have = torch.cuda.device_count()
    if needed > have:
        raise DrillError(
            f"the run's spec needs {needed:g} GPU(s) per trial and this machine has {have}; run the "
            "drills on the cluster that ran it (--address)."
        )


def _logged(result: dict) -> dict:
    if result["outcome"] == "recovered":
        say(f"{result['name']}: recovered in {result['recovery_s']:.1f}s")
    else:
        why = result.get("problem") or "; ".join(result.get("problems", [])) or "no recovery seen"
        say(f"{result['name']}: FAILED: {why}")
    return result


def _merge(path: Path, kind: str, results: dict[str, dict], skipped: list[dict]) -> dict:
    """drill.json with this run's drills replacing same-named earlier ones (others are kept)."""
    old: dict = {}
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError:
            old = {}
    kept = {d["name"]: d for d in old.get("drills") or [] if isinstance(d, dict) and d.get("name") in DRILLS}
    kept.update(results)
    import ray

    data = {
        "kind": kind,
        "ray_version": ray.__version__,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "drills": [kept[n] for n in DRILLS if n in kept],
        "skipped": skipped,
        "restores": old.get("restores", []),
        "restore_rate": old.get("restore_rate"),
    }
    return data


# ---------------------------------------------------------------------------------------------
# `rayrl drill`


def build_parser() -> argparse.ArgumentParser:
    """The `rayrl drill` parser; its help text is the command's documentation."""
    p = Parser(
        prog="rayrl drill",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.dedent(
            """\
        Fault drills for a run folder: kill an EnvRunner, the trial, the driver (and a worker node on a
        multi-node cluster), time each recovery, then restore every kept checkpoint and play one
        episode from each. Writes RUN_DIR/drill.json (read by `rayrl report`).

        The drills train a copy of the run's spec with tiny budgets under RUN_DIR/drills/; the run
        itself is only read. About 3-5 minutes on 2 cores.

          env_runner  SIGKILL an EnvRunner; RLlib restarts and resyncs it, training goes on
          trial       SIGKILL the trial actor; Tune retries from the latest checkpoint
          driver      kill -9 the sweep (in the search) or `rayrl train`, then the same command again
          node        kill a worker node's raylet (only when the cluster has more than one node)
          storage     refuse checkpoint uploads for 8 s; training goes on, every checkpoint lands intact"""
        ),
        epilog="exit status: 0 all drills recovered and every checkpoint restored, 1 otherwise, 2 bad input "
        "(run folder, flags, an unreachable cluster, or GPUs this machine lacks), before any drill.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder of `rayrl train` or the sweep ({storage}/{name})")
    p.add_argument(
        "--only",
        nargs="+",
        choices=DRILLS,
        metavar="DRILL",
        default=None,
        help=f"run only these drills ({', '.join(DRILLS)}); drill.json keeps earlier results of the others",
    )
    p.add_argument(
        "--address",
        default=None,
        help="Ray cluster to run on (default: RAY_ADDRESS, else a new local "
        "Ray); the node drill needs a cluster with several nodes",
    )
    p.add_argument(
        "--num-cpus",
        type=int,
        default=None,
        help="CPUs for a local Ray (default: all, at least what a drill trial needs)",
    )
    p.add_argument("--no-restore", action="store_true", help="skip restoring the run's checkpoints")
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="give up on a drill after this many seconds (default: 600; the driver drill, which "
        "runs its command twice, gets 1.5x)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `rayrl drill`; exit 2 with one paragraph on a missing or damaged RUN_DIR."""
    args = build_parser().parse_args(argv)
    try:
        if args.num_cpus is not None and args.num_cpus < 1:
            raise DrillError(f"--num-cpus: {args.num_cpus} is not a positive number of CPUs.")
        if args.timeout <= 0:
            raise DrillError(f"--timeout: {args.timeout:g} is not a positive number of seconds.")
        source = args.run_dir if is_uri(args.run_dir) else None
        if source:  # object storage: drill a local copy (checkpoints included), then upload drill.json
            try:
                fetch(source, full=True)
            except (FileNotFoundError, SpecError, OSError) as exc:
                raise DrillError(f"{source}: cannot read a run folder there ({exc}).") from None
        run_dir, spec, kind = check_run_dir(args.run_dir)
        if not os.access(run_dir, os.W_OK):
            raise DrillError(f"{run_dir}: not writable; the drills need RUN_DIR/drills/ and RUN_DIR/drill.json.")
    except DrillError as exc:
        fail(str(exc), "rayrl drill")
        return EXIT_USAGE
    address = args.address or os.environ.get("RAY_ADDRESS") or None
    say(
        f"{kind} run {run_dir}: drills {', '.join(args.only or DRILLS)}"
        f"{'' if args.no_restore else ', then a restore of every kept checkpoint'}"
    )
    start = time.monotonic()
    try:
        data = run_drills(
            run_dir,
            spec,
            kind,
            args.only or DRILLS,
            address=address,
            num_cpus=args.num_cpus,
            restore=not args.no_restore,
            timeout_s=args.timeout,
        )
    except DrillError as exc:
        fail(str(exc), "rayrl drill")
        return EXIT_USAGE
    except ConnectionError as exc:
        fail(f"--address: cannot reach the Ray cluster at {address} ({exc}).", "rayrl drill")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("\nrayrl drill: interrupted; drill.json was not updated.\n")
        return 130
    if source:
        publish(source, run_dir, ["drill.json"])
    drills, rate = data["drills"], data.get("restore_rate")
    ok = all(d["outcome"] == "recovered" for d in drills) and rate in (None, 1.0)
    summary = ", ".join(
        f"{d['name']} {d['outcome']}" + (f" in {d['recovery_s']:.1f}s" if d.get("recovery_s") is not None else "")
        for d in drills
    )
    restored = "no checkpoint to restore" if rate is None else f"restore rate {rate:.0%} of {len(data['restores'])}"
    print(
        f"rayrl drill: {summary}; {restored}; {time.monotonic() - start:.0f}s; wrote {run_dir / 'drill.json'}",
        flush=True,
    )
    return 0 if ok else 1
