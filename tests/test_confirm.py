"""The confirmation step's rules (rayrl.sweep.confirm), without Ray: ranking, fresh seeds, costs, spread, choice."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from rayrl import runfolder
from rayrl import spec as S
from rayrl.sweep import confirm, ladder


def _trial(tid: str, batch: int, lr: float, steps: int | None, ret: float | None, status: str) -> dict:
    return {
        "trial_id": tid,
        "batch_size": batch,
        "lr": lr,
        "env_steps": steps,
        "episode_return_mean": ret,
        "status": status,
    }


def _run(
    cand: int,
    seed: int,
    steps: float,
    reached: bool,
    wall: float = 10.0,
    usd: float = 0.001,
    ret: float = 460.0,
    batch: int = 2048,
    lr: float = 3e-4,
) -> dict:
    return {
        "candidate": cand,
        "phase2_trial_id": f"p{cand}",
        "batch_size": batch,
        "lr": lr,
        "seed": seed,
        "trial_id": f"c{cand}_{seed}",
        "env_steps": steps,
        "wall_s": wall,
        "usd": usd,
        "episode_return_mean": ret if reached else 200.0,
        "reached": reached,
    }


def test_rank_and_top_configs_take_phase2s_order_and_skip_duplicates_and_errors():
    trials = [
        _trial("a", 2048, 1e-4, 90_000, 478.0, "reached_target"),
        _trial("b", 512, 3e-4, 30_000, 452.0, "reached_target"),
        _trial("c", 4096, 2e-4, 200_000, 330.0, "completed"),
        _trial("d", 1024, 5e-4, 10_000, 500.0, "error"),
        _trial("e", 512, 3e-4, 40_000, 455.0, "reached_target"),  # same config as b
        _trial("f", 256, 1e-3, 40_000, None, "stopped_early"),
    ]
    assert [t["trial_id"] for t in runfolder.rank_trials(trials)] == ["b", "e", "a", "c"]
    assert [t["trial_id"] for t in confirm.top_configs(trials, 3)] == ["b", "a", "c"]
    assert [t["trial_id"] for t in confirm.top_configs(trials, 10)] == ["b", "a", "c"]
    assert confirm.top_configs(trials, 0) == []  # search.confirm_top_k=0 turns the confirmation off
    assert [t["trial_id"] for t in confirm.top_configs(trials, 1)] == ["b"]


def test_the_specs_own_config_joins_the_candidates_last_unless_already_there():
    top = [
        _trial("b", 512, 3e-4, 30_000, 452.0, "reached_target"),
        _trial("a", 2048, 1e-4, 90_000, 478.0, "reached_target"),
    ]
    out = confirm.with_baseline(top, 2048, 3e-4)
    assert [c["trial_id"] for c in out] == ["b", "a", confirm.BASELINE_ID]
    assert (out[-1]["batch_size"], out[-1]["lr"]) == (2048, 3e-4)
    assert [c["trial_id"] for c in confirm.with_baseline(top, 2048, 1e-4)] == ["b", "a"]  # "a" is the spec's
    assert [c["trial_id"] for c in confirm.with_baseline(top, 512, 1e-4)] == ["b", "a", "spec"]  # batch alone: no
    assert top[-1]["trial_id"] == "a" and len(top) == 2  # the input is not changed


def test_the_specs_own_config_wins_when_the_searched_ones_are_slower_on_fresh_seeds():
    runs = [
        {
            "candidate": c,
            "phase2_trial_id": tid,
            "batch_size": b,
            "lr": 1e-4,
            "seed": seed,
            "trial_id": f"{tid}{seed}",
            "env_steps": steps,
            "wall_s": wall,
            "usd": wall / 1000,
            "episode_return_mean": 460.0,
            "reached": True,
        }
        for c, tid, b, walls in ((1, "x", 512, (37.0, 39.0, 30.0)), (2, confirm.BASELINE_ID, 2048, (27.0, 12.0, 20.0)))
        for seed, wall, steps in zip((1000, 2000, 3000), walls, (80_000, 60_000, 70_000))
    ]
    chosen = confirm.choose(confirm.summarise(runs, "wall_s"))
    assert chosen["phase2_trial_id"] == confirm.BASELINE_ID and chosen["median"] == 20.0


def test_fresh_seeds_are_new_and_distinct():
    seeds = confirm.fresh_seeds(7, 4)
    assert seeds == [1007, 2007, 3007, 4007]
    assert 7 not in seeds and len(set(seeds)) == 4


def test_cost_of_a_run_that_missed_the_target_is_infinite():
    assert confirm.run_cost(_run(1, 1, 40_000, True, wall=12.5, usd=0.02), "env_steps") == 40_000
    assert confirm.run_cost(_run(1, 1, 40_000, True, wall=12.5, usd=0.02), "wall_s") == 12.5
    assert confirm.run_cost(_run(1, 1, 40_000, True, wall=12.5, usd=0.02), "usd") == 0.02
    assert confirm.run_cost(_run(1, 1, 200_000, False), "env_steps") == math.inf
    with pytest.raises(ValueError):
        confirm.run_cost(_run(1, 1, 1, True), "return")


def test_iqm_median_and_bootstrap_interval_numbers():
    x = [1.0, 2.0, 3.0, 4.0, 100.0, 6.0, 7.0, 8.0]
    assert confirm.iqm(x) == pytest.approx(np.mean([3.0, 4.0, 6.0, 7.0]))  # trims 2 from each end
    assert confirm.iqm([5.0, 1.0, 9.0]) == pytest.approx(5.0)  # n=3: nothing trimmed
    assert confirm.median([3.0, math.inf, 1.0]) == 3.0
    assert confirm.median([1.0, math.inf]) == math.inf
    low, high = confirm.bootstrap_interval([10.0, 11.0, 12.0, 13.0, 14.0], seed=1)
    assert 10.0 <= low <= 12.0 <= high <= 14.0 and low < high
    assert confirm.bootstrap_interval([10.0, 11.0, 12.0, 13.0, 14.0], seed=1) == (low, high)  # seeded
    low, high = confirm.bootstrap_interval([5.0, math.inf, math.inf])
    assert low == 5.0 and high == math.inf
    assert confirm.bootstrap_interval([4.0, 4.0, 4.0]) == (4.0, 4.0)


def test_confirmation_chooses_by_the_median_not_the_luckiest_run():
    """Candidate 1 won phase 2 and has the single cheapest run, but on fresh seeds its median is worse."""
    runs = [
        _run(1, 1000, 20_000, True),
        _run(1, 2000, 150_000, True),
        _run(1, 3000, 200_000, False),
        _run(2, 1000, 60_000, True),
        _run(2, 2000, 55_000, True),
        _run(2, 3000, 70_000, True),
        _run(3, 1000, 200_000, False),
        _run(3, 2000, 40_000, True),
        _run(3, 3000, 200_000, False),
    ]
    table = confirm.summarise(runs, "env_steps", quantile=0.5)
    by = {c["candidate"]: c for c in table}
    assert [c["score"] for c in table] == [c["median"] for c in table]  # 0.5 of an odd count: the median
    assert by[1]["median"] == 150_000 and by[2]["median"] == 60_000 and by[3]["median"] == math.inf
    assert by[2]["iqm"] == pytest.approx(np.mean([55_000, 60_000, 70_000]))
    assert by[1]["reached"] == 2 and by[3]["reached"] == 1 and by[2]["runs"] == 3
    assert by[2]["seeds"] == [1000, 2000, 3000]
    assert by[2]["ci_low"] >= 55_000 and by[2]["ci_high"] <= 70_000
    assert confirm.choose(table)["candidate"] == 2
    # the objective decides: if candidate 1's runs cost 0.3x per env step (a cheaper batch), dollars pick it
    runs_usd = [{**r, "usd": r["env_steps"] / 1e6 * (0.3 if r["candidate"] == 1 else 1.0)} for r in runs]
    usd = confirm.summarise(runs_usd, "usd", quantile=0.5)
    assert usd[0]["median"] == pytest.approx(0.045) and usd[1]["median"] == pytest.approx(0.06)
    assert confirm.choose(usd)["candidate"] == 1
    # at the default quantile (all 3 of 3 seeds) candidate 1's miss on seed 3000 rules it out
    usd75 = confirm.summarise(runs_usd, "usd")
    assert [c["score_k"] for c in usd75] == [3, 3, 3] and usd75[0]["score"] == math.inf
    assert confirm.choose(usd75)["candidate"] == 2


def test_a_config_that_misses_on_two_of_five_seeds_loses_to_one_that_always_reaches():
    """The README sweep's case (docs/benchmarks.md): the spec's own config reached on 3 of 5 seeds with the
    lower median; the searched one on 5 of 5. On unseen seeds the searched one took 5.5 s, the spec's 12.8 s."""
    seeds = [1000, 2000, 3000, 4000, 5000]
    runs = [_run(1, s, 0, True, usd=u) for s, u in zip(seeds, (0.000285, 0.00025, 0.0003, 0.00029, 0.00031))]
    runs += [
        {**_run(2, s, 0, u < 1, usd=u), "phase2_trial_id": confirm.BASELINE_ID}
        for s, u in zip(seeds, (0.00020, 0.000247, 0.00026, 9.0, 9.0))
    ]
    assert confirm.choose(confirm.summarise(runs, "usd", quantile=0.5))["candidate"] == 2  # the median's choice
    table = confirm.summarise(runs, "usd")
    assert [(c["score_k"], c["reached"]) for c in table] == [(4, 5), (4, 3)]
    assert table[0]["score"] == pytest.approx(0.0003) and table[1]["score"] == math.inf
    assert confirm.choose(table)["candidate"] == 1
    with pytest.raises(ValueError, match="quantile"):
        confirm.score_rank(5, 0.0)
    assert [confirm.score_rank(n) for n in (1, 2, 3, 4, 5, 8, 10)] == [1, 2, 3, 3, 4, 6, 8]
    assert [confirm.score_rank(n, 0.5) for n in (1, 3, 4, 5)] == [1, 2, 2, 3]


