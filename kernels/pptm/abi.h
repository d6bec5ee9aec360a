/*
 * pptm host <-> device ABI: the single source of truth for every layout the host and the
 * persistent manifold kernel share. The Rust side (runtime/src/gpu/abi_generated.rs) is generated
 * from this file by `cargo xtask abi`; `cargo xtask abi --check` (run by CI) fails when the two
 * differ, and the generated file carries layout assertions that fail to compile if a field moves.
 *
 * Queue protocol (io_uring-like; see runtime/src/gpu/queue.rs for the host half):
 *
 *   Submission ring (SQ): `queue_slots` slots of pptm_sq_slot in mapped pinned host memory.
 *     Owner: the host writes, the device only reads. Item number `seq` lives in slot
 *     seq & (queue_slots - 1). A slot holds one pptm_desc (32 u32 words) spread over 32 u64 words:
 *     word i = (payload_u32[i] << 32) | tag(seq). Each 8-byte word is written and read as one
 *     single-copy-atomic access, so a reader that sees the expected tag in the low half of a word
 *     also sees that word's payload: the device needs one PCIe read round trip per slot, not two
 *     (poll a flag, then read the body). tag(seq) = (seq >> log2(queue_slots)) % 0xFFFFFFFF + 1,
 *     never 0 (freshly zeroed memory is "empty") and different on every reuse of a slot.
 *
 *   Completion ring (CQ): `queue_slots` entries of pptm_cq_entry in mapped pinned host memory.
 *     Owner: the device writes, the host only reads. Item `seq` completes into entry
 *     seq & (queue_slots - 1): the body first, then `seq_plus_one` with st.release.sys. The host
 *     reads `seq_plus_one` with an acquire load and the body after it.
 *
 *   Flow control: the host reuses slot s & (N-1) for item s only after it has read the completion
 *     of item s - N. Since the device completes items in order and reads an item before it completes
 *     it, neither ring can overrun the other side.
 *
 *   Inside the grid: block 0 (the leader) copies ready SQ slots into the stage ring in device memory
 *     and publishes `staged` (st.release.gpu). Every block runs item `seq` once `staged > seq` and
 *     `completed == seq`, then arrives on the monotonic `arrivals` counter (atom.acq_rel.gpu). The
 *     block whose arrival is number (seq + 1) * nblocks - 1 is last: it combines the per-block
 *     partials, writes the completion entry, and publishes `completed = seq + 1`. No grid barrier.
 */
#ifndef PPTM_ABI_H
#define PPTM_ABI_H

#if defined(__CUDACC_RTC__)
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif

/* Bumped whenever any layout below changes. */
#define PPTM_ABI_VERSION 2u

/* Argument words in a descriptor: device pointers, element counts and f32 scalars (as bits). */
#define PPTM_DESC_ARGS 15u
/* u64 words in a submission slot: one per u32 word of pptm_desc. */
#define PPTM_SQ_SLOT_WORDS 32u
/* Items the leader may stage ahead of the item that runs. */
#define PPTM_STAGE_SLOTS 64u
/* Most blocks a manifold grid may have (sizes the partials array). */
#define PPTM_MAX_BLOCKS 1024u

/* Opcodes below PPTM_OP_FIRST_VARIANT are built into every manifold; fused variants use
 * opcodes derived from their chain's spec hash, always >= PPTM_OP_FIRST_VARIANT. */
#define PPTM_OP_NOOP 0u
#define PPTM_OP_SHUTDOWN 1u
#define PPTM_OP_FIRST_VARIANT 16u

/* Completion status words. */
#define PPTM_STATUS_OK 0u
#define PPTM_STATUS_BAD_OPCODE 1u

/* One work item as the host writes it (128 bytes). */
typedef struct pptm_desc {
    uint32_t opcode;
    uint32_t flags;
    uint64_t args[PPTM_DESC_ARGS];
} pptm_desc;

/* One submission slot (256 bytes): a pptm_desc, tagged word by word (see the protocol above). */
typedef struct pptm_sq_slot {
    uint64_t words[PPTM_SQ_SLOT_WORDS];
} pptm_sq_slot;

/* One completion entry (64 bytes, one cache line). */
typedef struct pptm_cq_entry {
    uint64_t seq_plus_one; /* written last (st.release.sys); 0 = never written */
    uint32_t status;       /* PPTM_STATUS_* */
    uint32_t opcode;       /* echo of the descriptor's opcode */
    double value;          /* scalar result of a reducing chain, else 0 */
    uint64_t reserved[5];
} pptm_cq_entry;

/* Host <-> device control words, in mapped host memory after the CQ (one 64-byte line each).
 * Start handshake: the host waits for `started` after launching; a manifold that cannot become
 * resident in time (the GPU is full of other persistent kernels) is abandoned by setting `cancel`,
 * and exits at once if it ever starts. */
typedef struct pptm_host_control {
    uint64_t started; /* the device writes 1 (st.release.sys) when every block is resident */
    uint64_t pad_started[7];
    uint64_t cancel; /* the host writes 1 to make a manifold that has not started exit at once */
    uint64_t pad_cancel[7];
} pptm_host_control;

/* Grid-wide state in device memory, zeroed before launch. Each counter has its own 128-byte line. */
typedef struct pptm_device_state {
    uint64_t staged; /* items copied from the SQ into `stage` (block 0 writes, release.gpu) */
    uint64_t pad_staged[15];
    uint64_t completed; /* items fully completed (the last arriver writes, release.gpu) */
    uint64_t pad_completed[15];
    uint64_t arrivals; /* monotonic count of block arrivals, nblocks per item */
    uint64_t pad_arrivals[15];
    uint64_t decision; /* block 0's start decision for every block: 1 run, 2 cancelled */
    uint64_t resident; /* blocks that have entered the kernel (start handshake) */
    uint64_t pad_resident[14];
    pptm_desc stage[PPTM_STAGE_SLOTS]; /* item seq is at stage[seq % PPTM_STAGE_SLOTS] */
    double partials[PPTM_MAX_BLOCKS];  /* per-block partial results of the running item */
} pptm_device_state;

/* The manifold kernel's only parameter, passed by value at launch. */
typedef struct pptm_manifold_params {
    pptm_sq_slot* sq;
    pptm_cq_entry* cq;
    pptm_host_control* control;
    pptm_device_state* state;
    uint32_t queue_slots;      /* power of two */
    uint32_t queue_slots_log2;
    uint32_t hot_polls;        /* empty polls of the SQ before the leader starts to back off */
    uint32_t max_backoff_ns;   /* longest sleep between two polls when idle */
} pptm_manifold_params;

#endif /* PPTM_ABI_H */
