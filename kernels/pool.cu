// pool.cu — 2-D max and average pooling, forward and backward, NCHW, any window and stride.
//
//   y[plane][p][q] = max or mean of x[plane][p·s .. p·s + KH)[q·s .. q·s + KW)
//   P = (H - KH) / s + 1, Q = (W - KW) / s + 1; `plane` runs over batch·channels.
// Max pooling records, per output, the argmax as an index into its input plane (ih·W + iw);
// ties keep the first (row-major) element and a NaN anywhere in the window wins, as in
// PyTorch, so NaNs propagate instead of being quietly dropped.
//
// Backward kernels run one thread per *input* element and gather from the outputs whose
// windows cover it: with overlapping windows (s < K) several outputs feed one input, and
// gathering instead of scattering with atomics keeps the result deterministic.
//
// All kernels: 1-D grid-stride launch (256 threads per block) over the elements they write.
// Bytes: forward reads |x| once (plus window overlap, served by cache) and writes |y| (and
// the argmax, 4 B per output); backward reads |dy| (and argmax) per covering window and
// writes |dx|. No shared memory: pooling does ≤ KH·KW comparisons per output and is bound
// by memory traffic. Each kernel exists per storage type (_f32, _f16, _bf16).
#include "simt.cuh"

template <class T>
__device__ __forceinline__ void max_pool_forward(const T* __restrict__ x, T* __restrict__ y, int* __restrict__ argmax,
                                                 int planes, int in_h, int in_w, int k_h, int k_w, int stride,
                                                 int out_h, int out_w) {
    const long long total = (long long)planes * out_h * out_w;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)blockDim.x * gridDim.x) {
        const int q = (int)(t % out_w), p = (int)(t / out_w % out_h);
        const long long plane = t / ((long long)out_w * out_h);
        const T* in = x + plane * in_h * in_w;
        int arg = (p * stride) * in_w + q * stride;  // start from the window's first element
        float best = (float)in[arg];
        for (int i = 0; i < k_h; ++i) {
            for (int j = 0; j < k_w; ++j) {
                int idx = (p * stride + i) * in_w + q * stride + j;
                float v = (float)in[idx];
                if (v > best || (v != v && best == best)) {
                    best = v;
                    arg = idx;
                }
            }
        }
        y[t] = (T)best;
        argmax[t] = arg;
    }
}

// First output row/column whose window covers input row/column `i`: ceil((i - k + 1) / s).
__device__ __forceinline__ int first_window(int i, int k, int stride) {
    int num = i - k + 1;
    return num <= 0 ? 0 : (num + stride - 1) / stride;
}

template <class T>
__device__ __forceinline__ void max_pool_backward(const T* __restrict__ dy, const int* __restrict__ argmax,
                                                  T* __restrict__ dx, int planes, int in_h, int in_w, int k_h,
                                                  int k_w, int stride, int out_h, int out_w) {
    const long long total = (long long)planes * in_h * in_w;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)blockDim.x * gridDim.x) {
        const int iw = (int)(t % in_w), ih = (int)(t / in_w % in_h);
        const long long plane = t / ((long long)in_w * in_h);
        const int here = ih * in_w + iw;
        float acc = 0.0f;
        for (int p = first_window(ih, k_h, stride); p <= min(ih / stride, out_h - 1); ++p) {
            for (int q = first_window(iw, k_w, stride); q <= min(iw / stride, out_w - 1); ++q) {
                long long o = (plane * out_h + p) * out_w + q;
                if (argmax[o] == here) acc += (float)dy[o];
            }
        }
        dx[t] = (T)acc;
    }
}

template <class T>
__device__ __forceinline__ void avg_pool_forward(const T* __restrict__ x, T* __restrict__ y, int planes, int in_h,
                                                 int in_w, int k_h, int k_w, int stride, int out_h, int out_w) {
    const long long total = (long long)planes * out_h * out_w;
    const float inv = 1.0f / (float)(k_h * k_w);
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)blockDim.x * gridDim.x) {
        const int q = (int)(t % out_w), p = (int)(t / out_w % out_h);
        const long long plane = t / ((long long)out_w * out_h);
        const T* in = x + plane * in_h * in_w;
        float acc = 0.0f;
        for (int i = 0; i < k_h; ++i)
            for (int j = 0; j < k_w; ++j) acc += (float)in[(p * stride + i) * in_w + q * stride + j];
        y[t] = (T)(acc * inv);
    }
}

