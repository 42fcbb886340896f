"""The replay device of the search benchmark: a recorded tuning space that "measures" a config
by looking it up.

The file format, what its parts mean (the invalid region, measured failures, the valid
space, the optimum) and the loader are :mod:`tiletune.kernels.replay.recorded`'s; this module adds
what the search needs: :class:`ReplaySpace`, a recorded space with its
:meth:`~ReplaySpace.search_space`, and :func:`load_replay`. The format's other names
(``replay_spaces``, ``ReplayError``, ...) are imported from :mod:`tiletune.kernels.replay.recorded`.
(The service tunes recorded spaces as kernels instead: :mod:`tiletune.kernels.replay.spec`.)

Imports ``tiletune.tuner.search.search`` and ``tiletune.kernels.replay.recorded`` (standard library only,
though importing the kernels package loads torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tiletune.kernels.replay.recorded import RecordedSpace, load_recorded
from tiletune.tuner.search.search import Config, SearchSpace

__all__ = ["ReplaySpace", "load_replay"]


@dataclass(frozen=True, eq=False)
class ReplaySpace(RecordedSpace):
    """A recorded space (:class:`~tiletune.kernels.replay.recorded.RecordedSpace`) a search can run over."""

    def search_space(self, seeds: Sequence[Config] = ()) -> SearchSpace:
        """The space for :class:`~tiletune.tuner.search.search.Search`.

        Seeded with nothing by default: Kernel Tuner records no default config,
        and any seed chosen from the recording would hand the search knowledge a
        real tuner does not have. Pass ``seeds=[space.median_config()]`` to
        mimic a mediocre hand-written default.
        """
        return SearchSpace(knobs=self.knobs, invalid_reason=self.invalid_reason, seeds=tuple(seeds))


def load_replay(path: Path | str) -> ReplaySpace:
    """Load a recorded space for the search (:func:`~tiletune.kernels.replay.recorded.load_recorded`).

    Parsed once per process; raises :class:`ReplayError` naming the path when the file is
    missing, not gzip, not JSON, or not in the expected format.
    """
    return load_recorded(path, ReplaySpace)
