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

/* struct file -> the last writer seen through it, direct-mapped by the file's address (an array
 * lookup the verifier inlines, where the LRU hash it replaces cost ~150 instructions a write()).
 * A file that shares its index with another one written meanwhile makes its event again, as one
 * whose writer changed; `check` ties an entry together, so that one written by two CPUs at once
 * matches neither. */
struct writer_seen {
    u64 file;
    u64 files;
    u64 check;
    u32 tgid;
};
#define WRITERS_SEEN 8192
BPF_ARRAY(writer_seen, struct writer_seen, WRITERS_SEEN);
BPF_RINGBUF_OUTPUT(owner_ring, OWNER_RING_PAGES);

static __always_inline u64 writer_check(u64 file, u64 files, u32 tgid)
{
    return file ^ (files * 0x9e3779b97f4a7c15ULL) ^ tgid;
}

int kprobe__nfs_file_write(struct pt_regs *ctx, void *iocb)
{
    u64 id = bpf_get_current_pid_tgid();
    void *task = (void *)bpf_get_current_task();
    u32 tgid = id >> 32;
    u64 file, files;
    KREAD(files, task, TASK_STRUCT_FILES);
    KREAD(file, iocb, KIOCB_KI_FILP);
    u32 i = (u32)(file >> 6) * 2654435761u % WRITERS_SEEN;
    struct writer_seen *seen = writer_seen.lookup(&i);
    if (!seen)
        return 0;
    struct writer_seen k = *seen;
    u64 check = writer_check(file, files, tgid);
    if (k.file == file && k.files == files && k.tgid == tgid && k.check == check)
        return 0;
    seen->file = file;
    seen->files = files;
    seen->tgid = tgid;
    seen->check = check;
    struct owner_event *e = owner_ring.ringbuf_reserve(sizeof(struct owner_event));
    if (!e) {
        count_loss(LOSS_OWNER_RING_FULL);
        return 0;
    }
    e->ts = bpf_ktime_get_ns();
    e->files = files;
    e->file = file;
    e->tid = id;
    e->tgid = tgid;
    owner_ring.ringbuf_submit(e, wake_flags(OWNER_RING_ID, OWNER_RING_WAKE, 0));
    return 0;
}

int kprobe__nfs_initiate_write(struct pt_regs *ctx, void *hdr)
{
    struct pending_io p = {};   /* the nfs group's tracepoint, which follows, adds the I/O */
    void *l, *c;
    KREAD2(l, NFS_PGIO_HEADER_ARGS_LOCK_CONTEXT, c, NFS_PGIO_HEADER_ARGS_CONTEXT, hdr);
    if (c && (u64)l == (u64)c + NFS_OPEN_CONTEXT_LOCK_CONTEXT_OFF) {
        /* the open's own lock context (its opener's files write: nfs_get_lock_context), which
         * lies in the open context beside flock_owner: one read for both */
        KREAD2(p.lock_owner, NFS_OPEN_CONTEXT_LOCK_CONTEXT_LOCKOWNER, p.open_file, NFS_OPEN_CONTEXT_FLOCK_OWNER, c);
    } else {
        if (l)
            KREAD(p.lock_owner, l, NFS_LOCK_CONTEXT_LOCKOWNER);
        if (c)
            KREAD(p.open_file, c, NFS_OPEN_CONTEXT_FLOCK_OWNER);
    }
    u32 tid = bpf_get_current_pid_tgid();
    pending_put(tid, &p);
    return 0;
}
