// selftest.cu — kernels that check the SIMT emulator itself (and, on a GPU, the toolchain).
//
// Two groups:
//   * correct kernels, each exercising one part of CUDA's execution model the emulator must
//     reproduce: grid-stride loops, shared memory with barriers, warp shuffles and votes,
//     atomics from many blocks, wmma, a barrier-heavy launch for timing, and a probe whose
//     launch profile the tests know in advance;
//   * deliberately WRONG kernels (prefix `broken_`), each with one classic bug: a missing
//     barrier, divergent or skipped barriers, an off-by-one write, a warp mask naming an
//     exited lane, lanes disagreeing on a mask, a deadlock, a shared-memory overflow, a
//     thread that never finishes. The tests demand that the emulator reports each one.
//     One more, broken_class_of_label, leans on undefined behaviour that g++ and nvcc treat
//     differently: only the stand-in's PTX executor (tests/ptx_executor.rs) shows it.
//     Never call them for results (and never launch broken_endless on a GPU).
//
// Launch shapes are given per kernel. None is performance-critical; each moves O(n) bytes.
#include "simt.cuh"

// c[i] = a[i] + b[i]. Any 1-D grid; grid-stride.
extern "C" __global__ void vector_add(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                                      unsigned long long n) {
    SIMT_GRID_STRIDE_LOOP(i, n) { c[i] = a[i] + b[i]; }
}

// out[i] = i for every i < n. Compiled with both arguments of __launch_bounds__: at most 64
// threads a block, two blocks per SM. Any 1-D grid of blocks of at most 64 threads; the
// launch checks of every executor must refuse a bigger block before it runs.
extern "C" __global__ void __launch_bounds__(64, 2) bounded_iota(unsigned int* __restrict__ out, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = i;
}

// out[b] = sum of in[b*blockDim.x .. +blockDim.x) (missing elements count 0).
// 1-D grid; any block size 1..1024, not only powers of two: the tree starts at the next
// power of two and skips partners past the end. Static shared memory + __syncthreads.
extern "C" __global__ void block_sum(const float* __restrict__ in, float* __restrict__ out, unsigned int n) {
    __shared__ float partial[1024];
    unsigned int tid = threadIdx.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + tid;
    partial[tid] = i < n ? in[i] : 0.0f;
    __syncthreads();
    unsigned int span = 1;
    while (span < blockDim.x) span <<= 1;
    for (unsigned int s = span / 2; s > 0; s >>= 1) {
        if (tid < s && tid + s < blockDim.x) partial[tid] += partial[tid + s];
        __syncthreads();
    }
    if (tid == 0) out[blockIdx.x] = partial[0];
}

// Per warp: out_down[w] = sum of the warp's 32 inputs by a __shfl_down_sync tree (lane 0
// holds it); out_xor[t] = the same sum on every lane by a __shfl_xor_sync butterfly.
// Block size a multiple of 32.
extern "C" __global__ void warp_sums(const float* __restrict__ in, float* __restrict__ out_down,
                                     float* __restrict__ out_xor) {
    unsigned int t = blockIdx.x * blockDim.x + threadIdx.x;
    float v = in[t];
    float d = v;
    for (int offset = 16; offset > 0; offset >>= 1) d += __shfl_down_sync(0xffffffffu, d, offset);
    if ((threadIdx.x & 31u) == 0) out_down[t / 32] = d;
    float x = v;
    for (int mask = 1; mask < 32; mask <<= 1) x += __shfl_xor_sync(0xffffffffu, x, mask);
    out_xor[t] = x;
}

// The four shuffles with a sub-warp width, for a lane-exact comparison with CUDA's rules:
// out[4t + k] for k = idx, up, down, xor. Block size a multiple of 32.
extern "C" __global__ void shuffle_rules(const int* __restrict__ in, int* __restrict__ out, int src, int delta,
                                         int width) {
    unsigned int t = blockIdx.x * blockDim.x + threadIdx.x;
    int v = in[t];
    out[4 * t + 0] = __shfl_sync(0xffffffffu, v, src, width);
    out[4 * t + 1] = __shfl_up_sync(0xffffffffu, v, delta, width);
    out[4 * t + 2] = __shfl_down_sync(0xffffffffu, v, delta, width);
    out[4 * t + 3] = __shfl_xor_sync(0xffffffffu, v, delta, width);
}

// Per warp: ballot[w] = __ballot_sync of pred != 0, count[w] = its popcount, and on every
// lane any[t]/all[t] = __any_sync/__all_sync. Block size a multiple of 32.
extern "C" __global__ void votes(const int* __restrict__ pred, unsigned int* __restrict__ ballot,
                                 unsigned int* __restrict__ count, int* __restrict__ any, int* __restrict__ all) {
    unsigned int t = blockIdx.x * blockDim.x + threadIdx.x;
    int p = pred[t];
    unsigned int b = __ballot_sync(0xffffffffu, p);
    any[t] = __any_sync(0xffffffffu, p);
    all[t] = __all_sync(0xffffffffu, p);
    if ((threadIdx.x & 31u) == 0) {
        ballot[t / 32] = b;
        count[t / 32] = __popc(b);
    }
}

