"""tiletune.service: the FastAPI server, its store and its job queue.

Arrives with the service issue. May import tiletune.tuner (search) and
tiletune.kernels (specs); never runs a kernel. Nothing imports it but its own
entry points.
"""
