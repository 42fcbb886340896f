"""Builds of kernels whose configs are fixed at build time: a recipe, and a cache of its artifacts on disk.

In Ascend C, CATLASS or CUTLASS-style kernels a tile shape is a template parameter: each config is a
build. A kernel that declares such knobs (:attr:`KernelDeclaration.build_knobs
<tiletune.kernels.declaration.KernelDeclaration.build_knobs>`) describes how to build one config with a
:class:`BuildRecipe` (its sources, its compiler, and either a command template or a Python hook), and
gets the artifact of a config from a :class:`BuildCache`:

- **Keyed** by everything the artifact depends on (:meth:`BuildCache.key`): the sources' bytes, the
  compiler (its resolved path and what ``--version`` prints), the flags, the command template (or the
  hook's name) and the build-time knobs' values. A changed source, another compiler or other flags
  are another build; configs differing only in run-time knobs share one.
- **Built once**, whoever asks: a build runs under an exclusive ``flock`` of its key, so two threads
  or processes never build the same key twice (the second waits, then finds the artifact); it is
  built into a temporary directory and published by one ``rename``, so a reader never sees half an
  artifact and a builder killed midway leaves nothing under the key.
- **A failure is an artifact too**: the compiler's message (trimmed, :func:`trim_message`) is published
  under the key and raised as :class:`BuildError` by every later :meth:`~BuildCache.get` of it, so a
  bench records it as a failed trial (and a trial process reads it instead of compiling again).
- **Retried when it could succeed**: a failure the key fully explains (the compiler ran and refused
  the sources, a hook raised) is kept for good, since the same sources, compiler, flags and config fail
  the same way and changing any of them is another key; a *transient* one (:attr:`BuildError.transient`:
  the build timed out, the compiler could not start or was killed by a signal, a hook ran out of
  memory or disk) is kept :attr:`BuildCache.retry_s` seconds (:data:`RETRY_TRANSIENT_S`), then built
  again by the next :meth:`~BuildCache.get`. Deleting ``root/<recipe>/<key>`` forces a rebuild.
- **No leftovers**: a builder killed midway leaves its temporary directory (``.build-<key>.*``); it
  is removed when a build of that key starts, and when a :class:`BuildCache` opens (any key whose lock
  no builder holds, :meth:`BuildCache.remove_leftovers`).
- **Counted**: :attr:`BuildCache.stats` counts this process's builds, hits and failures, and the
  seconds spent building; :meth:`BuildCache.entries` lists what is published on disk (any process's).

The cache on disk is the interface between a worker building ahead and the process that measures:
both ask the same :class:`BuildCache` root. Root: ``$TILETUNE_BUILD_DIR``, else
``$TILETUNE_CACHE_DIR/builds``, else ``$XDG_CACHE_HOME/tiletune/builds`` (``~/.cache/tiletune/builds``).

Torch-free, standard library only (POSIX: ``fcntl``). Nothing is compiled on import.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Protocol, runtime_checkable

BUILD_DIR_ENV = "TILETUNE_BUILD_DIR"
CACHE_DIR_ENV = "TILETUNE_CACHE_DIR"
#: What a failed build publishes under its key instead of the artifact.
ERROR_FILE = "error.txt"
#: What every published build records beside its artifact (config, compiler, command, seconds).
RECORD_FILE = "build.json"
#: The most characters of a compiler's message kept (the wire's reasons hold 2,000).
MESSAGE_CHARS = 1500
#: Seconds a transient build failure (:attr:`BuildError.transient`) is kept before it is built again.
RETRY_TRANSIENT_S = 600.0
#: The prefix of a build's temporary directory (``.build-<key>.<random>``) beside its key.
TEMP_PREFIX = ".build-"
#: Seconds after which a temporary directory whose name carries no key is a leftover.
UNKEYED_LEFTOVER_S = 3600.0


class BuildError(RuntimeError):
    """A config could not be built; the message is the compiler's (trimmed), or why it could not run.

    ``transient``: the failure is not the sources' (a timeout, a compiler that could not start or was
    killed, a hook out of memory or disk), so the cache builds the config again after a while.
    """

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class BuildContext:
    """What a build hook gets: the recipe, the build-time knobs' values, where to write the artifact
    (``output``, inside ``workdir``, a fresh directory the hook may use) and the compiler's path."""

    recipe: BuildRecipe
    values: Mapping[str, int]
    output: Path
    workdir: Path
    compiler: str


