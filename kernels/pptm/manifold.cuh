// The manifold: one persistent cooperative kernel per domain, launched once, that runs the domain's
// fused variants as the host submits them and returns only on a shutdown item.
//
// The grid is `compute blocks + 1`. The last block is the fetcher (pptm_fetcher): it polls the
// submission ring over PCIe and stages descriptors into device memory. The compute blocks
// (pptm_compute_loop) run each staged item in order. Protocol and ownership of every shared word:
// pptm/abi.h.
//
// The generated translation unit defines, before including this file:
//   uint32_t pptm_run_variant(const pptm_desc&, const pptm_block_ctx&, double& partial)
//       runs this block's share of the variant; returns a PPTM_STATUS_* word (uniform across blocks)
//       and, for reducing variants, the block's partial (valid in thread 0);
//   double pptm_finish_variant(const pptm_desc&, const double* partials, uint32_t nblocks, double* smem)
//       called by every thread of the last-arriving block; returns the item's scalar in thread 0;
//   bool pptm_variant_args_ok(const pptm_desc&)
//       the device's own checks of the descriptor's arguments (alignment, lengths), uniform across
//       blocks; false makes the item complete with PPTM_STATUS_BAD_ARGUMENT without running;
//   bool pptm_variant_writes_memory(uint32_t opcode)
//       whether the variant stores to device memory (its completion then needs a system fence).
#ifndef PPTM_MANIFOLD_CUH
#define PPTM_MANIFOLD_CUH

#include "pptm/abi.h"
#include "pptm/device.cuh"

#define PPTM_STAGE_LOG2 6
#define PPTM_FULL_MASK 0xffffffffu
static_assert((1u << PPTM_STAGE_LOG2) == PPTM_STAGE_SLOTS, "stage ring size");
static_assert(sizeof(pptm_desc) == 4 * PPTM_SQ_SLOT_WORDS, "pptm_desc is one u32 per slot word");


// ---- the fetcher -------------------------------------------------------------------------------

// Sleep before a poller's next poll: none while items are in flight or arrived recently, then
// exponential backoff up to max_backoff_ns, so an idle manifold keeps no PCIe read outstanding.
__device__ __forceinline__ uint32_t pptm_fetch_backoff(uint32_t idle_polls, const pptm_manifold_params& P) {
    if (idle_polls < P.hot_polls) return 0;
    const uint32_t k = min(idle_polls - P.hot_polls, 16u);
    return min(100u << k, P.max_backoff_ns);
}

// The fetcher's warps share two words in shared memory: `next` and `stop`. Every access is atomic
// (reads are atomic no-ops, one per warp, broadcast), so the flags are race-free by construction
// and compute-sanitizer's racecheck has nothing to report; volatile polling worked on the hardware
// but was a data race as the memory model sees it.
__device__ __forceinline__ int pptm_shared_flag(int* p) {
    int v = 0;
    if ((threadIdx.x & 31u) == 0) v = atomicOr(p, 0);
    return __shfl_sync(PPTM_FULL_MASK, v, 0);
}
__device__ __forceinline__ uint64_t pptm_shared_counter(unsigned long long* p) {
    unsigned long long v = 0;
    if ((threadIdx.x & 31u) == 0) v = atomicAdd(p, 0ull);
    return __shfl_sync(PPTM_FULL_MASK, v, 0);
}

// The watch warp (the fetcher block's last): every ~50 us it mirrors the newest of the compute blocks'
// progress stamps into the host's `heartbeat` word (only when it changed: an idle manifold writes
// nothing over PCIe), and reads the host's `abort` word; on an abort it tells the compute blocks
// (S->abort) and the pollers (`stop`) and returns. It never touches the items themselves, so a hung
// compute block cannot stop it.
__device__ __noinline__ void pptm_watch(const pptm_manifold_params& P, uint32_t nblocks, int* stop) {
    pptm_device_state* S = P.state;
    const unsigned lane = threadIdx.x & 31u;
    uint64_t mirrored = 0;
    for (;;) {
        if (pptm_shared_flag(stop)) return;
        const uint64_t abort = lane == 0 ? pptm_ld_relaxed_sys(&P.control->abort) : 0;
        if (__shfl_sync(PPTM_FULL_MASK, abort, 0) != 0) {
            if (lane == 0) {
                pptm_st_relaxed_gpu(&S->abort, 1);
                atomicExch(stop, 1);
            }
            return;
        }
        uint64_t newest = 0;
        for (uint32_t b = lane; b < nblocks; b += 32) newest = max(newest, pptm_ld_relaxed_gpu(&S->beat[b]));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) newest = max(newest, __shfl_xor_sync(PPTM_FULL_MASK, newest, o));
        if (newest != mirrored) {
            if (lane == 0) pptm_st_relaxed_sys(&P.control->heartbeat, newest);
            mirrored = newest;
        }
        pptm_sleep(50000u);
    }
}

// Slots a poller reads in one round: the next unstaged item's and the ones after it, so that
// items submitted back to back are staged several per PCIe round trip.
#define PPTM_FETCH_AHEAD 4u

// Where the fetcher's items run (abi.h, "Placement"): the first block for the next independent
// item, and the watermark the independent items after the latest barrier wait for. Owned by the
// warp whose claimed items are next to be placed (turns taken on `placed`).
struct pptm_placement {
    uint32_t cursor;
    uint64_t barrier_end;  // seq + 1 of the latest barrier placed
};

// Chooses item seq's blocks, given word 1 as the host wrote it; returns the staged word 1.
__device__ __forceinline__ uint32_t pptm_place(pptm_placement& at, uint64_t seq, uint32_t asked, uint32_t nblocks) {
    const bool independent = (asked & PPTM_BLOCKS_INDEPENDENT) != 0;
    const uint32_t want = asked & ~PPTM_BLOCKS_INDEPENDENT;
    const uint32_t blocks = want == 0 ? nblocks : min(want, nblocks);
    if (!independent) {
        at.barrier_end = seq + 1;
        return PPTM_STAGED_WORD(blocks, 0u, 0u, false);
    }
    const uint32_t first = at.cursor + blocks <= nblocks ? at.cursor : 0u;
    at.cursor = first + blocks == nblocks ? 0u : first + blocks;
    // Waiting for completed >= seq - lag: the latest barrier's end, or (further back than the
    // stage ring) an item that has completed anyway before this one could be staged.
    const uint32_t lag = (uint32_t)min(seq - at.barrier_end, (uint64_t)PPTM_STAGE_SLOTS);
    return PPTM_STAGED_WORD(blocks, first, lag, true);
}

