"""Event layouts: the C struct the BPF side gets, the numpy dtype that decodes it and the
Arrow types must agree byte for byte. gcc compiles the generated struct text, fills it
with a distinct value per field, and the bytes are decoded with the layout's dtype.
(The live tier checks the BPF side; this checks C <-> numpy <-> Arrow.)"""
from __future__ import annotations

import shutil
import struct
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from slotscope.agent.layouts import LAYOUTS, PATH_EVENT, PROC_EVENT, SYS_EVENT, Distinct, Layout, c_header

pytestmark = pytest.mark.unit

GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc is not installed: cannot compile the generated C structs")

TYPEDEFS = """
#include <stdint.h>
#include <stdio.h>
#include <string.h>
typedef uint8_t u8; typedef uint16_t u16; typedef uint32_t u32; typedef uint64_t u64;
typedef int32_t s32; typedef int64_t s64;
"""

EXPECTED_ARROW = {"u8": pa.uint8(), "u16": pa.uint16(), "u32": pa.uint32(), "u64": pa.uint64(),
                  "s32": pa.int32(), "s64": pa.int64()}
INT_BASE = {"u8": 0xA0, "u16": 0xB100, "u32": 0xC2000000, "u64": 0xD300000000000000,
            "s32": -1_000_000, "s64": -(10 ** 15)}
C_SUFFIX = {"u8": "u", "u16": "u", "u32": "u", "u64": "ull", "s32": "", "s64": "ll"}
RECORDS = 3


def _value(ctype: str, rec: int, idx: int):
    """A value distinct per record and field that uses the whole width of its type."""
    if ctype.startswith("char["):
        n = int(ctype[5:-1])
        text = f"r{rec}f{idx}".encode()
        if n >= 64:
            # a long string, NUL-terminated, with junk after the NUL (BPF does not zero the tail)
            return b"/mnt/ckpt/" + b"x" * (n - 30) + f"-{rec}-{idx}".encode() + b"\0junk"
        return text[: n - 1]
    base = INT_BASE[ctype]
    return base - rec * 7 - idx if ctype.startswith("s") else base + rec * 7 + idx


def _c_literal(v: int, ctype: str) -> str:
    if ctype == "s64" and v < 0:
        return f"({v + 1}ll - 1)"  # avoid the unrepresentable-literal warning for large negatives
    return f"{v}{C_SUFFIX[ctype]}"


def _c_program(layout: Layout) -> str:
    fills = []
    for rec in range(RECORDS):
        fills.append(f"    memset(&s[{rec}], 0, sizeof s[{rec}]);")
        for idx, (fname, ctype) in enumerate(layout.fields):
            v = _value(ctype, rec, idx)
            if isinstance(v, bytes):
                lit = "".join(f"\\x{b:02x}" for b in v)
                fills.append(f'    memcpy(s[{rec}].{fname}, "{lit}", {len(v)});')
            else:
                fills.append(f"    s[{rec}].{fname} = {_c_literal(v, ctype)};")
    return (TYPEDEFS + layout.c_struct() +
            f"int main(void) {{\n    static struct {layout.name} s[{RECORDS}];\n" + "\n".join(fills) +
            f"\n    uint64_t size = sizeof(struct {layout.name});\n"
            "    fwrite(&size, sizeof size, 1, stdout);\n"
            f"    fwrite(s, sizeof s, 1, stdout);\n    return 0;\n}}\n")


def _compile_and_run(tmp_path, source: str) -> bytes:
    src = tmp_path / "prog.c"
    exe = tmp_path / "prog"
    src.write_text(source)
    cc = subprocess.run([GCC, "-std=gnu11", "-Wall", "-Werror", "-o", str(exe), str(src)],
                        capture_output=True, text=True)
    assert cc.returncode == 0, f"generated C does not compile:\n{cc.stderr}\n{source}"
    return subprocess.run([str(exe)], capture_output=True, check=True).stdout


@needs_gcc
@pytest.mark.parametrize("layout", [SYS_EVENT, PATH_EVENT, PROC_EVENT], ids=lambda l: l.name)
def test_c_struct_bytes_decode_with_the_dtype(tmp_path, layout):
    out = _compile_and_run(tmp_path, _c_program(layout))
    (size,) = struct.unpack("=Q", out[:8])
    assert size == layout.dtype.itemsize, "sizeof(struct) differs from the numpy itemsize"
    assert len(out) == 8 + RECORDS * size
    recs = np.frombuffer(out[8:], dtype=layout.dtype)
    assert recs.shape == (RECORDS,)
    for rec in range(RECORDS):
        for idx, (fname, ctype) in enumerate(layout.fields):
            want = _value(ctype, rec, idx)
            got = recs[fname][rec]
            if isinstance(want, bytes):
                # numpy's S dtype drops trailing NULs only
                assert bytes(got) == want.rstrip(b"\0"), (fname, rec)
            else:
                assert int(got) == want, (fname, rec)


