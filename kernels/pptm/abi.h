/*
 * pptm host <-> device ABI: the single source of truth for every layout the host and the
 * persistent manifold kernel share. The Rust side (runtime/src/gpu/abi_generated.rs) is generated
 * from this file by `cargo xtask abi`; `cargo xtask abi --check` (run by CI) fails when the two
 * differ, and the generated file carries layout assertions that fail to compile if a field moves.
 *
 * Tagged words. Every ring below carries its payload in 8-byte words of the form
 *     (payload_u32 << 32) | tag,
 * written and read as single-copy-atomic 8-byte accesses. A reader that finds the tag it expects
 * in every word of an entry has the whole entry: one memory round trip, no "flag then body"
 * second read, and no release/acquire fence between body and flag on the writer's side.
 * tag(seq, slots) = (seq >> log2(slots)) % 0xFFFFFFFF + 1: never 0 (zeroed memory is "empty"),
 * and different on each reuse of a slot.
 *
 * Queue protocol (io_uring-like; the host half is runtime/src/gpu/queue.rs):
 *
 *   Submission ring (SQ), mapped pinned host memory, `queue_slots` pptm_sq_slot. The host writes,
 *     the device only reads. Item `seq` lives in slot seq & (queue_slots - 1): the 32 u32 words of
 *     its pptm_desc, tagged.
 *   Completion ring (CQ), mapped pinned host memory, `queue_slots` pptm_cq_entry. The device
 *     writes, the host only reads. Item `seq` completes into entry seq & (queue_slots - 1): words
 *     0..5 carry status, opcode, the low and high halves of the f64 result, the item's device
 *     time and its product paths, tagged.
 *   Flow control: the host reuses slot s & (N-1) for item s only after it has read the completion
 *     of item s - N. The device reads an item before it completes it, so neither side can overrun
 *     the other; completions may arrive out of order (independent items, below), each in its own
 *     entry.
 *
 * Inside the grid (kernels/pptm/manifold.cuh): the grid is `compute blocks + 1`. One block is the
 *   fetcher: it polls the SQ (several slots ahead in one PCIe round trip), chooses the compute
 *   blocks of each item (placement, below) and copies the descriptors, tagged again, into the stage
 *   ring in device memory; it never computes, so PCIe latency stays off the compute path.
 *
 *   Ordering. An item is a *barrier* (the default) or *independent* (the host sets
 *   PPTM_BLOCKS_INDEPENDENT in pptm_desc.blocks: its buffers are disjoint from those of every item
 *   in flight, which Rust's borrows guarantee for tickets). A barrier starts once every earlier
 *   item has completed (`completed == seq`) and no later item starts before it completes: a
 *   sequence of barriers runs exactly in order. An independent item starts once the latest barrier
 *   before it has completed and its blocks are free: small independent items run side by side.
 *
 *   Placement. Item seq runs on compute blocks first .. first + blocks - 1 (pptm_desc.blocks: a
 *   no-op or a small input needs one block, a large input all of them). A barrier takes blocks
 *   from 0; independent items take the blocks after the previous independent item's, from 0 again
 *   where they would pass the last block. The fetcher writes its choice into the staged copy of
 *   word 1 (PPTM_STAGED_*); blocks outside the range skip the item.
 *
 *   Completion. Each participating block arrives on arrivals[seq % STAGE_SLOTS]; the last one
 *   combines the partials, resets the counter and writes the completion entry. `completed` counts
 *   the items before which every item has completed (the watermark): a barrier's last block
 *   publishes `completed = seq + 1` itself; an independent item's marks finished[seq % SLOTS] and
 *   the block that finds the watermark at a finished item moves it past every finished item, one
 *   at a time under the `sweeping` lock (manifold.cuh, pptm_complete_independent). A block that
 *   finds `completed` beyond its own position jumps ahead (those items finished without it). No
 *   grid barrier anywhere.
 */
#ifndef PPTM_ABI_H
#define PPTM_ABI_H

#if defined(__CUDACC_RTC__)
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif

/* Bumped whenever any layout below changes. */
#define PPTM_ABI_VERSION 17u

