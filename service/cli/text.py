"""The text the remote commands print: sweeps as tables, a lookup's answer with its provenance,
a line per finished job and a sweep's summary (``up --submit``); the tables of ``sweeps list``,
``jobs list``, ``jobs show --trials`` and ``workers list``, and a job's facts (``jobs show``).

Pure functions of wire documents (:mod:`tiletune.client.wire`); no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

from tiletune.client.wire import (
    ANY_CHIP,
    JobPublic,
    ListedWorkerPublic,
    LookupPublic,
    SweepPublic,
    SweepSummaryPublic,
    TrialPublic,
)


def ms_text(value: float | None) -> str:
    """Milliseconds with four decimals, ``-`` for none."""
    return f"{value:.4f}" if value is not None else "-"


def _config_text(config: dict[str, int] | None) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items()) if config else "-"


def counts_text(sweep: SweepPublic) -> str:
    """The sweep's jobs by state, e.g. ``done 2, failed 1``."""
    return ", ".join(f"{state} {n}" for state, n in sorted(sweep.counts.items()))


def kernels_text(sweep: SweepPublic) -> str:
    """The kernels of the sweep's jobs, in job order, comma-separated."""
    return ", ".join(dict.fromkeys(job.kernel for job in sweep.jobs))


def _job_row(job: JobPublic) -> list[str]:
    progress = job.progress
    speedup = f"{progress.speedup_vs_default:.2f}x" if progress.speedup_vs_default else "-"
    return [
        str(job.id),
        job.shape_key,
        job.dtype,
        job.state,
        f"{progress.completed}/{job.trials}",
        ms_text(progress.best_ms),
        ms_text(progress.default_ms),
        speedup,
        _config_text(progress.best_config),
    ]


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )


def sweep_text(sweep: SweepPublic) -> str:
    """A sweep as its heading line and a table of its jobs."""
    chips = sorted({"any" if job.chip == ANY_CHIP else job.chip for job in sweep.jobs})
    heading = (
        f"sweep {sweep.id} ({kernels_text(sweep)}): {sweep.state}; jobs: {counts_text(sweep)};"
        f" chip: {', '.join(chips)}"
    )
    header = ["job", "shape", "dtype", "state", "trials", "best_ms", "default_ms", "speedup", "best config"]
    return heading + "\n" + format_table(header, [_job_row(job) for job in sweep.jobs])


def lookup_text(answer: LookupPublic) -> str:
    """The config, its match and its provenance, one fact per line."""
    shape = ",".join(f"{k}={v}" for k, v in answer.shape.items())
    lines = [
        f"{answer.kernel} {shape} {answer.dtype} on {answer.chip}",
        f"match:    {answer.match}",
        f"config:   {_config_text(answer.config)}",
    ]
    best = answer.best
    if best is None:
        lines.append("source:   the kernel's built-in default (nothing tuned for this key or a near shape)")
        return "\n".join(lines)
    speedup = f", {best.speedup_vs_default:.2f}x faster" if best.speedup_vs_default else ""
    lines += [
        f"tuned:    {best.shape_key} (kernel v{best.kernel_version}): {best.median_ms:.4f} ms"
        f" (default {ms_text(best.default_ms)} ms{speedup})",
        f"source:   job {best.job_id if best.job_id is not None else '-'},"
        f" promoted {best.promoted_at.isoformat(timespec='seconds')}",
        "software: " + (", ".join(f"{k} {v}" for k, v in best.software.items() if v) or "-"),
    ]
    return "\n".join(lines)


#: The multiplication sign, between a speedup and "faster" (1.80 TIMES faster).
TIMES = "\N{MULTIPLICATION SIGN}"


def _times(speedup: float) -> str:
    """E.g. ``1.80 TIMES faster``, or ``1.25 TIMES slower`` below 1 (without the spaces)."""
    return f"{speedup:.2f}{TIMES} faster" if speedup >= 1 else f"{1 / speedup:.2f}{TIMES} slower"


def job_line(job: JobPublic) -> str:
    """``kernel shape dtype: state, best X ms vs default Y ms (Z TIMES faster)``.

    A job without a measured best (failed, cancelled, skipped) gives its last failure
    reason, if any, instead of the timings.
    """
    head = f"{job.kernel} {job.shape_key} {job.dtype}: {job.state}"
    progress = job.progress
    if progress.best_ms is None:
        return f"{head} ({job.failure_reasons[-1]})" if job.failure_reasons else head
    line = f"{head}, best {ms_text(progress.best_ms)} ms vs default {ms_text(progress.default_ms)} ms"
    return f"{line} ({_times(progress.speedup_vs_default)})" if progress.speedup_vs_default else line


