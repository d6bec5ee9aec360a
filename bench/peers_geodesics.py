#!/usr/bin/env python3
"""PyTorch peers of examples/geodesics.rs: 18,030 geodesics by RK4 on a Christoffel table.

    python3 bench/peers_geodesics.py [--steps 100,1000] [--out FILE] [--bench-json FILE] [--quick]
                                     [--variants eager,graph,compile,compile-graph,torchdiffeq]
                                     [--cpu-smoke]

The system, the table and the inputs are the example's: Γ = ½ g⁻¹ ∂g/∂c of
g(c, λ) = 1 + 0.3 c² + 0.2 sin(3c + 2πλ), tabulated in f64 at 2000 concentrations in [−1, 1] by 601
wavelengths and stored in f32; one geodesic per ordered pair of 6 concentration levels and per
wavelength (k = t·601 + j); over t in [0, 1],

    dc/dt = v,   dv/dt = −Γ(c, λ_j) v²,   dA/dt = α_j tanh(c) v,

with Γ read by bilinear interpolation (grid_sample, border-clamped, align_corners=True), N classical
RK4 steps of dt = 1/N. Variants, all f32 on CUDA with the same inputs:
  * eager          -- a Python loop of N RK4 steps, one launch per op
  * graph          -- the same N-step loop captured once in a CUDA graph, replayed
  * compile        -- torch.compile (default mode) of the step, looped in Python
  * compile-graph  -- the compiled step's N-step loop captured by hand in one CUDA graph
  * torchdiffeq    -- torchdiffeq.odeint(method='rk4'), which is Kutta's 3/8 rule, not classical RK4
Each integration (initial state to end point) is timed with CUDA events and on the host around
synchronised work, after warm-up (compilation and capture excluded), for about 2 s (50 runs at
most, 5 at least); median and p99. Each variant's end points are compared with a float64 classical
RK4 whose Γ is an exact bilinear interpolation written with tensor indexing. Without CUDA,
--cpu-smoke runs the reference and the eager variant on the CPU (10 steps unless --steps says).
--bench-json also writes the rows as pptm-bench results (source "peers", chain "geodesics", size
small for N = 100 and large for N = 1000), which bench/run merges into REPORT.md beside pptm-bench's
case `geodesics`.
"""

import argparse
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import time

NC, NL = 2000, 601  # Γ table: concentration rows by wavelength columns
LEVELS = [-0.75, -0.45, -0.15, 0.15, 0.45, 0.75]
TRANSITIONS = [(a, b) for a in range(len(LEVELS)) for b in range(len(LEVELS)) if a != b]
GEODESICS = len(TRANSITIONS) * NL  # 18,030
VARIANTS = ["eager", "graph", "compile", "compile-graph", "torchdiffeq"]
NEEDS_CUDA = {"graph", "compile-graph"}
WHEELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wheels")
TORCHDIFFEQ_RK4 = ("Kutta's 3/8 rule (torchdiffeq's rk4_alt_step_func: k2 at dt/3, k3 at 2dt/3, "
                   "y1 = y0 + dt (k1 + 3 k2 + 3 k3 + k4) / 8)")


