/*
 * slotscope: one record per RPC task, from sunrpc tracepoints only.
 *
 * Tracepoint arguments only (BCC takes their layout from tracefs), so this is
 * header-independent too. A task is keyed by (client_id, task_id): task_id is a
 * per-client counter that can wrap, but never within one task's lifetime.
 *
 * A record is emitted at rpc_stats_latency, which rpc_exit_task fires once per
 * attempt, as /proc/self/mountstats counts. (rpc_task_complete is no use: by
 * then the task has dropped its client, so its client_id reads -1.) A task
 * that restarts after that (rpc_call_done can retry it) gets a fresh record
 * where it is next looked up: its call_reserve step, or a sleep before it (an
 * NFSv4.1 session slot's, in its prepare step).
 *
 * Where a span starts, rpc_task_run_action tells: its `action` is a function
 * pointer, compared with the addresses of call_reserve and call_transmit that
 * the agent reads from /proc/kallsyms (CALL_RESERVE_ADDR, CALL_TRANSMIT_ADDR).
 * Where they are missing (inlined), the sleep sums still give the waits, and
 * every step looks its task up. Of the ~14 steps of an RPC only those two look
 * it up; the others return on the address compare.
 */

#define SLEEP_NONE 0
#define SLEEP_BACKLOG 1
#define SLEEP_SESSION 2
#define SLEEP_SENDING 3
#define SLEEP_PENDING 4
#define SLEEP_DELAY 5

struct rpc_task_state {
    struct rpc_event ev;
    s64 sleep_start;
    u8 sleep_class;   /* SLEEP_* of the queue the task sleeps on */
    u8 has_slot;
};

/* Occupancy per client, as counters updated from every CPU. In the order of an rpc_event's
 * taken_* and freed_* fields (capture/events.py), which hold copies. */
struct client_slots {
    s32 in_use;
    s32 backlog;
    s32 session_wait;
    s32 sending;
    s32 pending;
};
_Static_assert(sizeof(struct client_slots) == 5 * sizeof(s32), "client_slots is an rpc_event's taken_* fields");


/* The tasks followed, direct-mapped (common.h) by their key: a task is looked up ~12 times.
 * Where another task held its slot, in the LRU hash, where a task that ends without an
 * accounting record does not pin an entry forever (in the array it keeps its slot, and the
 * tasks that map there go to the hash). */
#define TASK_SLOTS 16384
struct task_slot {
    struct rpc_task_state st;
    struct slot_hold hold;
};
BPF_ARRAY(task_slots, struct task_slot, TASK_SLOTS);
BPF_TABLE("lru_hash", u64, struct rpc_task_state, rpc_tasks, 65536);
BPF_RINGBUF_OUTPUT(rpc_ring, RPC_RING_PAGES);
/* By client id: the kernel hands out the lowest free one (an ida), so ids stay below the
 * number of clients alive at once. An array, whose lookups the verifier inlines. */
#define CLIENTS_MAX 16384
BPF_ARRAY(client_slots, struct client_slots, CLIENTS_MAX);
BPF_RINGBUF_OUTPUT(slot_ring, SLOT_RING_PAGES);

#ifdef AGGREGATE
/* ---- watch's aggregates (agent/aggregates.py sweeps them once a drain) ----
 * Per server (agg_server_of: client id -> server index, filled by user space from debugfs;
 * a mount's nfs and nfsacl clients share one transport, so one server), the slots in use and
 * the tasks waiting for one, summed over its clients, and their integrals over time kept as
 * acc + count * now: each change adds -delta * ts to acc, at the slot sample's own ts. A
 * client mapped after its first change brings its counts then (seeded). Full: some task
 * waiting; full_ns holds the ended periods, full_since the current one's start. Backlog
 * changes are made under the transport's backlog queue lock, so one transport's are ordered;
 * the servers' counts are changed only with atomic adds. */
struct agg_server {
    s64 in_use;
    s64 backlog;
    s64 in_use_acc;
    s64 backlog_acc;
    s64 full_ns;
    s64 full_since;
};
struct agg_client {
    u32 server;
    u32 seeded;
};
BPF_HASH(agg_server_of, u32, struct agg_client, 4096);
/* The clients whose counts changed before user space mapped them: what it maps at its next
 * sweep (client_slots, an array, would list every id). */
BPF_HASH(agg_unmapped, u32, u8, 4096);
BPF_ARRAY(agg_servers, struct agg_server, AGG_SERVERS);

