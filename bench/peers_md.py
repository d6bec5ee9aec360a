#!/usr/bin/env python3
"""PyTorch peers of issue 36 B: molecular dynamics with a learned-style force field.

    python3 bench/peers_md.py [--atoms 10,50,100,1000,10000] [--steps 1000] [--width 64]
                              [--variants eager,graph,compile,compile-graph] [--out FILE]
                              [--quick] [--cpu-smoke] [--check-forces FILE]
                              [--bench-json FILE]

The model, fixed here so that pptm's version can be held to it (every weight comes from the
splitmix64 streams of bench/peers.py's `uniform`, as pptm-bench's inputs do):

  * atoms: n, one species, unit mass, on a cubic lattice of spacing 1.5 (the first n sites of the
    smallest cube that holds them), each coordinate jittered by ±0.1; velocities uniform in ±1
    with the mean removed. Free boundaries (a cluster, no periodic images).
  * neighbours: pairs closer than r_c = 5 within a Verlet list of radius r_c + skin (skin = 1),
    held as an n x M index table (M: the most neighbours of any atom at the first build, times
    2, at most n − 1; a padded entry points at the atom itself and is masked; the cluster
    contracts, so a rebuild that finds more grows the table). The list is rebuilt from all
    pairs (in blocks, so 10,000 atoms fit) when an atom has moved since the
    last build by more than 0.4 (under skin / 2, which keeps the list exact; the check runs every
    10 steps, and the fastest atom cannot cover the other 0.1 in between: asserted).
  * features: K = 16 Gaussian radial basis functions exp(−γ (r − μ_k)²), μ_k = k r_c / (K − 1),
    γ = 0.5 / (r_c / (K − 1))², times the cosine cutoff f_c(r) = ½ (cos(π r / r_c) + 1) (r < r_c).
  * width F = 64 (or 128). h⁰ = e, one embedding row for every atom.
  * 3 interaction blocks (continuous-filter convolution): x = h W_in; the filter
    W(r) = (ssp(rbf(r) W₁ + b₁) W₂ + b₂) f_c(r); m_i = Σ_j x_j ⊙ W(r_ij), a scatter-sum over the
    neighbours; h ← h + ssp(m W_o1 + b_o1) W_o2 + b_o2. ssp(x) = softplus(x) − ln 2.
  * readout: E_i = ssp(h W_r1 + b_r1) W_r2 + b_r2 (F → F/2 → 1), E = Σ_i E_i.
  * forces: F = −∂E/∂x by autograd. Integration: velocity Verlet, dt = 1e-3.
  * weights: W (fan_in x fan_out) = (2u − 1) √(3 / fan_in), biases 0.1 (2u − 1), u = uniform(seed,
    size), seeds 101 upward in the order above (embedding, then per block W_in, W₁, b₁, W₂, b₂,
    W_o1, b_o1, W_o2, b_o2, then W_r1, b_r1, W_r2, b_r2).

Checks, in float64: forces against central finite differences of the energy (relative 1e-3, the
issue's bar), and the energy drift over the run (NVE): the largest |E_tot(t) − E_tot(0)| over the
initial kinetic energy. Velocity Verlet conserves a shadow energy, so the total energy oscillates
by O(dt²) without a trend; the bar stated here is 1e-3 of the kinetic energy in float64.

Variants, float32 on CUDA, one MD step = forces + a Verlet update (the list checks outside):
  * eager          -- autograd forces and the update, one launch per op
  * graph          -- 10 steps captured in one CUDA graph, replayed (the list checks between)
  * compile        -- torch.compile of the step (default mode), called per step
  * compile-graph  -- the compiled step, 10 steps captured in one CUDA graph
Each prints the per-step latency (median and p99 over runs of 100 steps, CUDA events and host
clocks around synchronised work, after warm-up).

--bench-json also writes the rows at 10, 50, 100, 1000 and 10,000 atoms as pptm-bench results
(source "peers", chain "md", sizes named "10 atoms" and so on, as cases.rs names them; one run
of 100 steps each, its total energy at
the end checked against the float64 start's, as pptm-bench's case `md` is), which bench/run
merges into REPORT.md.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import uniform  # noqa: E402  (the inputs' generator, shared with pptm-bench)

R_CUT, SKIN, K_RBF, DT = 5.0, 1.0, 16, 1e-3
SPACING, JITTER, V0 = 1.5, 0.1, 1.0
BLOCKS, CHECK_EVERY = 3, 10
# A list holds pairs within r_c + skin, so it stays exact until two atoms close skin between them:
# until one has moved skin / 2. The check runs every CHECK_EVERY steps, so it rebuilds at a
# displacement of REBUILD_AT, leaving (skin / 2 − REBUILD_AT) for the steps until the next check
# (asserted against the fastest atom).
REBUILD_AT = 0.4
VARIANTS = ["eager", "graph", "compile", "compile-graph"]


class Streams:
    """Consecutive seeds of `uniform`, from 101: each weight takes the next."""

    def __init__(self, first=101):
        self.seed = first

    def take(self, n):
        self.seed += 1
        return uniform(self.seed - 1, n)


def model_weights(torch, width, dtype, device):
    s = Streams()

    def w(fan_in, fan_out):
        u = torch.from_numpy(s.take(fan_in * fan_out)).double()
        return ((2 * u - 1) * math.sqrt(3.0 / fan_in)).reshape(fan_in, fan_out).to(device, dtype)

    def b(n):
        return (0.1 * (2 * torch.from_numpy(s.take(n)).double() - 1)).to(device, dtype)

    f = width
    p = dict(embed=b(f) * 10)  # an embedding row of order 1
    p["blocks"] = [dict(w_in=w(f, f), w1=w(K_RBF, f), b1=b(f), w2=w(f, f), b2=b(f),
                        wo1=w(f, f), bo1=b(f), wo2=w(f, f), bo2=b(f)) for _ in range(BLOCKS)]
    p.update(wr1=w(f, f // 2), br1=b(f // 2), wr2=w(f // 2, 1), br2=b(1))
    return p


def system(torch, n, dtype, device):
    """Lattice positions, jittered, and velocities with no net momentum."""
    side = math.ceil(n ** (1 / 3) - 1e-9)
    idx = torch.arange(n, dtype=torch.float64)
    grid = torch.stack([idx % side, (idx // side) % side, idx // (side * side)], dim=1)
    jitter = (2 * torch.from_numpy(uniform(11, 3 * n)).double() - 1).reshape(n, 3) * JITTER
    x = grid * SPACING + jitter
    v = (2 * torch.from_numpy(uniform(12, 3 * n)).double() - 1).reshape(n, 3) * V0
    v = v - v.mean(dim=0)
    return x.to(device, dtype), v.to(device, dtype)


def ssp(torch, x):
    return torch.nn.functional.softplus(x) - math.log(2.0)


def neighbour_table(torch, x, capacity=None, block=2048):
    """Every atom's neighbours within r_c + skin, as an n x M table (M = capacity, or the most
    found times 2, at most n − 1) and a mask; padded entries point at the atom itself."""
    n = x.shape[0]
    lists = []
    for lo in range(0, n, block):
        d = torch.cdist(x[lo:lo + block].double(), x.double())
        near = d < R_CUT + SKIN
        rows = torch.arange(near.shape[0], device=x.device)
        near[rows, rows + lo] = False
        lists.append(near)
    near = torch.cat(lists)
    counts = near.sum(dim=1)
    most = int(counts.max().item()) if n > 1 else 0
    m = capacity if capacity is not None else max(1, min(n - 1, 2 * most))
    if most > m:
        raise RuntimeError(f"an atom has {most} neighbours, the table holds {m}")
    k = min(m, n)
    order = torch.argsort((~near).to(torch.int8), dim=1, stable=True)[:, :k]
    valid = torch.gather(near, 1, order)
    if k < m:  # more columns than atoms: the rest are padding
        order = torch.cat([order, order.new_zeros(n, m - k)], dim=1)
        valid = torch.cat([valid, valid.new_zeros(n, m - k)], dim=1)
    self_idx = torch.arange(n, device=x.device).unsqueeze(1).expand(n, m)
    table = torch.where(valid, order, self_idx)
    return table, valid.to(x.dtype), m


def energy(torch, p, x, table, valid):
    """Total energy of positions x (n x 3) over the neighbour table."""
    n = x.shape[0]
    rij = x[table] - x.unsqueeze(1)  # n x M x 3
    # A masked entry is the atom itself (r = 0): its distance is made r_c so that nothing of it
    # reaches the energy or the gradient.
    r2 = (rij * rij).sum(-1)
    r = torch.sqrt(torch.where(valid > 0, r2, torch.full_like(r2, R_CUT * R_CUT)))
    inside = (r < R_CUT).to(x.dtype) * valid
    fc = 0.5 * (torch.cos(math.pi * r / R_CUT) + 1.0) * inside
    mu = torch.linspace(0.0, R_CUT, K_RBF, dtype=x.dtype, device=x.device)
    gamma = 0.5 / (R_CUT / (K_RBF - 1)) ** 2
    rbf = torch.exp(-gamma * (r.unsqueeze(-1) - mu) ** 2)  # n x M x K
    h = p["embed"].expand(n, -1)
    for b in p["blocks"]:
        xf = h @ b["w_in"]
        filt = (ssp(torch, rbf @ b["w1"] + b["b1"]) @ b["w2"] + b["b2"]) * fc.unsqueeze(-1)
        m = (xf[table] * filt).sum(dim=1)
        h = h + ssp(torch, m @ b["wo1"] + b["bo1"]) @ b["wo2"] + b["bo2"]
    e_atoms = ssp(torch, h @ p["wr1"] + p["br1"]) @ p["wr2"] + p["br2"]
    return e_atoms.sum()


def forces(torch, p, x, table, valid):
    with torch.enable_grad():
        xg = x.detach().requires_grad_(True)
        e = energy(torch, p, xg, table, valid)
        (g,) = torch.autograd.grad(e, xg)
    return e.detach(), -g


def make_step(torch, p, table, valid):
    """One velocity Verlet step, in place on (x, v, f): the state tensors stay the same, so a
    CUDA graph can replay it."""

    def step(x, v, f):
        v.add_(f, alpha=0.5 * DT)
        x.add_(v, alpha=DT)
        _, f_new = forces(torch, p, x, table, valid)
        f.copy_(f_new)
        v.add_(f, alpha=0.5 * DT)
    return step


def finite_difference_check(torch, p, x, table, valid, coords=6, h=1e-5):
    """Largest relative error of autograd forces against central differences (float64)."""
    _, f = forces(torch, p, x, table, valid)
    worst = 0.0
    n = x.shape[0]
    for k in range(coords):
        i, c = (k * 7919) % n, k % 3
        xp, xm = x.clone(), x.clone()
        xp[i, c] += h
        xm[i, c] -= h
        fd = -(energy(torch, p, xp, table, valid) - energy(torch, p, xm, table, valid)) / (2 * h)
        scale = max(float(f.abs().max()), 1e-12)
        worst = max(worst, abs(float(fd) - float(f[i, c])) / scale)
    return worst


def nve_drift(torch, p, n, steps, device):
    """float64 NVE run: (largest |E_tot − E_tot(0)| over the initial kinetic energy, rebuilds)."""
    d = torch.float64
    x, v = system(torch, n, d, device)
    table, valid, m = neighbour_table(torch, x)
    e, f = forces(torch, p, x, table, valid)
    kin0 = 0.5 * float((v * v).sum())
    e0 = float(e) + kin0
    built_at, worst, rebuilds = x.clone(), 0.0, 0
    vmax = float(v.norm(dim=1).max())
    assert 2 * vmax * DT * CHECK_EVERY < SKIN / 2 - REBUILD_AT, "the step outruns the checks"
    for s in range(steps):
        if s % CHECK_EVERY == 0 and float((x - built_at).norm(dim=1).max()) > REBUILD_AT:
            table, valid, m = neighbour_table(torch, x, capacity=None)
            built_at, rebuilds = x.clone(), rebuilds + 1
        v = v + 0.5 * DT * f
        x = x + DT * v
        e, f = forces(torch, p, x, table, valid)
        v = v + 0.5 * DT * f
        worst = max(worst, abs(float(e) + 0.5 * float((v * v).sum()) - e0))
    return worst / max(kin0, 1e-30), rebuilds


def timed_run(torch, variant, p, n, cuda, reps, device, compiled):
    """Per-step latencies (device s or None, host s) of runs of 100 steps from the start state."""
    d = torch.float32
    x, v = system(torch, n, d, device)
    table, valid, m = neighbour_table(torch, x)
    _, f = forces(torch, p, x, table, valid)
    # Every timed run starts from the same state (the cluster contracts as it runs, so runs that
    # followed each other would time denser and denser lists).
    start = [t.clone() for t in (x, v, f, table, valid)]
    step = make_step(torch, p, table, valid)
    if variant in ("compile", "compile-graph"):
        if n not in compiled:
            compiled[n] = torch.compile(step)
        step = compiled[n]
    chunk = CHECK_EVERY
    if variant in ("graph", "compile-graph"):
        if not cuda:
            raise RuntimeError("CUDA graphs need CUDA")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step(x, v, f)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(chunk):
                step(x, v, f)
        run_chunk = g.replay
    else:
        def run_chunk():
            for _ in range(chunk):
                step(x, v, f)
    built_at = x.clone()
    # The list must stay exact between checks (see REBUILD_AT).
    vmax = float(v.norm(dim=1).max())
    assert 2 * vmax * DT * chunk < SKIN / 2 - REBUILD_AT, "the step size outruns the list checks"

    def reset():
        nonlocal built_at
        for t, t0 in zip((x, v, f, table, valid), start):
            t.copy_(t0)
        built_at = x.clone()

    def run(steps=100):
        nonlocal built_at
        for _ in range(steps // chunk):
            run_chunk()
            if float((x - built_at).norm(dim=1).max()) > REBUILD_AT:
                t, vmask, _ = neighbour_table(torch, x, capacity=m)
                table.copy_(t)
                valid.copy_(vmask)
                built_at = x.clone()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    reset()
    run()
    sync()
    device_s, host_s = [], []
    for _ in range(reps):
        reset()
        sync()
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        t0 = time.perf_counter()
        run()
        if cuda:
            b.record()
        sync()
        host_s.append((time.perf_counter() - t0) / 100)
        if cuda:
            device_s.append(a.elapsed_time(b) * 1e-3 / 100)
    e, _ = forces(torch, p, x, table, valid)
    total = float(e) + 0.5 * float((v.double() * v.double()).sum())
    return (device_s or None), host_s, total


# pptm-bench's sizes of its case `md` (bench/src/cases.rs), by atom count, and its variants' names.
BENCH_SIZES = {n: f"{n} atoms" for n in (10, 50, 100, 1000, 10000)}
BENCH_STEPS = 100
BENCH_NAMES = {"eager": "torch eager", "graph": "torch eager + CUDA graph",
               "compile": "torch.compile default", "compile-graph": "torch.compile + CUDA graph"}


def bench_measurement(variant, n, m, width, device_s, host_s, total, e0, kin0):
    """One row of pptm-bench's results schema (bench/src/record.rs, Measurement): a run of
    BENCH_STEPS steps, with the bytes and flops cases.rs counts for the case `md`."""
    from peers import stat  # the same median and p99 as peers.py's rows
    runs = [t * BENCH_STEPS for t in host_s]
    host = stat(runs)
    points = 512  # pptm's filter tables (examples/md/system.rs FILTER_POINTS)
    bytes_ = n * 6 * 4 * 2 + 3 * points * 2 * width * 4
    flops = BENCH_STEPS * (19 * 2 * n * width * width + 6 * 12 * n * m * width)
    return dict(chain="md", size=BENCH_SIZES[n],
                shape=f"{n} atoms x {BENCH_STEPS} steps, width {width}, a list of {m}",
                x=float(n), variant=BENCH_NAMES[variant], host_us=host,
                device_us=stat([t * BENCH_STEPS for t in device_s]) if device_s else None,
                gbps=bytes_ / (host["median"] * 1e3), tflops=flops / (host["median"] * 1e6),
                max_rel_err=abs(total - e0) / max(kin0, abs(e0)), value=total)


def check_forces(torch, path, device):
    """Compares the start forces pptm wrote (examples/md.rs --write-forces) with autograd's, in
    float64 and float32: the largest difference over the largest autograd force."""
    worst = 0.0
    for line in open(path):
        if not line.strip():
            continue
        row = json.loads(line)
        n, width = row["atoms"], row["width"]
        got = torch.tensor(row["forces"], dtype=torch.float64).reshape(n, 3)
        for dtype in (torch.float64, torch.float32):
            p = model_weights(torch, width, dtype, device)
            x, _ = system(torch, n, dtype, device)
            table, valid, _ = neighbour_table(torch, x)
            _, f = forces(torch, p, x, table, valid)
            f = f.double().cpu()
            err = float((got - f).abs().max()) / max(float(f.abs().max()), 1e-30)
            name = str(dtype).replace("torch.", "")
            print(f"{n} atoms: pptm's forces against PyTorch autograd in {name}: {err:.2e} "
                  f"(bar 1e-4)")
            if dtype == torch.float64:
                worst = max(worst, err)
    return worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--atoms", help="system sizes (default 10,50,100,1000,10000; 10,50 with "
                                    "--cpu-smoke)")
    ap.add_argument("--steps", type=int, help="NVE steps of the drift check (default 1000; 100 "
                                              "with --cpu-smoke)")
    ap.add_argument("--width", type=int, default=64, choices=[64, 128])
    ap.add_argument("--variants", help=f"comma-separated, of {','.join(VARIANTS)}")
    ap.add_argument("--out", help="write one JSON object per (variant, atoms) line here")
    ap.add_argument("--quick", action="store_true", help="few repetitions")
    ap.add_argument("--cpu-smoke", action="store_true", help="no CUDA: checks and eager on the CPU")
    ap.add_argument("--bench-json", metavar="FILE",
                    help="also write pptm-bench results (schema pptm-bench/1) here")
    ap.add_argument("--check-forces", metavar="FILE",
                    help="compare the forces examples/md.rs --write-forces wrote, and exit")
    a = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"peers_md.py: PyTorch is not importable ({e})", file=sys.stderr)
        sys.exit(2)
    cuda = torch.cuda.is_available() and not a.cpu_smoke
    if not cuda and not a.cpu_smoke:
        print("peers_md.py: CUDA is not available; pass --cpu-smoke", file=sys.stderr)
        sys.exit(2)
    device = "cuda" if cuda else "cpu"
    if a.check_forces:
        worst = check_forces(torch, a.check_forces, device)
        sys.exit(0 if worst <= 1e-4 else 1)
    sizes = [int(s) for s in (a.atoms or ("10,50,100,1000,10000" if cuda else "10,50")).split(",")]
    steps = a.steps or (1000 if cuda else 100)
    variants = (a.variants or (",".join(VARIANTS) if cuda else "eager")).split(",")
    reps = 3 if (a.quick or not cuda) else 20
    print(f"torch {torch.__version__}; {torch.cuda.get_device_name() if cuda else 'CPU'}; "
          f"width {a.width}, {BLOCKS} interaction blocks, r_c {R_CUT}, skin {SKIN}, dt {DT}")
    p64 = model_weights(torch, a.width, torch.float64, device)
    p32 = model_weights(torch, a.width, torch.float32, device)
    rows, compiled, bench = [], {}, []
    for n in sizes:
        x, v = system(torch, n, torch.float64, device)
        table, valid, m = neighbour_table(torch, x)
        e_start, _ = forces(torch, p64, x, table, valid)
        kin0 = 0.5 * float((v * v).sum())
        e0 = float(e_start) + kin0
        fd = finite_difference_check(torch, p64, x, table, valid)
        drift, rebuilds = nve_drift(torch, p64, n, steps, device) if n <= 1000 else (None, None)
        print(f"{n} atoms: a list of {m} columns; forces vs finite differences "
              f"{fd:.1e} (bar 1e-3)" + (f"; float64 NVE over {steps} steps: drift {drift:.2e} of "
                                       f"the kinetic energy (bar 1e-3), {rebuilds} list rebuilds"
                                       if drift is not None else ""), flush=True)
        for variant in variants:
            row = dict(workload="md", atoms=n, variant=variant, width=a.width,
                       force_fd_err=fd, nve_drift=drift, steps=steps)
            try:
                with torch.no_grad():
                    dev, host, total = timed_run(torch, variant, p32, n, cuda, reps, device,
                                                 compiled)
                timed = dev or host
                row.update(status="ok", step_us=statistics.median(timed) * 1e6,
                           step_p99_us=sorted(timed)[min(len(timed) - 1,
                                                         len(timed) * 99 // 100)] * 1e6,
                           host_step_us=statistics.median(host) * 1e6, reps=len(host))
                print(f"  {variant:<14} {row['step_us']:10.1f} µs a step "
                      f"(p99 {row['step_p99_us']:.1f}; host {row['host_step_us']:.1f})", flush=True)
                if n in BENCH_SIZES:
                    bench.append(bench_measurement(variant, n, m, a.width, dev, host, total, e0,
                                                   kin0))
            except Exception as e:  # a failing peer is reported; the others still run
                row.update(status="failed", note=f"{type(e).__name__}: {str(e)[:200]}")
                print(f"  {variant:<14} failed: {row['note']}", flush=True)
            rows.append(row)
    if a.bench_json:
        from peers_geodesics import write_bench_json  # the same document as the geodesics peers'
        write_bench_json(torch, a.bench_json, bench, a.quick)
    if a.out:
        with open(a.out, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {a.out} ({len(rows)} lines)")


if __name__ == "__main__":
    main()
