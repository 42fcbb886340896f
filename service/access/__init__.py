"""Auth and limits: who the caller is and what a request may cost.

- ``auth``: bearer tokens, identities and roles; ``token_strength``: deployment tokens checked;
- ``ratelimit``: per-caller token buckets (the guessing limit, sweeps);
- ``bodies``: each route's body cap and deadline; ``body_json``: a body's structure checked first.
"""