// `fetch_pollers` warps poll the SQ slots of the next unstaged items, each in its own loop and
// started at staggered times, so a new item is seen a fraction of a PCIe round trip after it lands
// rather than half a round trip on average. Each round reads PPTM_FETCH_AHEAD slots at once (one
// round trip); the warp claims the ready ones at the front (CAS on the shared `next`), places them
// in turn after the previous claim's, copies them re-tagged into the stage ring, and polls the
// following slots at once. The fetcher returns after staging a shutdown item.
__device__ __noinline__ void pptm_fetcher(const pptm_manifold_params& P, uint32_t nblocks) {
    __shared__ unsigned long long next;    // lowest item not yet claimed
    __shared__ unsigned long long placed;  // items placed so far (the turn of the claim starting there)
    __shared__ pptm_placement at;
    __shared__ int stop;
    pptm_device_state* S = P.state;
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {
        next = 0;
        placed = 0;
        at.cursor = 0;
        at.barrier_end = 0;
        stop = 0;
    }
    __syncthreads();
    if (warp == PPTM_WARPS - 1) {
        pptm_watch(P, nblocks, &stop);
        return;
    }
    const uint32_t pollers = max(1u, min(P.fetch_pollers, min((uint32_t)PPTM_WARPS - 1u, PPTM_MAX_POLLERS)));
    if (warp >= pollers) return;
    pptm_sleep(warp * 250u);  // stagger
    const uint64_t mask = P.queue_slots - 1;
    uint64_t completed = 0;
    uint32_t idle_polls = 0, polls = 0;
    for (;;) {
        if (pptm_shared_flag(&stop)) return;
        const uint64_t item = pptm_shared_counter(&next);
        // stage[x % STAGE_SLOTS] may be rewritten once item x - STAGE_SLOTS has completed (every
        // compute block read it before arriving, or skipped it).
        if (item >= completed + PPTM_STAGE_SLOTS) {
            completed = lane == 0 ? pptm_ld_acquire_gpu(&S->completed) : 0;
            completed = __shfl_sync(PPTM_FULL_MASK, completed, 0);
            continue;
        }
        const uint32_t room = (uint32_t)min(completed + PPTM_STAGE_SLOTS - item, (uint64_t)PPTM_FETCH_AHEAD);
        // The slots after the first are read relaxed and issued first, so that all are in flight
        // together; the first slot's read is an acquire (a lone item needs no fence after it).
        uint64_t w[PPTM_FETCH_AHEAD];
#pragma unroll
        for (uint32_t j = 1; j < PPTM_FETCH_AHEAD; ++j)
            w[j] = j < room ? pptm_ld_relaxed_sys(&P.sq[(item + j) & mask].words[lane]) : 0;
        w[0] = pptm_ld_acquire_sys(&P.sq[item & mask].words[lane]);
        uint32_t ready = 0;
#pragma unroll
        for (uint32_t j = 0; j < PPTM_FETCH_AHEAD; ++j)
            if (ready == j && j < room && __all_sync(PPTM_FULL_MASK, (uint32_t)w[j] == pptm_tag(item + j, P.queue_slots_log2)))
                ready = j + 1;
        if (ready != 0) {
            unsigned long long claimed = 0;
            if (lane == 0) claimed = atomicCAS(&next, (unsigned long long)item, (unsigned long long)(item + ready));
            if (__shfl_sync(PPTM_FULL_MASK, claimed, 0) == item) {
                if (lane == 0) PPTM_TRACE(item, 9, pptm_globaltimer());
                // Acquire what the host wrote before submitting (the slots after the first were
                // read relaxed: a system-scope fence), and release it, with the stage stores, to
                // every compute block that reads these slots.
                if (ready > 1)
                    pptm_fence_acq_rel_sys();
                else
                    pptm_fence_acq_rel_gpu();
                // Place the claimed items after the previous claim's (a turn of a few instructions).
                while (pptm_shared_counter(&placed) != item) {
                }
                __threadfence_block();  // the previous turn's placement, published before `placed`
                pptm_placement here;
                here.cursor = (uint32_t)__shfl_sync(PPTM_FULL_MASK, lane == 0 ? atomicAdd(&at.cursor, 0u) : 0u, 0);
                here.barrier_end = pptm_shared_counter(reinterpret_cast<unsigned long long*>(&at.barrier_end));
                bool shutdown = false;
#pragma unroll
                for (uint32_t j = 0; j < PPTM_FETCH_AHEAD; ++j) {
                    if (j >= ready || shutdown) break;
                    const uint32_t opcode = __shfl_sync(PPTM_FULL_MASK, (uint32_t)(w[j] >> 32), 0);
                    const uint32_t asked = __shfl_sync(PPTM_FULL_MASK, (uint32_t)(w[j] >> 32), 1);
                    const uint32_t staged = pptm_place(here, item + j, asked, nblocks);
                    const uint32_t payload = lane == 1 ? staged : (uint32_t)(w[j] >> 32);
                    pptm_st_relaxed_gpu(&S->stage[(item + j) % PPTM_STAGE_SLOTS].words[lane],
                                        pptm_tagged(payload, pptm_tag(item + j, PPTM_STAGE_LOG2)));
                    shutdown = opcode == PPTM_OP_SHUTDOWN;
                }
                if (lane == 0) {
                    atomicExch(&at.cursor, here.cursor);
                    atomicExch(reinterpret_cast<unsigned long long*>(&at.barrier_end), (unsigned long long)here.barrier_end);
                    __threadfence_block();
                    atomicExch(&placed, (unsigned long long)(item + ready));
                    PPTM_TRACE(item, 10, pptm_globaltimer());
                }
                if (shutdown) {
                    if (lane == 0) atomicExch(&stop, 1);
                    return;
                }
            }
            idle_polls = 0;
            polls = 0;
            continue;  // the next slots may be ready already
        }
        // Nothing new. While items are in flight, poll hot at first and then every quarter
        // microsecond or so (a new independent item may start on free blocks at once).
        // `completed` is refreshed now and then to notice when they are done.
        const bool in_flight = item != completed;
        if (in_flight && (++polls & 7u) == 0) {
            completed = lane == 0 ? pptm_ld_relaxed_gpu(&S->completed) : 0;
            completed = __shfl_sync(PPTM_FULL_MASK, completed, 0);
        }
        if (in_flight) {
            idle_polls = 0;
            pptm_sleep(polls > 64 ? 250u : 0u);
        } else {
            polls = 0;
            if (idle_polls != 0xFFFFFFFFu) idle_polls++;
            pptm_sleep(pptm_fetch_backoff(idle_polls, P));
        }
    }
}

// ---- the compute blocks ------------------------------------------------------------------------

struct pptm_loop_smem {
    union {
        pptm_desc desc;  // the item this block runs
        uint32_t desc_words[PPTM_SQ_SLOT_WORDS];
    };
    // In a plan: the step this block runs, and the next one, prefetched while it runs.
    __align__(16) pptm_plan_step steps[2];
    double red[PPTM_WARPS];  // block-reduction scratch
    double own;              // this block's partial, read back when it ran the item alone
    uint64_t seq;            // the item this block runs
    uint64_t start;          // the item's first block: %globaltimer when it took the item
    uint32_t first;          // the item's first compute block (abi.h, "Placement")
    uint32_t independent;    // the item is independent (abi.h, "Ordering")
    int last;
    int abort;               // the host aborted the manifold: return
    uint32_t nonfinite;      // in the last block: some block of the item saw a non-finite value
};

// Compute blocks a plan's step runs on.
__device__ __forceinline__ uint32_t pptm_item_blocks(uint32_t requested, uint32_t nblocks) {
    return requested == 0 ? nblocks : min(requested, nblocks);
}

// Warp 0 finds the next item, from `seq` on, that this block takes part in, waits until it may run
// (a barrier: every earlier item completed; an independent item: the latest barrier before it),
// and leaves it in shared memory (sh.desc with its blocks resolved, sh.seq, sh.first,
// sh.independent).
//
// Polling is shaped to keep L2 traffic on the few hot words low while work runs: while an earlier
// item runs, only `completed` is read (and, after a while, not hot). While waiting for the host,
// every block reads the whole stage slot, so the block finds the descriptor complete in the same
// read that shows it arrived: reading two words first and the rest once needed cost a multi-block
// item one more L2 round trip before it could start.
//
// Each poll round is one acquire load (ld.acquire.gpu.v2: a strong load and an L1 invalidation,
// no memory barrier) by the whole warp: lanes 0..15 read the stage slot two words each, lanes
// 16..31 read `completed` and `abort` (adjacent words). The read that finds the item is also the
// acquire that makes the fetcher's and the previous item's writes visible; the __syncthreads after
// it extends that to the whole block. Two acquires a round (slot, then `completed`) cost two L2
// round trips, since an acquire's invalidation waits for its data before the next load may issue;
// a relaxed poll followed by fence.acq_rel.gpu put a MEMBAR.ALL.GPU on every item's path.
// (The pairs' layout, `completed` then `abort` 16-byte aligned and 16-byte aligned stage slots, is
// asserted on the host, runtime/src/gpu/manifold.rs: NVRTC has no offsetof.)
static_assert(sizeof(pptm_sq_slot) % 16 == 0, "stage slots are read in 16-byte pairs");
static_assert(PPTM_SQ_SLOT_WORDS == 32, "a slot is 16 pairs: lanes 0..15");
__device__ __forceinline__ void pptm_compute_wait(const pptm_manifold_params& P, pptm_loop_smem& sh, uint64_t seq,
                                                  uint32_t nblocks, uint32_t me) {
    if (threadIdx.x == 0) sh.abort = 0;
    __syncwarp();
    if (threadIdx.x < 32) {
        pptm_device_state* S = P.state;
        const unsigned lane = threadIdx.x;
        uint32_t idle = 0, busy = 0;
        for (;;) {
            const uint64_t* slot = S->stage[seq % PPTM_STAGE_SLOTS].words;
            const uint32_t tag = pptm_tag(seq, PPTM_STAGE_LOG2);
            uint64_t lo, hi;  // stage words 2 lane, 2 lane + 1 (lanes 0..15); completed, abort (16..31)
            pptm_ld_acquire_gpu_v2(lane < 16 ? slot + 2 * lane : &S->completed, lo, hi);
            const uint64_t done = __shfl_sync(PPTM_FULL_MASK, lo, 16);
            if (__shfl_sync(PPTM_FULL_MASK, hi, 16) != 0) {
                if (lane == 0) sh.abort = 1;
                break;
            }
            if (done > seq) {
                // Items seq .. done-1 finished without this block: none needed it.
                seq = done;
                idle = busy = 0;
                continue;
            }
            const bool tagged = lane >= 16 || ((uint32_t)lo == tag && (uint32_t)hi == tag);
            // Words 0 (opcode) and 1 (placement) are lane 0's pair.
            if (!__shfl_sync(PPTM_FULL_MASK, tagged, 0)) {
                // Not staged yet. While earlier items run, a short pause; waiting for the host, hot
                // for a while, then gentle backoff.
                if (done < seq) {
                    if (++busy > 16) pptm_sleep(500);
                } else if (++idle > 256) {
                    pptm_sleep(min(32u << min((idle - 256) / 64, 6u), 2000u));
                }
                continue;
            }
            const uint32_t placed = (uint32_t)(__shfl_sync(PPTM_FULL_MASK, hi, 0) >> 32);
            const uint32_t first = PPTM_STAGED_FIRST(placed), blocks = PPTM_STAGED_BLOCKS(placed);
            if (me < first || me >= first + blocks) {
                // Not needed for this item. Items are arriving: stay hot (with side by side, the
                // next one-block item lands on another block each time, so a block that backed
                // off while others ran would start it late).
                ++seq;
                idle = 0;
                continue;
            }
            if (done < seq - PPTM_STAGED_LAG(placed)) {
                // Items this one must follow (one this block skipped) are still running.
                if (++busy > 16) pptm_sleep(500);
                continue;
            }
            // Stage words land independently: read again until every one carries the tag.
            if (!__all_sync(PPTM_FULL_MASK, tagged)) continue;
            if (lane < 16) {
                sh.desc_words[2 * lane] = (uint32_t)(lo >> 32);
                sh.desc_words[2 * lane + 1] = lane == 0 ? blocks : (uint32_t)(hi >> 32);
            }
            if (lane == 0) {
                sh.first = first;
                sh.independent = (placed & PPTM_BLOCKS_INDEPENDENT) != 0;
            }
            if (lane == 0) sh.seq = seq;
            break;
        }
        // The load that found the item was an acquire: everything released before the fetcher's
        // stage stores and the last arriver's `completed` store (earlier items' outputs) is
        // visible to this warp, and to the whole block after the barrier.
    }
    __syncthreads();
}

