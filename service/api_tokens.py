"""``/v1/tokens``: create (the secret is shown once), list and revoke tokens. Admins only."""

from __future__ import annotations

from fastapi import APIRouter

from tiletune.client.wire import TokenCreate, TokenCreated, TokenPublic
from tiletune.service.dependencies import AdminDep, IdPath, TokensDep
from tiletune.service.errors import ConflictError

router = APIRouter(prefix="/v1", tags=["tokens"])


@router.post("/tokens", status_code=201)
def create_token(request: TokenCreate, tokens: TokensDep, _admin: AdminDep) -> TokenCreated:
    """A new token of a role (a worker's optionally bound to ``chip``); the answer is the only place
    its secret appears."""
    return tokens.create(request.role, request.name, request.chip)


@router.get("/tokens")
def list_tokens(tokens: TokensDep, _admin: AdminDep) -> list[TokenPublic]:
    """Every token (never a secret), oldest first."""
    return list(tokens.list())


@router.post("/tokens/{token_id}/revoke")
def revoke_token(token_id: IdPath, tokens: TokensDep, admin: AdminDep) -> TokenPublic:
    """Revoke a token for good (seen by other replicas within seconds); never the caller's own (409)."""
    if token_id == admin.token_id:
        raise ConflictError("a token cannot revoke itself; revoke it with another admin token", "token_id")
    return tokens.revoke(token_id)
