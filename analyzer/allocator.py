"""Which allocator Arrow's buffers come from while captures are analysed."""
from __future__ import annotations

import pyarrow as pa


def use_system_allocator() -> None:
    """Arrow buffers from the C library's malloc instead of pyarrow's default (mimalloc).

    An analysis makes few, large, short-lived buffers (columns of millions of rows). Under
    mimalloc a fresh process spent a third of its CPU zeroing new pages (clear_page, in perf):
    on bench/analyze.py's 50 M rows the first analysis in a process took 1.5-1.8 s with
    mimalloc and 1.15-1.25 s with malloc, later ones about the same."""
    pa.set_memory_pool(pa.system_memory_pool())