// The fault-injection items (abi.h): what a hang, a long item and a fault look like from the host.
// Thread 0 does the waiting; the block meets it at a barrier, so the status is uniform.
// `abort` is the word that ends a hang: the manifold's state word (device memory, written by its
// fetcher) or, in a launched kernel, the launch's word in mapped host memory (`abort_sys`).
__device__ __forceinline__ uint32_t pptm_run_debug_with(const uint64_t* abort, bool abort_sys, const pptm_desc& d,
                                                        const pptm_block_ctx& b) {
    __shared__ uint32_t status;
    if (threadIdx.x == 0) {
        status = PPTM_STATUS_OK;
        const uint64_t start = pptm_globaltimer();
        if (d.opcode == PPTM_OP_DEBUG_FAULT) {
            // Page 1 of the address space, which no process and no GPU maps: an illegal address.
            // (An address far above the device's allocations is not enough on a GPU that shares
            // the process's address space: one such store completed on an H200.) A load whose
            // value decides the status, not a store: the thread waits for it, so the fault lands
            // before this item could complete (a store's fault surfaced after the next item had
            // started once on an H200, and named that item).
            const uint32_t v = *reinterpret_cast<const volatile uint32_t*>(d.args[0] + 0x1000ull);
            if (v == 0x5eedu) status = PPTM_STATUS_BAD_ARGUMENT;
        } else {
            // HANG: no progress, ever; SLOW: progress every 100 us until args[0] ns have passed.
            for (;;) {
                if ((abort_sys ? pptm_ld_relaxed_sys(abort) : pptm_ld_relaxed_gpu(abort)) != 0) {
                    status = PPTM_STATUS_ABORTED;
                    break;
                }
                if (d.opcode == PPTM_OP_DEBUG_SLOW) {
                    if (pptm_globaltimer() - start >= d.args[0]) break;
                    pptm_tick(b);
                }
                pptm_sleep(100000u);
            }
        }
    }
    __syncthreads();
    return status;
}

__device__ __noinline__ uint32_t pptm_run_debug(const pptm_manifold_params& P, const pptm_desc& d, const pptm_block_ctx& b) {
    return pptm_run_debug_with(&P.state->abort, false, d, b);
}

__device__ __noinline__ uint32_t pptm_run_debug_launched(uint64_t* abort, const pptm_desc& d, const pptm_block_ctx& b) {
    return pptm_run_debug_with(abort, true, d, b);
}

// PPTM_OP_WAIT_VALUE (abi.h): thread 0 polls the word until it reaches the target, reporting
// progress until the patience runs out (then the watchdog may call it a hang) and leaving on an
// abort. The acquire that sees the target orders what the writer published before it (an
// application stream's kernels, by cuStreamWriteValue64's barrier) before this item's completion,
// which every later item acquires. A word that is not 8-byte aligned is a bad argument.
__device__ __noinline__ uint32_t pptm_run_wait(const pptm_manifold_params& P, const pptm_desc& d, const pptm_block_ctx& b) {
    __shared__ uint32_t status;
    if (threadIdx.x == 0) {
        status = PPTM_STATUS_OK;
        const uint64_t* word = reinterpret_cast<const uint64_t*>(d.args[0]);
        if (word == nullptr || (d.args[0] & 7u) != 0) {
            status = PPTM_STATUS_BAD_ARGUMENT;
        } else {
            // Polled back to back for the first 50 us, when a stream point is usually reached;
            // then with pauses, as an idle fetcher polls.
            const uint64_t start = pptm_globaltimer();
            while (pptm_ld_acquire_sys(word) < d.args[1]) {
                if (pptm_ld_relaxed_gpu(&P.state->abort) != 0) {
                    status = PPTM_STATUS_ABORTED;
                    break;
                }
                const uint64_t waited = pptm_globaltimer() - start;
                if (waited < d.args[2]) pptm_tick(b);
                if (waited > 50000u) pptm_sleep(1000u);
            }
        }
    }
    __syncthreads();
    return status;
}

// ---- plans (PPTM_OP_PLAN; layout and order rules in pptm/abi.h) --------------------------------

#define PPTM_PLAN_MAX_STEPS (1ull << 24)

__device__ __forceinline__ void pptm_ld_sys_v2(const uint64_t* p, uint64_t& a, uint64_t& b) {
    asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}

// Where a plan's pieces are. Every block computes the same from the descriptor.
struct pptm_plan_view {
    uint8_t* dev;             // region in the device arena: header, then the rest
    const uint8_t* host;      // region in the host arena (its device address)
    pptm_plan_step* steps;
    uint64_t* arrivals;
    uint64_t* finished;
    uint64_t* done;
    pptm_plan_result* results_dev;  // while the plan runs
    double* partials;
    pptm_plan_result* results;      // the host's copy
    uint64_t n;
};

// The plan's regions fit their arenas and are 16-byte aligned; otherwise the plan does not run.
__device__ __forceinline__ bool pptm_plan_view_of(const pptm_manifold_params& P, const pptm_desc& d, pptm_plan_view& v) {
    const uint64_t n = d.args[0], doff = d.args[1], hoff = d.args[2], parts = d.args[5];
    if (n == 0 || n > PPTM_PLAN_MAX_STEPS || parts > (1ull << 32) || ((doff | hoff) & 15u) != 0 || d.args[3] == 0)
        return false;
    const uint64_t dev_bytes = PPTM_PLAN_HEADER_BYTES + n * (sizeof(pptm_plan_step) + 24u + sizeof(pptm_plan_result)) + parts * 8u;
    const uint64_t host_bytes = n * sizeof(pptm_plan_step) + (n + 1) * sizeof(pptm_plan_result);
    if (doff > P.plan_dev_bytes || dev_bytes > P.plan_dev_bytes - doff) return false;
    if (hoff > P.plan_host_bytes || host_bytes > P.plan_host_bytes - hoff) return false;
    v.n = n;
    v.dev = P.plan_dev + doff;
    v.host = P.plan_host + hoff;
    v.steps = reinterpret_cast<pptm_plan_step*>(v.dev + PPTM_PLAN_HEADER_BYTES);
    v.arrivals = reinterpret_cast<uint64_t*>(v.steps + n);
    v.finished = v.arrivals + n;
    v.done = v.finished + n;
    v.results_dev = reinterpret_cast<pptm_plan_result*>(v.done + n);
    v.partials = reinterpret_cast<double*>(v.results_dev + n);
    v.results = reinterpret_cast<pptm_plan_result*>(P.plan_host + hoff + n * sizeof(pptm_plan_step));
    return true;
}

