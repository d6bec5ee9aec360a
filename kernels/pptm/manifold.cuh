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
//   bool pptm_variant_writes_memory(uint32_t opcode)
//       whether the variant stores to device memory (its completion then needs a system fence).
#ifndef PPTM_MANIFOLD_CUH
#define PPTM_MANIFOLD_CUH

#include "pptm/abi.h"
#include "pptm/device.cuh"

#define PPTM_STAGE_LOG2 6
#define PPTM_FULL_MASK 0xffffffffu
static_assert((1u << PPTM_STAGE_LOG2) == PPTM_STAGE_SLOTS, "stage ring size");
static_assert(PPTM_WARPS <= 32 && PPTM_WARPS >= 2, "the fetcher polls with all warps but one");
static_assert(sizeof(pptm_desc) == 4 * PPTM_SQ_SLOT_WORDS, "pptm_desc is one u32 per slot word");

// ---- the fetcher -------------------------------------------------------------------------------

// Sleep before the fetcher's next poll: none while items are in flight or arrived recently, then
// exponential backoff up to max_backoff_ns, so an idle manifold keeps no PCIe read outstanding.
__device__ __forceinline__ uint32_t pptm_fetch_backoff(uint32_t idle_polls, const pptm_manifold_params& P) {
    if (idle_polls < P.hot_polls) return 0;
    const uint32_t k = min(idle_polls - P.hot_polls, 16u);
    return min(100u << k, P.max_backoff_ns);
}

// Warps 0..14 each poll one SQ slot per round (one PCIe round trip for up to 15 items; one warp only
// after an empty round); the last warp reads `completed` meanwhile, for the stage ring's room.
// Ready slots are copied, re-tagged, into the stage ring. Returns after staging a shutdown item.
__device__ void pptm_fetcher(const pptm_manifold_params& P) {
    __shared__ uint32_t ready_mask;
    __shared__ uint64_t completed;
    __shared__ int shutdown;
    pptm_device_state* S = P.state;
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned poll_warps_max = PPTM_WARPS - 1;
    uint64_t staged = 0;     // the same in every thread
    uint32_t poll_warps = 1, idle_polls = 0;
    if (threadIdx.x == 0) {
        ready_mask = 0;
        completed = 0;
        shutdown = 0;
    }
    __syncthreads();
    for (;;) {
        // stage[x % STAGE_SLOTS] may be rewritten once item x - STAGE_SLOTS has completed (every
        // compute block read it before arriving).
        const uint64_t room = completed + PPTM_STAGE_SLOTS - staged;
        const uint32_t window = (uint32_t)min((uint64_t)poll_warps, room);
        uint32_t payload = 0;
        bool ready = false;
        uint64_t done = 0;
        if (warp < window) {
            const uint64_t item = staged + warp;
            const uint64_t w = pptm_ld_acquire_sys(&P.sq[item & (P.queue_slots - 1)].words[lane]);
            payload = (uint32_t)(w >> 32);
            ready = __all_sync(PPTM_FULL_MASK, (uint32_t)w == pptm_tag(item, P.queue_slots_log2));
            if (ready && lane == 0) atomicOr(&ready_mask, 1u << warp);
        } else if (warp == PPTM_WARPS - 1 && lane == 0) {
            done = pptm_ld_acquire_gpu(&S->completed);
        }
        __syncthreads();
        const uint32_t got = __ffs(~ready_mask) - 1;  // consecutive ready slots from `staged`
        if (ready && warp < got) {
            const uint64_t item = staged + warp;
            // Release: what the host wrote before submitting (and we acquired) is visible to every
            // compute block that reads this slot.
            pptm_fence_acq_rel_gpu();
            pptm_st_relaxed_gpu(&S->stage[item % PPTM_STAGE_SLOTS].words[lane], pptm_tagged(payload, pptm_tag(item, PPTM_STAGE_LOG2)));
            if (lane == 0 && payload == PPTM_OP_SHUTDOWN) shutdown = 1;
        }
        if (warp == PPTM_WARPS - 1 && lane == 0) completed = done;
        __syncthreads();
        if (shutdown) return;
        const bool in_flight = staged != completed;
        staged += got;
        if (threadIdx.x == 0) ready_mask = 0;
        if (got > 0) {
            poll_warps = poll_warps_max;
            idle_polls = 0;
        } else {
            poll_warps = 1;
            if (!in_flight && idle_polls != 0xFFFFFFFFu) idle_polls++;
            pptm_sleep(in_flight ? 0 : pptm_fetch_backoff(idle_polls, P));
        }
        __syncthreads();
    }
}

// ---- the compute blocks ------------------------------------------------------------------------

struct pptm_loop_smem {
    union {
        pptm_desc desc;  // the item this block runs
        uint32_t desc_words[PPTM_SQ_SLOT_WORDS];
    };
    double red[PPTM_WARPS];  // block-reduction scratch
    int last;
};

