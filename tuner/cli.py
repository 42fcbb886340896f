"""The ``tiletune`` command line: ``kernels``, ``tune``, ``bench`` (local) and ``worker``.

Every command has ``--help``; ``--json`` prints exactly one JSON document on
stdout (progress bars and messages go to stderr). Bad input exits with status
2 and a message naming the field at fault; nothing is measured before the
input is known to be good.

Optuna (and the modules that use it: search, tune, replay) is imported only by
``tune``, so ``tiletune worker`` runs on a worker-only install (``tiletune[worker]``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

import httpx

from tiletune.kernels.device import DEVICE_KINDS, Device, available_kinds, get_device
from tiletune.kernels.errors import DeviceUnavailableError, InputError
from tiletune.kernels.registry import ENTRY_POINT_GROUP, all_kernels, builtin_kernels, get_kernel
from tiletune.kernels.spec import DTYPES, Config, KernelSpec, Shape, parse_dims, torch_dtype
from tiletune.tuner.bench import KernelBench
from tiletune.tuner.progress import ProgressBar
from tiletune.tuner.worker import MAX_BATCH, Worker, WorkerRejectedError

if TYPE_CHECKING:
    from tiletune.tuner.replay import ReplaySpace
    from tiletune.tuner.tune import TuneReport

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
STRATEGIES = ("tpe", "random", "grid")
#: Same name as ``tiletune.tuner.replay.REPLAY_DIR_ENV`` (not imported here: replay imports Optuna).
REPLAY_DIR_ENV = "TILETUNE_REPLAY_DIR"
SERVER_ENV = "TILETUNE_SERVER"
TOKEN_ENV = "TILETUNE_TOKEN"


def parse_config(spec: KernelSpec, text: str, shape: Shape) -> Config:
    """A ``--config`` JSON object validated against the kernel's space for ``shape``."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError("config", f"not valid JSON ({error.msg}): {text!r}") from None
    if not isinstance(raw, dict):
        raise InputError("config", f"must be a JSON object of knob values, got {text!r}")
    return spec.parse_config(raw, shape)


def _kernel_inputs(args: argparse.Namespace) -> tuple[KernelSpec, Shape, str, Device]:
    for option in ("shape", "dtype"):
        if getattr(args, option) is None:
            raise InputError(option, f"--{option} is required (only --backend replay runs without it)")
    spec = get_kernel(args.kernel)
    shape = spec.parse_shape(parse_dims(args.shape))
    torch_dtype(args.dtype)
    return spec, shape, args.dtype, get_device(args.backend)


def _emit(args: argparse.Namespace, document: dict[str, Any], text: str) -> None:
    print(json.dumps(document, indent=2) if args.json else text)


def _format_config(config: Config) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


# -- kernels ------------------------------------------------------------------


def _kernel_source(name: str) -> str:
    return "builtin" if name in builtin_kernels() else f"plugin ({ENTRY_POINT_GROUP})"


def cmd_kernels(args: argparse.Namespace) -> None:
    """List kernels: dims, knobs and their values, implementations; devices usable here."""
    devices = available_kinds()
    kernels = [
        {
            "name": spec.name,
            "version": spec.version,
            "description": spec.description,
            "source": _kernel_source(spec.name),
            "dims": [{"name": d.name, "doc": d.doc, "choices": d.choices} for d in spec.dims],
            "knobs": [
                {"name": k.name, "values": list(k.values), "tiles": k.clamp_to, "doc": k.doc}
                for k in spec.knobs
            ],
            "backends": list(spec.backends()),
        }
        for spec in all_kernels().values()
    ]
    lines = [f"devices here: {', '.join(devices)} ({get_device('cpu').chip.name})", ""]
    for spec in all_kernels().values():
        lines.append(f"{spec.name} v{spec.version} [{_kernel_source(spec.name)}]: {spec.description}")
        lines.append(f"  dims:  {', '.join(d.name for d in spec.dims)}")
        lines.extend(f"  knob:  {knob.name} in {list(knob.values)}" for knob in spec.knobs)
        lines.append(f"  implementations: {', '.join(spec.backends())}")
    _emit(args, {"devices": devices, "kernels": kernels}, "\n".join(lines))


# -- tune -----------------------------------------------------------------------


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
        ]
    )


def _replay_space(args: argparse.Namespace) -> ReplaySpace:
    from tiletune.tuner.replay import ReplayError, load_replay, replay_spaces

    if args.shape is not None or args.dtype is not None:
        raise InputError("shape", "a recorded space has a fixed shape and dtype; omit --shape and --dtype")
    try:
        spaces = replay_spaces(args.replay_dir)
        if args.kernel not in spaces:
            known = ", ".join(spaces) or "none"
            raise InputError(
                "kernel", f"no recorded space {args.kernel!r} in the replay directory; known: {known}"
            )
        return load_replay(spaces[args.kernel])
    except ReplayError as error:
        raise InputError("replay_dir", str(error)) from None


