"""The kernel spec: a kernel's declaration and its torch half, the contract every tunable kernel implements.

A :class:`KernelSpec` is a :class:`~tiletune.kernels.declaration.KernelDeclaration` (dims, knobs,
constraints, default rule, counts: torch-free, what the server plans with) plus what runs it:

- ``make_inputs`` and ``reference``: deterministic inputs and the correct answer for checking configs;
- ``run``: the implementation per backend, in which every knob changes execution;
- ``backends``: the implementations this machine can run (of the declared ``implementations``);
- ``supports``: whether ``run`` can run on a device kind here;
- ``vendor``: torch's own op for a call, where the declaration says it has one (``has_vendor``);
- ``shape_of``: the shape of a call read from its tensors, which
  :func:`tiletune.kernels.launcher` needs (optional for plugins that are only tuned);
- ``call_arguments``: the call's arguments that are neither tensors nor key dims (``rms_norm``'s
  ``eps``), with the defaults ``run``, ``reference`` and ``vendor`` (the tuning path) use;
  ``run_with``, ``reference_with`` and ``vendor_with`` take one call's values (what an operator
  call runs). The tuned key and its config never depend on them.

Users tune their own operators by declaring a :class:`KernelDeclaration` (registered under the
entry-point group ``tiletune.spaces``, for servers without torch) and subclassing it with
:class:`KernelSpec` (registered under ``tiletune.kernels``, for workers); tiletune treats such
kernels exactly like built-ins (``examples/gelu_plugin``).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import torch

from tiletune.client import wire

# A plugin written against this contract imports the declaration's types from here too.
from tiletune.client.space import DeviceLimits as DeviceLimits  # noqa: PLC0414
from tiletune.client.space import Dim as Dim  # noqa: PLC0414
from tiletune.client.space import Knob as Knob  # noqa: PLC0414
from tiletune.client.space import snap_down as snap_down  # noqa: PLC0414
from tiletune.kernels.declaration import PORTABLE_BACKEND, Config, KernelDeclaration, Shape
from tiletune.kernels.errors import DTypeError, ShapeError

#: The torch dtype of each of the wire's dtype names.
DTYPES: dict[str, torch.dtype] = dict(
    zip(wire.DTYPES, (torch.float32, torch.float16, torch.bfloat16), strict=True)
)


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a dtype name; raises :class:`DTypeError` naming the choices."""
    try:
        return DTYPES[name]
    except KeyError:
        raise DTypeError("dtype", f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    """The dtype name of a torch dtype; raises :class:`DTypeError` naming the supported ones."""
    for name, candidate in DTYPES.items():
        if candidate == dtype:
            return name
    raise DTypeError("dtype", f"tensors of {dtype} are not supported; use one of {', '.join(DTYPES)}")


#: What a kernel's ``run`` and ``reference`` return: one tensor, or several (a backward kernel's
#: gradients, in the order its declaration names them); a bench checks each against the reference's.
KernelOutput = torch.Tensor | tuple[torch.Tensor, ...]
#: torch's own op for one call shape (:meth:`KernelSpec.vendor`): the kernel's inputs in, what its
#: ``run`` returns out.
VendorOp = Callable[[Sequence[torch.Tensor]], KernelOutput]
#: One call's arguments that are neither tensors nor key dims (``rms_norm``'s ``eps``), by name
#: (:attr:`KernelSpec.call_arguments`); a name left out takes the kernel's default.
CallArguments = Mapping[str, float]
#: A call that gives no argument: every one at its default.
NO_ARGUMENTS: CallArguments = MappingProxyType({})


def widened(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in the dtype a reference computes in: float32, or float64 for float64 (which the
    operators take for gradient checks)."""
    return tensor if tensor.dtype == torch.float64 else tensor.float()


def expect_inputs(kernel: str, inputs: Sequence[torch.Tensor], names: Sequence[str]) -> None:
    """Raise :class:`ShapeError` unless ``inputs`` are as many tensors as ``names`` (for ``shape_of``)."""
    if len(inputs) != len(names):
        raise ShapeError(
            "inputs", f"{kernel} takes {len(names)} tensor(s) ({', '.join(names)}), got {len(inputs)}"
        )


def expect_ndim(name: str, tensor: torch.Tensor, ndim: int, layout: str) -> None:
    """Raise :class:`ShapeError` (field ``inputs.<name>``) unless ``tensor`` has ``ndim`` dims."""
    if tensor.dim() != ndim:
        raise ShapeError(f"inputs.{name}", f"must be {layout}, got a tensor of size {list(tensor.shape)}")


def expect_size(name: str, got: int, expected: int, what: str) -> None:
    """Raise :class:`ShapeError` (field ``inputs.<name>``) unless a size read from it matches."""
    if got != expected:
        raise ShapeError(f"inputs.{name}", f"{what} is {got}, expected {expected}")


class KernelSpec(KernelDeclaration):
    """A tunable kernel: its declaration and its implementations. Subclasses set the declaration
    (class attributes and its abstract methods) and the abstract methods below.

    Contract, besides the declaration's:

    - ``run`` returns the same result as ``reference`` (within ``tolerance``)
      for every valid config, including shapes the tiles do not divide;
    - ``run_with`` at any call arguments returns ``reference_with``'s result at the same ones;
    - ``backends()`` is a subset of the declared ``implementations``: those that run here.
    """

    def shape_of(self, inputs: Sequence[torch.Tensor]) -> Shape:
        """The shape of a call on ``inputs`` (the tensors ``run`` takes, in its order).

        Size dims are read from the tensors; a dim the tensors cannot tell (a
        categorical one such as ``causal``) takes the value the kernel documents
        (``launch`` lets the caller override it by keyword). Raises
        :class:`ShapeError` naming the input at fault when the tensors do not
        fit together. Built-in kernels implement it; the base raises
        ``NotImplementedError``, so a plugin kernel is tunable without it but
        launchable only once it overrides this method.
        """
        raise NotImplementedError(
            f"kernel {self.name!r} ({type(self).__name__}) does not implement shape_of(inputs), which "
            "tiletune.kernels.launcher needs to read a call's shape from its tensors; "
            "override KernelSpec.shape_of in the kernel's spec"
        )

    # -- execution ----------------------------------------------------------

    @abstractmethod
    def make_inputs(
        self, shape: Shape, dtype: str, device: torch.device, seed: int = 0
    ) -> tuple[torch.Tensor, ...]:
        """Deterministic random inputs for ``shape`` on ``device``."""

    @abstractmethod
    def reference(self, inputs: Sequence[torch.Tensor], shape: Shape) -> KernelOutput:
        """The correct result, computed the plain way (in float32 or better where it matters): one
        tensor, or a tuple of them as ``run`` returns."""

    @abstractmethod
    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "torch"
    ) -> KernelOutput:
        """Run the kernel under ``config`` with the implementation ``backend``: one tensor, or a
        tuple of them (a backward kernel's gradients)."""

    #: The call arguments the kernel takes besides its tensors, with their defaults: the values
    #: ``run``, ``reference`` and ``vendor`` compute with (a bench tunes at them). Not key dims: a
    #: call's values change its result, never its key or its best config. None by default.
    call_arguments: CallArguments = NO_ARGUMENTS

    def arguments_of(self, arguments: CallArguments) -> dict[str, float]:
        """Every call argument's value: ``arguments``, the defaults (:attr:`call_arguments`) for the
        names it leaves out. Raises ``TypeError`` naming an argument the kernel does not take."""
        unknown = sorted(set(arguments) - set(self.call_arguments))
        if unknown:
            takes = ", ".join(self.call_arguments) or "none"
            raise TypeError(f"{self.name} takes no call argument {', '.join(unknown)} (it takes: {takes})")
        return {**self.call_arguments, **arguments}

    def run_with(
        self,
        inputs: Sequence[torch.Tensor],
        config: Config,
        shape: Shape,
        backend: str,
        arguments: CallArguments,
    ) -> KernelOutput:
        """``run`` for one call's ``arguments`` (see :meth:`arguments_of`). The base, for a kernel
        that takes none: ``run``. A kernel with :attr:`call_arguments` overrides it (and ``run`` is
        ``run_with`` at the defaults)."""
        self.arguments_of(arguments)
        return self.run(inputs, config, shape, backend)

    def reference_with(
        self, inputs: Sequence[torch.Tensor], shape: Shape, arguments: CallArguments
    ) -> KernelOutput:
        """``reference`` for one call's ``arguments``; the base, for a kernel that takes none:
        ``reference``."""
        self.arguments_of(arguments)
        return self.reference(inputs, shape)

    def vendor_with(self, shape: Shape, device_kind: str, arguments: CallArguments) -> VendorOp | None:
        """``vendor`` for one call's ``arguments`` (torch's op computing with them); the base, for a
        kernel that takes none: ``vendor``."""
        self.arguments_of(arguments)
        return self.vendor(shape, device_kind)

    def backends(self) -> tuple[str, ...]:
        """The implementations ``run`` accepts here, of the declared ``implementations``
        (the portable one, ``"torch"``, by default)."""
        return (PORTABLE_BACKEND,)

    #: The implementations (backends) whose default rule measured faster than torch's op: an operator
    #: call with no measured answer runs the rule there, torch's op elsewhere (see
    #: :func:`tiletune.kernels.vendor.untuned_runs_vendor`; a kernel names the figures it read).
    rule_beats_vendor: tuple[str, ...] = ()

    def vendor(self, shape: Shape, device_kind: str) -> VendorOp | None:
        """torch's own op for calls of ``shape`` on a ``device_kind`` device: a callable on the inputs
        ``run`` takes, returning what ``run`` returns (the vendor config's implementation,
        :mod:`tiletune.kernels.vendor`); None where there is none (the default). A kernel that
        declares ``has_vendor`` overrides it."""
        return None

    def supports(self, device_kind: str) -> bool:
        """Whether ``run`` can run on a device of ``device_kind`` (``cpu``, ``cuda``, ``npu``) here.

        The portable PyTorch kernels run everywhere (True); a kernel whose
        implementation needs a compiler or runtime (Triton, triton-ascend) says
        whether that is installed and usable for the kind.
        """
        return True
