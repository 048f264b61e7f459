/*
 * slotscope: file syscalls, per thread, on syscalls:* tracepoints.
 *
 * Header-independent on purpose: it reads only tracepoint arguments (whose
 * layout BCC takes from tracefs) and user memory with stable ABI layouts
 * (struct iovec, struct open_how). It never walks kernel structs, so it is
 * correct even when the kernel headers do not match the running kernel.
 *
 * The agent prepends: the generated header (structs, SYSOP_* numbers, counters),
 * common.h, and -D options: AGENT_TGID, FILTER_TGIDS, FILTER_CGROUP, FILTER_DEVS, FILTER_PATHS
 * and PATH_RELATED, HAVE_<syscall>, *_RING_PAGES.
 *
 * Which fd is worth an event is decided in user space, which knows paths and
 * mounts. The kernel only skips fds user space has marked uninteresting in
 * fd_ignore, and (FILTER_DEVS) successful stats whose result names a device
 * that holds no traced file: a job's start (Python importing torch) stats tens of
 * thousands of paths, whose strings would flood the path ring. To make that race-free, every (tgid, fd) gets a new generation
 * (the exit timestamp) when an open/dup creates it or a close ends it; a mark
 * applies only while it names the current generation, so an fd reused for an
 * NFS file is never skipped because of its previous file.
 *
 * With --path (FILTER_PATHS), a path-taking call whose paths are plainly outside every
 * prefix is dropped here, and an fd it opens is skipped from then on: on a busy host every
 * process's opens and stats would otherwise fill the path ring, to be thrown away in user
 * space (PATH_RELATED, agent/probes.py path_filter_flags). So is a call whose relative path
 * starts from a directory fd whose open was dropped so (fd_unrelated): a tree's removal
 * (rm -rf, Python's rmtree) unlinks every file by name relative to its directory's fd.
 */

typedef int rwf_t;  /* pwritev2's format names it; the headers BCC uses lack it */

#define AT_FDCWD_VAL -100
#define F_DUPFD_VAL 0
#define F_DUPFD_CLOEXEC_VAL 1030
#define IOV_SUM_MAX 8

/* struct inflight (agent/layouts.py INFLIGHT): a syscall between enter and exit, per thread,
 * direct-mapped (common.h) by thread id: made, found and dropped once a call each, and found
 * again by the nfs group's NFS calls inside it (bpf/nfs.c). Where another thread's call held the
 * index, in the hash. The agent reads both every second (who is blocked: agent/probes.py). */
#define INFLIGHT_SLOTS 1024
struct inflight_slot {
    struct inflight call;
    struct thread_hold head;
};
BPF_ARRAY(inflight_slots, struct inflight_slot, INFLIGHT_SLOTS);
BPF_HASH(inflight, u32, struct inflight, 16384);
BPF_TABLE("lru_hash", u64, u64, fd_gen, 131072);
BPF_TABLE("lru_hash", u64, u64, fd_ignore, 131072);
BPF_HASH(traced_tgids, u32, u8, 65536);
BPF_HASH(traced_devs, u64, u8, 1024);       /* FILTER_DEVS: st_dev of every traced filesystem */
BPF_CGROUP_ARRAY(cgroup_filter, 1);
BPF_RINGBUF_OUTPUT(sys_ring, SYS_RING_PAGES);
BPF_RINGBUF_OUTPUT(path_ring, PATH_RING_PAGES);
BPF_RINGBUF_OUTPUT(proc_ring, PROC_RING_PAGES);
BPF_RINGBUF_OUTPUT(env_ring, ENV_RING_PAGES);
struct env_name { char name[ENV_NAME_MAX]; };
BPF_HASH(rank_vars, struct env_name, u8, 64);      /* the agent fills it: identity.RANK_VARS */

static __always_inline int wanted(u64 pid_tgid)
{
    u32 tgid = pid_tgid >> 32;
    if (tgid == AGENT_TGID)
        return 0;
#ifdef FILTER_TGIDS
    if (!traced_tgids.lookup(&tgid))
        return 0;
#endif
#ifdef FILTER_CGROUP
    if (cgroup_filter.check_current_task(0) != 1)
        return 0;
#endif
    return 1;
}

