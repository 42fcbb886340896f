"""An example tiletune plugin: a tiled GELU. ``space`` declares it (torch-free), ``spec`` runs it."""