def problem(torch, device):
    """The Γ table (NC x NL, f32), each geodesic's column j, grid_sample x coordinate and α_j
    (f32), and the initial (c, v, A) (f32); built in f64 and rounded once, as the example does."""
    f64 = torch.float64
    c = -1.0 + 2.0 * torch.arange(NC, dtype=f64) / (NC - 1)
    lam = torch.arange(NL, dtype=f64) / (NL - 1)
    phase = 3.0 * c[:, None] + 2.0 * math.pi * lam[None, :]
    g = 1.0 + 0.3 * c[:, None] ** 2 + 0.2 * torch.sin(phase)
    dg = 0.6 * c[:, None] + 0.6 * torch.cos(phase)
    table = (0.5 * dg / g).float().contiguous()

    col = torch.arange(NL).repeat(len(TRANSITIONS))
    # x along the table's width; 2j/600 − 1 lands on column j (to f32 rounding) with align_corners.
    xn = (2.0 * col.to(f64) / (NL - 1) - 1.0).float()
    alpha = torch.exp(-(((col.to(f64) / (NL - 1)) - 0.5) / 0.2) ** 2).float()
    start = torch.tensor([LEVELS[a] for a, _ in TRANSITIONS], dtype=f64).repeat_interleave(NL)
    end = torch.tensor([LEVELS[b] for _, b in TRANSITIONS], dtype=f64).repeat_interleave(NL)
    c0, v0 = start.float(), (end - start).float()
    a0 = torch.zeros(GEODESICS, dtype=torch.float32)
    return {k: t.to(device) for k, t in dict(table=table, col=col, xn=xn, alpha=alpha,
                                               c0=c0, v0=v0, a0=a0).items()}


def grid_gamma(torch, table, xn):
    """Γ(c, λ_j) by grid_sample: the lookup a PyTorch user reaches for."""
    image = table.view(1, 1, NC, NL)

    def gamma(c):
        # grid's last dimension is (x along width = column, y along height = row); c in [−1, 1]
        # is the row coordinate as it stands, and border padding clamps it as the example does.
        grid = torch.stack((xn, c), dim=-1).view(1, 1, -1, 2)
        return torch.nn.functional.grid_sample(image, grid, mode="bilinear",
                                               padding_mode="border", align_corners=True).view(-1)
    return gamma


def indexed_gamma(torch, table, col):
    """Γ(c, λ_j) for the float64 reference: the bilinear interpolation written out with indexing,
    so that the reference shares no code with grid_sample and reads column j exactly."""
    flat = table.reshape(-1)

    def gamma(c):
        x = ((c + 1.0) * 0.5 * (NC - 1)).clamp(0.0, NC - 1)
        i0 = x.floor()
        i1 = (i0 + 1).clamp(max=NC - 1)
        g0 = flat[i0.long() * NL + col]
        g1 = flat[i1.long() * NL + col]
        return g0 + (x - i0) * (g1 - g0)
    return gamma


def deriv(torch, c, v, gamma, alpha):
    return v, -gamma(c) * v * v, alpha * torch.tanh(c) * v


def make_step(torch, dt, gamma, alpha):
    """One classical RK4 step of length dt over (c, v, A); A does not feed back, so the stages
    advance (c, v) only."""
    w = dt / 6.0

    def step(c, v, a):
        k1 = deriv(torch, c, v, gamma, alpha)
        k2 = deriv(torch, c + 0.5 * dt * k1[0], v + 0.5 * dt * k1[1], gamma, alpha)
        k3 = deriv(torch, c + 0.5 * dt * k2[0], v + 0.5 * dt * k2[1], gamma, alpha)
        k4 = deriv(torch, c + dt * k3[0], v + dt * k3[1], gamma, alpha)
        return tuple(s + w * (p + 2.0 * q + 2.0 * r + u)
                     for s, p, q, r, u in zip((c, v, a), k1, k2, k3, k4))
    return step


def integrate(step, c, v, a, steps):
    for _ in range(steps):
        c, v, a = step(c, v, a)
    return c, v, a


def time_step(steps):
    """dt as the example has it: 1/N rounded to f32 (the f64 reference uses the same value)."""
    return struct.unpack("f", struct.pack("f", 1.0 / steps))[0]


def reference(torch, p, steps, device):
    """End points of the float64 classical RK4 from the same f32 inputs and table."""
    d = torch.float64
    gamma = indexed_gamma(torch, p["table"].to(device, d), p["col"].to(device))
    step = make_step(torch, time_step(steps), gamma, p["alpha"].to(device, d))
    with torch.no_grad():
        end = integrate(step, *(p[k].to(device, d) for k in ("c0", "v0", "a0")), steps)
    return torch.stack(end)


