"""The capture format's one home: what the agent writes and everything else reads.

format (version, segment names, schema tags), events (the kernel events' fields as
plain data), syscalls (the traced syscalls and their groups), tables (the registry:
name -> major version -> schema), meta (meta.json), writer, reader (finished and
growing captures), kmsg (which kernel log lines the kmsg table holds).
Imports no other slotscope package.
"""
