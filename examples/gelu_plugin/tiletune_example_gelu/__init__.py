"""An example tiletune plugin: a tiled GELU. ``family`` is its record (what tiletune discovers),
``space`` declares it (torch-free), ``spec`` runs it."""
