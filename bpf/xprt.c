/*
 * slotscope: each transport's own slot counters (kprobes on xprt_reserve and
 * xprt_free_slot; struct rpc_xprt read through the running kernel's headers):
 * num_reqs, max_reqs, min_reqs and the backlog, sending and pending queue
 * lengths, per transport id, sampled every time a task asks for a slot or one
 * is given back (before the change: every slot taken is given back, so the
 * samples see each peak). Also which transport each RPC used, in its rpc_tasks
 * entry (bpf/sunrpc.c, loaded with this program). Not xprt_alloc_slot: a task
 * arriving at a congested transport goes to the backlog without calling it.
 */
#include <linux/sunrpc/clnt.h>
#include <linux/sunrpc/sched.h>
#include <linux/sunrpc/xprt.h>

BPF_RINGBUF_OUTPUT(xprt_ring, XPRT_RING_PAGES);

/* qlen is an unsigned short up to 6.8 and an unsigned int after (and in backports):
 * read its own size into a zeroed u32 (little-endian). */
#define QLEN_SIZE sizeof(((struct rpc_wait_queue *)0)->qlen)
#define READ_QLEN(dst, queue)                                              \
    do {                                                                   \
        u32 q = 0;                                                         \
        bpf_probe_read_kernel(&q, QLEN_SIZE, &queue.qlen);                 \
        dst = q;                                                           \
    } while (0)

/* The kernel's transport id (5.15+); before it, bits of the transport's address: unique
 * while it lives (probes.py XprtProbes.optional_members). */
static __always_inline u32 xprt_ident(struct rpc_xprt *xprt)
{
#ifdef HAVE_RPC_XPRT_ID
    u32 id = 0;
    bpf_probe_read_kernel(&id, sizeof(id), &xprt->id);
    return id;
#else
    return ((u64)xprt >> 6) & 0x7fffffff;
#endif
}

static __always_inline u32 task_client_id(struct rpc_task *task)
{
    struct rpc_clnt *clnt = 0;
    u32 id = 0;
    bpf_probe_read_kernel(&clnt, sizeof(clnt), &task->tk_client);
    if (clnt)
        bpf_probe_read_kernel(&id, sizeof(id), &clnt->cl_clid);
    return id;
}

static __always_inline void xprt_sample(struct rpc_xprt *xprt, u32 client_id, u8 alloc)
{
    struct xprt_event *e = xprt_ring.ringbuf_reserve(sizeof(struct xprt_event));
    if (!e) {
        count_loss(LOSS_XPRT_RING_FULL);
        return;
    }
    e->ts = bpf_ktime_get_ns();
    e->client_id = client_id;
    e->alloc = alloc;
    e->xprt_id = xprt_ident(xprt);
    bpf_probe_read_kernel(&e->num_reqs, sizeof(e->num_reqs), &xprt->num_reqs);
    bpf_probe_read_kernel(&e->max_reqs, sizeof(e->max_reqs), &xprt->max_reqs);
    bpf_probe_read_kernel(&e->min_reqs, sizeof(e->min_reqs), &xprt->min_reqs);
    READ_QLEN(e->backlog, xprt->backlog);
    READ_QLEN(e->sending, xprt->sending);
    READ_QLEN(e->pending, xprt->pending);
    xprt_ring.ringbuf_submit(e, wake_flags(XPRT_RING_ID, XPRT_RING_WAKE, 0));
}

/* Every task asks here (call_reserve), also while the transport is congested, when it
 * goes straight to the backlog without calling the allocator. */
int kprobe__xprt_reserve(struct pt_regs *ctx, struct rpc_task *task)
{
    struct rpc_xprt *xprt = 0;
    bpf_probe_read_kernel(&xprt, sizeof(xprt), &task->tk_xprt);
    if (!xprt)
        return 0;
    u32 client_id = task_client_id(task);
    unsigned short task_id = 0;
    bpf_probe_read_kernel(&task_id, sizeof(task_id), &task->tk_pid);
    struct rpc_task_state *st = rpc_state(client_id, task_id);
    if (st)
        st->ev.xprt_id = xprt_ident(xprt);
    xprt_sample(xprt, client_id, 1);
    return 0;
}

int kprobe__xprt_free_slot(struct pt_regs *ctx, struct rpc_xprt *xprt, struct rpc_rqst *req)
{
    struct rpc_task *task = 0;
    bpf_probe_read_kernel(&task, sizeof(task), &req->rq_task);
    xprt_sample(xprt, task ? task_client_id(task) : 0, 0);
    return 0;
}
