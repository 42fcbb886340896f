"""The tiled pipeline executor shared by the portable PyTorch kernels.

It imitates how an Ascend C kernel runs on an AI core. A kernel describes its
work as a :class:`TiledLoop`: a sequence of *steps* grouped into *output
tiles*. Every step copies its inputs from global memory into a local buffer
slot (``copy_in``) and computes on local buffers (``compute``, accumulating
across the steps of a tile); after the last step of a tile its result leaves
local memory (``copy_out``). An elementwise kernel has one step per tile; a
reduction or accumulation (matmul's k loop, attention's kv loop, column tiles
of a row) has several.

Slots: ``buffer_num`` rotating slots per queue. Step ``s`` uses input slot
``s % buffer_num``; output tile ``t`` uses output slot ``t % buffer_num``.
Kernels preallocate their slot tensors once per call and index them by slot.

Depth (``pipeline_depth``), i.e. how many stages run at once:

- 1: sequential, ``copy_in → compute → copy_out`` tile after tile;
- 2: copy-in runs asynchronously ahead of compute, up to ``buffer_num - 1``
  steps ahead and never into a slot still being computed on (double
  buffering with ``buffer_num=2``: the copy-in of step i+1 overlaps the
  compute of step i); copy-out follows compute in the caller's thread;
- 3: copy-out runs asynchronously too; an output slot is reused only after
  its previous copy-out finished.

Each stage runs its work items in order; on CPUs the asynchronous stages run
on background threads (torch ops release the GIL), on CUDA/NPU on side
streams ordered by events. An exception in any stage is re-raised in the
caller after every stage has stopped; nothing keeps touching the buffers
after :func:`execute` returns.

Tracing: inside ``with tracing() as trace:`` every executed loop records
``(stage, item, slot)`` events (item: the step for copy-in and compute, the tile for
copy-out) and the largest number of stage operations running at once
(``max_in_flight``, at most ``pipeline_depth``; measured on CPUs only).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from functools import cache
from queue import SimpleQueue
from typing import NamedTuple

import torch

StageFn = Callable[[int, int], None]
ComputeFn = Callable[[int, int, int], None]

#: Background workers shared by all pipelines; each running pipeline holds at most two.
STAGE_WORKERS = 64


@dataclass(frozen=True)
class TiledLoop:
    """A kernel's work as steps grouped into output tiles, and its three stages.

    - ``tile_steps[t]``: how many steps output tile ``t`` takes (each >= 1);
      steps are numbered globally, tile after tile.
    - ``copy_in(step, in_slot)``: global memory → input slot ``in_slot``.
    - ``compute(step, in_slot, out_slot)``: local buffers only; reads input
      slot ``in_slot``, accumulates into output slot ``out_slot`` of the
      step's tile (the first step of a tile initialises it).
    - ``copy_out(tile, out_slot)``: output slot → global memory, called once
      after the last step of ``tile``.

    A stage may touch only the slots it is given (and state private to its
    stage, e.g. compute's scratch), since stages of different steps overlap.
    """

    tile_steps: Sequence[int]
    copy_in: StageFn
    compute: ComputeFn
    copy_out: StageFn

    @property
    def step_count(self) -> int:
        """Total steps over all tiles."""
        return sum(self.tile_steps)


class TraceEvent(NamedTuple):
    """One stage operation: ``stage`` (copy_in, compute, copy_out), ``item`` (step or tile), ``slot``."""

    stage: str
    item: int
    slot: int


@dataclass
class PipelineTrace:
    """What the executor did, in the order stage operations started."""

    events: list[TraceEvent] = field(default_factory=list)
    max_in_flight: int = 0
    _active: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def of(self, stage: str) -> list[TraceEvent]:
        """The events of one stage, in order."""
        return [e for e in self.events if e.stage == stage]

    def _begin(self, event: TraceEvent) -> None:
        with self._lock:
            self.events.append(event)
            self._active += 1
            self.max_in_flight = max(self.max_in_flight, self._active)

    def _end(self) -> None:
        with self._lock:
            self._active -= 1

    def wrap(self, loop: TiledLoop) -> TiledLoop:
        """``loop`` with every stage call recorded in this trace."""

        def copy_in(step: int, slot: int) -> None:
            self._begin(TraceEvent("copy_in", step, slot))
            try:
                loop.copy_in(step, slot)
            finally:
                self._end()

        def compute(step: int, slot: int, out_slot: int) -> None:
            self._begin(TraceEvent("compute", step, slot))
            try:
                loop.compute(step, slot, out_slot)
            finally:
                self._end()

        def copy_out(tile: int, slot: int) -> None:
            self._begin(TraceEvent("copy_out", tile, slot))
            try:
                loop.copy_out(tile, slot)
            finally:
                self._end()

        return replace(loop, copy_in=copy_in, compute=compute, copy_out=copy_out)


_TRACE: ContextVar[PipelineTrace | None] = ContextVar("tiletune_pipeline_trace", default=None)


@contextmanager
def tracing() -> Iterator[PipelineTrace]:
    """Record every loop :func:`execute` runs in this context (for tests and debugging)."""
    trace = PipelineTrace()
    token = _TRACE.set(trace)
    try:
        yield trace
    finally:
        _TRACE.reset(token)


def check_pipeline(buffer_num: int, pipeline_depth: int) -> None:
    """Raise ``ValueError`` unless the knobs describe a runnable pipeline."""
    if buffer_num < 1:
        raise ValueError(f"buffer_num must be >= 1, got {buffer_num}")
    if pipeline_depth not in (1, 2, 3):
        raise ValueError(f"pipeline_depth must be 1, 2 or 3, got {pipeline_depth}")
    if pipeline_depth > 1 and buffer_num < 2:
        raise ValueError(f"pipeline_depth={pipeline_depth} needs buffer_num >= 2")


class Slots:
    """``count`` preallocated local buffers (one queue's slots) of ``capacity`` elements each.

    ``view(slot, size)`` is a contiguous tensor of ``size`` over the start of
    buffer ``slot`` (a partial tile uses the start of its slot); views are made
    once per (slot, size) and reused, so the per-step cost is a dict lookup.
    """

    def __init__(self, count: int, capacity: int, dtype: torch.dtype, device: torch.device) -> None:
        self._buffers = torch.empty((count, capacity), dtype=dtype, device=device).unbind(0)
        self._views: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}

    def view(self, slot: int, size: tuple[int, ...]) -> torch.Tensor:
        """Buffer ``slot`` seen as a contiguous tensor of ``size``."""
        key = (slot, size)
        found = self._views.get(key)
        if found is None:
            found = self._views[key] = self._buffers[slot][: math.prod(size)].view(size)
        return found


def require_backend(backends: Sequence[str], backend: str) -> None:
    """Raise ``ValueError`` naming the choices unless ``backend`` is one of ``backends``."""
    if backend not in backends:
        raise ValueError(f"backend: no backend {backend!r}; choose one of {list(backends)}")


def execute(loop: TiledLoop, buffer_num: int, pipeline_depth: int, device: torch.device) -> None:
    """Run ``loop`` with ``buffer_num`` slots per queue and ``pipeline_depth`` stages in flight.

    Returns when every copy-out has finished (on accelerators: when the work is
    ordered before anything later queued on the current stream). Re-raises the
    first exception of any stage.
    """
    check_pipeline(buffer_num, pipeline_depth)
    trace = _TRACE.get()
    if trace is not None:
        loop = trace.wrap(loop)
    with torch.no_grad():
        if pipeline_depth == 1:
            _run_sequential(loop, buffer_num)
        elif device.type == "cpu":
            _run_threaded(loop, buffer_num, pipeline_depth)
        else:
            _run_streamed(loop, buffer_num, pipeline_depth, device)


def _run_sequential(loop: TiledLoop, buffer_num: int) -> None:
    step = 0
    for tile, count in enumerate(loop.tile_steps):
        out_slot = tile % buffer_num
        for _ in range(count):
            slot = step % buffer_num
            loop.copy_in(step, slot)
            loop.compute(step, slot, out_slot)
            step += 1
        loop.copy_out(tile, out_slot)


# -- CPU: background threads -------------------------------------------------


def _stage_pool() -> ThreadPoolExecutor:
    """Threads for asynchronous stages: made on first use, reused (idle ones first), one pool per process."""
    return _process_pool(os.getpid())


@cache
def _process_pool(pid: int) -> ThreadPoolExecutor:
    # Keyed by pid: a forked child has none of its parent's threads and must start its own.
    return ThreadPoolExecutor(max_workers=STAGE_WORKERS, thread_name_prefix=f"tiletune-stage-{pid}")


class _Failure(NamedTuple):
    error: BaseException


class _CopyInStage:
    """Copies steps in, in order, on a worker; at most ``buffer_num`` slots filled ahead."""

    def __init__(self, copy_in: StageFn, step_count: int, buffer_num: int) -> None:
        self._copy_in = copy_in
        self._buffer_num = buffer_num
        self._filled: SimpleQueue[_Failure | None] = SimpleQueue()
        self._free: SimpleQueue[bool] = SimpleQueue()
        for _ in range(buffer_num):
            self._free.put(True)
        self._future: Future[None] = _stage_pool().submit(self._work, step_count)

    def _work(self, step_count: int) -> None:
        try:
            with torch.no_grad():
                for step in range(step_count):
                    if not self._free.get():
                        return
                    self._copy_in(step, step % self._buffer_num)
                    self._filled.put(None)
        except BaseException as error:
            self._filled.put(_Failure(error))

    def wait_filled(self) -> None:
        """Block until the next step's slot is filled; re-raise a copy-in failure."""
        failure = self._filled.get()
        if failure is not None:
            raise failure.error

    def release(self) -> None:
        """The oldest filled slot has been computed on; it may be refilled."""
        self._free.put(True)

    def close(self) -> None:
        """Stop early if still running and wait for the worker to finish."""
        self._free.put(False)
        self._future.result()


class _CopyOutStage:
    """Copies tiles out, in order, on a worker; hands back each output slot when done."""

    def __init__(self, copy_out: StageFn, buffer_num: int) -> None:
        self._copy_out = copy_out
        self._todo: SimpleQueue[tuple[int, int] | None] = SimpleQueue()
        self._free: SimpleQueue[_Failure | None] = SimpleQueue()
        self._error: BaseException | None = None
        for _ in range(buffer_num):
            self._free.put(None)
        self._future: Future[None] = _stage_pool().submit(self._work)

    def _work(self) -> None:
        with torch.no_grad():
            while (item := self._todo.get()) is not None:
                if self._error is None:
                    try:
                        self._copy_out(*item)
                    except BaseException as error:
                        self._error = error
                        self._free.put(_Failure(error))
                        continue
                self._free.put(None)

    def acquire(self) -> None:
        """Block until the next output slot's previous copy-out finished; re-raise its failure."""
        failure = self._free.get()
        if failure is not None:
            raise failure.error

    def submit(self, tile: int, slot: int) -> None:
        """Queue the copy-out of ``tile`` from ``slot``."""
        self._todo.put((tile, slot))

    def close(self) -> BaseException | None:
        """Finish queued copy-outs, stop the worker and return its failure, if any."""
        self._todo.put(None)
        self._future.result()
        return self._error


def _run_threaded(loop: TiledLoop, buffer_num: int, pipeline_depth: int) -> None:
    loader = _CopyInStage(loop.copy_in, loop.step_count, buffer_num)
    storer = _CopyOutStage(loop.copy_out, buffer_num) if pipeline_depth >= 3 else None
    completed = False
    try:
        step = 0
        for tile, count in enumerate(loop.tile_steps):
            out_slot = tile % buffer_num
            if storer is not None:
                storer.acquire()
            for _ in range(count):
                loader.wait_filled()
                loop.compute(step, step % buffer_num, out_slot)
                loader.release()
                step += 1
            if storer is not None:
                storer.submit(tile, out_slot)
            else:
                loop.copy_out(tile, out_slot)
        completed = True
    finally:
        loader.close()
        error = storer.close() if storer is not None else None
    if completed and error is not None:
        raise error


# -- CUDA / NPU: side streams ordered by events -------------------------------


def _run_streamed(loop: TiledLoop, buffer_num: int, pipeline_depth: int, device: torch.device) -> None:
    """Copy-in (and at depth 3 copy-out) on side streams; compute on the current stream.

    Events order the slots: a copy-in waits for the compute that last used its
    input slot, compute waits for its copy-in, a tile's first compute waits for
    the copy-out that last used its output slot, a copy-out for its tile's
    compute. The current stream finally waits for the side streams.
    """
    main = torch.accelerator.current_stream(device)
    loads = torch.Stream(device=device)
    stores = torch.Stream(device=device) if pipeline_depth >= 3 else None
    loaded = [torch.Event(device=device) for _ in range(buffer_num)]
    computed = [torch.Event(device=device) for _ in range(buffer_num)]
    finished = [torch.Event(device=device) for _ in range(buffer_num)]
    stored = [torch.Event(device=device) for _ in range(buffer_num)]
    loads.wait_stream(main)
    step = 0
    for tile, count in enumerate(loop.tile_steps):
        out_slot = tile % buffer_num
        if stores is not None and tile >= buffer_num:
            main.wait_event(stored[out_slot])
        for _ in range(count):
            slot = step % buffer_num
            with loads:
                if step >= buffer_num:
                    loads.wait_event(computed[slot])
                loop.copy_in(step, slot)
                loaded[slot].record(loads)
            main.wait_event(loaded[slot])
            loop.compute(step, slot, out_slot)
            computed[slot].record(main)
            step += 1
        if stores is None:
            loop.copy_out(tile, out_slot)
            continue
        finished[out_slot].record(main)
        with stores:
            stores.wait_event(finished[out_slot])
            loop.copy_out(tile, out_slot)
            stored[out_slot].record(stores)
    main.wait_stream(loads)
    if stores is not None:
        main.wait_stream(stores)
