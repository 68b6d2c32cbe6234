"""`rayrl drill` refuses what it cannot run before it runs anything (no Ray started, nothing written)."""

from __future__ import annotations

from test_report import SPEC, write_run

from rayrl.faults import drill


def test_a_spec_needing_more_gpus_than_this_machine_is_refused_before_any_drill(tmp_path, capsys):
    spec = dict(SPEC, resources={"learners": 16, "gpus_per_learner": 8, "env_runners": 1})  # 128 GPUs
    run_dir = write_run(tmp_path / "gpu-run", kind="train", spec=spec)
    before = sorted(p.name for p in run_dir.iterdir())
    assert drill.main([str(run_dir)]) == drill.EXIT_USAGE
    err = " ".join(capsys.readouterr().err.split())
    assert "needs 128 GPU(s) per trial" in err and "--address" in err
    assert sorted(p.name for p in run_dir.iterdir()) == before  # no drills/, no drill.json