static __always_inline void agg_slots(u32 client_id, struct client_slots *c, u8 what, s32 delta, s64 ts)
{
    if (what != SLEEP_NONE && what != SLEEP_BACKLOG)
        return;
    struct agg_client *m = agg_server_of.lookup(&client_id);
    if (!m) {
        u8 one = 1;
        agg_unmapped.update(&client_id, &one);
        return;
    }
    u32 idx = m->server;
    struct agg_server *s = agg_servers.lookup(&idx);
    if (!s)
        return;
    s64 d_in = 0, d_bl = 0;
    if (!m->seeded) {       /* its counts so far, this change's included */
        m->seeded = 1;
        d_in = c->in_use;
        d_bl = c->backlog;
    } else if (what == SLEEP_NONE) {
        d_in = delta;
    } else {
        d_bl = delta;
    }
    if (d_in) {
        __sync_fetch_and_add(&s->in_use, d_in);
        __sync_fetch_and_add(&s->in_use_acc, -d_in * ts);
    }
    if (!d_bl)
        return;
    __sync_fetch_and_add(&s->backlog, d_bl);
    __sync_fetch_and_add(&s->backlog_acc, -d_bl * ts);
    s64 since = s->full_since;
    if (s->backlog > 0 && !since) {
        s->full_since = ts;
    } else if (s->backlog <= 0 && since) {
        s->full_since = 0;
        __sync_fetch_and_add(&s->full_ns, ts - since);
    }
}

/* Per (client, procedure): histograms of slot wait, round trip and execute, in the metrics'
 * buckets (AGG_BUCKET, from agent/metrics.py LATENCY_BUCKETS_S), each with its sum (ns). */
struct agg_hist {
    u64 count[AGG_NBUCKETS];
    u64 sum_ns;
};
struct agg_rpc_key {
    u32 client_id;
    char procname[AGG_PROCNAME];   /* rpc_event's (a literal: BCC's key description cannot size it) */
};
struct agg_rpc {
    struct agg_hist slot_wait;
    struct agg_hist rtt;
    struct agg_hist execute;
};
BPF_HASH(agg_rpcs, struct agg_rpc_key, struct agg_rpc, 4096);
BPF_PERCPU_ARRAY(agg_rpc_blank, struct agg_rpc, 1);     /* too big for the stack: a new entry's zeros */

static __always_inline void agg_hist(struct agg_hist *h, u64 ns)
{
    u32 i = AGG_BUCKET(ns);
    if (i < AGG_NBUCKETS)
        __sync_fetch_and_add(&h->count[i], 1);
    __sync_fetch_and_add(&h->sum_ns, ns);
}

/* A complete RPC's spans, derived as agent/rpc_rows.py derives its row's. */
static __always_inline void agg_rpc(const struct rpc_event *ev, u64 rtt_us, u64 execute_us)
{
    struct agg_rpc_key key = {};
    key.client_id = ev->client_id;
    __builtin_memcpy(key.procname, ev->procname, sizeof(key.procname));
    int zero = 0;
    struct agg_rpc *blank = agg_rpc_blank.lookup(&zero);
    if (!blank)
        return;
    struct agg_rpc *a = agg_rpcs.lookup_or_try_init(&key, blank);
    if (!a)
        return;
    u64 wait = ev->ts_reserved > 0 && ev->ts_reserve_start > 0 ? ev->ts_reserved - ev->ts_reserve_start
                                                                : ev->backlog_sleep_ns;
    agg_hist(&a->slot_wait, wait);
    agg_hist(&a->rtt, rtt_us * 1000);
    agg_hist(&a->execute, execute_us * 1000);
}
#endif /* AGGREGATE */

/* Change one occupancy counter of a client at `ts`: -> its counts after the change, or 0.
 * A change of the waits for a slot makes a row of the client's counts (no peak of the table is
 * missed); a change of the slots in use does not: the RPC that took or gave back the slot
 * carries the counts of that moment in its own record (rpc_event's taken_*, freed_*), of which
 * user space makes the row (agent/rpc_rows.py), and a ring event each, two an RPC, was ~15% of
 * the BPF time of a WRITE. The sending and pending queues ride along as they stand then: a
 * row each for them was half of an RPC's slot rows, which no finding reads. */
