"""Published peak throughput of known chips: what "the fraction of the chip's peak" is taken against.

A small declarative table (:data:`PEAKS`): each row names a chip model by a pattern, its dense
floating-point rate per dtype and its memory bandwidth, each figure as its vendor publishes it
(the source is given beside each row). :func:`peak_of` finds a chip's row by the model part of
its registered name (``cuda/NVIDIA H200/sm_90`` → ``NVIDIA H200``; a bare model name works too).

Conventions:

- rates are **dense** (no structured-sparsity doubling);
- ``float16`` and ``bfloat16`` are the tensor-core (cube unit) rates, the most a kernel on that
  dtype can reach; ``float32`` is the IEEE FP32 rate of the CUDA cores, not TF32: the kernels'
  float32 tolerance (``1e-4``) is beyond TF32's 10-bit mantissa, so float32 work runs at FP32;
- a chip whose figures its vendor does not publish per model is absent, and so are CPUs (their
  peak depends on the core count a worker may use and on clocks no name carries): unknown, never
  guessed.

:func:`ceiling_of` is the other use: the rates no call on a chip can exceed (a listed chip's peak
with a margin for caches and clocks; a CPU's per-core bounds times its cores; a generous bound
for any other), so that the service refuses a reported time no chip could reach
(:func:`fastest_possible_s`).

Standard library only; imports nothing of tiletune.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

TERA: Final = 1e12
GIGA: Final = 1e9


@dataclass(frozen=True)
class Peak:
    """A chip's published peak for one dtype: floating-point operations and bytes per second.

    Either is ``None`` where the vendor publishes no figure.
    """

    flops_per_s: float | None
    bytes_per_s: float | None


@dataclass(frozen=True)
class ChipPeaks:
    """One row of :data:`PEAKS`: a model pattern (a regular expression matching the whole model
    name, case-insensitively), dense TFLOP/s per dtype, memory bandwidth in GB/s, and the source."""

    pattern: str
    tflops: MappingProxyType[str, float]
    memory_gb_s: float | None
    source: str

    def peak(self, dtype: str) -> Peak | None:
        """The peak for ``dtype``; ``None`` when neither figure is known for it."""
        tflops = self.tflops.get(dtype)
        flops = tflops * TERA if tflops is not None else None
        memory = self.memory_gb_s * GIGA if self.memory_gb_s is not None else None
        if flops is None and memory is None:
            return None
        return Peak(flops, memory)


def _row(
    pattern: str, fp32: float | None, fp16: float | None, memory_gb_s: float | None, source: str
) -> ChipPeaks:
    """A row whose float16 and bfloat16 rates are equal (every chip listed here)."""
    tflops = {"float32": fp32, "float16": fp16, "bfloat16": fp16}
    known = {name: value for name, value in tflops.items() if value is not None}
    return ChipPeaks(pattern, MappingProxyType(known), memory_gb_s, source)


#: Most specific patterns first: the first whose pattern matches the model is the chip's.
PEAKS: Final[tuple[ChipPeaks, ...]] = (
    # NVIDIA H200 Tensor Core GPU datasheet (2024): H200 NVL FP32 60 TFLOPS, BF16/FP16 tensor
    # 1,671 TFLOPS with sparsity (835.5 dense), GPU memory bandwidth 4.8 TB/s.
    _row(r"NVIDIA H200 NVL", 60.0, 835.5, 4800.0, "NVIDIA H200 datasheet, H200 NVL column"),
    # Same datasheet: H200 SXM FP32 67 TFLOPS, BF16/FP16 tensor 1,979 TFLOPS with sparsity
    # (989.5 dense), 4.8 TB/s. torch names the SXM part "NVIDIA H200".
    _row(r"NVIDIA H200( SXM.*)?", 67.0, 989.5, 4800.0, "NVIDIA H200 datasheet, H200 SXM column"),
    # NVIDIA H100 Tensor Core GPU datasheet (2023): H100 NVL FP32 60 TFLOPS, BF16/FP16 tensor
    # 1,671 TFLOPS with sparsity (835.5 dense), 3.9 TB/s.
    _row(r"NVIDIA H100 NVL", 60.0, 835.5, 3900.0, "NVIDIA H100 datasheet, H100 NVL column"),
    # Same datasheet: H100 PCIe FP32 51 TFLOPS, BF16/FP16 tensor 1,513 TFLOPS with sparsity
    # (756.5 dense), 2 TB/s.
    _row(r"NVIDIA H100 PCIe", 51.0, 756.5, 2000.0, "NVIDIA H100 datasheet, H100 PCIe column"),
    # Same datasheet: H100 SXM FP32 67 TFLOPS, BF16/FP16 tensor 1,979 TFLOPS with sparsity
    # (989.5 dense), 3.35 TB/s. torch names it "NVIDIA H100 80GB HBM3".
    _row(r"NVIDIA H100( 80GB HBM3| SXM.*)?", 67.0, 989.5, 3350.0, "NVIDIA H100 datasheet, H100 SXM column"),
    # NVIDIA A100 Tensor Core GPU datasheet (2021): FP32 19.5 TFLOPS, BF16/FP16 tensor 312 TFLOPS
    # dense (624 with sparsity); memory bandwidth by part: 80GB SXM 2,039 GB/s, 80GB PCIe
    # 1,935 GB/s, 40GB (PCIe and SXM) 1,555 GB/s.
    _row(r"NVIDIA A100-SXM4-80GB", 19.5, 312.0, 2039.0, "NVIDIA A100 datasheet, A100 80GB SXM"),
    _row(r"NVIDIA A100 80GB PCIe", 19.5, 312.0, 1935.0, "NVIDIA A100 datasheet, A100 80GB PCIe"),
    _row(r"NVIDIA A100-(SXM4|PCIE)-40GB", 19.5, 312.0, 1555.0, "NVIDIA A100 datasheet, A100 40GB"),
    # Huawei's launch of the Ascend 910 (August 2019): 256 TFLOPS FP16 (the cube unit). No FP32
    # figure and no per-part memory bandwidth is published, so only float16 is known. The 910B
    # parts (Ascend910B1..B4) are absent: Huawei publishes no per-part figures, and the ones
    # quoted elsewhere disagree.
    _row(r"Ascend910A?", None, 256.0, None, "Huawei Ascend 910 launch, 2019-08-23"),
)

_COMPILED = tuple((re.compile(row.pattern, re.IGNORECASE), row) for row in PEAKS)
#: The chip kinds a registered name starts with (``kind/model/...``).
_KINDS = ("cpu", "cuda", "npu")


def model_of(chip_name: str) -> str:
    """The model part of a registered chip name (``cuda/NVIDIA H200/sm_90`` → ``NVIDIA H200``);
    a name without a kind prefix is taken as the model itself."""
    kind, slash, rest = chip_name.partition("/")
    if slash and kind in _KINDS:
        return rest.split("/", 1)[0].strip()
    return chip_name.strip()


def chip_peaks(chip_name: str) -> ChipPeaks | None:
    """The row of :data:`PEAKS` for a chip (by registered name or model), if it is listed; CPUs never are."""
    if chip_name.startswith("cpu/"):
        return None
    model = model_of(chip_name)
    for pattern, row in _COMPILED:
        if pattern.fullmatch(model):
            return row
    return None


def peak_of(chip_name: str, dtype: str) -> Peak | None:
    """The published peak of a chip for ``dtype``; ``None`` when the chip's figures for it are unknown."""
    row = chip_peaks(chip_name)
    return row.peak(dtype) if row is not None else None


