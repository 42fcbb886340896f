"""Wire schemas of the REST API (``/v1``): what the server, the worker and the client exchange.

Pydantic models only; the server's ORM rows are separate (``service.models``).
Names follow FastAPI's full-stack template: ``*Create`` is what a caller sends,
``*Public`` what the server returns. Shapes and configs are plain
``{name: int}`` mappings; a shape's canonical string (dims in the spec's
order, ``batch=1,heads=8,...``) is part of every key.

Compatibility: what a caller sends (``*Create`` and the other request bodies, based on
``_Request``) is strict and refuses unknown fields; what the server answers (``*Public``
and the documents inside them, based on ``_Response``) ignores fields it does not know,
so clients and workers of an older release keep working against a newer server. A field
is added, never renamed.

The vocabularies (job, trial and sweep states, roles, strategies, match kinds, dtypes, device
kinds) and the shape text format (:func:`parse_dims`) are defined here once; every other
module imports them.

Imports pydantic and the standard library only (the client's install is tiny).
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    Strict,
    ValidationInfo,
    field_validator,
    model_serializer,
)

# -- bounded values: every input is bounded (integers to what the databases hold) ------------------

#: The largest integer the databases hold (a signed 64-bit integer).
MAX_DB_INT = 2**63 - 1
#: The largest dim or knob value (2^40: far beyond any tensor a chip holds).
MAX_DIM = 2**40
#: The most cores a chip may report (``ChipWire.cores``): far above any host's today.
MAX_CORES = 1 << 16
#: The most milliseconds a measurement may report (about 11.6 days), and the fewest (1 ns: no
#: timer resolves less, so a smaller time is made up).
MAX_MS = 1e9
MIN_MS = 1e-6


def _clean_text(text: str) -> str:
    """``text`` unless it holds control or format characters (NUL, bidirectional overrides, ...)."""
    for char in text:
        if unicodedata.category(char) in ("Cc", "Cf", "Cs", "Co", "Cn"):
            raise ValueError(f"must not contain the control or format character U+{ord(char):04X}")
    return text


#: An integer the databases hold, refusing ``true`` and ``"1"`` (JSON numbers only).
DbInt = Annotated[int, Strict(), Field(ge=0, le=MAX_DB_INT)]
#: An id: a positive :data:`DbInt`.
DbId = Annotated[int, Strict(), Field(ge=1, le=MAX_DB_INT)]
#: A search seed (NumPy's and Optuna's range).
Seed = Annotated[int, Strict(), Field(ge=0, lt=2**32)]
#: A time in milliseconds: finite and positive.
Millis = Annotated[float, Field(ge=MIN_MS, le=MAX_MS, allow_inf_nan=False)]
#: A name (chip, worker, sweep, software): printable text of 1 to 200 characters.
Name = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_clean_text)]
#: A free-text reason or message: printable, at most 2,000 characters.
Reason = Annotated[str, Field(max_length=2000), AfterValidator(_clean_text)]
#: A dim's or a knob's name.
Identifier = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
#: A dim's or a knob's value (categorical dims take 0).
DimValue = Annotated[int, Strict(), Field(ge=0, le=MAX_DIM)]

Shape = Annotated[dict[Identifier, DimValue], Field(max_length=16)]
Config = Annotated[dict[Identifier, DimValue], Field(max_length=32)]
#: A package's version in a software fingerprint.
Version = Annotated[str, Field(max_length=200), AfterValidator(_clean_text)]
#: The most characters of a software fingerprint's text (:func:`software_text`; the store's column).
MAX_SOFTWARE_TEXT = 1000


def software_text(software: dict[str, str | None]) -> str:
    """A software fingerprint as canonical JSON (sorted keys, ASCII): equal text means equal software."""
    return json.dumps(software, sort_keys=True, separators=(",", ":"))


def _storable_software(software: dict[str, str | None]) -> dict[str, str | None]:
    """``software`` unless its text is longer than the store keeps (:data:`MAX_SOFTWARE_TEXT`)."""
    if len(software_text(software)) > MAX_SOFTWARE_TEXT:
        raise ValueError(f"the fingerprint's JSON text must be at most {MAX_SOFTWARE_TEXT} characters")
    return software


#: A software fingerprint: package -> version (``None``: not installed). Whoever takes one in
#: (a worker's registration, an import) checks it against this one definition.
Software = Annotated[
    dict[Identifier, Version | None], Field(max_length=32), AfterValidator(_storable_software)
]


class JobState(StrEnum):
    """Where a job is in its life.

    The transitions are :mod:`tiletune.service.scheduling.lifecycle`'s table.
    """

    QUEUED = "queued"
    RUNNING = "running"
    VALIDATING = "validating"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"


#: Every job state, in life order.
JOB_STATES = tuple(state.value for state in JobState)
#: States of a job that still has work to do; every other state is final.
LIVE_JOB_STATES = (JobState.QUEUED, JobState.RUNNING, JobState.VALIDATING)
#: Final states.
FINAL_JOB_STATES = tuple(state for state in JobState if state not in LIVE_JOB_STATES)


class TrialState(StrEnum):
    """A trial's outcome so far: handed out (``asked``), told, or given up with its lease."""

    ASKED = "asked"
    MEASURED = "measured"
    INVALID = "invalid"
    FAILED = "failed"
    ABANDONED = "abandoned"
    VALIDATED = "validated"


