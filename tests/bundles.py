"""Config bundles as an export makes them: entries and their checksum."""

from __future__ import annotations

from typing import Any

from tiletune.client.wire import BestConfigPublic, ConfigBundle

#: The software a test entry claims it was measured with (an import needs its provenance).
SOFTWARE = {"torch": "2.13.0", "python": "3.11"}


def sealed(*entries: dict[str, Any]) -> dict[str, Any]:
    """A bundle (as JSON) of ``entries``, with the checksum an export would give it."""
    bundle = ConfigBundle(configs=[BestConfigPublic.model_validate(entry) for entry in entries])
    document: dict[str, Any] = bundle.sealed().model_dump(mode="json")
    return document


def resealed(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` (a bundle someone changed) with its checksum made to match again."""
    resealed_document: dict[str, Any] = ConfigBundle.model_validate(document).sealed().model_dump(mode="json")
    return resealed_document
