"""Revisions of the service's schema, one module each (``NNNN_slug.py``, revision id ``NNNN``).

Loaded by Alembic from their files, never imported by name. A revision is
frozen once released: it uses ``sqlalchemy`` types and literal constraint
names, never the current models.
"""