/* Argument words in a descriptor: device pointers, element counts and f32 scalars (as bits). */
#define PPTM_DESC_ARGS 15u
/* u64 words in a submission slot: one per u32 word of pptm_desc. */
#define PPTM_SQ_SLOT_WORDS 32u
/* Items the leader may stage ahead of the item that runs. */
#define PPTM_STAGE_SLOTS 64u
/* Most compute blocks a manifold grid may have (sizes the partials array). */
#define PPTM_MAX_BLOCKS 1024u

/* Most fetcher warps that poll the SQ. */
#define PPTM_MAX_POLLERS 8u

/* Opcodes below PPTM_OP_FIRST_VARIANT are built into every manifold; fused variants use
 * opcodes derived from their chain's spec hash, always >= PPTM_OP_FIRST_VARIANT. */
#define PPTM_OP_NOOP 0u
#define PPTM_OP_SHUTDOWN 1u
/* Waits until the u64 at args[0] (8-byte aligned, device-visible: mapped host or device memory)
 * holds a value >= args[1], then completes; the items after it in the queue start only then.
 * Reports progress to the watchdog while it waits, for at most args[2] ns; after that a wait that
 * still has not ended counts as a hang. The host submits these to order items after work on an
 * application's CUDA stream (the stream writes the word: cuStreamWriteValue64). */
#define PPTM_OP_WAIT_VALUE 2u
/* A plan (a pipeline's items of this domain, dispatched as one item; see pptm_plan_step below):
 * args[0] steps, args[1] byte offset of its region in the device plan arena, args[2] byte offset
 * of its region in the host plan arena, args[3] its id (never 0, unique in the process per
 * dispatch; the plans of one dispatch share it), args[4] how long (ns) its waits for other domains
 * report progress to the watchdog, args[5] the partial slots (f64) its steps of more than one
 * block need, args[6] 1 when the device region holds the steps already (a kept pipeline run again:
 * block 0 only zeroes the counters), 0 when block 0 copies them from the host region. `blocks`:
 * the most any of its steps runs on. */
#define PPTM_OP_PLAN 3u
/* Steps that exist only inside a plan. PLAN_WAIT: every block of the plan waits until the u64 at
 * args[0] (device memory) holds this plan's own id (args[2] = 1: the `done` word of another plan
 * of the same dispatch, which holds their shared id once the step is done; ids are unique per
 * dispatch, while a region's words keep the ids of dispatches that used it before) or at least
 * args[1] (args[2] = 0: a manifold's signal word), reporting progress for at most the plan's
 * patience. PLAN_LOOP: closes a loop over steps args[0] .. this one: after a
 * barrier of the plan's blocks, runs them again unless args[1] iterations have run or, with
 * args[2] = k + 1, step k's value is below the f64 args[3]; its value is the iterations run.
 * PLAN_WHEN: opens a conditional body, steps this one + 1 .. args[0] - 1: after a barrier of the
 * plan's blocks, runs them if step args[1] - 1's value is at least the f64 args[2] (not when it
 * is NaN), else goes on at step args[0], publishing the skipped steps' `finished` and `done`
 * words as if they had run; its value counts the times its body ran (loop iterations). */
#define PPTM_OP_PLAN_WAIT 4u
#define PPTM_OP_PLAN_LOOP 5u
#define PPTM_OP_PLAN_WHEN 6u
/* Fault injection (the host submits these only with the `fault-injection` feature), to prove the
 * watchdog and fault handling: HANG spins on the participating blocks until the host aborts the
 * manifold; SLOW runs for args[0] ns, reporting progress every 100 us (a long legitimate item);
 * FAULT stores to args[0] + 4096 (the host passes 0: page 1, an illegal address; a real device
 * fault, sticky for the process). */
#define PPTM_OP_DEBUG_HANG 8u
#define PPTM_OP_DEBUG_SLOW 9u
#define PPTM_OP_DEBUG_FAULT 10u
#define PPTM_OP_FIRST_VARIANT 16u

/* Tagged u64 words per completion entry that carry data (status, opcode, value lo, value hi,
 * device time, product paths). */