def max_rel_err(torch, got, want):
    """Per geodesic, the largest error of (c, v, A) over the largest reference component (at
    least 1e-6); the worst geodesic's. A non-finite end point is a failure, not a number."""
    got = torch.stack(tuple(got)).to(want.device, torch.float64) if isinstance(got, tuple) \
        else got.to(want.device, torch.float64)
    if not torch.isfinite(got).all():
        raise RuntimeError("the end points are not all finite")
    err = (got - want).abs().amax(dim=0) / want.abs().amax(dim=0).clamp_min(1e-6)
    return float(err.max().item())


def captured(torch, step, inputs, steps):
    """The whole N-step loop of `step` captured once in a CUDA graph; returns a call that replays
    it and hands back the static end points. Warm-up runs on a side stream first, as the CUDA
    graphs documentation asks (it also compiles a compiled step before the capture)."""
    static_in = tuple(t.clone() for t in inputs)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(*static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = integrate(step, *static_in, steps)

    def run():
        graph.replay()
        return static_out
    return run


def import_torchdiffeq():
    """torchdiffeq, installed from bench/wheels/ when it is not there (the GPU hosts have no
    network); returns (module, None) or (None, why not)."""
    try:
        import torchdiffeq
        return torchdiffeq, None
    except ImportError:
        pass
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links",
                          WHEELS, "torchdiffeq"], capture_output=True, text=True)
    if pip.returncode != 0:
        lines = (pip.stderr or pip.stdout).strip().splitlines()
        return None, f"not importable, and pip install from {WHEELS} failed: " \
                     f"{lines[-1] if lines else pip.returncode}"
    try:
        import torchdiffeq
        return torchdiffeq, None
    except ImportError as e:
        return None, f"installed from {WHEELS} but not importable: {e}"


class Skipped(Exception):
    """A variant that cannot run here (as opposed to one that failed)."""


def setup(torch, variant, p, steps, compiled):
    """A call that runs one whole integration of `variant` and returns its end points, and a note.
    Compilation and capture happen here, outside the timing; `compiled` keeps the compiled step
    per N so that compile-graph captures the step that compile timed."""
    dt = time_step(steps)
    step = make_step(torch, dt, grid_gamma(torch, p["table"], p["xn"]), p["alpha"])
    inputs = (p["c0"], p["v0"], p["a0"])
    if variant == "eager":
        return (lambda: integrate(step, *inputs, steps)), "Python loop of RK4 steps"
    if variant == "graph":
        return captured(torch, step, inputs, steps), "eager N-step loop, one CUDA graph, replayed"
    if variant in ("compile", "compile-graph"):
        if steps not in compiled:
            compiled[steps] = torch.compile(step)
        cstep = compiled[steps]
        if variant == "compile":
            return (lambda: integrate(cstep, *inputs, steps)), \
                "torch.compile(default) of the step, Python loop"
        return captured(torch, cstep, inputs, steps), \
            "torch.compile(default) step; whole N-step loop captured by hand in one CUDA graph"
    if variant == "torchdiffeq":
        tdq, why = import_torchdiffeq()
        if tdq is None:
            raise Skipped(why)
        gamma, alpha = grid_gamma(torch, p["table"], p["xn"]), p["alpha"]

        def func(t, y):
            return torch.stack(deriv(torch, y[0], y[1], gamma, alpha))
        y0 = torch.stack(inputs)
        t = torch.linspace(0, 1, steps + 1, device=y0.device)
        note = (f"torchdiffeq {getattr(tdq, '__version__', '?')} odeint(method='rk4'): "
                f"{TORCHDIFFEQ_RK4}; its fixed-grid loop compares device times on the host "
                f"every step")
        return (lambda: tdq.odeint(func, y0, t, method="rk4")[-1]), note
    raise ValueError(f"unknown variant {variant}")


def percentile99(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, math.ceil(0.99 * len(xs)) - 1)]


