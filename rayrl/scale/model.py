"""The scaling model: from one measured run to the throughput, cost and time to target at N GPUs.

Pure functions of plain numbers (docs/scale.md derives each term). Weak scaling: every learner
keeps the measured per-learner batch, so the global batch is N x that batch.

* All-reduce (per optimizer step, gradient of ``grad_bytes``): ring
  ``2(N-1)/N * bytes / busbw + 2(N-1) * latency``; tree (NCCL's double binary tree, pipelined)
  ``2 * bytes / busbw + 2 ceil(log2 N) * latency``; NCCL picks the faster, and so do we. Inside
  one node the intra-node figures apply, across nodes the inter-node ones (the slowest link).
* Learner time per iteration: the measured compute time for one learner's batch plus one
  all-reduce per optimizer step (no overlap with backward assumed: conservative).
* Env runners: as many as keep the N learners fed (samples per iteration in at most the
  learner time). Synchronous PPO samples, then learns (times add); asynchronous APPO/IMPALA
  overlap them (the slower side sets the pace).
* Env steps to target as the global batch B grows (McCandlish et al. 2018, "An Empirical Model
  of Large-Batch Training"): ``E(B) = E_min (1 + B / B_crit)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rayrl.observe import cost
from rayrl.scale.cluster import ClusterSpec
from rayrl.spec import CostSpec

ASYNC_ALGOS = ("APPO", "IMPALA")


@dataclass(frozen=True)
class Measured:
    """What one run measured (see rayrl.scale.measure), in plain numbers."""

    algo: str
    batch_per_learner: int  #: env steps per learner per iteration
    minibatch: int
    epochs: int
    learners: int  #: learners in the measured run (0: the trial's process, counts as 1)
    env_runners: int  #: env runners in the measured run (0: the trial's process, counts as 1)
    sample_s: float  #: seconds per iteration sampling (RLlib's env_runner_sampling_timer)
    learn_s: float  #: seconds per iteration in the learner update (learner_update_timer)
    grad_bytes: float  #: bytes all-reduced per optimizer step (parameters x 4 in fp32)
    cpus_per_env_runner: float = 1.0
    cpus_per_learner: float = 1.0
    env_steps_to_target: float | None = None  #: at the measured global batch; None: target not reached
    critical_batch: float = 16384.0

    @property
    def global_batch(self) -> int:
        return self.batch_per_learner * max(self.learners, 1)

    @property
    def runner_steps_per_s(self) -> float:
        """Env steps per second one env runner samples (runners sample in parallel)."""
        return self.global_batch / (self.sample_s * max(self.env_runners, 1))

    @property
    def learner_samples_per_s(self) -> float:
        """Env steps of batch one learner gets through per second of update (epochs included in the time)."""
        return self.batch_per_learner / self.learn_s

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps (so all-reduces) per iteration: epochs x minibatches."""
        return self.epochs * math.ceil(self.batch_per_learner / self.minibatch)


@dataclass(frozen=True)
class Point:
    """The model's figures at one size."""

    gpus: int
    nodes: int
    gpu_nodes: int
    cpu_nodes: int
    env_runners: int
    global_batch: int
    allreduce_s: float  #: one all-reduce of the gradient
    allreduce_algo: str  #: ring, tree or none
    learner_s: float  #: per iteration, compute + all-reduces
    sample_s: float  #: per iteration
    env_steps_per_s: float
    efficiency: float  #: throughput / (N x throughput at 1)
    usd_per_hour: float
    usd_per_million_samples: float
    env_steps_to_target: float | None
    hours_to_target: float | None
    usd_to_target: float | None


def ring_allreduce_s(nbytes: float, n: int, busbw_gbs: float, latency_us: float) -> float:
    """Ring all-reduce: 2(n-1) steps, each moving nbytes/n: bandwidth and latency terms."""
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n * nbytes / (busbw_gbs * 1e9) + 2.0 * (n - 1) * latency_us * 1e-6


def tree_allreduce_s(nbytes: float, n: int, busbw_gbs: float, latency_us: float) -> float:
    """Pipelined (double binary) tree all-reduce: reduce up and broadcast down, log2(n) deep each."""
    if n <= 1:
        return 0.0
    return 2.0 * nbytes / (busbw_gbs * 1e9) + 2.0 * math.ceil(math.log2(n)) * latency_us * 1e-6


def allreduce_s(nbytes: float, n: int, cluster: ClusterSpec) -> tuple[float, str]:
    """The faster of ring and tree at n ranks on ``cluster`` (intra-node links if n fits one node)."""
    if n <= 1:
        return 0.0, "none"
    if n <= cluster.gpus_per_node:
        bw, lat = cluster.intra_node_busbw_gbs, cluster.intra_node_latency_us
    else:
        bw, lat = cluster.inter_node_busbw_gbs, cluster.inter_node_latency_us
    ring, tree = ring_allreduce_s(nbytes, n, bw, lat), tree_allreduce_s(nbytes, n, bw, lat)
    return (ring, "ring") if ring <= tree else (tree, "tree")


