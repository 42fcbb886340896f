"""A plugin kernel's operator in one call: ``register_operator(SPEC, inputs=("x",))``.

The operator is ``torch.ops.tiletune.<spec.name>``, made as the built-ins' are: its implementation
runs the spec under the current source's config for the call's shape (looked up when it runs,
never at trace time; CPU: its ``native`` backend where it has one, else its first), its fake gives
an output like the first input (or ``fake``'s), and its backward is ``backward`` (with
``setup_context``) where given. Without a backward, autograd refuses the operator's use on tensors
that need a gradient (torch's error), rather than drop the gradient. ``launch(spec.name, ...)``
then runs the operator, as for a built-in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tiletune.kernels.ops.definitions import OPERATORS
from tiletune.kernels.ops.dispatch import run_tensor_kernel
from tiletune.kernels.ops.gradients import NAMESPACE
from tiletune.kernels.registry import get_kernel
from tiletune.kernels.spec import KernelSpec

Backward = Callable[..., Any]


def _like_first(*tensors: torch.Tensor) -> torch.Tensor:
    """The default fake: an output of the first input's size and dtype (an elementwise kernel's)."""
    return tensors[0].new_empty(tensors[0].shape)


def register_operator(
    spec: KernelSpec,
    inputs: Sequence[str],
    *,
    fake: Callable[..., torch.Tensor] = _like_first,
    backward: Backward | None = None,
    setup_context: Callable[..., None] | None = None,
) -> Any:
    """Register the operator ``torch.ops.tiletune.<spec.name>`` of a registered kernel (a plugin's
    ``tiletune.kernels`` entry point), taking one tensor per name of ``inputs`` (the order
    ``spec.run`` takes them) and returning one.

    ``fake(*tensors)`` gives an empty output of the right size and dtype; ``backward`` and
    ``setup_context`` are ``torch.library.register_autograd``'s. Returns the operator (a
    ``torch.library.custom_op``). Raises ``ValueError`` when ``spec.name`` already has an operator,
    and :class:`~tiletune.kernels.errors.UnknownKernelError` when no entry point declares it.
    """
    if spec.name in OPERATORS:
        raise ValueError(f"{spec.name} already has an operator: torch.ops.{NAMESPACE}.{spec.name}")
    if not inputs or not all(name.isidentifier() for name in inputs):
        raise ValueError(f"inputs must be one or more argument names, got {list(inputs)}")
    get_kernel(spec.name)  # the operator runs the registered kernel of that name
    schema = "(" + ", ".join(f"Tensor {name}" for name in inputs) + ") -> Tensor"

    def implementation(*tensors: torch.Tensor) -> torch.Tensor:
        return run_tensor_kernel(spec.name, tensors)

    operator = torch.library.custom_op(
        f"{NAMESPACE}::{spec.name}", implementation, mutates_args=(), schema=schema
    )
    operator.register_fake(fake)
    if backward is not None:
        operator.register_autograd(backward, setup_context=setup_context)
    OPERATORS[spec.name] = operator
    return operator
