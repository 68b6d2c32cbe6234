"""The search's first trials, pure: a Latin hypercube over log lr x batch.

Optuna's TPE draws its first ``n_startup_trials`` (10 by default) at random, so a search of 8 trials
was random search: one tuners-benchmark repetition drew 6 of 8 lrs below 7e-5 and shipped a worse
answer than the one before it. A Latin hypercube puts one lr in each 1/n of the log range and spreads
the batches evenly, so the half of the budget spent before TPE has anything to model covers the
space the same way on every seed; TPE then spends the rest near what worked.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

LR_PARAM, BATCH_PARAM = "rayrl_lr", "rayrl_batch"  # Optuna's names for the two axes (rayrl.sweep.search)


def startup_count(num_samples: int) -> int:
    """How many of ``num_samples`` trials the hypercube places: half, at least 4 (fewer only when the
    search has fewer trials), so TPE models at least half of the budget in a larger search."""
    return min(num_samples, max(4, num_samples // 2))


def latin_hypercube(n: int, lr_min: float, lr_max: float, batches: Sequence[int], seed: int) -> list[dict]:
    """``n`` points {LR_PARAM: lr, BATCH_PARAM: batch}: each 1/n of [log lr_min, log lr_max) holds one
    lr; the batches are spread as evenly as ``n`` allows (each used floor or ceil of n/len times, or
    one from each 1/n of the list when there are more batches than points), the pairing shuffled.
    Seeded, so a resumed or repeated sweep of one seed asks for the same points."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 0 < lr_min < lr_max:
        raise ValueError(f"the lr range must satisfy 0 < lr_min < lr_max, got {lr_min}..{lr_max}")
    if not batches:
        raise ValueError("no batches to place")
    rng = random.Random(seed)
    lo, span = math.log(lr_min), math.log(lr_max) - math.log(lr_min)
    strata = list(range(n))
    rng.shuffle(strata)
    lrs = [min(lr_max, math.exp(lo + span * (s + rng.random()) / n)) for s in strata]  # rounding
    k = len(batches)
    if n >= k:  # cell i of n split evenly over k batches: every batch used floor or ceil of n/k times
        cells = [batches[(i * k) // n] for i in range(n)]
    else:  # one batch from each 1/n of the ladder: small, middle and large all tried
        cells = [batches[int((i + rng.random()) * k / n)] for i in range(n)]
    rng.shuffle(cells)
    return [{LR_PARAM: lr, BATCH_PARAM: b} for lr, b in zip(lrs, cells, strict=True)]