// Block 0 of a plan: copies the steps from the host arena into the device arena, every thread with
// four 16-byte loads in flight (a plan of 170 steps, 32 KB, takes about one PCIe round trip), and
// zeroes the barrier, arrival and finished counters. The host wrote the steps before it submitted
// the item; the fetcher's acquire of the slot and this block's acquire of the stage slot order
// those writes before these loads. A resident plan (a kept pipeline run again) has its steps in
// the device region already: only the counters are zeroed.
__device__ __noinline__ void pptm_plan_copy_in(const pptm_plan_view& v, bool resident) {
    uint64_t* header = reinterpret_cast<uint64_t*>(v.dev);
    for (uint32_t i = threadIdx.x; i < PPTM_PLAN_HEADER_BYTES / 8u; i += PPTM_BLOCK_THREADS) header[i] = 0;
    for (uint64_t i = threadIdx.x; i < 2 * v.n; i += PPTM_BLOCK_THREADS) v.arrivals[i] = 0;  // arrivals, finished
    uint64_t* results = reinterpret_cast<uint64_t*>(v.results_dev);
    for (uint64_t i = threadIdx.x; i < v.n * (sizeof(pptm_plan_result) / 8u); i += PPTM_BLOCK_THREADS) results[i] = 0;
    if (resident) return;
    constexpr int U = 4;
    const uint64_t* src = reinterpret_cast<const uint64_t*>(v.host);
    uint64_t* dst = reinterpret_cast<uint64_t*>(v.steps);
    const uint64_t pairs = v.n * sizeof(pptm_plan_step) / 16u;
    for (uint64_t i = threadIdx.x; i < pairs; i += U * PPTM_BLOCK_THREADS) {
        uint64_t a[U], b[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (i + u * PPTM_BLOCK_THREADS < pairs) pptm_ld_sys_v2(src + 2 * (i + u * PPTM_BLOCK_THREADS), a[u], b[u]);
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (i + u * PPTM_BLOCK_THREADS < pairs) {
                dst[2 * (i + u * PPTM_BLOCK_THREADS)] = a[u];
                dst[2 * (i + u * PPTM_BLOCK_THREADS) + 1] = b[u];
            }
    }
}

// Thread 0 waits until *word >= target (or, with `equal`, == target); the block meets it after.
// Returns false, in every thread, when the host aborted the manifold meanwhile. `patience`: for
// how long (ns) the wait reports progress to the watchdog; 0 for waits on this plan's own blocks,
// which make progress themselves.
__device__ __forceinline__ bool pptm_plan_wait(const pptm_manifold_params& P, pptm_loop_smem& sh, const uint64_t* word,
                                               uint64_t target, bool equal, uint64_t patience, const pptm_block_ctx& ctx) {
    if (threadIdx.x == 0) {
        sh.abort = 0;
        uint64_t start = 0;
        for (uint32_t polls = 0;; ++polls) {
            const uint64_t w = pptm_ld_acquire_gpu(word);
            if (equal ? w == target : w >= target) break;
            if ((polls & 15u) == 15u) {
                if (pptm_ld_relaxed_gpu(&P.state->abort) != 0) {
                    sh.abort = 1;
                    break;
                }
                if (patience != 0) {
                    const uint64_t now = pptm_globaltimer();
                    if (start == 0) start = now;
                    if (now - start < patience) pptm_tick(ctx);
                    if (now - start > 50000u) pptm_sleep(1000u);
                } else if (polls > 4096) {
                    pptm_sleep(200u);
                }
            }
        }
    }
    __syncthreads();
    return sh.abort == 0;
}

// Every block of the plan arrives (after its threads' stores) and waits for all: the barrier-th
// barrier of this plan completes when the counter reaches barrier * plan_blocks.
__device__ __forceinline__ bool pptm_plan_barrier(const pptm_manifold_params& P, pptm_loop_smem& sh, uint64_t* counter,
                                                  uint64_t barrier, uint32_t plan_blocks, const pptm_block_ctx& ctx) {
    __syncthreads();
    if (plan_blocks == 1) return true;  // the block's own barrier above orders everything
    if (threadIdx.x == 0) pptm_atom_add_acq_rel_gpu(counter, 1);
    return pptm_plan_wait(P, sh, counter, barrier * plan_blocks, false, 0, ctx);
}

// Thread 0 stores a step's result in the plan's device region (the plan's last block copies the
// results to the host at its end).
__device__ __forceinline__ void pptm_plan_result_store(pptm_plan_result* r, uint32_t status, uint32_t paths, double value,
                                                       uint64_t end) {
    volatile uint64_t* w = reinterpret_cast<volatile uint64_t*>(r);
    w[0] = ((uint64_t)paths << 32) | status;
    w[1] = (uint64_t)__double_as_longlong(value);
    w[3] = end;
}

// A light step's share of its result from one block (abi.h, PPTM_STEP_LIGHT): relaxed reductions,
// which the block does not wait for. The plan's final arrival (a release) orders them before the
// results are copied out.
__device__ __forceinline__ void pptm_plan_result_fold(pptm_plan_result* r, uint32_t status, uint32_t paths, uint64_t end) {
    if (status != PPTM_STATUS_OK) asm volatile("red.relaxed.gpu.global.max.u32 [%0], %1;" ::"l"(&r->status), "r"(status) : "memory");
    if (paths != 0u) asm volatile("red.relaxed.gpu.global.or.b32 [%0], %1;" ::"l"(&r->paths), "r"(paths) : "memory");
    asm volatile("red.relaxed.gpu.global.max.u64 [%0], %1;" ::"l"(&r->end), "l"(end) : "memory");
}

// Records the plan's first failure (by time), which a later loop iteration's result would hide.
__device__ __forceinline__ void pptm_plan_note_failure(const pptm_plan_view& v, uint64_t k, uint32_t status) {
    atomicCAS(reinterpret_cast<unsigned long long*>(v.dev) + 1, 0ull, (unsigned long long)((k + 1) | ((uint64_t)status << 32)));
}

// Probe-only clock of a plan's walk (bench/probes/plan_probe.cu builds the manifold with
// -DPPTM_PLAN_CLOCK; generated code never defines it): block 0's thread 0 sums, over one plan, the
// SM cycles of each part of a step (PPTM_PLAN_CLOCK_PART), and stores the sums when the plan ends.
// The sums live in local memory: their loads and stores add about 15% to a one-block step (2.19
// against 1.84 µs on an H200), so compare clocked builds with clocked builds.
#ifdef PPTM_PLAN_CLOCK
#define PPTM_PLAN_CLOCK_PARTS 6
__device__ unsigned long long pptm_plan_clock[PPTM_PLAN_CLOCK_PARTS + 1];  // the last: steps walked
#define PPTM_PLAN_CLOCK_PART(i)                                          \
    do {                                                                 \
        if (me == 0 && threadIdx.x == 0) {                               \
            const unsigned long long t_ = clock64();                     \
            clk_sum[i] += t_ - clk_last;                                 \
            clk_last = t_;                                               \
        }                                                                \
    } while (0)
#else
#define PPTM_PLAN_CLOCK_PART(i) ((void)0)
#endif

// Runs this block's part of a plan item (every thread of blocks 0 .. plan_blocks - 1). Returns
// PPTM_STATUS_OK, PPTM_STATUS_BAD_ARGUMENT (the plan does not fit its arenas: nothing ran) or
// PPTM_STATUS_ABORTED; the steps' own statuses go to their results.
__device__ __noinline__ uint32_t pptm_run_plan(const pptm_manifold_params& P, pptm_loop_smem& sh, uint64_t seq, uint32_t me,
                                               uint32_t plan_blocks) {
    pptm_plan_view v;
    if (!pptm_plan_view_of(P, sh.desc, v)) return PPTM_STATUS_BAD_ARGUMENT;
    const uint64_t id = sh.desc.args[3], patience = sh.desc.args[4];
    const pptm_block_ctx plan_ctx = {me, plan_blocks, sh.red};
    if (me == 0) {
        pptm_plan_copy_in(v, sh.desc.args[6] == 1);
        __syncthreads();
        if (threadIdx.x == 0) pptm_st_release_gpu(&P.state->plan_copied, seq + 1);
    } else if (!pptm_plan_wait(P, sh, &P.state->plan_copied, seq + 1, false, 0, plan_ctx)) {
        return PPTM_STATUS_ABORTED;
    }
    uint64_t* const barrier_counter = reinterpret_cast<uint64_t*>(v.dev);
    uint64_t barriers = 0;
    uint32_t it = 0;          // iteration of the loop being run (0 outside loops)
    uint32_t cur = 0;         // the buffer of sh.steps holding step k
    uint64_t prefetched = ~0ull;  // the step the other buffer holds (copies in flight), if any
#ifdef PPTM_PLAN_CLOCK
    unsigned long long clk_sum[PPTM_PLAN_CLOCK_PARTS] = {}, clk_last = clock64(), clk_steps = 0;
#endif
    for (uint64_t k = 0; k < v.n;) {
#ifdef PPTM_PLAN_CLOCK
        ++clk_steps;
#endif
        // Step k goes to the buffer step k - 2 used (every thread is past step k - 1's barrier
        // below, so done with it): prefetched there while step k - 1 ran, or loaded now (the first
        // step, a loop's jump back). The copying threads wait for their own copies first.
        if (prefetched != ~0ull) pptm_cp_async_wait_all();
        cur ^= 1u;
        if (prefetched != k && threadIdx.x < sizeof(pptm_plan_step) / 16u) {
            const float* from = reinterpret_cast<const float*>(v.steps + k) + 4 * threadIdx.x;
            reinterpret_cast<pptm_f4*>(&sh.steps[cur])[threadIdx.x] = pptm_ld_cg_f4(from);
        }
        __syncthreads();  // step k is visible to every thread, and every thread is done with k - 1
        PPTM_PLAN_CLOCK_PART(0);
        // The next step's descriptor, into step k - 1's buffer, while this one runs: an L2 round
        // trip off the hand-off.
        prefetched = ~0ull;
        if (k + 1 < v.n) {
            if (threadIdx.x < sizeof(pptm_plan_step) / 16u)
                pptm_cp_async_16(reinterpret_cast<pptm_f4*>(&sh.steps[cur ^ 1u]) + threadIdx.x,
                                 reinterpret_cast<const pptm_f4*>(v.steps + k + 1) + threadIdx.x, 16);
            prefetched = k + 1;
        }
        const pptm_plan_step& st = sh.steps[cur];
        const uint32_t op = st.desc.opcode;
        if (op == PPTM_OP_PLAN_LOOP) {
            // Everything before it, this iteration's body included, has finished on every block.
            if (!pptm_plan_barrier(P, sh, barrier_counter, ++barriers, plan_blocks, plan_ctx)) return PPTM_STATUS_ABORTED;
            const uint64_t first = st.desc.args[0], cond = st.desc.args[2];
            bool again = it + 1 < st.desc.args[1] && first <= k;
            if (again && cond != 0 && cond <= k)
                again = !(pptm_ld_cg_f64(&v.results_dev[cond - 1].value) < __longlong_as_double(st.desc.args[3]));
            if (again) {
                ++it;
                k = first;
                continue;
            }
            if (me == 0 && threadIdx.x == 0) {
                const uint64_t now = pptm_globaltimer();
                reinterpret_cast<volatile uint64_t*>(&v.results_dev[k].start)[0] = now;
                pptm_plan_result_store(&v.results_dev[k], PPTM_STATUS_OK, 0u, (double)(it + 1), now);
                if (st.flags & PPTM_STEP_DONE) pptm_st_release_gpu(&v.done[k], id);
                if (st.flags & PPTM_STEP_FINISHED) pptm_st_release_gpu(&v.finished[k], 1);
            }
            it = 0;
            ++k;
            continue;
        }
        if (op == PPTM_OP_PLAN_WHEN) {
            // Everything before it has finished on every block: the condition's value is stored.
            if (!pptm_plan_barrier(P, sh, barrier_counter, ++barriers, plan_blocks, plan_ctx)) return PPTM_STATUS_ABORTED;
            const uint64_t end = st.desc.args[0], cond = st.desc.args[1];
            const bool valid = cond != 0 && cond <= k && end > k && end <= v.n;
            const bool take =
                valid && pptm_ld_cg_f64(&v.results_dev[cond - 1].value) >= __longlong_as_double(st.desc.args[2]);
            if (me == 0 && threadIdx.x == 0) {
                const uint64_t now = pptm_globaltimer();
                const double ran = reinterpret_cast<volatile double*>(&v.results_dev[k].value)[0] + (take ? 1.0 : 0.0);
                reinterpret_cast<volatile uint64_t*>(&v.results_dev[k].start)[0] = now;
                pptm_plan_result_store(&v.results_dev[k], valid ? PPTM_STATUS_OK : PPTM_STATUS_BAD_ARGUMENT, 0u, ran, now);
                if (!take && valid) {
                    // Steps after the body that wait for a skipped step go on at once: what they
                    // read is what was there before the body, which the barrier above finished.
                    for (uint64_t j = k + 1; j < end; ++j) {
                        const uint32_t flags = v.steps[j].flags;
                        if (flags & PPTM_STEP_FINISHED) pptm_st_release_gpu(&v.finished[j], it + 1);
                        if (flags & PPTM_STEP_DONE) pptm_st_release_gpu(&v.done[j], id);
                    }
                }
                if (st.flags & PPTM_STEP_FINISHED) pptm_st_release_gpu(&v.finished[k], it + 1);
                if (st.flags & PPTM_STEP_DONE) pptm_st_release_gpu(&v.done[k], id);
            }
            k = take || !valid ? k + 1 : end;
            continue;
        }
        if (st.sync == PPTM_SYNC_BARRIER && !pptm_plan_barrier(P, sh, barrier_counter, ++barriers, plan_blocks, plan_ctx))
            return PPTM_STATUS_ABORTED;
        const uint32_t blocks = pptm_item_blocks(st.desc.blocks, plan_blocks);
        if (me >= blocks) {
            ++k;
            continue;
        }
        if (st.sync == PPTM_SYNC_DEPS) {
            for (uint32_t j = 0; j < PPTM_PLAN_DEPS; ++j) {
                const uint32_t dep = st.deps[j];
                const uint64_t idx = dep & ~PPTM_DEP_IN_LOOP;
                if (dep == PPTM_DEP_NONE || idx >= k) continue;
                const uint64_t target = (dep & PPTM_DEP_IN_LOOP) ? it + 1 : 1;
                if (!pptm_plan_wait(P, sh, &v.finished[idx], target, false, 0, plan_ctx)) return PPTM_STATUS_ABORTED;
            }
        }
        if (me == 0 && threadIdx.x == 0) reinterpret_cast<volatile uint64_t*>(&v.results_dev[k].start)[0] = pptm_globaltimer();
        if (op == PPTM_OP_PLAN_WAIT) {
            // Another domain's plan publishes a step (or a manifold an item): every block of this
            // plan waits for it.
            const uint64_t* word = reinterpret_cast<const uint64_t*>(st.desc.args[0]);
            const bool ok = ((uint64_t)word & 7u) == 0 && word != nullptr;
            const bool equal = st.desc.args[2] != 0;
            const uint64_t target = equal ? id : st.desc.args[1];
            if (ok && !pptm_plan_wait(P, sh, word, target, equal, patience, plan_ctx)) return PPTM_STATUS_ABORTED;
            if (me == 0 && threadIdx.x == 0) {
                pptm_plan_result_store(&v.results_dev[k], ok ? PPTM_STATUS_OK : PPTM_STATUS_BAD_ARGUMENT, 0u, 0.0, pptm_globaltimer());
                if (st.flags & PPTM_STEP_FINISHED) pptm_st_release_gpu(&v.finished[k], it + 1);
            }
            ++k;
            continue;
        }
        const pptm_block_ctx ctx = {me, blocks, sh.red};
        uint32_t status = PPTM_STATUS_BAD_OPCODE;
        double partial = 0.0;
        if (threadIdx.x == 0) pptm_meet_word = &v.arrivals[k];
        PPTM_PLAN_CLOCK_PART(1);
        if (op >= PPTM_OP_FIRST_VARIANT)
            status = pptm_variant_args_ok(st.desc) ? pptm_run_variant(st.desc, ctx, partial) : PPTM_STATUS_BAD_ARGUMENT;
        if (status == PPTM_STATUS_ABORTED) return PPTM_STATUS_ABORTED;
        PPTM_PLAN_CLOCK_PART(2);
        if (st.flags & PPTM_STEP_LIGHT) {
            // Nothing waits for this step and it has no finish: this block folds its share into the
            // result and goes on, whatever the others do. 170 dependent 4096-element blends on two
            // blocks: 1.27 µs a step, against 2.24 with the arrival (H200, plan_probe.cu).
            if (st.flags & PPTM_STEP_CHECKS_FINITE) __syncthreads();  // every thread's checks
            if (threadIdx.x == 0) {
                const uint32_t paths = pptm_paths;
                pptm_paths = 0u;
                if (status == PPTM_STATUS_OK && pptm_nonfinite != 0u) status = PPTM_STATUS_NON_FINITE;
                pptm_nonfinite = 0u;
                pptm_plan_result_fold(&v.results_dev[k], status, paths, pptm_globaltimer());
                if (status != PPTM_STATUS_OK) pptm_plan_note_failure(v, k, status);
            }
            if ((k & 15u) == 0) pptm_tick(plan_ctx);
            ++k;
            continue;
        }
        __syncthreads();  // every thread's stores and finite checks, before thread 0 arrives
        uint32_t paths = 0;
        if (threadIdx.x == 0) {
            paths = pptm_paths;
            pptm_paths = 0u;
            const uint32_t bad = pptm_nonfinite;
            pptm_nonfinite = 0u;
            bool last = true;
            if (blocks == 1) {
                sh.nonfinite = bad;
            } else {
                v.partials[st.partials + me] = partial;
                const uint64_t prior = pptm_atom_add_acq_rel_gpu(&v.arrivals[k], 1ull | ((uint64_t)bad << 32));
                last = (uint32_t)prior == blocks * (pptm_meets + 1u) - 1u;  // meetings counted too
                pptm_meets = 0u;
                sh.last = last;
                sh.nonfinite = bad | (uint32_t)(prior >> 32);
            }
            // The steps that wait for this one read what its blocks stored, not its result: the
            // last block publishes that at once (its arrival acquired every block's release, and
            // this release passes them on), before its finish and result store. A 256² GEMV step
            // after another: 4.67 -> 4.52 µs on an H200 (bench/probes/plan_probe.cu).
            if (last) {
                if (st.flags & PPTM_STEP_DONE) pptm_st_release_gpu(&v.done[k], id);
                if (st.flags & PPTM_STEP_FINISHED) pptm_st_release_gpu(&v.finished[k], it + 1);
            }
        }
        // A one-block step is its own last block, and its finish reads the partial (in thread 0's
        // register) and the flags in thread 0, which wrote them: no barrier to share that.
        if (blocks > 1) __syncthreads();
        PPTM_PLAN_CLOCK_PART(3);
        if (blocks == 1 || sh.last) {
            double value = 0.0;
            if (status == PPTM_STATUS_OK)
                value = pptm_finish_variant(st.desc, blocks == 1 ? &partial : v.partials + st.partials, blocks, sh.red);
            if (threadIdx.x == 0) {
                if (status == PPTM_STATUS_OK && (sh.nonfinite | pptm_nonfinite) != 0) status = PPTM_STATUS_NON_FINITE;
                pptm_nonfinite = 0u;
                pptm_plan_result_store(&v.results_dev[k], status, paths, value, pptm_globaltimer());
                if (blocks > 1) v.arrivals[k] = 0;  // every block of this run of the step has arrived
                if (status != PPTM_STATUS_OK) pptm_plan_note_failure(v, k, status);
            }
        }
        PPTM_PLAN_CLOCK_PART(4);
        if ((k & 15u) == 0) pptm_tick(plan_ctx);  // progress for the watchdog, off most hand-offs
        ++k;
        PPTM_PLAN_CLOCK_PART(5);
    }
#ifdef PPTM_PLAN_CLOCK
    if (me == 0 && threadIdx.x == 0) {
        for (int i = 0; i < PPTM_PLAN_CLOCK_PARTS; ++i) pptm_plan_clock[i] = clk_sum[i];
        pptm_plan_clock[PPTM_PLAN_CLOCK_PARTS] = clk_steps;
    }
#endif
    pptm_cp_async_wait_all();  // a prefetch past the last loop exit, if any
    __syncthreads();
    return PPTM_STATUS_OK;
}

// The plan's results, copied to the host region by every thread of the item's last arriving block
// (every block's steps are done, and their stores acquired by its arrival), and its summary,
// results[n], by thread 0: the first failure (status, and the step as the value; -1 when none),
// the plan's start and end. The completion's system fence orders them before the entry.
__device__ __forceinline__ void pptm_plan_copy_out(const pptm_manifold_params& P, const pptm_desc& d, uint64_t start) {
    pptm_plan_view v;
    if (!pptm_plan_view_of(P, d, v)) return;
    const uint64_t* from = reinterpret_cast<const uint64_t*>(v.results_dev);
    uint64_t* to = reinterpret_cast<uint64_t*>(v.results);
    for (uint64_t i = threadIdx.x; i < v.n * (sizeof(pptm_plan_result) / 8u); i += PPTM_BLOCK_THREADS)
        pptm_st_relaxed_sys(to + i, pptm_ld_relaxed_gpu(from + i));
    if (threadIdx.x == 0) {
        const uint64_t failed = pptm_ld_relaxed_gpu(reinterpret_cast<const uint64_t*>(v.dev) + 1);
        uint64_t* r = reinterpret_cast<uint64_t*>(&v.results[v.n]);
        const double step = failed == 0 ? -1.0 : (double)((uint32_t)failed - 1);
        pptm_st_relaxed_sys(r + 0, failed >> 32);
        pptm_st_relaxed_sys(r + 1, (uint64_t)__double_as_longlong(step));
        pptm_st_relaxed_sys(r + 2, start);
        pptm_st_relaxed_sys(r + 3, pptm_globaltimer());
    }
    __syncthreads();
}

// Warp 0 of an independent item's last block, after its completion entry: marks the item
// finished and moves the watermark `completed` (and the streams' signal word) past every finished
// item at its front. The block that finds the watermark at its own item sweeps, under the
// `sweeping` lock; one that finds it lower leaves: the block that later moves the watermark to
// this item stores it, fences, and reads this item's flag, and this block stored the flag, fenced
// and read the watermark. Of the two sequentially consistent fences one comes first, so at least
// one side sees the other's store and the item is swept. (A barrier never races with a sweep: no
// item after it starts before it completes, and every item before it has.) The warp reads 32
// flags in one round trip: a sweep over many items finished side by side costs a few round trips,
// not one each.
__device__ __noinline__ void pptm_complete_independent(const pptm_manifold_params& P, uint64_t seq) {
    pptm_device_state* S = P.state;
    const unsigned lane = threadIdx.x & 31u;
    __syncwarp();
    uint64_t word = 0;
    if (lane == 0) {
        pptm_st_release_gpu(&S->finished[seq % PPTM_STAGE_SLOTS], seq + 1);
        pptm_fence_sc_gpu();
        word = pptm_ld_relaxed_gpu(&S->completed);
    }
    if (__shfl_sync(PPTM_FULL_MASK, word, 0) != seq) return;  // beyond it: swept; below: see above
    for (;;) {
        if (lane == 0) {
            while (atomicCAS(reinterpret_cast<unsigned long long*>(&S->sweeping), 0ull, 1ull) != 0ull) pptm_sleep(32);
            pptm_fence_acq_rel_gpu();  // what the previous sweeper published
            word = pptm_ld_relaxed_gpu(&S->completed);
        }
        const uint64_t from = __shfl_sync(PPTM_FULL_MASK, word, 0);
        uint64_t to = from;
        for (;;) {
            // Each lane acquires one flag (the item's outputs with it); the finished run at the
            // front is the ballot's trailing ones.
            const uint64_t item = to + lane;
            const bool finished = pptm_ld_acquire_gpu(&S->finished[item % PPTM_STAGE_SLOTS]) == item + 1;
            const unsigned ones = __ballot_sync(PPTM_FULL_MASK, finished);
            const unsigned run = ones == PPTM_FULL_MASK ? 32u : (unsigned)(__ffs(~ones) - 1);
            to += run;
            if (run < 32u) break;
        }
        __syncwarp();  // every lane's acquire before lane 0's release
        if (lane == 0) {
            if (to != from) {
                // The streams' word after the swept items' outputs (each fenced before its flag).
                pptm_fence_acq_rel_sys();
                pptm_st_relaxed_sys(P.signal, P.signal_base + to);
                pptm_st_release_gpu(&S->completed, to);
            }
            pptm_st_release_gpu(&S->sweeping, 0);
            pptm_fence_sc_gpu();
            // An item that finished at `to` meanwhile may have read the watermark before the store.
            word = pptm_ld_acquire_gpu(&S->finished[to % PPTM_STAGE_SLOTS]) == to + 1;
        }
        if (__shfl_sync(PPTM_FULL_MASK, word, 0) == 0) return;
    }
}

// `me` is this block's compute index (0 .. nblocks - 1), assigned at start-up (pptm_manifold).
__device__ void pptm_compute_loop(const pptm_manifold_params& P, uint32_t nblocks, uint32_t me) {
    __shared__ pptm_loop_smem sh;
    pptm_device_state* S = P.state;
    if (threadIdx.x == 0) {
        pptm_beat_word = &S->beat[me];
        pptm_beat_last = PPTM_BEAT_DEVICE;
        pptm_nonfinite = 0u;
        pptm_paths = 0u;
        pptm_abort_word = &S->abort;
        pptm_meets = 0u;
    }
    for (uint64_t seq = 0;; ++seq) {
        pptm_compute_wait(P, sh, seq, nblocks, me);
        if (sh.abort) return;
        seq = sh.seq;
        const uint32_t op = sh.desc.opcode;
        const uint32_t blocks = sh.desc.blocks;  // resolved by the fetcher: 1 .. nblocks
        const uint32_t mine = me - sh.first;      // this block's index in the item
        const pptm_block_ctx ctx = {mine, blocks, sh.red};
        // The item's first block runs every item: its start is the item's (read by the last
        // arriver, released to it by that block's arrival). It keeps it in shared memory too: when
        // it is also the last arriver (every one-block item) the completion needs no load for it.
        if (mine == 0 && threadIdx.x == 0) {
            sh.start = pptm_globaltimer();
            S->started_ns[seq % PPTM_STAGE_SLOTS] = sh.start;
        }
#ifdef PPTM_PHASE_TRACE
        uint64_t t_took = 0, t_ran = 0;
        if (threadIdx.x == 0) {
            pptm_clk_row = mine == 0 ? pptm_clk_trace[seq % PPTM_STAGE_SLOTS] : nullptr;
            PPTM_CLK(0);
            t_took = pptm_globaltimer();
            if (mine == 0) PPTM_TRACE(seq, 0, t_took);
            PPTM_TRACE_MAX(seq, 11, t_took);
        }
#endif

        uint32_t status = PPTM_STATUS_OK;
        double partial = 0.0;
        if (threadIdx.x == 0) pptm_meet_word = &S->arrivals[seq % PPTM_STAGE_SLOTS];
        if (op >= PPTM_OP_FIRST_VARIANT) {
            PPTM_CLK(8);
            const bool args_ok = pptm_variant_args_ok(sh.desc);
            PPTM_CLK(9);
            status = args_ok ? pptm_run_variant(sh.desc, ctx, partial) : PPTM_STATUS_BAD_ARGUMENT;
        } else if (op >= PPTM_OP_DEBUG_HANG && op <= PPTM_OP_DEBUG_FAULT)
            status = pptm_run_debug(P, sh.desc, ctx);
        else if (op == PPTM_OP_WAIT_VALUE)
            status = pptm_run_wait(P, sh.desc, ctx);
        else if (op == PPTM_OP_PLAN)
            status = pptm_run_plan(P, sh, seq, mine, blocks);
        else if (op != PPTM_OP_NOOP && op != PPTM_OP_SHUTDOWN)
            status = PPTM_STATUS_BAD_OPCODE;
        if (status == PPTM_STATUS_ABORTED) return;  // uniform: every thread saw the same abort
#ifdef PPTM_PHASE_TRACE
        if (threadIdx.x == 0) {
            PPTM_CLK(6);
            t_ran = pptm_globaltimer();
            if (mine == 0) PPTM_TRACE(seq, 1, t_ran);
            PPTM_TRACE_MAX(seq, 12, t_ran);
        }
#endif
        // Every thread's output stores (and finite checks) before thread 0's release at arrival:
        // the release orders only what the barrier ordered before it, and a streaming pattern ends
        // without one (under racecheck's scheduling a KlTerms sum read stale outputs on an H200).
        // Status and opcode are uniform, so is the barrier.
        if (status == PPTM_STATUS_OK && op >= PPTM_OP_FIRST_VARIANT &&
            (pptm_variant_writes_memory(op) || pptm_variant_checks_finite(op)))
            __syncthreads();

        // Arrive. The acq_rel add publishes this block's partial and outputs and, in the last
        // block, acquires every other block's. Its high half counts the blocks that saw a
        // non-finite value.
        uint64_t* arrivals = &S->arrivals[seq % PPTM_STAGE_SLOTS];
        uint64_t start = 0;  // thread 0 of the last arriver: block 0's start
        uint32_t paths = 0;  // thread 0: this block's product paths (the item's, abi.h)
        if (threadIdx.x == 0) {
            paths = pptm_paths;
            pptm_paths = 0u;
            if (op >= PPTM_OP_FIRST_VARIANT) {
                if (blocks == 1)
                    sh.own = partial;
                else
                    S->partials[seq % PPTM_STAGE_SLOTS][mine] = partial;
            }
            const uint32_t bad = pptm_nonfinite;
            pptm_nonfinite = 0u;
            // A one-block item (a no-op, a small input) is trivially last: no atomic.
            const uint64_t prior = blocks == 1 ? 0 : pptm_atom_add_acq_rel_gpu(arrivals, 1ull | ((uint64_t)bad << 32));
            // Each meeting inside the item (pptm_item_meet) counted every block once already.
            sh.last = blocks == 1 || (uint32_t)prior == blocks * (pptm_meets + 1u) - 1u;
            pptm_meets = 0u;
            sh.nonfinite = bad | (uint32_t)(prior >> 32);
            // The last arriver other than block 0 loads block 0's start now (acquired by the
            // add above), so the load's round trip overlaps the finish and the fence instead of
            // preceding the completion's stores.
            start = !sh.last ? 0 : mine == 0 ? sh.start : pptm_ld_relaxed_gpu(&S->started_ns[seq % PPTM_STAGE_SLOTS]);
#ifdef PPTM_PHASE_TRACE
            PPTM_CLK(7);
            const uint64_t t_arrived = pptm_globaltimer();
            if (mine == 0) PPTM_TRACE(seq, 2, t_arrived);
            if (sh.last) {
                PPTM_TRACE(seq, 3, t_took);
                PPTM_TRACE(seq, 4, t_ran);
                PPTM_TRACE(seq, 5, t_arrived);
            }
#endif
        }
        __syncthreads();
        if (sh.last) {
            double value = 0.0;
            if (status == PPTM_STATUS_OK && op >= PPTM_OP_FIRST_VARIANT)
                value = pptm_finish_variant(sh.desc, blocks == 1 ? &sh.own : S->partials[seq % PPTM_STAGE_SLOTS], blocks, sh.red);
            if (status == PPTM_STATUS_OK && op == PPTM_OP_PLAN) pptm_plan_copy_out(P, sh.desc, start);
            if (threadIdx.x == 0) {
                PPTM_TRACE(seq, 6, pptm_globaltimer());
                // Results in device memory must be visible to the host's copies before it learns
                // the item is done; a scalar result travels in the (tagged) entry itself.
                // A plan's steps write memory, and their results went to the host arena.
                if ((status == PPTM_STATUS_OK && pptm_variant_writes_memory(op)) || op == PPTM_OP_PLAN) pptm_fence_acq_rel_sys();
                PPTM_TRACE(seq, 7, pptm_globaltimer());
                if (status == PPTM_STATUS_OK && (sh.nonfinite | pptm_nonfinite) != 0) status = PPTM_STATUS_NON_FINITE;
                pptm_nonfinite = 0u;
                const uint32_t tag = pptm_tag(seq, P.queue_slots_log2);
                const uint64_t bits = (uint64_t)__double_as_longlong(value);
                const uint64_t ns = pptm_globaltimer() - start;
                uint64_t* e = P.cq[seq & (P.queue_slots - 1)].words;
                pptm_st_relaxed_sys(e + 0, pptm_tagged(status, tag));
                pptm_st_relaxed_sys(e + 1, pptm_tagged(op, tag));
                pptm_st_relaxed_sys(e + 2, pptm_tagged((uint32_t)bits, tag));
                pptm_st_relaxed_sys(e + 3, pptm_tagged((uint32_t)(bits >> 32), tag));
                pptm_st_relaxed_sys(e + 4, pptm_tagged((uint32_t)min(ns, (uint64_t)0xFFFFFFFFu), tag));
                pptm_st_relaxed_sys(e + 5, pptm_tagged(paths, tag));
                PPTM_TRACE(seq, 8, pptm_globaltimer());
                // The counter is free for item seq + STAGE_SLOTS.
                if (blocks > 1) *arrivals = 0;
                if (!sh.independent) {
                    // A barrier: every earlier item has completed and no later one has started,
                    // so nobody else moves the watermark now. Streams waiting for this item
                    // (Ticket::signal_stream): ordered after its outputs by the fence above, as
                    // the entry is. Then the next items may start.
                    pptm_st_relaxed_sys(P.signal, P.signal_base + seq + 1);
                    pptm_st_release_gpu(&S->completed, seq + 1);
                }
            }
            // An independent item: its warp 0 moves the watermark (after thread 0's entry).
            if (sh.independent && threadIdx.x < 32) pptm_complete_independent(P, seq);
        }
        if (op == PPTM_OP_SHUTDOWN) return;
        __syncthreads();
    }
}

// Compiled to fit two blocks per SM (at most 64 registers a thread, checked without spills): one
// for the manifold and one left to the application's kernels by default, or both for the manifold
// with Config::blocks_per_sm = 2. The heaviest variant of the domain must fit this budget.
//
// Roles are given by where blocks landed, not by their index: the grid has one block more than
// it has SMs' worth of compute blocks, so some SM holds two blocks, and the block scheduler picks
// which (on an H200, compute blocks 4 and 8 of 133). Had both been compute blocks, that SM would
// run two shares of every wide item at half speed and set the item's time; so, once every block
// is resident, the block that shares an SM with a lower-numbered one (the highest such) becomes
// the fetcher, and the others number themselves 0.. in block order.
extern "C" __global__ void __launch_bounds__(PPTM_BLOCK_THREADS, PPTM_MIN_BLOCKS_PER_SM) pptm_manifold(const pptm_manifold_params P) {
    __shared__ int go;
    __shared__ unsigned fetcher_block;
    pptm_device_state* S = P.state;
    if (threadIdx.x == 0) {
        // Start handshake. The last block decides for the grid whether to run (a launch the host
        // gave up on exits at once); the last block to become resident tells the host it started.
        if (blockIdx.x == gridDim.x - 1)
            pptm_st_release_gpu(&S->decision, pptm_ld_relaxed_sys(&P.control->cancel) == 0 ? 1 : 2);
        uint64_t decision;
        while ((decision = pptm_ld_acquire_gpu(&S->decision)) == 0) pptm_sleep(64);
        go = decision == 1;
        if (go) {
            uint32_t sm;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            S->smid[blockIdx.x] = sm;
            if (pptm_atom_add_acq_rel_gpu(&S->resident, 1) == gridDim.x - 1) pptm_st_release_sys(&P.control->started, 1);
            // A cooperative grid is resident all at once: wait for every block's SM.
            while (pptm_ld_acquire_gpu(&S->resident) < gridDim.x) pptm_sleep(64);
        }
        fetcher_block = 0;
    }
    __syncthreads();
    if (!go) return;
    // The highest block that shares its SM with a lower-numbered block; the last block if none.
    for (uint32_t b = threadIdx.x; b < gridDim.x; b += PPTM_BLOCK_THREADS) {
        const uint32_t sm = pptm_ld_cg_u32(&S->smid[b]);
        for (uint32_t a = 0; a < b; ++a)
            if (pptm_ld_cg_u32(&S->smid[a]) == sm) {
                atomicMax(&fetcher_block, b + 1);
                break;
            }
    }
    __syncthreads();
    const uint32_t fetcher = fetcher_block == 0 ? gridDim.x - 1 : fetcher_block - 1;
    if (blockIdx.x == fetcher)
        pptm_fetcher(P, gridDim.x - 1);
    else
        pptm_compute_loop(P, gridDim.x - 1, blockIdx.x - (blockIdx.x > fetcher ? 1u : 0u));
}

// ---- launched entry points (Variant::FusedLaunched, Variant::Unfused; see pptm/abi.h) ----------

// The descriptor into shared memory, where the variant code reads it, as in the manifold.
__device__ __forceinline__ void pptm_launch_begin(pptm_loop_smem& sh, const pptm_desc& d, pptm_launch_out* out) {
    if (threadIdx.x < PPTM_SQ_SLOT_WORDS) sh.desc_words[threadIdx.x] = reinterpret_cast<const uint32_t*>(&d)[threadIdx.x];
    if (threadIdx.x == 0) {
        pptm_beat_word = &out->progress;  // the launched variants' watchdog (launched.rs)
        pptm_beat_last = 0;
        pptm_nonfinite = 0u;
        pptm_paths = 0u;
        pptm_meet_word = nullptr;  // blocks of a launch need not be resident together: no meetings
        pptm_abort_word = nullptr;
        pptm_meets = 0u;
    }
    __syncthreads();
}

// Publishes this block's partial and its non-finite flag, and arrives. Returns true, in every
// thread, in the last block to arrive; that block may read every partial, `sh.nonfinite` says
// whether any block saw a non-finite value, and the counter is reset for the next launch.
__device__ __forceinline__ bool pptm_launch_arrive(pptm_loop_smem& sh, uint64_t* arrivals, double* partials,
                                                   double partial) {
    __syncthreads();  // every thread's finite checks are in
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = partial;
        const uint32_t bad = pptm_nonfinite;
        pptm_nonfinite = 0u;
        const uint64_t prior = gridDim.x == 1 ? 0 : pptm_atom_add_acq_rel_gpu(arrivals, 1ull | ((uint64_t)bad << 32));
        sh.last = gridDim.x == 1 || (uint32_t)prior == gridDim.x - 1;
        sh.nonfinite = bad | (uint32_t)(prior >> 32);
        if (sh.last && gridDim.x > 1) *arrivals = 0;  // every block has arrived
    }
    __syncthreads();
    return sh.last;
}

