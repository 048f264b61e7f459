"""What a save wrote, named from its files: the checkpoint layouts of the common libraries.

  DCP (torch.distributed.checkpoint)  __<rank>_<n>.distcp shards, and .metadata from rank 0
  safetensors                          *.safetensors (written under a temporary name, renamed)
  torch.save                           *.pt, *.pth, *.ckpt (zip archives; a .bin may be one, or not)

Anything else is named by its count of files.
"""
from __future__ import annotations

import os
import re

from .units import plural

DCP_SHARD = re.compile(r"__(\d+)_(\d+)\.distcp$")
DCP_METADATA = ".metadata"
# (format, what the report calls it, file name suffixes)
BY_SUFFIX = (
    ("safetensors", "safetensors checkpoint", (".safetensors",)),
    ("torch", "torch.save checkpoint", (".pt", ".pth", ".ckpt")),
)


def describe(files: list[str], directory: str | None) -> dict:
    """{"formats": [...], "text": "DCP checkpoint step_300/: 8 ranks x 4 shards + .metadata"}
    for the final paths of a save's files."""
    names = {f: os.path.basename(f) for f in files}
    where = f" {os.path.basename(directory.rstrip('/'))}/" if directory and directory != "/" else ""
    parts, formats, left = [], [], dict(names)
    shards: dict[int, int] = {}
    for f, n in names.items():
        if m := DCP_SHARD.match(n):
            shards[int(m[1])] = shards.get(int(m[1]), 0) + 1
            del left[f]
    if shards:
        per_rank = sorted(set(shards.values()))
        each = plural(per_rank[0], "shard") if len(per_rank) == 1 else f"{per_rank[0]}-{per_rank[-1]} shards"
        text = f"DCP checkpoint{where}: {plural(len(shards), 'rank')} x {each}"
        metadata = [f for f, n in left.items() if n == DCP_METADATA]
        if metadata:
            text += f" + {DCP_METADATA}" if len(metadata) == 1 else f" + {len(metadata)} {DCP_METADATA}"
            for f in metadata:
                del left[f]
        else:
            text += f" (no {DCP_METADATA}: the save did not finish, or rank 0 was not traced)"
        parts.append(text)
        formats.append("dcp")
    for fmt, label, suffixes in BY_SUFFIX:
        mine = sorted(f for f, n in left.items() if n.endswith(suffixes))
        if mine:
            parts.append(f"{label}{where}: {plural(len(mine), 'file')} ({', '.join(left[f] for f in mine[:2])}"
                         + (", ..." if len(mine) > 2 else "") + ")")
            formats.append(fmt)
            for f in mine:
                del left[f]
    if left:
        if parts:
            parts.append(plural(len(left), "other file"))
        else:
            parts.append((f"{where.strip()}: " if where else "") + plural(len(left), "file"))
    return {"formats": formats, "text": "; ".join(parts) if parts else "no files"}