def env_steps_to_target(global_batch: float, e_min: float, critical_batch: float) -> float:
    """McCandlish et al. 2018: env steps to reach the target at ``global_batch``."""
    return e_min * (1.0 + global_batch / critical_batch)


def min_env_steps(measured_steps: float, measured_batch: float, critical_batch: float) -> float:
    """E_min from one measured (batch, env steps to target) point."""
    return measured_steps / (1.0 + measured_batch / critical_batch)


def fit_critical_batch(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(E_min, B_crit) by least squares of E = E_min + (E_min / B_crit) B over (batch, env steps) points.

    None when fewer than two distinct batches, or the fit says larger batches need fewer steps
    (slope <= 0: the points are noise, not a critical batch).
    """
    if len({b for b, _ in points}) < 2:
        return None
    n = len(points)
    mb, me = sum(b for b, _ in points) / n, sum(e for _, e in points) / n
    slope = sum((b - mb) * (e - me) for b, e in points) / sum((b - mb) ** 2 for b, _ in points)
    e_min = me - slope * mb
    if slope <= 0 or e_min <= 0:
        return None
    return e_min, e_min / slope


def predict(m: Measured, cluster: ClusterSpec, prices: CostSpec, n: int, env_runners: int | None = None) -> Point:
    """The model at ``n`` learners (one GPU each); ``env_runners`` None: as many as keep them fed."""
    batch = m.batch_per_learner * n
    ar, algo = allreduce_s(m.grad_bytes, n, cluster)
    learner_s = m.learn_s + m.optimizer_steps * ar
    rate = m.runner_steps_per_s
    runners = env_runners if env_runners is not None else max(1, math.ceil(batch / (learner_s * rate)))
    sample_s = batch / (runners * rate)
    if m.algo in ASYNC_ALGOS:
        steps_per_s = batch / max(sample_s, learner_s)
    else:
        steps_per_s = batch / (sample_s + learner_s)
    gpu_nodes = math.ceil(n / cluster.gpus_per_node)
    cpus = 1.0 + runners * m.cpus_per_env_runner + n * m.cpus_per_learner  # + the driver (trial) process
    extra_cpus = max(0.0, cpus - gpu_nodes * cluster.cpus_per_node)
    cpu_nodes = math.ceil(extra_cpus / cluster.cpus_per_cpu_node)
    # GPU nodes are billed per accelerator (their CPUs included), CPU-only nodes per CPU.
    held = cost.TrialResources(gpus=gpu_nodes * cluster.gpus_per_node, cpus=cpu_nodes * cluster.cpus_per_cpu_node)
    usd_h = cost.hourly_rate(held, prices)
    usd_m = cost.per_million(cost.cost_per_sample_at(held, steps_per_s, prices))
    one = steps_per_s if n == 1 else predict(m, cluster, prices, 1).env_steps_per_s
    steps = hours = usd = None
    if m.env_steps_to_target is not None:
        e_min = min_env_steps(m.env_steps_to_target, m.global_batch, m.critical_batch)
        steps = env_steps_to_target(batch, e_min, m.critical_batch)
        hours = steps / steps_per_s / cost.SECONDS_PER_HOUR
        usd = usd_h * hours
    return Point(
        gpus=n,
        nodes=gpu_nodes + cpu_nodes,
        gpu_nodes=gpu_nodes,
        cpu_nodes=cpu_nodes,
        env_runners=runners,
        global_batch=batch,
        allreduce_s=ar,
        allreduce_algo=algo,
        learner_s=learner_s,
        sample_s=sample_s,
        env_steps_per_s=steps_per_s,
        efficiency=steps_per_s / (n * one),
        usd_per_hour=usd_h,
        usd_per_million_samples=usd_m,
        env_steps_to_target=steps,
        hours_to_target=hours,
        usd_to_target=usd,
    )


def prices_for(cluster: ClusterSpec, run_prices: CostSpec) -> CostSpec:
    """The run's prices, with whatever the cluster description sets instead."""
    return CostSpec(
        gpu_hour_usd=run_prices.gpu_hour_usd if cluster.gpu_hour_usd is None else cluster.gpu_hour_usd,
        cpu_hour_usd=run_prices.cpu_hour_usd if cluster.cpu_hour_usd is None else cluster.cpu_hour_usd,
        spot_discount=run_prices.spot_discount if cluster.spot_discount is None else cluster.spot_discount,
    )


def sizes(up_to: int) -> list[int]:
    """1, 2, 4, ... up to ``up_to`` (itself included when it is not a power of two)."""
    out, n = [], 1
    while n < up_to:
        out.append(n)
        n *= 2
    return out + [up_to]
