"""The configs that seed a new job's search, before any trial of it was measured.

First the best configs of the nearest tuned shapes of the same kernel, dtype and chip
(:func:`tiletune.service.configs.nearest_best`; the job's own shape left out), then the
fastest configs of the same key on other chips (:func:`tiletune.service.configs.other_chips_best`),
interleaved best first (:func:`tiletune.tuner.search.warm_start.interleave_seeds`). The search
measures them first, after the kernel's default, skipping invalid or repeated ones.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from tiletune.client.wire import Config
from tiletune.service import configs
from tiletune.service.configs import JobKey
from tiletune.service.models import JobRow
from tiletune.service.specs import lookup_kernel
from tiletune.tuner.search.warm_start import interleave_seeds

#: Nearest tuned shapes whose best configs seed a new job's search.
WARM_START_NEIGHBOURS = 3
#: Other chips whose fastest configs of the same key seed a new job's search (after the shapes')
#: and how many of each chip's (interleaved best first:
#: :func:`~tiletune.tuner.search.warm_start.interleave_seeds`).
WARM_START_CHIPS = 2
WARM_START_PER_CHIP = 4


def warm_start_configs(session: Session, job: JobRow) -> list[Config]:
    """The configs that seed ``job``'s search (a job of a chip), best first (see the module)."""
    assert job.chip_id is not None
    spec, shape, k = lookup_kernel(job.kernel), dict(job.shape), WARM_START_NEIGHBOURS + 1
    neighbours = configs.nearest_best(session, spec, shape, dtype=job.dtype, chip_id=job.chip_id, k=k)
    shapes = [row.config for _, row in neighbours if row.shape_key != job.shape_key]
    chips = configs.other_chips_best(
        session, JobKey.of(job), chips=WARM_START_CHIPS, per_chip=WARM_START_PER_CHIP
    )
    return shapes[:WARM_START_NEIGHBOURS] + interleave_seeds(chips, WARM_START_PER_CHIP)
