"""Scrapes a watching agent's metrics endpoint every INTERVAL s, as a fleet's Prometheus would
(the overhead bench's watch, whose metrics the host does not scrape): prints "ok" per scrape, or
what went wrong; ends at SIGTERM."""
import signal
import sys
import time
import urllib.request

signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
url, every = sys.argv[1], float(sys.argv[2])
while True:
    try:
        with urllib.request.urlopen(url, timeout=every) as r:
            r.read()
        print("ok", flush=True)
    except OSError as e:
        print(f"failed: {e}", flush=True)
    time.sleep(every)