static __always_inline struct client_slots *slots_change(u32 client_id, u8 what, s32 delta, s64 ts)
{
    struct client_slots *c = client_slots.lookup(&client_id);
    if (!c)
        return 0;
    switch (what) {
    case SLEEP_NONE: __sync_fetch_and_add(&c->in_use, delta); break;
    case SLEEP_BACKLOG: __sync_fetch_and_add(&c->backlog, delta); break;
    case SLEEP_SESSION: __sync_fetch_and_add(&c->session_wait, delta); break;
    case SLEEP_SENDING: __sync_fetch_and_add(&c->sending, delta); break;
    case SLEEP_PENDING: __sync_fetch_and_add(&c->pending, delta); break;
    default: return 0;
    }
#ifdef AGGREGATE
    agg_slots(client_id, c, what, delta, ts);
#endif
    if (what != SLEEP_BACKLOG && what != SLEEP_SESSION)
        return c;
    struct slot_event *e = slot_ring.ringbuf_reserve(sizeof(struct slot_event));
    if (!e) {
        count_loss(LOSS_RPC_SLOT_RING_FULL);
        return c;
    }
    e->ts = ts;
    e->client_id = client_id;
    e->in_use = c->in_use;
    e->backlog = c->backlog;
    e->session_wait = c->session_wait;
    e->sending = c->sending;
    e->pending = c->pending;
    slot_ring.ringbuf_submit(e, wake_flags(SLOT_RING_ID, SLOT_RING_WAKE, 0));
    return c;
}

static __always_inline u64 rpc_key(u32 client_id, u32 task_id)
{
    return ((u64)client_id << 32) | task_id;
}

/* A client's task ids are consecutive: they take consecutive slots, from a place that differs
 * by client (Knuth's multiplicative hash of the client id). */
static __always_inline struct task_slot *task_slot(u32 client_id, u32 task_id)
{
    u32 i = (client_id * 2654435761u + task_id) % TASK_SLOTS;
    return task_slots.lookup(&i);
}

static __always_inline int holds(struct task_slot *s, u32 client_id, u32 task_id)
{
    return s->hold.live && s->st.ev.task_id == task_id && s->st.ev.client_id == client_id;
}

static __always_inline struct rpc_task_state *rpc_state(u32 client_id, u32 task_id)
{
    struct task_slot *s = task_slot(client_id, task_id);
    if (s && holds(s, client_id, task_id))
        return &s->st;
    u64 key = rpc_key(client_id, task_id);
    return rpc_tasks.lookup(&key);
}

/* A task's record, from its first step (or its restart's): 0 if the table is full. */
static __always_inline struct rpc_task_state *rpc_begin(u32 client_id, u32 task_id, u16 flags)
{
    struct rpc_task_state st = {};
    u64 id = bpf_get_current_pid_tgid();
    st.ev.ts_begin = bpf_ktime_get_ns();
    st.ev.task_id = task_id;
    st.ev.client_id = client_id;
    st.ev.owner_tid = id;
    st.ev.owner_tgid = id >> 32;
    st.ev.task_flags = flags;
    st.ev.xprt_id = -1;  /* the xprt group fills it in at xprt_reserve */
    u32 tid = id;
    struct pending_io *io = pending_find(tid);
    if (io) {  /* the WRITE/COMMIT/READ this thread just initiated, and whose pages a WRITE sends */
        st.ev.fileid = io->fileid;
        st.ev.io_offset = io->offset;
        st.ev.io_count = io->count;
        st.ev.io_stable = io->stable;
        st.ev.io_dev = io->dev;
        st.ev.lock_owner = io->lock_owner;
        st.ev.open_file = io->open_file;
        pending_done(tid);
    }
    struct task_slot *s = task_slot(client_id, task_id);
    if (s && holds(s, client_id, task_id)) {   /* its own stale record (the id wrapped): replaced */
        s->st = st;
        return &s->st;
    }
    if (s && slot_take(&s->hold)) {
        s->st = st;
        s->hold.live = 1;
        return &s->st;
    }
    u64 key = rpc_key(client_id, task_id);
    if (rpc_tasks.update(&key, &st)) {
        count_loss(LOSS_RPC_TASKS_FULL);
        return 0;
    }
    return rpc_tasks.lookup(&key);
}

/* The task's attempt is accounted: its record is given up. */
static __always_inline void rpc_end(u32 client_id, u32 task_id)
{
    struct task_slot *s = task_slot(client_id, task_id);
    if (s && holds(s, client_id, task_id)) {
        slot_give_back(&s->hold);
        return;
    }
    u64 key = rpc_key(client_id, task_id);
    rpc_tasks.delete(&key);
}

TRACEPOINT_PROBE(sunrpc, rpc_task_begin)
{
    rpc_begin(args->client_id, args->task_id, args->flags);
    return 0;
}

