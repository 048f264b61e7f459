/* slotscope: prepended once when a kprobe group includes the kernel's headers (no BTF for
 * its module: agent/probes.py KprobeGroup.btf). */
/* Newer kernels' linux/bpf.h takes the size of these; an older BCC's copy of the uapi
 * bpf.h lacks them (agent/kernel.py: bpf_structs_bcc_lacks). Never read here. */
#ifdef OPAQUE_BPF_WQ
struct bpf_wq { __u64 __opaque[2]; } __attribute__((aligned(8)));
#endif
#ifdef OPAQUE_BPF_RB_ROOT
struct bpf_rb_root { __u64 __opaque[2]; } __attribute__((aligned(8)));
#endif
#ifdef OPAQUE_BPF_RB_NODE
struct bpf_rb_node { __u64 __opaque[4]; } __attribute__((aligned(8)));
#endif
#ifdef OPAQUE_BPF_REFCOUNT
struct bpf_refcount { __u32 __opaque[1]; } __attribute__((aligned(4)));
#endif
