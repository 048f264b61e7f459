"""What an Arrow IPC batch claims before it is decoded: its rows and the bytes its buffers
decode to. A reader checks the claim first, because a few compressed bytes can claim gigabytes
(pyarrow decompresses a whole batch at once, whatever memory that takes).

The claim is in the message's header, a flatbuffer (Arrow's format/Message.fbs):
Message{version, header_type, header, bodyLength}, whose header is a RecordBatch{length, nodes,
buffers, compression} or a DictionaryBatch{id, data: RecordBatch}. A compressed buffer starts
with its decoded length (int64, -1: stored as is).
"""
from __future__ import annotations

import struct

import pyarrow as pa

DICTIONARY_BATCH, RECORD_BATCH = 2, 3       # MessageHeader union type codes
BUFFER = struct.Struct("<qq")               # Buffer{offset, length}, in the body


class _Table:
    """A flatbuffer table: its fields by index (absent: None)."""

    def __init__(self, buf: bytes, pos: int):
        self.buf, self.pos = buf, pos
        self.vtable = pos - struct.unpack_from("<i", buf, pos)[0]
        self.vsize = struct.unpack_from("<H", buf, self.vtable)[0]

    def _at(self, index: int) -> int | None:
        slot = 4 + 2 * index
        if slot >= self.vsize:
            return None
        off = struct.unpack_from("<H", self.buf, self.vtable + slot)[0]
        return self.pos + off if off else None

    def scalar(self, index: int, fmt: str, default=0):
        at = self._at(index)
        return struct.unpack_from(fmt, self.buf, at)[0] if at is not None else default

    def _target(self, index: int) -> int | None:
        at = self._at(index)
        return at + struct.unpack_from("<I", self.buf, at)[0] if at is not None else None

    def table(self, index: int) -> "_Table | None":
        at = self._target(index)
        return _Table(self.buf, at) if at is not None else None

    def structs(self, index: int, size: int) -> list[int]:
        """The positions of a vector's fixed-size elements."""
        at = self._target(index)
        if at is None:
            return []
        n = struct.unpack_from("<I", self.buf, at)[0]
        if at + 4 + n * size > len(self.buf):
            raise ValueError("vector past the end of the header")
        return [at + 4 + i * size for i in range(n)]


def batch_claim(message: pa.ipc.Message) -> tuple[int, int] | None:
    """(rows, decoded bytes) a record or dictionary batch message claims; None for other messages.
    ValueError when its header cannot be read."""
    meta = message.metadata.to_pybytes()
    body = message.body
    try:
        msg = _Table(meta, struct.unpack_from("<I", meta, 0)[0])
        kind = msg.scalar(1, "<B")
        batch = msg.table(2)
        if kind == DICTIONARY_BATCH and batch is not None:
            batch = batch.table(1)
        if kind not in (DICTIONARY_BATCH, RECORD_BATCH):
            return None
        if batch is None:
            raise ValueError("batch message without a batch")
        rows = batch.scalar(0, "<q")
        compressed = batch.table(3) is not None
        decoded = 0
        for at in batch.structs(2, BUFFER.size):
            offset, length = BUFFER.unpack_from(meta, at)
            if offset < 0 or length < 0 or body is None or offset + length > body.size:
                raise ValueError("buffer outside the message body")
            if compressed and length >= 8:
                claimed = struct.unpack_from("<q", body[offset:offset + 8].to_pybytes())[0]
                decoded += length - 8 if claimed == -1 else claimed
            else:
                decoded += length
    except struct.error:
        raise ValueError("header cut short") from None
    if rows < 0 or decoded < 0:
        raise ValueError("negative sizes in the header")
    return rows, decoded