TRACEPOINT_PROBE(sunrpc, rpc_request)
{
    struct rpc_task_state *st = rpc_state(args->client_id, args->task_id);
    if (!st)
        return 0;
    st->ev.version = args->version;
    TP_DATA_LOC_READ_STR(st->ev.procname, procname, sizeof(st->ev.procname));
    TP_DATA_LOC_READ_STR(st->ev.progname, progname, sizeof(st->ev.progname));
    return 0;
}

/* The task whose call_reserve step this CPU runs: xprt_reserve, which that step calls at once,
 * takes its client id from here, not from a read of its rpc_clnt (bpf/xprt.c task_client). */
#ifdef XPRT_GROUP
struct reserving {
    u32 task_id;
    u32 client_id;
    u8 live;
};
BPF_PERCPU_ARRAY(reserving, struct reserving, 1);
#endif

static __always_inline void reserving_now(u32 client_id, u32 task_id)
{
#ifdef XPRT_GROUP
    int zero = 0;
    struct reserving *r = reserving.lookup(&zero);
    if (r) {
        r->task_id = task_id;
        r->client_id = client_id;
        r->live = 1;
    }
#endif
}

#if defined(CALL_RESERVE_ADDR) && defined(CALL_TRANSMIT_ADDR)
#define RUN_ACTION_FILTER
#endif

TRACEPOINT_PROBE(sunrpc, rpc_task_run_action)
{
#if defined(CALL_RESERVE_ADDR) || defined(CALL_TRANSMIT_ADDR)
    u64 action = (u64)args->action;
#endif
#ifdef RUN_ACTION_FILTER
    if (action != CALL_RESERVE_ADDR && action != CALL_TRANSMIT_ADDR)
        return 0;
#endif
    struct rpc_task_state *st = rpc_state(args->client_id, args->task_id);
    if (!st)  /* restarted after its accounting record */
        st = rpc_begin(args->client_id, args->task_id, args->flags);
    if (!st)
        return 0;
#ifdef CALL_RESERVE_ADDR
    if (action == CALL_RESERVE_ADDR) {
        if (!st->ev.ts_reserve_start)
            st->ev.ts_reserve_start = bpf_ktime_get_ns();
        reserving_now(args->client_id, args->task_id);
    }
#endif
#ifdef CALL_TRANSMIT_ADDR
    if (action == CALL_TRANSMIT_ADDR && !st->ev.ts_transmit_start)
        st->ev.ts_transmit_start = bpf_ktime_get_ns();
#endif
    return 0;
}

/* Which queue: the first bytes of q_name tell them apart. */
static __always_inline u8 sleep_class(const char *q)
{
    if (q[0] == 'x' && q[4] == '_') {        /* xprt_backlog, xprt_sending, xprt_pending */
        if (q[5] == 'b') return SLEEP_BACKLOG;
        if (q[5] == 's') return SLEEP_SENDING;
        if (q[5] == 'p') return SLEEP_PENDING;
    }
    if (q[0] == 'F' && q[1] == 'o')           /* ForeChannel Slot table */
        return SLEEP_SESSION;
    if (q[0] == 'd' && q[1] == 'e')           /* delayq */
        return SLEEP_DELAY;
    return SLEEP_NONE;
}

TRACEPOINT_PROBE(sunrpc, rpc_task_sleep)
{
    struct rpc_task_state *st = rpc_state(args->client_id, args->task_id);
    if (!st)  /* restarted after its accounting record, asleep before its call_reserve step */
        st = rpc_begin(args->client_id, args->task_id, args->flags);
    if (!st)
        return 0;
    char q[8] = {};
    TP_DATA_LOC_READ_CONST(q, q_name, sizeof(q));
    st->sleep_class = sleep_class(q);
    st->sleep_start = bpf_ktime_get_ns();
    if (st->sleep_class >= SLEEP_BACKLOG && st->sleep_class <= SLEEP_PENDING)
        slots_change(args->client_id, st->sleep_class, 1, st->sleep_start);
    return 0;
}

