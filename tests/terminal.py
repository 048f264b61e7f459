"""A real terminal for tests: one tmux server of the test's own running a command, its screen
read with capture-pane. Used by the TUI's tests (unit tier) and the agent's (live tier)."""
from __future__ import annotations

import re
import shlex
import subprocess
import time
import uuid

WIDTH, HEIGHT = 120, 40


class Tmux:
    """One tmux server of our own (its own socket), one session running a command."""

    def __init__(self, tmp_path):
        self.socket = f"slotscope-test-{uuid.uuid4().hex[:8]}"
        self.session = "top"
        self.exit_file = tmp_path / "exit"

    def tmux(self, *args: str, check: bool = True) -> str:
        res = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30)
        if check and res.returncode:
            raise AssertionError(f"tmux {' '.join(args)}: {res.stderr}")
        return res.stdout

    def start(self, *command: str, size: tuple[int, int] = (WIDTH, HEIGHT)) -> None:
        line = " ".join(shlex.quote(c) for c in command)
        # COLUMNS/LINES from the test's environment would override the pane's size
        shell = f"unset COLUMNS LINES; {line}; echo EXIT=$? > {shlex.quote(str(self.exit_file))}; sleep 60"
        self.tmux("new-session", "-d", "-s", self.session, "-x", str(size[0]), "-y", str(size[1]), shell)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.session)

    def wait_for(self, *texts: str, rows: int | None = None, timeout: float = 60) -> str:
        """The screen once it shows every text (and, with `rows`, that many rows of the rank
        table: the first frame after a load can draw the findings before the ranks get their
        share of the lines)."""
        end = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < end:
            screen = self.screen()
            if all(t in screen for t in texts) and (rows is None or len(rank_rows(screen)) == rows):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"never showed {texts!r}" + (f" and {rows} rank rows" if rows else "")
                             + f"; the screen:\n{screen}")

    def keys(self, *keys: str) -> None:
        """Each key on its own, with a pause: an Escape followed at once by a key reads as Alt+key."""
        for k in keys:
            self.tmux("send-keys", "-t", self.session, k)
            time.sleep(0.25 if k == "Escape" else 0.05)

    def exit_status(self, timeout: float = 20) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.exit_file.exists() and self.exit_file.read_text().strip():
                return self.exit_file.read_text().strip()
            time.sleep(0.1)
        raise AssertionError(f"did not exit; the screen:\n{self.screen()}")

    def close(self) -> None:
        self.tmux("kill-server", check=False)



def rank_rows(screen: str) -> list[str]:
    """The rank table's rows: lines starting with a right-aligned rank and then host vm, or its
    pid and comm python (at 80 columns the host is left out)."""
    return [line.split()[0] for line in screen.splitlines()
            if re.match(r" *\d+ +(vm|\d+ +python) ", line)]