#define PPTM_CQ_WORDS 6u

/* Product paths: which implementations of a matrix product an item ran (completion word 5 and
 * pptm_launch_out.paths, a bit set; 0 for an item with no product stage). The choice is made from
 * the item's shapes and pointers alone, so every block of an item makes the same one and the
 * last block to finish reports its own. Tests and benchmarks read it to know which precision a
 * result carries (fp8 wgmma adds in reduced precision) and that a shape reached the path meant
 * for it. */
#define PPTM_PATH_CUDA_CORES 1u /* f32 tiles on CUDA cores (pattern/linear.cuh) */
#define PPTM_PATH_MMA_SYNC 2u   /* mma.sync tensor cores (pattern/mma.cuh) */
#define PPTM_PATH_WGMMA 4u      /* Hopper's wgmma with TMA, 16-bit operands (pattern/wgmma.cuh) */
#define PPTM_PATH_WGMMA_FP8 8u  /* Hopper's wgmma, e4m3 operands (pattern/wgmma.cuh) */

/* Completion status words. */
#define PPTM_STATUS_OK 0u
#define PPTM_STATUS_BAD_OPCODE 1u
/* An argument failed the device's own checks (a pointer not aligned to its element, a length
 * beyond 2^48): the item did not run. The host validates every argument before submitting, so
 * this means a descriptor built around that validation. */
#define PPTM_STATUS_BAD_ARGUMENT 2u
/* The item stopped because the host aborted the manifold (watchdog): never completes normally. */
#define PPTM_STATUS_ABORTED 3u
/* A stage declared `finite = true` produced a NaN or an infinity. The item ran to the end: its
 * outputs are written, its value is what was computed. */
#define PPTM_STATUS_NON_FINITE 4u

/* One work item as the host writes it (128 bytes). */
/* In pptm_desc.blocks from the host: the item is independent of every item in flight (see the
 * ordering rules above). Below it, the blocks asked for (0 or more than the grid: all). */
#define PPTM_BLOCKS_INDEPENDENT 0x80000000u
/* Word 1 of a staged descriptor, as the fetcher rewrites it: the blocks (1 .. PPTM_MAX_BLOCKS,
 * never more than the grid), the first of them, how many items before this one may still run when
 * it starts (`lag`: it waits for completed >= seq - lag; 0 for a barrier, at most
 * PPTM_STAGE_SLOTS), and PPTM_BLOCKS_INDEPENDENT as the host set it. */
#define PPTM_STAGED_BLOCKS(w) ((w) & 0x7FFu)
#define PPTM_STAGED_FIRST(w) (((w) >> 11) & 0x3FFu)
#define PPTM_STAGED_LAG(w) (((w) >> 21) & 0x7Fu)
#define PPTM_STAGED_WORD(blocks, first, lag, independent) \
    ((blocks) | ((first) << 11) | ((lag) << 21) | ((independent) ? PPTM_BLOCKS_INDEPENDENT : 0u))

typedef struct pptm_desc {
    uint32_t opcode;
    uint32_t blocks; /* compute blocks that run the item (0 or more than the grid: all), | PPTM_BLOCKS_INDEPENDENT */
    uint64_t args[PPTM_DESC_ARGS];
} pptm_desc;

