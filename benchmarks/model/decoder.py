"""A Llama-style decoder in plain ``torch.nn``: what ``tiletune.nn.patch`` is meant to take as is.

Each layer: ``RMSNorm(eps=1e-6)`` → q/k/v ``Linear`` (no bias; grouped-query: ``heads`` query heads,
``kv_heads`` key/value heads) → ``F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)``
→ o ``Linear`` → residual; ``RMSNorm`` → SwiGLU MLP (gate, up, down ``Linear``) → residual. Then a
final ``RMSNorm`` and the LM head. No rotary embedding: it adds no call to the operators measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional

#: The norms' epsilon (tiletune's ``rms_norm`` operator's).
NORM_EPS = 1e-6


@dataclass(frozen=True)
class DecoderShape:
    """The decoder's sizes; the defaults are a small Llama-style model."""

    layers: int = 4
    hidden: int = 512
    heads: int = 8
    kv_heads: int = 2
    mlp: int = 1408
    vocab: int = 4096

    @property
    def head_dim(self) -> int:
        """Each head's width: ``hidden / heads``."""
        return self.hidden // self.heads


class Attention(nn.Module):
    """Causal grouped-query self-attention through ``F.scaled_dot_product_attention``."""

    def __init__(self, shape: DecoderShape) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = shape.heads, shape.kv_heads, shape.head_dim
        self.q = nn.Linear(shape.hidden, shape.heads * shape.head_dim, bias=False)
        self.k = nn.Linear(shape.hidden, shape.kv_heads * shape.head_dim, bias=False)
        self.v = nn.Linear(shape.hidden, shape.kv_heads * shape.head_dim, bias=False)
        self.o = nn.Linear(shape.heads * shape.head_dim, shape.hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """``x`` [batch, seq, hidden] attended causally, projected back to ``hidden``."""
        batch, seq, _ = x.shape
        q = self.q(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        out = functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        projected: Tensor = self.o(out.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim))
        return projected


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``."""

    def __init__(self, shape: DecoderShape) -> None:
        super().__init__()
        self.gate = nn.Linear(shape.hidden, shape.mlp, bias=False)
        self.up = nn.Linear(shape.hidden, shape.mlp, bias=False)
        self.down = nn.Linear(shape.mlp, shape.hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """The MLP of ``x`` [..., hidden]."""
        out: Tensor = self.down(functional.silu(self.gate(x)) * self.up(x))
        return out


class Block(nn.Module):
    """One pre-norm decoder layer: attention and MLP, each with its residual."""

    def __init__(self, shape: DecoderShape) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(shape.hidden, eps=NORM_EPS)
        self.attention = Attention(shape)
        self.mlp_norm = nn.RMSNorm(shape.hidden, eps=NORM_EPS)
        self.mlp = SwiGLU(shape)

    def forward(self, x: Tensor) -> Tensor:
        """``x`` through the layer."""
        x = x + self.attention(self.attention_norm(x))
        out: Tensor = x + self.mlp(self.mlp_norm(x))
        return out


class Decoder(nn.Module):
    """Token ids [batch, seq] → logits [batch, seq, vocab]."""

    def __init__(self, shape: DecoderShape) -> None:
        super().__init__()
        self.embedding = nn.Embedding(shape.vocab, shape.hidden)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.layers))
        self.norm = nn.RMSNorm(shape.hidden, eps=NORM_EPS)
        self.head = nn.Linear(shape.hidden, shape.vocab, bias=False)

    def forward(self, tokens: Tensor) -> Tensor:
        """The logits of every position."""
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        logits: Tensor = self.head(self.norm(x))
        return logits


def build_decoder(shape: DecoderShape, seed: int = 0) -> Decoder:
    """A decoder of ``shape`` with weights drawn from ``seed`` (the same seed, the same weights)."""
    torch.manual_seed(seed)
    return Decoder(shape)


def next_token_loss(logits: Tensor, tokens: Tensor) -> Tensor:
    """Cross-entropy of each position's logits against the next token."""
    return functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