static __always_inline struct inflight_slot *inflight_slot(u32 tid)
{
    u32 i = tid % INFLIGHT_SLOTS;
    return inflight_slots.lookup(&i);
}

/* The thread's call in flight, or 0. */
static __always_inline struct inflight *inflight_find(u32 tid)
{
    struct inflight_slot *s = inflight_slot(tid);
    return s && held_by(&s->head, tid) ? &s->call : inflight.lookup(&tid);
}

/* `in` as the thread's call in flight, in place of any it had. -> 0, or the hash's error. */
static __always_inline int inflight_put(u32 tid, struct inflight *in)
{
    struct inflight_slot *s = inflight_slot(tid);
    if (!s || !hold_for(&s->head, tid))
        return inflight.update(&tid, in);
    s->call = *in;
    s->head.hold.live = 1;
    return 0;
}

static __always_inline void inflight_done(u32 tid)
{
    struct inflight_slot *s = inflight_slot(tid);
    if (s && held_by(&s->head, tid))
        slot_give_back(&s->head.hold);
    else
        inflight.delete(&tid);
}

static __always_inline u64 fd_key(u32 tgid, s32 fd)
{
    return ((u64)tgid << 32) | (u32)fd;
}

/* Whether `mark`, a table's entry for the fd at `key`, names the generation the fd has now. */
static __always_inline int marks_now(u64 *mark, u64 key)
{
    if (!mark)
        return 0;
    u64 *gen = fd_gen.lookup(&key);
    return gen && *gen == *mark;
}

static __always_inline int ignored(u32 tgid, s32 fd)
{
    u64 key = fd_key(tgid, fd);
    return marks_now(fd_ignore.lookup(&key), key);
}

#ifdef AGGREGATE
/* ---- watch's aggregates (agent/aggregates.py sweeps them once a drain) ----
 * The calls on an fd that make rows (AGG_FD_OP: writes, close, fsyncs, ftruncate), timed in
 * the metrics' buckets (AGG_BUCKET), with the bytes written. Which fd is a traced file user
 * space decides: a call on an fd it has marked (agg_fds: the fd's generation as fd_gen holds
 * it, 0 for an fd from before, and its device) is added to its (syscall, device), to its
 * process and to the longest call of the interval; a call on any other fd (an ignored fd's
 * calls never get here) waits in agg_pending, per (fd, generation, syscall), until the sweep
 * has decided that fd, folded the entry and marked the fd. Calls that name a path (open,
 * stat, rename...) are not aggregated: only their rows tell whether the path is traced. */
struct agg_fd {
    u64 gen;
    u64 dev;
};
struct agg_calls {
    u64 count[AGG_NBUCKETS];
    u64 sum_ns;
    u64 written;
    s64 longest_ns;         /* agg_pending: its longest call, for the blocked_s trigger */
    s64 longest_enter;
    u32 longest_tid;
    u32 _pad;
};
struct agg_call_key {
    u64 dev;
    u32 op;
    u32 _pad;
};
struct agg_pending_key {
    u64 gen;
    u32 tgid;
    s32 fd;
    u32 op;
    u32 _pad;
};
struct agg_process {
    u64 written;
    u64 blocked_ns;         /* in traced calls */
};
struct agg_longest {
    s64 latency_ns;
    s64 ts_enter;
    u64 gen;                /* its fd's (the sweep names its file) */
    u32 tid;
    u32 tgid;
    s32 fd;
    u32 op;
};
BPF_TABLE("lru_hash", u64, struct agg_fd, agg_fds, 131072);
BPF_HASH(agg_calls, struct agg_call_key, struct agg_calls, 1024);
BPF_TABLE("lru_hash", struct agg_pending_key, struct agg_calls, agg_pending, 16384);
BPF_TABLE("lru_hash", u32, struct agg_process, agg_processes, 16384);
BPF_PERCPU_ARRAY(agg_longest, struct agg_longest, 1);     /* read and reset by every sweep */
BPF_PERCPU_ARRAY(agg_calls_blank, struct agg_calls, 1);   /* a new entry's zeros */

static __always_inline void agg_add(struct agg_calls *a, u64 ns, u64 written)
{
    u32 i = AGG_BUCKET(ns);
    if (i < AGG_NBUCKETS)
        __sync_fetch_and_add(&a->count[i], 1);
    __sync_fetch_and_add(&a->sum_ns, ns);
    if (written)
        __sync_fetch_and_add(&a->written, written);
}

