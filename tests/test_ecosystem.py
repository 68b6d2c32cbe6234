"""Tracking, export and play on a short real `rayrl train` (and a tiny sweep with MLflow on).

One trained run serves every test of the module: TensorBoard events, the MLflow file store, the
W&B offline run folder, ONNX / TorchScript exports compared with the RLlib module, and `rayrl play`.
"""

from __future__ import annotations

import csv
import json
import struct
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import ROOT, subprocess_env

pytestmark = pytest.mark.slow

CONFIG = ROOT / "experiments" / "configs" / "cartpole_ppo.yaml"
SMALL = [
    "--set",
    "algo.train_batch_per_learner=512",
    "--set",
    "algo.minibatch_size=128",
    "--set",
    "resources.env_runners=0",
    "--set",
    "env.envs_per_runner=4",
    "--set",
    "checkpoint.every=1",
]


@pytest.fixture(autouse=True)
def mlflow_file_store(monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses its file store without it


def rayrl_run(args: list[str], storage: Path, timeout: float = 420) -> subprocess.CompletedProcess:
    """A rayrl command on a local 2-CPU Ray with MLflow on (a file store under ``storage``)."""
    env = subprocess_env(MLFLOW_ALLOW_FILE_STORE="true", WANDB_SILENT="true")
    env.pop("WANDB_MODE", None)  # offline must come from the spec alone
    proc = subprocess.run(
        [
            sys.executable,
            *args,
            "--storage",
            str(storage),
            "--num-cpus",
            "2",
            "--config",
            str(CONFIG),
            *SMALL,
            "--set",
            "tracking.mlflow.enabled=true",
            "--set",
            f"tracking.mlflow.tracking_uri=file:{storage / 'mlruns'}",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """`rayrl train --population 2`, 4096 env steps per member (batch 512), synchronous PBT every
    1024 env steps; TensorBoard, MLflow and W&B (offline) on. One short real run serves every test
    below. (Asynchronous PBT ranks a member against the other's older score; with rising returns the
    arriving member tends to rank top, and a CI run once ended with no exploit at all.)"""
    storage = tmp_path_factory.mktemp("eco")
    rayrl_run(
        [
            "-m",
            "rayrl.cli",
            "train",
            "--name",
            "eco",
            "--population",
            "2",
            "--set",
            "stop.env_steps=4096",
            "--set",
            "population.perturbation_env_steps=1024",
            "--set",
            "population.entropy_max=0.01",
            "--set",
            "population.synchronous=true",  # every interval ranks both members: an exploit at each
            "--set",
            "tracking.wandb.enabled=true",
            "--set",
            "tracking.wandb.mode=offline",
        ],
        storage,
    )
    return storage / "eco"


def trial_ids(run: Path) -> dict[str, Path]:
    return {d.name.split("_", 1)[1]: d for d in (run / "tune").glob("PPO_*")}


def history(run: Path, trial_id: str) -> list[dict]:
    with (run / "history.csv").open() as f:
        return [r for r in csv.DictReader(f) if r["trial_id"] == trial_id]


def read_scalars(path: Path) -> dict[str, list[tuple[int, float]]]:
    """Scalars of a TensorBoard event file (TFRecord: length, crc, Event proto, crc)."""
    from tensorboardX.proto import event_pb2

    data, i, out = path.read_bytes(), 0, {}
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i : i + 8])
        event = event_pb2.Event.FromString(data[i + 12 : i + 12 + n])
        i += 12 + n + 4
        for value in event.summary.value:
            out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


def test_tensorboard_events_hold_rayrl_throughput_and_return(trained):
    for trial_id, trial_dir in trial_ids(trained).items():
        scalars: dict[str, list] = {}
        for events in sorted(trial_dir.glob("events.out.tfevents.*")):  # a PBT restart opens a new file
            for tag, points in read_scalars(events).items():
                scalars.setdefault(tag, []).extend(points)
        rows = history(trained, trial_id)
        assert len(rows) >= 2  # a member that copied another starts from its env steps
        for tag, column in (
            ("rayrl/env_steps_per_s", "env_steps_per_s"),
            ("rayrl/episode_return_mean", "episode_return_mean"),
        ):
            assert [s for s, _ in scalars[tag]] == [int(float(r["env_steps"])) for r in rows]  # by env steps
            assert [v for _, v in scalars[tag]] == pytest.approx([float(r[column]) for r in rows], rel=1e-5)
        assert all(v > 0 for _, v in scalars["rayrl/env_steps_per_s"])
        assert "ray/tune/env_runners/episode_return_mean" in scalars  # Tune's own tags are kept


def test_mlflow_holds_one_run_per_trial_with_spec_params_and_rayrl_metrics(trained):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"file:{trained.parent / 'mlruns'}")
    runs = client.search_runs([client.get_experiment_by_name("eco").experiment_id])
    by_trial = {r.data.tags["trial_id"]: r for r in runs}
    assert len(runs) == 2 and set(by_trial) == set(trial_ids(trained))
    first = {}  # each member's first draw: params.json, unless PBT replaced it (then population.csv says)
    for trial_id, trial_dir in trial_ids(trained).items():
        config = json.loads((trial_dir / "params.json").read_text())
        first[trial_id] = {"lr": config["lr"], "entropy_coeff": config["entropy_coeff"]}
    with (trained / "population.csv").open() as f:
        for step in reversed(list(csv.DictReader(f))):
            first[step["trial_id"]] = {"lr": float(step["lr_old"]), "entropy_coeff": float(step["entropy_coeff_old"])}
    for trial_id, run in by_trial.items():
        params = first[trial_id]
        assert run.data.tags["mlflow.runName"] == f"train_b512_lr{params['lr']:.1e}_{trial_id}"
        assert run.data.tags["rayrl.phase"] == "train" and run.info.status == "FINISHED"
        assert run.data.params["algo.train_batch_per_learner"] == "512"
        assert float(run.data.params["algo.lr"]) == pytest.approx(params["lr"])  # the member's own draw
        assert float(run.data.params["algo.entropy_coeff"]) == pytest.approx(params["entropy_coeff"])
        assert run.data.params["env.id"] == "CartPole-v1" and run.data.params["population.size"] == "2"
        rows = history(trained, trial_id)
        steps = client.get_metric_history(run.info.run_id, "rayrl/env_steps_per_s")
        assert [m.step for m in steps] == [int(float(r["env_steps"])) for r in rows]
        assert [m.value for m in steps] == pytest.approx([float(r["env_steps_per_s"]) for r in rows], rel=1e-5)
        assert run.data.metrics["rayrl/episode_return_mean"] == pytest.approx(float(rows[-1]["episode_return_mean"]))
        assert not any(k.startswith(("learners/", "config/")) for k in run.data.metrics)  # rayrl's keys only


