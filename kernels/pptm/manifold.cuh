// The manifold: one persistent cooperative kernel per domain, launched once, that runs the domain's
// fused variants as the host submits them and returns only on a shutdown item.
//
// The generated translation unit defines, before including this file:
//   uint32_t pptm_run_variant(const pptm_desc&, const pptm_block_ctx&, double& partial)
//       runs this block's share of the variant; returns a PPTM_STATUS_* word (uniform across blocks)
//       and, for reducing variants, the block's partial (valid in thread 0);
//   double pptm_finish_variant(const pptm_desc&, const double* partials, uint32_t nblocks, double* smem)
//       called by every thread of the last-arriving block; returns the item's scalar in thread 0.
//
// Protocol and ownership of every shared word: see pptm/abi.h.
#ifndef PPTM_MANIFOLD_CUH
#define PPTM_MANIFOLD_CUH

#include "pptm/abi.h"
#include "pptm/device.cuh"

static_assert(PPTM_WARPS < 32, "the leader's ready mask needs a spare bit");
static_assert(sizeof(pptm_desc) == 128, "pptm_desc is 32 u32 words");

struct pptm_loop_smem {
    pptm_desc desc;            // the item this block runs
    double red[PPTM_WARPS];    // block-reduction scratch
    uint64_t staged;           // block 0 only: items staged so far
    uint64_t completed;        // block 0 only: last read of state->completed
    uint32_t ready_mask;       // block 0 only: which polled SQ slots were ready
    uint32_t poll_warps;       // block 0 only: how many slots to poll next time
    uint32_t idle_polls;       // block 0 only: consecutive empty polls with nothing in flight
    int go;
    int last;
};

__device__ __forceinline__ uint32_t pptm_sq_tag(uint64_t seq, uint32_t queue_slots_log2) {
    return (uint32_t)((seq >> queue_slots_log2) % 0xFFFFFFFFull) + 1u;
}

// Sleep before the leader's next poll of the SQ. Hot (no sleep) while work is in flight or arrived
// recently; then exponential backoff up to max_backoff_ns, so an idle manifold does not keep a
// PCIe read outstanding all the time.
__device__ __forceinline__ uint32_t pptm_leader_backoff(uint32_t idle_polls, bool in_flight,
                                                        const pptm_manifold_params& P) {
    if (in_flight || idle_polls < P.hot_polls) return 0;
    const uint32_t k = min(idle_polls - P.hot_polls, 16u);
    return min(100u << k, P.max_backoff_ns);
}

// Block 0: copies ready SQ slots into the stage ring (up to one slot per warp per poll, all read in
// one PCIe round trip) until item `seq` is staged and item seq - 1 has completed.
__device__ void pptm_leader_wait(const pptm_manifold_params& P, pptm_loop_smem& sh, uint64_t seq) {
    pptm_device_state* S = P.state;
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    for (;;) {
        if (threadIdx.x == 0) {
            sh.completed = pptm_ld_acquire_gpu(&S->completed);
            sh.ready_mask = 0;
        }
        __syncthreads();
        const uint64_t staged = sh.staged, completed = sh.completed;
        // stage[x % PPTM_STAGE_SLOTS] may be rewritten once item x - PPTM_STAGE_SLOTS has completed.
        const uint64_t room = completed + PPTM_STAGE_SLOTS - staged;
        const uint32_t window = (uint32_t)min((uint64_t)sh.poll_warps, room);
        uint32_t payload = 0;
        bool ready = false;
        if (warp < window) {
            const uint64_t item = staged + warp;
            const pptm_sq_slot* slot = P.sq + (item & (P.queue_slots - 1));
            const uint64_t w = pptm_ld_relaxed_sys(&slot->words[lane]);
            payload = (uint32_t)(w >> 32);
            ready = __all_sync(0xffffffffu, (uint32_t)w == pptm_sq_tag(item, P.queue_slots_log2));
            if (ready && lane == 0) atomicOr(&sh.ready_mask, 1u << warp);
        }
        __syncthreads();
        const uint32_t got = __ffs(~sh.ready_mask) - 1;  // consecutive ready slots from `staged`
        if (ready && warp < got) {
            // Order the host's earlier writes (buffer uploads it waited for before submitting) before
            // anything this item publishes to the grid.
            pptm_fence_acq_rel_sys();
            uint32_t* dst = reinterpret_cast<uint32_t*>(&S->stage[(staged + warp) % PPTM_STAGE_SLOTS]);
            dst[lane] = payload;
            __threadfence();
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            if (got > 0) {
                sh.staged = staged + got;
                pptm_st_release_gpu(&S->staged, staged + got);
                sh.poll_warps = PPTM_WARPS;
                sh.idle_polls = 0;
            } else {
                sh.poll_warps = 1;
                if (staged == completed && sh.idle_polls != 0xFFFFFFFFu) sh.idle_polls++;
            }
            sh.go = (staged + got > seq) && (completed == seq);
        }
        __syncthreads();
        if (sh.go) return;
        if (got == 0) pptm_sleep(pptm_leader_backoff(sh.idle_polls, staged != completed, P));
        __syncthreads();
    }
}