def test_when_no_config_reaches_the_target_on_enough_seeds_the_median_then_the_return_wins():
    # 2 of 3 seeds at the target: a median, no score at 0.75 (3 of 3): the lower median wins
    some = [_run(1, s, x, x < 100_000) for s, x in ((1, 50_000), (2, 90_000), (3, 200_000))]
    some += [_run(2, s, x, x < 100_000) for s, x in ((1, 40_000), (2, 60_000), (3, 200_000))]
    table = confirm.summarise(some, "env_steps")
    assert [c["score"] for c in table] == [math.inf, math.inf] and [c["median"] for c in table] == [90_000, 60_000]
    assert confirm.choose(table)["candidate"] == 2
    # none at the target on most seeds: the higher median return
    runs = [
        {**_run(c, s, 8000, False), "episode_return_mean": ret}
        for c, s, ret in [(1, 1, 90.0), (1, 2, 40.0), (1, 3, 45.0), (2, 1, 60.0), (2, 2, 70.0), (2, 3, 20.0)]
    ]
    table = confirm.summarise(runs, "usd")
    assert [c["median"] for c in table] == [math.inf, math.inf]
    assert [c["median_return"] for c in table] == [45.0, 60.0]
    assert confirm.choose(table)["candidate"] == 2
    assert confirm.choose([]) is None


