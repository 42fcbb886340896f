"""What the GPU check (``benchmarks/gpu_check.py``) runs besides its keys: ``families`` (every
family's Triton kernel, forward and backward, against its reference and torch's op; each key tuned)
and ``fault`` (a trial whose kernel faults the GPU, in an isolated process; ``fault_jit``: its kernel)."""
