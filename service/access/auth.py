"""Identities and roles: bearer tokens, and who may call what.

- A token is ``tt_`` and 43 URL-safe characters (32 random bytes: 256 bits). It is shown once,
  when created; the database keeps only its SHA-256 digest. A presented token is digested,
  its row found by the digest and the two digests compared in constant time; a revoked
  token is refused.
- Roles (:class:`~tiletune.client.wire.Role`): ``admin`` may do everything; ``submitter``
  submits sweeps and cancels its own; ``worker`` registers workers and writes only through
  the leases of its own workers; ``reader`` reads. Every valid token may read.
- Reads (lookups, exports, history, sweeps, jobs, misses, metrics) need a token unless
  ``Settings.open_reads`` (the command line opens them on a loopback address); a token that
  is presented must be valid all the same.
- The first admin token of a database without one comes from ``TILETUNE_ADMIN_TOKEN`` (a
  deployment's secret) or is made and shown once by ``tiletune server`` (:meth:`Tokens.bootstrap`).
  A database that has an admin token already (live or revoked) keeps its tokens: a
  ``TILETUNE_ADMIN_TOKEN`` it does not know (or has revoked) is ignored, with a warning in the
  log at start (never the token).
- ``TILETUNE_WORKER_TOKEN`` (a deployment's secret for its workers) becomes the worker token
  ``deploy-worker`` of every chip at start unless a token with its digest exists, live or revoked:
  a revoked one is never made again (:meth:`Tokens.provision_worker`).
- Both must be generated tokens (:mod:`tiletune.service.access.token_strength`; the settings refuse
  others), and so is every token made here.

Verified tokens are remembered for ``cache_s`` per replica (a revocation in this replica is
seen at once, in another within ``cache_s``), so a lookup does not query the tokens table.
Each replica also knows the digests of the live tokens (read at most once per
:data:`LIVE_REREAD_S`): :meth:`Tokens.may_be_live` lets a caller whose address has spent its
failed authentications still present a valid token, while guesses from it cost no query.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from tiletune.client.wire import ANY_CHIP, Role, TokenCreated, TokenPublic
from tiletune.service.access.token_strength import TOKEN_PREFIX, token_weakness
from tiletune.service.database import Database, aware
from tiletune.service.errors import ForbiddenError, NotFoundError, UnauthorizedError
from tiletune.service.models import TokenRow

log = logging.getLogger(__name__)

#: Random bytes of a token's secret.
TOKEN_BYTES = 32
#: Seconds a verified token is remembered by a replica.
TOKEN_CACHE_S = 5.0
#: Seconds between two reads of the live tokens' digests (:meth:`Tokens.may_be_live`).
LIVE_REREAD_S = 1.0
#: The name of the worker token of ``TILETUNE_WORKER_TOKEN``.
DEPLOY_WORKER_NAME = "deploy-worker"


@dataclass(frozen=True)
class Identity:
    """Who calls: a token's id, name and role; ``anonymous`` when reads are open and none was sent."""

    token_id: int | None
    name: str
    role: Role | None

    @property
    def anonymous(self) -> bool:
        """True for a caller without a token."""
        return self.token_id is None

    def may(self, role: Role) -> bool:
        """True when this identity holds ``role``: an admin holds every role, every token ``reader``."""
        if self.role is None:
            return False
        return self.role in (Role.ADMIN, role) or role == Role.READER


ANONYMOUS = Identity(None, "anonymous", None)


def new_secret() -> str:
    """A fresh token: the prefix and 256 random bits, a generated token by
    :func:`~tiletune.service.access.token_strength.token_weakness` (drawn again in the rare case it
    is not)."""
    while True:
        secret = TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)
        if token_weakness(secret) is None:
            return secret


def digest(secret: str) -> str:
    """The stored form of a token."""
    return hashlib.sha256(secret.encode()).hexdigest()


def _public(row: TokenRow) -> TokenPublic:
    return TokenPublic(
        id=row.id,
        name=row.name,
        role=row.role,
        created_at=aware(row.created_at),
        revoked_at=aware(row.revoked_at) if row.revoked_at is not None else None,
        chip=row.chip_name,
    )


