"""``fused_attention_backward``: FlashAttention-2's backward (``dq``, ``dk``, ``dv`` from the saved
log-sum-exp). ``declaration`` (its space, torch-free), ``formula`` (the reference), ``portable`` (the tiled
PyTorch pipeline), ``native`` (C++ on CPUs), ``triton`` (the Triton kernels),
``vendor`` (torch's own op)."""
