"""``rms_norm_backward``: the gradients of ``rms_norm`` (``dx``, ``dw``), row-tiled as ``rms_norm``.
``declaration`` (its space, torch-free), ``formula`` (the untiled gradients: the reference, and torch's
op), ``portable`` (the tiled PyTorch pipeline), ``native`` (C++ on CPUs), ``triton`` (the Triton
kernel), ``vendor`` (torch's own op)."""
