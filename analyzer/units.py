"""How numbers read in every output (terminal report, HTML, TUI): sizes, rates, shares."""
from __future__ import annotations


def size(n: float | None) -> str:
    """Bytes in binary units: '512 B', '4.0 KiB', '1.5 GiB'; '-' when unknown."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return ""


def rate(bps: float | None) -> str:
    """Bits per second: '1.5 Mb/s', '10.0 Gb/s'; '?' when unknown."""
    if bps is None:
        return "?"
    for unit, div in (("Gb/s", 1e9), ("Mb/s", 1e6), ("kb/s", 1e3)):
        if bps >= div:
            return f"{bps / div:.1f} {unit}"
    return f"{bps:.0f} b/s"


def pct(x: float | None) -> str:
    """A share as a percentage, small ones with two significant digits ('0.025%')."""
    if x is None:
        return "?"
    return f"{100 * x:.0f}%" if x >= 0.01 or x == 0 else f"{100 * x:.2g}%"
