"""``matmul``: ``C = A @ B``, float32 accumulation. ``declaration`` (its space, torch-free),
``portable`` (the tiled PyTorch pipeline), ``native`` (C++ on CPUs), ``triton`` (the Triton kernel),
``vendor`` (torch's own op)."""
