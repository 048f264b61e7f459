/*
 * slotscope: NFS client WRITE / COMMIT / READ, from nfs tracepoints only
 * (header-independent). The issuing thread is current at initiate_*: the I/O goes
 * to its RPC's record (a row of its own only without the sunrpc group); the
 * completion runs in rpciod/nfsiod, so *_done rows say only what completed.
 */

BPF_RINGBUF_OUTPUT(nfs_ring, NFS_RING_PAGES);

/* Every record names its file: dev, fileid, offset; the callers add the rest. */
static __always_inline struct nfs_event *nfs_reserve(u32 kind, u32 dev, u64 fileid, s64 offset)
{
    struct nfs_event *e = nfs_ring.ringbuf_reserve(sizeof(struct nfs_event));
    if (!e) {
        count_loss(LOSS_NFS_RING_FULL);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    u64 id = bpf_get_current_pid_tgid();
    e->ts = bpf_ktime_get_ns();
    e->tid = id;
    e->tgid = id >> 32;
    e->kind = kind;
    e->dev = dev;
    e->fileid = fileid;
    e->offset = offset;
    return e;
}

/* BCC rewrites map calls, but not inside macros: submit through a function. */
static __always_inline void nfs_submit(struct nfs_event *e)
{
    nfs_ring.ringbuf_submit(e, wake_flags(NFS_RING_ID, NFS_RING_WAKE, 0));
}

/* The I/O this thread is about to start an RPC for (see common.h). A WRITE's entry is
 * there already where the nfs_owner group's kprobe left its owner: filled in place. */
static __always_inline void nfs_pending(u32 dev, u64 fileid, s64 offset, u32 count, u32 stable, int with_owner)
{
    u32 tid = bpf_get_current_pid_tgid();
#ifdef NFS_OWNER_GROUP
    struct pending_io *p = 0;
    if (with_owner)
        p = pending_find(tid);
    if (p) {
        p->fileid = fileid;
        p->offset = offset;
        p->count = count;
        p->stable = stable;
        p->dev = dev;
        return;
    }
#endif
    struct pending_io io = {.fileid = fileid, .offset = offset, .count = count, .stable = stable, .dev = dev};
    pending_put(tid, &io);
}

/* An I/O's start: left for its RPC's record (bpf/sunrpc.c rpc_begin takes it), and a row of its
 * own only where no RPC record is made (the sunrpc group not loaded): one ring event fewer a
 * WRITE, for a row the RPC's has whole (file, offset, count, stability, thread, time). */
static __always_inline int nfs_start(u32 kind, u32 dev, u64 fileid, s64 offset, u32 count, u32 stable,
                                     int with_owner)
{
    nfs_pending(dev, fileid, offset, count, stable, with_owner);
#ifndef SUNRPC_GROUP
    struct nfs_event *e = nfs_reserve(kind, dev, fileid, offset);
    if (!e)
        return 0;
    e->count = count;
    e->stable = stable;
    nfs_submit(e);
#endif
    return 0;
}

TRACEPOINT_PROBE(nfs, nfs_initiate_commit)
{ return nfs_start(NFS_COMMIT_START, args->dev, args->fileid, args->offset, args->count, 0, 0); }
#ifdef HAVE_nfs_initiate_read
TRACEPOINT_PROBE(nfs, nfs_initiate_read)
{ return nfs_start(NFS_READ_START, args->dev, args->fileid, args->offset, args->count, 0, 0); }
#endif
TRACEPOINT_PROBE(nfs, nfs_initiate_write)
{ return nfs_start(NFS_WRITE_START, args->dev, args->fileid, args->offset, args->count, args->stable, 1); }

TRACEPOINT_PROBE(nfs, nfs_writeback_done)
{
    struct nfs_event *e = nfs_reserve(NFS_WRITE_DONE, args->dev, args->fileid, args->offset);
    if (!e)
        return 0;
    e->count = args->arg_count;
    e->res_count = args->res_count;
    e->status = args->NFS_WRITEBACK_DONE_ERROR;  /* error, or status (probes.py field_variants) */
    e->stable = args->stable;
    __builtin_memcpy(&e->verifier, args->verifier, 8);
    nfs_submit(e);
    return 0;
}

TRACEPOINT_PROBE(nfs, nfs_commit_done)
{
    struct nfs_event *e = nfs_reserve(NFS_COMMIT_DONE, args->dev, args->fileid, args->offset);
    if (!e)
        return 0;
    e->status = args->NFS_COMMIT_DONE_ERROR;
    e->stable = args->stable;
    __builtin_memcpy(&e->verifier, args->verifier, 8);
    nfs_submit(e);
    return 0;
}

#ifdef HAVE_nfs_readpage_done
TRACEPOINT_PROBE(nfs, nfs_readpage_done)
{
    struct nfs_event *e = nfs_reserve(NFS_READ_DONE, args->dev, args->fileid, args->offset);
    if (!e)
        return 0;
    e->count = args->arg_count;
    e->res_count = args->res_count;
    e->status = args->NFS_READPAGE_DONE_ERROR;
    nfs_submit(e);
    return 0;
}
#endif

/*
 * Time a traced syscall spends in the NFS client's entry points, added to its
 * in-flight record (bpf/syscalls.c, loaded with this program): fsync, the flush of
 * close() (nfs_wb_all), getattr. Calls nest; the outermost one is timed.
 */
#ifdef SYSCALLS_GROUP
static __always_inline int nfs_call_enter(u16 call)
{
    struct inflight *in = inflight_find(bpf_get_current_pid_tgid());
    if (!in)
        return 0;
    if (in->nfs_depth++ == 0)
        in->nfs_since = bpf_ktime_get_ns();
    in->nfs_calls |= call;
    return 0;
}

static __always_inline int nfs_call_exit(void)
{
    struct inflight *in = inflight_find(bpf_get_current_pid_tgid());
    if (!in || in->nfs_depth == 0)
        return 0;
    if (--in->nfs_depth == 0)
        in->nfs_ns += bpf_ktime_get_ns() - in->nfs_since;
    return 0;
}

#ifdef HAVE_nfs_fsync_enter
TRACEPOINT_PROBE(nfs, nfs_fsync_enter) { return nfs_call_enter(NFS_CALL_FSYNC); }
TRACEPOINT_PROBE(nfs, nfs_fsync_exit) { return nfs_call_exit(); }
#endif
#ifdef HAVE_nfs_writeback_inode_enter
TRACEPOINT_PROBE(nfs, nfs_writeback_inode_enter) { return nfs_call_enter(NFS_CALL_FLUSH); }
TRACEPOINT_PROBE(nfs, nfs_writeback_inode_exit) { return nfs_call_exit(); }
#endif
#ifdef HAVE_nfs_getattr_enter
TRACEPOINT_PROBE(nfs, nfs_getattr_enter) { return nfs_call_enter(NFS_CALL_GETATTR); }
TRACEPOINT_PROBE(nfs, nfs_getattr_exit) { return nfs_call_exit(); }
#endif
#endif
