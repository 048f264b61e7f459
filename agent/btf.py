"""Where a struct member lies in the running kernel, from its BTF (/sys/kernel/btf).

The kprobe groups read struct members. Compiling against the kernel's headers ties them
to whether BCC can compile those headers (BCC 0.31 cannot compile 7.3's: its own copy of
the uapi bpf.h is older than the kernel's), so where the kernel describes its types in BTF
(vmlinux, and each module's split BTF, 5.11+) the members' offsets and sizes are read here
and handed to the program as numbers. Only what that needs is parsed: the type records,
to follow a member path through structs, unions, typedefs and qualifiers.
"""
from __future__ import annotations

import functools
import os
import struct

BTF_DIR = "/sys/kernel/btf"
MAGIC = 0xEB9F
POINTER_SIZE = struct.calcsize("P")

# Kinds (linux/btf.h), and how many bytes follow a type record: fixed, and per vlen entry.
INT, PTR, ARRAY, STRUCT, UNION, ENUM, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT = range(1, 12)
FUNC, FUNC_PROTO, VAR, DATASEC, FLOAT, DECL_TAG, TYPE_TAG, ENUM64 = range(12, 20)
TRAILER = {INT: (4, 0), ARRAY: (12, 0), STRUCT: (0, 12), UNION: (0, 12), ENUM: (0, 8), FUNC_PROTO: (0, 8),
           VAR: (4, 0), DATASEC: (0, 12), DECL_TAG: (4, 0), ENUM64: (0, 12)}
SIZED = (INT, STRUCT, UNION, ENUM, FLOAT, ENUM64)           # the record's third word is the size
QUALIFIERS = (TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG)   # the third word is the type they name


class BtfError(Exception):
    """The BTF is not there, not BTF, or lacks what was asked for: the message says which."""