// With `y` (the pooled ReLU's output, the size of dx), also the ReLU's backward: dx = 0
// where y <= 0. One pass instead of two and no workspace between them: the fused form reads
// |y| more and writes |dx| once (fp32 LeNet conv2 at batch 256: 3.3 MB read, 1.6 MB written,
// about 2.5 µs at an H100's 3.35 TB/s).
template <class T>
__device__ __forceinline__ void avg_pool_backward_masked(const T* __restrict__ dy, const T* __restrict__ y,
                                                         T* __restrict__ dx, int planes, int in_h, int in_w, int k_h,
                                                         int k_w, int stride, int out_h, int out_w) {
    const long long total = (long long)planes * in_h * in_w;
    const float inv = 1.0f / (float)(k_h * k_w);
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)blockDim.x * gridDim.x) {
        const int iw = (int)(t % in_w), ih = (int)(t / in_w % in_h);
        const long long plane = t / ((long long)in_w * in_h);
        float acc = 0.0f;
        for (int p = first_window(ih, k_h, stride); p <= min(ih / stride, out_h - 1); ++p)
            for (int q = first_window(iw, k_w, stride); q <= min(iw / stride, out_w - 1); ++q)
                acc += (float)dy[(plane * out_h + p) * out_w + q];
        dx[t] = y == nullptr || (float)y[t] > 0.0f ? (T)(acc * inv) : (T)0.0f;
    }
}

template <class T>
__device__ __forceinline__ void avg_pool_backward(const T* __restrict__ dy, T* __restrict__ dx, int planes, int in_h,
                                                  int in_w, int k_h, int k_w, int stride, int out_h, int out_w) {
    avg_pool_backward_masked<T>(dy, nullptr, dx, planes, in_h, in_w, k_h, k_w, stride, out_h, out_w);
}

template <class T>
__device__ __forceinline__ void avg_pool_relu_backward(const T* __restrict__ dy, const T* __restrict__ y,
                                                       T* __restrict__ dx, int planes, int in_h, int in_w, int k_h,
                                                       int k_w, int stride, int out_h, int out_w) {
    avg_pool_backward_masked<T>(dy, y, dx, planes, in_h, in_w, k_h, k_w, stride, out_h, out_w);
}

// ---------------------------------------------------------------- entry points

NANODDP_ENTRY_EACH_TYPE(max_pool_forward, (256),
    (const T* __restrict__ x, T* __restrict__ y, int* __restrict__ argmax, int planes, int in_h, int in_w,
     int k_h, int k_w, int stride, int out_h, int out_w),
    (x, y, argmax, planes, in_h, in_w, k_h, k_w, stride, out_h, out_w))

NANODDP_ENTRY_EACH_TYPE(max_pool_backward, (256),
    (const T* __restrict__ dy, const int* __restrict__ argmax, T* __restrict__ dx, int planes, int in_h,
     int in_w, int k_h, int k_w, int stride, int out_h, int out_w),
    (dy, argmax, dx, planes, in_h, in_w, k_h, k_w, stride, out_h, out_w))

NANODDP_ENTRY_EACH_TYPE(avg_pool_forward, (256),
    (const T* __restrict__ x, T* __restrict__ y, int planes, int in_h, int in_w, int k_h, int k_w, int stride,
     int out_h, int out_w),
    (x, y, planes, in_h, in_w, k_h, k_w, stride, out_h, out_w))

NANODDP_ENTRY_EACH_TYPE(avg_pool_backward, (256),
    (const T* __restrict__ dy, T* __restrict__ dx, int planes, int in_h, int in_w, int k_h, int k_w, int stride,
     int out_h, int out_w),
    (dy, dx, planes, in_h, in_w, k_h, k_w, stride, out_h, out_w))

NANODDP_ENTRY_EACH_TYPE(avg_pool_relu_backward, (256),
    (const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx, int planes, int in_h, int in_w,
     int k_h, int k_w, int stride, int out_h, int out_w),
    (dy, y, dx, planes, in_h, in_w, k_h, k_w, stride, out_h, out_w))
