"""How numbers read in every output (terminal report, HTML, TUI): sizes, rates, shares,
durations and times of day; each quantity formatted here only."""
from __future__ import annotations

import math

RATE_UNITS = (("Gb/s", 1e9), ("Mb/s", 1e6), ("kb/s", 1e3))
DAY_NS = 86_400_000_000_000


def plural(n: int, noun: str, many: str | None = None) -> str:
    """A count and its noun, singular for one: '1 rank', '8 ranks', '1,024 WRITE RPCs'; `many`
    when the plural is not noun + 's'."""
    return f"{n:,} {noun if n == 1 else many or noun + 's'}"


def decimals(largest: float | None, significant: int = 3, most: int = 4) -> int:
    """The decimals that show `largest` (the largest of values shown together) to `significant`
    digits: 23.6, 0.183, 1,234."""
    if not largest or not math.isfinite(largest):
        return 0
    return min(most, max(0, significant - 1 - math.floor(math.log10(abs(largest)))))


def number(v: float | None, unit: str = "", like: float | None = None) -> str:
    """A measured value with the precision its size needs (decimals() of `like`, else of v) and
    its unit: '23.6 s', '0.183 s', '126 ms', '5.55'; '-' when unknown."""
    if v is None:
        return "-"
    if isinstance(v, int) and like is None:
        return f"{v:,}" + (f" {unit}" if unit else "")
    return f"{v:,.{decimals(v if like is None else like)}f}" + (f" {unit}" if unit else "")


def duration(ns: float | None) -> str:
    """A duration on its own, with the precision its size needs: '23.3 s', '0.183 s', '20.0 ms'."""
    if ns is None:
        return "-"
    return number(ns / 1e9, "s") if abs(ns) >= 100_000_000 or not ns else number(ns / 1e6, "ms")


def size(n: float | None) -> str:
    """Bytes in binary units: '512 B', '4.0 KiB', '1.5 GiB'; '-' when unknown."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return ""


def byte_rate(bps: float | None) -> str:
    """Bytes per second in binary units: '183.8 KiB/s'; '-' when unknown."""
    return "-" if bps is None else size(bps) + "/s"


def _in_rate_unit(bps: float) -> tuple[float, str]:
    for unit, div in RATE_UNITS:
        if abs(bps) >= div:
            return bps / div, unit
    return bps, "b/s"


def rate(bps: float | None) -> str:
    """A measured rate in bits per second: '1.5 Mb/s', '10.0 Gb/s'; '?' when unknown."""
    if bps is None:
        return "?"
    value, unit = _in_rate_unit(bps)
    return f"{value:.0f} b/s" if unit == "b/s" else f"{value:.1f} {unit}"


def mbps(bps: float) -> str:
    """A rate always in Mb/s, '1.5 Mb/s': the JSON checklist's unit, one for every capture so that
    a script comparing values reads one unit."""
    return f"{bps / 1e6:.1f} Mb/s"


def gbps(bps: float) -> str:
    """A capacity always in Gb/s without padding digits, '10 Gb/s', '0.1 Gb/s' (the checklist's)."""
    return f"{bps / 1e9:g} Gb/s"


def round_rate(bps: float) -> str:
    """A round rate, as a link's capacity or an axis tick, without padding digits: '10 Gb/s',
    '2.5 Gb/s', '100 Mb/s'."""
    value, unit = _in_rate_unit(bps)
    return f"{value:g} {unit}"


def pct(x: float | None) -> str:
    """A share as a percentage, small ones with two significant digits ('0.025%')."""
    if x is None:
        return "?"
    return f"{100 * x:.0f}%" if x >= 0.01 or x == 0 else f"{100 * x:.2g}%"


def ms(ns: float | None, thousands: bool = True) -> str:
    """Nanoseconds in milliseconds, the unit left to the column head or the sentence: '1,234.5'
    ('1234.5' without `thousands`); '-' when unknown."""
    if ns is None:
        return "-"
    return f"{ns / 1e6:,.1f}" if thousands else f"{ns / 1e6:.1f}"


def seconds(ns: float | None, digits: int = 2, unit: bool = False) -> str:
    """Nanoseconds in seconds: '12.34', with unit '12.34 s'; '-' when unknown."""
    if ns is None:
        return "-"
    return f"{ns / 1e9:,.{digits}f}" + (" s" if unit else "")


def pids(values: list[int]) -> str:
    """A process list in one column: the first pid and how many more, '10742+1' (a list cut
    to fit, '10742,107', reads as two pids)."""
    return str(values[0]) + (f"+{len(values) - 1}" if len(values) > 1 else "") if values else "-"


def clock(utc_ns: int | None, decimals: int = 3) -> str:
    """A UTC time as its time of day, cut (not rounded) to `decimals`: '18:03:40.254',
    '18:03:40'; '?' when unknown."""
    if utc_ns is None:
        return "?"
    whole, frac = divmod(int(utc_ns) % DAY_NS, 1_000_000_000)
    text = f"{whole // 3600:02d}:{whole % 3600 // 60:02d}:{whole % 60:02d}"
    return text + f".{frac:09d}"[:decimals + 1] if decimals else text
