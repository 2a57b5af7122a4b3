// elementwise.cu — flat, memory-bound kernels over contiguous buffers.
//
// Launch shape: 1-D grid, 1-D blocks (256 threads is the default the Rust launchers pick),
// grid-stride loops, so any grid covers any n >= 0 and n may exceed 2^32.
// No shared memory, no barriers, no tiles: each element is independent.
//
// Roofline: every kernel here does O(1) FLOPs per element and is bound by DRAM bandwidth.
// Bytes moved per element (the figure a bench compares with peak bandwidth):
//   fill             4 B   (write f32)
//   scale            8 B   (read + write f32)                 1 FLOP
//   axpy            12 B   (read x, read y, write y)           2 FLOPs
//   add             12 B   (read a, read b, write out)         1 FLOP
//   cast_from_f32_T  6 B   (read f32, write a 16-bit T; 8 B for the f32 copy)
//   cast_to_f32_T    6 B   (read a 16-bit T, write f32)
// Casts round to nearest even (the T(float) constructor: __float2half_rn,
// __float2bfloat16_rn), the IEEE default, so results are the same on every backend.
#include "simt.cuh"

// out[i] = value
extern "C" __global__ void fill_f32(float* __restrict__ out, float value, unsigned long long n) {
    SIMT_GRID_STRIDE_LOOP(i, n) { out[i] = value; }
}

// x[i] = alpha * x[i]
extern "C" __global__ void scale_f32(float* __restrict__ x, float alpha, unsigned long long n) {
    SIMT_GRID_STRIDE_LOOP(i, n) { x[i] = alpha * x[i]; }
}

// y[i] = alpha * x[i] + y[i]   (BLAS axpy; one fused multiply-add per element)
extern "C" __global__ void axpy_f32(const float* __restrict__ x, float* __restrict__ y, float alpha,
                                    unsigned long long n) {
    SIMT_GRID_STRIDE_LOOP(i, n) { y[i] = fmaf(alpha, x[i], y[i]); }
}

// out[i] = a[i] + b[i]
extern "C" __global__ void add_f32(const float* __restrict__ a, const float* __restrict__ b,
                                   float* __restrict__ out, unsigned long long n) {
    SIMT_GRID_STRIDE_LOOP(i, n) { out[i] = a[i] + b[i]; }
}

// out[i] = T(in[i]), round to nearest even; overflow gives ±inf, NaN stays NaN.
template <class T>
__device__ __forceinline__ void cast_from_f32(const float* __restrict__ in, T* __restrict__ out,
                                              unsigned long long n) {
    SIMT_GRID_STRIDE_LOOP(i, n) { out[i] = (T)in[i]; }
}

// out[i] = (float) in[i]; exact for every value of each storage type.
template <class T>
__device__ __forceinline__ void cast_to_f32(const T* __restrict__ in, float* __restrict__ out, unsigned long long n) {
    SIMT_GRID_STRIDE_LOOP(i, n) { out[i] = (float)in[i]; }
}

NANODDP_ENTRY_EACH_TYPE(cast_from_f32, (256),
    (const float* __restrict__ in, T* __restrict__ out, unsigned long long n), (in, out, n))
NANODDP_ENTRY_EACH_TYPE(cast_to_f32, (256),
    (const T* __restrict__ in, float* __restrict__ out, unsigned long long n), (in, out, n))

// dx[i] = dy[i] where the layer's output y[i] > 0, else 0 (ReLU backward; y > 0 exactly
// where the input was > 0). 3 elements moved per element: 12 B fp32, 6 B half.
template <class T>
__device__ __forceinline__ void relu_backward(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                                              unsigned long long n) {
    SIMT_GRID_STRIDE_LOOP(i, n) { dx[i] = (float)y[i] > 0.0f ? dy[i] : (T)0.0f; }
}

NANODDP_ENTRY_EACH_TYPE(relu_backward, (256),
    (const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, unsigned long long n),
    (y, dy, dx, n))
