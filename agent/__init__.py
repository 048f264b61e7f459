"""The recording agent: loads BPF programs, drains them, writes captures. The only layer that imports bcc."""
