"""PyTorch peers of a pptm pipeline of dependent small stages (examples/pipeline_handoff.rs):
u <- 0.5 x + 0.25 c over 4096 elements, and y <- A x with A 256 x 256, at 8, 32 and 170 dependent
stages, as eager PyTorch, as one CUDA graph, and torch.compile'd (mode "max-autotune-no-cudagraphs")
then captured in a CUDA graph. Host clock from the first launch to the end of a synchronisation,
warm-up then 500 repetitions: median and p99.

    python3 bench/probes/dependent_steps_torch.py
"""
import time

import torch


def timed(label, stages, f):
    for _ in range(50):
        f()
    torch.cuda.synchronize()
    t = []
    for _ in range(500):
        t0 = time.perf_counter()
        f()
        torch.cuda.synchronize()
        t.append((time.perf_counter() - t0) * 1e6)
    t.sort()
    med, p99 = t[len(t) // 2], t[len(t) * 99 // 100]
    print(f"{label:<40} {stages:4d} stages  median {med:9.2f} us  p99 {p99:9.2f} us  ({med / stages:.2f} us a stage)")


def steps(kind, stages, x, c, a):
    def run():
        u = x
        for _ in range(stages):
            u = 0.5 * u + 0.25 * c if kind == "elementwise" else a @ u
        return u
    return run


def graphed(run):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    return g.replay


def main():
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(0)}, PyTorch {torch.__version__}")
    x = torch.rand(4096, device=dev) - 0.5
    c = torch.rand(4096, device=dev) - 0.5
    a = (torch.rand(256, 256, device=dev) - 0.5) * 0.2
    xg = torch.rand(256, device=dev) - 0.5
    for kind in ("elementwise", "gemv"):
        xi = x if kind == "elementwise" else xg
        for stages in (8, 32, 170):
            run = steps(kind, stages, xi, c, a)
            timed(f"{kind}, eager", stages, run)
            timed(f"{kind}, CUDA graph", stages, graphed(run))
            try:
                comp = torch.compile(steps(kind, stages, xi, c, a), mode="max-autotune-no-cudagraphs")
                comp()
                timed(f"{kind}, torch.compile + graph", stages, graphed(comp))
            except Exception as e:  # noqa: BLE001 (report and go on)
                print(f"{kind}, torch.compile: {type(e).__name__}: {e}"[:200])


if __name__ == "__main__":
    main()
