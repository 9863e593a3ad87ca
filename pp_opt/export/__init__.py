"""Exporters: a solved schedule as a Chrome/Perfetto trace, as pictures, and as PyTorch CSV.

The trace needs nothing beyond the standard library; the pictures need
matplotlib (``pip install 'pp-opt[plot]'``), imported only when drawing. The
PyTorch CSV writer lives in :mod:`pp_opt.export.torch_csv`.
"""

from pp_opt.export.plot import plot_memory, plot_schedule, save_figure
from pp_opt.export.trace import trace_events, write_trace

__all__ = ["plot_memory", "plot_schedule", "save_figure", "trace_events", "write_trace"]
