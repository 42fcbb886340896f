"""``compiled_matmul``: ``C = A @ B`` in float32 on CPUs, its tiles fixed when it is built (one build per
config). ``declaration`` (its space, torch-free), ``spec`` (the build recipe, loading and running a
build), ``csrc/compiled_matmul.cpp`` (the C++ kernel, no torch headers)."""
