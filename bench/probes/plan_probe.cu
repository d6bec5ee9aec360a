// Stand-alone probe of a plan's hand-off between dependent steps (docs/pipelines.md), for GPU hosts
// without Rust:
//
//     cargo xtask headers probe-include       # where Rust is; carry probe-include/ over
//     nvcc -cubin -O3 -arch=sm_90 -I probe-include -DPPTM_PLAN_CLOCK -o ops.cubin \
//          bench/generated/ops_compare/ops_compare.cu
//     nvcc -cubin -O3 -arch=sm_90 -I probe-include -DPPTM_PLAN_CLOCK -o gemv.cubin \
//          bench/generated/gemv_steps/gemv_steps.cu
//     nvcc -O3 -std=c++17 -I probe-include -o plan_probe bench/probes/plan_probe.cu -lcuda
//     ./plan_probe ops.cubin blend [steps] [reps]
//     ./plan_probe gemv.cubin gemv [steps] [reps]
//
// It builds one plan of `steps` dependent steps as the runtime's pipeline does (kernels/pptm/abi.h:
// the steps in the host plan arena, its counters and results in the device one): `blend`, pptm-bench's
// Blend u <- 0.5 u + 0.25 c over 4096 elements on one block, alternating two buffers (steps on one
// block need no wait); `gemv`, GemvStep y <- A x at 256 x 256 on 16 blocks (A's spectral radius
// near 1, so that 170 products neither vanish nor overflow), each step waiting for the
// whole step before it (PPTM_SYNC_DEPS). The plan is dispatched once from the host region, then kept
// (resident) and dispatched `reps` times. It prints the host-visible time, the span on the GPU, the
// steps' own time and the mean hand-off (the runtime's PipeResults::device_time), and, when the
// manifold was built with -DPPTM_PLAN_CLOCK, block 0's SM cycles per step in each part of the
// plan's walk (manifold.cuh, PPTM_PLAN_CLOCK_PART). The result is checked against an f64 reference.
#include "probe_host.h"