/* ---- plans (PPTM_OP_PLAN) -------------------------------------------------------------------
 *
 * A plan runs many items on one manifold as one queue item: one dispatch, one completion, and
 * between dependent steps a wait on the device instead of a host round trip.
 *
 * Memory. The host writes the steps into its plan arena (mapped pinned memory) and submits the
 * plan item; the plan's block 0 copies them into the device plan arena (all its threads, many
 * loads in flight: one PCIe round trip for a few hundred steps; not when args[6] says the device
 * region holds them from an earlier run of the same plan) and zeroes the plan's counters,
 * then publishes `plan_copied` (device state), which the plan's other blocks wait for. It zeroes
 * the results too: a step that never ran (a PLAN_WHEN body skipped) reports end = 0. Device
 * region, from args[1]:
 *     header (128 bytes: [0] the plan's barrier counter, [1] its first failure) | steps[n]
 *     | arrivals[n] | finished[n] | done[n] | results[n] (pptm_plan_result) | partials (f64, per
 *     step with more than one block)
 * The steps' results are kept in device memory while the plan runs (a loop's condition reads a
 * value there) and copied to the host region by the plan's last block, before the system fence
 * of its completion.
 * Host region, from args[2]: steps[n] | results[n + 1] (pptm_plan_result; results[n] sums the
 * plan up: the first failure by time, its status and its step as the value, -1 when none; the
 * plan's start and end). The host reuses either
 * region only once every plan that refers to it has completed.
 *
 * Order. Every block of the plan (0 .. blocks-1) walks the steps in order and runs its share of
 * each step it takes part in (blocks 0 .. step blocks - 1). Before a step:
 *   PPTM_SYNC_NONE     nothing: the step reads nothing an earlier step wrote, or reads it only
 *                      where the same block wrote it (the host proved the tiles line up);
 *   PPTM_SYNC_DEPS     each listed step has finished (its `finished` word reached 1, or the
 *                      running loop's iteration + 1 for a step of the loop: PPTM_DEP_IN_LOOP);
 *   PPTM_SYNC_BARRIER  every block of the plan has finished every earlier step.
 * A step's last arriving block publishes, as its flags ask, `finished` (release, gpu scope) and
 * the plan id in `done` (release), which another domain's PLAN_WAIT step acquires, as soon as it
 * has arrived (what waiters need is the memory every block stored); then it combines the partials
 * and stores the step's value and result (a PLAN_LOOP step publishes once the loop has ended). Only the plan's own completion is
 * written at system scope, after one system fence. A failed step (a status other than OK) does
 * not stop the plan: the host reports the first one. */
#define PPTM_SYNC_NONE 0u
#define PPTM_SYNC_DEPS 1u
#define PPTM_SYNC_BARRIER 2u
#define PPTM_PLAN_DEPS 4u
#define PPTM_DEP_IN_LOOP 0x80000000u
#define PPTM_DEP_NONE 0xFFFFFFFFu
#define PPTM_PLAN_HEADER_BYTES 128u
/* Step flags: a later step of the plan waits for this one's `finished` word (PPTM_SYNC_DEPS), or
 * another domain's plan for its `done` word. Unflagged steps publish neither: a one-block step
 * then ends with no fence at all. */
#define PPTM_STEP_FINISHED 1u
#define PPTM_STEP_DONE 2u
/* A light step: a map-pattern step with no reduction that nothing waits for (neither flag above).
 * Its blocks never meet: each block, done with its share, folds its status, paths and end into the
 * step's result with relaxed reductions (max, or, max) and goes on to its next step at once. The
 * result (zeroed at the plan's start) then holds the worst status of any block and iteration, and
 * the latest end. */
#define PPTM_STEP_LIGHT 4u
/* With PPTM_STEP_LIGHT: the chain checks its values are finite (`finite = true`), so the block's
 * threads meet before its status is folded; without it a light step has no barrier of its own. */
#define PPTM_STEP_CHECKS_FINITE 8u

/* One step of a plan (192 bytes). */
typedef struct pptm_plan_step {
    pptm_desc desc;                  /* the item as it would be submitted alone, or PLAN_WAIT/PLAN_LOOP */
    uint32_t sync;                   /* PPTM_SYNC_* */
    uint32_t flags;                  /* PPTM_STEP_*: what it publishes when it has finished */
    uint32_t partials;               /* first of its partial slots (f64) in the region's partials */
    uint32_t reserved0;
    uint32_t deps[PPTM_PLAN_DEPS];   /* with PPTM_SYNC_DEPS: earlier steps (| PPTM_DEP_IN_LOOP), or PPTM_DEP_NONE */
    uint32_t reserved[8];
} pptm_plan_step;

/* What a step left (32 bytes), in the host region, written at the step's end (the last loop
 * iteration's stays). Visible to the host once the plan has completed. */
