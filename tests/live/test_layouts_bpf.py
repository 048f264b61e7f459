"""The BPF side of the layouts: a program compiled by BCC from the generated header fills
every field with a known value; the bulk reader decodes it into the same values, and so
do the Arrow columns."""
import os
import time

import pytest

from slotscope.agent.layouts import PATH_EVENT, PROC_EVENT, SYS_EVENT, c_header
from slotscope.agent.probes import PAGE
from slotscope.agent.ringbuf import RingReader

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("bpf_ready")]

LAYOUTS = (SYS_EVENT, PATH_EVENT, PROC_EVENT)
BITS = {"u8": 8, "u16": 16, "u32": 32, "u64": 64, "s32": 32, "s64": 64}


def expected(layout):
    """A distinct value per field that uses the field's high bits and, for signed ones, its sign."""
    values = {}
    for i, (name, ctype) in enumerate(layout.fields):
        if ctype.startswith("char"):
            size = int(ctype[5:-1])
            values[name] = f"{layout.name}-{name}-{i}".encode()[:size - 1]
            continue
        bits = BITS[ctype]
        v = (0x5A << (bits - 8)) | (i + 1)
        values[name] = -v if ctype[0] == "s" else v
    return values


def fill_code(layout):
    lines = [f"struct {layout.name} *e = ring_{layout.name}.ringbuf_reserve(sizeof(*e));", "if (!e) return 0;"]
    for name, value in expected(layout).items():
        if isinstance(value, bytes):
            lines += [f"e->{name}[{j}] = {b};" for j, b in enumerate(value)]
            lines.append(f"e->{name}[{len(value)}] = 0;")
        else:
            lines.append(f"e->{name} = {value}LL;" if value < 0 else f"e->{name} = {value}ULL;")
    lines.append(f"ring_{layout.name}.ringbuf_submit(e, 0);")
    return "\n    ".join(lines)


def test_bpf_struct_decodes_field_by_field():
    from bcc import BPF

    body = "\n".join(f"BPF_RINGBUF_OUTPUT(ring_{lay.name}, 1);" for lay in LAYOUTS)
    fills = "\n    ".join("{ " + fill_code(lay) + " }" for lay in LAYOUTS)
    me = os.getpid()
    text = (c_header() + body + f"""
TRACEPOINT_PROBE(syscalls, sys_enter_getppid) {{
    if ((bpf_get_current_pid_tgid() >> 32) != {me}) return 0;
    {fills}
    return 0;
}}""")
    b = BPF(text=text.encode())
    try:
        os.getppid()
        time.sleep(0.05)
        for lay in LAYOUTS:
            reader = RingReader(b[f"ring_{lay.name}".encode()].map_fd, PAGE, lay)
            events = reader.read()
            assert events.size == 1, lay.name
            cols = lay.to_arrow(events)
            for name, want in expected(lay).items():
                got = events[name][0]
                padding = name.startswith("_")          # decoded, never a column
                assert (name in cols) != padding, (lay.name, name)
                if isinstance(want, bytes):
                    assert bytes(got).rstrip(b"\0") == want, (lay.name, name)
                    assert padding or cols[name][0].as_py() == want.decode()
                else:
                    assert int(got) == want, (lay.name, name, int(got), want)
                    assert padding or cols[name][0].as_py() == want
            reader.close()
    finally:
        b.cleanup()


def test_batches_across_the_end_of_the_ring_are_read_whole_and_in_order():
    """The reader maps the ring's data once: a batch that crosses its end comes in two pieces
    (a record too: 88-byte records do not divide a 4 KiB page)."""
    from bcc import BPF

    me = os.getpid()
    text = (c_header() + f"""
BPF_RINGBUF_OUTPUT(ring, 1);
BPF_ARRAY(seq, u64, 1);
TRACEPOINT_PROBE(syscalls, sys_enter_getppid) {{
    if ((bpf_get_current_pid_tgid() >> 32) != {me}) return 0;
    int zero = 0;
    u64 *n = seq.lookup(&zero);
    if (!n) return 0;
    struct {SYS_EVENT.name} *e = ring.ringbuf_reserve(sizeof(*e));
    if (!e) return 0;
    e->count = (*n)++;
    ring.ringbuf_submit(e, 0);
    return 0;
}}""")
    b = BPF(text=text.encode())
    reader = RingReader(b[b"ring"].map_fd, PAGE, SYS_EVENT)
    try:
        got = []
        for batch in range(40):                  # 40 x 31 records of 88 bytes: 26 laps of the page
            for _ in range(31):
                os.getppid()
            events = reader.read()
            assert events.size == 31, batch
            got += events["count"].tolist()
        assert got == list(range(40 * 31))
    finally:
        reader.close()
        b.cleanup()