// *total += sum of in[0..n) with one atomicAdd per element, from every block at once.
extern "C" __global__ void atomic_sum(const int* __restrict__ in, int* __restrict__ total, unsigned long long n) {
    SIMT_GRID_STRIDE_LOOP(i, n) { atomicAdd(total, in[i]); }
}

// The other atomics, one counter each, from every thread of every block:
//   imax = max of ival[t] (atomicMax on int), umax = max of uval[t] (on unsigned),
//   fsum = sum of fval[t] (atomicAdd on float; small integers, so exact in any order),
//   usum = number of threads (atomicAdd on unsigned), ticket = threads that won a
//   compare-and-swap race for slot t % 64 (atomicCAS: exactly one winner per slot),
//   last = some thread's id (atomicExch on float: must be one of them).
// 1-D grid; counters[0] imax, [1] umax bits, [2] usum, [3..67) slots; floats[0] fsum, [1] last.
extern "C" __global__ void atomic_mix(const int* __restrict__ ival, const unsigned int* __restrict__ uval,
                                      const float* __restrict__ fval, int* __restrict__ counters,
                                      float* __restrict__ floats, int* __restrict__ winners) {
    unsigned int t = blockIdx.x * blockDim.x + threadIdx.x;
    atomicMax(&counters[0], ival[t]);
    atomicMax(reinterpret_cast<unsigned int*>(&counters[1]), uval[t]);
    atomicAdd(reinterpret_cast<unsigned int*>(&counters[2]), 1u);
    atomicAdd(&floats[0], fval[t]);
    atomicExch(&floats[1], (float)t);
    int won = atomicCAS(&counters[3 + t % 64], 0, (int)t + 1) == 0;
    winners[t] = won;
}

// Half arithmetic: out[4i..4i+4) = a+b, a-b, a*b, fma(a, b, c) in __half, each rounded once.
extern "C" __global__ void half_arith(const __half* __restrict__ a, const __half* __restrict__ b,
                                      const __half* __restrict__ c, __half* __restrict__ out, unsigned int n) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        out[4 * i + 0] = __hadd(a[i], b[i]);
        out[4 * i + 1] = __hsub(a[i], b[i]);
        out[4 * i + 2] = __hmul(a[i], b[i]);
        out[4 * i + 3] = __hfma(a[i], b[i], c[i]);
    }
}

// Warp-synchronous exchange through shared memory, ordered by __syncwarp (no block
// barrier): each lane writes its value, __syncwarp, reads its mirror lane. Block size a
// multiple of 32.
extern "C" __global__ void warp_mirror(const float* __restrict__ in, float* __restrict__ out) {
    __shared__ float lanes[1024];
    unsigned int tid = threadIdx.x;
    lanes[tid] = in[blockIdx.x * blockDim.x + tid];
    __syncwarp();
    out[blockIdx.x * blockDim.x + tid] = lanes[(tid & ~31u) + (31u - (tid & 31u))];
}

// One warp: D = A·B + C for 16x16 row-major A, B, C, D (half inputs, float accumulate).
extern "C" __global__ void wmma_row_major(const __half* __restrict__ a, const __half* __restrict__ b,
                                          const float* __restrict__ c, float* __restrict__ d) {
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::load_matrix_sync(acc, c, 16, wmma::mem_row_major);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

// The same product with column-major A and B read from padded storage (leading dimension
// 24) and D stored column-major; the accumulator starts at zero.
extern "C" __global__ void wmma_col_major(const __half* __restrict__ a, const __half* __restrict__ b,
                                          float* __restrict__ d) {
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::col_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    wmma::load_matrix_sync(fa, a, 24);
    wmma::load_matrix_sync(fb, b, 24);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_col_major);
}

// `rounds` rounds of: write shared, barrier, read a neighbour, barrier (2 barriers a round).
// out[t] = sum over rounds r of (neighbour's value in round r). 1-D blocks up to 1024.
extern "C" __global__ void barrier_rounds(float* __restrict__ out, int rounds) {
    __shared__ float slot[1024];
    unsigned int tid = threadIdx.x;
    float acc = 0.0f;
    for (int r = 0; r < rounds; ++r) {
        slot[tid] = (float)(tid + r);
        __syncthreads();
        acc += slot[(tid + 1) % blockDim.x];
        __syncthreads();
    }
    out[blockIdx.x * blockDim.x + tid] = acc;
}

// Dynamic shared memory: out[t] = in[blockDim.x - 1 - t] within each block (a reversal
// through shared memory). Launch with blockDim.x * 4 bytes of dynamic shared memory.
extern "C" __global__ void reverse_in_block(const float* __restrict__ in, float* __restrict__ out) {
    SIMT_DYNAMIC_SHARED(float, tile);
    unsigned int tid = threadIdx.x;
    unsigned int base = blockIdx.x * blockDim.x;
    tile[tid] = in[base + tid];
    __syncthreads();
    out[base + tid] = tile[blockDim.x - 1 - tid];
}

