"""The ladder (the ladder): the doubling rule as pure functions over measured rungs (no Ray here).

Start at ``start``, multiply by ``factor``; stop growing when a doubling gains less than
``min_gain`` in env steps/s, at ``cap``, or when a rung fails. The knee is the last rung whose
doubling paid off: the largest batch worth its cost in throughput.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from rayrl.runfolder import CAP, EXPAND, FAILED, STOP, LadderRow, knee


@dataclass(frozen=True)
class Rung:
    """One measured rung: ``env_steps_per_s`` is None when the rung failed (OOM, error)."""

    batch_size: int
    env_steps_per_s: float | None


def rung_throughput(per_iteration: Sequence[float], warmup: int, measure: int) -> float | None:
    """Median env steps/s of the ``measure`` iterations after ``warmup``; None if too few ran."""
    measured = [x for x in per_iteration[warmup : warmup + measure] if x is not None and math.isfinite(x)]
    if len(measured) < measure or measure < 1:
        return None
    return float(statistics.median(measured))


def decide(rungs: Sequence[Rung], *, factor: int, cap: int, min_gain: float) -> list[LadderRow]:
    """The decision after each rung; the ladder ends at the first non-``expand`` row."""
    rows: list[LadderRow] = []
    prev: float | None = None
    for rung in rungs:
        if rung.env_steps_per_s is None:
            rows.append(LadderRow(rung.batch_size, None, None, FAILED))
            break
        gain = None if prev is None else (rung.env_steps_per_s / prev - 1.0 if prev > 0 else math.inf)
        if gain is not None and gain < min_gain - 1e-9:  # a gain of exactly min_gain still pays
            decision = STOP
        elif rung.batch_size * factor > cap:
            decision = CAP
        else:
            decision = EXPAND
        rows.append(LadderRow(rung.batch_size, rung.env_steps_per_s, gain, decision))
        if decision != EXPAND:
            break
        prev = rung.env_steps_per_s
    return rows


def next_batch(rungs: Sequence[Rung], *, start: int, factor: int, cap: int, min_gain: float) -> int | None:
    """The batch of the next rung to measure, or None when the ladder is finished."""
    if not rungs:
        return start if start <= cap else None
    rows = decide(rungs, factor=factor, cap=cap, min_gain=min_gain)
    if len(rows) < len(rungs) or rows[-1].decision != EXPAND:
        return None
    return rows[-1].batch_size * factor


def admissible(rows: Sequence[LadderRow]) -> list[int]:
    """The batch sizes the search may try: measured rungs up to and including the knee."""
    k = knee(rows)
    return [r.batch_size for r in rows if k is not None and r.env_steps_per_s is not None and r.batch_size <= k]


def search_batches(ladder: Sequence[int], *, start: int, factor: int, min_batch: int) -> list[int]:
    """The search's batch sizes: below the ladder's start (``start`` / factor, / factor^2, ... down to
    ``min_batch``), then the admissible ladder. The ladder bounds the batch from above by throughput;
    below its start, sample efficiency alone decides (a small batch can reach a target in fewer env steps).
    """
    below = []
    batch = start // factor
    while ladder and batch >= max(min_batch, 1):
        below.append(batch)
        batch //= factor
    return sorted(below) + list(ladder)


def max_rungs(start: int, factor: int, cap: int) -> int:
    """How many rungs the ladder can have: start, start x factor, ... up to the cap."""
    return int(math.log(cap / start, factor) + 1e-9) + 1


def minibatch_for(batch: int, base_batch: int, base_minibatch: int) -> int:
    """The minibatch size a batch trains with, from the spec's batch and minibatch.

    At or above the spec's batch (the ladder's rungs) the number of minibatches per epoch stays
    constant, so every rung does the same SGD steps per iteration and is measured by what it
    amortises. Below it (the search's batches down to search.min_batch) the spec's minibatch stays,
    capped at the batch: shrinking it too would multiply the SGD steps per env step, and their
    fixed cost dominates small batches (docs/benchmarks.md has the CartPole measurement).
    """
    if batch < base_batch:
        return max(1, min(base_minibatch, batch))
    per_epoch = max(1, round(base_batch / base_minibatch))
    return max(1, batch // per_epoch)
