// conv.cu — 2-D convolution (cross-correlation, as in every DL framework), NCHW.
//
//   y[n][o][p][q] = epilogue(bias[o] + Σ_c Σ_i Σ_j x[n][c][p·s - pad + i][q·s - pad + j] · w[o][c][i][j])
//   x: batch x C x H x W, w: O x C x KH x KW, y: batch x O x P x Q with
//   P = (H + 2·pad - KH) / s + 1, Q likewise. Out-of-range input taps read zero (padding).
//
// Why a tiled direct convolution and not implicit GEMM: the model's layers are small
// (src/model/mod.rs). conv1 (1→20 channels, 3x3, on 28x28) has a GEMM depth K = C·KH·KW of
// 9, far too shallow to amortize im2col index arithmetic or tensor-core tiles. conv2 (20→50
// channels, 5x5, on 13x13) is deeper, K = 500, but its GEMM view is M = O = 50 rows (four
// 16-row tensor-core tiles, the last holding 2) by N = batch·81 columns, 81 = P·Q not a
// multiple of any tile, so tiles would straddle images and run partly empty. Direct
// convolution keeps each output a plain dot product, stages the filter (the operand every
// thread of a block shares) in shared memory, and reads x through the cache, where the
// KH·KW overlapping windows of neighbouring threads hit the same lines.
//
// Kernels, each for fp32 (_f32) and for 16-bit storage with float accumulation (_f16, _bf16):
//   conv2d_forward:         one thread per output pixel; grid (ceil(P·Q/256), O, batch),
//                           block 256. The block's filter w[o] is staged in shared memory
//                           in chunks of whole input channels (≤ 1024 floats; KH·KW ≤ 1024).
//                           FLOPs 2·batch·O·P·Q·C·KH·KW; bytes ≥ |x| + |w| + |y|.
//   conv2d_backward_input:  dx = convolution of dy with the flipped filter, one thread per
//                           input pixel gathering the outputs whose windows cover it (no
//                           atomics: deterministic); grid (ceil(H·W/256), C, batch), block
//                           256; w[:, c] staged in shared memory in chunks of output channels.
//   conv2d_backward_filter: dw[o][c][i][j] = Σ_n Σ_p Σ_q dy[n][o][p][q] · x[n][c][..]; one
//                           block per filter element, 256 threads striding over batch·P·Q,
//                           then a shared-memory tree reduction (fixed order: deterministic).
//                           grid O·C·KH·KW, block 256. Written in float (master-weight grads).
//   conv2d_backward_bias:   db[o] = Σ dy[:, o]; one block per output channel, as above.
// Summation: the forward and input-gradient dot products (C·KH·KW and O·KH·KW terms, 500 and
// 1,250 for LeNet's conv2) sum each channel's window into a fresh register and add that to the
// running total once (blocked: error growing like KH·KW + C, not C·KH·KW; one register).
// The two gradient reductions run over batch·P·Q terms (173,056 for LeNet's conv1 at batch
// 256), batch·P·Q / 256 of them in each thread's running sum: that sum is compensated
// (CompensatedSum), so its error stays at a few ulps of the total instead of growing with the
// batch, and the tree over the block adds log2(256) = 8 roundings. Cost: three more adds
// per term, in kernels bound by their loads and index arithmetic.
#include "simt.cuh"

#define CONV_THREADS 256
#define CONV_TILE 1024  // floats of filter staged per pass (4 KiB)

