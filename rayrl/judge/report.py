"""`rayrl report RUN_DIR`: report.md + plots/*.png, the five-part acceptance check of a run folder.

This module loads the folder, renders the markdown and runs the CLI; the rules are in
rayrl.judge.acceptance, what they judge in rayrl.judge.evaluation, the figures in rayrl.judge.plots. Everything is
rendered in memory before any file is replaced, so a bad folder (exit 2) leaves earlier output
untouched. See docs/observability.md for every definition.
"""

from __future__ import annotations

import argparse
import io
import math
import numbers
import sys
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from rayrl import runfolder
from rayrl.errors import EXIT_USAGE
from rayrl.judge import security
from rayrl.judge.acceptance import FAIL, PARTS, Check, part_verdicts
from rayrl.judge.evaluation import evaluate, ladder_costs, run_costs
from rayrl.judge.folder import RunFolder, RunFolderError, load, subject_history
from rayrl.judge.plots import figures
from rayrl.observe import cost, keys
from rayrl.storage.files import write_local
from rayrl.storage.mirror import publish

# ---------------------------------------------------------------------------------------------
# report.md


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    esc = lambda v: str(v).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(esc(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _fmt(v: Any, spec: str = ",.4g") -> str:
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        return format(v, spec) if math.isfinite(v) else "-"
    return "-" if v is None or v is pd.NA else str(v)


def render(run: RunFolder, checks: Sequence[Check], plots: Iterable[str], baseline: RunFolder | None = None) -> str:
    """report.md's text."""
    s = run.summary
    parts = part_verdicts(checks)
    out = [f"# rayrl report: {run.name}", "", "## Summary", ""]
    rows = [
        ("kind", run.kind),
        ("env", (run.spec.get("env") or {}).get("id", "-")),
        ("algorithm", (run.spec.get("algo") or {}).get("name", "-")),
    ]
    if run.kind == "sweep":
        best = s.get("best") or {}
        rows += [
            ("knee batch size", _fmt(s.get("knee_batch_size"), "d")),
            (
                "best",
                f"batch {_fmt(best.get('batch_size'), 'd')}, lr {_fmt(best.get('lr'), '.3g')}, return "
                f"{_fmt(best.get('episode_return_mean'), '.1f')} after "
                f"{_fmt(best.get('env_steps'), ',.0f')} env steps",
            ),
            ("trials", _fmt(s.get("trials"))),
            ("stopped early", _fmt(s.get("stopped_early"))),
        ]
        if best.get("confirmed"):
            lo, hi = best.get("ci95_cost") or (None, None)
            rows.append(
                (
                    "confirmed on fresh seeds",
                    (
                        f"{best.get('objective')} to target on {best['score_seeds']} seeds "
                        f"{_fmt(best.get('score_cost'))}; "
                        if best.get("score_seeds")
                        else ""
                    )
                    + f"median {best.get('objective')} to target "
                    f"{_fmt(best.get('median_cost'))} (95% interval {_fmt(lo)} .. {_fmt(hi)}, IQM "
                    f"{_fmt(best.get('iqm_cost'))}); {best.get('seeds_at_target')} seeds reached it; median "
                    "return and env steps above",
                )
            )
    rows.append(
        (
            "return judged by",
            f"{run.judged_by} (history.csv {run.return_column}: best trial, stop criterion, reward part)",
        )
    )
    rows += [
        ("env steps", _fmt(s.get("env_steps_total", s.get("env_steps")), ",.0f")),
        ("wall time (s)", _fmt(s.get("wall_s"), ",.0f")),
    ]
    if baseline is not None:
        rows.append(("baseline", str(baseline.path)))
    out += [_table(rows, ("", "")), ""]
    out += [f"- note: {n}" for n in run.notes] + ([""] if run.notes else [])

    out += [
        "## Acceptance",
        "",
        _table([(p, parts[p]) for p in PARTS], ("part", "verdict")),
        "",
        _table(
            [(c.part, c.name, c.threshold, c.measured, c.verdict) for c in checks],
            ("part", "check", "threshold", "measured", "verdict"),
        ),
        "",
    ]

    rc = run_costs(run)
    p = run.prices
    out += [
        "## Cost",
        "",
        f"Prices: ${p.gpu_hour_usd:g}/GPU-hour, ${p.cpu_hour_usd:g}/CPU-hour, spot discount "
        f"{p.spot_discount:.0%}; each trial holds {rc['gpus_per_trial']:g} GPU and {rc['cpus_per_trial']:g} CPU.",
        "",
        _table(
            [
                ("trial-hours", _fmt(rc["trial_hours"], ".3f")),
                ("run cost (USD)", _fmt(rc["usd"], ",.4f")),
                ("env steps trained", _fmt(rc["env_steps"], ",.0f")),
                ("USD per million samples", _fmt(cost.per_million(rc["usd_per_sample"]))),
            ],
            ("", ""),
        ),
        "",
    ]
    ladder = ladder_costs(run)
    out += ["## Throughput ladder", ""]
    if ladder is None:
        out += ["Not applicable: a train run has no doubling ladder (run a sweep for one).", ""]
    else:
        out += [
            _table(
                [
                    (
                        int(r.batch_size),
                        _fmt(r.env_steps_per_s, ",.0f"),
                        _fmt(r.gain, "+.1%"),
                        r.decision,
                        _fmt(r.usd_per_m_samples),
                        _fmt(r.change_vs_first, "+.1%"),
                    )
                    for r in ladder.itertuples()
                ],
                ("batch", "env steps/s", "gain", "decision", "USD / M samples", "vs first rung"),
            ),
            "",
        ]
    out += ["## Trials", ""]
    if run.trials is None:
        out += ["Not applicable: a train run is one trial (see Training).", ""]
    elif run.trials.empty:
        out += ["No search trial reported.", ""]
    else:
        t = run.trials.sort_values("episode_return_mean", ascending=False)
        out += [
            _table(
                [
                    (
                        r.trial_id,
                        int(r.batch_size),
                        _fmt(r.lr, ".3g"),
                        _fmt(r.env_steps, ",.0f"),
                        _fmt(r.episode_return_mean, ".1f"),
                        r.status,
                    )
                    for r in t.itertuples()
                ],
                ("trial", "batch", "lr", "env steps", "return", "status"),
            ),
            "",
        ]
    out += confirmation_section(run)
    subject = subject_history(run)
    out += ["## Training", ""]
    if subject.empty:
        out += ["No iterations of the judged trial in history.csv.", ""]
    else:
        last = subject.iloc[-1]
        out += [
            _table(
                [
                    ("trial", last["trial_id"]),
                    ("iterations", _fmt(last[keys.ITERATION], ",.0f")),
                    ("env steps", _fmt(last["env_steps"], ",.0f")),
                    ("median env steps/s", _fmt(subject["env_steps_per_s"].median(), ",.0f")),
                    ("final return", _fmt(last["episode_return_mean"], ".1f")),
                    ("non-finite steps", _fmt(subject["nonfinite_steps"].max(), ",.0f")),
                    ("precision / backend", f"{last['precision']} / {last['backend']}"),
                ],
                ("", ""),
            ),
            "",
        ]
    out += ["## Fault tolerance", ""]
    if run.drill is None:
        out += ["No drill.json: run `rayrl drill RUN_DIR` to measure recovery and checkpoint restores.", ""]
    else:
        out += [
            _table(
                [
                    (d.get("name"), _fmt(d.get("recovery_s"), ".1f"), d.get("outcome"))
                    for d in run.drill.get("drills") or []
                ],
                ("drill", "recovery (s)", "outcome"),
            ),
            "",
        ]
    from rayrl.policy.play import report_lines

    out += ["## Policy", ""] + report_lines(run.path)
    sec = security.checks(run.posture)
    out += [
        "## Security",
        "",
        f"Verdict: {security.verdict(sec)} (not an acceptance part: the exposure of the "
        "Ray this run joined, as recorded at its start in posture.json; see docs/security.md).",
        "",
        _table(
            [(c.name, c.threshold, c.measured, c.verdict) for c in sec], ("check", "threshold", "measured", "verdict")
        ),
        "",
    ]
    out += ["## Plots", ""] + [f"![{Path(name).stem}](plots/{name})" for name in plots] + [""]
    return "\n".join(out)


def confirmation_section(run: RunFolder) -> list[str]:
    """The confirmed answer: each candidate's score, median, IQM and bootstrap interval, then every seed's run."""
    if run.kind != "sweep":
        return []
    c = run.summary.get("confirm")
    out = ["## Confirmation on fresh seeds", ""]
    if not c or run.confirm is None:
        return out + [
            "Not run (search.confirm_top_k: 0, or no usable search trial): best_config.yaml is the "
            "search's single best run, on one seed.",
            "",
        ]
    unit = {"usd": "USD", "wall_s": "wall s", "env_steps": "env steps"}.get(c.get("objective"), c.get("objective"))
    out += [
        f"The search's top {len(c['candidates'])} configs, each re-run on seeds {c['seeds']} (never used in "
        f"the ladder or the search) for up to {_fmt(c.get('env_steps_budget'), ',.0f')} env steps. The shipped config "
        f"has the lowest score: the {unit} to return {_fmt(c.get('target_return'), 'g')} within which "
        f"{runfolder.score_share(c)} of its seeds got there (search.confirm_quantile); a run that did not "
        "reach it counts as infinite (shown as -). Interval: 95% percentile bootstrap of the median. "
        '"race": the race stopped the run once its cost passed the best score so far (search.confirm_race): '
        "it could no longer change the choice, and counts as a miss, so a winner's median, IQM and interval are "
        "upper-censored.",
        "",
        _table(
            [
                (
                    "**" + str(k["candidate"]) + "**" if k["candidate"] == c["chosen"] else k["candidate"],
                    k["phase2_trial_id"],
                    k["batch_size"],
                    _fmt(k["lr"], ".3g"),
                    f"{k['reached']}/{k['runs']}",
                    _fmt(k.get("score")),
                    _fmt(k["median"]),
                    _fmt(k["iqm"]),
                    f"{_fmt(k['ci_low'])} .. {_fmt(k['ci_high'])}",
                    _fmt(k["median_return"], ".1f"),
                )
                for k in c["candidates"]
            ],
            (
                "candidate",
                "search trial",
                "batch",
                "lr",
                "at target",
                f"score {unit}",
                f"median {unit}",
                f"IQM {unit}",
                "95% interval",
                "median return",
            ),
        ),
        "",
        _table(
            [
                (
                    int(r.candidate),
                    int(r.seed),
                    r.trial_id,
                    _fmt(r.env_steps, ",.0f"),
                    _fmt(r.wall_s, ".1f"),
                    _fmt(r.usd, ".4g"),
                    _fmt(r.episode_return_mean, ".1f"),
                    "yes" if r.reached else "no",
                    _stopped(getattr(r, "stopped", None)),
                )
                for r in run.confirm.sort_values(["candidate", "seed"]).itertuples()
            ],
            ("candidate", "seed", "trial", "env steps", "wall s", "USD", "return", "at target", "stopped"),
        ),
        "",
    ]
    return out


def _stopped(reason: object) -> str:
    """confirm.csv's ``stopped`` in words (empty in a folder written before the column existed)."""
    if not isinstance(reason, str) or not reason:
        return "-"
    return reason.replace("_", " ")


# ---------------------------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    """The arguments of `rayrl report` (`rayrl report --help` prints this parser's help)."""
    p = argparse.ArgumentParser(
        prog="rayrl report",
        description="Write report.md and plots/*.png for a run "
        "folder: the five-part acceptance table (hardware, training, reward, cost, "
        "fault tolerance) with PASS / FAIL / N/A and the measured values.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder: {storage}/{name} of a sweep or `rayrl train`")
    p.add_argument(
        "--baseline",
        metavar="RUN_DIR",
        default=None,
        help="compare cost per effective sample against this run (default: the ladder's first rung)",
    )
    p.add_argument("--out", metavar="DIR", default=None, help="where report.md and plots/ go (default: RUN_DIR)")
    p.add_argument("--strict", action="store_true", help="exit 1 when any check fails")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `rayrl report`; exit 2 (one paragraph, nothing written) on a bad folder."""
    args = build_parser().parse_args(argv)
    try:
        run = load(args.run_dir)
        baseline = load(args.baseline) if args.baseline else None
        checks = evaluate(run, baseline)
        try:
            pngs = {name: _png(fig) for name, fig in figures(run).items()}
        except ImportError:  # matplotlib is in the dev extra; the tables need no plots
            pngs = {}
            run.notes.append("no plots: matplotlib is not installed (pip install matplotlib).")
        text = render(run, checks, pngs, baseline)
        out = Path(args.out) if args.out else run.path
        _write(out, text, pngs)
        if run.source and not args.out:  # the run folder is in object storage: the report goes there too
            publish(run.source, out, ["report.md", *(f"plots/{n}" for n in pngs)])
    except (RunFolderError, OSError) as exc:
        sys.stderr.write(textwrap.fill(f"rayrl report: error: {exc}", width=100) + "\n")
        return EXIT_USAGE
    verdicts = part_verdicts(checks)
    where = f"{run.source.partition('?')[0]}/report.md" if run.source and not args.out else out / "report.md"
    print(f"rayrl report: {where}: " + ", ".join(f"{p} {v}" for p, v in verdicts.items()))
    return 1 if args.strict and FAIL in verdicts.values() else 0


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _write(out: Path, text: str, pngs: dict[str, bytes]) -> None:
    """Everything is rendered before this runs; each file is replaced atomically."""
    for name, data in {**{f"plots/{n}": d for n, d in pngs.items()}, "report.md": text.encode()}.items():
        write_local(out / name, data)
