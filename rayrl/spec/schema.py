"""The spec's schema: every section a frozen dataclass, every field documented where it is declared.

The ``doc`` metadata is what ``rayrl spec`` prints (:func:`field_table`) and what README's spec
section is checked against, field by field (tests/test_readme.py).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import yaml

from rayrl.errors import SpecError

ALGORITHMS = ("PPO", "APPO", "IMPALA")
LR_SCALING = ("none", "linear", "sqrt")
PRECISIONS = ("fp32", "bf16", "fp16")
SCHEDULERS = ("asha", "hyperband")
ACTIVATIONS = ("tanh", "relu", "silu", "elu", "linear")
JUDGES = ("evaluation", "training")
MOVED = {"algo.hidden": "model.hidden"}  #: fields that moved, so an old spec's error names the new place
RUNNERS = ("auto", "fast", "rllib")
ENV_BACKENDS = ("gymnasium", "envpool")
OBJECTIVES = ("usd", "wall_s", "env_steps")
WANDB_MODES = ("online", "offline")
INITS = ("default", "orthogonal")


def doc(default: Any, text: str, **kw: Any) -> Any:
    """A dataclass field with its documentation attached (read by `rayrl spec` and the docs)."""
    if isinstance(default, (list, dict)):

        def copy(d: Any = default) -> Any:  # each instance its own list or dict
            return type(d)(d)

        return field(default_factory=copy, metadata={"doc": text, **kw})
    return field(default=default, metadata={"doc": text, **kw})


@dataclass(frozen=True)
class EnvSpec:
    id: str = doc(
        "CartPole-v1",
        "gymnasium id (e.g. CartPole-v1, ALE/Pong-v5) or a factory "
        "'package.module:function' that takes env_config and returns a gymnasium.Env",
    )
    config: dict = doc({}, "keyword arguments for the env (gymnasium.make kwargs, or the factory's env_config)")
    envs_per_runner: int = doc(8, "vectorised envs stepped by each env runner", min=1)
    runner: str = doc(
        "auto",
        "env runner: rllib (RLlib's SingleAgentEnvRunner), fast (rayrl.sampling's tight loop for "
        "stateless policies, the same episodes as RLlib's runner; it falls back to RLlib's loop, logged "
        "once, for recurrent modules, custom connectors, episode callbacks; docs/sampling.md) or auto "
        "(fast for PPO, rllib for APPO and IMPALA, whose asynchronous sampling it has not been shown on)",
        choices=RUNNERS,
    )
    backend: str = doc(
        "gymnasium",
        "vectorised env of the fast runner: gymnasium (its numpy-vectorised version "
        "when it has one) or envpool (needs the envpool package and an EnvPool id)",
        choices=ENV_BACKENDS,
    )


@dataclass(frozen=True)
class AlgoSpec:
    name: str = doc("PPO", "RLlib algorithm on the new API stack: PPO, APPO or IMPALA", choices=ALGORITHMS)
    lr: float = doc(
        3e-4, "learning rate for one learner (scaled by resources.lr_scaling when learners > 1)", gt=0.0, le=1.0
    )
    train_batch_per_learner: int = doc(
        2048, "env steps per training batch per learner (global batch = this x max(learners, 1))", min=1
    )
    minibatch_size: int = doc(256, "SGD minibatch size, env steps; at most train_batch_per_learner", min=1)
    epochs: int = doc(6, "passes over each training batch", min=1)
    gamma: float = doc(0.99, "discount factor", ge=0.0, le=1.0)
    gae_lambda: float = doc(0.95, "GAE lambda (PPO only; APPO and IMPALA use v-trace)", ge=0.0, le=1.0)
    entropy_coeff: float = doc(0.0, "entropy bonus coefficient", ge=0.0)
    vf_loss_coeff: float = doc(0.01, "value-function loss coefficient", ge=0.0)
    grad_clip: float = doc(1.0, "clip gradients to this global L2 norm; 0 turns clipping off", ge=0.0)
    clip: float | None = doc(
        None,
        "PPO and APPO: the policy ratio's clip range (RLlib's clip_param); null: RLlib's (PPO 0.3, APPO 0.4)",
        gt=0.0,
    )
    kl_coeff: float | None = doc(
        None,
        "PPO: the KL penalty's starting coefficient (RLlib adapts it toward a KL of 0.01 every update); "
        "0 turns the penalty off, as SB3 and CleanRL have none; null: RLlib's (on, 0.2)",
        ge=0.0,
    )
    vf_clip: float | None = doc(
        10.0, "PPO: clip each step's value loss at this (RLlib's vf_clip_param); null: no clipping", gt=0.0
    )
    lr_final: float | None = doc(
        None,
        "null: lr stays constant; a number: lr anneals linearly to this over stop.env_steps "
        "(RLlib's lr schedule; scaled by resources.lr_scaling as lr is)",
        ge=0.0,
    )
    clip_final: float | None = doc(
        None,
        "PPO: null keeps the clip constant; a number anneals it linearly from clip to this over stop.env_steps",
        gt=0.0,
    )
    entropy_final: float | None = doc(
        None,
        "null: entropy_coeff stays constant; a number anneals it linearly to this over stop.env_steps",
        ge=0.0,
    )
    normalize_reward: bool = doc(
        False,
        "PPO: divide rewards by the running std of the discounted return (gamma) before GAE, as SB3's "
        "VecNormalize and CleanRL's NormalizeReward do; reported returns stay the env's raw ones",
    )
    reward_clip: float = doc(10.0, "with normalize_reward: clip the scaled rewards to +-this; 0: no clipping", ge=0.0)
    adam_eps: float = doc(1e-8, "Adam's epsilon (torch's default; CleanRL and SB3's PPO use 1e-5)", gt=0.0)
    report_env_steps: int = doc(
        0,
        "PPO: one reported iteration (a Tune result: RLlib's metrics reduction and result, rayrl's callback, "
        "the checkpoint and stop checks) runs updates until it has sampled at least this many env steps, so "
        "a batch below it shares that work across several updates; 0 (the default): one update per report",
        min=0,
    )
    sample_ahead: bool = doc(
        False,
        "PPO with remote env runners (resources.env_runners >= 1): the runners sample the next batch while "
        "the learner trains on this one, so sampling and SGD use two cores at once; each batch is then "
        "trained one update after the weights that sampled it (PPO's ratio and clip take the sampling "
        "policy's log-probabilities, as for any batch); false: sample, then learn",
    )


@dataclass(frozen=True)
class ModelSpec:
    hidden: list = doc([64, 64], "hidden layer sizes of the policy/value MLP (after the CNN/LSTM, if any)", item=int)
    activation: str = doc("tanh", "MLP activation", choices=ACTIVATIONS)
    conv_filters: list | None = doc(
        None,
        "CNN for image observations: [[out_channels, [kernel_h, kernel_w], "
        "stride, padding (optional: same or valid; default same)], ...]; null: "
        "RLlib's default for the image size; ALE ids: [[16, [8, 8], 4], [32, [4, 4], "
        "2], [256, [11, 11], 1, valid]]",
    )
    conv_activation: str = doc("relu", "CNN activation", choices=ACTIVATIONS)
    lstm: bool = doc(False, "put an LSTM after the encoder (memory for partially observed envs)")
    lstm_cell_size: int = doc(256, "LSTM cell size", min=1)
    max_seq_len: int = doc(20, "LSTM: steps per training sequence (backprop through time)", min=1)
    vf_share_layers: bool = doc(False, "policy and value function share the encoder (true is usual for CNNs)")
    normalize_obs: bool = doc(
        False,
        "normalise observations by a running mean and std (RLlib's MeanStdFilter "
        "connector; its state is checkpointed and synced to the env runners)",
    )
    free_log_std: bool = doc(
        False, "continuous actions: the Gaussian's log std is a learned parameter, not an output of the network"
    )
    log_std_init: float | None = doc(
        None,
        "PPO, continuous actions: the Gaussian's initial log std (free_log_std: the parameter; else the bias "
        "of the log-std outputs); null: RLlib's (0 for a free log std); RL Zoo's MuJoCo PPO uses -2",
    )
    obs_clip: float = doc(
        10.0,
        "with normalize_obs: clip normalised observations to +-this (MeanStdFilter's clip_by_value); 0: no clipping",
        ge=0.0,
    )
    init: str = doc(
        "default",
        "PPO: weight initialisation: default (RLlib's) or orthogonal (CleanRL's and SB3's: gain sqrt(2) "
        "on hidden layers, 0.01 on the policy's output, 1 on the value's; zero biases)",
        choices=INITS,
    )


@dataclass(frozen=True)
class EvaluationSpec:
    interval: int = doc(0, "evaluate every N training iterations; 0 turns evaluation off", min=0)
    episodes: int = doc(10, "episodes per evaluation", min=1)
    deterministic: bool = doc(True, "evaluate the greedy policy (exploration off)")
    env_runners: int = doc(0, "EnvRunner actors of its own for evaluation; 0 evaluates in the trial's process", min=0)
    judge: str = doc(
        "evaluation",
        "when evaluation is on, the return that ranks search trials (scheduler, "
        "searcher, best trial, best_config.yaml), stops a run (stop.episode_return) and the report's "
        "reward part judges: evaluation or training",
        choices=JUDGES,
    )


@dataclass(frozen=True)
class ResourcesSpec:
    env_runners: int = doc(1, "remote EnvRunner actors; 0 samples in the trial's own process", min=0)
    learners: int = doc(
        0,
        "remote Learner actors on Ray Train's Torch backend; 0 learns in the trial's "
        "process, >= 2 runs DDP (NCCL on GPUs, gloo on CPUs)",
        min=0,
    )
    gpus_per_learner: float = doc(0.0, "GPUs per learner (with learners: 0, a GPU for the local learner)", ge=0.0)
    cpus_per_learner: float = doc(1.0, "CPUs per learner", gt=0.0)
    cpus_per_env_runner: float = doc(1.0, "CPUs per env runner", gt=0.0)
    custom_per_learner: dict = doc(
        {},
        "custom Ray resources each learner needs, e.g. {accelerator_type:H100: 0.001} to pin learners to a node type",
    )
    lr_scaling: str = doc(
        "none",
        "how lr grows with learners > 1: none, linear (lr x n) or sqrt "
        "(lr x sqrt(n)); always applied explicitly and recorded",
        choices=LR_SCALING,
    )


@dataclass(frozen=True)
class PrecisionSpec:
    mode: str = doc(
        "fp32", "learner precision: fp32, bf16 (autocast) or fp16 (autocast + dynamic loss scaling)", choices=PRECISIONS
    )
    accumulation_steps: int = doc(
        1,
        "minibatches whose gradients are summed before one optimizer step "
        "(effective minibatch = minibatch_size x this)",
        min=1,
    )
    max_nonfinite_steps: int = doc(
        10,
        "consecutive non-finite (NaN/Inf) steps, each skipped, after which "
        "the trial fails so Tune restores the last checkpoint",
        min=1,
    )


@dataclass(frozen=True)
class StopSpec:
    env_steps: int | None = doc(300_000, "stop after this many env steps sampled (lifetime)", min=1)
    episode_return: float | None = doc(450.0, "stop once the mean episode return reaches this")
    wall_s: float | None = doc(None, "stop after this many seconds of training", gt=0.0)


@dataclass(frozen=True)
class CheckpointSpec:
    every: int = doc(5, "checkpoint every N training iterations (and at the end)", min=1)
    keep: int = doc(3, "checkpoints kept (the newest)", min=1)
    max_failures: int = doc(
        10,
        "trial failures (preemptions, crashes) allowed within failure_window_s; each "
        "retries from the newest intact checkpoint; one more ends the run, resumably; "
        "-1 retries forever (sweep trials: retries over a trial's life)",
        min=-1,
    )
    failure_window_s: float = doc(
        3600.0,
        "the sliding window max_failures counts in, seconds (a budget by rate, "
        "not over the run's life: a spot run survives a preemption an hour for days, "
        "a crash loop ends in minutes)",
        gt=0.0,
    )
    tiered: bool = doc(
        True,
        "write each checkpoint to local_dir first and upload it to the storage in the "
        "background (training does not wait on the upload); false uploads before training goes on",
    )
    local_dir: str = doc(
        "$RAYRL_HOME/checkpoints",
        "tier-1 folder for checkpoints on each trial's node (a local SSD; $RAYRL_HOME, default "
        "~/.rayrl, is expanded on that node); restore prefers an intact copy here over downloading from storage",
    )
    preempt_grace_s: float = doc(
        25.0,
        "after a SIGTERM (spot reclaim, Kubernetes), the checkpoint of the "
        "iteration in progress must be written within this; then the process exits "
        "(AWS spot gives 120 s, GCP preemptible 30 s, Kubernetes "
        "terminationGracePeriodSeconds, default 30 s)",
        gt=0.0,
    )
    hung_runner_s: float = doc(
        300.0,
        "restart an EnvRunner that has not answered for this long while the run "
        "waits on it (a hung env step); 0 turns the watchdog off",
        ge=0.0,
    )


@dataclass(frozen=True)
class DoublingSpec:
    start: int = doc(2048, "first rung: train batch per learner, env steps", min=1)
    factor: int = doc(2, "each rung multiplies the batch by this", min=2)
    cap: int = doc(16384, "largest rung; above 16384 sample efficiency falls (a larger cap warns)", min=1)
    min_gain: float = doc(0.15, "keep doubling while a doubling raises env steps/s by at least this fraction", ge=0.0)
    warmup_iters: int = doc(1, "iterations of a rung not measured (start-up, JIT, caches)", min=0)
    measure_iters: int = doc(3, "measured iterations per rung; the rung's figure is their median", min=1)


@dataclass(frozen=True)
class SearchSpec:
    doubling: DoublingSpec = doc(DoublingSpec(), "the ladder: the throughput ladder")
    scheduler: str = doc("asha", "the search's trial scheduler: asha or hyperband", choices=SCHEDULERS)
    num_samples: int = doc(8, "search trials (Optuna TPE proposals)", min=1)
    max_env_steps: int = doc(200_000, "the search's budget per trial, env steps (the scheduler's time unit)", min=1)
    grace_env_steps: int = doc(40_000, "ASHA: env steps before a trial may be stopped", min=1)
    reduction_factor: float = doc(3.0, "ASHA/HyperBand reduction factor", gt=1.0)
    lr_min: float = doc(1e-5, "the search's lr range, lower end (log-uniform)", gt=0.0)
    lr_max: float = doc(1e-3, "the search's lr range, upper end", gt=0.0)
    max_concurrent: int = doc(0, "search trials at once; 0 derives it from the cluster's CPUs and GPUs", min=0)
    min_batch: int = doc(
        256,
        "the search also tries batches below doubling.start, dividing by doubling.factor "
        "down to this (none if above the start): the ladder bounds the batch from above "
        "(throughput), sample efficiency decides below it",
        min=1,
    )
    confirm_top_k: int = doc(
        3,
        "confirmation: re-run the best k searched configs on fresh seeds; 0 skips "
        "it (best_config.yaml is then the search's single best run)",
        min=0,
    )
    confirm_seeds: int = doc(
        5,
        "confirmation: fresh seeds per config (never used in the ladder or the search); with 3, one lucky "
        "run moves a median (docs/benchmarks.md)",
        min=1,
    )
    confirm_baseline: bool = doc(
        True,
        "confirmation: the spec's own batch and lr run too (candidate 'spec' "
        "when not already among the top k), so the sweep ships a change only when "
        "it beats its starting point on the same fresh seeds",
    )
    confirm_race: bool = doc(
        True,
        "confirmation: stop a run once its config can no longer win (its cost "
        "passed the lowest score known so far) and start no more runs of it: the same "
        "choice, the losers cost less (confirm.csv's stopped: race)",
    )
    confirm_quantile: float = doc(
        0.75,
        "confirmation: a config's score is the cost within which this fraction of its seeds reached "
        "stop.episode_return (its ceil(q x n)-th cheapest run: the 4th of 5 at 0.75; 0.5: the median for "
        "an odd count); the lowest score ships, so a config that misses on more than a quarter of its "
        "seeds cannot win on its lucky ones",
        gt=0.0,
        le=1.0,
    )
    confirm_tie: float = doc(
        0.0,
        "confirmation: a searched config ships instead of the spec's own only when its score is "
        "more than this fraction lower; within it they tie and the simpler one (the starting point) "
        "ships; 0 (default): the lowest score wins",
        ge=0.0,
    )
    confirm_env_steps: int | None = doc(
        None,
        "confirmation: budget per run, env steps (a run stops at "
        "stop.episode_return); null: search.max_env_steps, the search's budget, so "
        "shrinking the search shrinks its confirmation too",
        min=1,
    )
    objective: str = doc(
        "usd",
        "confirmation: the config with the lowest cost to stop.episode_return (on "
        "search.confirm_quantile of its seeds) wins; cost in usd (the cost section's prices), wall_s or env_steps",
        choices=OBJECTIVES,
    )
    space: dict = doc(
        {},
        "more fields for the search to vary beside batch and lr: dotted algo.* or model.* names "
        "mapped to {low: L, high: H} (log: true for log-uniform; integers for an integer field) or "
        "{choices: [...]}, e.g. {algo.gamma: {low: 0.95, high: 0.999}, algo.epochs: {choices: [4, 10, 20]}}; "
        "trials.csv and confirm.csv gain a column per field, best_config.yaml takes the winner's values",
    )


@dataclass(frozen=True)
class CostSpec:
    gpu_hour_usd: float = doc(3.0, "price of one GPU-hour, USD", ge=0.0)
    cpu_hour_usd: float = doc(0.05, "price of one CPU-hour, USD", ge=0.0)
    spot_discount: float = doc(0.0, "fraction taken off on spot/preemptible capacity", ge=0.0, lt=1.0)


@dataclass(frozen=True)
class AcceptanceSpec:
    gpu_util_min: float = doc(0.90, "hardware: mean GPU utilisation after warm-up, at least (fraction)", ge=0.0, le=1.0)
    mem_util_max: float = doc(0.95, "hardware: peak memory (GPU, else host), below (fraction)", ge=0.0, le=1.0)
    net_util_max: float = doc(0.80, "hardware: peak NIC throughput / link speed, below (fraction)", ge=0.0, le=1.0)
    env_steps_per_s: float | None = doc(
        None, "training: expected env steps/s; null: the ladder's rung at the judged batch", gt=0.0
    )
    env_steps_per_s_tolerance: float = doc(
        0.10, "training: measured may fall this fraction short of expected", ge=0.0, lt=1.0
    )
    loss_spike_k: float = doc(6.0, "training: a loss spike is a rise > median + k scaled MADs of the changes", gt=0.0)
    episode_return: float | None = doc(None, "reward: target return; null: stop.episode_return")
    return_cv_max: float = doc(0.10, "reward: coefficient of variation of the return, below", gt=0.0)
    return_cv_window: int = doc(10, "reward: ... over the last this many iterations", min=2)
    cost_reduction_min: float = doc(
        0.10, "cost: cost per effective sample at least this far below the baseline", ge=0.0, lt=1.0
    )
    recovery_s_max: float = doc(300.0, "fault tolerance: every drill recovers in under this many seconds", gt=0.0)
    restore_rate_min: float = doc(
        1.0, "fault tolerance: fraction of checkpoint restores that must succeed", ge=0.0, le=1.0
    )
    warmup_iters: int = doc(1, "first iterations of a trial not judged (start-up)", min=0)


@dataclass(frozen=True)
class MlflowSpec:
    enabled: bool = doc(
        False,
        "log every trial to MLflow: one MLflow run per trial, params = the trial's spec "
        "values, metrics = rayrl's result keys (needs the tracking extra)",
    )
    tracking_uri: str | None = doc(
        None,
        "MLflow tracking URI (file:/abs/path, http://host:5000); null: "
        "MLFLOW_TRACKING_URI or MLflow's default; credentials only from "
        "MLFLOW_TRACKING_USERNAME/_PASSWORD/_TOKEN, never in the URI",
    )
    experiment: str | None = doc(None, "MLflow experiment name; null: the run name")


@dataclass(frozen=True)
class WandbSpec:
    enabled: bool = doc(
        False,
        "log every trial to Weights & Biases, one W&B run per trial (needs the tracking "
        "extra; the API key only from WANDB_API_KEY or `wandb login`)",
    )
    project: str | None = doc(None, "W&B project; null: WANDB_PROJECT, else the run name")
    group: str | None = doc(None, "W&B group; null: the run name and phase (e.g. cartpole-ppo/phase2)")
    mode: str = doc(
        "online",
        "online, or offline (writes the W&B run folder beside the trial, no network; `wandb sync` uploads it later)",
        choices=WANDB_MODES,
    )


@dataclass(frozen=True)
class TrackingSpec:
    tensorboard: bool = doc(
        True,
        "TensorBoard event files in every trial folder (Tune's TBX logger; rayrl's "
        "metrics also under rayrl/, by env steps)",
    )
    mlflow: MlflowSpec = doc(MlflowSpec(), "MLflow (Tune's MLflowLoggerCallback)")
    wandb: WandbSpec = doc(WandbSpec(), "Weights & Biases (Tune's WandbLoggerCallback)")


@dataclass(frozen=True)
class PopulationSpec:
    size: int = doc(
        0,
        "`rayrl train` trains this many trials together with Population Based Training (Tune's "
        "PopulationBasedTraining); 0: one trial",
        min=0,
    )
    perturbation_env_steps: int = doc(
        50_000,
        "PBT: every this many env steps a trial in the bottom quantile "
        "copies a top trial's checkpoint (exploit) and perturbs lr and "
        "entropy_coeff (explore)",
        min=1,
    )
    entropy_min: float = doc(0.0, "PBT: entropy_coeff range, lower end (lr: search.lr_min..search.lr_max)", ge=0.0)
    entropy_max: float = doc(0.02, "PBT: entropy_coeff range, upper end", ge=0.0)
    quantile_fraction: float = doc(0.25, "PBT: fraction of trials that exploit / are exploited", gt=0.0, le=0.5)
    synchronous: bool = doc(
        False,
        "PBT: rank all members together once each has reached the interval (Tune's synch), so every "
        "interval exploits; it pauses (and restarts) every member at every interval. Off: a member is "
        "ranked when it arrives, against the others' last ranked scores, which may be an interval older",
    )


@dataclass(frozen=True)
class Spec:
    name: str = doc("rayrl", "experiment name: the run folder under the storage path")
    seed: int = doc(0, "seed for torch, the envs and the searchers", min=0)
    env: EnvSpec = doc(EnvSpec(), "the environment")
    algo: AlgoSpec = doc(AlgoSpec(), "the algorithm and its hyperparameters")
    model: ModelSpec = doc(ModelSpec(), "the policy/value network (RLlib's DefaultModelConfig)")
    evaluation: EvaluationSpec = doc(EvaluationSpec(), "periodic evaluation episodes, apart from training")
    resources: ResourcesSpec = doc(ResourcesSpec(), "actors and devices of one trial")
    precision: PrecisionSpec = doc(PrecisionSpec(), "learner numerics")
    stop: StopSpec = doc(StopSpec(), "when a training run ends (whichever comes first)")
    checkpoint: CheckpointSpec = doc(CheckpointSpec(), "checkpoints and retries")
    search: SearchSpec = doc(SearchSpec(), "the sweep: doubling rule then ASHA/HyperBand + Optuna")
    cost: CostSpec = doc(CostSpec(), "prices for cost per effective sample")
    acceptance: AcceptanceSpec = doc(AcceptanceSpec(), "thresholds of the five-part acceptance report")
    tracking: TrackingSpec = doc(TrackingSpec(), "experiment tracking: TensorBoard, MLflow, W&B")
    population: PopulationSpec = doc(PopulationSpec(), "Population Based Training for `rayrl train`")

    @property
    def global_batch(self) -> int:
        """Env steps per update across all learners."""
        return self.algo.train_batch_per_learner * max(self.resources.learners, 1)

    @property
    def effective_lr(self) -> float:
        """lr after the declared scaling rule for the number of learners."""
        return scaled_lr(self.algo.lr, self.resources.learners, self.resources.lr_scaling)

    @property
    def env_runner(self) -> str:
        """The env runner trials use: env.runner, with auto resolved (fast for PPO, else rllib)."""
        if self.env.runner != "auto":
            return self.env.runner
        return "fast" if self.algo.name == "PPO" else "rllib"

    @property
    def judged_by(self) -> str:
        """The return runs are ranked and stopped by: "evaluation" (when on and chosen) or "training"."""
        return judged_by(self.evaluation)


def judged_by(evaluation: EvaluationSpec) -> str:
    """ "evaluation" when evaluation is on and judges, else "training" (the run folder's readers ask too)."""
    return "evaluation" if evaluation.interval > 0 and evaluation.judge == "evaluation" else "training"


def scaled_lr(lr: float, learners: int, rule: str) -> float:
    """Scale a one-learner lr to ``learners`` learners by ``rule`` (none | linear | sqrt)."""
    n = max(learners, 1)
    if rule == "linear":
        return lr * n
    if rule == "sqrt":
        return lr * math.sqrt(n)
    if rule == "none":
        return lr
    raise SpecError(f"resources.lr_scaling: {rule!r} is not a scaling rule; valid: {', '.join(LR_SCALING)}.")


def is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def field_table(cls: type = Spec, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted name, default, doc) for every leaf field: the source of `rayrl spec` and the README."""
    rows = []
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        if is_section(type(default)):
            rows.extend(field_table(type(default), name + "."))
        else:
            rows.append(
                (
                    name,
                    yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip(),
                    f.metadata.get("doc", ""),
                )
            )
    return rows