def cmd_tune(args: argparse.Namespace) -> None:
    """Tune one kernel for one shape and dtype on this machine (or on a recorded space)."""
    from tiletune.tuner.tune import TuneOptions, tune, tune_replay

    quiet_libraries()
    if args.trials is not None and args.trials <= 0:
        raise InputError("trials", f"must be a positive integer, got {args.trials}")
    options = TuneOptions(strategy=args.strategy, trials=args.trials, seed=args.seed, max_time_s=args.time)
    if args.backend == "replay":
        space = _replay_space(args)
        total = space.valid_count if args.strategy == "grid" else args.trials
        with ProgressBar(total=total, label=f"replaying {space.name}") as bar:
            report = tune_replay(space, options, progress=bar.update)
        _emit(args, report.as_dict(), _tune_text(report))
        return
    spec, shape, dtype, device = _kernel_inputs(args)
    total = len(spec.space(shape, dtype, device.chip.limits)) if args.strategy == "grid" else args.trials
    with ProgressBar(total=total, label=f"tuning {spec.name}") as bar:
        report = tune(spec, shape, dtype, device, options, progress=bar.update)
    _emit(args, report.as_dict(), _tune_text(report))


# -- bench ----------------------------------------------------------------------


def cmd_bench(args: argparse.Namespace) -> None:
    """Measure the given configs and the default interleaved in one run."""
    spec, shape, dtype, device = _kernel_inputs(args)
    configs = [parse_config(spec, text, shape) for text in args.config]
    default = spec.default_config(shape, dtype, device.chip.limits)
    if default not in configs:
        configs.append(default)
    bench = KernelBench(spec, shape, dtype, device)
    verdicts = [(config, bench.check(config)) for config in configs]
    runnable = [config for config, verdict in verdicts if verdict is None]
    rejected = [verdict for _, verdict in verdicts if verdict is not None]
    measurements = bench.compare(runnable) if runnable else []
    results: list[dict[str, Any]] = [
        {"config": config, **m.as_dict(), "is_default": config == default}
        for config, m in zip(runnable, measurements, strict=True)
    ]
    results += [
        {
            "config": r.config,
            "median_ms": None,
            "invalid": r.invalid or r.error,
            "is_default": r.config == default,
        }
        for r in rejected
    ]
    lines = [f"{spec.name} {spec.canonical_shape(shape)} {dtype} on {device.chip.name}"]
    for result in results:
        timing = (
            f"{result['median_ms']:.4f} ms (p10 {result['p10_ms']:.4f}, p90 {result['p90_ms']:.4f},"
            f" n={result['samples']})"
            if result["median_ms"] is not None
            else f"invalid: {result['invalid']}"
        )
        marker = " [default]" if result["is_default"] else ""
        lines.append(f"  {_format_config(result['config'])}{marker}: {timing}")
    document = {
        "kernel": spec.name,
        "shape": shape,
        "dtype": dtype,
        "chip": device.chip.name,
        "results": results,
    }
    _emit(args, document, "\n".join(lines))


# -- worker ---------------------------------------------------------------------


def server_url(args: argparse.Namespace) -> str:
    """``--server``, else ``$TILETUNE_SERVER``; an http(s) URL or :class:`InputError` (field server)."""
    url = args.server or os.environ.get(SERVER_ENV)
    if not url:
        raise InputError("server", f"--server URL (or ${SERVER_ENV}) is required, e.g. http://tuner:8642")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as error:
        raise InputError("server", f"--server {url!r} is not a URL ({error})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise InputError("server", f"--server must be an http:// or https:// URL, got {url!r}")
    return url


def _worker_http(args: argparse.Namespace) -> httpx.Client:
    """The HTTP client of a worker: the server as base URL, the bearer token when given."""
    url = server_url(args)
    token = args.token or os.environ.get(TOKEN_ENV)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url, headers=headers, timeout=httpx.Timeout(30.0, connect=10.0))


