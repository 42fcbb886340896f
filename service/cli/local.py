"""The local commands: ``kernels``, ``tune`` and ``bench`` (no server).

Every handler imports torch, the kernels and the tuner when it runs, never when this module
is imported, so ``tiletune --help`` works on the base install; Optuna (search, tune, replay)
is imported only by ``tune``. The kernels' input errors become the command line's
:class:`~tiletune.service.cli.options.BadInputError` (exit 2, naming the field).
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from tiletune.client.space import Dim, is_vendor
from tiletune.client.wire import STRATEGIES
from tiletune.kernels.replay.recorded import REPLAY_DIR_ENV
from tiletune.service.cli.options import (
    BadInputError,
    Commands,
    add_json_option,
    add_kernel_arguments,
    emit,
)

if TYPE_CHECKING:
    from tiletune.kernels import Config, DeviceLimits, KernelSpec, Shape
    from tiletune.kernels.device import Device
    from tiletune.tuner.measure.replay import ReplaySpace
    from tiletune.tuner.measure.tune import TuneReport

R = TypeVar("R")


def kernel_errors_as_bad_input(
    handler: Callable[[argparse.Namespace], R],
) -> Callable[[argparse.Namespace], R]:
    """``handler`` with the kernels' :class:`InputError` and :class:`DeviceUnavailableError` as bad input."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> R:
        from tiletune.kernels.errors import DeviceUnavailableError, InputError

        try:
            return handler(args)
        except InputError as error:
            raise BadInputError(error.field, error.reason) from None
        except DeviceUnavailableError as error:
            raise BadInputError("backend", str(error)) from None

    return run


def parse_config(spec: KernelSpec, text: str, shape: Shape, limits: DeviceLimits) -> Config:
    """A ``--config`` JSON object validated against the kernel's space for ``shape`` on a chip of
    ``limits``."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise BadInputError("config", f"not valid JSON ({error.msg}): {text!r}") from None
    if not isinstance(raw, dict):
        raise BadInputError("config", f"must be a JSON object of knob values, got {text!r}")
    return spec.parse_config(raw, shape, limits)


def _kernel_inputs(args: argparse.Namespace) -> tuple[KernelSpec, Shape, str, Device]:
    from tiletune.kernels import get_kernel
    from tiletune.kernels.declaration import parse_dims
    from tiletune.kernels.device import get_device
    from tiletune.kernels.spec import torch_dtype

    for option in ("shape", "dtype"):
        if getattr(args, option) is None:
            raise BadInputError(option, f"--{option} is required (only --backend replay runs without it)")
    spec = get_kernel(args.kernel)
    shape = spec.parse_shape(parse_dims(args.shape))
    torch_dtype(args.dtype)
    return spec, shape, args.dtype, get_device(args.backend)


def _format_config(config: Config) -> str:
    if is_vendor(config):
        return "torch's op (vendor)"
    return " ".join(f"{k}={v}" for k, v in config.items())


# -- kernels ----------------------------------------------------------------------------------------


def _kernel_source(name: str) -> str:
    from tiletune.kernels.declarations import KERNELS_ENTRY_POINT_GROUP
    from tiletune.kernels.family import FAMILIES_ENTRY_POINT_GROUP, builtin_families, family_of
    from tiletune.kernels.replay.declaration import REPLAY_KERNELS_ENV, REPLAY_PREFIX
    from tiletune.kernels.replay.spec import registered_replay_kernels

    if name.startswith(REPLAY_PREFIX) and name in registered_replay_kernels():
        return f"replay (${REPLAY_KERNELS_ENV})"
    family = family_of(name)
    if family is None:
        return f"plugin ({KERNELS_ENTRY_POINT_GROUP})"
    return "builtin" if family.name in builtin_families() else f"plugin ({FAMILIES_ENTRY_POINT_GROUP})"


def _dim_label(dim: Dim) -> str:
    """A dim's name, with its default where a shape may leave it out: ``kv_heads (=heads)``."""
    return dim.name if dim.default is None else f"{dim.name} (={dim.default})"


