"""The token the test suite's servers start with and its callers send (an admin's)."""

from pydantic import SecretStr

ADMIN_TOKEN = "tt_the-test-suite-admin-token-0123456789abcdefghijk"
#: Headers of a request made with :data:`ADMIN_TOKEN`.
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

#: :data:`ADMIN_TOKEN` as the servers' settings take it.
ADMIN_SECRET = SecretStr(ADMIN_TOKEN)
