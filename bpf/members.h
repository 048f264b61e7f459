/* slotscope: prepended once when a kprobe group (which reads kernel struct members) loads. */

/* A kprobe's context (the architecture's, and light: it includes no linux/bpf.h). */
#include <asm/ptrace.h>

/* A kernel struct member, at the offset and of the size the running kernel gives it
 * (<NAME>_OFF, <NAME>_SIZE: from its BTF, or from its headers where it has none for the
 * module; agent/probes.py KprobeGroup.members), read into `dst`, which must be at least as
 * wide: a narrower member (rpc_wait_queue.qlen is 16 bits on some kernels, 32 on others)
 * lands zero-extended (little-endian), a wider one does not compile. */
#define KREAD(dst, base, NAME)                                                             \
    do {                                                                                   \
        _Static_assert(NAME##_SIZE <= sizeof(dst), #NAME " is wider than " #dst);          \
        __builtin_memset(&(dst), 0, sizeof(dst));                                          \
        bpf_probe_read_kernel(&(dst), NAME##_SIZE, (const char *)(base) + NAME##_OFF);     \
    } while (0)