def test_population_records_exploit_and_explore(trained):
    with (trained / "population.csv").open() as f:
        steps = list(csv.DictReader(f))
    # synchronous PBT: one exploit (the bottom of two) at each interval the run crosses before 4096
    assert [int(float(step["env_steps"])) // 1024 for step in steps] == [1, 2, 3]
    for step in steps:
        assert {step["trial_id"], step["cloned_from"]} == set(trial_ids(trained))  # bottom copied top
        assert 1e-5 <= float(step["lr_new"]) <= 1e-3 and 0.0 <= float(step["entropy_coeff_new"]) <= 0.01
        assert (float(step["lr_new"]), float(step["entropy_coeff_new"])) != (
            float(step["lr_cloned"]),
            float(step["entropy_coeff_cloned"]),
        )  # explored, not a plain copy
    summary = json.loads((trained / "summary.json").read_text())
    assert summary["population"]["size"] == 2 and summary["population"]["exploits"] == len(steps)
    assert summary["population"]["errored"] == 0  # every exploit found the checkpoint it copies
    assert summary["population"]["best_trial_id"] in trial_ids(trained)


def test_wandb_offline_writes_its_run_folders(trained):
    for trial_id, trial_dir in trial_ids(trained).items():
        (run_dir,) = trial_dir.glob("wandb/offline-run-*")
        (log,) = run_dir.glob(f"run-{trial_id}.wandb")
        assert log.stat().st_size > 1000  # the run's records, ready for `wandb sync`


def recorded_observations(module, n: int = 100) -> np.ndarray:
    """``n`` CartPole observations met by the module's own greedy play."""
    env, obs_list = gym.make("CartPole-v1"), []
    obs, _ = env.reset(seed=7)
    while len(obs_list) < n:
        obs_list.append(obs)
        with torch.no_grad():
            logits = module.forward_inference({"obs": torch.as_tensor(obs)[None]})["action_dist_inputs"]
        obs, _, terminated, truncated, _ = env.step(int(logits.argmax()))
        if terminated or truncated:
            obs, _ = env.reset()
    return np.asarray(obs_list, dtype=np.float32)


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_export_gives_the_modules_actions(trained, tmp_path, fmt):
    from rayrl.policy import export
    from rayrl.policy.checkpoints import find_checkpoint, load_module

    out = tmp_path / f"policy.{fmt}"
    assert export.main([str(trained), "--format", fmt, "--out", str(out)]) == 0
    module = load_module(find_checkpoint(trained)[1])
    obs = recorded_observations(module)
    with torch.no_grad():
        logits = module.forward_inference({"obs": torch.as_tensor(obs)})["action_dist_inputs"].numpy()
    if fmt == "onnx":
        import onnxruntime

        actions, dist_inputs = onnxruntime.InferenceSession(str(out)).run(None, {"obs": obs})
    else:
        actions, dist_inputs = (t.detach().numpy() for t in torch.jit.load(str(out))(torch.as_tensor(obs)))
    assert len(set(logits.argmax(-1))) == 2  # both actions occur: the comparison can tell them apart
    np.testing.assert_array_equal(actions, logits.argmax(-1))
    np.testing.assert_allclose(dist_inputs, logits, rtol=1e-5, atol=1e-6)
    side = json.loads(Path(str(out) + ".json").read_text())
    assert side["observation"]["shape"] == [4] and side["action"]["n"] == 2
    assert side["preprocessing"]["normalisation"] is None and side["env"]["id"] == "CartPole-v1"


def test_export_continuous_policy_maps_mean_onto_bounds(tmp_path):
    """Box actions: the exported action is RLlib's unsquashed Gaussian mean (untrained Pendulum module)."""
    import onnxruntime
    from ray.rllib.utils.spaces.space_utils import unsquash_action

    from rayrl import spec as S
    from rayrl.policy.export import export
    from rayrl.rllib import algo

    env = gym.make("Pendulum-v1")
    spec = S.from_dict({"env": {"id": "Pendulum-v1"}})
    module = algo.build_config(spec).get_rl_module_spec(env=env).build()
    module.eval()
    obs = np.stack([env.observation_space.sample() for _ in range(100)]).astype(np.float32)
    with torch.no_grad():
        inputs = module.forward_inference({"obs": torch.as_tensor(obs)})["action_dist_inputs"]
    expected = unsquash_action(inputs[:, :1].numpy(), env.action_space)
    for fmt in ("onnx", "torchscript"):
        out = export(module, env.observation_space, env.action_space, fmt, tmp_path / f"p.{fmt}")
        got = (
            onnxruntime.InferenceSession(str(out)).run(None, {"obs": obs})[0]
            if fmt == "onnx"
            else torch.jit.load(str(out))(torch.as_tensor(obs))[0].detach().numpy()
        )
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_play_prints_five_returns_and_records_videos(trained, tmp_path, capsys):
    from rayrl.policy import play

    assert play.main([str(trained), "--episodes", "5", "--video", str(tmp_path / "video")]) == 0
    lines = capsys.readouterr().out.splitlines()
    returns = [float(line.split("return ")[1]) for line in lines if line.startswith("episode ")]
    saved = json.loads((trained / "play.json").read_text())
    assert len(returns) == 5 and saved["returns"] == returns and all(r >= 8 for r in returns)
    assert saved["mean"] == pytest.approx(np.mean(returns)) and saved["std"] == pytest.approx(np.std(returns, ddof=1))
    videos = list((tmp_path / "video").glob("*.mp4"))
    assert len(videos) == 5 and all(v.stat().st_size > 1000 for v in videos) and saved["videos"]


def test_export_and_play_take_the_confirmation_run_when_the_specs_own_config_won(trained, tmp_path, capsys):
    """A sweep whose winner is the spec's own config (it never ran in the search): export and play use
    its first confirmation run at the target. The folder is laid out as a sweep leaves it, with the
    real checkpoints of a real training run as its trials."""
    import shutil

    from rayrl import runfolder
    from rayrl.policy import export, play

    (search_tid, search_dir), (spec_tid, spec_dir) = sorted(trial_ids(trained).items())
    run = tmp_path / "sweep"
    shutil.copytree(search_dir, run / runfolder.PHASE_DIRS[runfolder.SEARCH] / search_dir.name)
    shutil.copytree(spec_dir, run / runfolder.PHASE_DIRS[runfolder.CONFIRM_PHASE] / spec_dir.name)
    shutil.copy(trained / "spec.yaml", run / "spec.yaml")
    (run / "summary.json").write_text(
        json.dumps({"kind": "sweep", "best": {"trial_id": "spec", "batch_size": 512, "lr": 3e-4}})
    )
    row = dict.fromkeys(runfolder.CONFIRM_COLUMNS, "")
    rows = [
        {**row, "candidate": 1, "phase2_trial_id": search_tid, "batch_size": 512, "lr": 3e-4, "seed": 1000}
        | {"trial_id": "c_missing", "reached": "False"},
        {**row, "candidate": 2, "phase2_trial_id": "spec", "batch_size": 512, "lr": 3e-4, "seed": 1000}
        | {"trial_id": "c_missed", "reached": "False"},
        {**row, "candidate": 2, "phase2_trial_id": "spec", "batch_size": 512, "lr": 3e-4, "seed": 2000}
        | {"trial_id": spec_tid, "reached": "True"},
    ]
    with (run / runfolder.CONFIRM).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(runfolder.CONFIRM_COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
    assert export.main([str(run)]) == 0
    side = json.loads((run / "policy.onnx.json").read_text())
    assert side["trial_id"] == spec_tid  # the spec's run at the target, not the search's best trial
    assert play.main([str(run), "--episodes", "1"]) == 0
    assert f"trial {spec_tid}" in capsys.readouterr().out


def test_sweep_logs_one_mlflow_run_per_phase2_trial(tmp_path):
    from mlflow.tracking import MlflowClient

    rayrl_run(
        [
            "experiments/sweep.py",
            "--name",
            "ecosweep",
            "--set",
            "search.doubling={start: 512, cap: 512, warmup_iters: 0, measure_iters: 1}",
            "--set",
            "search.num_samples=2",
            "--set",
            "search.max_env_steps=1536",
            "--set",
            "search.grace_env_steps=512",
            "--set",
            "search.max_concurrent=2",
            # one batch size (no search below the ladder) and no confirmation: MLflow per trial is under test
            "--set",
            "search.min_batch=512",
            "--set",
            "search.confirm_top_k=0",
        ],
        tmp_path,
    )
    with (tmp_path / "ecosweep" / "trials.csv").open() as f:
        trials = {r["trial_id"]: r for r in csv.DictReader(f)}
    client = MlflowClient(f"file:{tmp_path / 'mlruns'}")
    runs = client.search_runs([client.get_experiment_by_name("ecosweep").experiment_id])
    phase2 = {r.data.tags["trial_id"]: r for r in runs if r.data.tags["rayrl.phase"] == "search"}
    assert len(trials) == 2 and set(phase2) == set(trials)
    assert sum(r.data.tags["rayrl.phase"] == "ladder" for r in runs) == 1  # the ladder's one rung
    for trial_id, run in phase2.items():
        assert float(run.data.params["algo.lr"]) == pytest.approx(float(trials[trial_id]["lr"]))
        assert run.data.tags["mlflow.runName"].startswith(f"search_b512_lr{float(trials[trial_id]['lr']):.1e}")
        assert "rayrl/env_steps_per_s" in run.data.metrics