typedef struct pptm_plan_result {
    uint32_t status; /* PPTM_STATUS_* */
    uint32_t paths;  /* PPTM_PATH_* */
    double value;    /* the step's scalar (a reducing chain), the iterations of a PLAN_LOOP, else 0 */
    uint64_t start;  /* %globaltimer when block 0 took the step */
    uint64_t end;    /* %globaltimer when its last block finished it (a light step: the latest block) */
} pptm_plan_result;

/* One submission slot (256 bytes): a pptm_desc, one tagged word per u32 (see above). Also the
 * layout of a stage-ring slot in device memory. */
typedef struct pptm_sq_slot {
    uint64_t words[PPTM_SQ_SLOT_WORDS];
} pptm_sq_slot;

/* One completion entry (64 bytes, one cache line): tagged words
 *   [0] status (PPTM_STATUS_*)  [1] opcode (echo)  [2] result bits 0..31  [3] result bits 32..63
 *   [4] device time in ns (saturated at 2^32 - 1): %globaltimer from compute block 0 taking the
 *       item to the last block finishing it  [5] product paths (PPTM_PATH_*)
 * where the result is the f64 scalar of a reducing chain, else 0. */
typedef struct pptm_cq_entry {
    uint64_t words[PPTM_CQ_WORDS];
    uint64_t reserved[2];
} pptm_cq_entry;

/* Host <-> device control words, in mapped host memory after the CQ (one 64-byte line each).
 * Start handshake: the host waits for `started` after launching; a manifold that cannot become
 * resident in time (the GPU is full of other persistent kernels) is abandoned by setting `cancel`,
 * and exits at once if it ever starts.
 * Watchdog: a warp of the fetcher block mirrors the compute blocks' progress stamps (`beat`, below)
 * into `heartbeat` every ~50 us while they change, so the host sees progress inside long items
 * without a driver call. The host writes `abort` = 1 to make every block leave its loops and the
 * kernel return (items in flight never complete); the fetcher passes it on through `abort` in the
 * device state. */
typedef struct pptm_host_control {
    uint64_t started; /* the device writes 1 (st.release.sys) when every block is resident */
    uint64_t pad_started[7];
    uint64_t cancel; /* the host writes 1 to make a manifold that has not started exit at once */
    uint64_t pad_cancel[7];
    uint64_t heartbeat; /* the latest compute-block progress stamp (%globaltimer ns), st.relaxed.sys */
    uint64_t pad_heartbeat[7];
    uint64_t abort; /* the host writes 1: every block returns as soon as it can */
    uint64_t pad_abort[7];
} pptm_host_control;

/* Grid-wide state in device memory, zeroed before launch. Each counter has its own 128-byte line. */
typedef struct pptm_device_state {
    /* `completed` and `abort` are one 16-byte-aligned pair: compute blocks poll both, with the
     * stage slot, in one vector acquire (manifold.cuh, pptm_compute_wait). */
    uint64_t completed; /* items fully completed (the last arriver writes, release.gpu) */
    uint64_t abort;     /* 1 once the host asked for an abort (the fetcher writes; blocks poll it with `completed`) */
    uint64_t pad_completed[14];
    uint64_t arrivals[PPTM_STAGE_SLOTS]; /* per item (seq % STAGE_SLOTS): blocks that finished it; the last resets it */
    uint64_t decision; /* the fetcher's start decision for every block: 1 run, 2 cancelled */
    uint64_t resident; /* blocks that have entered the kernel (start handshake) */
    uint64_t pad_resident[14];
    uint64_t plan_copied; /* seq + 1 of the latest plan item whose steps block 0 copied in (release.gpu) */
    uint64_t pad_plan_copied[15];
    uint64_t sweeping; /* 1 while a block moves `completed` past finished independent items (a lock) */
    uint64_t pad_sweeping[15];
    uint64_t finished[PPTM_STAGE_SLOTS]; /* seq + 1 once independent item seq has completed (release.gpu) */
    pptm_sq_slot stage[PPTM_STAGE_SLOTS]; /* item seq, tagged, at stage[seq % PPTM_STAGE_SLOTS] */
    uint64_t started_ns[PPTM_STAGE_SLOTS]; /* %globaltimer when the item's first block took item seq (its arrival releases it) */
    /* Partial results of item seq's blocks, in partials[seq % PPTM_STAGE_SLOTS] (items side by
     * side, and a block that arrived and went on to a later item, never share a row). */
    double partials[PPTM_STAGE_SLOTS][PPTM_MAX_BLOCKS];
    uint32_t smid[PPTM_MAX_BLOCKS + 32];  /* the SM each block runs on (start-up role assignment) */
    uint64_t beat[PPTM_MAX_BLOCKS];       /* per compute block: %globaltimer at its latest tile (progress) */
} pptm_device_state;

