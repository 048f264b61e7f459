/*
 * slotscope: who dirtied the pages that background writeback sends (kprobes).
 *
 * A WRITE run by a flusher kworker names the kworker as its owner. Its pages
 * remember their writer: each page request holds the lock context and open
 * context it was dirtied under, and the RPC's header carries its first
 * request's (hdr->args.lock_context, hdr->args.context). A lock context's
 * lockowner is the writer's current->files; an open context's flock_owner is
 * the struct file of the open.
 *
 * nfs_file_write: which process writes through which struct file with which
 * files_struct, one owner_event per change (the user-space side joins the
 * pointers back to processes by time: pointers are reused after an exit).
 * nfs_initiate_write: the WRITE's lock owner and open file, left by thread for
 * rpc_task_begin (bpf/sunrpc.c), which follows in the same thread (common.h pending_io).
 *
 * These read struct members at this kernel's offsets (bpf/members.h).
 */

struct writer_seen {
    u64 files;
    u32 tgid;
};

/* struct file -> the last writer seen through it (LRU: closed files age out). */
BPF_TABLE("lru_hash", u64, struct writer_seen, writer_seen, 65536);
BPF_RINGBUF_OUTPUT(owner_ring, OWNER_RING_PAGES);

int kprobe__nfs_file_write(struct pt_regs *ctx, void *iocb)
{
    u64 id = bpf_get_current_pid_tgid();
    void *task = (void *)bpf_get_current_task();
    struct writer_seen now = {.tgid = id >> 32};
    u64 file;
    KREAD(now.files, task, TASK_STRUCT_FILES);
    KREAD(file, iocb, KIOCB_KI_FILP);
    struct writer_seen *seen = writer_seen.lookup(&file);
    if (seen && seen->files == now.files && seen->tgid == now.tgid)
        return 0;
    writer_seen.update(&file, &now);
    struct owner_event *e = owner_ring.ringbuf_reserve(sizeof(struct owner_event));
    if (!e) {
        count_loss(LOSS_OWNER_RING_FULL);
        return 0;
    }
    e->ts = bpf_ktime_get_ns();
    e->files = now.files;
    e->file = file;
    e->tid = id;
    e->tgid = id >> 32;
    owner_ring.ringbuf_submit(e, wake_flags(OWNER_RING_ID, OWNER_RING_WAKE, 0));
    return 0;
}

int kprobe__nfs_initiate_write(struct pt_regs *ctx, void *hdr)
{
    struct pending_io p = {};   /* the nfs group's tracepoint, which follows, adds the I/O */
    void *l, *c;
    KREAD2(l, NFS_PGIO_HEADER_ARGS_LOCK_CONTEXT, c, NFS_PGIO_HEADER_ARGS_CONTEXT, hdr);
    if (l)
        KREAD(p.lock_owner, l, NFS_LOCK_CONTEXT_LOCKOWNER);
    if (c)
        KREAD(p.open_file, c, NFS_OPEN_CONTEXT_FLOCK_OWNER);
    u32 tid = bpf_get_current_pid_tgid();
    pending_put(tid, &p);
    return 0;
}
