"""`python experiments/sweep.py`: parse, check everything the user gave, then run the sweep."""

from __future__ import annotations

import sys

from rayrl import runfolder, runtime
from rayrl.args import Parser, add_run_args, fail
from rayrl.errors import EXIT_USAGE, UserError
from rayrl.observe.output import apply_output
from rayrl.storage.files import explain
from rayrl.sweep.config import SweepError, load_spec

PROG = "experiments/sweep.py"
DESCRIPTION = (
    "The rayrl sweep. The ladder measures env steps/s at batch 2048, 4096, ... (the doubling rule: stop when "
    "a doubling gains < 15% or at the cap) to find the knee; the search runs ASHA (or HyperBand) with Optuna "
    "TPE over lr and the batch sizes up to the knee (and below the start, down to search.min_batch), by "
    "episode return; then confirm runs the top search.confirm_top_k configs and the spec's own batch and lr "
    "(search.confirm_baseline) again on fresh seeds and the lowest cost (search.objective) within which "
    "3/4 of a config's seeds reach the target (search.confirm_quantile) wins; a run stops once its config can "
    "no longer win (search.confirm_race). Results: "
    "STORAGE/NAME/ (doubling.csv, trials.csv, confirm.csv, best_config.yaml, summary.json). The same command "
    "again resumes."
)


def parser() -> Parser:
    p = Parser(prog=PROG, description=DESCRIPTION)
    add_run_args(p, default_config="experiments/configs/cartpole_ppo.yaml")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny budgets: the whole sweep, confirmation included, "
        "in a few minutes on 2 cores (docs/benchmarks.md has the measured time); sampling and "
        "evaluation in the trial's own process (--set overrides still apply on top)",
    )
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs for a local Ray (default: all)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 done, 1 the sweep could not finish (the message says why), 2 bad input, 130 interrupted."""
    args = parser().parse_args(argv)
    try:
        apply_output(args)
        spec = load_spec(args.config, args.overrides, tiny=args.smoke)
        paths = runtime.resolve(args.storage, args.name or spec.name, args.allow_shared_run_dir)
    except UserError as exc:
        fail(str(exc), "sweep")
        return EXIT_USAGE
    # The runner imports Ray, RLlib and Tune: only once the input is known to be good.
    from rayrl.sweep.run import run
    from rayrl.tune import resources
    from rayrl.tune.tuner import check_run_states

    try:
        with runtime.claim(paths):
            check_run_states(paths, runfolder.SWEEP_DIRS)  # before Ray starts
            if runtime.init_ray(None, args.num_cpus):
                why = resources.trial_misfit(runtime.cluster_resources(), resources.of_spec(spec))
                if why:
                    raise SweepError(why)
            runtime.record_posture(paths)
            summary = run(spec, paths)
    except SweepError as exc:
        fail(str(exc), "sweep")
        return 1
    except UserError as exc:  # the name is held by a live run, or a damaged run folder found on resume
        fail(str(exc), "sweep")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("\nsweep: interrupted; run the same command again to resume.\n")
        return 130
    except Exception as exc:  # a full disk or a failed upload: one paragraph, files intact, resumable
        err = explain(exc, paths.run_dir)
        if err is None:
            raise
        sys.stderr.write(f"sweep: error: {err.strerror}\n")
        return 1
    best = summary["best"]
    if best is None:
        what = "evaluation" if spec.judged_by == "evaluation" else "episode"
        print(
            f"[sweep] no search trial finished an {what} within search.max_env_steps "
            f"({spec.search.max_env_steps:,}), so there is no return to pick the best by; raise "
            f"search.max_env_steps (episodes of this env may be long) and see "
            f"{paths.run_dir / runfolder.PHASE_DIRS[runfolder.SEARCH]}",
            flush=True,
        )
        return 1
    from rayrl.sweep.closing import closing_summary

    trials_csv, doubling_csv = paths.run_dir / runfolder.TRIALS, paths.run_dir / runfolder.DOUBLING
    trials = runfolder.read_trials(trials_csv) if trials_csv.is_file() else []
    ladder = runfolder.read_doubling(doubling_csv) if doubling_csv.is_file() else []
    print(closing_summary(summary, ladder, trials, paths.run_dir), flush=True)
    return 0
