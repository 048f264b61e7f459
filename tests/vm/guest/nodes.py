"""Two nodes (run-scenario --nodes 2): the control channel between the two VMs' guests, over
the link that joins them, and node 2's clock step.

Node 1 (the server, and its own client) listens; node 2 connects. A line "time" is answered at
once with node 1's CLOCK_REALTIME in ns; every other line is a message of the scenario's
protocol: node 2 says "ready" (mounted, agent recording, ranks started), node 1 answers "go"
when its own ranks are ready too, and node 2 says "done" when it has its results. A message may
carry data, JSON on the same line after its name (a real job's ranks: guest/scenario.py).

The guests' real-time clocks start from the emulated RTC, in whole seconds: node 2 steps its
own to node 1's, NTP-style (the sample with the shortest round trip of many; node 1's time is
taken as at its middle), then measures again: what is left, plus half that round trip, bounds
the error. It tells the kernel so (adjtimex, as chronyd does), which the agent records in
meta.json; node 1, the reference, says it is synchronized with no error.
"""

import json
import queue
import socket
import threading
import time


PORT = 7700
SAMPLES = 32
REALTIME = time.CLOCK_REALTIME


class NodeError(RuntimeError):
    pass


def message(what, data=None):
    return f"{what}\n".encode() if data is None else f"{what} {json.dumps(data)}\n".encode()


def payload(got, what, who):
    """The data of the message `got`, which must be `what` with data."""
    name, _, data = (got or "").partition(" ")
    if name != what or not data:
        raise NodeError(f"{who} said {repr(got)[:80]} (None: it hung up) where {what!r} with data was awaited")
    return json.loads(data)


def mark_synchronized(esterror_ns, maxerror_ns):
    from slotscope.agent.clock import mark_synchronized   # installed by the boot, after this imports
    mark_synchronized(esterror_ns, maxerror_ns)


def now_ns():
    return time.clock_gettime_ns(REALTIME)


class Peer:
    """Node 1's end: listens on the link; answers "time" in its reader thread, queues the rest."""

    def __init__(self, addr):
        self.server = socket.create_server((addr, PORT))
        self.messages = queue.Queue()
        self.conn = None
        threading.Thread(target=self._serve, daemon=True).start()
        mark_synchronized(0, 0)     # the job's reference clock

    def _serve(self):
        conn, _ = self.server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn = conn
        for line in conn.makefile("rb"):
            if line == b"time\n":
                conn.sendall(b"%d\n" % now_ns())
            else:
                self.messages.put(line.decode().strip())
        self.messages.put(None)

    def _next(self, what, timeout):
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise NodeError(f"node 2 did not say {what!r} within {timeout:.0f} s") from None

    def wait(self, what, timeout):
        got = self._next(what, timeout)
        if got != what:
            raise NodeError(f"node 2 said {got!r} (None: it hung up) where node 1 waited for {what!r}")

    def receive(self, what, timeout):
        return payload(self._next(what, timeout), what, "node 2")

    def send(self, what, data=None):
        self.conn.sendall(message(what, data))

    def wait_hangup(self, timeout):
        """Until node 2's job ends (its agent stopped): the server must outlive its mount."""
        self.wait(None, timeout)


class Control:
    """Node 2's end: connects (node 1 may still be installing), asks the time, sends and waits."""

    def __init__(self, addr, timeout):
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = socket.create_connection((addr, PORT), timeout=5)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise NodeError(f"node 1 ({addr}:{PORT}) did not answer within {timeout:.0f} s: {e}") from None
                time.sleep(1)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.lines = self.sock.makefile("rb")

    def _line(self, timeout):
        self.sock.settimeout(timeout)
        try:
            line = self.lines.readline()
        except TimeoutError:
            raise NodeError(f"node 1 said nothing within {timeout:.0f} s") from None
        if not line:
            raise NodeError("node 1 hung up")
        return line.decode().strip()

    def sample(self):
        """(offset of node 1's clock from ours, round trip) in ns, from one exchange."""
        t0 = now_ns()
        self.sock.sendall(b"time\n")
        theirs = int(self._line(10))
        t1 = now_ns()
        return theirs - (t0 + t1) // 2, t1 - t0

    def offset(self):
        """The sample with the shortest round trip of SAMPLES: {"offset_ns", "rtt_ns"}."""
        off, rtt = min((self.sample() for _ in range(SAMPLES)), key=lambda s: s[1])
        return {"offset_ns": off, "rtt_ns": rtt}

    def step_clock(self):
        """Step CLOCK_REALTIME to node 1's, measure what is left, tell the kernel the bound."""
        before = self.offset()
        time.clock_settime_ns(REALTIME, now_ns() + before["offset_ns"])
        after = self.offset()
        bound = abs(after["offset_ns"]) + after["rtt_ns"] // 2
        mark_synchronized(bound, bound)
        return {"step_ns": before["offset_ns"], "step_rtt_ns": before["rtt_ns"], "after": after,
                "uncertainty_ns": bound}

    def send(self, what, data=None):
        self.sock.sendall(message(what, data))

    def wait(self, what, timeout):
        got = self._line(timeout)
        if got != what:
            raise NodeError(f"node 1 said {got!r} where node 2 waited for {what!r}")

    def receive(self, what, timeout):
        return payload(self._line(timeout), what, "node 1")
