"""Whether a token a deployment supplies (``TILETUNE_ADMIN_TOKEN``, ``TILETUNE_WORKER_TOKEN``) is a
generated one: the one rule, shared by the server's settings and the tokens it mints.

A generated token is ``tt_`` followed by :data:`MIN_RANDOM_CHARS` to :data:`MAX_RANDOM_CHARS`
characters of ``A-Z a-z 0-9 _ -`` with

- no placeholder word (:data:`PLACEHOLDER_WORDS`, any case, anywhere in the token);
- at least :data:`MIN_DISTINCT_CHARS` different characters (:data:`MIN_DISTINCT_HEX_CHARS` when
  they are all hexadecimal digits or ``-``: 32 random hex digits show fewer than 12 in 1.7 % of
  draws, fewer than 8 in 4 of 10^8);
- no character :data:`MAX_RUN` or more times in a row.

Both ``'tt_' + secrets.token_urlsafe(32)`` (43 characters, what the server mints) and
``tt_`` + ``openssl rand -hex 32`` (64) pass (all but about one in 10^7 of the first, which drew
a placeholder word by chance, and one in 10^9 of the second: draw again); ``CHANGE-ME``,
``tt_changeme...``, a short or prefix-less value, or one character repeated are refused, with
the reason.

Standard library only: the server's settings import it before anything else is loaded.
"""

from __future__ import annotations

import re

#: What every tiletune token starts with.
TOKEN_PREFIX = "tt_"
#: Fewest characters after the prefix (``openssl rand -hex 16`` is 32; ``token_urlsafe(32)`` 43).
MIN_RANDOM_CHARS = 32
#: Most characters after the prefix (an input bound, not a strength rule).
MAX_RANDOM_CHARS = 256
#: Fewest different characters after the prefix (a urlsafe token of 43 has ~31).
MIN_DISTINCT_CHARS = 12
#: Fewest different characters after the prefix when all are hex digits or ``-`` (32 random ones have ~14).
MIN_DISTINCT_HEX_CHARS = 8
#: Fewest repeats of one character in a row that are refused.
MAX_RUN = 10
#: Words of example values and placeholders, refused in any case (none can occur in a hex token, and
#: a minted one that drew one is drawn again: :func:`tiletune.service.access.auth.new_secret`).
PLACEHOLDER_WORDS = ("change", "example", "placeholder", "replace", "password", "secret")
#: The command that makes a generated token, as error messages and the deploy docs show it.
GENERATE_COMMAND = "python3 -c \"import secrets; print('tt_' + secrets.token_urlsafe(32))\""

_RANDOM_PART = re.compile(r"[A-Za-z0-9_-]+")
_HEX_CHARS = frozenset("0123456789abcdefABCDEF-")
_RUN = re.compile(rf"(.)\1{{{MAX_RUN - 1},}}")


def token_weakness(token: str) -> str | None:
    """Why ``token`` is not a generated token (a phrase that never quotes it), or ``None`` when it is.

    See the module docstring for the rule.
    """
    lowered = token.lower()
    for word in PLACEHOLDER_WORDS:
        if word in lowered:
            return f"it contains {word!r}, a placeholder"
    if not token.startswith(TOKEN_PREFIX):
        return f"it does not start with {TOKEN_PREFIX!r}"
    random_part = token[len(TOKEN_PREFIX) :]
    if not _RANDOM_PART.fullmatch(random_part):
        return f"it has characters other than A-Z a-z 0-9 _ - after {TOKEN_PREFIX!r}"
    if len(random_part) < MIN_RANDOM_CHARS:
        return (
            f"it has {len(random_part)} characters after {TOKEN_PREFIX!r}, "
            f"fewer than the {MIN_RANDOM_CHARS} needed"
        )
    if len(random_part) > MAX_RANDOM_CHARS:
        return f"it has more than {MAX_RANDOM_CHARS} characters after {TOKEN_PREFIX!r}"
    characters = set(random_part)
    if len(characters) == 1:
        return "it is one character repeated"
    least = MIN_DISTINCT_HEX_CHARS if characters <= _HEX_CHARS else MIN_DISTINCT_CHARS
    if len(characters) < least:
        return f"it has only {len(characters)} different characters (a generated one has {least} or more)"
    if _RUN.search(random_part):
        return f"it repeats one character {MAX_RUN} or more times in a row"
    return None


def weak_token_message(weakness: str) -> str:
    """The whole refusal of a weak token: the reason, the rule, and how to make a good one."""
    return (
        f"not a generated token: {weakness} ({TOKEN_PREFIX!r} and {MIN_RANDOM_CHARS} or more random "
        f"characters of A-Z a-z 0-9 _ - are needed); make one with: {GENERATE_COMMAND}"
    )