static __always_inline void agg_marked(struct inflight *in, u64 id, struct agg_fd *mark, u64 ns, u64 written,
                                       struct agg_calls *blank)
{
    struct agg_call_key key = {};
    key.dev = mark->dev;
    key.op = in->op;
    struct agg_calls *a = agg_calls.lookup_or_try_init(&key, blank);
    if (a)
        agg_add(a, ns, written);
    u32 tgid = id >> 32;
    struct agg_process none = {};
    struct agg_process *p = agg_processes.lookup_or_try_init(&tgid, &none);
    if (p) {
        __sync_fetch_and_add(&p->written, written);
        __sync_fetch_and_add(&p->blocked_ns, ns);
    }
    int zero = 0;
    struct agg_longest *l = agg_longest.lookup(&zero);
    if (l && (s64)ns > l->latency_ns) {
        l->latency_ns = ns;
        l->ts_enter = in->ts_enter;
        l->gen = mark->gen;
        l->tid = id;
        l->tgid = tgid;
        l->fd = in->fd;
        l->op = in->op;
    }
}

static __always_inline void agg_syscall(struct inflight *in, u64 id, long ret, s64 now)
{
    if (in->skip || !AGG_FD_OP(in->op))
        return;
    u64 ns = now - in->ts_enter;
    u64 written = AGG_WRITE_OP(in->op) && ret > 0 ? ret : 0;
    int zero = 0;
    struct agg_calls *blank = agg_calls_blank.lookup(&zero);
    if (!blank)
        return;
    u64 key = fd_key(id >> 32, in->fd);
    u64 *g = fd_gen.lookup(&key);
    u64 gen = g ? *g : 0;
    struct agg_fd *mark = agg_fds.lookup(&key);
    if (mark && mark->gen == gen) {
        agg_marked(in, id, mark, ns, written, blank);
        return;
    }
    struct agg_pending_key pk = {};
    pk.gen = gen;
    pk.tgid = id >> 32;
    pk.fd = in->fd;
    pk.op = in->op;
    struct agg_calls *a = agg_pending.lookup_or_try_init(&pk, blank);
    if (!a)
        return;
    agg_add(a, ns, written);
    if ((s64)ns > a->longest_ns) {
        a->longest_ns = ns;
        a->longest_enter = in->ts_enter;
        a->longest_tid = id;
    }
}
#endif /* AGGREGATE */

static __always_inline int enter(u16 op, s32 fd, s32 fd2, u64 count, s64 offset, u32 flags,
                                 const void *path1, const void *path2, int fd_based)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!wanted(id))
        return 0;
    struct inflight in = {};
    if (fd_based && ignored(id >> 32, fd)) {
        if (op != SYSOP_CLOSE)
            return 0;
        in.skip = 1;
    }
    in.ts_enter = bpf_ktime_get_ns();
    in.tgid = id >> 32;
    in.op = op;
    in.fd = fd;
    in.fd2 = fd2;
    in.count = count;
    in.offset = offset;
    in.flags = flags;
    in.path1 = (u64)path1;
    in.path2 = (u64)path2;
    if (inflight_put(id, &in))
        count_loss(LOSS_INFLIGHT_FULL);
    return 0;
}

/* writev and friends: the requested bytes are the sum of the iovecs. */
static __always_inline int enter_vec(u16 op, s32 fd, const void *vec, u64 vlen, s64 offset)
{
    u64 total = 0;
    struct { u64 base; u64 len; } iov;
#pragma unroll
    for (int i = 0; i < IOV_SUM_MAX; i++) {
        if (i >= vlen)
            break;
        if (bpf_probe_read_user(&iov, sizeof(iov), vec + i * sizeof(iov)))
            break;
        total += iov.len;
    }
    int ret = enter(op, fd, -1, total, offset, 0, 0, 0, 1);
    if (vlen > IOV_SUM_MAX) {
        struct inflight *in = inflight_find(bpf_get_current_pid_tgid());
        if (in)
            in->partial = 1;
    }
    return ret;
}

