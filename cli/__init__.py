"""The front door: every `slotscope` subcommand (main.py), `demo` and its bundled workload,
and `record --tui` (the recorder in a child process, the TUI in front)."""
