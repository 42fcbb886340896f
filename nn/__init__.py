"""tiletune in a model: layers and functions on tiletune's operators (``torch.ops.tiletune``).

- :mod:`.functional`: ``scaled_dot_product_attention`` with torch's signature, ``rms_norm``,
  ``linear``;
- :mod:`.layers`: ``RMSNorm`` and ``Linear``, drop-in for torch's;
- :mod:`.patch`: ``patch(model)`` swaps a model's RMSNorm and Linear modules for these (Hugging
  Face RMSNorm modules too: :mod:`.hf_rms_norm`) and runs its ``F.scaled_dot_product_attention``
  calls on the operator, with no change to its code; ``patch_summary(model)``: what it replaced
  and what it left, and why (a :class:`~tiletune.nn.patch.PatchSummary`, also logged);
- :mod:`.transformers`: Hugging Face Transformers' attention registry, ``attn_implementation=
  "tiletune"`` (imported on its own: ``tiletune.nn`` never imports transformers);
- ``configure``: where the operators' configs come from (a server, or the kernels' rules).

Imports torch and :mod:`tiletune.kernels.ops` (which registers the operators).
"""

from tiletune.kernels.ops import configure
from tiletune.nn import functional
from tiletune.nn.layers import Linear, RMSNorm
from tiletune.nn.patch import PatchSummary, patch, patch_summary

__all__ = ["Linear", "PatchSummary", "RMSNorm", "configure", "functional", "patch", "patch_summary"]
