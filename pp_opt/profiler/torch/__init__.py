"""The profiler's PyTorch wing: the model the runtime trains and the measurement of its stages.

:mod:`.blocks` and :mod:`.model` build the decoder stages, :mod:`.stage_ops` and
:mod:`.stage_profile` time what ``torch.distributed.pipelining`` runs, :mod:`.link` a message
between neighbours, and :mod:`.measured` turns the timings into a cost profile
(:mod:`.timing_stats`, :mod:`.machine_load`: the statistics and the machine's load beside
them). The formulas it is checked against sit in :mod:`pp_opt.profiler`, which never imports
this package at module level; importing this package itself loads nothing (its modules do).
"""