// Warp 0 waits until item `seq` is staged and item seq - 1 has completed, reading the stage slot and
// `completed` in the same L2 round trip, and leaves the descriptor in shared memory. Backs off
// gently after a long wait to leave L2 bandwidth to other kernels.
__device__ __forceinline__ void pptm_compute_wait(const pptm_manifold_params& P, pptm_loop_smem& sh, uint64_t seq) {
    if (threadIdx.x < 32) {
        pptm_device_state* S = P.state;
        const unsigned lane = threadIdx.x;
        const uint64_t* slot = S->stage[seq % PPTM_STAGE_SLOTS].words;
        const uint32_t tag = pptm_tag(seq, PPTM_STAGE_LOG2);
        for (uint32_t spins = 0;; ++spins) {
            const uint64_t w = pptm_ld_relaxed_gpu(slot + lane);
            const uint64_t c = lane == 0 ? pptm_ld_relaxed_gpu(&S->completed) : 0;
            const bool staged = __all_sync(PPTM_FULL_MASK, (uint32_t)w == tag);
            const bool previous_done = __shfl_sync(PPTM_FULL_MASK, c, 0) == seq;
            if (staged && previous_done) {
                sh.desc_words[lane] = (uint32_t)(w >> 32);
                break;
            }
            if (spins > 256) pptm_sleep(min(32u << min((spins - 256) / 64, 6u), 2000u));
        }
        // Acquire: everything released before the fetcher's stage stores and the last arriver's
        // `completed` store (item seq - 1's outputs) is visible to this block from here on.
        pptm_fence_acq_rel_gpu();
    }
    __syncthreads();
}

__device__ void pptm_compute_loop(const pptm_manifold_params& P, uint32_t nblocks) {
    __shared__ pptm_loop_smem sh;
    pptm_device_state* S = P.state;
    const pptm_block_ctx ctx = {blockIdx.x, nblocks, sh.red};
    for (uint64_t seq = 0;; ++seq) {
        pptm_compute_wait(P, sh, seq);
        const uint32_t op = sh.desc.opcode;

        uint32_t status = PPTM_STATUS_OK;
        double partial = 0.0;
        if (op >= PPTM_OP_FIRST_VARIANT)
            status = pptm_run_variant(sh.desc, ctx, partial);
        else if (op != PPTM_OP_NOOP && op != PPTM_OP_SHUTDOWN)
            status = PPTM_STATUS_BAD_OPCODE;

        // Arrive. The acq_rel add publishes this block's partial and outputs and, in the last
        // block, acquires every other block's.
        if (threadIdx.x == 0) {
            S->partials[blockIdx.x] = partial;
            const uint64_t before = pptm_atom_add_acq_rel_gpu(&S->arrivals, 1);
            sh.last = before == (seq + 1) * nblocks - 1;
        }
        __syncthreads();
        if (sh.last) {
            double value = 0.0;
            if (status == PPTM_STATUS_OK && op >= PPTM_OP_FIRST_VARIANT)
                value = pptm_finish_variant(sh.desc, S->partials, nblocks, sh.red);
            if (threadIdx.x == 0) {
                // The next item may start now; the completion entry follows.
                pptm_st_release_gpu(&S->completed, seq + 1);
                // Results in device memory must be visible to the host's copies before it learns
                // the item is done; a scalar result travels in the (tagged) entry itself.
                if (status == PPTM_STATUS_OK && pptm_variant_writes_memory(op)) pptm_fence_acq_rel_sys();
                const uint32_t tag = pptm_tag(seq, P.queue_slots_log2);
                const uint64_t bits = (uint64_t)__double_as_longlong(value);
                uint64_t* e = P.cq[seq & (P.queue_slots - 1)].words;
                pptm_st_relaxed_sys(e + 0, pptm_tagged(status, tag));
                pptm_st_relaxed_sys(e + 1, pptm_tagged(op, tag));
                pptm_st_relaxed_sys(e + 2, pptm_tagged((uint32_t)bits, tag));
                pptm_st_relaxed_sys(e + 3, pptm_tagged((uint32_t)(bits >> 32), tag));
            }
        }
        if (op == PPTM_OP_SHUTDOWN) return;
        __syncthreads();
    }
}

extern "C" __global__ void __launch_bounds__(PPTM_BLOCK_THREADS, 1) pptm_manifold(const pptm_manifold_params P) {
    __shared__ int go;
    pptm_device_state* S = P.state;
    const bool fetcher = blockIdx.x == gridDim.x - 1;
    if (threadIdx.x == 0) {
        // Start handshake. The fetcher decides for the grid whether to run (a launch the host gave
        // up on exits at once); the last block to become resident tells the host it started.
        if (fetcher) pptm_st_release_gpu(&S->decision, pptm_ld_relaxed_sys(&P.control->cancel) == 0 ? 1 : 2);
        uint64_t decision;
        while ((decision = pptm_ld_acquire_gpu(&S->decision)) == 0) pptm_sleep(64);
        go = decision == 1;
        if (go && pptm_atom_add_acq_rel_gpu(&S->resident, 1) == gridDim.x - 1) pptm_st_release_sys(&P.control->started, 1);
    }
    __syncthreads();
    if (!go) return;
    if (fetcher)
        pptm_fetcher(P);
    else
        pptm_compute_loop(P, gridDim.x - 1);
}

// An empty kernel in the same module, for launch-overhead baselines measured beside the manifold.
extern "C" __global__ void pptm_empty() {}

#endif  // PPTM_MANIFOLD_CUH
