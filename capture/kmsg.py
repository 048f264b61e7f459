"""Which kernel log lines the kmsg table holds, and how a hung-task report continues: the agent
keeps lines by these rules, and the analyzer reads reports (kernel logs, the kmsg table) by them."""
from __future__ import annotations

import re

# Kernel log lines worth keeping: NFS and RPC client and server messages, hung tasks.
KMSG_PATTERN = re.compile(r"\bnfs|\brpc|\bsunrpc|lockd|not responding|hung_task|blocked for more than", re.I)
HUNG_TASK = "blocked for more than"

# A call-trace frame: " ? rpc_wait_bit_killable+0x11/0x70 [sunrpc]" (old kernels: "[<ffff..>] fn+..").
FRAME = re.compile(r"\s*(?:\[<[0-9a-f]+>\] )?(?:\? )?(?P<fn>[A-Za-z_][\w.]*)\+0x[0-9a-f]+/0x[0-9a-f]+"
                   r"(?: \[(?P<mod>\w+)(?: [0-9a-f]+)?\])?")
# Lines of a hung-task report that are not frames and do not end it.
REPORT_LINE = re.compile(r'\s*(?:Not tainted|Tainted:|"echo 0 >|task:|Call [Tt]race:|</?(?:TASK|IRQ|NMI|EOI)>'
                         r"|(?:RIP|RSP|RAX|RBX|RCX|RDX|RSI|RDI|RBP|R\d\d?|FS|GS|CS|CR\d|DR\d): )")


def continues_report(text: str) -> bool:
    """A line that belongs to the hung-task report before it (a frame, or a header line)."""
    return bool(FRAME.match(text) or REPORT_LINE.match(text))


class KmsgFilter:
    """Which kernel log lines to keep: NFS/RPC lines, and hung-task reports with their whole
    call trace (its frames say where the task waits, NFS or not)."""

    def __init__(self):
        self._in_report = False

    def keep(self, message: str) -> bool:
        self._in_report = (self._in_report and continues_report(message)) or HUNG_TASK in message
        return self._in_report or bool(KMSG_PATTERN.search(message))
