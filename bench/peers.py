#!/usr/bin/env python3
"""The chains of pptm-bench in PyTorch, timed the way pptm-bench times pptm.

    python3 bench/peers.py [--quick] [--chains a,b] [--sizes small,medium,large]
                           [--variants eager,graph,compile,compile-graph]
                           [--compile-mode MODE] [--pptm bench/results/pptm.json]
                           [--out bench/results/peers.json]

Runs where PyTorch and a GPU are (the GPU hosts). For every chain and size of pptm-bench, with the
same inputs (the counter-based generator of bench/src/cases.rs, reproduced bit for bit below):
  * eager                     -- PyTorch ops, one launch each
  * eager + CUDA graph        -- the same ops captured once with torch.cuda.graph and replayed
  * torch.compile <mode>      -- inductor (its own CUDA graphs off); max-autotune, or default with
                                 --quick (autotuning every case takes minutes)
  * torch.compile <mode> + CUDA graph -- the compiled function captured with torch.cuda.graph
For the dependent-steps cases, also hand-written CUDA (bench/probes/dependent_steps.cu, built
with nvcc where it is installed): the same steps as one kernel launch each, as a CUDA graph, and as
a graph with programmatic dependent launch (PDL), the pipeline peer of the issue that asked for
pipelines. Their inputs are the probe's own, so their values are not cross-checked.
Each call is timed on the host from the call to the result being usable on the host (a scalar is
copied to pinned host memory asynchronously, inside the graph where there is one, then the stream
is synchronised; a tensor result is synchronised), after warm-up, for about a second (a tenth
with --quick); median and p99. Device time comes from CUDA events around the call. Every variant's
result is checked against a float64 evaluation before and after timing (1e-4 relative) and is not
reported if it fails. With --pptm, the script prints each chain's relative difference from pptm's
result on the same inputs. Writes the pptm-bench/1 schema that `pptm-bench report` merges.
"""

import argparse
import datetime
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

SCHEMA = "pptm-bench/1"

# Input streams and fixed parameters: the same numbers as bench/src/cases.rs.
SEED = dict(KL_Q=1, KL_P=2, ACC_OBS=3, ACC_PRED=4, ACC_PREC=5, BEL_OBS=6, BEL_PRED=7, BEL_PREC=8,
            BEL_J=9, BEL_MU=10, DIST_X=11, TE_X=12, TE_Y=13, TE_Z=14, TE_EPS=15, GEMV_A=16,
            GEMV_X=17, GEMV_Y=18, MM_A=19, MM_W=20, MM_B=21, MM16_A=22, MM16_W=23, MM16_B=24,
            RES_X=25, RES_Y=26)
BELIEF_LR = 0.1
GEMV_ALPHA, GEMV_BETA = 1.0, 0.5
KTH_K, KTH_D = 4, 4
TE_K, TE_EPS_SCALE = 4, 0.1
PSI_K = sum(1.0 / i for i in range(1, TE_K)) - 0.5772156649015329  # digamma(TE_K)
SIZES = ["small", "medium", "large"]
CHAINS = ["kl_complexity", "accuracy_pipeline", "row_squared_residual", "dependent_steps_pipeline",
          "dependent_steps_kept", "dependent_steps_fused", "dependent_gemv_pipeline",
          "dependent_gemv_kept", "belief_update", "belief_update_bf16",
          "distance_kth", "te_reduction", "gemv_axpby_sum", "gemv_axpby_sum_bf16",
          "gemv_axpby_sum_fp16", "matmul_bias_gelu", "matmul_bias_gelu_bf16x3", "matmul_bias_gelu_bf16"]
# What a result must match its float64 reference to: 1e-4, but 1e-2 where PyTorch rounds to bf16
# (the product before the bias; x and A x of a bf16 GEMV), which pptm does not (the plan's bar for
# bf16 operands).
TOLERANCE = {"matmul_bias_gelu_bf16": 1e-2, "gemv_axpby_sum_bf16": 1e-2, "belief_update_bf16": 1e-2,
             "gemv_axpby_sum_fp16": 1e-2}