/* A stat call with the buffer it fills (newfstatat's struct stat, statx's struct statx). */
static __always_inline int enter_stat(u16 op, s32 dfd, u32 flags, const void *path, const void *buf)
{
    int ret = enter(op, dfd, -1, 0, -1, flags, path, 0, 0);
    struct inflight *in = inflight_find(bpf_get_current_pid_tgid());
    if (in)
        in->buf = (u64)buf;
    return ret;
}

/* Whether a stat succeeded on a device with no traced file (FILTER_DEVS): its buffer holds
 * the device in uapi layouts, struct stat's st_dev first, statx's stx_dev_major/minor at
 * 136/140 (encoded as st_dev is: new_encode_dev). */
static __always_inline int untraced_stat(struct inflight *in, long ret)
{
#ifdef FILTER_DEVS
    if (ret != 0 || !in->buf)
        return 0;
    u64 dev = 0;
    if (in->op == SYSOP_NEWFSTATAT) {
        if (bpf_probe_read_user(&dev, sizeof(dev), (const void *)in->buf))
            return 0;
    } else {
        u32 mm[2];
        if (bpf_probe_read_user(mm, sizeof(mm), (const void *)(in->buf + 136)))
            return 0;
        dev = ((u64)(mm[0] & 0xfff) << 8) | ((u64)(mm[0] & ~0xfffU) << 32) | (mm[1] & 0xff) |
              ((u64)(mm[1] & ~0xffU) << 12);
    }
    return !traced_devs.lookup(&dev);
#else
    return 0;
#endif
}

#ifdef FILTER_PATHS
struct path_buf { u64 w[PATH_MAX_CAPTURED / 8]; };
BPF_PERCPU_ARRAY(path_scratch, struct path_buf, 1);
BPF_TABLE("lru_hash", u64, u64, fd_unrelated, 16384);     /* fd -> the generation whose open was dropped */

/* Whether dfd names a directory opened by a call the filter dropped, in that same generation. */
static __always_inline int unrelated_dir(u32 tgid, s32 dfd)
{
    if (dfd == AT_FDCWD_VAL)
        return 0;
    u64 key = fd_key(tgid, dfd);
    return marks_now(fd_unrelated.lookup(&key), key);
}

#define BYTES(c) ((c) * 0x0101010101010101ULL)
/* 0x80 in each byte of x that is zero, 0 elsewhere (exact: no carry from byte to byte). */
static __always_inline u64 zero_bytes(u64 x)
{
    u64 low7 = BYTES(0x7f);
    return ~(((x & low7) + low7) | x | low7);
}

/* Whether user space would find the path outside every --path prefix and not above one (a
 * directory an *at call may start from): complete and already normal (no "//", no "/." that
 * os.path.normpath could fold, no trailing "/"), and either absolute with PATH_RELATED false,
 * or relative to an unrelated_dir and not starting with "." (nothing under a directory outside
 * every prefix and above none is under a prefix, unless ".." leads out). Any other path is
 * user space's to decide. Eight bytes at a time, without a branch per byte: a
 * byte-by-byte loop was refused by 5.10's verifier, and unrolled took seconds to verify. */
static __always_inline int unrelated_path(u64 uptr, u32 tgid, s32 dfd)
{
    u32 zero = 0;
    struct path_buf *b = path_scratch.lookup(&zero);
    if (!b)
        return 0;
#pragma unroll
    for (int k = 0; k < PATH_MAX_CAPTURED / 8; k++)
        b->w[k] = 0;        /* past the path's end: zeros, not an earlier path's bytes */
    long n = bpf_probe_read_user_str(b->w, sizeof(b->w), (const void *)uptr);
    const unsigned char *s = (const unsigned char *)b->w;
    if (n < 2 || n >= sizeof(b->w))
        return 0;
    int relative = s[0] != '/';
    if (relative && (s[0] == '.' || !unrelated_dir(tgid, dfd)))
        return 0;
    u64 folded = 0;     /* a '/' followed by '/', '.' or the end */
#pragma unroll
    for (int k = 0; k < PATH_MAX_CAPTURED / 8; k++) {
        /* volatile: loaded one by one as used (all 32 loaded first spilled past the stack) */
        u64 x = *(volatile u64 *)&b->w[k];
        u64 next = (x >> 8) | ((u64)(k + 1 < PATH_MAX_CAPTURED / 8 ? *(volatile u8 *)&s[8 * k + 8] : 0) << 56);
        folded |= zero_bytes(x ^ BYTES('/')) &
                  (zero_bytes(next ^ BYTES('/')) | zero_bytes(next ^ BYTES('.')) | zero_bytes(next));
    }
    return !folded && (relative || !PATH_RELATED(s));
}
#endif