/* The manifold kernel's only parameter, passed by value at launch. */
typedef struct pptm_manifold_params {
    pptm_sq_slot* sq;
    pptm_cq_entry* cq;
    pptm_host_control* control;
    pptm_device_state* state;
    uint32_t queue_slots;      /* power of two */
    uint32_t queue_slots_log2;
    uint32_t hot_polls;        /* empty polls of the SQ before the fetcher starts to back off */
    uint32_t max_backoff_ns;   /* longest sleep between two polls when idle */
    uint32_t fetch_pollers;    /* fetcher warps polling the SQ at staggered times (1..PPTM_MAX_POLLERS) */
    uint32_t reserved;
    /* The domain's signal word in device memory (runtime/src/gpu/signals.rs): after item seq
     * completes, the device stores signal_base + seq + 1 there (after the completion entry, under
     * the same fence), so an application's stream can wait for an item (cuStreamWaitValue64). */
    uint64_t* signal;
    uint64_t signal_base;
    /* The plan arenas (PPTM_OP_PLAN): the host's (mapped pinned memory, its device address) and
     * the device's, with their sizes in bytes. */
    uint8_t* plan_host;
    uint8_t* plan_dev;
    uint64_t plan_host_bytes;
    uint64_t plan_dev_bytes;
} pptm_manifold_params;

/* Fused-launched mode (Variant::FusedLaunched): the same fused variant run by one ordinary kernel
 * launch per item (pptm_launched), so persistence and fusion can be measured apart. Each block runs
 * its share, the last to arrive combines the partials and writes `out`; the host reads `out` after
 * synchronising the stream. */
typedef struct pptm_launch_out {
    uint32_t status; /* PPTM_STATUS_* */
    uint32_t paths;  /* PPTM_PATH_*: the product paths the item's stages ran */
    double value; /* the scalar of a reducing chain, else 0 */
    /* Progress for the launched variants' watchdog: a block's %globaltimer when it reached a tile
     * (pptm_tick), written at most once a millisecond per block. The host clears it before
     * launching. */
    uint64_t progress;
    /* The host writes 1 when the item made no progress for the watchdog's deadline: injected hangs
     * return (status PPTM_STATUS_ABORTED). The host clears it before launching. */
    uint64_t abort;
} pptm_launch_out;

/* pptm_launched's only parameter, passed by value. */
typedef struct pptm_launch_params {
    pptm_desc desc;
    uint64_t* arrivals;   /* device memory, 0 between launches (the last block resets it) */
    double* partials;     /* device memory, PPTM_MAX_BLOCKS entries */
    pptm_launch_out* out; /* mapped host memory */
} pptm_launch_params;

/* Unfused mode (Variant::Unfused): every stage of a chain is its own launch of pptm_unfused_stage,
 * in order on one stream; stage s writes its output to scratch[s] (the last one of a chain that
 * returns a tensor writes `out`), and reductions and the stages after them write `out->value`.
 * A stage that fails sets out->status (the host clears it before the first stage). */
#define PPTM_MAX_STAGES 16u

typedef struct pptm_unfused_params {
    pptm_desc desc;
    uint32_t stage;
    uint32_t pad;
    float* scratch[PPTM_MAX_STAGES]; /* device memory, one output per stage */
    uint64_t* arrivals;              /* as in pptm_launch_params */
    double* partials;
    pptm_launch_out* out;
} pptm_unfused_params;

#endif /* PPTM_ABI_H */
