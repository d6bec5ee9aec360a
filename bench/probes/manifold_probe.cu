// Stand-alone probe of the inference manifold's item latency, for GPU hosts without Rust:
//
//     cargo xtask headers probe-include       # where Rust is; carry probe-include/ over
//     nvcc -cubin -O3 -arch=sm_90 -I probe-include [-DPPTM_PHASE_TRACE] -o inference.cubin \
//          generated/inference/inference.cu
//     nvcc -O3 -std=c++17 -I probe-include -o probe bench/probes/manifold_probe.cu -lcuda
//     ./probe inference.cubin [reps] [grid]
//
// It runs generated/inference/inference.cu as compiled here (so kernels/ edits are measured
// without a codegen run or a Rust build), launches the manifold on every SM as the runtime does, drives the
// queue protocol of kernels/pptm/abi.h from the host, and prints, for a no-op, kl_complexity over
// 4096 elements and belief_update at 256 x 256, the host-visible round trip and the device time
// (median, p99). Built with -DPPTM_PHASE_TRACE the manifold stamps %globaltimer at each phase of
// every item (manifold.cuh) and the probe prints the median of each phase, relative to block 0
// taking the item, and block 0's finer steps in SM clock cycles (PPTM_CLK in device.cuh and the
// patterns). The trace's own stores and atomics shift what follows them (a call after an atomic
// waits for it), so compare traced builds with traced builds. The probe also loads PTX (the
// driver JIT-compiles it): `./probe generated/inference/compute_90.ptx` measures the committed
// NVRTC output, which is what the runtime runs. Results are checked against a CPU reference
// before timing.
#include "probe_host.h"

// What each slot of the phase trace records (manifold.cuh, PPTM_PHASE_TRACE).
static constexpr int TRACE_SLOTS = 16;
static const char* const trace_names[TRACE_SLOTS] = {
    "block 0 took the item", "block 0 ran its share", "block 0 arrived", "last block took it",
    "last block ran its share", "last block arrived", "last block finished", "last block fenced",
    "completion written", "fetcher saw the SQ slot", "fetcher staged it", "latest block took it",
    "latest block ran its share", "", "", ""};

