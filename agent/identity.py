"""Who a process is: comm, command line, cgroup and its training rank.

Only whitelisted environment variables are kept, and command lines are
truncated and redacted. Reading /proc/PID/cmdline or environ takes the target's
mmap lock, which a process in D state (stuck on NFS) can hold for minutes, so
those reads run in worker threads with a timeout, never on the drain path.
"""
from __future__ import annotations

import queue
import re
import threading
import time
from dataclasses import dataclass

# The rank variables of torchrun/torchelastic, Slurm, Open MPI and PMI/PMIx (DESIGN.md).
RANK_VARS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "TORCHELASTIC_RUN_ID",
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_JOB_ID", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMIX_RANK",
)
# Where the global rank comes from, in order of preference.
GLOBAL_RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")

CMDLINE_MAX = 512
READ_TIMEOUT = 2.0
REDACTED = "***"

# A secret word ends its name part: --hf-token, API_TOKEN, --pass, --pw, --key; not --tokenizer,
# --max-tokens, --num-passes, --author, --monkey.
_SECRET_WORD = (r"(?:pass(?:word|wd|phrase)?(?![a-z])|secret|token(?![a-z])|api[-_]?key|access[-_]?key|"
                r"private[-_]?key|credentials?|auth(?![a-z])|(?<![a-z])pw(?![a-z])|(?<![a-z])key(?![a-z]))")
_SECRET_FLAG = re.compile(rf"^(--?[\w.-]*{_SECRET_WORD}[\w.-]*)(=.*)?$", re.I)
_SECRET_ASSIGN = re.compile(rf"^([\w.]*{_SECRET_WORD}[\w.]*)([=:]).+$", re.I)   # TOKEN=x, password:x
_ATTACHED_PASSWORD = re.compile(r"^-p\S+$")                                       # mysql -phunter2
_USER_FLAGS = ("-u", "--user")                                                     # curl -u user:password
_URL_CREDS = re.compile(r"(\w+://)[^/\s:@]+:[^/\s@]+@")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[\w.~+/=-]+")
_KNOWN_TOKENS = re.compile(r"\b(AKIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{20,}|hf_[A-Za-z0-9]{20,}|"
                           r"xox[abposr]-[A-Za-z0-9-]{10,}|sk-[A-Za-z0-9_-]{20,})\b")
_JSON_SECRET = re.compile(rf'("[\w.-]*{_SECRET_WORD}[\w.-]*"\s*:\s*)"(?:\\.|[^"\\])*"', re.I)
_QUOTED = re.compile(r"'([^']*)'" + r'|"((?:\\.|[^"\\])*)"')
# A shell string (sh -c '...', one argument with several words): its words, quoted parts included.
_SHELL_WORD = re.compile(r"""(?:'[^']*'|"(?:\\.|[^"\\])*"|[^\s;&|()<>'"])+""")


def redact_argv(argv: list[str]) -> list[str]:
    """Hide obvious secrets: values of secret-looking flags and assignments (also inside shell
    strings), URL credentials, bearer tokens, JSON secret fields and well-known token formats."""
    return _redact_words([_redact_text(arg) for arg in argv])


def _redact_text(text: str) -> str:
    """The secrets recognised anywhere in a string, whatever its words."""
    text = _URL_CREDS.sub(rf"\1{REDACTED}@", text)
    text = _BEARER.sub(rf"\1{REDACTED}", text)
    text = _JSON_SECRET.sub(rf'\1"{REDACTED}"', text)
    return _KNOWN_TOKENS.sub(REDACTED, text)


def _redact_words(words: list[str]) -> list[str]:
    """The word rules over a sequence of words: a secret flag hides the next word."""
    out, hide_next, user_next = [], False, False
    for word in words:
        if len(_SHELL_WORD.findall(word)) > 1:      # a shell string: its own words
            out.append(_redact_shell(word))
            hide_next = user_next = False
            continue
        plain = _unquote(word)
        if hide_next:
            out.append(REDACTED)
        elif user_next and ":" in plain:
            out.append(f"{plain.split(':', 1)[0]}:{REDACTED}")
        elif m := _SECRET_FLAG.match(plain):
            out.append(plain if m.group(2) is None else f"{m.group(1)}={REDACTED}")
        elif m := _SECRET_ASSIGN.match(plain):
            out.append(f"{m.group(1)}{m.group(2)}{REDACTED}")
        elif _ATTACHED_PASSWORD.match(plain):
            out.append(f"-p{REDACTED}")
        else:
            out.append(word)
        hide_next = bool(not hide_next and (m := _SECRET_FLAG.match(plain)) and m.group(2) is None)
        user_next = plain in _USER_FLAGS
    return out


