"""The tiled pipeline executor: slot rotation, stage overlap per depth, errors from every stage."""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable

import pytest
import torch

from tiletune.kernels.add import portable as add
from tiletune.kernels.fused_attention import portable as fused_attention
from tiletune.kernels.fused_attention.tiles import attention_steps
from tiletune.kernels.matmul import portable as matmul
from tiletune.kernels.pipeline import Slots, TiledLoop, check_pipeline, execute, tracing
from tiletune.kernels.softmax import portable as softmax

CPU = torch.device("cpu")
PIPELINES = [(1, 1), (2, 1), (2, 2), (3, 2), (4, 2), (2, 3), (3, 3), (4, 3)]


class Recorder:
    """A loop whose stages move step numbers through real slot tensors, checking what they read."""

    def __init__(self, tile_steps: list[int], buffer_num: int, stage_sleep_s: float = 0.0) -> None:
        self.tile_steps = tile_steps
        self.tile_of = [t for t, count in enumerate(tile_steps) for _ in range(count)]
        self.inputs = torch.full((buffer_num,), -1.0)
        self.outputs = torch.zeros(buffer_num)
        self.result = torch.zeros(len(tile_steps))
        self.sleep_s = stage_sleep_s
        self.fail: dict[str, int] = {}
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def _enter(self, stage: str, item: int) -> None:
        with self._lock:
            self.calls.append(stage)
        if self.fail.get(stage) == item:
            raise RuntimeError(f"{stage} {item} failed")

    def _work(self) -> None:
        if self.sleep_s:
            time.sleep(self.sleep_s)

    def copy_in(self, step: int, slot: int) -> None:
        self._enter("copy_in", step)
        self._work()
        self.inputs[slot] = step

    def compute(self, step: int, slot: int, out_slot: int) -> None:
        self._enter("compute", step)
        assert self.inputs[slot].item() == step, "a slot was overwritten before its compute"
        self._work()
        assert self.inputs[slot].item() == step, "a slot was overwritten during its compute"
        first = step == 0 or self.tile_of[step - 1] != self.tile_of[step]
        if first:
            self.outputs[out_slot] = 0
        self.outputs[out_slot] += step

    def copy_out(self, tile: int, out_slot: int) -> None:
        self._enter("copy_out", tile)
        self._work()
        self.result[tile] = self.outputs[out_slot]

    def loop(self) -> TiledLoop:
        return TiledLoop(self.tile_steps, self.copy_in, self.compute, self.copy_out)

    def expected(self) -> list[float]:
        sums = [0.0] * len(self.tile_steps)
        for step, tile in enumerate(self.tile_of):
            sums[tile] += step
        return sums


@pytest.mark.parametrize(("buffer_num", "depth"), PIPELINES)
def test_every_step_computes_on_its_own_slot_and_every_tile_is_copied_out(
    buffer_num: int, depth: int
) -> None:
    recorder = Recorder([3, 1, 2, 4, 1, 1, 5], buffer_num)
    with tracing() as trace:
        execute(recorder.loop(), buffer_num, depth, CPU)
    assert recorder.result.tolist() == recorder.expected()
    steps = sum(recorder.tile_steps)
    assert [(e.item, e.slot) for e in trace.of("copy_in")] == [(s, s % buffer_num) for s in range(steps)]
    assert [(e.item, e.slot) for e in trace.of("compute")] == [(s, s % buffer_num) for s in range(steps)]
    tiles = len(recorder.tile_steps)
    assert [(e.item, e.slot) for e in trace.of("copy_out")] == [(t, t % buffer_num) for t in range(tiles)]


@pytest.mark.parametrize(("buffer_num", "depth"), [(2, 2), (4, 2), (2, 3), (4, 3)])
def test_slots_are_never_overwritten_while_computed_on(buffer_num: int, depth: int) -> None:
    """Slow stages: copy-in races ahead, yet never into a slot compute still reads (checked twice)."""
    recorder = Recorder([2, 1, 3] * 5, buffer_num, stage_sleep_s=0.001)
    execute(recorder.loop(), buffer_num, depth, CPU)
    assert recorder.result.tolist() == recorder.expected()


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_stages_in_flight_match_the_pipeline_depth(depth: int) -> None:
    recorder = Recorder([1] * 8, buffer_num=3, stage_sleep_s=0.01)
    with tracing() as trace:
        execute(recorder.loop(), 3, depth, CPU)
    assert trace.max_in_flight == depth
    assert recorder.result.tolist() == recorder.expected()


def test_prefetch_runs_at_most_buffer_num_minus_one_steps_ahead() -> None:
    """With depth 2 and 3 buffers, copy-in of step s starts only after compute of step s-3 ended."""
    buffer_num = 3
    recorder = Recorder([1] * 12, buffer_num)
    with tracing() as trace:
        execute(recorder.loop(), buffer_num, 2, CPU)
    order = [(e.stage, e.item) for e in trace.events]
    for step in range(buffer_num, 12):
        assert order.index(("compute", step - buffer_num)) < order.index(("copy_in", step))


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("stage", "item"), [("copy_in", 0), ("copy_in", 5), ("compute", 4), ("copy_out", 3)])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_a_failing_stage_raises_in_the_caller_and_stops_the_pipeline(
    stage: str, item: int, depth: int
) -> None:
    recorder = Recorder([1] * 12, buffer_num=2)
    recorder.fail[stage] = item
    with pytest.raises(RuntimeError, match=f"{stage} {item} failed"):
        execute(recorder.loop(), 2, depth, CPU)
    calls = len(recorder.calls)
    time.sleep(0.05)
    assert len(recorder.calls) == calls, "a background stage kept running after the error"
    assert threading.active_count() < 80


