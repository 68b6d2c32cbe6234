"""benchmarks/fault_table.py: its arguments, its arithmetic of what a fault cost (from made-up rows),
its table; and, slow, one cheap fault end to end (the S3 server refusing connections for 3 s)."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import fault_table as F


def rows(*points: tuple[float, int]) -> list[F.Row]:
    """Rows at (time, iteration), 512 env steps per iteration."""
    return [F.Row(t, it, 512 * it) for t, it in points]


# ---- arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--faults", "s3_down,nope"], "--faults: 'nope' is not a fault"),
        (["--faults", ","], "--faults: nothing is not a fault"),
        (["--iters", "5"], "--iters: 5 leaves no iterations after the fault"),
        (["--outage-s", "0"], "--outage-s: 0 is out of range"),
        (["--put-delay-s", "nan"], "--put-delay-s: nan is out of range"),
        (["--lock-stale-s", "2"], "--lock-stale-s: 2 is out of range"),
        (["--slow-s", "abc"], "argument --slow-s: invalid float value"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_arguments_exit_2_with_one_paragraph(argv, said, capsys):
    with pytest.raises(SystemExit) as exc:
        F.parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1


def test_work_and_out_must_be_usable(tmp_path, capsys):
    afile = tmp_path / "f"
    afile.write_text("")
    with pytest.raises(SystemExit) as exc:
        F.parse_args(["--work", str(afile)])
    assert exc.value.code == 2 and "exists and is not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        F.parse_args(["--out", str(tmp_path)])
    assert exc.value.code == 2 and "--out:" in capsys.readouterr().err


def test_faults_keep_the_order_given_and_drop_repeats():
    args = F.parse_args(["--faults", "sigkill_upload, s3_down,sigkill_upload"])
    assert args.names == ["sigkill_upload", "s3_down"]
    assert F.parse_args([]).names == list(F.FAULTS) and len(F.FAULTS) == 7


# ---- what a fault cost ----------------------------------------------------------------------


def test_a_restore_counts_the_iterations_and_env_steps_trained_twice():
    # Iterations 1-7 before a kill at t=10; the rerun restores the checkpoint of iteration 5 and goes on.
    before = rows(*[(t, t) for t in range(1, 8)])
    after = rows((30, 6), (31, 7), (32, 8))
    iters, env = F.redone(before + after, since=10)
    assert iters == 7 - 6 + 1 == 2
    assert env == 512 * 7 - 512 * 5  # from the restored point (iteration 5) to the last before


def test_a_fresh_start_redoes_everything_and_nothing_before_the_fault_counts():
    history = rows((1, 1), (2, 2), (3, 3), (4, 1), (5, 2), (20, 1), (21, 2))
    # the regression at t=4 came before the fault at t=10: only the one at t=20 counts
    assert F.redone(history, since=10) == (2, 1024)
    assert F.redone(rows((1, 1), (2, 2), (3, 3)), since=0) == (0, 0)  # no fault, nothing redone


def test_a_crash_loop_counts_every_retry():
    # retried from iteration 4's checkpoint three times, each trained 5 again before failing
    history = rows((1, 3), (2, 4), (3, 5), (11, 5), (21, 5), (31, 5), (32, 6))
    assert F.redone(history, since=2.5) == (3, 3 * 512)


def test_a_restore_to_an_iteration_never_seen_estimates_its_env_steps():
    # the run's lines before the fault began at iteration 6 (an earlier session): iteration 4 was not seen
    history = [F.Row(1, 6, 3000), F.Row(2, 7, 3500), F.Row(3, 8, 4000), F.Row(9, 5, 2500)]
    assert F.redone(history, since=5) == (4, 4000 - (2500 - 500))


def test_the_restore_point_and_the_history_rows_lost_beyond_the_allowed_lag():
    history = rows((1, 1), (2, 2), (3, 3), (4, 4), (14, 5), (15, 6), (40, 5), (41, 6))
    assert F.first_restore(history, since=20) == 5  # trained iteration 5 again: restored checkpoint_000003
    assert F.first_restore(history, since=50) is None
    assert F.first_restore(rows((1, 1), (9, 1)), since=5) == 1  # a fresh start
    # a rerun restoring the newest checkpoint goes on counting: its process's first row is the restore
    assert F.first_restore(rows((1, 3), (2, 4), (30, 5)), since=10, starts=[0, 20]) == 5
    assert F.first_restore(rows((1, 3), (2, 4), (30, 5)), since=10) is None
    # the fault at t=16: rows 2-6 never reached the bucket; those written more than 10 s before it count
    assert F.rows_lost_late(history, [2, 3, 4, 5, 6], t_fault=16, allowed_s=10) == [2, 3, 4]
    assert F.rows_lost_late(history, [5, 6], t_fault=16, allowed_s=10) == []
    assert F.spans([7, 2, 3, 4, 9, 10]) == "2-4, 7, 9-10" and F.spans([]) == ""


def test_a_tier1_manifest_is_known_in_the_bucket_by_its_etag(tmp_path):
    import hashlib

    data = b'{"files": {}}'
    single, multipart = hashlib.md5(data).hexdigest(), hashlib.md5(hashlib.md5(data).digest()).hexdigest() + "-1"
    assert F.etags(data) == {single, multipart}
    folder = tmp_path / "PPO_1-abc" / "checkpoint_000004"
    folder.mkdir(parents=True)
    (folder / "rayrl_manifest.json").write_bytes(data)
    (tmp_path / "PPO_1-abc" / "checkpoint_000005").mkdir()  # no manifest yet: not complete
    assert F.tier1_manifests(tmp_path) == {4: {single, multipart}}


def test_recovery_pause_and_pace():
    history = rows((1, 1), (2, 2), (3, 3), (40, 4), (41, 5))
    assert F.training_again(history, after=30) == 40
    assert F.training_again(history, after=50) is None
    assert F.longest_pause(history, since=3.5, until=41) == 37  # from iteration 3 to iteration 4
    assert F.longest_pause(history, since=3.5, until=60) == 37
    assert F.longest_pause(rows((1, 1)), since=2, until=30) == 29  # never trained again: to the end
    assert F.usual_gap(history, until=10) == 1.0
    assert math.isnan(F.usual_gap(rows((1, 1)), until=10))


def test_rows_are_read_from_the_verbose_lines_only():
    assert F.parse_row("[train     11s] | iter 12 | env steps 6,145 | 667 steps/s | return 19.9", 5.0) == F.Row(
        5.0, 12, 6145
    )
    closing = "[train 33s] run finished: used its 5,120 env-step budget | iter 10 | env steps 5,126 |"
    assert F.parse_row(closing, 1) is None
    assert F.parse_row("(PPO pid=1) [rayrl] checkpoint upload failed", 1) is None


def test_the_error_paragraph_is_the_rayrl_line_else_the_last_line():
    text = "noise\n(PPO pid=3) warning\nrayrl train: error: could not write x: the disk (or quota) is full.\n"
    assert F.error_paragraph(text) == "rayrl train: error: could not write x: the disk (or quota) is full."
    assert F.error_paragraph("a\nTraceback\nOSError: boom\n") == "OSError: boom"
    assert F.error_paragraph("") == ""
    worker = "\x1b[36m(PPO pid=7)\x1b[0m checkpoint upload refused"
    assert F.error_paragraph("rayrl train: error: refused.\n" + worker) == "rayrl train: error: refused."


def test_a_run_ends_with_the_paragraph_when_no_traceback_follows_it():
    logged = "ERROR tune -- Trial failed\nTraceback (most recent call last):\n  x\nStorageRefused: no\n"
    assert F.ended_with_paragraph(logged + "rayrl train: error: could not write h.csv: ACCESS_DENIED.\n")
    assert not F.ended_with_paragraph("rayrl train: error: x\n" + logged)
    assert not F.ended_with_paragraph(logged)
    assert F.ended_with_paragraph("[rayrl] s3://b/run: this run lost its lock: no renewal succeeded for 9 s.")


def test_a_verdict_lists_the_checks_that_did_not_hold():
    out = F.judged({}, [(True, "resumed"), (False, "the bucket is whole"), (False, "no traceback")])
    assert out["verdict"] == "FAIL" and out["why"] == "not: the bucket is whole; not: no traceback"
    assert F.judged({}, [(True, "resumed")])["verdict"] == "ok"


# ---- the table ------------------------------------------------------------------------------


def test_the_table_has_one_line_per_fault_with_its_figures_and_verdict():
    measured = {
        "what": "S3 server down",
        "injected": "every connection refused for 30 s",
        "files_lost": 1,
        "lost": ["checkpoint_000004 (queued at the fault, never in the bucket)"],
        "iterations_redone": 3,
        "env_steps_redone": 1536,
        "recovery_s": 44.25,
        "recovery_to": "training again",
        "longest_pause_s": 41.04,
        "verdict": "FAIL",
        "why": "not: the run went on through the outage",
    }
    stop = {**measured, "what": "permanent AccessDenied", "recovery_to": "clear stop", "lost": [], "files_lost": 0}
    stop.update(verdict="ok", why="", recovery_s=12.0)
    skipped = {"what": "tier-1 disk full", "injected": "tmpfs", "verdict": "skipped", "why": "needs root"}
    went_on = {**stop, "what": "tier-1 disk full", "recovery_s": None, "recovery_to": "did not stop"}
    text = F.C.table(F.HEADERS, F.table_rows([measured, stop, skipped, went_on]))
    lines = text.splitlines()
    assert len(lines) == 2 + 4 and lines[0].startswith("| fault")
    assert "| did not stop " in lines[5]
    assert "| 1 (checkpoint_000004 (queued at the fault, never in the bucket)) |" in lines[2]
    assert "| 3 " in lines[2] and "| 1536 " in lines[2] and "| 44.2 " in lines[2] and "| 41.0 " in lines[2]
    assert lines[2].rstrip(" |").endswith("FAIL (not: the run went on through the outage)")
    assert "12.0 to the stop" in lines[3] and lines[3].rstrip(" |").endswith("ok")
    assert "skipped: needs root" in lines[4]


# ---- one fault, end to end ------------------------------------------------------------------


@pytest.mark.slow
def test_s3_down_for_3_s_end_to_end_and_a_second_run_keeps_the_row(tmp_path, capsys):
    work, out = tmp_path / "work", tmp_path / "f.json"
    argv = ["--faults", "s3_down", "--outage-s", "3", "--work", str(work), "--out", str(out)]  # --iters' default
    assert F.main(argv) == 0
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert data["machine"]["nproc"] and data["settings"]["faults"] == ["s3_down"]
    assert row["fault"] == "s3_down" and row["verdict"] in ("ok", "FAIL"), row
    assert row["exit_codes"][0] is not None and row["iterations_total"] >= F.parse_args([]).iters
    assert row["last_iteration_before"] >= F.STEADY_ROWS
    assert row["recovery_s"] is not None and row["recovery_s"] >= 3  # training again only after the outage
    assert row["longest_pause_s"] >= row["usual_gap_s"] > 0
    assert row["bucket"]["checkpoints"] and row["iterations_redone"] >= 0
    assert "| S3 server down |" in capsys.readouterr().out
    # Measured once: the second run keeps the row (no training), and says so.
    assert F.main(argv) == 0
    assert "kept from" in capsys.readouterr().out
    assert json.loads(out.read_text())["rows"] == [row]


def test_a_manifest_listed_after_the_watchers_last_look_is_still_seen_landing():
    """outcome() looks once more before judging: a manifest that landed in the watcher's last second
    must not be reported as never in the bucket."""

    class Client:
        keys: list[str] = []

        def get_paginator(self, name):
            client = self

            class Pages:
                def paginate(self, **kwargs):
                    return [
                        {"Contents": [{"Key": kwargs["Prefix"] + k, "Size": 1, "ETag": '"e1"'} for k in client.keys]}
                    ]

            return Pages()

    client = Client()
    bucket = F.Bucket(client, "run/train")
    bucket.stop()  # the watcher has taken its last look
    client.keys = ["tune/PPO_1-abc/checkpoint_000004/rayrl_manifest.json"]
    assert bucket.landed(4, {"e1"}) is None
    bucket.look()
    assert bucket.landed(4, {"e1"}) is not None and bucket.landed(4, {"other"}) is None