static __always_inline int emit_path(s64 ts_enter, u32 tid, u8 slot, u64 uptr)
{
    struct path_event *p = path_ring.ringbuf_reserve(sizeof(struct path_event));
    if (!p) {
        count_loss(LOSS_PATH_RING_FULL);
        return 0;
    }
    p->ts_enter = ts_enter;
    p->tid = tid;
    p->slot = slot;
    p->len = bpf_probe_read_user_str(p->path, sizeof(p->path), (const void *)uptr);
    if (p->len < 0) {
        p->path[0] = 0;
        count_loss(LOSS_PATH_READ_FAILED);
    }
    path_ring.ringbuf_submit(p, wake_flags(PATH_RING_ID, PATH_RING_WAKE, 0));
    return 1;
}

static __always_inline int creates_fd(u16 op)
{
    return op == SYSOP_OPENAT || op == SYSOP_OPENAT2 || op == SYSOP_CREAT || op == SYSOP_DUP ||
           op == SYSOP_DUP2 || op == SYSOP_DUP3 || op == SYSOP_FCNTL;
}

/* `paths`: a call that takes paths (a constant: the others compile without the path filter). */
static __always_inline int leave(long ret, int paths)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = id;
    struct inflight *in = inflight_find(tid);
    if (!in)
        return 0;
    s64 now = bpf_ktime_get_ns();
#ifdef AGGREGATE
    agg_syscall(in, id, ret, now);
#endif

    /* A new or closed fd gets a new generation, whatever else happens. */
    s32 changed = -1;
    if (ret >= 0 && creates_fd(in->op))
        changed = ret;
    else if (ret == 0 && in->op == SYSOP_CLOSE)
        changed = in->fd;
    if (changed >= 0) {
        u64 key = fd_key(id >> 32, changed);
        u64 gen = now;
        fd_gen.update(&key, &gen);
    }
    if (in->skip || untraced_stat(in, ret))
        goto out;
#ifdef FILTER_PATHS
    /* Never a chdir (EXIT, not EXIT_PATHS): the cwd is what relative paths are resolved against. */
    if (paths && in->path1 && unrelated_path(in->path1, id >> 32, in->fd) &&
        (!in->path2 || unrelated_path(in->path2, id >> 32, in->fd2))) {
        if (changed >= 0 && in->op != SYSOP_CLOSE) {   /* an untraced file's new fd */
            u64 key = fd_key(id >> 32, changed);
            u64 gen = now;
            fd_ignore.update(&key, &gen);
            fd_unrelated.update(&key, &gen);
        }
        goto out;
    }
#endif

    /* Paths first: a committed syscall record implies its paths are committed. */
    u8 npaths = 0;
    if (in->path1)
        npaths += emit_path(in->ts_enter, tid, 0, in->path1);
    if (in->path2)
        npaths += emit_path(in->ts_enter, tid, 1, in->path2);

    struct sys_event *e = sys_ring.ringbuf_reserve(sizeof(struct sys_event));
    if (!e) {
        count_loss(LOSS_SYS_RING_FULL);
        goto out;
    }
    e->ts_enter = in->ts_enter;
    e->ts_exit = now;
    e->ret = ret;
    e->count = in->count;
    e->offset = in->offset;
    e->tid = tid;
    e->tgid = id >> 32;
    e->fd = in->fd;
    e->fd2 = in->fd2;
    e->flags = in->flags;
    e->op = in->op;
    e->nfs_ns = in->nfs_ns;
    e->nfs_calls = in->nfs_calls;
    e->npaths = npaths;
    e->partial = in->partial;
    sys_ring.ringbuf_submit(e, wake_flags(SYS_RING_ID, SYS_RING_WAKE, 0));
out:
    inflight_done(tid);
    return 0;
}