#: A Python build hook: writes ``context.output`` or raises (:class:`BuildError` with the compiler's
#: message; any other exception becomes one naming its type).
BuildHook = Callable[[BuildContext], None]


@dataclass(frozen=True)
class BuildRecipe:
    """How to build one config of a kernel.

    ``command`` is a template of the compiler's argument list: ``{compiler}``, ``{output}``,
    ``{workdir}`` and each build-time knob (``{tile_m}``) are replaced inside an argument; an argument
    that is exactly ``{sources}`` or ``{flags}`` becomes the sources' paths or the flags. ``hook`` is a
    Python function instead (:data:`BuildHook`); exactly one of them is given (``ValueError``).
    ``compiler`` is the executable (a name looked up on ``PATH``, or a path); ``version_args``
    make it print its version, which is part of the key. ``artifact`` is the built file's name.
    """

    name: str
    sources: tuple[Path, ...]
    artifact: str
    compiler: str
    flags: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    hook: BuildHook | None = None
    version_args: tuple[str, ...] = ("--version",)
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if bool(self.command) == (self.hook is not None):
            raise ValueError(f"build recipe {self.name}: give a command template or a hook, not both or none")

    def arguments(self, compiler: str, values: Mapping[str, int], output: Path, workdir: Path) -> list[str]:
        """The command template filled in (see the class docstring); ``KeyError`` for an unknown name."""
        names = {"compiler": compiler, "output": str(output), "workdir": str(workdir), **values}
        args: list[str] = []
        for part in self.command:
            if part == "{sources}":
                args += [str(source) for source in self.sources]
            elif part == "{flags}":
                args += list(self.flags)
            else:
                args.append(part.format(**names))
        return args


@runtime_checkable
class BuiltPerConfig(Protocol):
    """A kernel spec whose configs are builds: it names its build-time knobs and builds a config's
    artifact through a :class:`BuildCache` (returning its path; :class:`BuildError` on failure)."""

    build_knobs: tuple[str, ...]

    def build_config(self, config: Mapping[str, int]) -> Path:
        """The artifact of ``config`` (built now unless cached)."""
        ...


def trim_message(text: str, limit: int = MESSAGE_CHARS) -> str:
    """A compiler's output made short enough to store: its ``error`` lines first when it has any,
    then the rest, cut at ``limit`` characters with a note of what was left out."""
    lines = [line.rstrip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    ordered = errors + [line for line in lines if line not in errors] if errors else lines
    kept: list[str] = []
    used = 0
    for line in ordered:
        if used + len(line) + 1 > limit:
            kept.append(f"… ({len(ordered) - len(kept)} more lines)")
            break
        kept.append(line)
        used += len(line) + 1
    return "\n".join(kept) or "(no output)"


def run_compiler(args: Sequence[str], cwd: Path, timeout_s: float) -> None:
    """Run a compiler command; :class:`BuildError` with its trimmed output when it fails or times out."""
    try:
        done = subprocess.run(
            list(args),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env={**os.environ, "LC_ALL": "C"},  # plain ASCII messages, whatever the locale
        )
    except subprocess.TimeoutExpired:
        message = f"the build timed out after {timeout_s:g} s: {' '.join(args[:3])} …"
        raise BuildError(message, transient=True) from None
    except OSError as error:
        raise BuildError(f"the compiler could not run: {error}", transient=True) from None
    if done.returncode < 0:  # killed (the OOM killer, a stopping machine): not the sources' fault
        output = trim_message(done.stderr + done.stdout)
        raise BuildError(f"the compiler was killed by signal {-done.returncode}: {output}", transient=True)
    if done.returncode != 0:
        raise BuildError(trim_message(done.stderr + done.stdout))


@cache
def _compiler_identity(path: str, mtime_ns: int, version_args: tuple[str, ...]) -> str:
    """What the compiler at ``path`` prints for ``version_args`` (cached per file version)."""
    try:
        done = subprocess.run([path, *version_args], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BuildError(f"the compiler {path} does not answer {' '.join(version_args)}: {error}") from None
    return f"{path}\n{done.stdout}{done.stderr}"


@cache
def _file_digest(path: Path, mtime_ns: int, size: int) -> str:
    """SHA-256 of a file's bytes (cached per file version: a source is read once per change)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def resolve_compiler(recipe: BuildRecipe) -> tuple[str, str]:
    """The compiler's path and identity (path and version output); :class:`BuildError` when absent."""
    path = shutil.which(recipe.compiler)
    if path is None:
        raise BuildError(f"compiler {recipe.compiler!r} not found on PATH: install it to build {recipe.name}")
    return path, _compiler_identity(path, os.stat(path).st_mtime_ns, recipe.version_args)


def build_root() -> Path:
    """Where builds live (see the module docstring); read from the environment on each call."""
    if os.environ.get(BUILD_DIR_ENV):
        return Path(os.environ[BUILD_DIR_ENV])
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]) / "builds"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tiletune" / "builds"


