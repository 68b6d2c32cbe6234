"""The benchmarks: their pure helpers (fast), and each script's --quick mode end to end (slow).

The quick modes run as scripts, exactly as docs/benchmarks.md tells a reader to, each with its own
local Ray; together 3-4 minutes on 2 cores.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, subprocess_env

BENCH = ROOT / "benchmarks"


def load(name: str):
    """Import a benchmark script as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"rayrl_bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_quick(script: str, out: Path, *extra: str, timeout: int = 300) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, str(BENCH / f"{script}.py"), "--quick", "--out", str(out), *extra],
                          env=subprocess_env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def positive(*values: float) -> None:
    for v in values:
        assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, values


# ---- fast: the pure parts -----------------------------------------------------------------------

def test_lr_draw_is_log_uniform_one_per_stratum_and_seeded():
    sweep_cost = load("sweep_cost")
    lrs = sweep_cost.draw_lrs(4, 1e-5, 1e-3, seed=0)
    assert lrs == sorted(lrs) and lrs == sweep_cost.draw_lrs(4, 1e-5, 1e-3, seed=0)
    assert lrs != sweep_cost.draw_lrs(4, 1e-5, 1e-3, seed=1)
    edges = [1e-5 * 10 ** (0.5 * i) for i in range(5)]  # quarters of the 2-decade log range
    for lr, lo, hi in zip(lrs, edges[:-1], edges[1:]):
        assert lo * (1 - 1e-9) <= lr <= hi * (1 + 1e-9)


