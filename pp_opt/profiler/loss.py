"""The loss's memory on the last pipeline stage: what it keeps from F to B, what its backward
holds, and what a chunked loss changes.

torchtitan 9dec370 computes ``cross_entropy(pred.flatten(0, 1).float(), labels)`` over the
whole microbatch after the output layer: F keeps the fp32 log-softmax over the vocabulary and
B holds its fp32 gradients beside it. torchtitan 0.3.0's model configs wrap the loss in
``ChunkedLossWrapper`` (``components/loss.py``, ``num_chunks = 8``; every llama3, qwen3,
deepseek_v3 and gpt_oss config): inside the last stage's F it runs the output layer, the
loss and their backward one sequence chunk at a time, adds each chunk's hidden-state
gradient into an fp32 buffer (``GradAccumulator``) and keeps that gradient, cast to the
hidden dtype, for B. The stack card's ``loss_chunks`` says which.
"""

from __future__ import annotations

from pp_opt.job import Job
from pp_opt.profiler.cards import ModelCard
from pp_opt.profiler.fsdp import fsdp_on
from pp_opt.profiler.stacks import load_stack_card

LOG_SOFTMAX_BYTES = 4.0
"""Bytes per logit the whole-microbatch loss keeps from F to B (its fp32 log-softmax)."""
LOSS_GRAD_BYTES = 8.0
"""Bytes per logit the loss's backward holds beyond its saved fp32 softmax: the fp32 gradient
of the log-softmax output and the fp32 gradient of its input (torchtitan's
``cross_entropy(pred.float(), labels)``)."""
LOSS_PARALLEL_GRAD_BYTES = 12.0
"""Bytes per logit beyond the saved log-softmax that torch's loss-parallel backward holds
(``torch.distributed.tensor.parallel.loss._nll_loss_and_log_softmax_backward``: the fp32
``zeros_like`` gradient, ``exp(x)``, their sum and the product, of which three at once);
torchtitan runs the loss parallel whenever ``tp > 1`` (``disable_loss_parallel`` false)."""
ACCUMULATOR_BYTES = 4.0
"""Bytes per hidden element of ``GradAccumulator``'s buffer (``dtype=torch.float32``)."""


def loss_chunks(job: Job) -> int:
    """The sequence chunks the job's stack runs the loss in (1: the whole microbatch)."""
    return load_stack_card(job.stack).loss_chunks


def loss_grad_bytes(job: Job) -> float:
    """Bytes per logit the loss's backward holds beyond its saved fp32 log-softmax."""
    if job.tp > 1 and fsdp_on(job):  # torchtitan's runtime: loss parallel under TP
        return LOSS_PARALLEL_GRAD_BYTES
    return LOSS_GRAD_BYTES


def loss_kept_bytes(card: ModelCard, job: Job, tokens: float) -> float:
    """Bytes one microbatch of ``tokens`` keeps from the last stage's F to its B for the loss:
    the fp32 log-softmax over this GPU's vocabulary share, or under a chunked loss the
    hidden states' gradient (hidden dtype; the chunks enter the output layer replicated over
    the tensor-parallel ranks, so it is the whole width)."""
    if loss_chunks(job) > 1:
        return card.dtype_bytes * tokens * card.hidden
    return LOG_SOFTMAX_BYTES * tokens * card.vocab / job.tp


def loss_transient_bytes(card: ModelCard, job: Job, tokens: float) -> float:
    """What the loss holds only while it runs: the fp32 gradients of the whole microbatch's
    logits in B, or under a chunked loss (in F) one chunk's logits, their fp32 log-softmax
    and gradients, and the fp32 gradient accumulator."""
    chunks = loss_chunks(job)
    if chunks == 1:
        return loss_grad_bytes(job) * tokens * card.vocab / job.tp
    per_logit = card.dtype_bytes + LOG_SOFTMAX_BYTES + loss_grad_bytes(job)
    chunk = per_logit * tokens / chunks * card.vocab / job.tp
    return chunk + ACCUMULATOR_BYTES * tokens * card.hidden
