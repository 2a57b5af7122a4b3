// collective.cu — the data movement of the collectives: sum k buffers into one or more.
//
//   for every destination d:  d[i] = scale · (src[0][i] + src[1][i] + ... + src[k-1][i])
// k = 1 with one destination is a copy. Sources and destinations are addresses, possibly of
// other devices' memory: the kernel dereferences peer pointers directly (reads for a pull,
// writes for a push), as NCCL's P2P transport does. The addresses arrive in one small device
// array: `addrs[0..nsrc]` the sources, `addrs[nsrc..nsrc+ndst]` the destinations.
// Sums are left folds in f32 in source order, so every rank that computes an element
// computes it bit for bit the same, whatever the backend; 16-bit buffers (fp16, bf16) are
// widened, summed in f32 and rounded once per store. Each thread reads all sources of its elements before
// writing any destination, so a destination may alias a source (in-place reduction).
//
// Launch: 1-D grid-stride, 256 threads per block, 4 consecutive elements per thread per
// iteration so each buffer is touched in 16-byte runs. Bytes per element: nsrc reads +
// ndst writes (4 B each for f32, 2 B for fp16 and bf16); FLOPs: nsrc - 1 adds. Bound by
// memory (or by the link to the peer) at any k.
#include "simt.cuh"

template <class T>
__device__ __forceinline__ void reduce_sum(const unsigned long long* __restrict__ addrs, int nsrc, int ndst,
                                           unsigned long long n, float scale) {
    const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x * 4;
    for (unsigned long long base = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) * 4; base < n;
         base += stride) {
        float acc[4];
        const T* s0 = reinterpret_cast<const T*>(addrs[0]);
        for (int j = 0; j < 4; ++j) acc[j] = base + j < n ? (float)s0[base + j] : 0.0f;
        for (int k = 1; k < nsrc; ++k) {
            const T* s = reinterpret_cast<const T*>(addrs[k]);
            for (int j = 0; j < 4; ++j)
                if (base + j < n) acc[j] += (float)s[base + j];
        }
        for (int d = 0; d < ndst; ++d) {
            T* dst = reinterpret_cast<T*>(addrs[nsrc + d]);
            for (int j = 0; j < 4; ++j)
                if (base + j < n) dst[base + j] = (T)(acc[j] * scale);
        }
    }
}

// (256, 1): with a bare 256, ptxas for sm_90 aims at 8 resident blocks (32 registers) and
// spills; this kernel wants 38.
NANODDP_ENTRY_EACH_TYPE(reduce_sum, (256, 1),
    (const unsigned long long* __restrict__ addrs, int nsrc, int ndst, unsigned long long n, float scale),
    (addrs, nsrc, ndst, n, scale))