#define EXIT(name) \
    TRACEPOINT_PROBE(syscalls, sys_exit_##name) { return leave(args->ret, 0); }
#define EXIT_PATHS(name) \
    TRACEPOINT_PROBE(syscalls, sys_exit_##name) { return leave(args->ret, 1); }

/* ---- the syscalls; each is compiled only where its tracepoint exists ---- */

#ifdef HAVE_write
TRACEPOINT_PROBE(syscalls, sys_enter_write)
{ return enter(SYSOP_WRITE, args->fd, -1, args->count, -1, 0, 0, 0, 1); }
EXIT(write)
#endif
#ifdef HAVE_pwrite64
TRACEPOINT_PROBE(syscalls, sys_enter_pwrite64)
{ return enter(SYSOP_PWRITE64, args->fd, -1, args->count, args->pos, 0, 0, 0, 1); }
EXIT(pwrite64)
#endif
#ifdef HAVE_writev
TRACEPOINT_PROBE(syscalls, sys_enter_writev)
{ return enter_vec(SYSOP_WRITEV, args->fd, args->vec, args->vlen, -1); }
EXIT(writev)
#endif
#ifdef HAVE_pwritev
TRACEPOINT_PROBE(syscalls, sys_enter_pwritev)
{ return enter_vec(SYSOP_PWRITEV, args->fd, args->vec, args->vlen, args->pos_l); }
EXIT(pwritev)
#endif
#ifdef HAVE_pwritev2
TRACEPOINT_PROBE(syscalls, sys_enter_pwritev2)
{ return enter_vec(SYSOP_PWRITEV2, args->fd, args->vec, args->vlen, args->pos_l); }
EXIT(pwritev2)
#endif
#ifdef HAVE_fsync
TRACEPOINT_PROBE(syscalls, sys_enter_fsync)
{ return enter(SYSOP_FSYNC, args->fd, -1, 0, -1, 0, 0, 0, 1); }
EXIT(fsync)
#endif
#ifdef HAVE_fdatasync
TRACEPOINT_PROBE(syscalls, sys_enter_fdatasync)
{ return enter(SYSOP_FDATASYNC, args->fd, -1, 0, -1, 0, 0, 0, 1); }
EXIT(fdatasync)
#endif
#ifdef HAVE_sync_file_range
TRACEPOINT_PROBE(syscalls, sys_enter_sync_file_range)
{ return enter(SYSOP_SYNC_FILE_RANGE, args->fd, -1, args->nbytes, args->offset, args->flags, 0, 0, 1); }
EXIT(sync_file_range)
#endif
#ifdef HAVE_close
TRACEPOINT_PROBE(syscalls, sys_enter_close)
{ return enter(SYSOP_CLOSE, args->fd, -1, 0, -1, 0, 0, 0, 1); }
EXIT(close)
#endif
#ifdef HAVE_ftruncate
TRACEPOINT_PROBE(syscalls, sys_enter_ftruncate)
{ return enter(SYSOP_FTRUNCATE, args->fd, -1, args->length, -1, 0, 0, 0, 1); }
EXIT(ftruncate)
#endif
#ifdef HAVE_openat
TRACEPOINT_PROBE(syscalls, sys_enter_openat)
{ return enter(SYSOP_OPENAT, args->dfd, -1, 0, -1, args->flags, args->filename, 0, 0); }
EXIT_PATHS(openat)
#endif
#ifdef HAVE_openat2
TRACEPOINT_PROBE(syscalls, sys_enter_openat2)
{
    u64 flags = 0;  /* struct open_how starts with the u64 flags (uapi, stable) */
    bpf_probe_read_user(&flags, sizeof(flags), args->how);
    return enter(SYSOP_OPENAT2, args->dfd, -1, 0, -1, flags, args->filename, 0, 0);
}
EXIT_PATHS(openat2)
#endif
#ifdef HAVE_creat
TRACEPOINT_PROBE(syscalls, sys_enter_creat)
{ return enter(SYSOP_CREAT, AT_FDCWD_VAL, -1, 0, -1, 0, args->pathname, 0, 0); }
EXIT_PATHS(creat)
#endif
#ifdef HAVE_rename
TRACEPOINT_PROBE(syscalls, sys_enter_rename)
{ return enter(SYSOP_RENAME, AT_FDCWD_VAL, AT_FDCWD_VAL, 0, -1, 0, args->oldname, args->newname, 0); }
EXIT_PATHS(rename)
#endif
#ifdef HAVE_renameat
TRACEPOINT_PROBE(syscalls, sys_enter_renameat)
{ return enter(SYSOP_RENAMEAT, args->olddfd, args->newdfd, 0, -1, 0, args->oldname, args->newname, 0); }
EXIT_PATHS(renameat)
#endif
#ifdef HAVE_renameat2
TRACEPOINT_PROBE(syscalls, sys_enter_renameat2)
{ return enter(SYSOP_RENAMEAT2, args->olddfd, args->newdfd, 0, -1, args->flags, args->oldname, args->newname, 0); }
EXIT_PATHS(renameat2)
#endif
#ifdef HAVE_unlink
TRACEPOINT_PROBE(syscalls, sys_enter_unlink)
{ return enter(SYSOP_UNLINK, AT_FDCWD_VAL, -1, 0, -1, 0, args->pathname, 0, 0); }
EXIT_PATHS(unlink)
#endif
#ifdef HAVE_unlinkat
TRACEPOINT_PROBE(syscalls, sys_enter_unlinkat)
{ return enter(SYSOP_UNLINKAT, args->dfd, -1, 0, -1, args->flag, args->pathname, 0, 0); }
EXIT_PATHS(unlinkat)
#endif
#ifdef HAVE_mkdir
TRACEPOINT_PROBE(syscalls, sys_enter_mkdir)
{ return enter(SYSOP_MKDIR, AT_FDCWD_VAL, -1, 0, -1, 0, args->pathname, 0, 0); }
EXIT_PATHS(mkdir)
#endif
#ifdef HAVE_mkdirat
TRACEPOINT_PROBE(syscalls, sys_enter_mkdirat)
{ return enter(SYSOP_MKDIRAT, args->dfd, -1, 0, -1, 0, args->pathname, 0, 0); }
EXIT_PATHS(mkdirat)
#endif
#ifdef HAVE_newfstatat
TRACEPOINT_PROBE(syscalls, sys_enter_newfstatat)
{ return enter_stat(SYSOP_NEWFSTATAT, args->dfd, args->flag, args->filename, args->statbuf); }
EXIT_PATHS(newfstatat)
#endif
#ifdef HAVE_statx
TRACEPOINT_PROBE(syscalls, sys_enter_statx)
{ return enter_stat(SYSOP_STATX, args->dfd, args->flags, args->filename, args->buffer); }
EXIT_PATHS(statx)
#endif
#ifdef HAVE_chdir
TRACEPOINT_PROBE(syscalls, sys_enter_chdir)
{ return enter(SYSOP_CHDIR, AT_FDCWD_VAL, -1, 0, -1, 0, args->filename, 0, 0); }
EXIT(chdir)
#endif
#ifdef HAVE_fchdir
TRACEPOINT_PROBE(syscalls, sys_enter_fchdir)
{ return enter(SYSOP_FCHDIR, args->fd, -1, 0, -1, 0, 0, 0, 0); }
EXIT(fchdir)
#endif
/* dup*: not rows, but they create fds the fd table must know. fd_based is 0:
 * a dup of an ignored fd still has to reach user space. */
#ifdef HAVE_dup
TRACEPOINT_PROBE(syscalls, sys_enter_dup)
{ return enter(SYSOP_DUP, args->fildes, -1, 0, -1, 0, 0, 0, 0); }
EXIT(dup)
#endif
#ifdef HAVE_dup2
TRACEPOINT_PROBE(syscalls, sys_enter_dup2)
{ return enter(SYSOP_DUP2, args->oldfd, args->newfd, 0, -1, 0, 0, 0, 0); }
EXIT(dup2)
#endif
#ifdef HAVE_dup3
TRACEPOINT_PROBE(syscalls, sys_enter_dup3)
{ return enter(SYSOP_DUP3, args->oldfd, args->newfd, 0, -1, args->flags, 0, 0, 0); }
EXIT(dup3)
#endif
#ifdef HAVE_fcntl
TRACEPOINT_PROBE(syscalls, sys_enter_fcntl)
{
    if (args->cmd != F_DUPFD_VAL && args->cmd != F_DUPFD_CLOEXEC_VAL)
        return 0;
    return enter(SYSOP_FCNTL, args->fd, -1, 0, -1, args->cmd, 0, 0, 0);
}
EXIT(fcntl)
#endif

#ifdef HAVE_close_range
TRACEPOINT_PROBE(syscalls, sys_enter_close_range)
{ return enter(SYSOP_CLOSE_RANGE, args->fd, args->max_fd, 0, -1, args->flags, 0, 0, 0); }
EXIT(close_range)
#endif

/* ---- process lifecycle: ancestry for rank inheritance and --pid/-- COMMAND ----
 * Only traced processes' (wanted()): with --pid or --cgroup, the threads and programs the rest
 * of a busy machine starts would fill the ring and wake the agent for nothing. */

static __always_inline void emit_proc(u32 kind, u32 tid, u64 clone_flags, int urgent)
{
    struct proc_event *p = proc_ring.ringbuf_reserve(sizeof(struct proc_event));
    if (!p) {
        count_loss(LOSS_PROC_RING_FULL);
        return;
    }
    u64 id = bpf_get_current_pid_tgid();
    p->ts = bpf_ktime_get_ns();
    p->clone_flags = clone_flags;
    p->tid = tid;
    p->tgid = id >> 32;
    p->ptid = id;
    p->kind = kind;
    proc_ring.ringbuf_submit(p, wake_flags(PROC_RING_ID, PROC_RING_WAKE, urgent));
}

TRACEPOINT_PROBE(task, task_newtask)
{
#ifdef FILTER_TGIDS
    /* A traced process's children are traced from their first instruction. */
    u32 parent = bpf_get_current_pid_tgid() >> 32;
    if (!(args->clone_flags & CLONE_THREAD_FLAG) && traced_tgids.lookup(&parent)) {
        u32 child = args->pid;
        u8 one = 1;
        traced_tgids.update(&child, &one);
    }
#endif
    if (wanted(bpf_get_current_pid_tgid()))
        emit_proc(PROC_NEWTASK, args->pid, args->clone_flags, 0);
    return 0;
}

/* The rank variables of the program a traced process execs, from its new environment (user
 * memory, read before the program starts): only the names in rank_vars leave the kernel. A rank
 * that writes its file and exits within milliseconds is gone before /proc can be read. */
#define ENV_SCAN 128
static __always_inline void scan_env(const char *const *envp)
{
    u64 ts = bpf_ktime_get_ns();
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    for (int i = 0; i < ENV_SCAN; i++) {
        const char *s = NULL;
        if (bpf_probe_read_user(&s, sizeof(s), &envp[i]) || !s)
            return;
        struct env_name key = {};
        if (bpf_probe_read_user_str(key.name, sizeof(key.name), s) <= 0)
            continue;
        int eq = -1;
#pragma unroll
        for (int j = 0; j < ENV_NAME_MAX; j++) {
            if (eq < 0 && key.name[j] == '=')
                eq = j;
            if (eq >= 0)
                key.name[j] = 0;
        }
        if (eq <= 0 || !rank_vars.lookup(&key))
            continue;
        struct env_event *e = env_ring.ringbuf_reserve(sizeof(struct env_event));
        if (!e) {
            count_loss(LOSS_ENV_RING_FULL);
            return;
        }
        e->ts = ts;
        e->tgid = tgid;
        __builtin_memcpy(e->name, key.name, sizeof(e->name));
        if (bpf_probe_read_user_str(e->value, sizeof(e->value), s + eq + 1) < 0)
            e->value[0] = 0;
        env_ring.ringbuf_submit(e, wake_flags(ENV_RING_ID, ENV_RING_WAKE, 0));
    }
}

TRACEPOINT_PROBE(syscalls, sys_enter_execve)
{
    if (wanted(bpf_get_current_pid_tgid()))
        scan_env((const char *const *)args->envp);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_execveat)
{
    if (wanted(bpf_get_current_pid_tgid()))
        scan_env((const char *const *)args->envp);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exec)
{
    /* A traced program's identity cannot wait: a forced wakeup. */
    if (wanted(bpf_get_current_pid_tgid()))
        emit_proc(PROC_EXEC, args->pid, 0, 1);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    if ((u32)id != (u32)(id >> 32))
        return 0;  /* a thread, not the process */
    int traced = wanted(id);
#ifdef FILTER_TGIDS
    u32 tgid = id >> 32;
    traced_tgids.delete(&tgid);
#endif
    if (traced)
        emit_proc(PROC_EXIT, (u32)id, 0, 0);
    return 0;
}