def summary_line(sweep: SweepPublic, elapsed_s: float) -> str:
    """The finished sweep in one line: its jobs by state and the speedups of those that have one."""
    line = f"sweep {sweep.id} ({kernels_text(sweep)}) {sweep.state} in {elapsed_s:.0f} s"
    line = f"{line}: {counts_text(sweep)}"
    speedups = [job.progress.speedup_vs_default for job in sweep.jobs if job.progress.speedup_vs_default]
    if not speedups:
        return line
    if len(speedups) == 1:
        return f"{line}; speedup over default {speedups[0]:.2f}{TIMES}"
    geomean = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
    return (
        f"{line}; speedup over default {min(speedups):.2f}{TIMES}-{max(speedups):.2f}{TIMES}"
        f" (geometric mean {geomean:.2f}{TIMES})"
    )


# -- listings: sweeps, jobs, trials, workers ----------------------------------------------------------


def when_text(moment: datetime | None) -> str:
    """A moment to the second (ISO 8601, its offset kept), ``-`` for none."""
    return moment.isoformat(timespec="seconds") if moment is not None else "-"


def _chip_text(chip: str) -> str:
    return "any" if chip == ANY_CHIP else chip


def sweeps_table(sweeps: Sequence[SweepSummaryPublic]) -> str:
    """``sweeps list``: one row per sweep, its jobs counted by state."""
    header = ["sweep", "name", "state", "kernels", "jobs", "by state", "created"]
    rows = [
        [
            str(sweep.id),
            sweep.name or "-",
            sweep.state,
            ",".join(sweep.kernels) or "-",
            str(sweep.job_count),
            ", ".join(f"{state} {n}" for state, n in sorted(sweep.counts.items())) or "-",
            when_text(sweep.created_at),
        ]
        for sweep in sweeps
    ]
    return format_table(header, rows) if rows else "no sweeps"


def jobs_table(jobs: Sequence[JobPublic]) -> str:
    """``jobs list``: one row per job, its key, state, trials and best time so far."""
    header = ["job", "sweep", "kernel", "shape", "dtype", "chip", "state", "trials", "best_ms", "speedup"]
    rows = []
    for job in jobs:
        speedup = job.progress.speedup_vs_default
        rows.append(
            [
                str(job.id),
                str(job.sweep_id),
                job.kernel,
                job.shape_key,
                job.dtype,
                _chip_text(job.chip),
                job.state,
                f"{job.progress.completed}/{job.trials}",
                ms_text(job.progress.best_ms),
                f"{speedup:.2f}x" if speedup else "-",
            ]
        )
    return format_table(header, rows) if rows else "no jobs"


def job_text(job: JobPublic) -> str:
    """``jobs show``: a job's key, state, budget and progress, one fact per line."""
    progress = job.progress
    budget = f"{job.trials} trials, {job.strategy}"
    budget += f", at most {job.max_time_s:g} s" if job.max_time_s is not None else ""
    budget += f", patience {job.patience}" if job.patience is not None else ""
    lines = [
        f"job {job.id} of sweep {job.sweep_id}: {job.kernel} v{job.kernel_version} {job.shape_key}"
        f" {job.dtype} on {_chip_text(job.chip)} ({job.backend})",
        f"state:    {job.state} (created {when_text(job.created_at)}, updated {when_text(job.updated_at)})",
        f"budget:   {budget}",
        f"trials:   {progress.completed} measured, {progress.invalid} invalid,"
        f" {progress.duplicate} duplicate, {progress.failed} failed",
        f"best:     {ms_text(progress.best_ms)} ms {_config_text(progress.best_config)}",
        f"default:  {ms_text(progress.default_ms)} ms"
        + (f" ({_times(progress.speedup_vs_default)})" if progress.speedup_vs_default else ""),
    ]
    if job.lease_failures or job.failure_reasons:
        lines.append(f"failures: {job.lease_failures} failed lease(s)")
        lines += [f"  - {reason}" for reason in job.failure_reasons]
    return "\n".join(lines)


def trials_table(trials: Sequence[TrialPublic]) -> str:
    """``jobs show --trials``: one row per trial, in the order asked."""
    header = ["trial", "number", "phase", "state", "median_ms", "p10_ms", "p90_ms", "config", "reason"]
    rows = [
        [
            str(trial.id),
            str(trial.number) if trial.number is not None else "-",
            trial.phase,
            trial.state,
            ms_text(trial.median_ms),
            ms_text(trial.p10_ms),
            ms_text(trial.p90_ms),
            _config_text(trial.config),
            (trial.reason or "-").replace("\n", " ")[:80],
        ]
        for trial in trials
    ]
    return format_table(header, rows) if rows else "no trials"


def workers_table(workers: Sequence[ListedWorkerPublic]) -> str:
    """``workers list``: one row per worker, the most recently seen first."""
    header = ["worker", "name", "chip", "backends", "leased jobs", "registered", "last seen"]
    rows = [
        [
            str(worker.id),
            worker.name,
            worker.chip,
            ",".join(worker.backends),
            ",".join(str(job) for job in worker.leased_jobs) or "-",
            when_text(worker.registered_at),
            when_text(worker.last_seen_at),
        ]
        for worker in workers
    ]
    return format_table(header, rows) if rows else "no workers"
