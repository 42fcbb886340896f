"""Best configs: single-key lookup, bulk export / import, per-shape history; health and metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse

from tiletune.client.wire import ConfigBundle, HistoryPoint, LookupPublic
from tiletune.kernels import all_kernels
from tiletune.service import configs
from tiletune.service.dependencies import AdminDep, DatabaseDep, LookupCacheDep, ReaderDep
from tiletune.service.lookup import lookup
from tiletune.service.specs import kernel_info, parse_key

router = APIRouter(tags=["configs"])

ShapeQuery = Annotated[str, Query(description="dims as name=value pairs, e.g. m=64,n=64,k=64")]
Match = Annotated[str, Query(description="loosest answer accepted: exact | nearest | default")]


@router.get("/v1/configs/{kernel}")
async def lookup_config(
    kernel: str,
    *,
    shape: ShapeQuery,
    chip: str,
    db: DatabaseDep,
    cache: LookupCacheDep,
    _reader: ReaderDep,
    dtype: str = "float32",
    match: Match = "default",
) -> LookupPublic:
    """The config for one key: ``exact``, else the ``nearest`` tuned shape, else the ``default``.

    Answers are cached by the replica for ``lookup_cache_s`` (see ``Settings``).
    """
    key = (kernel, shape, dtype, chip, match)
    generation = db.generation
    answer = cache.get(key, generation)
    if answer is None:
        answer = await run_in_threadpool(lookup, db, kernel, shape, dtype=dtype, chip=chip, match=match)
        cache.put(key, generation, answer)
    return answer


@router.get("/v1/configs")
def export_configs(chip: str, db: DatabaseDep, _reader: ReaderDep, kernel: str | None = None) -> ConfigBundle:
    """Every best config of a chip (optionally one kernel): the client's prefetch and the export bundle.

    The bundle carries the info of every registered kernel (or of ``kernel``
    alone; none when it is not registered), so a client can pick the nearest
    tuned shape without the kernels' code.
    """
    kernels = all_kernels()
    specs = list(kernels.values()) if kernel is None else [kernels[kernel]] if kernel in kernels else []
    with db.read() as session:
        entries = configs.best_configs(session, chip, kernel)
    return ConfigBundle(
        exported_at=db.clock(),
        chip=chip,
        kernels=[kernel_info(spec) for spec in specs],
        configs=entries,
    ).sealed()


@router.post("/v1/configs/import")
def import_configs(
    bundle: ConfigBundle,
    db: DatabaseDep,
    _admin: AdminDep,
    force: Annotated[bool, Query(description="also replace bests measured on this server")] = False,
) -> dict[str, int]:
    """Store an exported bundle (admins): its checksum, then every entry against its kernel and chip.

    An entry replaces a key's best only if the key has none or it is faster, and a best measured
    on this server only with ``force``.
    """
    with db.write() as session:
        changed = configs.import_configs(session, bundle, db.clock(), force)
    return {"changed": changed}


@router.get("/v1/history/{kernel}")
def history(
    kernel: str,
    shape: ShapeQuery,
    db: DatabaseDep,
    _reader: ReaderDep,
    dtype: str = "float32",
    chip: str | None = None,
) -> list[HistoryPoint]:
    """Every promotion of one shape's best config, oldest first."""
    spec, parsed = parse_key(kernel, shape, dtype)
    with db.read() as session:
        return configs.history(session, spec.name, spec.canonical_shape(parsed), dtype, chip)


@router.get("/livez")
def livez() -> dict[str, str]:
    """``ok`` while the process serves (a liveness probe that does not depend on the database)."""
    return {"status": "ok"}


@router.get("/healthz")
def healthz(db: DatabaseDep) -> dict[str, str]:
    """``ok`` when the database answers (readiness)."""
    with db.read() as session:
        configs.counts(session)
    return {"status": "ok"}


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(db: DatabaseDep, _reader: ReaderDep) -> str:
    """Jobs by state and best configs stored, in Prometheus' text format."""
    with db.read() as session:
        counts = configs.counts(session)
    lines = ["# TYPE tiletune_jobs gauge"]
    lines += [f'tiletune_jobs{{state="{state}"}} {n}' for state, n in sorted(counts["jobs"].items())]
    lines += ["# TYPE tiletune_best_configs gauge", f"tiletune_best_configs {counts['best_configs']}"]
    return "\n".join(lines) + "\n"