def test_a_failing_last_copy_out_is_not_lost() -> None:
    recorder = Recorder([1] * 4, buffer_num=2)
    recorder.fail["copy_out"] = 3
    with pytest.raises(RuntimeError, match="copy_out 3 failed"):
        execute(recorder.loop(), 2, 3, CPU)


@pytest.mark.parametrize(
    ("buffer_num", "depth", "message"),
    [(0, 1, "buffer_num"), (1, 2, "buffer_num >= 2"), (2, 4, "pipeline_depth"), (2, 0, "pipeline_depth")],
)
def test_an_unrunnable_pipeline_is_refused(buffer_num: int, depth: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_pipeline(buffer_num, depth)
    with pytest.raises(ValueError, match=message):
        execute(Recorder([1], 1).loop(), buffer_num, depth, CPU)


def test_slots_are_contiguous_views_of_preallocated_buffers() -> None:
    slots = Slots(2, 12, torch.float32, CPU)
    full, part = slots.view(0, (3, 4)), slots.view(0, (2, 5))
    assert full.is_contiguous()
    assert part.is_contiguous()
    assert full.data_ptr() == part.data_ptr() != slots.view(1, (3, 4)).data_ptr()
    assert slots.view(0, (3, 4)) is full


# -- the kernels' tiles follow their knobs ------------------------------------


def traced(run: Callable[[], object]) -> tuple[list[tuple[int, int]], list[tuple[int, int]], int]:
    with tracing() as trace:
        run()
    copy_ins = [(e.item, e.slot) for e in trace.of("copy_in")]
    copy_outs = [(e.item, e.slot) for e in trace.of("copy_out")]
    return copy_ins, copy_outs, trace.max_in_flight


@pytest.mark.parametrize(("tile", "buffer_num", "depth"), [(256, 1, 1), (128, 3, 2), (64, 4, 3)])
def test_add_runs_one_step_per_tile_of_tile_size(tile: int, buffer_num: int, depth: int) -> None:
    shape = {"n": 1000}
    inputs = add.SPEC.make_inputs(shape, "float32", CPU)
    config = {"tile_size": tile, "buffer_num": buffer_num, "pipeline_depth": depth}
    copy_ins, copy_outs, in_flight = traced(lambda: add.SPEC.run(inputs, config, shape))
    tiles = math.ceil(1000 / tile)
    assert copy_ins == [(s, s % buffer_num) for s in range(tiles)]
    assert copy_outs == [(t, t % buffer_num) for t in range(tiles)]
    assert 1 <= in_flight <= depth


@pytest.mark.parametrize("layout", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_matmul_takes_one_step_per_k_tile_of_every_output_tile(layout: tuple[int, int]) -> None:
    """Whatever the operands' layouts (read in place): the same tiles and steps."""
    shape = {"m": 40, "n": 33, "k": 70, "a_transposed": layout[0], "b_transposed": layout[1]}
    config = {"tile_m": 16, "tile_n": 32, "tile_k": 32, "buffer_num": 2, "pipeline_depth": 2}
    inputs = matmul.SPEC.make_inputs(shape, "float32", CPU)
    assert matmul.SPEC.shape_of(inputs) == shape
    copy_ins, copy_outs, _ = traced(lambda: matmul.SPEC.run(inputs, config, shape))
    assert len(copy_outs) == 3 * 2
    assert len(copy_ins) == 3 * 2 * 3


def test_softmax_column_tiles_take_two_passes_per_row_tile() -> None:
    shape = {"rows": 10, "cols": 100}
    config = {"tile_rows": 4, "tile_cols": 32, "buffer_num": 2, "pipeline_depth": 3}
    inputs = softmax.SPEC.make_inputs(shape, "float32", CPU)
    copy_ins, copy_outs, _ = traced(lambda: softmax.SPEC.run(inputs, config, shape))
    assert len(copy_ins) == 3 * 2 * 4
    assert len(copy_outs) == 3 * 4


@pytest.mark.parametrize(
    ("seq_q", "seq_kv", "causal", "kv_blocks"),
    [
        (64, 64, 0, [4, 4, 4, 4]),
        (64, 64, 1, [1, 2, 3, 4]),
        (64, 64, 2, [1, 2, 3, 4]),  # square: both alignments are the diagonal
        (32, 64, 1, [1, 2]),  # top-left: query i sees keys 0..i
        (32, 64, 2, [3, 4]),  # bottom-right: query i sees keys 0..i + 32
        (64, 32, 2, [1, 1, 1, 2]),  # queries 0..31 see no key: one masked step writes their zeros
    ],
)
def test_causal_attention_skips_kv_blocks_above_the_diagonal(
    seq_q: int, seq_kv: int, causal: int, kv_blocks: list[int]
) -> None:
    shape = {
        "batch": 1,
        "heads": 2,
        "kv_heads": 2,
        "seq_q": seq_q,
        "seq_kv": seq_kv,
        "head_dim": 8,
        "causal": causal,
        "mask": 0,
    }
    config = {"block_q": 16, "block_kv": 16, "buffer_num": 2, "pipeline_depth": 2}
    inputs = fused_attention.SPEC.make_inputs(shape, "float32", CPU)
    copy_ins, copy_outs, _ = traced(lambda: fused_attention.SPEC.run(inputs, config, shape))
    assert len(copy_outs) == len(kv_blocks)
    assert len(copy_ins) == sum(kv_blocks)


# -- the accelerator path, on simulated streams ---------------------------------


class SimStream:
    """A stream that queues work; ``SimDevice.drain`` runs queued work in a random legal order."""

    def __init__(self, device: SimDevice) -> None:
        self.device = device
        self.queue: list[Callable[[], None] | tuple[SimStream, int]] = []
        self.done = 0
        device.streams.append(self)

    def __enter__(self) -> SimStream:
        self.device.current.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.device.current.pop()

    def enqueue(self, work: Callable[[], None]) -> None:
        self.queue.append(work)

    def wait_event(self, event: SimEvent) -> None:
        if event.mark is not None:
            self.queue.append(event.mark)

    def wait_stream(self, other: SimStream) -> None:
        self.queue.append((other, len(other.queue)))


class SimEvent:
    """Marks a point in a stream's queue when recorded; waiting on it waits for that point."""

    def __init__(self) -> None:
        self.mark: tuple[SimStream, int] | None = None

    def record(self, stream: SimStream) -> None:
        self.mark = (stream, len(stream.queue))


class SimDevice:
    """Streams and events with CUDA's ordering rules, run by a seeded random scheduler."""

    def __init__(self, seed: int) -> None:
        self.streams: list[SimStream] = []
        self.main = SimStream(self)
        self.current = [self.main]
        self.rng = random.Random(seed)

    def drain(self) -> None:
        while True:
            ready = [s for s in self.streams if s.done < len(s.queue) and self._ready(s.queue[s.done])]
            if not ready:
                break
            stream = self.rng.choice(ready)
            work = stream.queue[stream.done]
            if callable(work):
                work()
            stream.done += 1
        assert all(s.done == len(s.queue) for s in self.streams), "deadlock: work left that can never run"

    @staticmethod
    def _ready(work: Callable[[], None] | tuple[SimStream, int]) -> bool:
        return callable(work) or work[0].done >= work[1]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("buffer_num", "depth"), [(2, 2), (3, 2), (2, 3), (4, 3)])
def test_stream_events_order_every_slot_on_accelerators(
    monkeypatch: pytest.MonkeyPatch, buffer_num: int, depth: int, seed: int
) -> None:
    """Stages only enqueue work; a random legal execution order must still give the right result."""
    device = SimDevice(seed)
    monkeypatch.setattr(torch.accelerator, "current_stream", lambda _device=None: device.main)
    monkeypatch.setattr(torch, "Stream", lambda **_: SimStream(device))
    monkeypatch.setattr(torch, "Event", lambda **_: SimEvent())
    recorder = Recorder([2, 1, 3, 1, 1, 2, 1, 1], buffer_num)

    def deferred(stage: Callable[..., None]) -> Callable[..., None]:
        return lambda *args: device.current[-1].enqueue(lambda: stage(*args))

    loop = TiledLoop(
        recorder.tile_steps,
        deferred(recorder.copy_in),
        deferred(recorder.compute),
        deferred(recorder.copy_out),
    )
    execute(loop, buffer_num, depth, torch.device("cuda"))
    assert len(device.streams) == (2 if depth == 2 else 3)
    device.drain()
    assert recorder.result.tolist() == recorder.expected()


def test_causal_attention_cuts_the_kv_block_crossing_the_last_query() -> None:
    steps = attention_steps(64, 64, 16, 32, causal=1)
    spans = [[(s.kv.start, s.kv.stop) for s in steps if s.tile == t] for t in range(4)]
    assert spans == [[(0, 16)], [(0, 32)], [(0, 32), (32, 48)], [(0, 32), (32, 64)]]
    assert [s.masked for s in steps] == [True, True, False, True, False, True]


def test_bottom_right_causal_attention_cuts_where_the_last_query_of_a_block_stops() -> None:
    """``causal=2`` with 16 queries over 40 keys: query i sees keys 0..i + 24."""
    steps = attention_steps(16, 40, 8, 16, causal=2)
    spans = [[(s.kv.start, s.kv.stop) for s in steps if s.tile == t] for t in range(2)]
    assert spans == [[(0, 16), (16, 32)], [(0, 16), (16, 32), (32, 40)]]
    # a block's steps are masked past its first query's last key: 24 for block 0, 32 for block 1
    assert [s.masked for s in steps] == [False, True, False, False, True]