class Tokens:
    """Creating, listing, revoking and verifying tokens; see the module docstring."""

    def __init__(
        self, db: Database, cache_s: float = TOKEN_CACHE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.db = db
        self.cache_s = cache_s
        self._clock = clock
        self._verified: dict[str, tuple[float, Identity]] = {}
        self._live: frozenset[str] = frozenset()
        self._live_read_at: float | None = None
        self._lock = threading.Lock()
        self._live_lock = threading.Lock()

    def create(self, role: Role, name: str, chip: str | None = None) -> TokenCreated:
        """A new token of ``role`` (a worker's bound to ``chip`` if given); its secret is in the answer."""
        secret = new_secret()
        with self.db.write() as session:
            row = TokenRow(
                name=name, role=role, digest=digest(secret), created_at=self.db.clock(), chip_name=chip
            )
            session.add(row)
            session.flush()
            created = TokenCreated(**_public(row).model_dump(), token=secret)
        with self._lock:
            self._live_read_at = None  # the live digests are read again when next asked
        return created

    def replace(self, role: Role, name: str) -> TokenCreated:
        """A new token of ``role`` named ``name``; the live tokens of that name are revoked."""
        with self.db.write() as session:
            for row in session.scalars(
                select(TokenRow).where(TokenRow.name == name, TokenRow.revoked_at.is_(None))
            ):
                row.revoked_at = self.db.clock()
        self._forget()
        return self.create(role, name)

    def list(self) -> Sequence[TokenPublic]:
        """Every token, oldest first, without secrets."""
        with self.db.read() as session:
            return [_public(row) for row in session.scalars(select(TokenRow).order_by(TokenRow.id))]

    def revoke(self, token_id: int) -> TokenPublic:
        """Revoke a token (for good); revoking it again changes nothing."""
        with self.db.write() as session:
            row = session.get(TokenRow, token_id)
            if row is None:
                raise NotFoundError(f"no token {token_id}", field="token_id")
            if row.revoked_at is None:
                row.revoked_at = self.db.clock()
            public = _public(row)
        self._forget()
        return public

    def _forget(self) -> None:
        """Forget what this replica remembered of its tokens (after a revocation here)."""
        with self._lock:
            self._verified.clear()
            self._live_read_at = None

    def bootstrap(self, admin_secret: str | None) -> str | None:
        """Give a database without an admin token its first one: ``admin_secret``, else a new one.

        Returns the secret when it was made here (to be shown once), else ``None``. A database
        that has an admin token (live or revoked) is left as it is: an ``admin_secret`` that is
        not one of its tokens, or is revoked, is ignored, and a warning says so (never the secret
        itself). Replicas starting together with the same ``admin_secret`` make one row (the
        digest is unique: the others find it).
        """
        try:
            return self._bootstrap(admin_secret)
        except IntegrityError:  # another replica stored the same secret first
            return self._bootstrap(admin_secret)

    def _bootstrap(self, admin_secret: str | None) -> str | None:
        with self.db.write() as session:
            admins = select(func.count()).select_from(TokenRow).where(TokenRow.role == Role.ADMIN)
            if session.scalar(admins):
                if admin_secret:
                    _warn_if_unusable(
                        session.scalar(select(TokenRow).where(TokenRow.digest == digest(admin_secret)))
                    )
                return None
            secret = admin_secret or new_secret()
            row = TokenRow(name="admin", role=Role.ADMIN, digest=digest(secret), created_at=self.db.clock())
            session.add(row)
        return None if admin_secret else secret

    def provision_worker(self, worker_secret: str) -> TokenPublic | None:
        """Make ``worker_secret`` the worker token :data:`DEPLOY_WORKER_NAME` of every chip (``*``),
        unless a token with its digest exists, live or revoked; returns the token made, else ``None``.

        Idempotent across restarts, and across replicas starting together (the digest is unique:
        the one that loses the race finds the winner's row). A revoked one is not made again, and
        one of another role is left as it is; a warning says so (never the secret).
        """
        try:
            return self._provision_worker(worker_secret)
        except IntegrityError:  # another replica stored it first
            return self._provision_worker(worker_secret)

    def _provision_worker(self, worker_secret: str) -> TokenPublic | None:
        stored = digest(worker_secret)
        with self.db.write() as session:
            row = session.scalar(select(TokenRow).where(TokenRow.digest == stored))
            if row is not None:
                _warn_if_not_a_live_worker(row)
                return None
            row = TokenRow(
                name=DEPLOY_WORKER_NAME,
                role=Role.WORKER,
                digest=stored,
                created_at=self.db.clock(),
                chip_name=ANY_CHIP,
            )
            session.add(row)
            session.flush()
            public = _public(row)
        log.info("TILETUNE_WORKER_TOKEN is now the worker token %r (id %d) of every chip", row.name, row.id)
        return public

    def remembered(self, secret: str) -> Identity | None:
        """The identity of a token verified within ``cache_s``, else ``None`` (never the database)."""
        found = self._verified.get(digest(secret))
        return found[1] if found is not None and found[0] > self._clock() else None

    def may_be_live(self, secret: str) -> bool:
        """True when ``secret``'s digest is among the live tokens' digests, read from the database
        at most once per :data:`LIVE_REREAD_S` (a token created in this replica is known at once,
        one made in another replica within that); False says the token is unknown or revoked."""
        presented = digest(secret)
        if presented in self._live:
            return True
        with self._live_lock:  # callers arriving during a read wait for its answer, not for none
            if presented in self._live:
                return True
            now = self._clock()
            if self._live_read_at is not None and now - self._live_read_at < LIVE_REREAD_S:
                return False
            self._live_read_at = now
            with self.db.read() as session:
                live = frozenset(
                    session.scalars(select(TokenRow.digest).where(TokenRow.revoked_at.is_(None)))
                )
            self._live = live
        return presented in live

    def identify(self, secret: str) -> Identity:
        """The identity of a presented token; :class:`UnauthorizedError` when unknown or revoked."""
        presented = digest(secret)
        now = self._clock()
        found = self._verified.get(presented)
        if found is not None and found[0] > now:
            return found[1]
        with self.db.read() as session:
            row = session.scalar(select(TokenRow).where(TokenRow.digest == presented))
        if row is None or not hmac.compare_digest(row.digest, presented) or row.revoked_at is not None:
            raise UnauthorizedError("unknown or revoked token", field="authorization")
        identity = Identity(row.id, row.name, Role(row.role))
        with self._lock:
            self._verified[presented] = (now + self.cache_s, identity)
        return identity


def _warn_if_unusable(row: TokenRow | None) -> None:
    """Warn that ``TILETUNE_ADMIN_TOKEN`` is ignored when it is not a live token of the database."""
    if row is None:
        log.warning(
            "TILETUNE_ADMIN_TOKEN is ignored: the database has tokens already and this is not one of "
            "them (it only gives a database without an admin token its first); sign in with an "
            "existing admin token, or create one with `tiletune token create --role admin`"
        )
    elif row.revoked_at is not None:
        log.warning("TILETUNE_ADMIN_TOKEN is ignored: it is the token %r (id %d), revoked", row.name, row.id)


def _warn_if_not_a_live_worker(row: TokenRow) -> None:
    """Warn that ``TILETUNE_WORKER_TOKEN`` is a revoked token, or one of another role."""
    if row.revoked_at is not None:
        log.warning(
            "TILETUNE_WORKER_TOKEN is ignored: it is the token %r (id %d), revoked; it is not made "
            "again: give the workers and the server a new one",
            row.name,
            row.id,
        )
    elif row.role != Role.WORKER:
        log.warning(
            "TILETUNE_WORKER_TOKEN is the token %r (id %d), a %s token: workers using it act as %s",
            row.name,
            row.id,
            row.role,
            row.role,
        )


def require(identity: Identity, role: Role) -> Identity:
    """``identity`` if it holds ``role``; 401 for no token, 403 for another role."""
    if identity.anonymous:
        raise UnauthorizedError(
            f"this needs a {role.value} token (Authorization: Bearer)", field="authorization"
        )
    if not identity.may(role):
        raise ForbiddenError(
            f"a {identity.role} token may not do this; it needs {role.value}", field="authorization"
        )
    return identity
