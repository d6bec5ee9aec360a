#!/usr/bin/env python3
"""PyTorch peers of examples/kernel_matrix.rs: fidelity kernel matrices K_ij = |<psi_i|psi_j>|^2.

    python3 bench/peers_kernel_matrix.py [--states 4096,16384] [--qubits 8] [--other M]
                                         [--variants complex64,real,real-compile] [--check]
                                         [--reps 5] [--block 8192] [--out FILE]
    python3 bench/peers_kernel_matrix.py --cpu-smoke

The states are the example's, bit for bit before the normalisation: N states of d = 2^q amplitudes,
real parts from input stream 11 and imaginary parts from stream 12 (uniform in (0, 1], mapped to
2u - 1; peers.py's splitmix64 generator), each state divided by its norm in float64 and stored as
float32. --other M draws M more states from streams 13 and 14 and computes K between the two sets
(the example's --other); otherwise K of the N states with themselves.

Variants, each computing the whole N x M matrix on the GPU (K stays there), in blocks of --block
rows (a block's complex product alone is block x M x 8 bytes), TF32 off:

  * complex64: A B^H as one complex64 matmul per block, then |.|^2 (the formulation a user writes);
  * real: X = [re, im], Re = X [re, im]^T and Im = X [-im, re]^T as float32 matmuls, then
    Re^2 + Im^2 (the same product via real GEMMs);
  * real-compile: the same function under torch.compile (the square-and-add fused);
  * complex128: the complex64 variant's code on complex128 states (the same float32 values
    widened; K in float64), the complex128 option of the workload.

Each is timed with CUDA events around the whole matrix: one warm-up, then --reps runs, the median
and the worst reported, with the rate in entries a second and in TFLOP/s counting 8 flops a
complex multiply-add (8 N M d), as examples/kernel_matrix.rs prints them. --check compares sampled
rows of each variant's K with float64 (the worst |K - K64| / (K64 + 1/d), the example's measure).
Sum K is printed for comparison with the example's.
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from peers import check_generator, uniform  # noqa: E402


def states(n, d, seed):
    """The example's States::random(n, d, seed): float32 real and imaginary parts."""
    re = 2.0 * uniform(seed, n * d).astype(np.float64) - 1.0
    im = 2.0 * uniform(seed + 1, n * d).astype(np.float64) - 1.0
    # The example rounds 2u - 1 to float32 before normalising.
    re = re.astype(np.float32).astype(np.float64).reshape(n, d)
    im = im.astype(np.float32).astype(np.float64).reshape(n, d)
    norm = np.sqrt((re * re + im * im).sum(axis=1, keepdims=True))
    return (re / norm).astype(np.float32), (im / norm).astype(np.float32)


def kernel_rows_f64(a_re, a_im, b_re, b_im, rows):
    a = a_re[rows].astype(np.float64) + 1j * a_im[rows].astype(np.float64)
    b = b_re.astype(np.float64) + 1j * b_im.astype(np.float64)
    return np.abs(a @ b.conj().T) ** 2


def make_variants(torch):
    def complex64(a, b, out, block):
        bh = b.conj().T
        for r in range(0, a.shape[0], block):
            p = a[r : r + block] @ bh
            out[r : r + block] = p.real.square() + p.imag.square()

    def real_block(x, wr, wi):
        return (x @ wr).square() + (x @ wi).square()

    compiled = {}

    def real(a, b, out, block, fn=real_block):
        x = torch.cat([a.real, a.imag], dim=1).contiguous()
        wr = torch.cat([b.real, b.imag], dim=1).T.contiguous()
        wi = torch.cat([-b.imag, b.real], dim=1).T.contiguous()
        for r in range(0, x.shape[0], block):
            out[r : r + block] = fn(x[r : r + block], wr, wi)

    def real_compile(a, b, out, block):
        if "fn" not in compiled:
            compiled["fn"] = torch.compile(real_block, dynamic=False)
        real(a, b, out, block, fn=compiled["fn"])

    widened = {}

    def complex128(a, b, out, block):
        # The states widened once (in the warm-up call), not in every timed run.
        key = (a.data_ptr(), b.data_ptr())
        if key not in widened:
            widened.clear()
            widened[key] = (a.to(torch.complex128), b.to(torch.complex128))
        a64, b64 = widened[key]
        bh = b64.conj().T
        for r in range(0, a64.shape[0], block):
            p = a64[r : r + block] @ bh
            out[r : r + block] = (p.real.square() + p.imag.square()).float()

    return {"complex64": complex64, "real": real, "real-compile": real_compile, "complex128": complex128}


