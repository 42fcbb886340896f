"""What the Triton kernels share: ``space`` (launch knobs, torch-free), ``spec`` (device support,
launch options), the ``*jit`` modules (the ``@triton.jit`` kernels, imported with triton on first run)."""
