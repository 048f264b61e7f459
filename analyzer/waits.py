"""What a sampled thread was waiting for, from its state and /proc/PID/wchan: the vocabulary
of sampled captures (record --no-bpf), shared by the findings (sampled.py) and the activity
of each process (sampled_activity.py)."""
from __future__ import annotations

# /proc/PID/wchan -> what the thread waits for. The names differ between kernels: page waits
# are wait_on_page_bit_common (5.10) and folio_wait_bit_common (5.16 and later, 6.1, 6.12);
# rpc_wait_bit_killable and nfs_wait_bit_killable are the same name in all of them.
WAITS: dict[str, str] = {
    # a synchronous RPC (__rpc_execute): for a slot, to transmit, for the server's reply
    "rpc_wait_bit_killable": "rpc",
    # an NFS bit: a request or page group locked, a COMMIT in progress (NFS_INO_COMMIT), state recovery
    "nfs_wait_bit_killable": "nfs", "nfs_wait_bit_uninterruptible": "nfs",
    "nfs_commit_inode": "nfs", "__nfs_commit_inode": "nfs", "wait_on_commit": "nfs",
    # a page (folio) under writeback: fsync/close waiting for its WRITEs, or for a locked page
    "folio_wait_bit_common": "writeback", "folio_wait_bit": "writeback", "folio_wait_writeback": "writeback",
    "wait_on_page_bit_common": "writeback", "wait_on_page_bit": "writeback",
    "wait_on_page_writeback": "writeback", "__folio_lock": "writeback", "__lock_page": "writeback",
    # NFS's own write congestion (nfs_writepages waits for write_congestion_wait)
    "nfs_writepages": "writeback", "nfs_writepages_callback": "writeback", "nfs_do_writepage": "writeback",
    "balance_dirty_pages": "dirty_throttle",
    "pipe_write": "pipe", "pipe_read": "pipe", "unix_stream_read_generic": "socket",
    "futex_wait_queue": "futex", "futex_wait_queue_me": "futex", "futex_wait": "futex",
    "do_epoll_wait": "poll", "ep_poll": "poll", "do_select": "poll", "do_sys_poll": "poll",
    "poll_schedule_timeout": "poll", "hrtimer_nanosleep": "sleep", "do_nanosleep": "sleep",
    "__mutex_lock": "lock", "mutex_lock": "lock", "rwsem_down_write_slowpath": "lock",
    "rwsem_down_read_slowpath": "lock",
}
WAIT_MEANS = {
    "rpc": "an RPC to the server (a slot, the wire, the reply)", "nfs": "an NFS request or COMMIT in progress",
    "writeback": "pages being written back", "dirty_throttle": "throttled for dirtying pages too fast",
    "pipe": "a pipe", "socket": "a socket", "futex": "another thread (futex)", "poll": "poll/epoll",
    "sleep": "a sleep", "lock": "a kernel lock", "running": "running",
    "blocked": "uninterruptible sleep (D) where the kernel gave no wchan", "other": "elsewhere in the kernel",
}
NFS_WAITS = ("rpc", "nfs", "writeback", "dirty_throttle", "blocked")


def wait_kind(state: str | None, wchan: str | None) -> str:
    if state == "R":
        return "running"
    if wchan in (None, "", "0"):      # some kernels give no wchan: D state is still a block in the kernel
        return "blocked" if state == "D" else "other"
    return WAITS.get(wchan, "other")