// The status a launched item or stage reports: a non-finite value seen by any block (or by the
// last block's finish) turns OK into PPTM_STATUS_NON_FINITE. Thread 0 of the last block.
__device__ __forceinline__ uint32_t pptm_launch_status(const pptm_loop_smem& sh, uint32_t status) {
    return status == PPTM_STATUS_OK && (sh.nonfinite | pptm_nonfinite) != 0 ? PPTM_STATUS_NON_FINITE : status;
}

// Fused-launched mode: one item per ordinary launch of `desc.blocks` blocks. The variant code is the
// manifold's; only the dispatch differs.
extern "C" __global__ void __launch_bounds__(PPTM_BLOCK_THREADS, PPTM_MIN_BLOCKS_PER_SM) pptm_launched(const pptm_launch_params P) {
    __shared__ pptm_loop_smem sh;
    pptm_launch_begin(sh, P.desc, P.out);
    const uint32_t op = sh.desc.opcode;
    const pptm_block_ctx ctx = {blockIdx.x, gridDim.x, sh.red};
    uint32_t status = PPTM_STATUS_OK;
    double partial = 0.0;
    if (op >= PPTM_OP_FIRST_VARIANT)
        status = pptm_variant_args_ok(sh.desc) ? pptm_run_variant(sh.desc, ctx, partial) : PPTM_STATUS_BAD_ARGUMENT;
    else if (op == PPTM_OP_DEBUG_HANG || op == PPTM_OP_DEBUG_SLOW)  // a fault would poison the process
        status = pptm_run_debug_launched(&P.out->abort, sh.desc, ctx);
    else if (op != PPTM_OP_NOOP)
        status = PPTM_STATUS_BAD_OPCODE;
    if (pptm_launch_arrive(sh, P.arrivals, P.partials, partial)) {
        double value = 0.0;
        if (status == PPTM_STATUS_OK && op >= PPTM_OP_FIRST_VARIANT) value = pptm_finish_variant(sh.desc, P.partials, gridDim.x, sh.red);
        if (threadIdx.x == 0) {
            P.out->status = pptm_launch_status(sh, status);
            P.out->paths = pptm_paths;
            P.out->value = value;
        }
    }
}

