"""A model card as pipeline stages: the modules the profiler times and the runtime trains.

One :class:`DecoderStage` per pipeline stage: the first embeds token ids (and learned
positions), every stage runs its decoder layers (:class:`~.blocks.DecoderBlock`), and
the last ends with the final norm and the output layer and returns logits. The loss
(:func:`lm_loss`) is not part of the module: PyTorch's pipeline runtime computes it from the
last stage's output inside that stage's forward action, and the profiler does the same, so
both time the same work. Import this module only when torch is installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pp_opt.profiler.cards import ModelCard
from pp_opt.profiler.torch.blocks import DecoderBlock, _norm

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class TokenEmbedding(nn.Module):
    """Token embedding plus a learned ``s x h`` position table (``position = "learned"``)."""

    def __init__(self, card: ModelCard) -> None:
        super().__init__()
        self.tokens = nn.Embedding(card.vocab, card.hidden)
        self.positions = nn.Embedding(card.seq, card.hidden) if card.position == "learned" else None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x: torch.Tensor = self.tokens(ids)
        if self.positions is not None:
            x = x + self.positions.weight[: ids.shape[-1]]
        return x


class LMHead(nn.Module):
    """Final norm and output layer; returns the logits (the loss is :func:`lm_loss`)."""

    def __init__(self, card: ModelCard) -> None:
        super().__init__()
        self.norm = _norm(card)
        self.out = nn.Linear(card.hidden, card.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.out(self.norm(x))
        return logits


class DecoderStage(nn.Module):
    """One pipeline stage: ``[embedding] -> layers x DecoderBlock -> [norm, output layer]``."""

    def __init__(self, card: ModelCard, layers: int, *, first: bool, last: bool) -> None:
        super().__init__()
        self.embed = TokenEmbedding(card) if first else None
        self.blocks = nn.ModuleList(DecoderBlock(card) for _ in range(layers))
        self.head = LMHead(card) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        if self.head is not None:
            x = self.head(x)
        return x


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over a microbatch, fp32 log-softmax (the last stage's loss)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def make_stage(
    card: ModelCard,
    layers: Sequence[int],
    stage: int,
    *,
    device: Any = "cpu",
    dtype: str = "fp32",
    seed: int = 0,
) -> DecoderStage:
    """Stage ``stage`` of the model split as ``layers`` (layers per stage), seeded per stage.

    Every process that builds a stage gets the same weights for the same ``seed``, and the
    global random state is left as it was.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed * 10_007 + stage)
        module = DecoderStage(card, layers[stage], first=stage == 0, last=stage == len(layers) - 1)
    return module.to(device=device, dtype=TORCH_DTYPES[dtype]).train()


def make_batch(
    card: ModelCard, *, rows: int, seq: int, device: Any = "cpu", seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token targets, ``rows x seq`` each (``rows = m x mbs`` for a step)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, card.vocab, (rows, seq + 1), generator=gen)
    return ids[:, :-1].contiguous().to(device), ids[:, 1:].contiguous().to(device)
