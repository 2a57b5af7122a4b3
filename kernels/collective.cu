// collective.cu — the data movement of the collectives: sum k buffers into one.
//
//   dst[i] = src[0][i] + src[1][i] + ... + src[k-1][i]     (k = 1 is a copy)
// The sources are addresses, possibly of other devices' memory (peer access: the kernel
// dereferences a peer's pointer directly, as NCCL's P2P transport does), passed in a small
// device array. Sums are left folds in f32 in source order, so every rank that computes an
// element computes it bit for bit the same; half buffers are widened, summed in f32 and
// rounded once at the store. dst may alias src[0] (in-place reduction): each element is read
// before it is written by the same thread.
//
// Launch: 1-D grid-stride, 256 threads per block, 4 consecutive elements per thread per
// iteration so each source is read in 16-byte runs. Bytes per element: k reads + 1 write
// (4 B each for f32, 2 B for half); FLOPs: k - 1 adds. Bound by memory (or the link to the
// peer) at any k.
#include "simt.cuh"

template <class T>
__device__ __forceinline__ void reduce_sum(T* dst, const unsigned long long* __restrict__ srcs, int nsrc,
                                           unsigned long long n, float scale) {
    const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x * 4;
    for (unsigned long long base = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) * 4; base < n;
         base += stride) {
        float acc[4];
        const T* s0 = reinterpret_cast<const T*>(srcs[0]);
        for (int j = 0; j < 4; ++j) acc[j] = base + j < n ? (float)s0[base + j] : 0.0f;
        for (int k = 1; k < nsrc; ++k) {
            const T* s = reinterpret_cast<const T*>(srcs[k]);
            for (int j = 0; j < 4; ++j)
                if (base + j < n) acc[j] += (float)s[base + j];
        }
        for (int j = 0; j < 4; ++j)
            if (base + j < n) dst[base + j] = (T)(acc[j] * scale);
    }
}

// dst = scale · Σ srcs (scale is 1 except for the final step of an average).
extern "C" __global__ void reduce_sum_f32(float* dst, const unsigned long long* __restrict__ srcs, int nsrc,
                                          unsigned long long n, float scale) {
    reduce_sum<float>(dst, srcs, nsrc, n, scale);
}

extern "C" __global__ void reduce_sum_f16(__half* dst, const unsigned long long* __restrict__ srcs, int nsrc,
                                          unsigned long long n, float scale) {
    reduce_sum<__half>(dst, srcs, nsrc, n, scale);
}