static constexpr int PPTM_PLAN_CLOCK_PARTS_PROBE = 6;  // manifold.cuh: PPTM_PLAN_CLOCK_PARTS
static const char* const part_names[PPTM_PLAN_CLOCK_PARTS_PROBE] = {"step visible (prefetch wait, barrier)", "waits, start stamp",
                                         "the step's pattern", "barrier, arrival", "finish, result, releases",
                                         "watchdog tick"};

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: plan_probe module.cubin blend[N]|gemv [steps] [reps]\n");
        return 2;
    }
    const bool gemv = std::strcmp(argv[2], "gemv") == 0;
    const uint32_t steps = argc > 3 ? (uint32_t)std::atoi(argv[3]) : 170;
    const int reps = argc > 4 ? std::atoi(argv[4]) : 2000;
    setvbuf(stdout, nullptr, _IOLBF, 0);
    CK(cudaFree(nullptr));
    CUmodule mod;
    CU(cuModuleLoad(&mod, argv[1]));
    CUdeviceptr clock_sums = 0;
    size_t clock_bytes = 0;
    const bool clocked = cuModuleGetGlobal(&clock_sums, &clock_bytes, mod, "pptm_plan_clock") == CUDA_SUCCESS;
    Manifold mf(mod);
    {
        int regs = 0, local = 0;
        CU(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, mf.fn));
        CU(cuFuncGetAttribute(&local, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, mf.fn));
        std::printf("manifold: %d registers, %d B local memory a thread\n", regs, local);
    }

    // The plan arenas: the steps and the results' host copy in mapped memory, the rest on the device.
    // `blend` runs on one block; `blendN` spreads each step over N blocks (the same tiles every step,
    // so no step waits for another).
    const uint32_t blocks = gemv ? 16 : (std::strlen(argv[2]) > 5 ? (uint32_t)std::atoi(argv[2] + 5) : 1u);
    const uint64_t host_bytes = steps * sizeof(pptm_plan_step) + (steps + 1) * sizeof(pptm_plan_result);
    const uint64_t dev_bytes = PPTM_PLAN_HEADER_BYTES +
                               steps * (sizeof(pptm_plan_step) + 24 + sizeof(pptm_plan_result)) +
                               (uint64_t)steps * blocks * 8;
    uint8_t* plan_host;
    CK(cudaHostAlloc((void**)&plan_host, host_bytes, cudaHostAllocMapped));
    std::memset(plan_host, 0, host_bytes);
    CK(cudaHostGetDevicePointer((void**)&mf.P.plan_host, plan_host, 0));
    CK(cudaMalloc(&mf.P.plan_dev, dev_bytes));
    mf.P.plan_host_bytes = host_bytes;
    mf.P.plan_dev_bytes = dev_bytes;
    mf.launch(0);
    int clock_khz = 0;
    CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));

    // Inputs: Blend's u and c (4096), or GemvStep's x (256) and A (256 x 256, entries uniform with
    // variance 1 / 256).
    srand(11);
    auto rnd = [](size_t n, float lo, float hi) {
        std::vector<float> v(n);
        for (auto& x : v) x = lo + (hi - lo) * (float)rand() / (float)RAND_MAX;
        return v;
    };
    const size_t len = gemv ? 256 : 4096;
    const std::vector<float> x0 = rnd(len, -1, 1), other = gemv ? rnd(len * len, -std::sqrt(3.0f) / 16, std::sqrt(3.0f) / 16) : rnd(len, -1, 1);
    float* buf[2] = {upload(x0), upload(x0)};
    float* dother = upload(other);
    const float alpha = 0.5f, beta = 0.25f;
    uint32_t abits, bbits;
    std::memcpy(&abits, &alpha, 4);
    std::memcpy(&bbits, &beta, 4);

    auto* st = reinterpret_cast<pptm_plan_step*>(plan_host);
    for (uint32_t k = 0; k < steps; ++k) {
        pptm_plan_step s{};
        pptm_desc& d = s.desc;
        const float *from = buf[k % 2], *to = buf[(k + 1) % 2];
        if (gemv) {
            d.opcode = 0x94973fa8u;  // GemvStep: x, a, out, n, m
            d.args[0] = ptr(from), d.args[1] = ptr(dother), d.args[2] = ptr(to), d.args[3] = len, d.args[4] = len;
        } else {
            d.opcode = 0x608156bdu;  // Blend: x, y, alpha, beta, out, n
            d.args[0] = ptr(from), d.args[1] = ptr(dother), d.args[2] = abits, d.args[3] = bbits, d.args[4] = ptr(to);
            d.args[5] = len;
        }
        d.blocks = blocks;
        for (uint32_t j = 0; j < PPTM_PLAN_DEPS; ++j) s.deps[j] = PPTM_DEP_NONE;
        if (gemv && k > 0) {
            s.sync = PPTM_SYNC_DEPS;
            s.deps[0] = k - 1;
            st[k - 1].flags |= PPTM_STEP_FINISHED;
        }
        s.partials = k * blocks;
        st[k] = s;
    }
    const auto* res = reinterpret_cast<const pptm_plan_result*>(plan_host + steps * sizeof(pptm_plan_step));
    pptm_desc plan{};
    plan.opcode = PPTM_OP_PLAN;
    plan.blocks = blocks;
    plan.args[0] = steps, plan.args[1] = 0, plan.args[2] = 0, plan.args[4] = 0, plan.args[5] = (uint64_t)steps * blocks;

    auto dispatch = [&](bool resident, double& host_us) {
        plan.args[3] = mf.h.next + 1;
        plan.args[6] = resident ? 1 : 0;
        uint32_t status, ns;
        double v;
        const auto t0 = std::chrono::steady_clock::now();
        mf.h.wait(mf.h.submit(plan), status, v, ns);
        host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        if (status != PPTM_STATUS_OK) {
            std::fprintf(stderr, "plan: status %u\n", status);
            mf.shutdown();
            std::exit(1);
        }
        for (uint32_t k = 0; k < steps; ++k)
            if (res[k].status != PPTM_STATUS_OK) {
                std::fprintf(stderr, "step %u: status %u\n", k, res[k].status);
                mf.shutdown();
                std::exit(1);
            }
    };

    // Once from the host region, checked against f64.
    double host_us;
    dispatch(false, host_us);
    {
        std::vector<double> u(x0.begin(), x0.end()), w(len);
        for (uint32_t k = 0; k < steps; ++k) {
            for (size_t i = 0; i < len; ++i) {
                if (gemv) {
                    double acc = 0;
                    for (size_t j = 0; j < len; ++j) acc += (double)other[i * len + j] * u[j];
                    w[i] = acc;
                } else {
                    w[i] = alpha * u[i] + beta * (double)other[i];
                }
            }
            u.swap(w);
        }
        std::vector<float> got(len);
        CK(cudaMemcpy(got.data(), buf[steps % 2], len * 4, cudaMemcpyDeviceToHost));
        double worst = 0, scale = 0;
        for (size_t i = 0; i < len; ++i) scale = std::max(scale, std::fabs(u[i]));
        for (size_t i = 0; i < len; ++i) worst = std::max(worst, std::fabs(got[i] - u[i]) / std::max(scale, 1e-30));
        std::printf("%s, %u steps on %u block(s): worst error %.2e of the largest |value| %.3e\n", gemv ? "GemvStep 256x256" : "Blend 4096",
                    steps, blocks, worst, scale);
        if (!(worst < 1e-4) && std::getenv("PLAN_PROBE_NO_CHECK") == nullptr) {
            mf.shutdown();
            return 1;
        }
    }

    std::vector<double> host, span, own, handoff;
    std::vector<double> parts(PPTM_PLAN_CLOCK_PARTS_PROBE, 0.0);
    unsigned long long sums[PPTM_PLAN_CLOCK_PARTS_PROBE + 1];
    double walked = 0;
    for (int r = 0; r < reps + 200; ++r) {
        dispatch(true, host_us);
        if (r < 200) continue;
        uint64_t first = ~0ull, last = 0;
        double items = 0;
        for (uint32_t k = 0; k < steps; ++k) {
            first = std::min(first, res[k].start);
            last = std::max(last, res[k].end);
            items += (double)(res[k].end - res[k].start);
        }
        host.push_back(host_us);
        span.push_back((last - first) / 1e3);
        own.push_back(items / 1e3);
        handoff.push_back(((double)(last - first) - items) / 1e3 / (steps - 1));
        if (clocked) {
            CK(cudaMemcpy(sums, (void*)clock_sums, sizeof(sums), cudaMemcpyDeviceToHost));
            for (int i = 0; i < PPTM_PLAN_CLOCK_PARTS_PROBE; ++i) parts[i] += (double)sums[i];
            walked += (double)sums[PPTM_PLAN_CLOCK_PARTS_PROBE];
        }
    }
    std::printf("  host median %.2f us p99 %.2f | span %.2f us | steps' own %.2f us | hand-off %.3f us (p10 %.3f, p90 %.3f) | %.3f us a step\n",
                pct(host, 0.5), pct(host, 0.99), pct(span, 0.5), pct(own, 0.5), pct(handoff, 0.5), pct(handoff, 0.1),
                pct(handoff, 0.9), pct(span, 0.5) / steps);
    if (clocked && walked > 0) {
        double total = 0;
        for (double p : parts) total += p;
        std::printf("  block 0, cycles a step (SM clock %d MHz; the clock's own reads included):\n", clock_khz / 1000);
        for (int i = 0; i < PPTM_PLAN_CLOCK_PARTS_PROBE; ++i)
            std::printf("    %-40s %7.0f cycles  %.3f us\n", part_names[i], parts[i] / walked,
                        parts[i] / walked / (clock_khz / 1e3));
        std::printf("    %-40s %7.0f cycles  %.3f us\n", "all", total / walked, total / walked / (clock_khz / 1e3));
    }
    mf.shutdown();
    return 0;
}
