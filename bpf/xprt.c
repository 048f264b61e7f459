/*
 * slotscope: each transport's own slot counters (kprobes on xprt_reserve and
 * xprt_free_slot; struct rpc_xprt read at this kernel's offsets, bpf/members.h):
 * num_reqs, max_reqs, min_reqs and the backlog, sending and pending queue
 * lengths, per transport id, sampled as each slot is given back, before the change
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
    KREAD(e->sending, xprt, RPC_XPRT_SENDING_QLEN);
    KREAD(e->pending, xprt, RPC_XPRT_PENDING_QLEN);
    xprt_ring.ringbuf_submit(e, wake_flags(XPRT_RING_ID, XPRT_RING_WAKE, 0));
}

/* The task's transport, in its record. */
int kprobe__xprt_reserve(struct pt_regs *ctx, void *task)
{
    void *xprt, *clnt;
    u16 task_id;
    KREAD3(xprt, RPC_TASK_TK_XPRT, clnt, RPC_TASK_TK_CLIENT, task_id, RPC_TASK_TK_PID, task);
    if (!xprt)
        return 0;
    struct rpc_task_state *st = rpc_state(client_ident(clnt), task_id);
    if (st)
        st->ev.xprt_id = xprt_ident(xprt);
    return 0;
}

static __always_inline int give_back(void *xprt, void *req)
{
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
