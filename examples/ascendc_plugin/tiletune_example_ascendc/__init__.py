"""An Ascend C vector add whose tile length and buffer count are compile-time constants: one build
per config with the CANN compiler (``bisheng``), tuned by tiletune like any kernel. Not run here."""
