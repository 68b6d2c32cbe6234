"""benchmarks/tuners.py: its pure parts (fast: budgets, order, resume, answers, figures) and --quick (slow).

The slow tests run the script as docs/benchmarks.md tells a reader to, with the cheap tuners only
(rayrl's sweep at smoke sizes takes longer than a test should; the quick run in the docs covers it).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT, subprocess_env

from benchmarks import common as C
from benchmarks import tuners as B
from benchmarks import zoo_answers as Z
from benchmarks import zoo_optimize

CARTPOLE = ROOT / "experiments" / "configs" / "cartpole_ppo.yaml"
PENDULUM = ROOT / "experiments" / "configs" / "pendulum_ppo.yaml"


def zoo_installed() -> bool:
    return Z.unsupported("CartPole-v1") is None


needs_zoo = pytest.mark.skipif(not zoo_installed(), reason="rl_zoo3 not installed (the bench extra)")


# ---- arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--tuners", "rayrl,grid"], "--tuners: grid: choose from rayrl"),
        (["--reps", "0"], "--reps and --judge-seeds must be >= 1"),
        (["--judge-seeds", "0"], "--reps and --judge-seeds must be >= 1"),
        (["--budget-runs", "0"], "--budget-runs must be > 0"),
        (["--envs", "hopper"], "--envs: hopper: choose from cartpole, pendulum"),
        (["--config", str(CARTPOLE)], "needs --target"),
        (["--target", "300"], "--target applies to one env"),
        (["--config", str(CARTPOLE), "--target", "1", "--envs", "cartpole"], "--config replaces --envs"),
        (["--config", "nope.yaml", "--target", "1"], "does not exist"),
        (["--seed-base", "1000", "--judge-seeds", "2"], "judging seeds [1000, 2000] are seeds the tuners train on"),
    ],
)
def test_bad_arguments_exit_2_saying_what_to_change(argv, says, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        B.parse(["--out", str(tmp_path / "o.json"), "--tuners", "tune_by_hand", *argv])
    assert exc.value.code == 2
    assert says in capsys.readouterr().err


def test_defaults_and_quick_sizes(tmp_path):
    args = B.parse(["--out", str(tmp_path / "o.json"), "--tuners", "tune_by_hand,random"])
    assert (args.reps, args.judge_seeds, args.budget_runs, args.envs) == (2, 5, 8, ["cartpole", "pendulum"])
    assert args.seeds == [100_000, 101_000, 102_000, 103_000, 104_000]
    assert args.work == tmp_path / "o.json.work"
    q = B.parse(["--out", str(tmp_path / "o.json"), "--quick", "--tuners", "random"])
    assert (q.reps, q.judge_seeds, q.budget_runs, q.envs) == (1, 1, 2, ["cartpole"])
    spec = q.specs["cartpole"]
    assert spec.stop.env_steps == B.QUICK_RUN_ENV_STEPS and spec.stop.episode_return == B.QUICK.target


# ---- budgets, space, seeds ----------------------------------------------------------------------


def search(max_env_steps=200_000, grace=40_000, rf=3.0):
    return SimpleNamespace(max_env_steps=max_env_steps, grace_env_steps=grace, reduction_factor=rf)


def test_budget_split_gives_every_tuner_the_same_env_steps():
    b = B.split(8 * 300_000, 300_000, search(), zoo_horizon=100_000, quick=False)
    assert b.env_steps == 2_400_000
    assert (b.per_trial, b.grace, b.reduction_factor) == (200_000, 40_000, 3.0)
    assert (b.zoo_trials, b.zoo_timesteps) == (24, 100_000)  # RL Zoo's n_timesteps for the env
    assert b.zoo_trials * b.zoo_timesteps == b.env_steps
    assert b.num_samples * b.grace >= b.env_steps  # the budget, not the trial count, ends a Tune tuner
    assert b.zoo_evaluations == B.ZOO_EVALUATIONS


def test_budget_split_quick_and_tiny_budgets():
    q = B.split(40_000, 20_000, search(8000, 2048, 2.0), zoo_horizon=100_000, quick=True)
    assert (q.zoo_trials, q.zoo_timesteps, q.zoo_evaluations, q.per_trial) == (2, 20_000, 2, 8000)
    tiny = B.split(5000, 20_000, search(), zoo_horizon=None, quick=False)  # below one trial
    assert (tiny.per_trial, tiny.grace, tiny.zoo_trials, tiny.zoo_timesteps) == (5000, 5000, 1, 5000)
    odd = B.split(250_000, 100_000, search(), zoo_horizon=None, quick=False)  # no Zoo entry: a run's env steps
    assert (odd.zoo_trials, odd.zoo_timesteps) == (2, 100_000)
    with pytest.raises(ValueError, match="budget"):
        B.split(0, 1, search(), None, False)


def test_search_space_is_every_batch_the_sweep_could_search():
    cart, pend = C.load_spec(CARTPOLE), C.load_spec(PENDULUM)
    assert B.search_space(cart) == {"lr": [1e-5, 1e-3], "batches": [256, 512, 1024, 2048, 4096, 8192, 16384]}
    assert B.search_space(pend)["batches"] == [256, 512, 1024, 2048, 4096, 8192]


def test_judging_seeds_avoid_every_seed_a_tuner_trains_on():
    seen = B.tuning_seeds(0, reps=2, confirm_seeds=3)
    assert seen == {0, 1, 1000, 1001, 2000, 2001, 3000, 3001}
    assert not seen & set(B.judge_seeds(B.JUDGE_SEED_BASE, 5))


# ---- order and resume ---------------------------------------------------------------------------


def test_plan_alternates_tuners_and_judging_order():
    seeds = [7, 8]
    steps = B.plan(["cartpole"], ["rayrl", "tune_by_hand", "random"], reps=2, seeds=seeds)
    tunes = [(s.rep, s.tuner) for s in steps if s.judged_as is None]
    assert tunes == [(0, "rayrl"), (0, "tune_by_hand"), (0, "random"), (1, "tune_by_hand"), (1, "random"), (1, "rayrl")]
    rep0 = [s for s in steps if s.rep == 0]
    assert all(s.judged_as is None for s in rep0[:3]) and all(s.judged_as for s in rep0[3:])  # tune, then judge
    first, second = [[s.judged_as for s in rep0 if s.seed == seed] for seed in seeds]
    assert first == ["rayrl", "tune_by_hand", "random"] and second == ["tune_by_hand", "random", "rayrl"]
    zoo = B.plan(["pendulum"], ["zoo_optimize"], reps=1, seeds=[5])
    assert [(s.judged_as, s.library) for s in zoo[1:]] == [("zoo_optimize", "sb3"), ("zoo_optimize_as_rayrl", "rayrl")]


def test_resume_skips_every_finished_step(tmp_path):
    steps = B.plan(["cartpole"], ["tune_by_hand", "random"], reps=1, seeds=[5, 6])
    assert B.pending(steps, tmp_path) == steps
    done = steps[:3]
    for s in done:
        B.write(s.path(tmp_path), {"x": 1.0})
    assert B.pending(steps, tmp_path) == steps[3:]
    assert not list(tmp_path.rglob("*.tmp"))  # written atomically
    assert len({s.path(tmp_path) for s in steps}) == len(steps)  # one file per step


def fake_work(work: Path, tuners: list[str], seeds: list[int], budget: int) -> None:
    """Result files as a finished run leaves them."""
    for k, tuner in enumerate(tuners):
        B.write(
            B.Step("cartpole", tuner, 0).path(work),
            {
                "tuner_env_steps": budget - 10 * k,
                "tuner_wall_s": 50.0 + k,
                "answer": {"batch_size": 256, "lr": 1e-4 * (k + 1), "minibatch_size": 256},
                "seed": 0,
                "accounting": "test",
            },
        )
        for i, seed in enumerate(seeds):
            B.write(
                B.Step("cartpole", tuner, 0, tuner, "rayrl", seed).path(work),
                {"reached": i != 2, "wall_s": 4.0 + i + k, "env_steps": 5000.0 * (i + 1), "seed": seed},
            )


def test_a_finished_work_folder_is_reported_without_running_anything(tmp_path):
    out, work = tmp_path / "q.json", tmp_path / "work"
    argv = ["--quick", "--out", str(out), "--work", str(work), "--tuners", "tune_by_hand,random", "--judge-seeds", "3"]
    fake_work(work, ["tune_by_hand", "random"], B.judge_seeds(B.JUDGE_SEED_BASE, 3), 40_000)
    assert B.main(argv) == 0  # nothing pending: no Ray started, the report from the files
    report = json.loads(out.read_text())
    rows = report["envs"]["cartpole"]["rows"]
    assert [(r["tuner"], r["rep"]) for r in rows] == [("tune_by_hand", 0), ("random", 0)]
    r = rows[0]
    assert r["budget_env_steps"] == 40_000 and r["tuner_env_steps"] == 40_000 and r["tuner_wall_s"] == 50.0
    assert r["answer"] == {"batch_size": 256, "lr": 1e-4, "minibatch_size": 256}
    assert (r["reached"], r["n"], r["answer_median_wall_s"], r["answer_median_env_steps"]) == (2, 3, 5.0, 10_000.0)
    assert r["median_is_lower_bound"] is False  # the miss (6 s) is above the median
    assert r["answer_iqm_wall_s"] == 5.0
    assert report["machine"]["nproc"] and report["envs"]["cartpole"]["budget"]["zoo_trials"] == 2


def test_other_settings_in_the_work_folder_are_refused(tmp_path, capsys):
    out, work = tmp_path / "q.json", tmp_path / "work"
    B.write(work / "settings.json", {"quick": True, "budgets": {"cartpole": {"env_steps": 1}}})
    assert B.main(["--quick", "--out", str(out), "--work", str(work), "--tuners", "random"]) == 2
    err = capsys.readouterr().err
    assert "holds results of other settings (budgets" in err and "another --work" in err
    assert not out.exists()


# ---- answers ------------------------------------------------------------------------------------


def test_the_sweeps_answer_and_cost_from_its_run_folder(tmp_path):
    from benchmarks import tuner_runs as R
    from rayrl import spec as spec_mod

    spec = spec_mod.replace(C.load_spec(CARTPOLE), algo={"lr": 3.6e-4, "train_batch_per_learner": 512})
    (tmp_path / "best_config.yaml").write_text(spec_mod.dumps(spec))
    summary = {"env_steps_total": 599_648, "env_steps_phase1": 57_391, "env_steps_phase2": 327_999}
    summary.update(env_steps_confirm=214_258, knee_batch_size=4096)
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    got = R.read_sweep(tmp_path)
    assert got["tuner_env_steps"] == 599_648
    assert got["phases"] == {"ladder": 57_391, "search": 327_999, "confirm": 214_258}
    answer = got["answer"]
    assert (answer["batch_size"], answer["lr"], answer["knee_batch_size"]) == (512, 3.6e-4, 4096)
    (tmp_path / "best_config.yaml").unlink()
    with pytest.raises(RuntimeError, match="no best_config.yaml"):
        R.read_sweep(tmp_path)


def test_hand_written_tuners_answer_by_the_sweeps_ranking():
    from benchmarks import tuner_runs as R

    rows = [
        {"batch_size": 256, "lr": 1e-4, "env_steps": 8000.0, "episode_return_mean": 120.0, "status": "completed"},
        {"batch_size": 512, "lr": 3e-4, "env_steps": 6000.0, "episode_return_mean": 151.0, "status": "reached_target"},
        {"batch_size": 1024, "lr": 5e-4, "env_steps": 4000.0, "episode_return_mean": 160.0, "status": "reached_target"},
        {"batch_size": 1024, "lr": 9e-4, "env_steps": 100.0, "episode_return_mean": None, "status": "error"},
    ]
    assert R.best_trial(rows)["lr"] == 5e-4  # at the target in the fewest env steps
    assert R.best_trial(rows[:1])["lr"] == 1e-4
    assert R.best_trial(rows[3:]) is None


def test_budget_stopper_stops_a_trial_at_its_cap_or_target_and_all_at_the_budget():
    from benchmarks import tuner_runs as R

    s = R.BudgetStopper(budget=1000, per_trial=400, return_key="rayrl/train_return", target=150.0)
    result = lambda steps, ret: {"num_env_steps_sampled_lifetime": steps, "rayrl": {"train_return": ret}}
    assert not s("a", result(300, 20.0)) and not s.stop_all()
    assert s("a", result(400, 20.0))  # its cap
    assert s("b", result(100, 151.0))  # the target
    assert not s("b", result(100, math.nan)) and not s.stop_all()  # NaN (no episode yet) stops nothing
    s("c", result(500, 10.0))
    assert s.stop_all()  # 400 + 100 + 500 >= 1000
    assert s.criteria() == {"num_env_steps_sampled_lifetime": 400, "rayrl/train_return": 150.0}


def test_zoo_env_steps_are_counted_from_the_wrappers_lines(tmp_path):
    path = tmp_path / "count.jsonl"
    assert zoo_optimize.counted(path) == {"train_env_steps": 0, "eval_env_steps": 0, "trials": 0}
    path.write_text('{"train_env_steps": 8192, "eval_env_steps": 518}\n{"train_env_steps": 4096, "eval_')
    assert zoo_optimize.counted(path) == {"train_env_steps": 8192, "eval_env_steps": 518, "trials": 1}


@needs_zoo
def test_zoo_answer_from_its_study(tmp_path):
    import optuna

    storage = tmp_path / "study.log"
    name = Z.study_name("zoo_optimize", "CartPole-v1", 0)
    backend = optuna.storages.journal.JournalFileBackend(str(storage))
    study = optuna.create_study(study_name=name, storage=optuna.storages.JournalStorage(backend), direction="maximize")
    dist = {
        "batch_size_pow": optuna.distributions.IntDistribution(2, 10),
        "n_steps_pow": optuna.distributions.IntDistribution(5, 12),
        "one_minus_gamma": optuna.distributions.FloatDistribution(1e-4, 0.03, log=True),
        "one_minus_gae_lambda": optuna.distributions.FloatDistribution(1e-4, 0.1, log=True),
        "learning_rate": optuna.distributions.FloatDistribution(1e-5, 0.002, log=True),
        "ent_coef": optuna.distributions.FloatDistribution(1e-8, 0.1, log=True),
        "clip_range": optuna.distributions.CategoricalDistribution([0.1, 0.2, 0.3, 0.4]),
        "n_epochs": optuna.distributions.CategoricalDistribution([1, 5, 10, 20]),
        "max_grad_norm": optuna.distributions.FloatDistribution(0.3, 2),
        "net_arch": optuna.distributions.CategoricalDistribution(["tiny", "small", "medium"]),
        "activation_fn": optuna.distributions.CategoricalDistribution(["tanh", "relu"]),
    }
    params = {
        "batch_size_pow": 6,
        "n_steps_pow": 7,
        "one_minus_gamma": 0.02,
        "one_minus_gae_lambda": 0.05,
        "learning_rate": 5e-4,
        "ent_coef": 1e-6,
        "clip_range": 0.3,
        "n_epochs": 10,
        "max_grad_norm": 0.8,
        "net_arch": "tiny",
        "activation_fn": "relu",
    }
    for value in (150.0, 480.0):
        study.add_trial(optuna.trial.create_trial(params=params, distributions=dist, value=value))
    study.add_trial(optuna.trial.create_trial(params=params, distributions=dist, state=optuna.trial.TrialState.PRUNED))
    best = Z.read_study(storage, name)
    assert (best["value"], best["trial"], best["trials"], best["complete"], best["pruned"]) == (480.0, 1, 3, 2, 1)
    a = Z.answer("zoo", best, "CartPole-v1")
    assert (a["n_envs"], a["n_steps"], a["batch_size"], a["n_epochs"]) == (8, 128, 64, 10)
    assert math.isclose(a["gamma"], 0.98) and math.isclose(a["gae_lambda"], 0.95) and a["learning_rate"] == 5e-4
    assert a["policy_kwargs"] == {"net_arch": {"pi": [64], "vf": [64]}, "activation_fn": "relu"}
    json.dumps(a)  # kept as JSON
    sets, unmapped = Z.rayrl_overrides(a, continuous=False, horizon=100_000)
    got = dict(s.split("=", 1) for s in sets)
    assert got["algo.train_batch_per_learner"] == "1024" and got["model.hidden"] == "[64]" and not unmapped
    assert Z.read_study(tmp_path / "none.log", name) is None


@needs_zoo
def test_zoo_batch_lr_answer_from_its_report_csv(tmp_path):
    reports = tmp_path / "logs" / "ppo"
    reports.mkdir(parents=True)
    (reports / "report_CartPole-v1_2-trials-tpe-median_1.csv").write_text(
        ",number,value,state,params_batch,params_learning_rate,user_attrs_batch_size,user_attrs_n_steps\n"
        "0,0,40.5,COMPLETE,256.0,0.000125,256.0,32.0\n"
        "1,1,112.6,COMPLETE,1024.0,7.0e-05,1024.0,128.0\n"
        "2,2,,PRUNED,512.0,0.0009,512.0,64.0\n"
    )
    best = Z.read_report(tmp_path / "logs")
    assert (best["value"], best["trials"], best["pruned"]) == (112.6, 3, 1)
    a = Z.answer("batch_lr", best, "CartPole-v1")
    assert (a["n_steps"], a["batch_size"], a["learning_rate"], a["n_envs"]) == (128, 1024, 7e-5, 8)
    assert a["clip_range"] == "lin_0.2" and a["gamma"] == 0.98  # RL Zoo's defaults for the env stay
    assert Z.within(a, (1e-5, 1e-3), [256, 512, 1024]) and not Z.within(a, (1e-4, 1e-3), [256, 512, 1024])
    sets, _ = Z.rayrl_overrides(a, continuous=False, horizon=100_000)
    got = dict(s.split("=", 1) for s in sets)  # Zoo's lin_ clip: annealed over Zoo's n_timesteps
    assert (got["algo.clip"], got["algo.clip_final"], got["stop.env_steps"], got["algo.lr_final"]) == (
        "0.2",
        "0.0001",
        "100000",
        "null",
    )


def test_zoo_fields_rayrl_cannot_express_are_listed():
    answer = {
        "n_envs": 2,
        "n_steps": 64,
        "learning_rate": "lin_0.001",
        "use_sde": True,
        "sde_sample_freq": 4,
        "target_kl": 0.02,
        "policy_kwargs": {"net_arch": {"pi": [64], "vf": [128]}, "activation_fn": "leaky_relu", "log_std_init": -2},
    }
    sets, unmapped = Z.rayrl_overrides(answer, continuous=True, horizon=50_000)
    got = dict(s.split("=", 1) for s in sets)
    assert (got["algo.lr"], got["algo.lr_final"], got["model.log_std_init"]) == ("0.001", "0.0", "-2.0")
    assert "model.hidden" not in got and "model.activation" not in got
    text = " | ".join(unmapped)
    for word in ("net_arch", "leaky_relu", "use_sde", "sde_sample_freq", "target_kl"):
        assert word in text


@needs_zoo
def test_pendulum_config_is_rl_zoos_entry_as_far_as_it_maps():
    from rayrl import spec as spec_mod

    pend = C.load_spec(PENDULUM)
    entry = {k: v for k, v in (Z.defaults("Pendulum-v1") or {}).items() if k != "n_timesteps"}
    sets, unmapped = Z.rayrl_overrides(entry, continuous=True, horizon=100_000)
    zoo = spec_mod.from_dict(spec_mod.apply_overrides(spec_mod.to_dict(pend), sets))
    assert (zoo.env, zoo.algo, zoo.model) == (pend.env, pend.algo, pend.model)
    assert [u.split()[0] for u in unmapped] == ["use_sde", "sde_sample_freq"]


# ---- figures ------------------------------------------------------------------------------------


def test_judged_figures_count_a_miss_at_its_cap_and_say_so():
    runs = [
        {"reached": True, "wall_s": 10.0, "env_steps": 1000.0},
        {"reached": False, "wall_s": 12.0, "env_steps": 2000.0},  # capped: at or below the median -> bound
        {"reached": True, "wall_s": 30.0, "env_steps": 3000.0},
        {"reached": True, "wall_s": 40.0, "env_steps": 4000.0},
    ]
    f = B.judged_figures(runs)
    assert (f["reached"], f["n"], f["answer_median_wall_s"], f["answer_median_env_steps"]) == (3, 4, 21.0, 2500.0)
    assert f["answer_iqm_wall_s"] == 21.0 and f["answer_iqm_env_steps"] == 2500.0  # mean of the middle two
    assert f["median_is_lower_bound"] is True
    assert B.judged_figures([])["n"] == 0


def test_goals_met_missed_and_not_measured():
    def row(name, rep, wall, cost):
        return {"judged_as": name, "rep": rep, "answer_median_wall_s": wall, "tuner_env_steps": cost}

    table = [row("rayrl", 0, 10.0, 900), row("rayrl", 1, 12.0, 1100), row("random", 0, 11.0, 1000)]
    table += [row("zoo_optimize", 0, 20.0, 2000)]
    g = B.goals(table)
    assert g["answer_le_every_other"]["met"] is True and g["cost_le_zoo_optimize"]["met"] is True
    assert g["rayrl_reproducible"]["met"] is True and math.isclose(g["rayrl_reproducible"]["spread"], 0.2)
    g = B.goals([row("rayrl", 0, 10.0, 900), row("random", 0, 9.0, 1000)])
    assert g["answer_le_every_other"]["met"] is False
    assert g["cost_le_zoo_optimize"]["met"] is None and g["rayrl_reproducible"]["met"] is None


# ---- --quick, end to end (slow) -----------------------------------------------------------------


def run_quick(out: Path, *extra: str, timeout: int = 420) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.tuners", "--quick", "--out", str(out), *extra],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| tuner (judged as)" in proc.stdout  # the printed table
    return json.loads(out.read_text())


def sane(row: dict, budget: int, overrun: float) -> None:
    assert row["budget_env_steps"] == budget > 0
    assert 0 < row["tuner_env_steps"] <= budget + overrun, row
    assert row["tuner_wall_s"] > 0 and row["n"] == 1 and row["reached"] in (0, 1)
    assert row["answer_median_wall_s"] > 0 and row["answer_median_env_steps"] > 0 and row["answer_iqm_wall_s"] > 0


@pytest.mark.slow
def test_quick_with_the_tune_tuners(tmp_path):
    report = run_quick(tmp_path / "q.json", "--tuners", "tune_by_hand,random", "--budget-runs", "1")
    env = report["envs"]["cartpole"]
    budget, space = env["budget_env_steps"], env["search_space"]
    assert budget == B.QUICK_RUN_ENV_STEPS and env["target"] == B.QUICK.target
    assert [r["tuner"] for r in env["rows"]] == ["tune_by_hand", "random"]
    for row in env["rows"]:
        sane(row, budget, 0.1 * budget)
        a = row["answer"]
        assert a["batch_size"] in space["batches"] and space["lr"][0] <= a["lr"] <= space["lr"][1]
    assert report["machine"]["nproc"] >= 1


@pytest.mark.slow
@needs_zoo
def test_quick_with_the_zoo_tuners(tmp_path):
    report = run_quick(tmp_path / "q.json", "--tuners", "zoo_optimize,zoo_optimize_batch_lr", "--budget-runs", "1")
    env = report["envs"]["cartpole"]
    budget, space = env["budget_env_steps"], env["search_space"]
    names = [r["judged_as"] for r in env["rows"]]
    assert names == ["zoo_optimize", "zoo_optimize_as_rayrl", "zoo_optimize_batch_lr", "zoo_optimize_batch_lr_as_rayrl"]
    for row in env["rows"]:
        # A Zoo trial ends on a whole rollout: up to 4096 steps x 8 envs past its n_timesteps.
        sane(row, budget, 4096 * 8)
        assert "counted" in row["accounting"] and row["tuner_eval_env_steps"] > 0
    lr_only = env["rows"][2]["answer"]
    assert Z.within(lr_only, tuple(space["lr"]), space["batches"])
    assert env["rows"][3]["answer"]["overrides"] and env["rows"][3]["unmapped"] == []