def uniform(seed, n):
    """n values of stream `seed`, uniform in (0, 1]: splitmix64 of (seed, i), as cases.rs."""
    g = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) * g + np.arange(n, dtype=np.uint64) + g
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return ((z >> np.uint64(40)).astype(np.float32) + np.float32(1)) / np.float32(16777216)


def check_generator():
    bits = uniform(1, 3).view(np.uint32).tolist()
    want = [1054667070, 1061088142, 1061144647]  # pinned in cases.rs's tests as well
    if bits != want:
        sys.exit(f"peers.py: the input generator differs from pptm-bench's ({bits} != {want})")


def cases(torch):
    """(chain, size, shape, x, bytes, flops, inputs(dtype) -> tuple, fn(*inputs), scalar?)"""
    out = []
    dev = "cuda"

    def t(seed, n, dtype, shape=None, scale=1.0):
        a = torch.from_numpy(uniform(seed, n) * np.float32(scale)).to(dev)
        a = a.to(dtype)
        return a.reshape(shape) if shape else a

    for size, n in zip(SIZES, [4096, 1 << 20, 1 << 26]):
        out.append(("kl_complexity", size, f"n = {n}", n, 8 * n, 4 * n,
                    lambda d, n=n: (t(SEED["KL_Q"], n, d), t(SEED["KL_P"], n, d)),
                    lambda q, p: torch.where(q > 0, q * (torch.log(q) - torch.log(p)), 0).sum(),
                    True))
        out.append(("accuracy_pipeline", size, f"n = {n}", n, 12 * n, 4 * n,
                    lambda d, n=n: (t(SEED["ACC_OBS"], n, d), t(SEED["ACC_PRED"], n, d),
                                    t(SEED["ACC_PREC"], n, d)),
                    lambda o, p, w: -0.5 * (w * (o - p) ** 2).sum(),
                    True))
    for size, (rows, cols) in zip(SIZES, [(64, 64), (1024, 1024), (16384, 4096)]):
        n = rows * cols
        out.append(("row_squared_residual", size, f"{rows} x {cols}", n, 8 * n + 4 * rows, 5 * n,
                    lambda d, n=n, rows=rows, cols=cols: (t(SEED["RES_X"], n, d, (rows, cols)),
                                                          t(SEED["RES_Y"], n, d, (rows, cols))),
                    lambda x, y: ((1.0 * x - 0.5 * y) ** 2).sum(dim=1),
                    False))
    for size, stages in zip(SIZES, [8, 32, 170]):
        # Dependent steps u <- 0.5 u + 0.25 c over 4096 elements, as cases.rs's: eager runs a
        # kernel a step; torch.compile fuses them all. The same computation serves the three pptm
        # cases (the pipeline built each time, kept and run again, one chain with `repeat`).
        def steps(x, c, stages=stages):
            u = x
            for _ in range(stages):
                u = 0.5 * u + 0.25 * c
            return u
        for chain in ("dependent_steps_pipeline", "dependent_steps_kept", "dependent_steps_fused"):
            out.append((chain, size, f"{stages} steps of n = 4096", stages, 12 * 4096 * stages,
                        3 * 4096 * stages,
                        lambda d: (t(SEED["RES_X"], 4096, d), t(SEED["RES_Y"], 4096, d)),
                        steps, False))
    for size, stages in zip(SIZES, [8, 32, 170]):
        # Dependent GEMVs u <- A u, A 256 x 256 (uniform over 128, as cases.rs): one kernel a
        # step whatever the variant (torch.compile does not fuse dependent matrix products).
        def gemv_steps(a, x, stages=stages):
            u = x
            for _ in range(stages):
                u = a @ u
            return u
        for chain in ("dependent_gemv_pipeline", "dependent_gemv_kept"):
            out.append((chain, size, f"{stages} steps of 256 x 256", stages,
                        4 * (256 * 256 + 512) * stages, 2 * 256 * 256 * stages,
                        lambda d: (t(SEED["GEMV_A"], 256 * 256, d, (256, 256), 1.0 / 128),
                                   t(SEED["GEMV_X"], 256, d)),
                        gemv_steps, False))
    for size, n in zip(SIZES, [256, 1024, 4096]):
        m = n
        out.append(("belief_update", size, f"m = n = {n}", n, 4 * (m * n + 3 * m + 2 * n),
                    2 * m * n + 4 * m,
                    lambda d, n=n, m=m: (t(SEED["BEL_OBS"], m, d), t(SEED["BEL_PRED"], m, d),
                                         t(SEED["BEL_PREC"], m, d),
                                         t(SEED["BEL_J"], m * n, d, (m, n)),
                                         t(SEED["BEL_MU"], n, d)),
                    lambda o, p, w, j, mu: mu + BELIEF_LR * (j.t() @ (w * (o - p))),
                    False))
    for size, n in zip(SIZES, [256, 1024, 4096]):
        # J's values rounded to bf16 (as cases.rs); what a user writes multiplies in bf16, so the
        # weighted error is rounded to bf16 too. The float64 reference uses the same bf16 J.
        m = n
        def bel16(d, n=n, m=m):
            j = t(SEED["BEL_J"], m * n, torch.float32, (m, n)).to(torch.bfloat16)
            return (t(SEED["BEL_OBS"], m, d), t(SEED["BEL_PRED"], m, d), t(SEED["BEL_PREC"], m, d),
                    j.to(d) if d == torch.float64 else j, t(SEED["BEL_MU"], n, d))
        out.append(("belief_update_bf16", size, f"m = n = {n}, J bf16", n,
                    2 * m * n + 4 * (3 * m + 2 * n), 2 * m * n + 4 * m, bel16,
                    lambda o, p, w, j, mu: mu + BELIEF_LR * (j.t() @ (w * (o - p)).to(j.dtype)).to(mu.dtype),
                    False))
    for size, n in zip(SIZES, [1024, 4096, 16384]):
        # The k-th smallest distance to the others is the (k+1)-th of the row with the point
        # itself (distance 0, the smallest), whatever the ties.
        out.append(("distance_kth", size, f"n = {n}, d = {KTH_D}, k = {KTH_K}", n,
                    4 * (n * KTH_D + n), 3 * n * (n - 1) * KTH_D,
                    lambda d, n=n: (t(SEED["DIST_X"], n * KTH_D, d, (n, KTH_D)),),
                    lambda x: torch.topk((x[:, None, :] - x[None, :, :]).abs().amax(-1),
                                         KTH_K + 1, dim=1, largest=False).values[:, KTH_K],
                    False))

        def te(x, y, z, eps):
            dx = (x[:, None] - x[None, :]).abs()
            dy = (y[:, None] - y[None, :]).abs()
            dz = (z[:, None] - z[None, :]).abs()
            e = eps[:, None]
            # Every point is within its own radius (distance 0 < eps): subtract it.
            nxz = (torch.maximum(dx, dz) < e).sum(1) - 1
            nyz = (torch.maximum(dy, dz) < e).sum(1) - 1
            nz = (dz < e).sum(1) - 1
            dg = lambda c: torch.special.digamma(c.to(x.dtype) + 1)
            return PSI_K + (dg(nz) - dg(nxz) - dg(nyz)).mean()

        out.append(("te_reduction", size, f"n = {n}, d = 1 each, k = {TE_K}", n, 16 * n,
                    11 * n * (n - 1),
                    lambda d, n=n: (t(SEED["TE_X"], n, d), t(SEED["TE_Y"], n, d),
                                    t(SEED["TE_Z"], n, d), t(SEED["TE_EPS"], n, d, None,
                                                             TE_EPS_SCALE)),
                    te, True))
    for size, n in zip(SIZES, [256, 4096, 16384]):
        m = n
        out.append(("gemv_axpby_sum", size, f"m = n = {n}", n, 4 * (m * n + m + n),
                    2 * m * n + 5 * m,
                    lambda d, n=n, m=m: (t(SEED["GEMV_X"], n, d),
                                         t(SEED["GEMV_A"], m * n, d, (m, n)),
                                         t(SEED["GEMV_Y"], m, d)),
                    lambda x, a, y: ((GEMV_ALPHA * (a @ x) + GEMV_BETA * y) ** 2).sum(),
                    True))
    for size, n in zip(SIZES, [256, 4096, 16384]):
        # A's values rounded to bf16 (as cases.rs); what a user writes multiplies in bf16, so x is
        # rounded to bf16 too and A x comes back in bf16. The float64 reference multiplies the
        # same bf16 A by the f32 x.
        m = n
        for chain, dtype in [("gemv_axpby_sum_bf16", torch.bfloat16), ("gemv_axpby_sum_fp16", torch.float16)]:
            def gemv16(d, n=n, m=m, dtype=dtype):
                a = t(SEED["GEMV_A"], m * n, torch.float32, (m, n)).to(dtype)
                return (t(SEED["GEMV_X"], n, d), a.to(d) if d == torch.float64 else a,
                        t(SEED["GEMV_Y"], m, d))
            note = "A bf16" if dtype == torch.bfloat16 else "A fp16 (CUDA cores)"
            out.append((chain, size, f"m = n = {n}, {note}", n, 2 * m * n + 4 * (m + n),
                        2 * m * n + 5 * m, gemv16,
                        lambda x, a, y: ((GEMV_ALPHA * (a @ x.to(a.dtype)).to(x.dtype)
                                          + GEMV_BETA * y) ** 2).sum(),
                        True))
    # The f32 dense layer; pptm runs it on CUDA cores (matmul_bias_gelu) and on tensor cores at
    # f32's accuracy (matmul_bias_gelu_bf16x3): PyTorch's f32 matmul (cuBLAS SGEMM) is the peer of both.
    for chain in ["matmul_bias_gelu", "matmul_bias_gelu_bf16x3"]:
        for size, (m, k, n) in zip(SIZES, [(64, 256, 256), (1024, 1024, 1024), (4096, 4096, 4096)]):
            out.append((chain, size, f"{m}×{k}×{n} f32", m, 4 * (m * k + k * n + n + m * n),
                        2 * m * k * n,
                        lambda d, m=m, k=k, n=n: (t(SEED["MM_A"], m * k, d, (m, k)),
                                                  t(SEED["MM_W"], k * n, d, (k, n)),
                                                  t(SEED["MM_B"], n, d)),
                        lambda a, w, b: torch.nn.functional.gelu(a @ w + b),
                        False))
    for size, (m, k, n) in zip(SIZES, [(64, 256, 256), (1024, 1024, 1024), (8192, 8192, 8192)]):
        # bf16 operands centred on 0 (as cases.rs's centred_bf16), an f32 bias: what a user
        # writes, `gelu(a @ w + b)`, multiplies in bf16 and adds the f32 bias to the bf16 product.
        # The float64 reference multiplies the same bf16 values.
        def mm16(d, m=m, k=k, n=n):
            def c(seed, count, shape, dtype):
                v = torch.from_numpy(uniform(SEED[seed], count) - np.float32(0.5)).to(dev)
                v = v.to(torch.bfloat16) if dtype is not None else v
                v = v.to(d) if d == torch.float64 else v
                return v.reshape(shape) if shape else v
            return (c("MM16_A", m * k, (m, k), torch.bfloat16), c("MM16_W", k * n, (k, n), torch.bfloat16),
                    c("MM16_B", n, None, None))
        out.append(("matmul_bias_gelu_bf16", size, f"{m}×{k}×{n} bf16", m,
                    2 * (m * k + k * n) + 4 * (n + m * n), 2 * m * k * n, mm16,
                    lambda a, w, b: torch.nn.functional.gelu(a @ w + b),
                    False))
    return out