// Block 0's clock64 steps (PPTM_CLK in device.cuh and the patterns), after slot 0 (it took the item).
static constexpr int CLK_SLOTS = 10;
static const char* const clk_names[CLK_SLOTS] = {
    "took the item", "pattern entered", "gemv_t: chunk barrier", "gemv_t: pro staged",
    "sums barrier / map: loop done", "pattern returns", "ran its share", "arrived",
    "argument test starts", "argument test done"};

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: probe inference.cubin [reps] [grid blocks]\n");
        return 2;
    }
    const int reps = argc > 2 ? std::atoi(argv[2]) : 20000;
    const int grid_override = argc > 3 ? std::atoi(argv[3]) : 0;  // blocks in all (default: SMs + 1)
    CK(cudaFree(nullptr));  // the primary context, shared with the driver API below
    CUmodule mod;
    CU(cuModuleLoad(&mod, argv[1]));
    CUdeviceptr trace = 0;
    size_t trace_bytes = 0;
    const bool traced = cuModuleGetGlobal(&trace, &trace_bytes, mod, "pptm_trace") == CUDA_SUCCESS;
    CUdeviceptr clk = 0;
    size_t clk_bytes = 0;
    const bool clocked = cuModuleGetGlobal(&clk, &clk_bytes, mod, "pptm_clk_trace") == CUDA_SUCCESS;
    Manifold mf(mod);
    mf.launch(grid_override);
    Host& h = mf.h;
    int regs = 0, local = 0, smem = 0;
    CU(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, mf.fn));
    CU(cuFuncGetAttribute(&local, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, mf.fn));
    CU(cuFuncGetAttribute(&smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, mf.fn));
    std::printf("manifold: %d regs, %d B local, %d B static smem; grid %d; phase trace %s\n", regs, local, smem, mf.grid,
                traced ? "on" : "off");
    cudaStream_t copies;
    CK(cudaStreamCreateWithFlags(&copies, cudaStreamNonBlocking));

    // Inputs.
    srand(7);
    auto rnd = [](size_t n, float lo, float hi) {
        std::vector<float> v(n);
        for (auto& x : v) x = lo + (hi - lo) * (float)rand() / (float)RAND_MAX;
        return v;
    };
    const size_t kn = 4096, m = 256, n = 256;
    auto q = rnd(kn, 0.01f, 1.0f), p = rnd(kn, 0.01f, 1.0f);
    auto obs = rnd(m, -1, 1), pred = rnd(m, -1, 1), prec = rnd(m, 0.1f, 2), J = rnd(m * n, -1, 1), mu = rnd(n, -1, 1);
    const float lr = 0.05f;
    float *dq = upload(q), *dp = upload(p), *dobs = upload(obs), *dpred = upload(pred), *dprec = upload(prec),
          *dJ = upload(J), *dmu = upload(mu), *dout;
    CK(cudaMalloc(&dout, n * 4));

    pptm_desc noop{};
    noop.opcode = PPTM_OP_NOOP;
    noop.blocks = 1;
    pptm_desc kl{};
    kl.opcode = 0x7985c08cu;
    kl.blocks = 1;
    kl.args[0] = ptr(dq), kl.args[1] = ptr(dp), kl.args[2] = kn;
    pptm_desc bu{};
    bu.opcode = 0x6a371d48u;
    bu.blocks = (uint32_t)((n + 7) / 8);
    uint32_t lrbits;
    std::memcpy(&lrbits, &lr, 4);
    bu.args[0] = ptr(dobs), bu.args[1] = ptr(dpred), bu.args[2] = ptr(dprec), bu.args[3] = ptr(dJ), bu.args[4] = ptr(dmu);
    bu.args[5] = lrbits, bu.args[6] = ptr(dout), bu.args[7] = m, bu.args[8] = n;

    // Check once.
    {
        uint32_t st, ns;
        double v;
        h.wait(h.submit(kl), st, v, ns);
        double ref = 0;
        for (size_t i = 0; i < kn; ++i) ref += (double)q[i] * (std::log((double)q[i]) - std::log((double)p[i]));
        std::printf("kl check: status %u, %.9g vs %.9g (rel %.2e)\n", st, v, ref, std::fabs(v - ref) / std::fabs(ref));
        CK(cudaMemset(dout, 0xff, n * 4));
        h.wait(h.submit(bu), st, v, ns);
        std::vector<float> got(n);
        CK(cudaMemcpy(got.data(), dout, n * 4, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (size_t j = 0; j < n; ++j) {
            double g = 0;
            for (size_t i = 0; i < m; ++i) g += (double)J[i * n + j] * (double)prec[i] * ((double)obs[i] - (double)pred[i]);
            const double r = mu[j] + lr * g;
            worst = std::max(worst, std::fabs(got[j] - r) / std::max(1e-6, std::fabs(r)));
        }
        std::printf("belief_update check: status %u, worst rel err %.2e\n", st, worst);
    }

    struct Case {
        const char* name;
        pptm_desc d;
    } cases[] = {{"no-op", noop}, {"kl_complexity 4096", kl}, {"belief_update 256x256", bu}, {"  on 16 blocks", bu},
                 {"  on 8 blocks", bu}};
    cases[3].d.blocks = 16;
    cases[4].d.blocks = 8;
    for (const Case& c : cases) {
        std::vector<double> host_us, dev_us;
        std::vector<std::vector<double>> phase(TRACE_SLOTS);
        static unsigned long long(*tr)[TRACE_SLOTS] = nullptr;
        if (!tr) CK(cudaMallocHost((void**)&tr, sizeof(unsigned long long) * PPTM_STAGE_SLOTS * TRACE_SLOTS));
        // Block 0's clock64 steps (device.cuh, PPTM_CLK), relative to its slot 0, in cycles.
        std::vector<std::vector<double>> cycles(CLK_SLOTS);
        static unsigned long long(*ck)[CLK_SLOTS] = nullptr;
        if (!ck) CK(cudaMallocHost((void**)&ck, sizeof(unsigned long long) * PPTM_STAGE_SLOTS * CLK_SLOTS));
        if (clocked) {
            CK(cudaMemsetAsync((void*)clk, 0, clk_bytes, copies));
            CK(cudaStreamSynchronize(copies));
        }
        for (int r = 0; r < reps + 1000; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            uint32_t st, ns;
            double v;
            const uint64_t seq = h.submit(c.d);
            h.wait(seq, st, v, ns);
            const auto t1 = std::chrono::steady_clock::now();
            if (st != PPTM_STATUS_OK) {
                std::fprintf(stderr, "%s: status %u\n", c.name, st);
                return 1;
            }
            if (r < 1000) continue;
            host_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
            dev_us.push_back(ns / 1e3);
            if (traced && (seq + 1) % PPTM_STAGE_SLOTS == 0) {
                CK(cudaMemcpyAsync(tr, (void*)trace, sizeof(unsigned long long) * PPTM_STAGE_SLOTS * TRACE_SLOTS, cudaMemcpyDeviceToHost, copies));
                CK(cudaStreamSynchronize(copies));
                for (uint32_t s = 0; s < PPTM_STAGE_SLOTS; ++s)
                    for (int i = 0; i < TRACE_SLOTS; ++i)
                        if (tr[s][i] != 0 && tr[s][0] != 0) phase[i].push_back(((double)tr[s][i] - (double)tr[s][0]) / 1e3);
            }
            if (clocked && (seq + 1) % PPTM_STAGE_SLOTS == 0) {
                CK(cudaMemcpyAsync(ck, (void*)clk, sizeof(unsigned long long) * PPTM_STAGE_SLOTS * CLK_SLOTS, cudaMemcpyDeviceToHost, copies));
                CK(cudaStreamSynchronize(copies));
                for (uint32_t s = 0; s < PPTM_STAGE_SLOTS; ++s)
                    for (int i = 1; i < CLK_SLOTS; ++i)
                        if (ck[s][i] > ck[s][0] && ck[s][0] != 0 && ck[s][i] - ck[s][0] < 1000000ull)
                            cycles[i].push_back((double)(ck[s][i] - ck[s][0]));
                CK(cudaMemsetAsync((void*)clk, 0, clk_bytes, copies));
                CK(cudaStreamSynchronize(copies));
            }
        }
        std::printf("%-24s host median %6.2f us p99 %6.2f | device median %5.2f us p99 %5.2f\n", c.name, pct(host_us, 0.5),
                    pct(host_us, 0.99), pct(dev_us, 0.5), pct(dev_us, 0.99));
        for (int i = 0; i < TRACE_SLOTS; ++i)
            if (!phase[i].empty())
                std::printf("    phase %2d %-28s median %+6.2f us, p10 %+6.2f, p90 %+6.2f\n", i, trace_names[i],
                            pct(phase[i], 0.5), pct(phase[i], 0.1), pct(phase[i], 0.9));
        for (int i = 1; i < CLK_SLOTS; ++i)
            if (!cycles[i].empty())
                std::printf("    block 0 step %d %-24s median %6.0f cycles, p10 %6.0f, p90 %6.0f (%zu items)\n", i, clk_names[i],
                            pct(cycles[i], 0.5), pct(cycles[i], 0.1), pct(cycles[i], 0.9), cycles[i].size());
    }

    mf.shutdown();
    std::printf("shut down\n");
    return 0;
}