template <class T>
__device__ __forceinline__ void conv2d_forward(const T* __restrict__ x, const T* __restrict__ w,
                                               const float* __restrict__ bias, T* __restrict__ y, int in_c, int in_h,
                                               int in_w, int out_c, int k_h, int k_w, int stride, int pad, int out_h,
                                               int out_w, int relu) {
    __shared__ float wtile[CONV_TILE];
    const int n = blockIdx.z, o = blockIdx.y;
    const int pixel = blockIdx.x * blockDim.x + threadIdx.x;
    const int p = pixel / out_w, q = pixel % out_w;
    const bool active = pixel < out_h * out_w;
    const int window = k_h * k_w;
    const int chunk = CONV_TILE / window;  // whole input channels per pass
    float acc = 0.0f;
    for (int c0 = 0; c0 < in_c; c0 += chunk) {
        const int c1 = min(in_c, c0 + chunk);
        for (int t = threadIdx.x; t < (c1 - c0) * window; t += blockDim.x)
            wtile[t] = (float)w[((long long)o * in_c + c0) * window + t];
        __syncthreads();
        if (active) {
            for (int c = c0; c < c1; ++c) {
                const T* plane = x + ((long long)n * in_c + c) * in_h * in_w;
                const float* wc = wtile + (c - c0) * window;
                float part = 0.0f;  // this channel's window, added to acc once (blocked sum)
                for (int i = 0; i < k_h; ++i) {
                    int ih = p * stride - pad + i;
                    if (ih < 0 || ih >= in_h) continue;
                    for (int j = 0; j < k_w; ++j) {
                        int iw = q * stride - pad + j;
                        if (iw < 0 || iw >= in_w) continue;
                        part = fmaf((float)plane[ih * in_w + iw], wc[i * k_w + j], part);
                    }
                }
                acc += part;
            }
        }
        __syncthreads();
    }
    if (!active) return;
    if (bias) acc += bias[o];
    if (relu) acc = fmaxf(acc, 0.0f);
    y[(((long long)n * out_c + o) * out_h + p) * out_w + q] = (T)acc;
}

template <class T>
__device__ __forceinline__ void conv2d_backward_input(const T* __restrict__ dy, const T* __restrict__ w,
                                                      T* __restrict__ dx, int in_c, int in_h, int in_w, int out_c,
                                                      int k_h, int k_w, int stride, int pad, int out_h, int out_w) {
    __shared__ float wtile[CONV_TILE];
    const int n = blockIdx.z, c = blockIdx.y;
    const int pixel = blockIdx.x * blockDim.x + threadIdx.x;
    const int ih = pixel / in_w, iw = pixel % in_w;
    const bool active = pixel < in_h * in_w;
    const int window = k_h * k_w;
    const int chunk = CONV_TILE / window;  // whole output channels per pass
    float acc = 0.0f;
    for (int o0 = 0; o0 < out_c; o0 += chunk) {
        const int o1 = min(out_c, o0 + chunk);
        for (int t = threadIdx.x; t < (o1 - o0) * window; t += blockDim.x) {
            int o = o0 + t / window, ij = t % window;
            wtile[t] = (float)w[((long long)o * in_c + c) * window + ij];
        }
        __syncthreads();
        if (active) {
            for (int o = o0; o < o1; ++o) {
                const T* plane = dy + ((long long)n * out_c + o) * out_h * out_w;
                const float* wo = wtile + (o - o0) * window;
                float part = 0.0f;  // this output channel's taps, added to acc once
                for (int i = 0; i < k_h; ++i) {
                    int p = ih + pad - i;  // = p·stride for the output row p that used this tap
                    if (p < 0) continue;
                    if (stride != 1) {  // uniform branch: no integer division at stride 1
                        if (p % stride != 0) continue;
                        p /= stride;
                    }
                    if (p >= out_h) continue;
                    for (int j = 0; j < k_w; ++j) {
                        int q = iw + pad - j;
                        if (q < 0) continue;
                        if (stride != 1) {
                            if (q % stride != 0) continue;
                            q /= stride;
                        }
                        if (q >= out_w) continue;
                        part = fmaf((float)plane[p * out_w + q], wo[i * k_w + j], part);
                    }
                }
                acc += part;
            }
        }
        __syncthreads();
    }
    if (active) dx[(((long long)n * in_c + c) * in_h + ih) * in_w + iw] = (T)acc;
}

// A running float sum that carries its own rounding error (Kahan): its error bound is a few
// ulps of the total however many terms are added, where a plain running sum's grows with
// their number. Needs IEEE adds as written: no -use_fast_math (which may reassociate).
struct CompensatedSum {
    float sum = 0.0f, carry = 0.0f;  // carry: what the last additions rounded away, negated
    __device__ __forceinline__ void add(float v) {
        const float y = v - carry;
        const float t = sum + y;
        carry = (t - sum) - y;
        sum = t;
    }
    __device__ __forceinline__ float total() const { return sum - carry; }
};

