/* slotscope: what every probe group shares. */

/* Events lost, per counter (LOSS_* from the generated header), per CPU. */
BPF_PERCPU_ARRAY(loss, u64, LOSS_NCOUNTERS);

static __always_inline void count_loss(int idx)
{
    u64 *v = loss.lookup(&idx);
    if (v)
        (*v)++;
}
