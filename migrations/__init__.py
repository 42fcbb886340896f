"""tiletune.migrations: the Alembic environment and versions of the service's tables.

Run through :mod:`tiletune.service.migrate` (``upgrade(url)`` at server start),
which needs no ini file: the scripts are found in this installed package.
History is linear; revision ids are ``0001``, ``0002``, ... and versions are
kept in the table ``tiletune_alembic_version`` (Optuna, which also uses
Alembic, keeps ``alembic_version``). ``alembic.ini`` here is for developers
only: ``alembic -c migrations/alembic.ini revision --autogenerate -m ...``.
"""