def run(args):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = torch.device(args.device)
    variants = make_variants(torch)
    wanted = args.variants.split(",")
    for v in wanted:
        if v not in variants:
            sys.exit(f"unknown variant {v} (have {', '.join(variants)})")
    results = []
    for q in [int(x) for x in str(args.qubits).split(",")]:
        d = 1 << q
        for n in [int(x) for x in str(args.states).split(",")]:
            a_re, a_im = states(n, d, 11)
            if args.other:
                b_re, b_im = states(args.other, d, 13)
            else:
                b_re, b_im = a_re, a_im
            m = b_re.shape[0]
            a = torch.complex(torch.from_numpy(a_re), torch.from_numpy(a_im)).to(dev)
            b = torch.complex(torch.from_numpy(b_re), torch.from_numpy(b_im)).to(dev)
            out = torch.empty((n, m), dtype=torch.float32, device=dev)
            check_rows = sorted({0, 1, n // 3, n // 2, n - 1})
            ref = kernel_rows_f64(a_re, a_im, b_re, b_im, check_rows) if args.check else None
            for name in wanted:
                fn = variants[name]
                fn(a, b, out, args.block)  # warm-up (and compilation)
                times = []
                for _ in range(args.reps):
                    out.fill_(float("nan"))
                    if dev.type == "cuda":
                        start = torch.cuda.Event(enable_timing=True)
                        end = torch.cuda.Event(enable_timing=True)
                        start.record()
                        fn(a, b, out, args.block)
                        end.record()
                        torch.cuda.synchronize()
                        times.append(start.elapsed_time(end) / 1e3)
                    else:
                        t0 = time.perf_counter()
                        fn(a, b, out, args.block)
                        times.append(time.perf_counter() - t0)
                med = statistics.median(times)
                row = {
                    "variant": name,
                    "states": n,
                    "other": m if args.other else None,
                    "qubits": q,
                    "median_s": med,
                    "worst_s": max(times),
                    "entries_per_s": n * m / med,
                    "tflops": 8.0 * n * m * d / med / 1e12,
                    "sum": float(out.double().sum().item()),
                }
                if ref is not None:
                    got = out[check_rows].double().cpu().numpy()
                    err = np.abs(got - ref)
                    err[np.isnan(err)] = np.inf
                    row["error"] = float((err / (ref + 1.0 / d)).max())
                results.append(row)
                print(
                    f"{name:>13}  N {n} x {m}, q {q}: {med * 1e3:10.2f} ms (worst {max(times) * 1e3:.2f}),"
                    f" {row['entries_per_s']:.3e} entries/s, {row['tflops']:.1f} TFLOP/s,"
                    f" sum K {row['sum']:.6e}"
                    + (f", error {row['error']:.2e}" if "error" in row else ""),
                    flush=True,
                )
            del a, b, out
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--states", default="4096")
    ap.add_argument("--qubits", default="8")
    ap.add_argument("--other", type=int, default=0)
    ap.add_argument("--variants", default="complex64,real,real-compile")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--block", type=int, default=8192)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU, every check on")
    args = ap.parse_args()
    check_generator()
    if args.cpu_smoke:
        args.device, args.states, args.qubits, args.reps, args.block = "cpu", "33", "3", 1, 16
        args.check = True
        args.variants = "complex64,real,complex128"
        for other in (0, 5):
            args.other = other
            for r in run(args):
                if not r["error"] < 1e-5:
                    sys.exit(f"cpu smoke: {r['variant']} off by {r['error']:.2e}")
        print("cpu smoke: ok")
        return
    run(args)


if __name__ == "__main__":
    main()
