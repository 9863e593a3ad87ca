"""The Zero Bubble paper's cost-aware greedy rules (``loop`` and ``v``) and their tuning."""
