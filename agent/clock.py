"""The kernel's NTP state (adjtimex): whether CLOCK_REALTIME is synchronized and how well.

chronyd and ntpd keep it up to date (their estimated error, and the maximum error, which the
kernel grows by 500 ppm of elapsed time until the next update); a clock that nothing
synchronizes says STA_UNSYNC. Captures of many nodes line up on CLOCK_REALTIME, so meta.json
records this with the clock pair: the analyzer states each capture's clock uncertainty from it.
"""
from __future__ import annotations

import ctypes
import ctypes.util

ADJ_MAXERROR, ADJ_ESTERROR, ADJ_STATUS = 0x0004, 0x0008, 0x0010
STA_UNSYNC = 0x0040


class Timex(ctypes.Structure):
    """struct timex (linux/timex.h), as the C library lays it out on 64-bit Linux."""
    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
                ("constant", ctypes.c_long), ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
                ("time_sec", ctypes.c_long), ("time_usec", ctypes.c_long), ("tick", ctypes.c_long),
                ("ppsfreq", ctypes.c_long), ("jitter", ctypes.c_long), ("shift", ctypes.c_int),
                ("stabil", ctypes.c_long), ("jitcnt", ctypes.c_long), ("calcnt", ctypes.c_long),
                ("errcnt", ctypes.c_long), ("stbcnt", ctypes.c_long), ("tai", ctypes.c_int),
                ("_reserved", ctypes.c_int * 11)]


def _adjtimex(tx: Timex) -> Timex:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.adjtimex(ctypes.byref(tx)) < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"adjtimex: {ctypes.cast(libc.strerror(err), ctypes.c_char_p).value.decode()}")
    return tx


def sync_state() -> dict:
    """{"synchronized", "esterror_ns", "maxerror_ns"}: what the kernel was last told (modes 0 reads
    without changing anything, as any user may)."""
    tx = _adjtimex(Timex())
    return {"synchronized": not tx.status & STA_UNSYNC, "esterror_ns": tx.esterror * 1000,
            "maxerror_ns": tx.maxerror * 1000}


def mark_synchronized(esterror_ns: int, maxerror_ns: int) -> None:
    """Tell the kernel the clock is synchronized to within these bounds, as an NTP daemon does
    after it sets the clock (needs CAP_SYS_TIME). A clock_settime() marks it unsynchronized: call
    this after the step."""
    tx = _adjtimex(Timex())     # to keep the other status bits as they are
    _adjtimex(Timex(modes=ADJ_STATUS | ADJ_ESTERROR | ADJ_MAXERROR, status=tx.status & ~STA_UNSYNC,
                    esterror=max(1, esterror_ns // 1000), maxerror=max(1, maxerror_ns // 1000)))