@contextmanager
def _stop_on_signals(worker: Worker) -> Iterator[None]:
    """SIGTERM and SIGINT call ``worker.stop()``; a second signal acts as it did before."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handle(signum: int, frame: FrameType | None) -> None:
        logging.getLogger(__name__).info("received %s", signal.Signals(signum).name)
        worker.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    for sig in previous:
        signal.signal(sig, handle)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def cmd_worker(args: argparse.Namespace) -> None:
    """Lease tuning jobs from a server and measure them on this machine until stopped."""
    if not 1 <= args.batch <= MAX_BATCH:
        raise InputError("batch", f"must be an integer from 1 to {MAX_BATCH}, got {args.batch}")
    http = _worker_http(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request (heartbeats) is noise
    with http:
        worker = Worker(http, backend=args.backend, name=args.name, batch=args.batch)
        with _stop_on_signals(worker):
            worker.run(once=args.once)


# -- parser ---------------------------------------------------------------------


def _add_kernel_arguments(parser: argparse.ArgumentParser, replay: bool = False) -> None:
    parser.add_argument("kernel", help="kernel name (see `tiletune kernels`)")
    parser.add_argument("--shape", help="problem dims, e.g. m=1024,n=1024,k=1024 (required)")
    parser.add_argument("--dtype", help=f"element type: {', '.join(DTYPES)} (required)")
    devices = ", ".join(DEVICE_KINDS)
    parser.add_argument(
        "--backend",
        default="cpu",
        help=f"device to run on: {devices} or auto (default: cpu)"
        + (
            "; replay: KERNEL names a recorded space, whose recorded times are the measurements"
            if replay
            else ""
        ),
    )
    if replay:
        parser.add_argument(
            "--replay-dir",
            default=None,
            help="directory of recorded spaces for --backend replay "
            f"(default: ${REPLAY_DIR_ENV}, else ../shared/replay)",
        )
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``tiletune`` command."""
    parser = argparse.ArgumentParser(
        prog="tiletune",
        description="Measured tiling (tile sizes, buffer count, pipeline depth) for accelerator kernels.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    kernels = commands.add_parser("kernels", help="list kernels, their dims and search spaces")
    kernels.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    kernels.set_defaults(handler=cmd_kernels)

    tune_parser = commands.add_parser(
        "tune",
        help="tune a kernel for one shape locally (no server)",
        description="Search the kernel's tiling space on this machine with Optuna, validate the top "
        "configs and the default interleaved, and report the best config and its speedup.",
    )
    _add_kernel_arguments(tune_parser, replay=True)
    tune_parser.add_argument("--trials", type=int, default=40, help="measured configs to try (default 40)")
    tune_parser.add_argument(
        "--strategy", choices=STRATEGIES, default="tpe", help="tpe (default), random, or grid (all valid)"
    )
    tune_parser.add_argument("--seed", type=int, default=0, help="search seed (default 0)")
    tune_parser.add_argument(
        "--time", type=float, default=None, help="stop searching after this many seconds"
    )
    tune_parser.set_defaults(handler=cmd_tune)

    bench_parser = commands.add_parser(
        "bench",
        help="measure given configs and the default interleaved",
        description="The honest way to compare configs: check each against the reference, then time "
        "them and the kernel's default in rounds (A B A B ...) in one run.",
    )
    _add_kernel_arguments(bench_parser)
    bench_parser.add_argument(
        "--config",
        action="append",
        default=[],
        help='a config as a JSON object, e.g. \'{"tile_size": 4096, "buffer_num": 2, "pipeline_depth": 2}\';'
        " repeat for more",
    )
    bench_parser.set_defaults(handler=cmd_bench)
    _add_worker_parser(commands)
    return parser


def _add_worker_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``worker`` subcommand."""
    worker = commands.add_parser(
        "worker",
        help="lease tuning jobs from a server and measure them here",
        description="Register this machine's chip with a tiletune server, lease its tuning jobs, "
        "measure the configs the server asks for (each checked against the reference first) and "
        "report them, until stopped. SIGTERM or Ctrl-C finishes the current trial, gives the job "
        "back and exits; a lost server is waited for with capped exponential backoff.",
    )
    worker.add_argument("--server", help=f"server URL, e.g. http://tuner:8642 (default: ${SERVER_ENV})")
    worker.add_argument(
        "--backend",
        choices=(*DEVICE_KINDS, "auto"),
        default="auto",
        help="device to measure on (default: auto = npu, else cuda, else cpu)",
    )
    worker.add_argument("--token", help=f"bearer token for the server (default: ${TOKEN_ENV})")
    worker.add_argument("--once", action="store_true", help="exit when the server has no job for this chip")
    worker.add_argument("--name", help="worker name shown by the server (default: HOSTNAME-PID)")
    worker.add_argument(
        "--batch", type=int, default=1, help=f"configs asked per request, 1 to {MAX_BATCH} (default 1)"
    )
    worker.set_defaults(handler=cmd_worker)


def quiet_libraries() -> None:
    """Keep Optuna's per-trial INFO lines off the terminal: the progress bar says it better."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tiletune`` console command; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        args.handler(args)
    except (InputError, DeviceUnavailableError) as error:
        print(f"tiletune {args.command}: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except WorkerRejectedError as error:
        print(f"tiletune {args.command}: error: {error}", file=sys.stderr)
        return EXIT_FAILURE
    return 0


if __name__ == "__main__":
    sys.exit(main())
