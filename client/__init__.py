"""tiletune.client: the runtime lookup library used at kernel launch.

Owns the wire schemas shared with the server and (from the client issue on) the
``ConfigClient`` / ``AsyncConfigClient``. May import httpx and pydantic only:
never torch, optuna, fastapi or sqlalchemy.
"""