// Unfused mode: one stage of one item per launch; the generated translation unit defines
// pptm_run_stage and pptm_finish_stage.
extern "C" __global__ void __launch_bounds__(PPTM_BLOCK_THREADS, PPTM_MIN_BLOCKS_PER_SM) pptm_unfused_stage(const pptm_unfused_params P) {
    __shared__ pptm_loop_smem sh;
    pptm_launch_begin(sh, P.desc, P.out);
    const pptm_block_ctx ctx = {blockIdx.x, gridDim.x, sh.red};
    double partial = 0.0;
    const uint32_t status = pptm_run_stage(sh.desc, P.stage, P.scratch, P.out, ctx, partial);
    if (pptm_launch_arrive(sh, P.arrivals, P.partials, partial)) {
        if (status == PPTM_STATUS_OK) pptm_finish_stage(sh.desc, P.stage, P.scratch, P.out, P.partials, gridDim.x, sh.red);
        // A stage reports only trouble: OK is the launcher's initial word, and an earlier stage's
        // non-finite status must survive the stages after it.
        if (threadIdx.x == 0 && pptm_launch_status(sh, status) != PPTM_STATUS_OK) P.out->status = pptm_launch_status(sh, status);
        // The stages run one after another on one stream: this one adds its paths to theirs.
        if (threadIdx.x == 0 && pptm_paths != 0u) P.out->paths |= pptm_paths;
    }
}

// An empty kernel in the same module, for launch-overhead baselines measured beside the manifold.
extern "C" __global__ void pptm_empty() {}

// The latency floor of any host-visible result, for benchmarks: one thread answers every word the
// host writes to `in` by writing it back to `out` (both mapped host memory), until it reads ~0.
extern "C" __global__ void pptm_echo(const uint64_t* in, uint64_t* out) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    for (uint64_t last = 0;;) {
        uint64_t v;
        while ((v = pptm_ld_acquire_sys(in)) == last) {
        }
        if (v == ~0ull) return;
        pptm_st_release_sys(out, v);
        last = v;
    }
}

#endif  // PPTM_MANIFOLD_CUH