TRACEPOINT_PROBE(sunrpc, rpc_task_wakeup)
{
    struct rpc_task_state *st = rpc_state(args->client_id, args->task_id);
    if (!st || !st->sleep_start)
        return 0;
    s64 now = bpf_ktime_get_ns();
    u64 slept = now - st->sleep_start;
    switch (st->sleep_class) {
    case SLEEP_BACKLOG: st->ev.backlog_sleep_ns += slept; break;
    case SLEEP_SESSION: st->ev.session_sleep_ns += slept; break;
    case SLEEP_SENDING: st->ev.sending_sleep_ns += slept; break;
    case SLEEP_PENDING: st->ev.pending_sleep_ns += slept; break;
    case SLEEP_DELAY: st->ev.delay_sleep_ns += slept; break;
    }
    if (st->sleep_class >= SLEEP_BACKLOG && st->sleep_class <= SLEEP_PENDING)
        slots_change(args->client_id, st->sleep_class, -1, now);
    st->sleep_start = 0;
    return 0;
}

TRACEPOINT_PROBE(sunrpc, xprt_reserve)
{
    struct rpc_task_state *st = rpc_state(args->client_id, args->task_id);
    if (!st)
        return 0;
    st->ev.ts_reserved = bpf_ktime_get_ns();
    st->ev.xid = args->xid;
    if (!st->has_slot) {
        st->has_slot = 1;
        struct client_slots *c = slots_change(args->client_id, SLEEP_NONE, 1, st->ev.ts_reserved);
        if (c) {
            __builtin_memcpy(&st->ev.taken_in_use, c, sizeof(*c));
            st->ev.slot_rows |= SLOT_ROW_TAKEN;
        }
    }
    return 0;
}

/* May fire in another task's context (the lock holder sends the queue): keyed, so fine. */
TRACEPOINT_PROBE(sunrpc, xprt_transmit)
{
    struct rpc_task_state *st = rpc_state(args->client_id, args->task_id);
    if (!st || args->status != 0)
        return 0;
    s64 now = bpf_ktime_get_ns();
    if (!st->ev.ts_first_tx)
        st->ev.ts_first_tx = now;
    st->ev.ts_last_tx = now;
    st->ev.transmits++;
    return 0;
}

#ifdef HAVE_xprt_retransmit
TRACEPOINT_PROBE(sunrpc, xprt_retransmit)
{
    struct rpc_task_state *st = rpc_state(args->client_id, args->task_id);
    if (st)
        st->ev.retransmits++;
    return 0;
}
#endif

#ifdef HAVE_rpc_timeout_status
TRACEPOINT_PROBE(sunrpc, rpc_timeout_status)
{
    struct rpc_task_state *st = rpc_state(args->client_id, args->task_id);
    if (st)
        st->ev.timeouts++;
    return 0;
}
#endif

/* The attempt is over: its slot is given back here, where its end is timed. Given back at
 * rpc_stats_latency with this time, the counts could include a wait for a slot that ended in
 * between, and the row would end the table's full time early (against the kernel's aggregate). */
TRACEPOINT_PROBE(sunrpc, rpc_task_end)
{
    struct rpc_task_state *st = rpc_state(args->client_id, args->task_id);
    if (!st)
        return 0;
    st->ev.status = args->status;
    st->ev.ts_end = bpf_ktime_get_ns();
    st->ev.complete = 1;
    if (st->has_slot) {
        st->has_slot = 0;
        struct client_slots *c = slots_change(args->client_id, SLEEP_NONE, -1, st->ev.ts_end);
        if (c) {
            __builtin_memcpy(&st->ev.freed_in_use, c, sizeof(*c));
            st->ev.slot_rows |= SLOT_ROW_FREED;
        }
    }
    return 0;
}

/* Once per attempt, right after rpc_task_end, with the numbers mountstats adds up. */
TRACEPOINT_PROBE(sunrpc, rpc_stats_latency)
{
    struct rpc_task_state *st = rpc_state(args->client_id, args->task_id);
    if (!st)
        return 0;
    if (!st->ev.ts_end)
        st->ev.ts_end = bpf_ktime_get_ns();
    struct rpc_event *e = rpc_ring.ringbuf_reserve(sizeof(struct rpc_event));
    if (e) {
        __builtin_memcpy(e, &st->ev, sizeof(*e));
        e->backlog_us = args->backlog;
        e->rtt_us = args->rtt;
        e->execute_us = args->execute;
        e->attempts = 1;
        e->xid = args->xid;
        e->complete = 1;
        rpc_ring.ringbuf_submit(e, wake_flags(RPC_RING_ID, RPC_RING_WAKE, 0));
    } else {
        count_loss(LOSS_RPC_RING_FULL);
    }
#ifdef AGGREGATE
    agg_rpc(&st->ev, args->rtt, args->execute);
#endif
    rpc_end(args->client_id, args->task_id);
    return 0;
}
