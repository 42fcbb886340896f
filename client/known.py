"""The best configs a client knows for one chip, and how it picks among them.

Pure logic, no I/O: filled from the server's bulk export, single lookups, the
on-disk cache or an imported bundle. Contract:

- an entry is keyed by (kernel, kernel version, canonical shape, dtype); a
  newer promotion of a key replaces an older one (``promoted_at``);
- ``exact`` answers only entries of the caller's kernel version: an entry
  tuned with another version of the kernel is never used;
- ``nearest`` answers the entry of the closest shape of the same kernel
  version and dtype that agrees on every categorical dim (distance:
  :func:`tiletune.client.nearest.shape_distance`); it needs the kernel's
  :class:`~tiletune.client.wire.KernelInfo` (dims, categorical dims);
- shapes are canonicalised in the kernel's dim order when its info is known,
  as the server does; without it, in the caller's order;
- every entry is checked before it is taken (:func:`tiletune.client.knobs.config_problem`
  for its own shape, with the kernel's info when it is of the entry's version): one that
  fails is refused (handed to ``on_refused``) and never answered; when a kernel's info
  changes, the entries already taken for it are checked again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from tiletune.client.knobs import KnobCheck
from tiletune.client.nearest import nearest
from tiletune.client.wire import BestConfigPublic, ConfigBundle, KernelInfo

EntryKey = tuple[str, int, str, str]
#: Told of an entry refused by the check, and why.
OnRefused = Callable[[BestConfigPublic, str], None]


def with_defaults(shape: Mapping[str, int], info: KernelInfo | None) -> Mapping[str, int]:
    """``shape`` with the dims it leaves out that have a default (``info.dim_defaults``) filled in,
    as the server fills them: a value, or the value of the dim it names."""
    if info is None or all(dim in shape for dim in info.dim_defaults):  # the launch path: no copy
        return shape
    filled = dict(shape)
    for dim in info.dims:
        default = info.dim_defaults.get(dim)
        if dim not in filled and default is not None:
            named = filled.get(default) if isinstance(default, str) else default
            if named is not None:
                filled[dim] = named
    return filled


def canonical_shape(shape: Mapping[str, int], info: KernelInfo | None) -> str:
    """``dim=value,...`` in the kernel's dim order when known (the server's shape key), else as given."""
    if info is not None and set(info.dims) == shape.keys():
        return ",".join(f"{dim}={shape[dim]}" for dim in info.dims)
    return ",".join(f"{dim}={value}" for dim, value in shape.items())


class KnownConfigs:
    """Best configs of one chip by key, with the kernels' info; see the module docstring."""

    def __init__(self, chip: str, on_refused: OnRefused | None = None) -> None:
        self.chip = chip
        self.kernels: dict[str, KernelInfo] = {}
        self._entries: dict[EntryKey, BestConfigPublic] = {}
        self._on_refused = on_refused
        self._checks: dict[tuple[str, int], KnobCheck] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[BestConfigPublic]:
        """Every entry, sorted by kernel and shape."""
        return sorted(
            self._entries.values(), key=lambda e: (e.kernel, e.kernel_version, e.shape_key, e.dtype)
        )

    def add(self, entries: Iterable[BestConfigPublic], kernels: Iterable[KernelInfo] = ()) -> int:
        """Take entries of this chip (newer promotions win, checked ones only) and kernel infos;
        how many entries changed."""
        renewed = set()
        for info in kernels:
            if self.kernels.get(info.name) != info:
                renewed.add(info.name)
            self.kernels[info.name] = info
        if renewed:
            self._checks = {key: check for key, check in self._checks.items() if key[0] not in renewed}
            self._recheck(renewed)
        changed = 0
        for entry in entries:
            if entry.chip != self.chip or not self._accepts(entry):
                continue
            key = (entry.kernel, entry.kernel_version, entry.shape_key, entry.dtype)
            known = self._entries.get(key)
            if known is None or known.promoted_at < entry.promoted_at:
                self._entries[key] = entry
                changed += 1
        return changed

    def info_of(self, kernel: str, version: int | None) -> KernelInfo | None:
        """The kernel's info if it describes ``version`` (``None``: any), else ``None``."""
        info = self.kernels.get(kernel)
        return info if info is not None and (version is None or info.version == version) else None

    def _accepts(self, entry: BestConfigPublic) -> bool:
        key = (entry.kernel, entry.kernel_version)
        check = self._checks.get(key)
        if check is None:
            check = self._checks[key] = KnobCheck(self.info_of(*key))
        problem = check.problem(entry.config, entry.shape)
        if problem is not None and self._on_refused is not None:
            self._on_refused(entry, problem)
        return problem is None

    def _recheck(self, kernels: set[str]) -> None:
        """Drop the entries of ``kernels`` that fail the check under their (new) info."""
        for key, entry in list(self._entries.items()):
            if entry.kernel in kernels and not self._accepts(entry):
                del self._entries[key]

    def add_bundle(self, bundle: ConfigBundle) -> int:
        """Take a bundle's entries and kernel infos."""
        return self.add(bundle.configs, bundle.kernels)

    def bundle(self) -> ConfigBundle:
        """Everything known, as a bundle (for the disk cache and export)."""
        return ConfigBundle(
            chip=self.chip, kernels=list(self.kernels.values()), configs=self.entries()
        ).sealed()

    def exact(
        self, kernel: str, version: int, shape: Mapping[str, int], dtype: str
    ) -> BestConfigPublic | None:
        """The entry tuned for exactly this key with this kernel version."""
        info = self.kernels.get(kernel)
        key = (kernel, version, canonical_shape(with_defaults(shape, info), info), dtype)
        return self._entries.get(key)

    def nearest(
        self, kernel: str, version: int, shape: Mapping[str, int], dtype: str
    ) -> tuple[float, BestConfigPublic] | None:
        """The entry of the nearest comparable shape (needs the kernel's info), with its distance."""
        info = self.kernels.get(kernel)
        if info is None:
            return None
        candidates = (
            (entry.shape, entry.shape_key, entry)
            for (k, v, _, d), entry in self._entries.items()
            if k == kernel and v == version and d == dtype
        )
        found = nearest(with_defaults(shape, info), candidates, info.categorical, k=1)
        return found[0] if found else None
