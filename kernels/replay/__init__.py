"""Recorded tuning spaces as kernels: ``recorded`` (the recordings), ``declaration`` (a recorded
space's declaration, torch-free), ``spec`` (its spec: nothing to run, measured by lookup)."""
