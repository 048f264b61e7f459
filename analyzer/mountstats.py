"""/proc/self/mountstats, the kernel's own per-op NFS counters: what the agent stores in
meta.json at start and stop, and their difference, against which a capture is checked."""
from __future__ import annotations

from slotscope.capture.mountstats import parse_section


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