def write_history(path: Path, rows: list[tuple]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trial_id", "phase", "training_iteration", "env_steps", "episode_return_mean"])
        w.writerows(rows)


def test_consumption_counts_every_trial_until_the_first_at_target(tmp_path):
    sweep_cost = load("sweep_cost")
    history = tmp_path / "history.csv"
    write_history(history, [
        ("r1", "doubling", 1, 2048, 20.0), ("r1", "doubling", 2, 4096, 30.0),   # the ladder counts
        ("a", "search", 1, 1000, 20.0), ("b", "search", 1, 1000, 22.0),
        ("a", "search", 2, 2000, 200.0), ("b", "search", 2, 2000, 460.0),      # first at target here
        ("a", "search", 3, 3000, 470.0), ("c", "other", 1, 9999, 500.0),       # after it / other phase
    ])
    c = sweep_cost.consumption(history, ("doubling", "search"), 450.0)
    assert c["env_steps_to_target"] == 4096 + 2000 + 2000
    assert c["first_at_target"] == {"trial_id": "b", "iteration": 2, "env_steps": 8096}
    assert c["env_steps_total"] == 4096 + 3000 + 2000
    assert c["best_return"] == 470.0 and c["trials"] == 2  # ladder rungs are not search trials
    # Both search trials reached the target: in a random order the expectation is their mean.
    assert c["trials_at_target"] == 2 and c["env_steps_to_target_random_order"] == pytest.approx((3000 + 2000) / 2)
    never = sweep_cost.consumption(history, ("doubling",), 450.0)
    assert never["env_steps_to_target"] is None and never["first_at_target"] is None
    assert math.isnan(never["best_return"])


def test_expected_cost_to_target_over_random_trial_orders():
    sweep_cost = load("sweep_cost")
    # 2 failures (100, 200) and 2 successes (50, 70): each failure precedes both successes 1/3 of the time.
    trials = [(100.0, False), (200.0, False), (50.0, True), (70.0, True)]
    assert sweep_cost.expected_to_target(trials) == pytest.approx(300 / 3 + 60)
    # Brute force over all orders agrees.
    import itertools

    costs = []
    for order in itertools.permutations(trials):
        total = 0.0
        for steps, ok in order:
            total += steps
            if ok:
                break
        costs.append(total)
    assert sweep_cost.expected_to_target(trials) == pytest.approx(sum(costs) / len(costs))
    assert sweep_cost.expected_to_target([(100.0, False)]) is None


def test_sweep_cost_goal_needs_a_third_of_the_steps_and_an_equal_best_return():
    sweep_cost = load("sweep_cost")

    def side(to_target, total, best):
        return {"env_steps_to_target": to_target, "env_steps_total": total, "best_return": best,
                "first_at_target": {"env_steps": to_target} if to_target else None,
                "wall_s_to_target": 10.0, "wall_s_total": 20.0}

    met = sweep_cost.figures({"grid": side(900, 1600, 470.0), "rayrl": side(300, 700, 455.0)}, 450.0, 100)
    assert met["goal_met"] and met["env_steps_ratio_to_target"] == pytest.approx(1 / 3)
    assert met["grid_env_steps"] == 900 and met["rayrl_env_steps_total"] == 700
    assert not sweep_cost.figures({"grid": side(900, 1600, 470.0), "rayrl": side(301, 700, 460.0)},
                                  450.0, 100)["goal_met"]
    # Fewer steps but a worse best return is not the goal; a grid that never reached counts in total.
    worse = sweep_cost.figures({"grid": side(None, 1600, 300.0), "rayrl": side(None, 200, 250.0)}, 450.0, 100)
    assert worse["grid_env_steps"] == 1600 and not worse["goal_met"]


def test_time_to_reward_median_is_a_lower_bound_only_when_a_capped_run_could_move_it():
    ttr = load("time_to_reward")

    def run(wall, steps, reached):
        return {"wall_s": wall, "env_steps": steps, "reached": reached, "build_s": 1.0}

    ok = ttr.summarise([run(10, 1000, True), run(20, 2000, True), run(200, 9000, False)])  # 100, 100, 45 /s
    assert ok["wall_s"] == 20 and ok["env_steps"] == 2000 and not ok["median_is_lower_bound"]
    assert ok["reached"] == 2 and ok["env_steps_per_s"] == pytest.approx(100.0)
    capped = ttr.summarise([run(10, 1000, True), run(200, 9000, False), run(200, 9000, False)])
    assert capped["median_is_lower_bound"] and capped["wall_s"] == 200 and capped["env_steps_per_s"] == 45


def test_read_knee_from_doubling_csv_summary_and_run_folder(tmp_path):
    common = load("common")
    (tmp_path / "doubling.csv").write_text("batch_size,env_steps_per_s,gain,decision\n2048,5000,,expand\n"
                                           "4096,7000,0.4,expand\n8192,7500,0.0714,stop\n")
    (tmp_path / "summary.json").write_text(json.dumps({"knee_batch_size": 4096}))
    knee, ladder = common.read_knee(tmp_path / "doubling.csv")
    assert knee == 4096 and [r["decision"] for r in ladder] == ["expand", "expand", "stop"]
    assert common.read_knee(tmp_path / "summary.json") == (knee, ladder)
    assert common.read_knee(tmp_path)[0] == 4096
    with pytest.raises(SystemExit, match="does not exist"):
        common.read_knee(tmp_path / "nope.csv")


def test_table_and_json_helpers():
    common = load("common")
    text = common.table(["a", "b"], [["x", 1234.5], ["longer", float("nan")]])
    lines = text.splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    assert cells[0] == ["a", "b"] and cells[2] == ["x", "1,234"] and cells[3] == ["longer", "-"]
    assert len({len(line) for line in lines}) == 1
    assert common.jsonable({"x": float("inf"), "p": Path("/a"), "l": [1.0, float("nan")]}) == \
        {"x": None, "p": "/a", "l": [1.0, None]}
    assert common.median([3.0, float("nan"), 1.0, 2.0]) == 2.0 and math.isnan(common.median([]))


# ---- slow: each script's quick mode -------------------------------------------------------------

@pytest.mark.slow
def test_throughput_quick(tmp_path):
    report, printed = run_quick("throughput", tmp_path / "t.json")
    positive(report["limit_sps"], report["rllib_default_sps"], report["rayrl_sps"])
    assert report["rayrl_over_rllib_default"] == pytest.approx(report["rayrl_sps"] / report["rllib_default_sps"])
    assert report["rayrl_over_limit"] == pytest.approx(report["rayrl_sps"] / report["limit_sps"])
    assert report["goal_met"] == (report["rayrl_over_rllib_default"] >= 2.5)
    (round_ratio,) = report["round_ratios_rayrl_over_rllib_default"]  # quick: one round
    assert round_ratio == pytest.approx(report["contenders"]["rayrl"]["round_medians"][0]
                                        / report["contenders"]["rllib_default"]["round_medians"][0])
    # The limit steps envs with no learning and no Ray: nothing end to end can beat it on one core.
    assert report["rayrl_sps"] < report["limit_sps"] and report["rllib_default_sps"] < report["limit_sps"]
    ladder = report["ladder"]
    assert ladder[0]["batch_size"] == 1024 and ladder[0]["decision"] != "failed"
    # The knee the benchmark ran is the rule's: the last rung whose doubling paid off.
    assert report["knee_batch_size"] == [r["batch_size"] for r in ladder if r["decision"] in ("expand", "cap")][-1]
    for name in ("limit", "rllib_default", "rayrl"):
        c = report["contenders"][name]
        assert c["samples"] >= 1 and c["sps_min"] <= c["sps_median"] <= c["sps_max"]
    assert report["contenders"]["rayrl"]["timers_median_s"]["learner_update_timer"] > 0
    assert report["machine"]["nproc"] >= 1 and report["machine"]["cpu_model"]
    assert "x RLlib default" in printed and f"{report['rayrl_over_rllib_default']:.2f}" in printed


@pytest.mark.slow
def test_time_to_reward_quick(tmp_path):
    report, printed = run_quick("time_to_reward", tmp_path / "ttr.json")
    assert report["target_return"] == 60.0
    for name in ("rllib_default", "rayrl"):
        runs = report["runs"][name]
        assert len(runs) == 1 and runs[0]["seed"] == 0
        positive(report[f"{name}_wall_s"], report[f"{name}_env_steps"], runs[0]["build_s"])
        r = runs[0]
        # Reached means the last return met the target; otherwise a cap stopped it.
        assert r["reached"] == (r["return"] >= 60.0)
        assert r["reached"] or r["wall_s"] >= 30.0 or r["env_steps"] >= 60_000
    assert report["wall_ratio_default_over_rayrl"] == pytest.approx(
        report["rllib_default_wall_s"] / report["rayrl_wall_s"])
    assert report["env_steps_ratio_default_over_rayrl"] == pytest.approx(
        report["rllib_default_env_steps"] / report["rayrl_env_steps"])
    assert "RLlib default PPO" in printed and "wall s" in printed


@pytest.mark.slow
def test_sweep_cost_quick(tmp_path):
    report, printed = run_quick("sweep_cost", tmp_path / "sc.json", "--storage", str(tmp_path / "runs"),
                                "--reps", "1", timeout=500)
    (rep,) = report["reps"]
    positive(rep["grid_env_steps"], rep["grid4_env_steps"], rep["rayrl_env_steps"], rep["grid_env_steps_total"],
             rep["grid4_env_steps_total"], rep["rayrl_env_steps_total"], rep["rayrl_wall_s_total"])
    for side in ("grid", "grid4", "rayrl"):
        assert math.isfinite(rep[f"{side}_best_return"]) and rep[f"{side}_best_return"] > 0
        assert rep[f"{side}_env_steps"] <= rep[f"{side}_env_steps_total"]
        if rep[f"{side}_reached_target"]:
            assert rep[f"{side}_best_return"] >= report["target_return"]
    # One repetition: every headline median is that repetition's figure.
    assert report["grid4_env_steps_to_target"] == rep["grid4_env_steps"]
    assert report["grid16_env_steps_total"] == rep["grid_env_steps_total"]
    assert report["rayrl_env_steps_total"] == rep["rayrl_env_steps_total"]
    assert report["grid_best_return"] == rep["grid_best_return"]
    assert report["goal_total_met"] == (report["rayrl_env_steps_total"] <= report["grid16_env_steps_total"] / 3)
    assert report["goal_to_target_met"] == (report["rayrl_env_steps_to_target"] <= report["grid4_env_steps_to_target"])
    assert rep["grid"]["trials"] == 4 and rep["grid4"]["trials"] == 2 and report["grid_batches"] == [512, 1024]
    assert sorted(float(x) for x in rep["grid4_lrs"].values()) <= sorted(rep["grid_lrs"])  # one lr per batch
    # Every grid trial runs to the budget unless it reached the target: nothing stops it early.
    last: dict[str, tuple[float, float]] = {}
    with (Path(rep["grid"]["run_dir"]) / "history.csv").open() as f:
        for row in csv.DictReader(f):
            last[row["trial_id"]] = (float(row["env_steps"]), float(row["episode_return_mean"] or "nan"))
    assert len(last) == 4
    assert all(steps >= report["budget_env_steps"] or ret >= report["target_return"] for steps, ret in last.values())
    assert sum(steps for steps, _ in last.values()) == pytest.approx(report["grid16_env_steps_total"])
    summary = json.loads((Path(rep["rayrl"]["run_dir"]) / "summary.json").read_text())
    assert summary["env_steps_total"] == pytest.approx(report["rayrl_env_steps_total"])  # confirmation included
    assert summary["env_steps_confirm"] > 0
    assert "goal 2: rayrl env steps total" in printed
    # --report-only reads the same run folders back (no Ray, nothing rerun): the same figures.
    again, _ = run_quick("sweep_cost", tmp_path / "again.json", "--storage", str(tmp_path / "runs"),
                         "--reps", "1", "--report-only", timeout=120)
    for key in ("grid4_env_steps_to_target", "grid16_env_steps_to_target", "grid16_env_steps_total",
                "rayrl_env_steps_to_target", "rayrl_env_steps_total", "grid_best_return", "rayrl_best_return"):
        assert again[key] == pytest.approx(report[key]), key


@pytest.mark.slow
def test_profile_iteration_quick(tmp_path):
    report, printed = run_quick("profile_iteration", tmp_path / "p.json")
    ph = report["driver"]["phases_s"]
    positive(report["iteration_wall_s"], ph["train_total"], ph["sampling"], ph["learner_update"],
             ph["rayrl_learner_minibatches"], report["tune"]["trial_wall_per_iter_s"])
    # The phases are parts of one train() call: they cannot add up to more than it.
    assert ph["sampling"] + ph["learner_update"] + ph["weight_sync"] <= ph["training_step"] * 1.001
    assert ph["training_step"] <= ph["train_total"] * 1.001
    assert ph["rayrl_learner_minibatches"] <= ph["learner_update"] * 1.001
    runner = report["driver"]["runner"]
    assert 0 < runner["env_step"] < runner["sample_total"] and runner["env_steps"] >= 1024
    assert report["tune"]["iterations"] == 3
    assert report["batch_size"] == 1024 and "sampling" in printed