def _redact_shell(text: str) -> str:
    words = list(_SHELL_WORD.finditer(text))
    redacted = _redact_words([m.group() for m in words])
    parts, pos = [], 0
    for m, word in zip(words, redacted):
        parts += [text[pos:m.start()], word]
        pos = m.end()
    return "".join(parts) + text[pos:]


def _unquote(word: str) -> str:
    return _QUOTED.sub(lambda m: m.group(1) or m.group(2) or "", word)


def format_cmdline(raw: bytes) -> str:
    argv = [a.decode("utf-8", "replace") for a in raw.rstrip(b"\0").split(b"\0")] if raw else []
    text = " ".join(redact_argv(argv))
    return text if len(text) <= CMDLINE_MAX else text[:CMDLINE_MAX - 3] + "..."


def rank_env(environ: bytes) -> dict[str, str]:
    """Only the whitelisted variables of a raw /proc/PID/environ."""
    wanted = {}
    for entry in environ.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name.decode("ascii", "replace") in RANK_VARS:
            wanted[name.decode()] = value.decode("utf-8", "replace")[:128]
    return wanted


def _first_int(env: dict[str, str], names: tuple[str, ...]) -> int | None:
    for name in names:
        v = env.get(name, "").strip()
        if v.lstrip("-").isdigit():
            return int(v)
    return None


@dataclass
class Identity:
    tgid: int
    ppid: int | None
    comm: str
    cmdline: str
    cgroup: str
    env: dict[str, str]
    first_seen: int                  # CLOCK_MONOTONIC ns
    rank_source: str = "none"        # env | inherited | none
    inherited_from: int | None = None
    complete: bool = True            # False when a /proc read timed out or the process was gone

    @property
    def rank(self) -> int | None:
        return _first_int(self.env, GLOBAL_RANK_VARS)

    @property
    def local_rank(self) -> int | None:
        return _first_int(self.env, LOCAL_RANK_VARS)

    @property
    def world_size(self) -> int | None:
        return _first_int(self.env, ("WORLD_SIZE",))


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def read_identity(tgid: int, now_ns: int) -> Identity:
    """Everything about a process from /proc. Slow or blocking reads belong in a worker."""
    status = {}
    try:
        for line in _read(f"/proc/{tgid}/status").decode(errors="replace").splitlines():
            k, _, v = line.partition(":")
            status[k] = v.strip()
    except OSError:
        return Identity(tgid, None, "", "", "", {}, now_ns, complete=False)
    ident = Identity(tgid, int(status.get("PPid", 0)) or None, status.get("Name", ""), "", "", {}, now_ns)
    # Each read on its own: a kernel without cgroups mounted gives an empty cgroup file.
    try:
        lines = _read(f"/proc/{tgid}/cgroup").decode(errors="replace").strip().splitlines()
        ident.cgroup = lines[-1] if lines else ""
    except OSError:
        ident.complete = False
    try:
        ident.cmdline = format_cmdline(_read(f"/proc/{tgid}/cmdline"))
        ident.env = rank_env(_read(f"/proc/{tgid}/environ"))
    except OSError:
        ident.complete = False
    if ident.env:
        ident.rank_source = "env"
    return ident


def _exited(tgid: int) -> bool:
    """Gone, or a zombie (whose command line reads empty for good)."""
    try:
        return _read(f"/proc/{tgid}/stat").rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


MID_EXEC_TRIES = 10       # reads of a process that looks mid-exec, MID_EXEC_WAIT s apart
MID_EXEC_WAIT = 0.05


