"""Best configs: single-key lookup, bulk export / import, per-shape history; health and metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse

from tiletune.client.wire import ConfigBundle, HistoryPoint, KernelInfo, LookupPublic
from tiletune.kernels import KernelSpec, all_kernels
from tiletune.service.dependencies import LookupCacheDep, StoreDep
from tiletune.service.lookup import lookup, parse_key

router = APIRouter(tags=["configs"])

ShapeQuery = Annotated[str, Query(description="dims as name=value pairs, e.g. m=64,n=64,k=64")]
Match = Annotated[str, Query(description="loosest answer accepted: exact | nearest | default")]


@router.get("/v1/configs/{kernel}")
async def lookup_config(
    kernel: str,
    *,
    shape: ShapeQuery,
    chip: str,
    store: StoreDep,
    cache: LookupCacheDep,
    dtype: str = "float32",
    match: Match = "default",
) -> LookupPublic:
    """The config for one key: ``exact``, else the ``nearest`` tuned shape, else the ``default``.

    Answers are cached by the replica for ``lookup_cache_s`` (see ``Settings``).
    """
    key = (kernel, shape, dtype, chip, match)
    generation = store.generation
    answer = cache.get(key, generation)
    if answer is None:
        answer = await run_in_threadpool(lookup, store, kernel, shape, dtype=dtype, chip=chip, match=match)
        cache.put(key, generation, answer)
    return answer


@router.get("/v1/configs")
def export_configs(chip: str, store: StoreDep, kernel: str | None = None) -> ConfigBundle:
    """Every best config of a chip (optionally one kernel): the client's prefetch and the export bundle.

    The bundle carries the info of every registered kernel (or of ``kernel``
    alone; none when it is not registered), so a client can pick the nearest
    tuned shape without the kernels' code.
    """
    kernels = all_kernels()
    specs = list(kernels.values()) if kernel is None else [kernels[kernel]] if kernel in kernels else []
    return ConfigBundle(
        exported_at=store.clock(),
        chip=chip,
        kernels=[kernel_info(spec) for spec in specs],
        configs=store.best_configs(chip, kernel),
    )


def kernel_info(spec: KernelSpec) -> KernelInfo:
    """What a client needs of a kernel: name, version, dims in spec order, categorical dims, knobs."""
    return KernelInfo(
        name=spec.name,
        version=spec.version,
        dims=[dim.name for dim in spec.dims],
        categorical=[dim.name for dim in spec.dims if dim.categorical],
        knobs=[knob.name for knob in spec.knobs],
    )


@router.post("/v1/configs/import")
def import_configs(bundle: ConfigBundle, store: StoreDep) -> dict[str, int]:
    """Store an exported bundle; an entry replaces a key's best only if the key has none or it is faster."""
    return {"changed": store.import_configs(bundle.configs)}


@router.get("/v1/history/{kernel}")
def history(
    kernel: str, shape: ShapeQuery, store: StoreDep, dtype: str = "float32", chip: str | None = None
) -> list[HistoryPoint]:
    """Every promotion of one shape's best config, oldest first."""
    spec, parsed = parse_key(kernel, shape, dtype)
    return store.history(spec.name, spec.canonical_shape(parsed), dtype, chip)


@router.get("/livez")
def livez() -> dict[str, str]:
    """``ok`` while the process serves (a liveness probe that does not depend on the database)."""
    return {"status": "ok"}


@router.get("/healthz")
def healthz(store: StoreDep) -> dict[str, str]:
    """``ok`` when the database answers (readiness)."""
    store.counts()
    return {"status": "ok"}


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(store: StoreDep) -> str:
    """Jobs by state and best configs stored, in Prometheus' text format."""
    counts = store.counts()
    lines = ["# TYPE tiletune_jobs gauge"]
    lines += [f'tiletune_jobs{{state="{state}"}} {n}' for state, n in sorted(counts["jobs"].items())]
    lines += ["# TYPE tiletune_best_configs gauge", f"tiletune_best_configs {counts['best_configs']}"]
    return "\n".join(lines) + "\n"