// Every other block: thread 0 waits until item `seq` is staged and item seq - 1 has completed.
// Polls L2 only; backs off gently after a long wait to leave L2 bandwidth to other kernels.
__device__ void pptm_follower_wait(const pptm_manifold_params& P, uint64_t seq) {
    if (threadIdx.x == 0) {
        pptm_device_state* S = P.state;
        for (uint32_t spins = 0;; ++spins) {
            if (pptm_ld_acquire_gpu(&S->completed) == seq && pptm_ld_acquire_gpu(&S->staged) > seq) break;
            if (spins > 256) pptm_sleep(min(32u << min((spins - 256) / 64, 6u), 2000u));
        }
    }
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(PPTM_BLOCK_THREADS, 1) pptm_manifold(const pptm_manifold_params P) {
    __shared__ pptm_loop_smem sh;
    pptm_device_state* S = P.state;
    const uint32_t nblocks = gridDim.x;
    const pptm_block_ctx ctx = {blockIdx.x, nblocks, sh.red};
    if (threadIdx.x == 0) {
        sh.staged = 0;
        sh.poll_warps = 1;
        sh.idle_polls = 0;
        // Start handshake. Block 0 decides for the grid whether to run (a launch the host gave
        // up on exits at once); the last block to become resident tells the host it started.
        if (blockIdx.x == 0) pptm_st_release_gpu(&S->decision, pptm_ld_relaxed_sys(&P.control->cancel) == 0 ? 1 : 2);
        uint64_t decision;
        while ((decision = pptm_ld_acquire_gpu(&S->decision)) == 0) pptm_sleep(64);
        sh.go = decision == 1;
        if (sh.go && pptm_atom_add_acq_rel_gpu(&S->resident, 1) == nblocks - 1)
            pptm_st_release_sys(&P.control->started, 1);
    }
    __syncthreads();
    if (!sh.go) return;

    for (uint64_t seq = 0;; ++seq) {
        if (blockIdx.x == 0)
            pptm_leader_wait(P, sh, seq);
        else
            pptm_follower_wait(P, seq);

        // Fetch the descriptor from the stage ring through L2 (another block wrote it).
        if (threadIdx.x < 32) {
            const uint32_t* src = reinterpret_cast<const uint32_t*>(&S->stage[seq % PPTM_STAGE_SLOTS]);
            reinterpret_cast<uint32_t*>(&sh.desc)[threadIdx.x] = pptm_ld_cg_u32(src + threadIdx.x);
        }
        __syncthreads();
        const uint32_t op = sh.desc.opcode;

        uint32_t status = PPTM_STATUS_OK;
        double partial = 0.0;
        if (op >= PPTM_OP_FIRST_VARIANT)
            status = pptm_run_variant(sh.desc, ctx, partial);
        else if (op != PPTM_OP_NOOP && op != PPTM_OP_SHUTDOWN)
            status = PPTM_STATUS_BAD_OPCODE;

        // Arrive. The acq_rel add publishes this block's partial and, in the last block, acquires
        // every other block's.
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
                pptm_cq_entry* e = P.cq + (seq & (P.queue_slots - 1));
                pptm_st_relaxed_sys(reinterpret_cast<uint64_t*>(&e->status), ((uint64_t)op << 32) | status);
                pptm_st_relaxed_sys(reinterpret_cast<uint64_t*>(&e->value), (uint64_t)__double_as_longlong(value));
                pptm_st_release_sys(&e->seq_plus_one, seq + 1);
                pptm_st_release_gpu(&S->completed, seq + 1);
            }
        }
        if (op == PPTM_OP_SHUTDOWN) return;
        __syncthreads();
    }
}

// An empty kernel in the same module, for launch-overhead baselines measured beside the manifold.
extern "C" __global__ void pptm_empty() {}

#endif  // PPTM_MANIFOLD_CUH