def read_settled(tgid: int, now_ns: int) -> Identity:
    """read_identity, again a few times while the process looks mid-exec: an execve names the
    process (comm) before the new program's arguments and environment are laid out, and reads of
    them in between give nothing. Under emulation that window is long enough for a look at /proc
    to land in it (in the VM rig, one rank of four, started through setpriv, went unnamed)."""
    for _ in range(MID_EXEC_TRIES):
        ident = read_identity(tgid, now_ns)
        if ident.cmdline or ident.ppid in (None, 2) or tgid == 2 or _exited(tgid):    # whole, a kernel thread, gone
            return ident
        time.sleep(MID_EXEC_WAIT)
    return ident


@dataclass
class _Job:
    tgid: int
    now_ns: int
    result: Identity | None = None


class IdentityReader:
    """Reads identities in worker threads. A worker stuck on a D-state process is
    abandoned (it is a daemon thread) and replaced, up to MAX_STUCK of them."""

    WORKERS = 2
    MAX_STUCK = 16

    def __init__(self):
        self._jobs: queue.Queue[_Job] = queue.Queue()
        self.results: queue.Queue[Identity] = queue.Queue()
        self._pending: dict[int, _Job] = {}
        self._started: dict[int, float] = {}
        self._abandoned: dict[int, float] = {}   # given up on by the watchdog, maybe only slow
        self.stuck = 0
        self._lock = threading.Lock()
        for _ in range(self.WORKERS):
            self._spawn()

    def _spawn(self) -> None:
        threading.Thread(target=self._work, daemon=True, name="slotscope-identity").start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                self._started[job.tgid] = time.monotonic()
            job.result = read_settled(job.tgid, job.now_ns)
            with self._lock:
                self._started.pop(job.tgid, None)
                self._abandoned.pop(job.tgid, None)
                self._pending.pop(job.tgid, None)
            self.results.put(job.result)

    def request(self, tgid: int, now_ns: int) -> None:
        # No de-duplication here: after an exec the same tgid must be read again even
        # while a read from before the exec is still in flight (Identities drops that one).
        with self._lock:
            job = self._pending[tgid] = _Job(tgid, now_ns)
        self._jobs.put(job)

    def watchdog(self, now_ns: int) -> None:
        """Give up on reads that hang: report the process as unreadable, replace the worker."""
        now = time.monotonic()
        with self._lock:
            hung = [t for t, since in self._started.items() if now - since > READ_TIMEOUT]
            for tgid in hung:
                self._abandoned[tgid] = self._started.pop(tgid)
                self._pending.pop(tgid, None)
        for tgid in hung:
            self.results.put(Identity(tgid, None, "", "", "", {}, now_ns, complete=False))
            if self.stuck < self.MAX_STUCK:
                self.stuck += 1
                self._spawn()

    def in_flight(self) -> bool:
        """Reads queued or running, including ones the watchdog gave up on (they may still finish)."""
        with self._lock:
            return bool(self._started or self._abandoned) or not self._jobs.empty()

    def stop(self) -> None:
        for _ in range(self.WORKERS + self.stuck):
            self._jobs.put(None)