def peak_fraction(peak: Peak | None, flops_per_s: float | None, bytes_per_s: float | None) -> float | None:
    """The fraction of ``peak`` an achieved rate reaches on the resource that binds: the larger of
    achieved / peak FLOP/s and achieved / peak bytes/s, over the figures known on both sides."""
    if peak is None:
        return None
    fractions = [
        achieved / top
        for achieved, top in ((flops_per_s, peak.flops_per_s), (bytes_per_s, peak.bytes_per_s))
        if achieved is not None and achieved > 0 and top is not None and top > 0
    ]
    return max(fractions) if fractions else None


# -- ceilings: what no measurement on a chip can exceed -------------------------------------------

#: A listed chip's ceiling over its published peak: FLOP/s may run a little above the datasheet
#: (clocks); bytes/s counts a call's inputs and outputs, which on-chip caches serve several times
#: faster than the published memory bandwidth (an H100's L2 about 4x, its shared memory about 10x).
LISTED_FLOPS_MARGIN: Final = 2.0
LISTED_BYTES_MARGIN: Final = 16.0
#: One CPU core at most: 6 GHz; float32 through two 16-lane FMA units (384 GFLOP/s), float16 and
#: bfloat16 through matrix units (AMX: 2,048 per cycle, 12.3 TFLOP/s); three 64-byte loads and
#: two 64-byte stores a cycle from L1 (1.9 TB/s).
CPU_CORE_FLOPS: Final = MappingProxyType({"float32": 384e9, "float16": 12.3e12, "bfloat16": 12.3e12})
CPU_CORE_BYTES_PER_S: Final = 1.92e12
#: A CPU whose cores were not reported is taken to have this many (more than any socket sold).
CPU_CORES_UNKNOWN: Final = 512
#: An accelerator not listed in :data:`PEAKS`: far above any sold (2026's largest reach about
#: 5 PFLOP/s dense at 16 bits and 8 TB/s).
UNLISTED_CEILING: Final = Peak(flops_per_s=50e15, bytes_per_s=1e15)


def ceiling_of(chip_name: str, kind: str, cores: int | None, dtype: str) -> Peak:
    """The rates no call on this chip can exceed, both figures always known: a listed chip's
    published peak with :data:`LISTED_FLOPS_MARGIN` / :data:`LISTED_BYTES_MARGIN` (a figure it does
    not publish: :data:`UNLISTED_CEILING`'s), a CPU's per-core bounds times its cores, else
    :data:`UNLISTED_CEILING`. A time that implies more is not a measurement."""
    if kind == "cpu":
        count = cores if cores is not None and cores > 0 else CPU_CORES_UNKNOWN
        per_core = CPU_CORE_FLOPS.get(dtype, max(CPU_CORE_FLOPS.values()))
        return Peak(per_core * count, CPU_CORE_BYTES_PER_S * count)
    peak = peak_of(chip_name, dtype)
    if peak is None:
        return UNLISTED_CEILING
    flops = peak.flops_per_s * LISTED_FLOPS_MARGIN if peak.flops_per_s is not None else None
    moved = peak.bytes_per_s * LISTED_BYTES_MARGIN if peak.bytes_per_s is not None else None
    return Peak(
        flops if flops is not None else UNLISTED_CEILING.flops_per_s,
        moved if moved is not None else UNLISTED_CEILING.bytes_per_s,
    )


def fastest_possible_s(flops: float, bytes_moved: float, ceiling: Peak) -> float:
    """The least time a call of ``flops`` and ``bytes_moved`` takes under ``ceiling``: the larger of
    its compute and its traffic at the ceiling's rates (0 for a call that counts neither)."""
    times = [
        amount / rate
        for amount, rate in ((flops, ceiling.flops_per_s), (bytes_moved, ceiling.bytes_per_s))
        if amount > 0 and rate is not None and rate > 0
    ]
    return max(times, default=0.0)