// One request of each kind the stand-in's launch profile counts, with counts that follow
// from the arguments alone (tests/ptx_executor.rs): per warp, a global load of
// in[i * stride] (4-byte lanes `stride` words apart), one FMA, a shared store and load `bank_stride`
// words apart (bank conflicts when it is even), a barrier and a coalesced store of out[i].
// Blocks of exactly 32 threads; stride, bank_stride 1..32.
extern "C" __global__ void profile_probe(const float* __restrict__ in, float* __restrict__ out, unsigned int stride,
                                         unsigned int bank_stride) {
    __shared__ float words[32 * 32];
    unsigned int t = threadIdx.x;
    unsigned int i = blockIdx.x * 32 + t;
    words[t * bank_stride] = fmaf(in[i * stride], 2.0f, 1.0f);
    __syncthreads();
    out[i] = words[(31 - t) * bank_stride];
}

// ---------------------------------------------------------------- deliberately wrong kernels

// BUG: no __syncthreads between the write and the neighbour's read.
extern "C" __global__ void broken_missing_barrier(float* __restrict__ out) {
    __shared__ float slot[1024];
    unsigned int tid = threadIdx.x;
    slot[tid] = (float)tid;
    out[blockIdx.x * blockDim.x + tid] = slot[(tid + 1) % blockDim.x];
}

// BUG: half the block waits at one barrier, half at another.
extern "C" __global__ void broken_divergent_barrier(float* __restrict__ out) {
    if (threadIdx.x < blockDim.x / 2) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1.0f;
}

// BUG: thread 0 returns early; the others wait for it at the barrier.
extern "C" __global__ void broken_early_exit(float* __restrict__ out) {
    if (threadIdx.x == 0) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

// BUG: off by one: writes out[0..n] inclusive.
extern "C" __global__ void broken_off_by_one(float* __restrict__ out, unsigned int n) {
    for (unsigned int i = threadIdx.x; i <= n; i += blockDim.x) out[i] = 2.0f;
}

// BUG: lane 31 exits, the rest shuffle with a mask that still names it.
extern "C" __global__ void broken_exited_lane(int* __restrict__ out) {
    if (threadIdx.x == 31) return;
    out[threadIdx.x] = __shfl_sync(0xffffffffu, (int)threadIdx.x, 0);
}

// BUG: the lower half-warp passes a half mask, the upper half the full mask.
extern "C" __global__ void broken_mask_mismatch(int* __restrict__ out) {
    unsigned int mask = threadIdx.x < 16 ? 0x0000ffffu : 0xffffffffu;
    out[threadIdx.x] = __shfl_sync(mask, (int)threadIdx.x, 0);
}

// BUG: lane 0 waits at __syncthreads while lanes 1..31 wait for lane 0 in a shuffle.
extern "C" __global__ void broken_deadlock(int* __restrict__ out) {
    int v = 0;
    if (threadIdx.x == 0) {
        __syncthreads();
    } else {
        v = __shfl_sync(0xffffffffu, (int)threadIdx.x, 0);
    }
    out[threadIdx.x] = v;
}

// BUG: 32-element shared array indexed by threadIdx.x; launched with more than 32 threads
// it writes past the end. Only the ASan build of the emulator can see this one.
extern "C" __global__ void broken_shared_overflow(float* __restrict__ out) {
    __shared__ float small[32];
    small[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = small[threadIdx.x % 32];
}

// BUG: thread `spin_thread` never finishes: it waits for out[0] to hold -1, which nothing
// writes (the volatile read keeps the compiler from hoisting the load and deleting the
// loop); the block's other threads wait for it at __syncthreads. Only a time limit ends
// this launch. 1-D blocks of more than spin_thread threads; out holds one float per thread.
extern "C" __global__ void broken_endless(float* out, int spin_thread) {
    if ((int)threadIdx.x == spin_thread) {
        const volatile float* flag = out;
        while (*flag != -1.0f) {
        }
    }
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f;
}

// BUG, one only the compiled code shows: meant to map each label to its class, -1 for a label
// that is not one (NaN, negative, >= classes), but it relies on what a float-to-int cast does
// with NaN, which C++ leaves undefined. Compiled by g++ for x86 (the SIMT emulator), the cast
// of NaN is INT_MIN, caught as negative; on a GPU, cvt.rzi.s32.f32 turns NaN into 0, so a NaN
// label quietly becomes class 0. Only the PTX executor, running what nvcc emitted, shows it.
// The fix: test the float (`!(x >= 0.0f && x < classes)`) before converting. Any 1-D grid.
extern "C" __global__ void broken_class_of_label(const float* __restrict__ labels, int* __restrict__ out,
                                                 unsigned int n, int classes) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int c = (int)labels[i];
    out[i] = (c < 0 || c >= classes) ? -1 : c;
}