def test_phase2_searches_below_the_ladder_down_to_min_batch():
    assert ladder.search_batches([2048, 4096], start=2048, factor=2, min_batch=256) == [256, 512, 1024, 2048, 4096]
    assert ladder.search_batches([2048], start=2048, factor=2, min_batch=300) == [512, 1024, 2048]
    assert ladder.search_batches([512], start=512, factor=2, min_batch=1024) == [512]
    assert ladder.search_batches([], start=2048, factor=2, min_batch=256) == []


def test_spec_fields_of_the_confirmation():
    spec = S.from_dict({})
    s = spec.search
    assert (s.confirm_top_k, s.confirm_seeds, s.objective, s.min_batch) == (3, 5, "usd", 256)
    assert s.confirm_baseline is True
    assert S.from_dict({"search": {"confirm_baseline": False}}).search.confirm_baseline is False
    with pytest.raises(S.SpecError, match="search.confirm_baseline"):
        S.from_dict({"search": {"confirm_baseline": "maybe"}})
    with pytest.raises(S.SpecError, match="search.objective.*wall_s"):
        S.from_dict({"search": {"objective": "return"}})
    with pytest.raises(S.SpecError, match="search.confirm_seeds"):
        S.from_dict({"search": {"confirm_seeds": 0}})


def test_report_and_plot_show_every_seed_and_the_interval(tmp_path):
    """report.md's confirmation section lists each candidate's median and interval and each seed's run."""
    from test_report import write_run

    from rayrl.judge import folder, report

    root = write_run(tmp_path / "s")
    runs = [
        _run(1, 1000, 20_000, True, usd=0.002),
        _run(1, 2000, 150_000, True, usd=0.015),
        _run(1, 3000, 200_000, False, usd=0.02),
        _run(2, 1000, 60_000, True, usd=0.006, batch=512, lr=1e-3),
        _run(2, 2000, 55_000, True, usd=0.0055, batch=512, lr=1e-3),
        _run(2, 3000, 70_000, True, usd=0.007, batch=512, lr=1e-3),
    ]
    pd.DataFrame(runs, columns=runfolder.CONFIRM_COLUMNS).to_csv(root / "confirm.csv", index=False)
    table = confirm.summarise(runs, "usd")
    summary = json.loads((root / "summary.json").read_text())
    summary["confirm"] = {
        "objective": "usd",
        "seeds": [1000, 2000, 3000],
        "env_steps_budget": 200_000,
        "target_return": 400.0,
        "chosen": confirm.choose(table)["candidate"],
        "candidates": [confirm.jsonable(c) for c in table],
    }
    (root / "summary.json").write_text(json.dumps(summary))
    assert report.main([str(root)]) == 0
    text = (root / "report.md").read_text()
    section = text[text.index("## Confirmation on fresh seeds") : text.index("## Training")]
    # the chosen one, bold, score 0.007 (its worst of 3: the 0.75 quantile's ceil(2.25)-th), median 0.006
    assert "| **2** | p2 | 512 | 0.001 | 3/3 | 0.007 | 0.006 |" in section
    assert "| 1 | p1 | 2048 | 0.0003 | 2/3 | - | 0.015 |" in section  # a miss: no score
    assert section.count("| yes |") == 5 and section.count("| no |") == 1
    assert "| 1 | 3000 | c1_3000 | 200,000 |" in section
    data = (root / "plots" / "confirm.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and "(plots/confirm.png)" in text
    assert folder.load(root).confirm["reached"].sum() == 5


def _race_choice(
    true: dict[tuple[int, int], float],
    returns: dict[tuple[int, int], float],
    seeds: list[int],
    race: bool,
    tie: float = 0.0,
    quantile: float = confirm.QUANTILE,
) -> tuple[int, float]:
    """Run every (candidate, seed) in candidate-major order, cost rising by 1 per result, to its true cost
    (inf: never reaches; stops at a budget of 100); a run that reached returns ``returns[c, s]``, one cut
    short its partial return. The choice is the real one: confirm.csv rows through summarise and choose.
    Returns (chosen candidate, total cost spent)."""
    cands = sorted({c for c, _ in true})
    # the last candidate is the spec's own config (confirm_baseline), weighted by the tie allowance
    pid = {c: confirm.BASELINE_ID if c == cands[-1] else f"p{c}" for c in cands}
    r = confirm.Race(cands, seeds, confirm.weights([{"trial_id": pid[c]} for c in cands], tie), quantile)
    rows, spent = [], 0.0
    for c in cands:
        for s in seeds:
            cost, target = 0.0, true[(c, s)]
            while True:
                cost += 1.0
                if cost >= target:
                    reached = True
                    r.finish(c, s, target)
                    break
                if cost >= 100 or (race and r.should_stop(c, s, cost)):
                    reached = False
                    r.finish(c, s, math.inf)
                    break
            spent += min(cost, target)
            ret = returns[(c, s)] if reached else 400.0 * cost / 100  # a cut run's return is partial
            rows.append(
                {
                    "candidate": c,
                    "phase2_trial_id": pid[c],
                    "batch_size": 256,
                    "lr": 1e-3 * c,
                    "seed": s,
                    "env_steps": min(cost, target),
                    "reached": reached,
                    "episode_return_mean": ret,
                }
            )
    return confirm.choose(confirm.summarise(rows, "env_steps", quantile=quantile), tie)["candidate"], spent


@pytest.mark.parametrize("quantile", [0.5, 0.75])
@pytest.mark.parametrize("n_seeds", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("grid", [False, True])
def test_the_race_chooses_what_the_full_confirmation_chooses_and_spends_less(n_seeds, grid, quantile):
    """``grid``: costs on a coarse grid (env steps fall on batch multiples), so medians often tie."""
    rng = np.random.default_rng(n_seeds + 10 * grid)
    seeds = [1000 * (i + 1) for i in range(n_seeds)]
    saved, ties, by_tie = [], 0, 0
    miss = 0.2 if quantile <= 0.5 else 0.1  # at 0.75 one miss in three seeds already rules a config out
    for _ in range(120):
        k = int(rng.integers(2, 6))
        true, returns = {}, {}
        for c in range(1, k + 1):
            scale = rng.uniform(10, 60)
            for s in seeds:  # a run reaches at a noisy cost, or never (inf) with probability `miss`
                noisy = float(rng.choice([8.0, 16.0, 24.0])) if grid else float(np.ceil(scale * rng.lognormal(0, 0.5)))
                true[(c, s)] = math.inf if rng.random() < miss else noisy
                returns[(c, s)] = float(rng.uniform(450, 500))
        tie = float(rng.choice([0.0, 0.1, 0.5]))  # the spec's own config (the last) ties within this
        full, full_cost = _race_choice(true, returns, seeds, race=False, tie=tie, quantile=quantile)
        raced, raced_cost = _race_choice(true, returns, seeds, race=True, tie=tie, quantile=quantile)
        untied = confirm.choose(_table(true, seeds, k, quantile), 0.0)["candidate"]
        by_tie += full == k and tie > 0 and untied != k
        rank = confirm.score_rank(n_seeds, quantile)
        scores = [sorted(true[(c, s)] for s in seeds)[rank - 1] for c in range(1, k + 1)]
        ties += math.isfinite(min(scores)) and scores.count(min(scores)) > 1
        assert raced == full, (true, full, raced)
        assert raced_cost <= full_cost
        saved.append(1 - raced_cost / full_cost)
    if n_seeds >= 2:
        assert np.mean(saved) > 0.10  # the point of the race: the losers' runs are cut short
    if grid:
        assert ties >= 10  # the tie cases are really there
    if n_seeds >= 3:
        assert by_tie >= 3  # the spec's own config won by the tie allowance, raced and in full


def _table(
    true: dict[tuple[int, int], float], seeds: list[int], k: int, quantile: float = confirm.QUANTILE
) -> list[dict]:
    """summarise's rows for a full confirmation of ``true`` costs (last candidate: the spec's own)."""
    rows = [
        {
            "candidate": c,
            "phase2_trial_id": confirm.BASELINE_ID if c == k else f"p{c}",
            "batch_size": 256,
            "lr": 1e-3,
            "seed": s,
            "env_steps": true[(c, s)] if math.isfinite(true[(c, s)]) else 100.0,
            "reached": math.isfinite(true[(c, s)]),
            "episode_return_mean": 480.0,
        }
        for c in range(1, k + 1)
        for s in seeds
    ]
    return confirm.summarise(rows, "env_steps", quantile=quantile)


def test_the_spec_ships_when_the_best_searched_config_is_within_the_tie_allowance():
    seeds = [1, 2, 3]
    near = {(1, s): 95.0 for s in seeds} | {(2, s): 100.0 for s in seeds}  # searched 5% cheaper
    assert confirm.choose(_table(near, seeds, 2), 0.1)["phase2_trial_id"] == confirm.BASELINE_ID
    assert confirm.choose(_table(near, seeds, 2), 0.0)["candidate"] == 1
    far = {(1, s): 80.0 for s in seeds} | {(2, s): 100.0 for s in seeds}  # 20% cheaper: it ships
    assert confirm.choose(_table(far, seeds, 2), 0.1)["candidate"] == 1
    # within noise: the spec's median inside the winner's 95% interval
    spread = {(1, 1): 60.0, (1, 2): 80.0, (1, 3): 120.0} | {(2, s): 100.0 for s in seeds}
    table = _table(spread, seeds, 2, quantile=0.5)
    chosen = confirm.choose(table, 0.1)
    assert chosen["candidate"] == 1 and confirm.within_noise(chosen, table[1]) is True
    far_table = _table(far, seeds, 2)
    assert confirm.within_noise(far_table[0], far_table[1]) is False
    assert confirm.within_noise(chosen, None) is None


def test_the_race_stops_a_run_past_the_best_score_and_skips_a_config_that_cannot_win():
    r = confirm.Race([1, 2], [7, 8, 9], quantile=0.5)  # the 2nd cheapest of 3: the median
    for seed, cost in ((7, 10.0), (8, 20.0)):
        assert not r.should_stop(1, seed, cost - 1)  # no score known yet: nothing stops
        r.finish(1, seed, cost)
    assert r.bound() == 20.0  # the median of (10, 20, anything) is at most 20
    assert not r.should_stop(1, 9, 19.0)
    assert r.should_stop(1, 9, 20.5)  # censoring the best config's own worst run: its median stays 20
    assert r.why_stop(1, 9, 20.5) == "this run passed 20, so it cannot be among its config's 2 cheapest of 3"
    r.finish(1, 9, math.inf)
    assert r.bound() == 20.0
    assert not r.should_stop(2, 7, 20.0)  # at the bound, not past it: it could still tie
    assert r.should_stop(2, 7, 20.5)  # past the best score: this run cannot be among its config's cheapest two
    r.finish(2, 7, math.inf)
    assert not r.should_stop(2, 8, 5.0)  # still possible: 5 and an unstarted run could make a median below 20
    assert r.should_stop(2, 8, 21.0)
    r.finish(2, 8, math.inf)
    assert r.lowest_score(2) == math.inf
    assert r.should_stop(2, 9, 0.5)  # two runs out: the config cannot win, its last run stops at once
    assert r.why_stop(2, 9, 0.5) == "its config's score can no longer beat the best score so far (20)"
    # the default quantile on 5 seeds: the 4th cheapest; nothing is bounded until a config has 4 finished
    q = confirm.Race([1, 2], [1, 2, 3, 4, 5])
    assert q.k == 4
    for seed, cost in ((1, 10.0), (2, 12.0), (3, 30.0)):
        q.finish(1, seed, cost)
    assert q.bound() == math.inf and not q.should_stop(2, 1, 35.0)
    q.finish(1, 4, 40.0)
    assert q.bound() == 40.0  # (10, 12, 30, 40, anything): the 4th cheapest is at most 40
    assert not q.should_stop(2, 1, 35.0)  # above the median's 30, still below the score's bound
    assert q.should_stop(2, 1, 40.5)
    q.finish(2, 1, math.inf)
    assert not q.should_stop(2, 2, 1.0)  # one miss of five: the other four could still score below 40
    q.finish(2, 2, math.inf)
    assert q.lowest_score(2) == math.inf and q.should_stop(2, 3, 1.0)  # two misses: out
    # a race pickled by an older rayrl ranked by the median
    old = confirm.Race.__new__(confirm.Race)
    old.__setstate__({"seeds": [1, 2, 3], "runs": {1: {s: [0.0, False, math.inf] for s in (1, 2, 3)}}})
    assert old.k == 2 and old.weights == {}


def test_confirm_stopper_stops_at_target_budget_and_race_and_names_why():

    points = [
        (1, 512, 3e-4, 11),
        (1, 512, 3e-4, 12),
        (1, 512, 3e-4, 13),
        (2, 1024, 1e-4, 11),
        (2, 1024, 1e-4, 12),
        (2, 1024, 1e-4, 13),
    ]

    stop = _stopper(points, quantile=0.5)  # the median of 3; the default 0.75 ranks by the worst of 3 (below)

    def res(batch, lr, seed, steps, ret):
        return {
            "num_env_steps_sampled_lifetime": steps,
            "rayrl": {"train_return": ret},
            "time_total_s": 1.0,
            "config": {"train_batch_size_per_learner": batch, "lr": lr, "seed": seed},
        }

    assert not stop("a", res(512, 3e-4, 11, 1000, 200.0))
    assert stop("a", res(512, 3e-4, 11, 2000, 460.0))  # target
    assert stop("b", res(512, 3e-4, 12, 10_000, 300.0))  # budget
    assert stop("c", res(512, 3e-4, 13, 3000, 451.0))
    assert stop.race.bound() == 3000.0  # median of (2000, 3000, inf)
    assert not stop("d", res(1024, 1e-4, 11, 3000, 100.0))
    assert stop("d", res(1024, 1e-4, 11, 4096, 100.0))  # past 3000: cannot win
    assert confirm.stop_reason(False, False, 4096, 10_000) == "race"
    assert confirm.stop_reason(False, False, 10_000, 10_000) == "budget"
    assert confirm.stop_reason(True, False, 2000, 10_000) == "target"
    assert confirm.stop_reason(False, True, 2000, 10_000) == "error"
    # Reached, then an error while stopping: the race counted the reach, so confirm.csv does too.
    assert confirm.stop_reason(True, True, 2000, 10_000) == "target"
    off = _stopper(points, race=False)
    assert not off("d", res(1024, 1e-4, 11, 9000, 100.0)) and off("d", res(1024, 1e-4, 11, 10_000, 100.0))
    worst = _stopper(points)
    assert worst.race is not None and worst.race.k == 3  # the default quantile: all three seeds must reach
    assert worst("a", res(512, 3e-4, 11, 2000, 460.0)) and worst("b", res(512, 3e-4, 12, 10_000, 300.0))
    assert worst.race.bound() == math.inf and not worst("d", res(1024, 1e-4, 11, 9000, 100.0))
    with pytest.raises(KeyError, match="no planned run"):
        stop("x", res(2048, 1e-4, 11, 100, 1.0))


def test_runs_of_a_config_the_race_ruled_out_are_never_started(tmp_path):
    """PlannedRuns asks the stopper before each planned run: once a config cannot win, its remaining seeds
    are passed over (each would have cost a trial's start and build before the race could stop it), and
    confirm.csv still gets their rows, as misses at no cost stopped by the race."""
    from ray.tune.search import Searcher

    from rayrl.sweep.confirm_run import CANDIDATE_KEY, never_started
    from rayrl.sweep.search import PlannedRuns

    seeds = [11, 12, 13]
    plan = [(1, 512, 3e-4), (2, 1024, 1e-4), (3, 2048, 3e-4)]
    points = [
        {CANDIDATE_KEY: c, "seed": s, "train_batch_size_per_learner": b, "lr": lr} for c, b, lr in plan for s in seeds
    ]
    stop = _stopper(
        [(p[CANDIDATE_KEY], p["train_batch_size_per_learner"], p["lr"], p["seed"]) for p in points], quantile=0.5
    )
    searcher = PlannedRuns(points, stop.skip)
    # what each started run does, in env steps per result: candidate 1 reaches at 2000 on every seed;
    # candidate 2 does not reach by 4096 on its first two seeds; candidate 3 reaches at 1000
    reach = {1: 2000, 2: math.inf, 3: 1000}
    started = []
    while (point := searcher.suggest(f"t{len(started)}")) != Searcher.FINISHED:
        started.append((point[CANDIDATE_KEY], point["seed"]))
        steps = 0
        while True:
            steps += 1024
            ret = 460.0 if steps >= reach[point[CANDIDATE_KEY]] else 100.0
            result = {"num_env_steps_sampled_lifetime": steps, "rayrl": {"train_return": ret}, "config": point}
            if stop(f"t{len(started)}", result):
                break
    # candidate 2's first seed ran past the best median (2048) and stopped; its second ran and stopped too;
    # then two misses of three: it cannot win, so its third seed was never started
    assert started == [(1, 11), (1, 12), (1, 13), (2, 11), (2, 12), (3, 11), (3, 12), (3, 13)]
    assert stop.race is not None and stop.race.runs[2][13][1:] == [True, math.inf]  # counted as a miss
    planned = {(c, s) for c, _, _ in plan for s in seeds}
    candidates = [{"trial_id": f"p{c}", "batch_size": b, "lr": lr} for c, b, lr in plan]
    rows = never_started(planned - set(started), candidates, [])
    assert [(r["candidate"], r["seed"], r["env_steps"], r["reached"], r["stopped"]) for r in rows] == [
        (2, 13, 0, False, "race")
    ]
    assert rows[0]["batch_size"] == 1024 and rows[0]["phase2_trial_id"] == "p2"
    # the skip is not pickled with the experiment; a restored searcher keeps this start's
    path = str(tmp_path / "searcher.pkl")
    searcher.save(path)
    fresh = PlannedRuns(points, stop.skip)
    fresh.restore(path)
    assert fresh.next == len(points) and fresh.skip == stop.skip
    bare = PlannedRuns(points)
    bare.restore(path)
    assert bare.skip is None


def _stopper(points, seeds=(11, 12, 13), **kw):
    """A ConfirmStopper of ``points`` (candidate, batch, lr, seed) on env steps to return 450, budget 10,000."""
    from rayrl.sweep.confirm_run import ConfirmStopper
    from rayrl.tune.resources import trial_resources

    return ConfirmStopper(
        points,
        list(seeds),
        objective="env_steps",
        return_key="rayrl/train_return",
        target=450.0,
        budget=10_000,
        held=trial_resources(S.ResourcesSpec()),
        prices=S.CostSpec(),
        **kw,
    )
