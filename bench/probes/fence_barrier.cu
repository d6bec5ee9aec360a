// Stand-alone probe (nvcc -O3 -arch=sm_90 -o probe bench/probes/fence_barrier.cu && ./probe) on a GPU host:
// the cost of fence.acq_rel at gpu and sys scope after a block wrote to global memory, and a
// counter grid barrier (one red.release.gpu add per block, an acquire spin on a monotonic target)
// against cooperative_groups grid.sync(). Figures from an H200 are in docs/internals.md.
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
__device__ __forceinline__ uint64_t gt() { uint64_t t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ long long clk() { return clock64(); }

// fence cost after a block wrote nwrite floats
__global__ void fence_probe(float* buf, int nwrite, long long* res, int iters, int kind) {
  for (int it = 0; it < iters; ++it) {
    for (int i = threadIdx.x; i < nwrite; i += blockDim.x) buf[i] = it + i;
    __syncthreads();
    if (threadIdx.x == 0) {
      long long a = clk();
      if (kind == 0) asm volatile("fence.acq_rel.sys;" ::: "memory");
      else if (kind == 1) asm volatile("fence.acq_rel.gpu;" ::: "memory");
      else if (kind == 2) asm volatile("fence.sc.sys;" ::: "memory");
      long long b = clk();
      res[it] = b - a;
    }
    __syncthreads();
  }
}

__device__ unsigned long long bar_count;
__device__ __forceinline__ void my_barrier(unsigned long long target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u64 [%0], 1;" :: "l"(&bar_count) : "memory");
    unsigned long long v;
    do { asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(&bar_count) : "memory"); } while (v < target);
  }
  __syncthreads();
}
__global__ void bar_grid_sync(int iters, unsigned long long* out) {
  cg::grid_group g = cg::this_grid();
  g.sync();
  uint64_t t0 = gt();
  for (int i = 0; i < iters; ++i) g.sync();
  uint64_t t1 = gt();
  if (blockIdx.x == 0 && threadIdx.x == 0) *out = t1 - t0;
}
__global__ void bar_mine(int iters, unsigned long long* out) {
  unsigned long long n = gridDim.x;
  my_barrier(n);
  uint64_t t0 = gt();
  for (int i = 0; i < iters; ++i) my_barrier(n * (i + 2));
  uint64_t t1 = gt();
  if (blockIdx.x == 0 && threadIdx.x == 0) *out = t1 - t0;
}
int main() {
  float* buf; cudaMalloc(&buf, 1 << 24);
  long long* res; cudaMallocManaged(&res, 1000 * sizeof(long long));
  int clkkhz; cudaDeviceGetAttribute(&clkkhz, cudaDevAttrClockRate, 0);
  const char* names[] = {"fence.acq_rel.sys", "fence.acq_rel.gpu", "fence.sc.sys"};
  for (int kind = 0; kind < 3; ++kind)
    for (int nw : {0, 256, 4096, 65536}) {
      fence_probe<<<1, 512>>>(buf, nw, res, 200, kind); cudaDeviceSynchronize();
      std::vector<long long> v(res + 20, res + 200); std::sort(v.begin(), v.end());
      printf("%-18s after %6d floats written: median %lld cycles (%.2f us at %d MHz), p90 %lld\n", names[kind], nw, v[v.size()/2], v[v.size()/2] * 1e3 / clkkhz, clkkhz/1000, v[v.size()*9/10]);
    }
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  unsigned long long* out; cudaMallocManaged(&out, 8);
  for (int blocks : {8, 44, sms}) {
    int iters = 2000; void* args[] = {&iters, &out};
    cudaLaunchCooperativeKernel((void*)bar_grid_sync, blocks, 512, args, 0, 0); cudaDeviceSynchronize();
    cudaLaunchCooperativeKernel((void*)bar_grid_sync, blocks, 512, args, 0, 0); cudaDeviceSynchronize();
    double gs = *out / (double)iters;
    unsigned long long z = 0; cudaMemcpyToSymbol(bar_count, &z, 8);
    cudaLaunchCooperativeKernel((void*)bar_mine, blocks, 512, args, 0, 0); cudaDeviceSynchronize();
    double mine = *out / (double)iters;
    printf("grid barrier, %3d blocks x 512: grid.sync %.0f ns, counter barrier %.0f ns (%s)\n", blocks, gs, mine, cudaGetErrorString(cudaGetLastError()));
  }
}
