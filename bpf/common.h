/* slotscope: what every probe group shares. */

/* Events lost, per counter (LOSS_* from the generated header), per CPU. */
BPF_PERCPU_ARRAY(loss, u64, LOSS_NCOUNTERS);

static __always_inline void count_loss(int idx)
{
    u64 *v = loss.lookup(&idx);
    if (v)
        (*v)++;
}

/* Events are submitted without waking the agent: it drains every ring on its own cadence
 * (DRAIN_EVERY in agent/probes.py), far cheaper than a wakeup per event. It is woken early
 * when an event cannot wait (`urgent`: a new program, to identify before it exits) or
 * after `every` events on this CPU (<RING>_WAKE: an eighth of record's ring over all CPUs,
 * half of watch's: agent/probes.py ring_sizes), so that it drains before the ring overflows.
 * The agent waits with epoll, edge-triggered: only these forced wakeups end its wait. */
BPF_PERCPU_ARRAY(unwoken, u32, NRINGS);
BPF_PERCPU_ARRAY(woken, u64, NRINGS);     /* forced wakeups per ring: what they cost, seen from user space */

static __always_inline u64 force_wakeup(int ring)
{
    u64 *w = woken.lookup(&ring);
    if (w)
        (*w)++;
    return BPF_RB_FORCE_WAKEUP;
}

static __always_inline u64 wake_flags(int ring, u32 every, int urgent)
{
    u32 *n = unwoken.lookup(&ring);
    if (!n)
        return urgent ? force_wakeup(ring) : BPF_RB_NO_WAKEUP;
    if (urgent || ++*n >= every) {
        *n = 0;
        return force_wakeup(ring);
    }
    return BPF_RB_NO_WAKEUP;
}

/* Direct-mapped tables: a record is looked for first at one index of an array, which the
 * verifier inlines (a hash lookup costs ~150 instructions), and in a hash where another live
 * record held that index when it was made. An index is taken with XADD and a read-back of the
 * count (every kernel has XADD; compare-and-swap needs 5.12), so that two CPUs cannot both
 * take it; its holder fills the record, then sets `live`. */
struct slot_hold {
    u32 claims;
    u8 live;
};

static __always_inline int slot_take(struct slot_hold *h)
{
    if (h->live)
        return 0;
    __sync_fetch_and_add(&h->claims, 1);
    if (*(volatile u32 *)&h->claims == 1)
        return 1;
    __sync_fetch_and_add(&h->claims, -1);   /* another CPU's record took it meanwhile */
    return 0;
}

static __always_inline void slot_give_back(struct slot_hold *h)
{
    h->live = 0;
    __sync_fetch_and_add(&h->claims, -1);
}

/* Per-thread tables (a thread's pending I/O below, its syscall in flight: bpf/syscalls.c) are
 * direct-mapped by thread id; only the thread itself touches its record. A slot's head, and its
 * logic; each table has its own three accessors (find, put, done), alike: BCC compiles no map
 * call inside a macro ("cannot use map function inside a macro"). */
struct thread_hold {
    u32 tid;
    struct slot_hold hold;
};

static __always_inline int held_by(struct thread_hold *h, u32 tid)
{
    return h->hold.live && h->tid == tid;
}

/* Whether the slot is now the thread's: it was, or it was free and is taken (the caller fills
 * its record, then sets `live`). */
static __always_inline int hold_for(struct thread_hold *h, u32 tid)
{
    if (held_by(h, tid))
        return 1;
    if (!slot_take(&h->hold))
        return 0;
    h->tid = tid;
    return 1;
}

/* nfs_initiate_{write,commit,read} fire in the issuing thread just before it starts
 * the RPC task (rpc_execute -> rpc_task_begin, same thread): the nfs group leaves the
 * I/O here by thread id and the sunrpc group attaches it to the task. The nfs_owner group's
 * kprobe on nfs_initiate_write, which runs before that tracepoint, leaves the WRITE's lock
 * owner and open file in the same entry (bpf/owners.c). Direct-mapped by thread id. */
struct pending_io {
    u64 fileid;
    s64 offset;
    u64 lock_owner;
    u64 open_file;
    u32 count;
    u32 stable;
    u32 dev;
};
#define PENDING_SLOTS 4096
struct pending_slot {
    struct pending_io io;
    struct thread_hold head;
};
BPF_ARRAY(pending_slots, struct pending_slot, PENDING_SLOTS);
BPF_HASH(pending_io, u32, struct pending_io, 4096);

static __always_inline struct pending_slot *pending_slot(u32 tid)
{
    u32 i = tid % PENDING_SLOTS;
    return pending_slots.lookup(&i);
}

/* The thread's pending I/O, or 0. */
static __always_inline struct pending_io *pending_find(u32 tid)
{
    struct pending_slot *s = pending_slot(tid);
    return s && held_by(&s->head, tid) ? &s->io : pending_io.lookup(&tid);
}

/* Leave `io` as the thread's pending I/O, in place of any it had. */
static __always_inline void pending_put(u32 tid, struct pending_io *io)
{
    struct pending_slot *s = pending_slot(tid);
    if (s && hold_for(&s->head, tid)) {
        s->io = *io;
        s->head.hold.live = 1;
    } else {
        pending_io.update(&tid, io);
    }
}

/* The thread's pending I/O is taken. */
static __always_inline void pending_done(u32 tid)
{
    struct pending_slot *s = pending_slot(tid);
    if (s && held_by(&s->head, tid))
        slot_give_back(&s->head.hold);
    else
        pending_io.delete(&tid);
}