class Btf:
    """One BTF blob, optionally split on top of a base (a module's, on vmlinux's): type ids
    and string offsets then continue the base's."""

    def __init__(self, data: bytes, base: Btf | None = None, name: str = "BTF"):
        self.name, self.base = name, base
        if len(data) < 24:
            raise BtfError(f"{name} is too short to be BTF")
        magic, _version, _flags, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from("<HBBIIIII", data)
        if magic != MAGIC:
            raise BtfError(f"{name} is not BTF (magic {magic:#x}, or big-endian)")
        self.types = data[hdr_len + type_off: hdr_len + type_off + type_len]
        self.strings = data[hdr_len + str_off: hdr_len + str_off + str_len]
        self.first_id = base.first_id + len(base.offsets) if base else 1   # id 0 is void
        self.first_str = len(base.strings) + base.first_str if base else 0
        self.offsets = self._index()
        self._by_name: dict[str, list[int]] | None = None

    def _index(self) -> list[int]:
        """Where each type record starts in the type section."""
        offsets, pos, data = [], 0, self.types
        unpack = struct.Struct("<I").unpack_from
        while pos < len(data):
            offsets.append(pos)
            info = unpack(data, pos + 4)[0]
            fixed, per = TRAILER.get(info >> 24 & 0x1F, (0, 0))
            pos += 12 + fixed + per * (info & 0xFFFF)
        return offsets

    def _string(self, off: int) -> str:
        if off < self.first_str:
            return self.base._string(off)
        at = off - self.first_str
        return self.strings[at: self.strings.index(b"\0", at)].decode()

    def _record(self, type_id: int) -> tuple[str, int, int, int, bool, bytes, int]:
        """(name, kind, vlen, size-or-type, kind_flag, the section holding it, where its trailer
        starts) of a type id, in this BTF or its base."""
        if type_id < self.first_id:
            if self.base is None:
                raise BtfError(f"{self.name}: no type {type_id}")
            return self.base._record(type_id)
        pos = self.offsets[type_id - self.first_id]
        name_off, info, size_or_type = struct.unpack_from("<III", self.types, pos)
        return (self._string(name_off), info >> 24 & 0x1F, info & 0xFFFF, size_or_type, bool(info >> 31),
                self.types, pos + 12)

    def _structs_named(self, name: str) -> list[int]:
        """The ids of the structs (not forward declarations) of that name, this BTF's first."""
        if self._by_name is None:
            self._by_name = {}
            for i, pos in enumerate(self.offsets):
                name_off, info = struct.unpack_from("<II", self.types, pos)
                if info >> 24 & 0x1F == STRUCT:
                    self._by_name.setdefault(self._string(name_off), []).append(self.first_id + i)
        return self._by_name.get(name, []) + (self.base._structs_named(name) if self.base else [])

    def size(self, type_id: int) -> int:
        name, kind, _, size_or_type, _, data, trailer = self._record(type_id)
        if kind in SIZED:
            return size_or_type
        if kind == PTR:
            return POINTER_SIZE
        if kind in QUALIFIERS:
            return self.size(size_or_type)
        if kind == ARRAY:
            elem, _index, count = struct.unpack_from("<III", data, trailer)
            return self.size(elem) * count
        raise BtfError(f"{self.name}: type {type_id} ({name or 'anonymous'}) has no size")

    def _resolve(self, type_id: int) -> int:
        """Past typedefs and qualifiers, to the type they name."""
        while True:
            _, kind, _, size_or_type, _, _, _ = self._record(type_id)
            if kind not in QUALIFIERS:
                return type_id
            type_id = size_or_type

    def _find(self, type_id: int, name: str) -> tuple[int, int, int] | None:
        """(member type, bit offset, bitfield size) of `name` in a struct or union, looking
        inside its anonymous members too, as C does."""
        _, kind, vlen, _, kind_flag, data, trailer = self._record(type_id)
        if kind not in (STRUCT, UNION):
            return None
        for i in range(vlen):
            name_off, member_type, offset = struct.unpack_from("<III", data, trailer + 12 * i)
            at, bits = (offset & 0xFFFFFF, offset >> 24) if kind_flag else (offset, 0)
            member = self._string(name_off)
            if member == name:
                return member_type, at, bits
            found = None if member else self._find(self._resolve(member_type), name)
            if found:
                return found[0], at + found[1], found[2]
        return None

    def member(self, struct_name: str, path: str) -> tuple[int, int]:
        """(byte offset, size) of `path` ("backlog.qlen": members of members) in struct
        `struct_name`. BtfError, saying what is missing, if the struct or a member is not there."""
        ids = self._structs_named(struct_name)
        if not ids:
            raise BtfError(f"{self.name} has no struct {struct_name}")
        type_id, bit_offset, walked = ids[0], 0, struct_name
        for name in path.split("."):
            found = self._find(self._resolve(type_id), name)
            if found is None:
                raise BtfError(f"struct {struct_name} has no member `{path}` ({walked} has no `{name}`) "
                               f"in {self.name}")
            type_id, at, bits = found
            if bits or at % 8:
                raise BtfError(f"{struct_name}.{path} is a bitfield in {self.name}: it cannot be read by offset")
            bit_offset += at
            walked += f".{name}"
        return bit_offset // 8, self.size(type_id)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise BtfError(f"cannot read {path}: {exc.strerror}") from None


@functools.cache
def vmlinux() -> Btf:
    path = os.path.join(BTF_DIR, "vmlinux")
    return Btf(_read(path), name=path)


@functools.cache   # a module's types do not change while it stays loaded
def kernel_btf(module: str | None = None) -> Btf:
    """The running kernel's BTF: vmlinux's, or a module's on top of it."""
    if not module:
        return vmlinux()
    path = os.path.join(BTF_DIR, module)
    return Btf(_read(path), base=vmlinux(), name=path)


def has_module_btf(module: str) -> bool:
    """Whether the kernel describes this module's types (CONFIG_DEBUG_INFO_BTF_MODULES, 5.11+)."""
    return all(os.path.exists(os.path.join(BTF_DIR, name)) for name in ("vmlinux", module))