def measure(torch, run, cuda, budget, max_reps, min_reps):
    """Times whole integrations: 3 warm-up runs, then runs until `budget` seconds have passed (at
    least min_reps, at most max_reps). Returns (device seconds or None, host seconds)."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(3):
        run()
    sync()
    device, host = [], []
    begin = time.perf_counter()
    while len(host) < max_reps and (len(host) < min_reps or time.perf_counter() - begin < budget):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        if cuda:
            start.record()
        run()
        if cuda:
            end.record()
        sync()
        host.append(time.perf_counter() - t0)
        if cuda:
            device.append(start.elapsed_time(end) * 1e-3)
    return (device or None), host


def row(variant, steps, status, note, **fields):
    out = dict(workload="geodesics", variant=variant, steps=steps, geodesics=GEODESICS,
               median_us=None, p99_us=None, host_median_us=None, host_p99_us=None, reps=None,
               max_rel_err=None, steps_per_s=None, status=status, note=note)
    out.update(fields)
    return out


def first_line(e):
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300] if text else ''}"


def print_row(r):
    def num(key, spec):
        width = spec.split(".")[0].rstrip("d")
        return format(r[key], spec) if r[key] is not None else format("-", f">{width}")
    print(f"{r['variant']:<14} {r['steps']:>5} {num('median_us', '12.1f')} "
          f"{num('p99_us', '12.1f')} {num('host_median_us', '12.1f')} "
          f"{num('host_p99_us', '12.1f')} {num('reps', '5d')} {num('max_rel_err', '10.2e')} "
          f"{num('steps_per_s', '12.3e')}  {r['status']}: {r['note']}", flush=True)


# pptm-bench's sizes of its case `geodesics` (bench/src/cases.rs), by step count.
BENCH_SIZES = {100: "small", 1000: "large"}
BENCH_NAMES = {"eager": "torch eager", "graph": "torch eager + CUDA graph",
               "compile": "torch.compile default, step looped",
               "compile-graph": "torch.compile default + CUDA graph",
               "torchdiffeq": "torchdiffeq rk4 (3/8 rule)"}


def bench_measurement(variant, steps, device_s, host_s, err, total):
    """One row of pptm-bench's results schema (bench/src/record.rs, Measurement)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from peers import stat  # the same median and p99 as peers.py's rows
    host = stat(host_s)
    return dict(chain="geodesics", size=BENCH_SIZES[steps],
                shape=f"{GEODESICS} geodesics x {steps} steps, Γ {NC} x {NL}", x=float(steps),
                variant=BENCH_NAMES[variant], host_us=host,
                device_us=stat(device_s) if device_s else None,
                # As cases.rs counts them: states in and out, columns and α, Γ once; 120 flops
                # a geodesic-step.
                gbps=(GEODESICS * 32 + NC * NL * 4) / (host["median"] * 1e3),
                tflops=120.0 * GEODESICS * steps / (host["median"] * 1e6),
                max_rel_err=err, value=total)


