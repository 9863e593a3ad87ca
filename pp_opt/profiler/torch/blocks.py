"""A model card as real PyTorch modules: a pre-norm decoder block and the output head.

Linear layers can defer their weight gradient, as the Zero Bubble implementation does: in B
they compute only the input gradient and keep ``(input, output gradient)`` in a
:class:`WeightGradStore`; W is then :meth:`WeightGradStore.flush`. That makes B and W two
separately timed steps that together do the work of one ordinary backward.

Choices that decide what autograd keeps (see formulas.py, which counts the same tensors):
eager attention is explicit ``softmax(QK^T / sqrt(d) + causal) V`` with GQA heads expanded;
flash attention is ``scaled_dot_product_attention`` (a fused kernel where the device has one);
dropout uses ``torch.native_dropout`` (a 1-byte bool mask on CPU and CUDA); RMSNorm is a small
autograd function that keeps its input and rstd, as fused kernels do. No rotary embedding
(it changes no tensor that is kept). Import this module only when torch is installed.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from pp_opt.profiler.cards import ModelCard


class WeightGradStore:
    """Inputs and output gradients of deferred linear layers, kept from B until W."""

    def __init__(self) -> None:
        self.items: list[tuple[torch.Tensor, torch.Tensor, nn.Parameter, nn.Parameter | None]] = []

    def flush(self) -> None:
        """W: every deferred weight (and bias) gradient, accumulated into ``.grad``."""
        for x, grad, weight, bias in self.items:
            g2 = grad.reshape(-1, grad.shape[-1])
            gw = g2.t().matmul(x.reshape(-1, x.shape[-1]))
            weight.grad = gw if weight.grad is None else weight.grad + gw
            if bias is not None:
                gb = g2.sum(0)
                bias.grad = gb if bias.grad is None else bias.grad + gb
        self.items.clear()

    def saved_bytes(self) -> int:
        """Bytes of the distinct storages held for W (``M_W`` as measured)."""
        seen: dict[int, int] = {}
        for x, grad, _, _ in self.items:
            for t in (x, grad):
                storage = t.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
        return sum(seen.values())


class _DeferredLinear(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        store: WeightGradStore,
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.bias, ctx.store = bias, store
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        x, weight = ctx.saved_tensors
        ctx.store.items.append((x, grad, weight, ctx.bias))
        return grad.matmul(weight), None, None, None


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, weight)
        return (x.float() * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, rstd, weight = ctx.saved_tensors
        xhat = x.float() * rstd
        gw = grad.float() * weight.float()
        dx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        dweight = (grad.float() * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dweight.to(weight.dtype), None


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Function.apply has no type hints.
        return cast(torch.Tensor, _RMSNorm.apply(x, self.weight, self.eps))  # type: ignore[no-untyped-call]


def _norm(card: ModelCard) -> nn.Module:
    return nn.LayerNorm(card.hidden) if card.norm == "layernorm" else RMSNorm(card.hidden)


class _Deferrable(nn.Module):
    """Runs its linear layers plainly, or deferring W into ``store`` when one is set."""

    store: WeightGradStore | None = None

    def linear(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        if self.store is None:
            return F.linear(x, layer.weight, layer.bias)
        out = _DeferredLinear.apply(x, layer.weight, layer.bias, self.store)  # type: ignore[no-untyped-call]
        return cast(torch.Tensor, out)


class DecoderBlock(_Deferrable):
    """Pre-norm decoder layer: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, card: ModelCard) -> None:
        super().__init__()
        self.card = card
        h, f, kv = card.hidden, card.ffn_size, card.kv_hidden
        self.norm1, self.norm2 = _norm(card), _norm(card)
        self.qkv = nn.Linear(h, h + 2 * kv, bias=card.bias)
        self.proj = nn.Linear(h, h, bias=card.bias)
        self.fc1 = nn.Linear(h, 2 * f if card.mlp == "swiglu" else f, bias=card.bias)
        self.fc2 = nn.Linear(f, h, bias=card.bias)

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        if self.card.dropout > 0 and self.training:
            return torch.native_dropout(x, self.card.dropout, True)[0]
        return x

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        a, kv_heads, d = self.card.heads, self.card.num_kv_heads, h // self.card.heads
        q, k, v = self.linear(self.qkv, x).split([h, kv_heads * d, kv_heads * d], dim=-1)
        q = q.view(b, s, a, d).transpose(1, 2)
        k = k.view(b, s, kv_heads, d).transpose(1, 2)
        v = v.view(b, s, kv_heads, d).transpose(1, 2)
        if self.card.attention == "flash":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads < a)
        else:
            if kv_heads < a:
                k = k.repeat_interleave(a // kv_heads, dim=1)
                v = v.repeat_interleave(a // kv_heads, dim=1)
            causal = torch.full((s, s), float("-inf"), device=x.device, dtype=x.dtype).triu(1)
            scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d)) + causal
            out = torch.matmul(self._drop(torch.softmax(scores, dim=-1)), v)
        return self.linear(self.proj, out.transpose(1, 2).reshape(b, s, h))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(self.fc1, x)
        if self.card.mlp == "swiglu":
            gate, up = y.chunk(2, dim=-1)
            y = F.silu(gate) * up
        else:
            y = F.gelu(y)
        return self.linear(self.fc2, y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._drop(self._attention(self.norm1(x)))
        return x + self._drop(self._mlp(self.norm2(x)))


class OutputHead(_Deferrable):
    """Final norm, output layer and cross-entropy loss (fp32 log-softmax) of the last stage."""

    def __init__(self, card: ModelCard) -> None:
        super().__init__()
        self.norm = _norm(card)
        self.out = nn.Linear(card.hidden, card.vocab, bias=False)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.linear(self.out, self.norm(x))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