// Sum of `v` over the block (blockDim.x a power of two ≤ 1024); the result is in red[0].
__device__ __forceinline__ void block_reduce(float* red, float v) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
}

template <class T>
__device__ __forceinline__ void conv2d_backward_filter(const T* __restrict__ x, const T* __restrict__ dy,
                                                       float* __restrict__ dw, int batch, int in_c, int in_h, int in_w,
                                                       int out_c, int k_h, int k_w, int stride, int pad, int out_h,
                                                       int out_w) {
    __shared__ float red[CONV_THREADS];
    const int e = blockIdx.x;  // filter element (o, c, i, j)
    const int j = e % k_w, i = e / k_w % k_h, c = e / (k_w * k_h) % in_c, o = e / (k_w * k_h * in_c);
    const int pixels = out_h * out_w;
    CompensatedSum acc;
    // Thread t takes terms t, t + blockDim.x, ... of the batch·P·Q (image, pixel) pairs, in
    // order. Their (n, p, q) advance by carries instead of divisions: the 64-bit division
    // per term had cost more than the term (2.25 ms for LeNet's conv2 on an H200).
    const int span = max(pixels, 1);  // no output pixels: no terms (n starts at batch)
    int n = pixels > 0 ? (int)threadIdx.x / span : batch;
    int p = (int)threadIdx.x % span / max(out_w, 1), q = (int)threadIdx.x % span % max(out_w, 1);
    const int block = blockDim.x;
    const int step_n = block / span, step_p = block % span / max(out_w, 1);
    const int step_q = block % span % max(out_w, 1);
    for (; n < batch; n += step_n, p += step_p, q += step_q) {
        int ih = p * stride - pad + i, iw = q * stride - pad + j;
        if (ih >= 0 && ih < in_h && iw >= 0 && iw < in_w) {
            float g = (float)dy[((long long)n * out_c + o) * pixels + p * out_w + q];
            acc.add(g * (float)x[(((long long)n * in_c + c) * in_h + ih) * in_w + iw]);
        }
        // The next term's (n, p, q): q and p each wrap at most once (step_q < out_w,
        // step_p < out_h).
        if (q + step_q >= out_w) {
            q -= out_w;
            ++p;
        }
        if (p + step_p >= out_h) {
            p -= out_h;
            ++n;
        }
    }
    block_reduce(red, acc.total());
    if (threadIdx.x == 0) dw[e] = red[0];
}

template <class T>
__device__ __forceinline__ void conv2d_backward_bias(const T* __restrict__ dy, float* __restrict__ db, int batch,
                                                     int out_c, int pixels) {
    __shared__ float red[CONV_THREADS];
    const int o = blockIdx.x;
    CompensatedSum acc;
    for (long long t = threadIdx.x; t < (long long)batch * pixels; t += blockDim.x) {
        long long n = t / pixels, pq = t % pixels;
        acc.add((float)dy[(n * out_c + o) * pixels + pq]);
    }
    block_reduce(red, acc.total());
    if (threadIdx.x == 0) db[o] = red[0];
}

// ---------------------------------------------------------------- entry points

NANODDP_ENTRY_EACH_TYPE(conv2d_forward, (256),
    (const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ bias_or_null, T* __restrict__ y,
     int in_c, int in_h, int in_w, int out_c, int k_h, int k_w, int stride, int pad, int out_h, int out_w, int relu),
    (x, w, bias_or_null, y, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w, relu))

NANODDP_ENTRY_EACH_TYPE(conv2d_backward_input, (256),
    (const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx, int in_c, int in_h, int in_w, int out_c,
     int k_h, int k_w, int stride, int pad, int out_h, int out_w),
    (dy, w, dx, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w))

NANODDP_ENTRY_EACH_TYPE(conv2d_backward_filter, (256),
    (const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ dw, int batch, int in_c, int in_h,
     int in_w, int out_c, int k_h, int k_w, int stride, int pad, int out_h, int out_w),
    (x, dy, dw, batch, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w))

NANODDP_ENTRY_EACH_TYPE(conv2d_backward_bias, (256),
    (const T* __restrict__ dy, float* __restrict__ db, int batch, int out_c, int pixels),
    (dy, db, batch, out_c, pixels))