class AskPhase(StrEnum):
    """What an ``ask`` tells a worker to do (see :class:`AskPublic`)."""

    SEARCH = "search"
    VALIDATE = "validate"
    WAIT = "wait"
    DONE = "done"


class Role(StrEnum):
    """What a token may do: ``admin`` everything; the others their part; every token may read."""

    ADMIN = "admin"
    SUBMITTER = "submitter"
    WORKER = "worker"
    READER = "reader"


class SweepState(StrEnum):
    """A sweep is ``running`` while any of its jobs is live, then ``finished``."""

    RUNNING = "running"
    FINISHED = "finished"


Strategy = Literal["tpe", "random", "grid"]
#: Search strategies: ``tpe`` (model-guided), ``random``, ``grid`` (every valid config).
STRATEGIES: tuple[str, ...] = get_args(Strategy)

Match = Literal["exact", "nearest", "default"]
#: How a lookup was answered, strictest first: tuned key, nearest tuned shape, the default rule.
MATCH_KINDS: tuple[str, ...] = get_args(Match)

#: Element types of kernel inputs.
DTYPES = ("float32", "float16", "bfloat16")
#: Device kinds a worker measures on (``auto``: the first one present of npu, cuda, cpu).
DEVICE_KINDS = ("cpu", "cuda", "npu")

#: The header that carries a lease's fencing token in the worker protocol's calls.
LEASE_TOKEN_HEADER = "X-Lease-Token"

#: The header of a request's id: the client sends a fresh one with each call, the server echoes it
#: (or the one it made) and writes it in every log line of the request.
REQUEST_ID_HEADER = "X-Request-ID"

#: The header of a sweep submission's idempotency key: the client sends one per submission, the
#: same on each retry, so a retried ``POST /v1/sweeps`` answers the first sweep (no second one).
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"

#: Most configs one ``ask`` hands out (``?n=``).
MAX_ASK = 64
#: Configs a worker asks per ``ask`` unless told otherwise (batched, and pipelined: see the worker).
DEFAULT_BATCH = 4
#: The most trial ids an ``ask`` may say it is holding (a batch measured, a batch asked ahead).
MAX_HOLDING = 2 * MAX_ASK

#: A job's chip target that any chip may take (the job binds to the first chip that leases it).
ANY_CHIP = "*"
#: The backend a job shows until its first lease chooses one: it names none, and runs the
#: implementation the leasing worker's chip runs best (see :class:`SweepCreate`).
ANY_BACKEND = "*"