@kernel_errors_as_bad_input
def cmd_kernels(args: argparse.Namespace) -> None:
    """List kernels: dims, knobs and their values, implementations; devices usable here."""
    from tiletune.kernels import all_kernels
    from tiletune.kernels.device import available_kinds, get_device

    devices = available_kinds()
    specs = list(all_kernels().values())
    kernels = [
        {
            "name": spec.name,
            "version": spec.version,
            "description": spec.description,
            "source": _kernel_source(spec.name),
            "dims": [
                {"name": d.name, "doc": d.doc, "choices": d.choices, "default": d.default} for d in spec.dims
            ],
            "knobs": [
                {"name": k.name, "values": list(k.values), "tiles": k.clamp_to, "doc": k.doc}
                for k in spec.knobs
            ],
            "backends": list(spec.backends()),
        }
        for spec in specs
    ]
    lines = [f"devices here: {', '.join(devices)} ({get_device('cpu').chip.name})", ""]
    for spec in specs:
        lines.append(f"{spec.name} v{spec.version} [{_kernel_source(spec.name)}]: {spec.description}")
        lines.append(f"  dims:  {', '.join(_dim_label(d) for d in spec.dims)}")
        lines.extend(f"  knob:  {knob.name} in {list(knob.values)}" for knob in spec.knobs)
        lines.append(f"  implementations: {', '.join(spec.backends())}")
    emit(args, {"devices": devices, "kernels": kernels}, "\n".join(lines))


# -- tune -------------------------------------------------------------------------------------------


def _tune_text(report: TuneReport) -> str:
    speedup = report.speedup_vs_default
    default = (
        f"{report.default.median_ms:.4f} ms" if report.default else f"invalid ({report.default_invalid})"
    )
    counts = report.counts
    return "\n".join(
        [
            f"{report.kernel} {','.join(f'{k}={v}' for k, v in report.shape.items())} {report.dtype}"
            f" on {report.chip}",
            f"space: {report.space_size} valid configs; measured {counts.get('completed', 0)}"
            f" (invalid {counts.get('invalid', 0)}, duplicate {counts.get('duplicate', 0)},"
            f" failed {counts.get('failed', 0)}) in {report.wall_s:.1f} s",
            f"best:    {_format_config(report.best_config)}  {report.best.median_ms:.4f} ms"
            f" (p10 {report.best.p10_ms:.4f}, p90 {report.best.p90_ms:.4f}, n={report.best.samples})",
            f"default: {_format_config(report.default_config)}  {default}",
            f"speedup over default: {speedup:.2f}x" if speedup else "speedup over default: n/a",
            f"torch's op: {report.vendor.median_ms:.4f} ms; best is {report.speedup_vs_vendor:.2f}x as fast"
            if report.vendor and report.speedup_vs_vendor
            else "torch's op: not measured (the kernel has none here)",
        ]
    )


def _replay_space(args: argparse.Namespace) -> ReplaySpace:
    from tiletune.kernels.replay.recorded import ReplayError, replay_spaces
    from tiletune.tuner.measure.replay import load_replay

    if args.shape is not None or args.dtype is not None:
        raise BadInputError("shape", "a recorded space has a fixed shape and dtype; omit --shape and --dtype")
    try:
        spaces = replay_spaces(args.replay_dir)
        if args.kernel not in spaces:
            known = ", ".join(spaces) or "none"
            raise BadInputError(
                "kernel", f"no recorded space {args.kernel!r} in the replay directory; known: {known}"
            )
        return load_replay(spaces[args.kernel])
    except ReplayError as error:
        raise BadInputError("replay_dir", str(error)) from None


