"""Facts about the training frameworks pp_opt writes settings for, each stated once.

- :mod:`.pytorch`: PyTorch's pipeline schedule names (``get_schedule_class``) and what
  each implies: placement, stages per rank, split or fused backward.
- :mod:`.torchtitan`: torchtitan's config keys, module names, base configs and required
  settings, keyed by release (``0.3`` and the renamed keys of the next release); its
  default schedule, stages per rank and layer split.
- :mod:`.megatron`: the Megatron-LM flags pp_opt prints and where each is read; its
  schedule and default layer split.

Each fact names the source it was checked against. Nothing here imports a framework.
"""