class ShapeTextError(ValueError):
    """A shape text that is not ``name=value`` pairs; ``field`` names the part at fault."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def parse_dims(text: str) -> dict[str, object]:
    """``"m=64,n=32"`` -> ``{"m": 64, "n": 32}``; raises :class:`ShapeTextError` on bad syntax."""
    dims: dict[str, object] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ShapeTextError("shape", f"expected name=value pairs separated by commas, got {part!r}")
        if name in dims:
            raise ShapeTextError(f"shape.{name}", "given twice")
        try:
            dims[name] = int(value)
        except ValueError:
            raise ShapeTextError(f"shape.{name}", f"must be an integer, got {value.strip()!r}") from None
    if not dims:
        raise ShapeTextError("shape", "is empty; give name=value pairs such as m=64,n=64,k=64")
    return dims


def shape_text(shape: dict[str, int]) -> str:
    """The text form of a shape, dims in the given order: ``{"m": 64}`` -> ``"m=64"``."""
    return ",".join(f"{name}={value}" for name, value in shape.items())


class _Request(BaseModel):
    """A body a caller sends: unknown fields are refused (a typo is an error, not a default)."""

    model_config = ConfigDict(extra="forbid")


class _Response(BaseModel):
    """A document the server answers: unknown fields are ignored (a newer server may add some)."""

    model_config = ConfigDict(extra="ignore")


class ErrorBody(_Response):
    """Every error response: a stable ``code``, a human ``message``, the offending ``field`` if any."""

    code: str
    message: str
    field: str | None = None


# -- measurements --------------------------------------------------------------------------------


#: A CPU frequency governor's name, or the distinct names of several CPUs joined by commas.
GovernorText = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.,-]+$")]
#: A clock in MHz (0 to 100 GHz, finite).
Mhz = Annotated[float, Field(ge=0, le=1e5, allow_inf_nan=False)]
#: A load average (runnable tasks), finite.
LoadAverage = Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]


class ConditionsWire(_Request):
    """The machine's state around one measurement (``tiletune.kernels.conditions``).

    The host's: its CPU frequency governor (None: not exposed, as in many containers), its 1- and
    5-minute load averages and its mean CPU clock. An accelerator's besides: its clock (SM on
    CUDA, AI Core on NPU), its rated maximum, their ratio ``clock_fraction`` and its temperature.
    ``clock_repeats``: how often the measurement was taken again for a clock under the minimum
    fraction; ``low_clock``: still under it after the last repeat.
    """

    device_kind: Literal["cpu", "cuda", "npu"]
    governor: GovernorText | None = None
    load_1m: LoadAverage | None = None
    load_5m: LoadAverage | None = None
    cpu_mhz: Mhz | None = None
    clock_mhz: Mhz | None = None
    max_clock_mhz: Mhz | None = None
    clock_fraction: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] | None = None
    temperature_c: Annotated[float, Field(ge=-100, le=300, allow_inf_nan=False)] | None = None
    clock_repeats: int = Field(default=0, ge=0, le=100, strict=True)
    low_clock: bool = Field(default=False, strict=True)


class MeasurementWire(_Request):
    """Statistics of repeated timed runs of one config, in milliseconds per launch; ``conditions``:
    the machine's state meanwhile (None from workers that do not send it); ``launches_per_sample``:
    the back-to-back calls each sample timed (1 from workers that do not send it)."""

    median_ms: Millis
    p10_ms: Millis
    p90_ms: Millis
    min_ms: Millis
    samples: int = Field(ge=1, le=10**9, strict=True)
    pruned: bool = False
    launches_per_sample: int = Field(default=1, ge=1, le=10**9, strict=True)
    conditions: ConditionsWire | None = None


# -- sweeps and jobs -------------------------------------------------------------------------------


class SweepKernel(_Request):
    """One kernel of a sweep and the shapes to tune it for."""

    kernel: Identifier
    shapes: list[Shape] = Field(min_length=1, max_length=1000)


class SweepCreate(_Request):
    """A tuning sweep: one job per (kernel, shape, dtype, chip).

    Kernels and shapes come as ``kernel`` + ``shapes`` (one kernel), as
    ``kernels`` (a list of kernel + shapes), or both (``kernel`` first).

    ``chips`` are the chip names workers register; empty means any chip (each
    job binds to the first chip that leases it). ``backend`` names the implementation
    every job runs; without it each job runs the one its first lease's worker prefers
    among those it offers for the kernel (``native`` on a CPU that has it, else the kernel's
    first), and keeps it. ``trials`` is the search's
    budget of unique valid measurements per job; ``max_time_s`` an optional
    time budget; ``patience`` stops a job after that many measurements
    without improving its best (convergence). ``workers_per_job`` lets
    several workers of one chip share a job. ``force`` tunes keys again even
    when they are already tuned on the same chip, kernel version and software.
    ``with_backward`` queues, beside each forward key, the keys its backward looks up
    (``softmax`` → ``softmax_backward`` at the same shape; ``matmul`` → two matmul keys on the
    transposed shapes; ``add`` has none): what a training workload needs tuned.
    """

    kernel: Identifier | None = None
    shapes: list[Shape] = Field(default_factory=list, max_length=1000, validate_default=True)
    kernels: list[SweepKernel] = Field(default_factory=list, max_length=64, validate_default=True)
    dtypes: list[Annotated[str, Field(max_length=16)]] = Field(
        default_factory=lambda: ["float32"], min_length=1, max_length=3
    )
    chips: list[Name] = Field(default_factory=list, max_length=64)
    backend: Annotated[str, Field(max_length=32)] | None = Field(
        default=None,
        description="implementation (one the kernel declares); default: the best one the worker "
        "that leases each job runs (on a CPU: native where it has it, else torch)",
    )
    strategy: Strategy = "tpe"
    trials: int = Field(default=40, ge=1, le=10_000, strict=True)
    max_time_s: float | None = Field(default=None, gt=0, le=7 * 24 * 3600, allow_inf_nan=False)
    patience: int | None = Field(default=None, ge=1, le=10_000, strict=True)
    seed: Seed = 0
    workers_per_job: int = Field(default=1, ge=1, le=64, strict=True)
    validate_top: int = Field(default=3, ge=1, le=16, strict=True)
    force: bool = False
    with_backward: bool = Field(
        default=False,
        description="also queue the keys each kernel's backward looks up (its backward kernel at the "
        "same shape; matmul: the transposed matmuls), for training",
    )
    name: Name | None = None

    @field_validator("shapes")
    @classmethod
    def _shapes_go_with_kernel(cls, shapes: list[Shape], info: ValidationInfo) -> list[Shape]:
        if info.data.get("kernel") and not shapes:
            raise ValueError("give at least one shape for the kernel")
        if shapes and not info.data.get("kernel"):
            raise ValueError("shapes need a kernel (or use kernels)")
        return shapes

    @field_validator("kernels")
    @classmethod
    def _some_kernel(cls, kernels: list[SweepKernel], info: ValidationInfo) -> list[SweepKernel]:
        if not kernels and not info.data.get("kernel") and "shapes" in info.data:
            raise ValueError("give kernel and shapes, or kernels")
        return kernels

    def parts(self) -> list[SweepKernel]:
        """Every (kernel, shapes) of the sweep, ``kernel`` + ``shapes`` first (unvalidated)."""
        single = [SweepKernel.model_construct(kernel=self.kernel, shapes=self.shapes)] if self.kernel else []
        return single + list(self.kernels)


class JobProgress(_Response):
    """How far a job is: trials by outcome, best time so far, speedup over the default."""

    completed: int = 0
    invalid: int = 0
    duplicate: int = 0
    failed: int = 0
    best_ms: float | None = None
    best_config: Config | None = None
    default_ms: float | None = None
    speedup_vs_default: float | None = None


class JobConfirmation(_Response):
    """Who measured a validated job's winner in its search, and who confirmed it in the validation
    run: a worker other than the one whose measurement led, where the chip had one online
    (``confirmed_by`` ``None``: the leader validated its own pick). ``agree`` compares the two
    medians of the winner (``None``: no other worker measured it in the search); a winner the
    workers disagree on beyond ``agreement_ratio`` either way is not promoted."""

    measured_by: list[str]
    confirmed_by: str | None = None
    search_ms: float | None = None
    validation_ms: float
    agree: bool | None = None
    agreement_ratio: float | None = None


class JobPublic(_Response):
    """One job: the tuning of one (kernel, shape, dtype, chip target).

    ``chip`` is the chip the job is bound to, or its target until its first lease (``*``: any);
    ``backend`` the implementation it runs, or ``*`` (:data:`ANY_BACKEND`) until its first lease
    chooses one. A key has one live job at most: a sweep's job for a key another live job tunes
    is born ``skipped`` with ``tuned_by`` naming that job.
    """

    id: int
    sweep_id: int
    kernel: str
    kernel_version: int
    shape: Shape
    shape_key: str
    dtype: str
    chip: str
    backend: str
    strategy: str
    trials: int
    max_time_s: float | None = None
    patience: int | None = None
    state: str
    lease_failures: int
    failure_reasons: list[str]
    progress: JobProgress
    created_at: datetime
    updated_at: datetime
    #: For a job born ``skipped`` because a live job of its key tunes it: that job's id.
    tuned_by: int | None = None
    #: For a validated job: who measured and who confirmed its winner.
    confirmation: JobConfirmation | None = None


class _SweepHead(_Response):
    """What every answer about a sweep says of it: identity, state and its jobs counted by state."""

    id: int
    name: str | None
    kernels: list[str]
    state: str
    created_at: datetime
    counts: dict[str, int]


class SweepPublic(_SweepHead):
    """A sweep with its jobs and their states."""

    jobs: list[JobPublic]


#: ``GET /v1/sweeps``: sweeps a page holds unless ``limit`` says otherwise, and at most.
SWEEPS_PAGE_DEFAULT = 50
SWEEPS_PAGE_MAX = 1000


class SweepSummaryPublic(_SweepHead):
    """A sweep as ``GET /v1/sweeps`` lists it: its jobs counted, by state (``counts``) and in
    all (``job_count``), never embedded, so a page stays small however big its sweeps are.

    ``jobs`` is always empty here; it stays so that clients of older releases, which read the
    list as :class:`SweepPublic`, still parse it. ``GET /v1/sweeps/{id}`` lists a sweep's jobs.
    """

    job_count: int
    jobs: list[JobPublic] = Field(default_factory=list, max_length=0)


# -- workers and leases ----------------------------------------------------------------------------


class ChipWire(_Request):
    """A chip as a worker reports it: identity and the limits constraints use."""

    name: Name
    kind: Annotated[str, Field(min_length=1, max_length=16, pattern=r"^[a-z]+$")]
    local_memory_bytes: int = Field(gt=0, le=MAX_DIM, strict=True)
    max_buffer_num: int = Field(default=4, ge=1, le=64, strict=True)
    alignment_bytes: int = Field(default=32, ge=1, le=4096, strict=True)
    #: The cores the native kernels may spread a call over (a CPU's thread pool); ``None`` from
    #: a worker that does not report it.
    cores: int | None = Field(default=None, ge=1, le=MAX_CORES, strict=True)


class WorkerCreate(_Request):
    """A worker registering: its name, chip, backends, kernels and software fingerprint.

    ``kernels`` limits the jobs it leases (empty: any); ``kernel_versions``
    (name -> version) also passes by jobs of another version of a kernel.
    ``kernel_backends`` (kernel -> the implementations it runs of it, in the kernel's order) is
    what it offers per kernel: it leases a job naming a backend only where it offers it, and a
    job naming none runs the one it prefers (``native`` on a CPU, else the first). A worker that
    does not send it (an older one) is offered, of each kernel, the implementations the kernel
    declares among its ``backends``, and runs ``torch`` where the kernel has it.
    """

    name: Name
    chip: ChipWire
    backends: list[Identifier] = Field(min_length=1, max_length=16)
    kernels: list[Identifier] = Field(default_factory=list, max_length=256)
    kernel_versions: dict[Identifier, Annotated[int, Strict(), Field(ge=1, le=2**31)]] = Field(
        default_factory=dict, max_length=256
    )
    kernel_backends: (
        dict[Identifier, Annotated[list[Identifier], Field(min_length=1, max_length=16)]] | None
    ) = Field(default=None, max_length=256)
    software: Software = Field(default_factory=dict)


class WorkerPublic(_Response):
    """A registered worker."""

    id: int
    name: str
    chip: str
    backends: list[str]
    software: dict[str, str | None]
    last_seen_at: datetime


#: ``GET /v1/workers``: workers a page holds unless ``limit`` says otherwise, and at most.
WORKERS_PAGE_DEFAULT = 100
WORKERS_PAGE_MAX = 1000


class ListedWorkerPublic(WorkerPublic):
    """A worker as ``GET /v1/workers`` lists it: what it registered, when, and the jobs it holds now.

    ``kernels``: the kernels it leases (empty: any); ``leased_jobs``: the ids of the jobs it holds
    a live lease on (not ended, not expired) when the list was made.
    """

    kernels: list[str] = Field(default_factory=list)
    registered_at: datetime | None = None
    leased_jobs: list[int] = Field(default_factory=list)


class LeaseCreate(_Request):
    """A worker asking for a job its chip can run."""

    worker_id: DbId


class LeasedJob(_Response):
    """What a worker needs to run a job: the key, the backend and measurement settings.

    ``backend`` is always one the worker offers for the kernel: the job's own, or, for a job that
    named none, the one this lease chose (kept on the job for every later lease).
    """

    id: int
    kernel: str
    kernel_version: int
    shape: Shape
    dtype: str
    backend: str
    default_config: Config


class LeasePublic(_Response):
    """A lease: the fencing ``token`` every write under it carries, and its timing."""

    token: str
    job: LeasedJob
    expires_at: datetime
    lease_s: float
    heartbeat_s: float


class Task(_Response):
    """A config to measure under a lease; ``trial_id`` identifies it in ``tell``."""

    trial_id: int
    config: Config


class AskPublic(_Response):
    """The answer to ``ask``.

    ``phase``: ``search`` (measure ``tasks`` one by one, then ``tell``);
    ``validate`` (measure ``validate`` interleaved in one run, then
    ``complete``); ``wait`` (others hold the remaining work: ask again later);
    ``done`` (nothing left: release the lease).
    """

    phase: AskPhase
    tasks: list[Task] = Field(default_factory=list)
    validate_configs: list[Config] = Field(default_factory=list)


class TrialOutcome(_Request):
    """The result of one task: a measurement, or the reason there is none.

    ``invalid``: the worker's constraints rejected the config without running
    it; ``error``: it ran and crashed or returned a wrong result.
    """

    trial_id: DbInt
    measurement: MeasurementWire | None = None
    invalid: Reason | None = None
    error: Reason | None = None


class TellCreate(_Request):
    """Results of tasks; telling a trial again is counted once."""

    outcomes: list[TrialOutcome] = Field(min_length=1, max_length=1000)


class TellPublic(_Response):
    """How many outcomes were new and how many repeated an earlier tell."""

    accepted: int
    repeated: int


class ValidatedConfig(_Request):
    """One config of the final interleaved validation run."""

    config: Config
    measurement: MeasurementWire | None = None
    error: Reason | None = None


class CompleteCreate(_Request):
    """The validation run of a job's top configs (and its default), measured interleaved."""

    results: list[ValidatedConfig] = Field(min_length=1, max_length=64)


class ReleaseCreate(_Request):
    """A worker giving a lease back (shutting down, or unable to run the job) and why."""

    reason: Reason = "released"
    failed: bool = False


# -- configs ---------------------------------------------------------------------------------------


class BestConfigPublic(_Response):
    """The promoted best config of one key, with its measurement and provenance."""

    kernel: str
    kernel_version: int
    shape: Shape
    shape_key: str
    dtype: str
    chip: str
    config: Config
    median_ms: float
    default_config: Config | None = None
    default_ms: float | None = None
    speedup_vs_default: float | None = None
    job_id: int | None = None
    trial_id: int | None = None
    software: dict[str, str | None] = Field(default_factory=dict)
    promoted_at: datetime


class LookupPublic(_Response):
    """A single-key lookup: the config to use and how it was found.

    ``match``: ``exact`` (tuned for this key), ``nearest`` (tuned for the
    nearest shape of the same kernel version, chip and dtype), ``default``
    (the kernel's built-in rule). ``best`` carries provenance unless default.
    ``knob_values``: each knob's values for this shape on this chip (``KernelDeclaration.knob_values``),
    which the client checks ``config`` against (``None`` from a server that does not send them).
    """

    kernel: str
    shape: Shape
    dtype: str
    chip: str
    config: Config
    match: Match
    best: BestConfigPublic | None = None
    knob_values: dict[str, list[int]] | None = None


class KernelInfo(_Response):
    """What a client needs to know of a kernel to pick among tuned shapes without the kernel's code.

    ``dims`` in the spec's order; ``categorical`` dims select a variant (never
    crossed by the nearest-shape fallback); ``knobs`` are the config's names.

    The knobs' values, for the client to check a config before serving it
    (:mod:`tiletune.client.knobs`): ``knob_values`` every candidate of each knob
    (``None`` from a server that does not send them, or for a kernel whose values
    follow a rule of its own); ``clamp_to`` the dim each tile knob is clamped to for a
    shape, by ``clamp_rule`` (``min``: ``min(value, dim)``; ``pow2_ceil``:
    ``min(value, max(pow2_ceil(dim), min(values)))``). ``dim_defaults``: the dims a shape may
    leave out, each with its value or the name of the dim whose value it takes (``kv_heads``:
    ``"heads"``; empty from a server that does not send them). A rule a client does not know
    leaves it checking the knob names alone. In a chip's bundle the values are that chip's
    (a knob that runs up to the chip's cores, the native kernels' ``block_dim``, lists the
    values up to the cores its workers report). The rules are
    :mod:`tiletune.client.space`'s, where the kernels declare them.
    """

    name: str
    version: int
    dims: list[str]
    categorical: list[str] = Field(default_factory=list)
    knobs: list[str] = Field(default_factory=list)
    knob_values: dict[str, list[int]] | None = None
    clamp_to: dict[str, str] = Field(default_factory=dict)
    clamp_rule: str = "min"
    dim_defaults: dict[str, int | str] = Field(default_factory=dict)


class ConfigBundle(_Response):
    """Bulk export / import of best configs (one chip, optionally one kernel), with the kernels' info.

    ``checksum`` (:meth:`sealed`) is the SHA-256 of the entries in canonical JSON; a server
    imports only a bundle whose checksum matches its entries.
    """

    format: Literal["tiletune.configs/1"] = "tiletune.configs/1"
    exported_at: datetime | None = None
    chip: str | None = None
    kernels: list[KernelInfo] = Field(default_factory=list)
    configs: list[BestConfigPublic]
    checksum: str | None = None

    def content_checksum(self) -> str:
        """The SHA-256 of the entries as canonical JSON (sorted keys, no spaces)."""
        entries = [entry.model_dump(mode="json") for entry in self.configs]
        text = json.dumps(entries, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(text.encode()).hexdigest()

    def sealed(self) -> ConfigBundle:
        """This bundle with its checksum set."""
        return self.model_copy(update={"checksum": self.content_checksum()})


class ConfigsImportedPublic(_Response):
    """The answer to ``POST /v1/configs/import``: how many keys' best configs the bundle changed."""

    changed: int


class HistoryPoint(_Response):
    """One promotion of a key: when, what, how fast, on which software."""

    promoted_at: datetime
    config: Config
    median_ms: float
    default_ms: float | None
    kernel_version: int
    chip: str
    software: dict[str, str | None]
    job_id: int | None


class ConditionsPublic(_Response):
    """A measured trial's conditions as stored (fields: :class:`ConditionsWire`)."""

    device_kind: str
    governor: str | None = None
    load_1m: float | None = None
    load_5m: float | None = None
    cpu_mhz: float | None = None
    clock_mhz: float | None = None
    max_clock_mhz: float | None = None
    clock_fraction: float | None = None
    temperature_c: float | None = None
    clock_repeats: int = 0
    low_clock: bool = False


class TrialPublic(_Response):
    """One trial of a job: a searched config (``number`` set) or a validation run, and its outcome."""

    id: int
    number: int | None
    phase: str
    config: Config
    state: str
    median_ms: float | None
    p10_ms: float | None
    p90_ms: float | None
    samples: int | None
    reason: str | None
    asked_at: datetime
    told_at: datetime | None
    conditions: ConditionsPublic | None = None
    #: The worker that measured it (its lease's).
    worker: str | None = None


# -- misses: shapes clients asked for that nobody tuned ---------------------------------------------


class MissReport(_Request):
    """A key a client answered with ``nearest`` or ``default``, and how often since its last report."""

    kernel: Identifier
    shape: Shape
    dtype: Annotated[str, Field(max_length=16)]
    chip: Name
    match: Literal["nearest", "default"]
    count: int = Field(default=1, ge=1, le=1_000_000, strict=True)


class MissesCreate(_Request):
    """A batch of misses from one client (sent off the launch path)."""

    misses: list[MissReport] = Field(min_length=1, max_length=10_000)


class MissPublic(_Response):
    """A key's miss count on the server and the job queued for it, if any."""

    kernel: str
    shape: Shape
    shape_key: str
    dtype: str
    chip: str
    count: int
    job_id: int | None
    first_seen_at: datetime
    last_seen_at: datetime


class MissesPublic(_Response):
    """What a batch of misses did: entries counted, and the demand jobs the server queued for the
    batch's keys right after (possibly none: the demand budget may be spent, or a later pass queues
    them; a key's ``job_id`` in ``GET /v1/misses`` shows its job)."""

    accepted: int
    queued_jobs: list[int]


# -- client stats: how clients answered their launches without asking the server ----------------

#: The most answers of one kind a client reports at once (more wait for its next report). A client
#: reports every ``miss_flush_s`` (5 s by default): this is 20 million launches a second, several
#: times what a process's launch path serves, while it bounds what one report (and, with the
#: reports' rate limit, one token) can add to the server's metrics.
MAX_REPORTED_ANSWERS = 100_000_000

#: A count of answers in a report.
AnswerCount = Annotated[int, Strict(), Field(ge=0, le=MAX_REPORTED_ANSWERS)]


class AnswerCounts(_Request):
    """Answers by match (:data:`Match`): ``exact``, ``nearest``, ``default``; no other key."""

    exact: AnswerCount = 0
    nearest: AnswerCount = 0
    default: AnswerCount = 0


#: The most keys one client stats report carries (the client sends its most launched).
MAX_REPORTED_KEYS = 100


class KeyLaunches(_Request):
    """How often a client launched one key (from its own caches) since its last report."""

    kernel: Identifier
    shape: Shape
    dtype: Annotated[str, Field(max_length=16)]
    count: AnswerCount = Field(gt=0)


class ClientStatsCreate(_Request):
    """What a client served itself since its last report: the answers its launches got from its
    own caches and defaults (not from a server lookup, which the server counts), by match.

    ``chip`` is the chip the client serves; the server counts the answers, never the chip, in
    its metrics (no name a caller chose reaches a label). ``keys`` (optional; older clients send
    none): the launches of its most launched keys, at most :data:`MAX_REPORTED_KEYS`, which the
    server stores per key and chip to re-tune the most used keys first after a software change.
    """

    chip: Name
    answers: AnswerCounts
    keys: list[KeyLaunches] = Field(default_factory=list, max_length=MAX_REPORTED_KEYS)

    @model_serializer(mode="wrap")
    def _keys_when_any(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``keys`` is sent only when there are some: a server older than per-key counts refuses
        the field (its bodies refuse unknown fields), even empty."""
        body: dict[str, Any] = handler(self)
        if not self.keys:
            body.pop("keys", None)
        return body


class ClientStatsPublic(_Response):
    """How many answers the server counted (the sum of the report's counts), and of the report's
    ``keys`` how many it counted (those of kernels, shapes and dtypes it knows)."""

    accepted: int
    keys: int = 0


# -- tokens ----------------------------------------------------------------------------------------


class TokenCreate(_Request):
    """A token to create (admin only): its role and a name people recognise it by.

    ``chip`` binds a worker token to the one chip it may register and lease for; a worker token
    created without it is bound to the chip of its first registration. ``*`` (:data:`ANY_CHIP`)
    lets it work for every chip: for a fleet of several chips that shares one token, by an
    admin's choice. Other roles take none.
    """

    role: Role
    name: str = Field(default="token", min_length=1, max_length=200, pattern=r"^[\w .@:/+-]+$")
    chip: Name | None = Field(
        default=None, description="worker tokens: the only chip it may work for (`*`: every chip)"
    )

    @field_validator("chip")
    @classmethod
    def _chip_binds_workers(cls, chip: str | None, info: ValidationInfo) -> str | None:
        if chip is not None and info.data.get("role") not in (None, Role.WORKER):
            raise ValueError("only a worker token is bound to a chip")
        return chip


class TokenPublic(_Response):
    """A token as listed: never its secret. ``chip``: the chip a worker token is bound to (``*``:
    every chip; ``None`` until its first registration, and for other roles)."""

    id: int
    name: str
    role: str
    created_at: datetime
    revoked_at: datetime | None = None
    chip: str | None = None


class TokenCreated(TokenPublic):
    """A token just created: the only answer that carries its secret (``token``); it is not stored."""

    token: str