def stat(ts):
    ts = sorted(ts)
    return dict(median=ts[len(ts) // 2] * 1e6, p99=ts[min(len(ts) * 99 // 100, len(ts) - 1)] * 1e6,
                reps=len(ts))


def time_loop(torch, call, budget, max_reps):
    """Warm-up for a tenth of the budget, then time; returns (host stat, device stat)."""
    start = time.perf_counter()
    warm = 0
    while warm < 3 or time.perf_counter() - start < budget / 10:
        call()
        warm += 1
    per = (time.perf_counter() - start) / warm
    reps = max(10, min(max_reps, int(budget / max(per, 1e-9))))
    host, device = [], []
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    for i in range(reps):
        t0 = time.perf_counter()
        ev[i][0].record()
        call(ev[i][1])
        host.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    device = [a.elapsed_time(b) * 1e-3 for a, b in ev]
    return stat(host), stat(device)


def summary(torch, r):
    return float(r.double().sum().item()) if r.dim() > 0 else float(r.double().item())


def max_rel(torch, got, want):
    """Norm-wise: the largest error over the largest reference magnitude (a GEMV output may
    cancel to near zero, so an element-wise ratio would judge rounding, not correctness)."""
    got, want = got.double(), want.double()
    if not torch.isfinite(got).all():
        return math.inf
    return float(((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item())


def nvidia_smi(query):
    try:
        o = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                           capture_output=True, text=True, check=True)
        return o.stdout.strip().splitlines()[0]
    except Exception:
        return None


# The dependent-steps cases (the probe's elementwise stages, then its GEMVs) and the probe's
# stage counts by size.
DEPENDENT_STEPS = ("dependent_steps_waited", "dependent_steps_pipeline", "dependent_steps_kept",
                   "dependent_steps_fused")
DEPENDENT_GEMV = ("dependent_gemv_waited", "dependent_gemv_pipeline", "dependent_gemv_kept")
STEPS_BY_SIZE = {"small": 8, "medium": 32, "large": 170}
CUDA_PEERS = {"launches": "CUDA launches (hand-written)", "graph": "CUDA graph (hand-written)",
              "graph+PDL": "CUDA graph + PDL (hand-written)"}


class Progress:
    """A progress bar on stderr, one line per step (so it interleaves cleanly with the results
    printed on stdout): how many steps are done, the time so far, and the case being timed."""

    def __init__(self, total):
        self.total, self.steps, self.start = total, 0, time.monotonic()

    def step(self, what):
        width = 24
        filled = width * self.steps // max(self.total, 1)
        self.steps += 1
        bar = "#" * filled + "-" * (width - filled)
        print(f"[{bar}] {self.steps}/{self.total} {time.monotonic() - self.start:5.0f} s  {what}",
              file=sys.stderr, flush=True)

    def done(self):
        print(f"[{'#' * 24}] {self.total}/{self.total} {time.monotonic() - self.start:5.0f} s",
              file=sys.stderr, flush=True)


def cuda_peers(chains, sizes):
    """The hand-written CUDA peers of the dependent-steps cases: (results, refused)."""
    wanted = [c for c in chains if c in DEPENDENT_STEPS + DEPENDENT_GEMV]
    if not wanted:
        return [], []
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                    if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probes", "dependent_steps.cu")
    def refuse_all(reason):
        print(f"REFUSED hand-written CUDA peers: {reason}", flush=True)
        return [], [dict(chain=c, size=z, variant=v, reason=reason) for c in wanted for z in sizes
                     for v in CUDA_PEERS.values()]
    if nvcc is None:
        return refuse_all("nvcc is not installed here")
    exe = os.path.join(tempfile.mkdtemp(), "dependent_steps")
    try:
        subprocess.run([nvcc, "-O3", "-arch=native", "-o", exe, src], check=True,
                       capture_output=True, text=True)
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    except (subprocess.CalledProcessError, OSError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        return refuse_all(f"the probe did not build or run: {detail.strip().splitlines()[-1:]}")
    line = re.compile(r"^(elementwise 4096|gemv 256x256), (launches|graph|graph\+PDL)\s+(\d+) "
                      r"stages\s+median\s+([\d.]+) us\s+p99\s+([\d.]+) us")
    results = []
    for text in out.splitlines():
        m = line.match(text)
        if not m:
            continue
        what, kind = m.group(1), m.group(2)
        stages, med, p99 = int(m.group(3)), float(m.group(4)), float(m.group(5))
        if what.startswith("gemv"):
            family, shape = DEPENDENT_GEMV, f"{stages} steps of 256 x 256"
            nbytes, flops = 4 * (256 * 256 + 512) * stages, 2 * 256 * 256 * stages
        else:
            family, shape = DEPENDENT_STEPS, f"{stages} steps of n = 4096"
            nbytes, flops = 12 * 4096 * stages, 3 * 4096 * stages
        for size, n in STEPS_BY_SIZE.items():
            if n != stages or size not in sizes:
                continue
            for chain in (c for c in wanted if c in family):
                results.append(dict(chain=chain, size=size, shape=shape,
                                    x=float(stages), variant=CUDA_PEERS[kind],
                                    host_us=dict(median=med, p99=p99, reps=500), device_us=None,
                                    gbps=nbytes / (med * 1e3), tflops=flops / (med * 1e6),
                                    max_rel_err=None, value=None))
            print(f"{family[0][:-7]:<18} {size:<7} {CUDA_PEERS[kind]:<40} median {med:10.2f} µs  "
                  f"p99 {p99:10.2f} µs", flush=True)
    return results, []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--chains")
    ap.add_argument("--sizes")
    ap.add_argument("--variants", default="eager,graph,compile,compile-graph")
    ap.add_argument("--compile-mode",
                    help="torch.compile mode (default: max-autotune; default with --quick, whose "
                         "autotuning alone would take minutes)")
    ap.add_argument("--pptm", help="pptm-bench's results, to cross-check results against")
    ap.add_argument("--out", default="bench/results/peers.json")
    a = ap.parse_args()
    check_generator()

    import torch
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 means f32, as in pptm's f32 matmul
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch._dynamo.config.cache_size_limit = 256
    budget, max_reps = (0.12, 2000) if a.quick else (1.0, 20000)
    wanted_chains = a.chains.split(",") if a.chains else CHAINS
    wanted_sizes = a.sizes.split(",") if a.sizes else SIZES
    variants = a.variants.split(",")
    mode = a.compile_mode or ("default" if a.quick else "max-autotune")
    # Inductor's own CUDA graphs stay off: the graph variants capture by hand, which costs less
    # per call than cudagraph trees.
    compile_mode = {"max-autotune": "max-autotune-no-cudagraphs",
                    "reduce-overhead": "default"}.get(mode, mode)
    names = {"eager": "torch eager", "graph": "torch eager + CUDA graph",
             "compile": f"torch.compile {mode}",
             "compile-graph": f"torch.compile {mode} + CUDA graph"}
    pptm_values = {}
    if a.pptm:
        with open(a.pptm) as f:
            for m in json.load(f)["results"]:
                if m["variant"] == "pptm fused persistent" and m.get("value") is not None:
                    pptm_values[(m["chain"], m["size"])] = m["value"]

    results, refused = [], []
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    def save(partial):
        """Writes the results so far (`partial` until the end: a run cut short keeps them)."""
        smi = nvidia_smi("name,driver_version")
        name, driver = (smi.split(", ") + ["", ""])[:2] if smi else (torch.cuda.get_device_name(), "")
        clocks = nvidia_smi("clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw") \
            if not partial else None
        doc = dict(schema=SCHEMA, source="peers", date=started,
                   commit=f"torch {torch.__version__}", quick=a.quick, partial=partial,
                   device=dict(name=name, driver=driver,
                               clocks=[f"after: sm, mem, max sm, temperature, power = {clocks}"]
                               if clocks else []),
                   results=results, refused=refused)
        with open(a.out + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(a.out + ".tmp", a.out)

    selected = [c for c in cases(torch) if c[0] in wanted_chains and c[1] in wanted_sizes]
    progress = Progress(len(selected) * len(variants))
    for chain, size, shape, x, nbytes, flops, make, fn, scalar in selected:
        inputs = make(torch.float32)
        with torch.no_grad():
            want = fn(*make(torch.float64)) if chain not in ("distance_kth", "te_reduction") \
                else None
            eager_value = None
            compiled = None
            # A scalar result is copied to pinned host memory without a blocking .item() (the
            # fastest way to get it to the host), inside the graph where there is one.
            host_buf = torch.empty((), dtype=torch.float32, pin_memory=True)

            def to_host(r):
                if scalar:
                    host_buf.copy_(r, non_blocking=True)
                return r

            for v in variants:
                name = names[v]
                progress.step(f"{chain} {size} {name}")
                try:
                    if v == "eager":
                        f = lambda: to_host(fn(*inputs))
                    elif v in ("graph", "compile-graph"):
                        # Captured once (after warm-up on a side stream), replayed per call.
                        if v == "compile-graph" and compiled is None:
                            compiled = torch.compile(fn, mode=compile_mode, dynamic=False)
                        body = fn if v == "graph" else compiled
                        s = torch.cuda.Stream()
                        s.wait_stream(torch.cuda.current_stream())
                        with torch.cuda.stream(s):
                            for _ in range(3):
                                body(*inputs)
                        torch.cuda.current_stream().wait_stream(s)
                        g = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(g):
                            static_out = to_host(body(*inputs))
                        f = lambda g=g, o=static_out: (g.replay(), o)[1]
                    elif v == "compile":
                        compiled = torch.compile(fn, mode=compile_mode, dynamic=False)
                        f = lambda c=compiled: to_host(c(*inputs))
                    else:
                        raise ValueError(f"unknown variant {v}")

                    def call(end=None, f=f):
                        r = f()
                        if end is not None:
                            end.record()
                        torch.cuda.current_stream().synchronize()
                        if scalar:
                            host_buf.item()  # on the host already: no device access
                        return r

                    def checked(f=f):
                        r = f().clone()
                        torch.cuda.synchronize()
                        if want is not None:
                            err = max_rel(torch, r, want)
                        elif eager_value is not None:
                            err = abs(summary(torch, r) - eager_value) / max(abs(eager_value), 1e-30)
                        else:
                            err = 0.0 if torch.isfinite(r).all() else math.inf
                        if not err <= TOLERANCE.get(chain, 1e-4):
                            raise RuntimeError(f"relative error {err:.2e} against the reference")
                        return err, summary(torch, r)

                    err0, value = checked()
                    if v == "eager":
                        eager_value = value
                    host, device = time_loop(torch, call, budget, max_reps)
                    err1, _ = checked()
                except Exception as e:  # a peer that fails is reported as refused, not fatal
                    reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                    print(f"REFUSED {chain} {size} {name}: {reason}", flush=True)
                    refused.append(dict(chain=chain, size=size, variant=name, reason=reason))
                    torch.cuda.synchronize()
                    save(partial=True)
                    continue
                med = host["median"]
                results.append(dict(chain=chain, size=size, shape=shape, x=float(x), variant=name,
                                    host_us=host, device_us=device, gbps=nbytes / (med * 1e3),
                                    tflops=flops / (med * 1e6), max_rel_err=max(err0, err1),
                                    value=value))
                save(partial=True)
                cross = ""
                if (chain, size) in pptm_values:
                    p = pptm_values[(chain, size)]
                    cross = f"  vs pptm {abs(value - p) / max(abs(value), 1e-30):.1e}"
                print(f"{chain:<18} {size:<7} {name:<40} median {med:10.2f} µs  "
                      f"p99 {host['p99']:10.2f} µs{cross}", flush=True)
        del inputs
        torch.cuda.empty_cache()

    progress.done()
    more, gone = cuda_peers(wanted_chains, wanted_sizes)
    results += more
    refused += gone

    save(partial=False)
    print(f"wrote {a.out} ({len(results)} measurements, {len(refused)} refused)")


if __name__ == "__main__":
    main()
