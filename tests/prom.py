"""Debian's Prometheus server as the tests of watch's metrics run it: scraping targets every
SCRAPE_S into a TSDB (tests/live/test_watch.py on this machine; the VM rig on the host, its
target a watching guest's forwarded port: tests/vm/vmrig/scenario.py), or serving a stored TSDB
alone, and PromQL asked at a given time (the HTTP API's `time=`)."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

PROMETHEUS = shutil.which("prometheus")
SCRAPE_S = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(tsdb: Path, targets=(), log=subprocess.DEVNULL) -> tuple[subprocess.Popen, int]:
    """Prometheus keeping its TSDB in `tsdb`, scraping `targets` (ADDR:PORT) every SCRAPE_S (its
    config beside it, `tsdb`.yml); without targets it serves what the TSDB holds. -> (the
    process, its HTTP port on 127.0.0.1)."""
    config, web = Path(f"{tsdb}.yml"), free_port()
    config.write_text(f"global:\n  scrape_interval: {SCRAPE_S}s\n  evaluation_interval: {SCRAPE_S}s\n"
                      f"scrape_configs:\n  - job_name: slotscope\n    static_configs:\n"
                      f"      - targets: {sorted(targets)}\n")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
                             f"--web.listen-address=127.0.0.1:{web}"],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    return proc, web


def wait_ready(proc: subprocess.Popen, port: int, timeout: float = 60.0) -> None:
    """Until its /-/ready answers (a stored TSDB's write-ahead log replayed)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"prometheus not ready within {timeout:g} s")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def query(port: int, expr: str, at: float) -> list:
    """An instant query evaluated at `at` (UTC s) -> its result list."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            answer = json.load(r)
    except urllib.error.HTTPError as exc:       # a query it refuses: its body says why
        answer = json.load(exc)
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


def values(result: list) -> dict[str, float]:
    """An instant vector as {its series' labels: value}."""
    return {",".join(f"{k}={v}" for k, v in sorted(r["metric"].items())): float(r["value"][1]) for r in result}
