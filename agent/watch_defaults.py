"""`slotscope watch`'s defaults, declared once: here, light enough for the CLI to import for
its options and --help (the agent itself imports numpy, pyarrow and BCC)."""
KEEP_S = 120.0              # --keep
KEEP_BYTES = 32 << 20       # --keep-size: bytes held, compressed (see README: watch)
AFTER_S = 10.0              # --after: seconds of rows after the trigger
MAX_DISK = 1 << 30          # --max-disk
PROCESS_CAP = 100           # --per-process's series