def _quiet_optuna() -> None:
    """Keep Optuna's per-trial INFO lines off the terminal: the progress bar says it better."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


@kernel_errors_as_bad_input
def cmd_tune(args: argparse.Namespace) -> None:
    """Tune one kernel for one shape and dtype on this machine (or on a recorded space)."""
    from tiletune.tuner.measure.progress import ProgressBar
    from tiletune.tuner.measure.tune import TuneOptions, tune, tune_replay

    _quiet_optuna()
    if args.trials is not None and args.trials <= 0:
        raise BadInputError("trials", f"must be a positive integer, got {args.trials}")
    options = TuneOptions(strategy=args.strategy, trials=args.trials, seed=args.seed, max_time_s=args.time)
    if args.backend == "replay":
        space = _replay_space(args)
        total = space.valid_count if args.strategy == "grid" else args.trials
        with ProgressBar(total=total, label=f"replaying {space.name}") as bar:
            report = tune_replay(space, options, progress=bar.update)
        emit(args, report.as_dict(), _tune_text(report))
        return
    spec, shape, dtype, device = _kernel_inputs(args)
    total = len(spec.space(shape, dtype, device.chip.limits)) if args.strategy == "grid" else args.trials
    with ProgressBar(total=total, label=f"tuning {spec.name}") as bar:
        report = tune(spec, shape, dtype, device, options, progress=bar.update)
    emit(args, report.as_dict(), _tune_text(report))


# -- bench ------------------------------------------------------------------------------------------


@kernel_errors_as_bad_input
def cmd_bench(args: argparse.Namespace) -> None:
    """Measure the given configs, the default and the vendor op (torch's own) interleaved in one run."""
    from tiletune.tuner.measure.bench import KernelBench
    from tiletune.tuner.measure.vendor_compare import compare_with_vendor

    spec, shape, dtype, device = _kernel_inputs(args)
    configs = [parse_config(spec, text, shape, device.chip.limits) for text in args.config]
    default = spec.default_config(shape, dtype, device.chip.limits)
    bench = KernelBench(spec, shape, dtype, device)
    results = [row.as_dict() for row in compare_with_vendor(bench, configs, default)]
    lines = [
        f"{spec.name} {spec.canonical_shape(shape)} {dtype} on {device.chip.name} ({bench.implementation})"
    ]
    for result in results:
        timing = (
            f"{result['median_ms']:.4f} ms (p10 {result['p10_ms']:.4f}, p90 {result['p90_ms']:.4f},"
            f" n={result['samples']})"
            if result["median_ms"] is not None
            else f"invalid: {result['invalid']}"
        )
        name = "torch's own op [vendor]" if result["is_vendor"] else _format_config(result["config"])
        marker = " [default]" if result["is_default"] else ""
        lines.append(f"  {name}{marker}: {timing}")
    document = {
        "kernel": spec.name,
        "shape": shape,
        "dtype": dtype,
        "chip": device.chip.name,
        "backend": bench.implementation,
        "results": results,
    }
    emit(args, document, "\n".join(lines))


# -- parsers ----------------------------------------------------------------------------------------


def add_parsers(commands: Commands) -> None:
    """The ``kernels``, ``tune`` and ``bench`` subcommands."""
    kernels = commands.add_parser("kernels", help="list kernels, their dims and search spaces")
    add_json_option(kernels)
    kernels.set_defaults(handler=cmd_kernels, extra="tune")

    tune = commands.add_parser(
        "tune",
        help="tune a kernel for one shape locally (no server)",
        description="Search the kernel's tiling space on this machine with Optuna, validate the top "
        "configs and the default interleaved, and report the best config and its speedup.",
    )
    add_kernel_arguments(
        tune, "replay: KERNEL names a recorded space, whose recorded times are the measurements"
    )
    tune.add_argument(
        "--replay-dir",
        default=None,
        help=f"directory of recorded spaces for --backend replay (default: ${REPLAY_DIR_ENV}, else "
        "../shared/replay)",
    )
    tune.add_argument("--trials", type=int, default=40, help="measured configs to try (default 40)")
    tune.add_argument(
        "--strategy", choices=STRATEGIES, default="tpe", help="tpe (default), random, or grid (all valid)"
    )
    tune.add_argument("--seed", type=int, default=0, help="search seed (default 0)")
    tune.add_argument("--time", type=float, default=None, help="stop searching after this many seconds")
    tune.set_defaults(handler=cmd_tune, extra="tune")

    bench = commands.add_parser(
        "bench",
        help="measure given configs, the default and torch's own op interleaved",
        description="The honest way to compare configs: check each against the reference, then time "
        "them, the kernel's default and its vendor op (torch's own, where the kernel has one: a row "
        "with config null and is_vendor true) in rounds (A B A B ...) in one run.",
    )
    add_kernel_arguments(bench)
    bench.add_argument(
        "--config",
        action="append",
        default=[],
        help='a config as a JSON object, e.g. \'{"tile_size": 4096, "buffer_num": 2, "pipeline_depth": 2}\';'
        " repeat for more",
    )
    bench.set_defaults(handler=cmd_bench, extra="tune")
