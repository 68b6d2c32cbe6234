"""benchmarks/gpu_check.py on a machine without CUDA: it skips cleanly, its arguments are checked, its
verdicts follow the figures, and its fp16/bf16 learner measurement runs (on the CPU here).

The GPU paths themselves (NCCL learners, CUDA autocast, NVML) run only on a GPU machine:
`python -m benchmarks.gpu_check` there.
"""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks import gpu_check as G

NO_CUDA = not torch.cuda.is_available()


@pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA: the script runs its checks instead")
def test_without_cuda_the_script_says_skipped_and_exits_0(capsys):
    assert G.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gpu_check: no CUDA device: skipped") and len(out.strip().splitlines()) == 1
    assert G.main(["--require-gpu"]) == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--iters", "1"], "--iters must be >= 2"),
        (["--batch", "0"], "--batch must be >= 1"),
        (["--batch", "512", "--minibatch", "1024"], "--minibatch 1024 is larger than --batch 512"),
        (["--learners", "0"], "--learners must be >= 1"),
        (["--load-s", "0"], "--load-s must be in"),
    ],
)
def test_bad_arguments_exit_2_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        G.parse(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_learner_plan_two_gpus_or_one_with_a_note():
    assert G.plan_learners(8, None) == (2, [])
    assert G.plan_learners(2, None) == (2, [])
    n, notes = G.plan_learners(1, None)
    assert n == 1 and len(notes) == 1 and "world size 1" in notes[0]
    assert G.plan_learners(8, 4) == (4, [])
    with pytest.raises(ValueError, match="--learners 3: this machine has 2 GPU"):
        G.plan_learners(2, 3)


def nccl_facts(**changes):
    facts = {
        "learners": 2,
        "batch": 8192,
        "iters": 4,
        "backend": "nccl",
        "devices": ["cuda"],
        "weights_equal": True,
        "learner_samples_per_s": 90_000.0,
        "env_steps_per_s": 4_000.0,
        "nonfinite_steps": 0.0,
        "gpu_util": 0.6,
    }
    return {**facts, **changes}


def test_nccl_verdicts_follow_the_facts():
    verdicts = lambda facts: [r[3] for r in G.nccl_rows(facts)]  # noqa: E731
    assert verdicts(nccl_facts()) == ["ok", "ok", "ok"]
    assert verdicts(nccl_facts(backend="gloo")) == ["FAIL", "ok", "ok"]  # learners fell back to gloo
    assert verdicts(nccl_facts(devices=["cpu", "cuda"])) == ["FAIL", "ok", "ok"]
    assert verdicts(nccl_facts(weights_equal=False)) == ["ok", "FAIL", "ok"]  # DDP let them drift
    assert verdicts(nccl_facts(gpu_util=math.nan)) == ["ok", "ok", "FAIL"]  # NVML missing in results
    assert verdicts(nccl_facts(gpu_util=1.7)) == ["ok", "ok", "FAIL"]  # not a fraction
    assert [r[0] for r in G.nccl_rows(nccl_facts(learners=1))] == ["NCCL learners", "NVML in results"]


def test_nvml_verdict_wants_fractions_and_a_visible_load():
    idle = {"gpu_util": 0.0, "gpu_mem_util": 0.01}
    assert G.nvml_row(idle, {"gpu_util": 0.97, "gpu_mem_util": 0.02}, 3.0)[3] == "ok"
    assert G.nvml_row(idle, {"gpu_util": 0.0, "gpu_mem_util": 0.02}, 3.0)[3] == "FAIL"  # load not seen
    assert G.nvml_row(idle, {"gpu_util": math.nan, "gpu_mem_util": 0.02}, 3.0)[3] == "FAIL"  # no NVML
    assert G.nvml_row(idle, {"gpu_util": 97.0, "gpu_mem_util": 0.02}, 3.0)[3] == "FAIL"  # percent, not fraction


def test_precision_verdicts_want_a_power_of_two_fp16_scale_and_no_nonfinite_step():
    def figures(**fp16):
        fp32 = {"samples_per_s": 1000.0, "ratio_vs_fp32": 1.0, "loss_scale": math.nan, "nonfinite_steps": 0.0}
        return {
            "fp32": fp32,
            "bf16": {**fp32, "ratio_vs_fp32": 1.4},
            "fp16": {**fp32, "ratio_vs_fp32": 1.3, "loss_scale": 32768.0, **fp16},
        }

    verdicts = lambda res: [r[3] for r in G.precision_rows(res, "cuda")]  # noqa: E731
    assert verdicts(figures()) == ["ok", "ok", "ok"]
    assert verdicts(figures(loss_scale=math.nan)) == ["ok", "ok", "FAIL"]  # no dynamic loss scaling
    assert verdicts(figures(loss_scale=3000.0)) == ["ok", "ok", "FAIL"]  # not a scaler's power of two
    assert verdicts(figures(nonfinite_steps=2.0)) == ["ok", "ok", "FAIL"]
    res = figures()
    res["bf16"]["loss_scale"] = 1.0
    assert verdicts(res) == ["ok", "FAIL", "ok"]  # bf16 needs no scaler
    assert "1.30x fp32" in G.precision_rows(figures(), "cuda")[2][2]


@pytest.mark.slow
def test_the_precision_measurement_runs_on_cpu_and_reports_the_loss_scale():
    """The fp32/bf16/fp16 learner measurement the script runs on cuda, here on the CPU (tiny sizes)."""
    torch.set_num_threads(1)
    args = G.parse(["--batch", "256", "--minibatch", "128", "--hidden", "32", "32", "--rounds", "1"])
    res = G.measure_precision("cpu", args)
    assert set(res) == {"fp32", "bf16", "fp16"}
    assert res["fp32"]["ratio_vs_fp32"] == 1.0 and all(r["samples_per_s"] > 0 for r in res.values())
    assert all(r["nonfinite_steps"] == 0 for r in res.values())
    assert math.isnan(res["fp32"]["loss_scale"]) and math.isnan(res["bf16"]["loss_scale"])
    assert res["fp16"]["loss_scale"] == 65536.0  # the learner's initial scale, no overflow in 2 x 2 steps
    rows = G.precision_rows(res, "cpu")
    assert [r[0] for r in rows] == ["fp32 learner", "bf16 learner", "fp16 learner"]
    assert [r[3] for r in rows] == ["ok", "ok", "ok"], rows
    table = G.C.table(G.HEADERS, rows)
    assert table.splitlines()[0].startswith("| check") and "loss scale 65536" in table
