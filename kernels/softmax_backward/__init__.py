"""``softmax_backward``: the gradient of ``softmax`` over the last dim, row-tiled as ``softmax``.
``declaration`` (its space, torch-free), ``portable`` (the tiled PyTorch pipeline), ``native`` (C++ on
CPUs), ``triton`` (the Triton kernel),
``vendor`` (torch's own op)."""