@needs_gcc
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: l.name)
def test_to_arrow_types_and_values_from_c_bytes(tmp_path, layout):
    out = _compile_and_run(tmp_path, _c_program(layout))
    recs = np.frombuffer(out[8:], dtype=layout.dtype)
    cols = layout.to_arrow(recs)
    assert list(cols) == [f for f, _ in layout.fields if not f.startswith("_")]   # padding left out
    for idx, (fname, ctype) in enumerate(layout.fields):
        if fname.startswith("_"):
            continue
        col = cols[fname]
        assert len(col) == RECORDS
        if ctype.startswith("char["):
            assert col.type == pa.string()
            want = [_value(ctype, r, idx).split(b"\0", 1)[0].decode() for r in range(RECORDS)]
        else:
            assert col.type == EXPECTED_ARROW[ctype], fname
            assert layout.arrow_type(fname) == EXPECTED_ARROW[ctype]
            want = [_value(ctype, r, idx) for r in range(RECORDS)]
        assert col.to_pylist() == want, fname


def test_path_string_stops_at_the_first_nul():
    recs = np.zeros(1, PATH_EVENT.dtype)
    recs["path"][0] = b"/mnt/ckpt/a\0stale-bytes-from-an-earlier-event"
    assert PATH_EVENT.to_arrow(recs)["path"].to_pylist() == ["/mnt/ckpt/a"]


def test_timestamps_are_int64_nanoseconds():
    for layout, field in ((SYS_EVENT, "ts_enter"), (SYS_EVENT, "ts_exit"), (PATH_EVENT, "ts_enter"),
                          (PROC_EVENT, "ts")):
        assert layout.arrow_type(field) == pa.int64()
        assert layout.dtype[field] == np.dtype(np.int64)


def test_c_struct_text_declares_every_field_in_order():
    text = SYS_EVENT.c_struct()
    positions = [text.index(f" {fname};") for fname, _ in SYS_EVENT.fields]
    assert positions == sorted(positions)
    assert f"== {SYS_EVENT.dtype.itemsize}" in text   # the compile-time size check


@needs_gcc
def test_whole_c_header_compiles(tmp_path):
    source = TYPEDEFS + c_header() + (
        "int main(void) { printf(\"%d %d %zu\\n\", SYSOP_WRITE, LOSS_NCOUNTERS, sizeof(struct sys_event)); return 0; }\n")
    out = _compile_and_run(tmp_path, source).decode().split()
    from slotscope.agent.layouts import LOSS_COUNTERS, OP_NUMBER
    assert out == [str(OP_NUMBER["write"]), str(len(LOSS_COUNTERS)), str(SYS_EVENT.dtype.itemsize)]


@needs_gcc
def test_size_check_fires_when_layouts_disagree(tmp_path):
    """The _Static_assert in the generated text really catches a mismatch."""
    broken = SYS_EVENT.c_struct().replace("u8 partial;", "u64 partial;")
    src = tmp_path / "broken.c"
    src.write_text(TYPEDEFS + broken + "int main(void) { return 0; }\n")
    cc = subprocess.run([GCC, "-std=gnu11", "-c", "-o", str(tmp_path / "b.o"), str(src)],
                        capture_output=True, text=True)
    assert cc.returncode != 0
    assert "C and numpy layouts differ" in cc.stderr


def test_after_warm_up_decoding_imports_nothing_more():
    """The recorder warms up before saying "recording": the first drain with events must not
    pay a lazy import (numpy.ma on the first pa.array of an ndarray: 0.6 s under emulation)."""
    code = """
import sys
import numpy as np
from slotscope.agent.layouts import LAYOUTS, warm_up
rng = np.random.default_rng(1)
records = [np.frombuffer(rng.bytes(layout.dtype.itemsize * 50), layout.dtype) for layout in LAYOUTS]
if sys.argv[1] == "warm":
    warm_up()
before = set(sys.modules)
for layout, recs in zip(LAYOUTS, records):
    layout.to_arrow(recs)
print(" ".join(sorted(set(sys.modules) - before)))
"""
    cold, warm = (subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True, check=True).stdout.split()
                  for how in ("cold", "warm"))
    assert "numpy.ma" in cold      # what the warm-up is for, or this test tests nothing
    assert warm == []


@pytest.mark.parametrize("values", [
    np.full(1000, 7, np.int64),                                     # one value: one run
    np.repeat(np.array([5, 9, 5, 2], np.uint32), 300),              # long runs, a value seen twice
    np.random.default_rng(1).integers(0, 4, 1000, dtype=np.int64),  # short runs: hashed by row
    np.array([3], np.int64),
], ids=["constant", "runs", "mixed", "single"])
def test_distinct_maps_every_row_to_its_own_value(values):
    distinct = Distinct(values)
    assert sorted(distinct.values) == sorted(set(values.tolist()))
    assert np.array(distinct.values)[distinct.indices].tolist() == values.tolist()
    assert distinct.map(lambda v: f"v{v}", pa.string()).to_pylist() == [f"v{v}" for v in values.tolist()]