def write_bench_json(torch, path, results, quick):
    import datetime
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                                 "--format=csv,noheader"], capture_output=True, text=True,
                                timeout=30).stdout.strip().splitlines()[0]
    except Exception:  # no nvidia-smi: the field stays empty
        driver = ""
    doc = dict(schema="pptm-bench/1", source="peers",
               date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               commit=f"torch {torch.__version__}", quick=quick,
               device=dict(name=torch.cuda.get_device_name(), driver=driver, clocks=[]),
               results=results, refused=[])
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {path} ({len(results)} measurements)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", help="RK4 step counts, comma-separated (default 100,1000; "
                                    "10 with --cpu-smoke)")
    ap.add_argument("--out", help="write one JSON object per (variant, N) line here "
                                  "(default: print them on stdout)")
    ap.add_argument("--bench-json", help="also write pptm-bench results (schema pptm-bench/1) here")
    ap.add_argument("--quick", action="store_true", help="few repetitions, for a smoke run")
    ap.add_argument("--variants", help=f"comma-separated, of {','.join(VARIANTS)} (default: all; "
                                       "eager with --cpu-smoke)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="run on the CPU without CUDA: the reference and the eager variant")
    a = ap.parse_args()

    try:
        import torch
    except ImportError as e:
        print(f"peers_geodesics.py: PyTorch is not importable ({e})", file=sys.stderr)
        sys.exit(2)
    cuda = torch.cuda.is_available() and not a.cpu_smoke
    if not cuda and not a.cpu_smoke:
        print("peers_geodesics.py: CUDA is not available; pass --cpu-smoke to run the float64 "
              "reference and the eager variant on the CPU", file=sys.stderr)
        sys.exit(2)
    device = "cuda" if cuda else "cpu"
    steps_list = [int(s) for s in (a.steps or ("100,1000" if cuda else "10")).split(",")]
    variants = (a.variants or (",".join(VARIANTS) if cuda else "eager")).split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {VARIANTS}")
    budget, max_reps, min_reps = (0.2, 5, 3) if a.quick else (2.0, 50, 5)

    print(f"torch {torch.__version__}; device: "
          f"{torch.cuda.get_device_name() if cuda else 'CPU (smoke run, host timing only)'}")
    print(f"{GEODESICS} geodesics, Γ table {NC} x {NL} f32, classical RK4, N = "
          f"{', '.join(map(str, steps_list))}")
    p = problem(torch, device)
    rows, compiled, bench = [], {}, []
    print(f"{'variant':<14} {'N':>5} {'median µs':>12} {'p99 µs':>12} {'host med µs':>12} "
          f"{'host p99 µs':>12} {'reps':>5} {'max rel':>10} {'geo-steps/s':>12}  status: note")
    for steps in steps_list:
        want = reference(torch, p, steps, device)
        for variant in variants:
            if variant in NEEDS_CUDA and not cuda:
                r = row(variant, steps, "skipped", "CUDA graphs need CUDA")
            else:
                try:
                    with torch.no_grad():
                        t0 = time.perf_counter()
                        run, note = setup(torch, variant, p, steps, compiled)
                        end = run()
                        err = max_rel_err(torch, end, want)
                        total = float(torch.stack(tuple(end)).double().sum().item()
                                      if isinstance(end, tuple) else end.double().sum().item())
                        ready = time.perf_counter() - t0
                        device_s, host_s = measure(torch, run, cuda, budget, max_reps, min_reps)
                    # Without CUDA events (CPU smoke), the host times stand for the device's.
                    timed = device_s or host_s
                    med = statistics.median(timed)
                    r = row(variant, steps, "ok",
                            f"{note}; setup + first run {ready:.2f} s"
                            + ("" if device_s else "; median/p99 are host times"),
                            median_us=med * 1e6, p99_us=percentile99(timed) * 1e6,
                            host_median_us=statistics.median(host_s) * 1e6,
                            host_p99_us=percentile99(host_s) * 1e6, reps=len(host_s),
                            max_rel_err=err, steps_per_s=GEODESICS * steps / med)
                    if cuda and steps in BENCH_SIZES:
                        bench.append(bench_measurement(variant, steps, device_s, host_s, err,
                                                       total))
                except Skipped as e:
                    r = row(variant, steps, "skipped", str(e))
                except Exception as e:  # a peer that fails is reported, and the others still run
                    r = row(variant, steps, "failed", first_line(e))
                    if cuda:
                        try:
                            torch.cuda.synchronize()
                        except Exception:
                            pass
                run = None  # drop a captured graph's memory before the next variant
                if cuda:
                    torch.cuda.empty_cache()
            rows.append(r)
            print_row(r)
    if a.bench_json:
        write_bench_json(torch, a.bench_json, bench, a.quick)
    lines = "".join(json.dumps(r) + "\n" for r in rows)
    if a.out:
        with open(a.out, "w") as f:
            f.write(lines)
        print(f"wrote {a.out} ({len(rows)} lines)")
    else:
        sys.stdout.write(lines)


if __name__ == "__main__":
    main()
