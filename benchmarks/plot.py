"""A benchmark's main figure as a PNG, drawn from the JSON document the benchmark printed.

The docs commit each figure with its JSON beside it, so a figure is always a real run's::

    .venv/bin/python benchmarks/search_replay.py --seeds 4 > docs/figures/search_replay.json
    .venv/bin/python benchmarks/plot.py docs/figures/search_replay.json   # -> docs/figures/search_replay.png

The plot follows the document's ``benchmark`` field (the functions live in ``benchmarks/plots/``):

- ``search_replay``: per recorded space, the fraction of the optimum reached against the
  budget (% of the valid space measured, log axis), median and worst seed, ours (``tpe``)
  and ``random``;
- ``space_basins``: per recorded space, the share of configs whose hill climb ends within
  ``reach`` of the optimum, under one-knob and two-knob moves;
- ``tuning_quality``: per key, the default rule's, the exhaustive best's and torch's op's time
  over the tuned config's (log axis), p10–p90 whiskers;
- ``gpu_check``: per key, the tuned and the default config's time over PyTorch's own op, and
  the attention goal (1.2×);
- ``service_overhead``: each local / service pair's wall time, and their ratios against the goal;
- ``replay_worker_cost``: ms per replay trial: wall time, server and worker CPU, the lookup path;
- ``worker_agreement``: two honest workers' ratio on one config (validation over search), by
  kernel, against the confirmation's agreement ratio;
- ``http_load``: requests/s and p50 / p99 latency per scenario and per mixed-load endpoint;
- ``http_lookup``: requests/s and p50 / p99 latency against concurrent clients;
- ``store_size``: per store size, lookups' requests/s and p50 / p99 / max latency, and each
  imported bundle's seconds;
- ``lookup_latency``: ns per call of a hit against a bare dict lookup, and of a launch with and
  without the client;
- ``dashboard``: every page's median and p95 server time against the goal;
- ``model_step``: a decoder's inference and training step per variant (torch eager and compiled,
  tiletune's operators on the default rules, on tuned configs, compiled) over torch eager's,
  and each operator's share of the tuned variant's profiled step;
- ``isolation_overhead``: per case, the in-process and the isolated trial's median (p10–p90),
  the paired overhead in % against the 10 % goal, and the round trip of a call;
- ``cpp_lookup``: the C++ client's ns per lookup (a hit on one key, on keys in turn, through a
  Client; nearest, default; median, p10–p90, p99) against the 100 ns goal for a hit;
- ``compile_time_tiles``: per shape and tile config, the compile-time and the run-time build's
  median time (torch.matmul for scale), and the build-ahead runs' measuring, build wait and busy share.

Asking for another benchmark is an error that names those that have a plot.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/plot.py`: its folder is on the path, not the root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from benchmarks.plots.accelerator import plot_compile_time_tiles, plot_cpp_lookup, plot_isolation_overhead
from benchmarks.plots.client import plot_lookup_latency
from benchmarks.plots.dashboard import plot_dashboard
from benchmarks.plots.http import plot_http_load, plot_http_lookup, plot_store_size
from benchmarks.plots.kernels import plot_gpu_check, plot_tuning_quality, plot_untuned_choice
from benchmarks.plots.model import plot_local_tune, plot_model_step
from benchmarks.plots.search import plot_search_replay, plot_space_basins
from benchmarks.plots.service import plot_replay_worker_cost, plot_service_overhead, plot_worker_agreement

DPI = 110

PLOTS: dict[str, Callable[[dict[str, Any]], Figure]] = {
    "search_replay": plot_search_replay,
    "space_basins": plot_space_basins,
    "tuning_quality": plot_tuning_quality,
    "untuned_choice": plot_untuned_choice,
    "gpu_check": plot_gpu_check,
    "service_overhead": plot_service_overhead,
    "replay_worker_cost": plot_replay_worker_cost,
    "worker_agreement": plot_worker_agreement,
    "http_load": plot_http_load,
    "http_lookup": plot_http_lookup,
    "store_size": plot_store_size,
    "lookup_latency": plot_lookup_latency,
    "dashboard": plot_dashboard,
    "model_step": plot_model_step,
    "local_tune": plot_local_tune,
    "isolation_overhead": plot_isolation_overhead,
    "cpp_lookup": plot_cpp_lookup,
    "compile_time_tiles": plot_compile_time_tiles,
}


def plot(json_path: Path, png_path: Path) -> None:
    """Read one benchmark document, draw its main figure, write it as a PNG."""
    document = json.loads(json_path.read_text())
    name = document.get("benchmark")
    if name not in PLOTS:
        raise ValueError(f"{json_path}: no plot for benchmark {name!r}; plotted: {sorted(PLOTS)}")
    figure = PLOTS[name](document)
    figure.savefig(png_path, dpi=DPI)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("json", type=Path, help="a benchmark's JSON output")
    parser.add_argument("-o", "--output", type=Path, help="the PNG (default: the JSON's path, .png)")
    args = parser.parse_args(argv)
    output: Path = args.output or args.json.with_suffix(".png")
    try:
        plot(args.json, output)
    except (OSError, ValueError, KeyError) as error:
        print(f"plot: {error}", file=sys.stderr)
        return 2
    print(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
