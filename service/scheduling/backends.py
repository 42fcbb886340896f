"""Which implementation (backend) a job runs: what its kernel declares, what a worker offers, what a
lease chooses. Nothing here reads the server's own machine: it plans with what kernels declare and
what workers report.

- a kernel's declared ``implementations`` (:class:`~tiletune.kernels.declaration.KernelDeclaration`):
  the backends it has on any machine (``torch``, ``native``, ``triton``, …), whatever this machine
  builds; a sweep may name any of them (:mod:`tiletune.service.scheduling.jobs`);
- :func:`offered_backends`: per kernel, the implementations a registered worker runs, the one it
  prefers first. A worker that reports them per kernel (``kernel_backends``) is offered those the
  kernel declares, in the kernel's order, with ``native`` first on a CPU (the rule of a local run
  that names none: ``preferred_backend``); an older worker (no ``kernel_backends``) is offered, of
  each kernel it runs, those the kernel declares among its flat ``backends``, ``torch`` first
  where the kernel has it (the portable one: its list does not say which kernel has which);
- :func:`runnable`: the jobs a worker may lease as far as backends go: of a kernel it offers,
  naming a backend it offers for that kernel, or naming none;
- :func:`chosen_backend`: the backend a job runs under a worker's lease: its own, or, for a job
  that names none, the one the worker prefers (the queue keeps it on the job: every later lease,
  trial and result of the job is of that backend).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import ColumnElement, and_, false, or_

from tiletune.kernels import KernelDeclaration, all_declarations
from tiletune.kernels.declaration import PORTABLE_BACKEND
from tiletune.kernels.native.space import in_preference
from tiletune.service.models import JobRow, WorkerRow

#: Kernel name -> the implementations a worker offers of it, the one it prefers first.
Offer = dict[str, tuple[str, ...]]


def offered_backends(
    worker: WorkerRow, chip_kind: str, kernels: Mapping[str, KernelDeclaration] | None = None
) -> Offer:
    """Each kernel of ``kernels`` (every declared one by default) that ``worker`` runs with the
    implementations it offers of it, the preferred one first (see the module docstring).

    Kernels the worker names but the server does not know, and kernels of which it offers no
    declared implementation, are left out.
    """
    known = all_declarations() if kernels is None else kernels
    limited = set(worker.kernels) if worker.kernels else None
    reported: Mapping[str, list[str]] | None = worker.kernel_backends
    offer: Offer = {}
    for name, spec in known.items():
        if limited is not None and name not in limited:
            continue
        declared = spec.implementations
        if reported is not None:
            usable = [backend for backend in reported.get(name, ()) if backend in declared]
            first = None  # the rule of a local run
        else:
            usable = [backend for backend in declared if backend in worker.backends]
            first = PORTABLE_BACKEND
        if usable:
            offer[name] = in_preference(usable, chip_kind, first)
    return offer


def runnable(offer: Offer) -> ColumnElement[bool]:
    """Jobs of a kernel in ``offer`` that name one of its backends there, or none (one clause per
    distinct set of backends, however many kernels share it)."""
    if not offer:
        return false()
    kernels_of: dict[frozenset[str], list[str]] = {}
    for kernel, backends in offer.items():
        kernels_of.setdefault(frozenset(backends), []).append(kernel)
    return or_(
        *(
            and_(
                JobRow.kernel.in_(kernels),
                or_(JobRow.backend.is_(None), JobRow.backend.in_(sorted(backends))),
            )
            for backends, kernels in kernels_of.items()
        )
    )


def chosen_backend(job: JobRow, offer: Offer) -> str:
    """The backend ``job`` runs under a lease of the worker of ``offer``: its own, else the worker's
    preferred one for its kernel. ``KeyError`` for a job the worker does not offer to run (the
    lease filter, :func:`runnable`, never hands it one)."""
    if job.backend is not None:
        return job.backend
    return offer[job.kernel][0]
