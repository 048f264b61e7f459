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

/* Members that lie close together, read with one helper call: the bytes from the lowest of
 * them to the end of the highest where that span is at most KSPAN_MAX bytes on this kernel
 * (offsets and sizes are constants: the compiler keeps one branch), else one call each. */
#define KSPAN_MAX 64
#define KEND(NAME) ((NAME##_OFF) + (NAME##_SIZE))
#define KMIN(a, b) ((a) < (b) ? (a) : (b))
#define KMAX(a, b) ((a) > (b) ? (a) : (b))
#define KSPAN_GET(dst, span, lo, NAME)                                                     \
    do {                                                                                   \
        _Static_assert(NAME##_SIZE <= sizeof(dst), #NAME " is wider than " #dst);          \
        __builtin_memset(&(dst), 0, sizeof(dst));                                          \
        __builtin_memcpy(&(dst), (const char *)(span) + (NAME##_OFF) - (lo), NAME##_SIZE); \
    } while (0)
#define KREAD3(d1, N1, d2, N2, d3, N3, base)                                               \
    do {                                                                                   \
        const u32 lo_ = KMIN(KMIN(N1##_OFF, N2##_OFF), N3##_OFF);                          \
        const u32 hi_ = KMAX(KMAX(KEND(N1), KEND(N2)), KEND(N3));                          \
        if (hi_ - lo_ <= KSPAN_MAX) {                                                      \
            u64 span_[KSPAN_MAX / 8];                                                      \
            bpf_probe_read_kernel(span_, hi_ - lo_, (const char *)(base) + lo_);           \
            KSPAN_GET(d1, span_, lo_, N1);                                                 \
            KSPAN_GET(d2, span_, lo_, N2);                                                 \
            KSPAN_GET(d3, span_, lo_, N3);                                                 \
        } else {                                                                           \
            KREAD(d1, base, N1);                                                           \
            KREAD(d2, base, N2);                                                           \
            KREAD(d3, base, N3);                                                           \
        }                                                                                  \
    } while (0)
#define KREAD2(d1, N1, d2, N2, base) KREAD3(d1, N1, d2, N2, d2, N2, base)
