"""Hugging Face's ``LlamaForCausalLM`` from a small config: the model ``model_step --model llama`` times.

The sizes are the decoder's (:class:`~benchmarks.model.decoder.DecoderShape`: layers, hidden,
heads, kv heads, SwiGLU width, vocabulary), with what the decoder leaves out: rotary position
embeddings (``rope_theta`` 10,000), separate input and output embeddings, transformers' own
``sdpa`` attention (which ``tiletune.nn.patch`` sends to tiletune's operator) and its own
``LlamaRMSNorm`` (``eps`` 1e-6, which ``patch`` swaps). Random weights from a seed, no download.
"""

from __future__ import annotations

import torch
import transformers
from torch import Tensor, nn
from transformers.models.llama.modeling_llama import LlamaForCausalLM

from benchmarks.model.decoder import NORM_EPS, DecoderShape

#: The longest sequence the config's rotary table covers.
MAX_POSITIONS = 4096


class LogitsOf(nn.Module):
    """A causal LM as the benchmark calls a model: token ids in, the logits of every position out
    (no cache: a training step's forward)."""

    def __init__(self, model: LlamaForCausalLM) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor) -> Tensor:
        """The logits ``[batch, seq, vocab]`` of ``tokens``."""
        logits: Tensor = self.model(input_ids=tokens, use_cache=False).logits
        return logits


def build_llama(shape: DecoderShape, seed: int = 0) -> LogitsOf:
    """A ``LlamaForCausalLM`` of ``shape``'s sizes with weights drawn from ``seed``."""
    config = transformers.LlamaConfig(  # type: ignore[no-untyped-call]
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.mlp,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=NORM_EPS,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return LogitsOf(LlamaForCausalLM(config))  # type: ignore[no-untyped-call]