@dataclass
class BuildStats:
    """This process's use of one cache: builds made (``built``, of which ``failed``), artifacts found
    (``hits``, failures found included) and the seconds spent in builds (``build_s``)."""

    built: int = 0
    failed: int = 0
    hits: int = 0
    build_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, *, built: int = 0, failed: int = 0, hits: int = 0, build_s: float = 0.0) -> None:
        """Count (thread-safe)."""
        with self._lock:
            self.built, self.failed, self.hits = self.built + built, self.failed + failed, self.hits + hits
            self.build_s += build_s

    def as_dict(self) -> dict[str, float]:
        """JSON-ready counts."""
        return {"built": self.built, "failed": self.failed, "hits": self.hits, "build_s": self.build_s}


@contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if absent) for the block; threads and
    processes alike wait for it (each open is its own lock holder)."""
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@contextmanager
def _unheld(path: Path) -> Iterator[bool]:
    """Whether the ``flock`` on ``path`` was free: if so it is held for the block (not waited for)."""
    with path.open("a") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


class BuildCache:
    """Artifacts of build recipes under ``root`` (default :func:`build_root`); see the module docstring.

    Layout: ``root/<recipe>/<key>/`` holds the artifact (or :data:`ERROR_FILE`) and
    :data:`RECORD_FILE`; ``root/<recipe>/<key>.lock`` is the key's lock. Thread-safe. Opening one
    removes the leftovers of killed builders (:meth:`remove_leftovers`). ``retry_s``: how long a
    transient failure is kept before it is built again.
    """

    def __init__(self, root: Path | None = None, retry_s: float = RETRY_TRANSIENT_S) -> None:
        self.root = root if root is not None else build_root()
        self.retry_s = retry_s
        self.stats = BuildStats()
        self.remove_leftovers()

    def key(self, recipe: BuildRecipe, values: Mapping[str, int]) -> str:
        """The digest of what a build of ``values`` depends on (see the module docstring)."""
        digest = hashlib.sha256(recipe.name.encode())
        for source in recipe.sources:
            stat = source.stat()
            digest.update(
                f"\0source {source.name}\0{_file_digest(source, stat.st_mtime_ns, stat.st_size)}".encode()
            )
        digest.update(resolve_compiler(recipe)[1].encode())
        how = (
            recipe.command
            if recipe.hook is None
            else (f"{recipe.hook.__module__}.{recipe.hook.__qualname__}",)
        )
        for part in (
            *recipe.flags,
            "\0command",
            *how,
            "\0values",
            *(f"{k}={values[k]}" for k in sorted(values)),
        ):
            digest.update(f"\0{part}".encode())
        return digest.hexdigest()[:24]

    def directory(self, recipe: BuildRecipe, values: Mapping[str, int]) -> Path:
        """Where the build of ``values`` is (or will be) published."""
        return self.root / recipe.name / self.key(recipe, values)

    def get(self, recipe: BuildRecipe, values: Mapping[str, int]) -> Path:
        """The artifact of ``values``: found, or built now (waiting for another builder of the key).

        Raises :class:`BuildError` with the compiler's message when the build failed (now, or before
        and kept: see the module docstring for when a failure is built again).
        """
        final = self.directory(recipe, values)
        found = self._found(recipe, final)
        if found is None:
            final.parent.mkdir(parents=True, exist_ok=True)
            with _exclusive(final.parent / f"{final.name}.lock"):
                found = self._found(recipe, final)  # another builder may have published it meanwhile
                if found is None:
                    found = self._build(recipe, values, final)
                else:
                    self.stats.add(hits=1)
        else:
            self.stats.add(hits=1)
        if isinstance(found, BuildError):
            raise found
        return found

    def entries(self, recipe: BuildRecipe) -> list[str]:
        """The keys published for ``recipe`` on disk (by any process), sorted."""
        folder = self.root / recipe.name
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))

    def remove_leftovers(self) -> int:
        """Remove the temporary directories of builds that never published (their builder was killed):
        those of a key whose lock no builder holds, and those without a key older than
        :data:`UNKEYED_LEFTOVER_S`. Returns how many were removed."""
        removed = 0
        folders = [p for p in self.root.iterdir() if p.is_dir()] if self.root.is_dir() else []
        for folder in folders:
            for path in folder.glob(f"{TEMP_PREFIX}*"):
                key, dot, _ = path.name[len(TEMP_PREFIX) :].partition(".")
                if not dot:
                    if time.time() - path.stat().st_mtime > UNKEYED_LEFTOVER_S:
                        _remove(path)
                        removed += 1
                    continue
                with _unheld(folder / f"{key}.lock") as free:
                    if free:
                        _remove(path)
                        removed += 1
        return removed

    def _found(self, recipe: BuildRecipe, final: Path) -> Path | BuildError | None:
        """What is published at ``final``: the artifact, or the failure to raise; None when nothing
        is, when it is a transient failure older than :attr:`retry_s`, or when it vanished while read
        (being replaced: the caller takes the key's lock and looks again)."""
        try:
            record = json.loads((final / RECORD_FILE).read_text())
            if record.get("ok", True):
                return final / recipe.artifact
            message = (final / ERROR_FILE).read_text(errors="replace")
        except FileNotFoundError:
            return None
        transient = bool(record.get("transient"))
        if transient and time.time() - float(record.get("finished_at", 0.0)) >= self.retry_s:
            return None
        return BuildError(message, transient=transient)

    def _build(self, recipe: BuildRecipe, values: Mapping[str, int], final: Path) -> Path | BuildError:
        """Build into a temporary directory beside ``final`` and publish it by renaming (under the
        key's lock, after removing the key's leftovers; an expired failure there is replaced)."""
        for leftover in final.parent.glob(f"{TEMP_PREFIX}{final.name}.*"):
            _remove(leftover)
        started = time.monotonic()
        workdir = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{final.name}.", dir=final.parent))
        failure: BuildError | None = None
        try:
            compiler = resolve_compiler(recipe)[0]
            output = workdir / recipe.artifact
            if recipe.hook is not None:
                recipe.hook(BuildContext(recipe, dict(values), output, workdir, compiler))
            else:
                run_compiler(recipe.arguments(compiler, values, output, workdir), workdir, recipe.timeout_s)
            if not output.exists():
                raise BuildError(f"the build of {recipe.name} finished without writing {recipe.artifact}")
        except BuildError as error:
            failure = error
        except Exception as error:  # a hook's own failure is the config's failure, with its type
            transient = isinstance(error, (OSError, MemoryError))  # out of disk or memory, not the config
            failure = BuildError(trim_message(f"{type(error).__name__}: {error}"), transient=transient)
        seconds = time.monotonic() - started
        record = {"recipe": recipe.name, "values": dict(values), "seconds": seconds, "ok": failure is None}
        if failure is not None:
            (workdir / ERROR_FILE).write_text(str(failure))
            record |= {"transient": failure.transient, "finished_at": time.time()}
        (workdir / RECORD_FILE).write_text(json.dumps(record, sort_keys=True))
        if final.exists():  # an expired failure: moved aside (a leftover if we die now), then removed
            aside = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{final.name}.", dir=final.parent))
            os.rename(final, aside)
            _remove(aside)
        os.rename(workdir, final)
        self.stats.add(built=1, failed=int(failure is not None), build_s=seconds)
        return failure if failure is not None else final / recipe.artifact


_caches: dict[Path, BuildCache] = {}
_caches_lock = threading.Lock()


def shared_cache(root: Path | None = None) -> BuildCache:
    """The process's one :class:`BuildCache` of ``root`` (default :func:`build_root`, read now), so
    every spec and the build-ahead of a worker count into the same :attr:`BuildCache.stats`."""
    where = root if root is not None else build_root()
    with _caches_lock:
        if where not in _caches:
            _caches[where] = BuildCache(where)
        return _caches[where]
