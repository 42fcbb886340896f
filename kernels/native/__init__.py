"""What the native CPU kernels share: ``space`` (the ``block_dim`` knob, torch-free), ``spec`` (dispatch
to the extension), ``build`` (building ``csrc`` on the target machine, never on import)."""