class Identities:
    """Identity of every process that shows up, with rank inheritance: a process
    without rank variables takes its nearest ancestor's (threads need nothing:
    they are their process).

    observe() reads a process early (at exec, while it surely lives: short-lived
    writers are gone by the time their rows are decoded); want() marks it for the
    `procs` table. collect() returns the wanted identities that are settled. exited() lets
    go of a process once nothing can need it (see _release): every process the machine ran
    was kept for the whole recording."""

    def __init__(self, reader: IdentityReader | None = None):
        self.reader = reader or IdentityReader()
        self.known: dict[int, Identity] = {}
        self.parent: dict[int, int] = {}     # from fork events, which outlive /proc
        self._pending: set[int] = set()
        self._wanted: set[int] = set()
        self._emitted: set[int] = set()
        self._exec_ts: dict[int, int] = {}   # tgid -> its last exec: reads requested before are stale
        self._exec_env: dict[int, dict[str, str]] = {}   # tgid -> rank variables read at its exec
        self._children: dict[int, int] = {}  # tgid -> its children in `parent`
        self._exited: set[int] = set()       # gone, and kept until released

    def note_fork(self, parent: int, child: int) -> None:
        self.parent[child] = parent
        self._children[parent] = self._children.get(parent, 0) + 1

    def exited(self, tgid: int) -> None:
        """The process is gone and none of its rows is still to come."""
        self._exited.add(tgid)
        self._release(tgid)

    def _release(self, tgid: int) -> None:
        """Forget a process that exited once nothing can need it: no read of it in flight, no
        row of it still to write, no child left that may inherit its rank variables (a child
        holds its ancestors); then its parent, if that exited before it, may go too."""
        while (tgid in self._exited and not self._children.get(tgid) and tgid not in self._pending
               and (tgid not in self._wanted or tgid in self._emitted)):
            for kept in (self._exited, self._wanted, self._emitted):
                kept.discard(tgid)
            for kept in (self.known, self._exec_ts, self._exec_env, self._children):
                kept.pop(tgid, None)
            parent = self.parent.pop(tgid, None)
            if parent is None:
                return
            self._children[parent] -= 1
            tgid = parent

    def observe(self, tgid: int, now_ns: int) -> None:
        if tgid not in self.known and tgid not in self._pending:
            self._pending.add(tgid)
            self.reader.request(tgid, now_ns)

    def want(self, tgid: int, now_ns: int) -> None:
        if tgid not in self._wanted:
            self._wanted.add(tgid)
            self.observe(tgid, now_ns)

    def exec_(self, tgid: int, now_ns: int, env: dict[str, str] | None = None) -> None:
        """After exec the command line and maybe the environment changed: read it again. `env`:
        the rank variables the kernel read at the execve, for a process gone before /proc is."""
        if env:
            self._exec_env[tgid] = env
        else:
            self._exec_env.pop(tgid, None)
        self.known.pop(tgid, None)
        self._emitted.discard(tgid)
        self._pending.discard(tgid)
        self._exec_ts[tgid] = now_ns
        self.observe(tgid, now_ns)

    def busy(self) -> bool:
        return bool(self._pending) or self.reader.in_flight()

    def collect(self, now_ns: int) -> list[Identity]:
        self.reader.watchdog(now_ns)
        while True:
            try:
                ident = self.reader.results.get_nowait()
            except queue.Empty:
                break
            if ident.first_seen < self._exec_ts.get(ident.tgid, ident.first_seen):
                continue  # read before the process exec'd: its old command line and environment
            self._pending.discard(ident.tgid)
            stale = self.known.get(ident.tgid)
            if ident.complete and stale is not None and not stale.complete:
                # The watchdog gave up on this read (a busy machine, not a D state), then it
                # finished: the better identity replaces the row written meanwhile.
                self._emitted.discard(ident.tgid)
            if not ident.env and self._exec_env.get(ident.tgid):
                ident.env, ident.rank_source = dict(self._exec_env[ident.tgid]), "env"
            if ident.ppid is None:
                ident.ppid = self.parent.get(ident.tgid)
            parent = self.known.get(ident.ppid or 0)
            if not ident.complete and parent is not None and ident.tgid in self.parent:
                # Gone before we could read it: a fork without exec is its parent's copy.
                ident.comm = ident.comm or parent.comm
                ident.cmdline = ident.cmdline or parent.cmdline
                ident.cgroup = ident.cgroup or parent.cgroup
            self.known[ident.tgid] = ident
        ready = []
        for tgid in sorted(self._wanted - self._emitted):
            ident = self.known.get(tgid)
            if ident is None or (not ident.env and not self._inherit(ident, now_ns)):
                continue  # still being read, or an ancestor is
            self._emitted.add(tgid)
            ready.append(ident)
        for tgid in list(self._exited):     # what a read or a row kept
            self._release(tgid)
        return ready

    def _inherit(self, ident: Identity, now_ns: int) -> bool:
        """Take the nearest ancestor's rank variables. True when settled (inherited,
        or no ancestor has any); False while an ancestor is still being read."""
        seen = set()
        pid = ident.ppid or self.parent.get(ident.tgid)
        while pid and pid > 1 and pid not in seen:
            seen.add(pid)
            anc = self.known.get(pid)
            if anc is None:
                self.observe(pid, now_ns)
                return False
            if anc.env:
                ident.env = dict(anc.env)
                ident.rank_source = "inherited"
                ident.inherited_from = anc.tgid
                return True
            pid = anc.ppid or self.parent.get(pid)
        return True
