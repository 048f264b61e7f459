"""/proc/self/mountstats, the kernel's own per-op NFS counters: what the agent stores in
meta.json at start and stop, and their difference, against which a capture is checked."""
from __future__ import annotations

import re

from slotscope.capture.mountstats import nfs_sections, parse_section

from .job import utc_ns


def parse(text: str, mountpoint: str = "/mnt/nfs") -> dict:
    """The section of one mount in a whole /proc/self/mountstats text."""
    inside, lines = False, []
    for line in text.splitlines():
        if line.startswith("device "):
            inside = f" mounted on {mountpoint} " in line
        elif inside:
            lines.append(line)
    found = parse_section("\n".join(lines))
    if not found["ops"]:
        raise ValueError(f"no NFS mount on {mountpoint} in mountstats")
    return found


def delta(before: dict, after: dict) -> dict:
    """Counter differences per op; transports as they are after (max_slots is a high-water
    mark, so only the after value means anything)."""
    ops = {name: {k: v - before["ops"].get(name, {}).get(k, 0) for k, v in c.items()}
           for name, c in after["ops"].items()}
    return {"ops": ops, "xprt": after["xprt"]}


def capture_deltas(meta: dict) -> dict[str, dict]:
    """mountpoint -> delta() over the recording, for the mounts meta.json has both ends of."""
    start, stop = meta.get("mountstats_start") or {}, meta.get("mountstats_stop") or {}
    return {point: delta(parse_section(start[point]), parse_section(stop[point]))
            for point in sorted(set(start) & set(stop))}


def _device_server(device: str) -> str:
    """'10.0.0.1:/export' -> '10.0.0.1'; '[fd00::1]:/export' -> 'fd00::1'."""
    return device.rpartition(":/")[0].strip("[]") if ":/" in device else device


def mounts(text: str) -> dict[str, tuple[str, dict]]:
    """mountpoint -> (server, parse_section()) of every NFS mount in a whole mountstats text."""
    return {point: (_device_server(section.split()[1]), parse_section(section))
            for point, section in nfs_sections(text).items()}


_ISO = re.compile(r"(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d)(?:[.,](\d+))?(Z|[+-]\d\d:?\d\d)?")


def stamp(line: str) -> int | None:
    """UTC ns of a timestamp line (`date +%s.%N`, or ISO 8601 as `date -Ins` writes it; without
    a zone it is UTC), None when the line is not one."""
    line = line.strip()
    if re.fullmatch(r"\d+(\.\d+)?", line):
        whole, _, frac = line.partition(".")
        return int(whole) * 1_000_000_000 + int((frac + "000000000")[:9])
    m = _ISO.fullmatch(line)
    if not m:
        return None
    zone = m.group(3) or "Z"
    base = utc_ns(m.group(1).replace(" ", "T") + (zone if ":" in zone or zone == "Z" else zone[:3] + ":" + zone[3:]))
    return base + int(((m.group(2) or "") + "000000000")[:9])


def snapshots(text: str) -> list[tuple[int, str]]:
    """(UTC ns, mountstats text) of each copy in a file of copies each headed by a timestamp line."""
    out: list[tuple[int, list[str]]] = []
    for line in text.splitlines():
        t = stamp(line) if line and not line[0].isspace() and not line.startswith("device ") else None
        if t is not None:
            out.append((t, []))
        elif out:
            out[-1][1].append(line)
    return [(t, "\n".join(lines)) for t, lines in out]
