"""``/compare``: placeholder."""

from fastapi import APIRouter

router = APIRouter(include_in_schema=False)
