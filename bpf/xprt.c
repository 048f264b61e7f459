/*
 * slotscope: each transport's own slot counters (kprobes on xprt_reserve and
 * xprt_free_slot; struct rpc_xprt read at this kernel's offsets, bpf/members.h):
 * num_reqs, max_reqs, min_reqs and the backlog's length (the sending and pending
 * queues' are in the slots rows, per client: a read of each, ~100 instructions a WRITE,
 * gave no finding more), per transport id, sampled as each slot is given back, before the change
 * (xprt_free_slot; an RDMA transport's xprt_rdma_free_slot, where rpcrdma is loaded at the start).
 * num_reqs falls only there, so these samples see each of its peaks; the backlog, which
 * a give-back drains, is seen at its height before each. (A sample as each task asked
 * too, as before, saw no more at twice the cost; a backlog that begins while no slot is
 * given back, a frozen server, shows from the next give-back: the slots rows of
 * bpf/sunrpc.c have its start.) At xprt_reserve, which every task calls (call_reserve),
 * also when it goes straight to a congested transport's backlog, the RPC's transport
 * goes into its rpc_tasks entry (bpf/sunrpc.c, loaded with this program).
 */

BPF_RINGBUF_OUTPUT(xprt_ring, XPRT_RING_PAGES);

/* The kernel's transport id (5.15+); before it, bits of the transport's address: unique
 * while it lives (probes.py XprtProbes.optional_members). */
static __always_inline u32 xprt_ident(void *xprt)
{
#ifdef HAVE_RPC_XPRT_ID
    u32 id;
    KREAD(id, xprt, RPC_XPRT_ID);
    return id;
#else
    return ((u64)xprt >> 6) & 0x7fffffff;
#endif
}

static __always_inline u32 client_ident(void *clnt)
{
    u32 id = 0;
    if (clnt)
        KREAD(id, clnt, RPC_CLNT_CL_CLID);
    return id;
}

/* Each transport's id and the client of its latest request, at an index of its address, left by
 * the request: the give-back that follows reads neither (four helper reads of ~100
 * instructions: the task, its client, the client's id, the transport's), nor, where xprt_free is
 * probed, do the transport's next requests read its id. `check` ties the entry together: one
 * written by two CPUs at once (two transports at one index, or one transport's two clients)
 * does not pass, and the id is read as before. */
struct xprt_seen {
    u64 xprt;
    u64 check;
    u32 id;
    u32 client_id;
};
#define XPRTS_SEEN 256
BPF_ARRAY(xprts_seen, struct xprt_seen, XPRTS_SEEN);

static __always_inline u64 seen_check(u64 xprt, u32 id, u32 client_id)
{
    return xprt ^ (((u64)id << 32) | client_id) ^ 0x9e3779b97f4a7c15ULL;
}

static __always_inline struct xprt_seen *seen_slot(void *xprt)
{
    u32 i = ((u64)xprt >> 6) % XPRTS_SEEN;
    return xprts_seen.lookup(&i);
}

/* Whether `k`, a copy of an entry (what is checked is what is used), is the transport's. */
static __always_inline int seen_holds(struct xprt_seen k, void *xprt)
{
    return k.xprt == (u64)xprt && k.check == seen_check(k.xprt, k.id, k.client_id);
}

static __always_inline void xprt_sample(void *xprt, u32 xprt_id, u32 client_id)
{
    struct xprt_event *e = xprt_ring.ringbuf_reserve(sizeof(struct xprt_event));
    if (!e) {
        count_loss(LOSS_XPRT_RING_FULL);
        return;
    }
    e->ts = bpf_ktime_get_ns();
    e->client_id = client_id;
    e->alloc = 0;   /* a give-back's (1 marked a task's request, in captures that sampled those) */
    e->xprt_id = xprt_id;
    KREAD3(e->num_reqs, RPC_XPRT_NUM_REQS, e->max_reqs, RPC_XPRT_MAX_REQS, e->min_reqs, RPC_XPRT_MIN_REQS, xprt);
    KREAD(e->backlog, xprt, RPC_XPRT_BACKLOG_QLEN);
    xprt_ring.ringbuf_submit(e, wake_flags(XPRT_RING_ID, XPRT_RING_WAKE, 0));
}

/* The task's client id: left by its call_reserve step, which runs just before xprt_reserve on
 * this CPU (bpf/sunrpc.c), where that was this task's; else read from its client. */
static __always_inline u32 task_client(u16 task_id, void *clnt)
{
#ifdef CALL_RESERVE_ADDR   /* else sunrpc.c cannot tell that step */
    int zero = 0;
    struct reserving *r = reserving.lookup(&zero);
    if (r && r->live && (u16)r->task_id == task_id) {
        r->live = 0;
        return r->client_id;
    }
#endif
    return client_ident(clnt);
}

/* The transport's id: its entry's, where xprt_free clears the entry of a transport freed (whose
 * address a new one may take); else read from it. */
static __always_inline u32 task_xprt(void *xprt, struct xprt_seen *s)
{
#ifdef XPRT_FREE_PROBED
    if (s) {
        struct xprt_seen k = *s;
        if (seen_holds(k, xprt))
            return k.id;
    }
#endif
    return xprt_ident(xprt);
}

/* The task's transport, in its record. */
int kprobe__xprt_reserve(struct pt_regs *ctx, void *task)
{
    void *xprt, *clnt;
    u16 task_id;
    KREAD3(xprt, RPC_TASK_TK_XPRT, clnt, RPC_TASK_TK_CLIENT, task_id, RPC_TASK_TK_PID, task);
    if (!xprt)
        return 0;
    struct xprt_seen *s = seen_slot(xprt);
    u32 client_id = task_client(task_id, clnt), xprt_id = task_xprt(xprt, s);
    struct rpc_task_state *st = rpc_state(client_id, task_id);
    if (st)
        st->ev.xprt_id = xprt_id;
    if (s && !(seen_holds(*s, xprt) && s->id == xprt_id && s->client_id == client_id)) {
        s->xprt = (u64)xprt;
        s->id = xprt_id;
        s->client_id = client_id;
        s->check = seen_check((u64)xprt, xprt_id, client_id);
    }
    return 0;
}

static __always_inline int give_back(void *xprt, void *req)
{
    struct xprt_seen *s = seen_slot(xprt);
    if (s) {
        struct xprt_seen k = *s;
        if (seen_holds(k, xprt)) {
            xprt_sample(xprt, k.id, k.client_id);
            return 0;
        }
    }
    void *task, *clnt = 0;
    KREAD(task, req, RPC_RQST_RQ_TASK);
    if (task)
        KREAD(clnt, task, RPC_TASK_TK_CLIENT);
    xprt_sample(xprt, xprt_ident(xprt), client_ident(clnt));
    return 0;
}

int kprobe__xprt_free_slot(struct pt_regs *ctx, void *xprt, void *req)
{
    return give_back(xprt, req);
}

#ifdef XPRT_RDMA_FREE_SLOT
/* An RDMA transport's slots go back through rpcrdma's own function (same arguments). */
int kprobe__xprt_rdma_free_slot(struct pt_regs *ctx, void *xprt, void *req)
{
    return give_back(xprt, req);
}
#endif

#ifdef XPRT_FREE_PROBED
/* A transport freed: its entry no longer names it (task_xprt). */
int kprobe__xprt_free(struct pt_regs *ctx, void *xprt)
{
    struct xprt_seen *s = seen_slot(xprt);
    if (s && s->xprt == (u64)xprt)
        s->check = 0;
    return 0;
}
#endif
