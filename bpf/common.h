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

/* nfs_initiate_{write,commit,read} fire in the issuing thread just before it starts
 * the RPC task (rpc_execute -> rpc_task_begin, same thread): the nfs group leaves the
 * I/O here by thread id and the sunrpc group attaches it to the task. */
struct pending_io {
    u64 fileid;
    s64 offset;
    u32 count;
    u32 stable;
    u32 dev;
};
BPF_HASH(pending_io, u32, struct pending_io, 4096);

/* The nfs_owner group's kprobe on nfs_initiate_write leaves the WRITE's lock owner and
 * open file here, by thread, for the same rpc_task_begin (bpf/owners.c). */
struct pending_owner {
    u64 lock_owner;
    u64 open_file;
};
BPF_HASH(pending_owner, u32, struct pending_owner, 4096);
