// conv_direct.cu — direct convolutions for a layer with few filter taps (K = C·KH·KW ≤ 9:
// LeNet's conv1, one channel, 3x3), followed by a ReLU and a 2x2, stride-2 average pool:
// the forward with both fused, and the filter and bias gradients through them. Same
// operations as conv.cu's pooled kernels, for the shapes where an implicit GEMM has no
// reduction to tile: 9 taps are less than one of its 16-step slices, and its 32-row tiles
// held conv1's 20 channels at 35% use.
//
//   y[n][o][p][q]      = relu(bias[o] + Σ_(c,i,j) w[o][c][i][j] · x[n][c][p·s - pad + i][q·s - pad + j])
//   pooled[n][o][a][b] = ((y[2a][2b] + y[2a][2b+1]) + (y[2a+1][2b] + y[2a+1][2b+1])) · 0.25,
//                        from the f32 values (before y is rounded to T), as conv.cu's epilogue
//   dY[n][o][p][q]     = d_pooled[n][o][p/2][q/2] · 0.25 where y > 0, else 0 (conv.cu's
//                        through_pool), over the windows' pixels only
//   dw[o][(c,i,j)]     = Σ_(n,p,q) dY · x̂[(c,i,j)][(n,p,q)],   db[o] = Σ_(n,p,q) dY
// y is written (and read back) only at the pixels the pool's windows cover, as conv.cu's.
// Out-of-range taps read zero: each image is staged in shared memory with a zero border of
// `pad`, so no tap is bounds-tested.
//
// conv_direct_relu_pool_forward: grid (batch), block 256, dynamic shared memory for the
//   image (C·(H + 2·pad)·(W + 2·pad) floats) and the filter and bias (O·K + O floats). A
//   thread per pooled output (o, a, b) at a time: its window's four pixels share each tap's
//   weight (one shared load for four FMAs). At LeNet's conv1 (batch 256): 62.3 MFLOP,
//   compulsory bytes 0.8 MB of images in, 13.8 MB of y and 3.5 MB pooled out (f32): 18.1 MB,
//   3.4 FLOP/B, memory-bound: 5.4 µs at an H100's 3.35 TB/s.
// conv_direct_relu_pool_filter: grid (S slices of the batch's images, ⌈O / 4⌉), block 128:
//   warp w takes channel o = 4·blockIdx.y + w, its lanes the windows' pixels of each image
//   in turn (the image staged in shared memory as above), each lane holding the K + 1 sums
//   (dw's row and db) in registers. At conv1: 2·62.3 MFLOP (the products and db), bytes
//   0.8 MB of images, 13.8 MB of y and 3.5 MB of d_pooled in: 18.1 MB, memory-bound like the
//   forward (5.4 µs).
//   Summation: each image's terms of a lane (⌈P·Q / 32⌉ of them: 22 at conv1) in a fresh
//   register, added to the lane's total compensated (Kahan); the 32 lanes' totals by a
//   butterfly of shuffles in a fixed order; the S slices' partials (scratch slot s, in
//   conv.cu's layout: O·K + O floats a slot, dw then db) in slice order, compensated, in two
//   levels by the last blocks to finish (split_sum.cuh): the same bits on every run and GPU.
//   S is chosen by the host from the shape alone (`direct_filter_slices`).
#include "simt.cuh"
#include "split_sum.cuh"

#define DIRECT_MAX_TAPS 9
#define DIRECT_WARPS 4  // conv_direct_relu_pool_filter's channels per block
#define DIRECT_BATCH 4  // pixels whose loads a lane of it issues together

// Stages image n's C planes into `xs`, converted to float, with a zero border of `pad`:
// plane c at c·hp·wp, row r at r·wp (hp = H + 2·pad, wp = W + 2·pad).
template <class T>
__device__ __forceinline__ void stage_image(const T* __restrict__ x, float* __restrict__ xs, int n, int in_c,
                                            int in_h, int in_w, int pad) {
    const int hp = in_h + 2 * pad, wp = in_w + 2 * pad, all = in_c * hp * wp;
    const T* img = x + (long long)n * in_c * in_h * in_w;
    for (int e = threadIdx.x; e < all; e += blockDim.x) {
        const int c = e / (hp * wp), r = e / wp % hp - pad, q = e % wp - pad;
        xs[e] = r >= 0 && r < in_h && q >= 0 && q < in_w ? (float)img[(c * in_h + r) * in_w + q] : 0.0f;
    }
}

// Offsets of a filter's K taps (c, i, j) in a staged image, in (c, i, j) order.
__device__ __forceinline__ int tap_offset(int t, int k_h, int k_w, int hp, int wp) {
    const int window = k_h * k_w, c = t / window, i = t % window / k_w, j = t % k_w;
    return (c * hp + i) * wp + j;
}

template <class T>
__device__ __forceinline__ void conv_direct_relu_pool_forward(
    const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ bias, T* __restrict__ y,
    T* __restrict__ pooled, int batch, int in_c, int in_h, int in_w, int out_c, int k_h, int k_w, int stride, int pad,
    int out_h, int out_w) {
    SIMT_DYNAMIC_SHARED(float, direct_shared);
    const int hp = in_h + 2 * pad, wp = in_w + 2 * pad, taps = in_c * k_h * k_w;
    float* xs = direct_shared;            // [C][hp][wp]
    float* ws = xs + in_c * hp * wp;      // [O][K]
    float* bs = ws + out_c * taps;        // [O]
    __shared__ int offsets[DIRECT_MAX_TAPS];
    const int n = blockIdx.x;
    stage_image(x, xs, n, in_c, in_h, in_w, pad);
    for (int e = threadIdx.x; e < out_c * taps; e += blockDim.x) ws[e] = (float)w[e];
    for (int e = threadIdx.x; e < out_c; e += blockDim.x) bs[e] = bias ? bias[e] : 0.0f;
    if ((int)threadIdx.x < taps) offsets[threadIdx.x] = tap_offset((int)threadIdx.x, k_h, k_w, hp, wp);
    __syncthreads();

    const int ph = out_h / 2, pw = out_w / 2, windows = ph * pw, pixels = out_h * out_w;
    for (int e = threadIdx.x; e < out_c * windows; e += blockDim.x) {
        const int o = e / windows, a = e % windows / pw, b = e % pw;
        // The window's top-left pixel (2a, 2b) in the staged image; its right neighbour is
        // `stride` columns on, the one below `stride` rows.
        const float* at = xs + (2 * a * stride) * wp + 2 * b * stride;
        const float* wo = ws + o * taps;
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int t = 0; t < taps; ++t) {
            const float wt = wo[t];
            const float* p = at + offsets[t];
            v[0] = fmaf(wt, p[0], v[0]);
            v[1] = fmaf(wt, p[stride], v[1]);
            v[2] = fmaf(wt, p[stride * wp], v[2]);
            v[3] = fmaf(wt, p[stride * wp + stride], v[3]);
        }
        SIMT_UNROLL
        for (int u = 0; u < 4; ++u) v[u] = fmaxf(v[u] + bs[o], 0.0f);
        const long long plane = ((long long)n * out_c + o) * pixels + (2 * a) * out_w + 2 * b;
        y[plane] = (T)v[0];
        y[plane + 1] = (T)v[1];
        y[plane + out_w] = (T)v[2];
        y[plane + out_w + 1] = (T)v[3];
        pooled[((long long)n * out_c + o) * windows + e % windows] = (T)(((v[0] + v[1]) + (v[2] + v[3])) * 0.25f);
    }
}

NANODDP_ENTRY_EACH_TYPE(conv_direct_relu_pool_forward, (256),
    (const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ bias_or_null, T* __restrict__ y,
     T* __restrict__ pooled, int batch, int in_c, int in_h, int in_w, int out_c, int k_h, int k_w, int stride,
     int pad, int out_h, int out_w),
    (x, w, bias_or_null, y, pooled, batch, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w))

// The filter gradient: see the header. `scratch` and `counters` as conv.cu's filter gradient
// (split_sum.cuh), unused with one slice (gridDim.x = 1).
template <class T>
__device__ __forceinline__ void conv_direct_relu_pool_filter(
    const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ d_pooled, float* __restrict__ dw,
    float* __restrict__ db, float* __restrict__ scratch, int* __restrict__ counters, int batch, int in_c, int in_h,
    int in_w, int out_c, int k_h, int k_w, int stride, int pad, int out_h, int out_w) {
    SIMT_DYNAMIC_SHARED(float, direct_shared);
    const int hp = in_h + 2 * pad, wp = in_w + 2 * pad, taps = in_c * k_h * k_w;
    const int lane = threadIdx.x % 32, o = blockIdx.y * DIRECT_WARPS + threadIdx.x / 32;
    const int splits = gridDim.x, s = blockIdx.x;
    const int per = (batch + splits - 1) / splits, n0 = min(batch, s * per), n1 = min(batch, n0 + per);
    const int ph = out_h / 2, pw = out_w / 2, region_w = 2 * pw, region = 2 * ph * region_w;
    const int pixels = out_h * out_w;
    __shared__ int offset[DIRECT_MAX_TAPS];
    if ((int)threadIdx.x < taps) offset[threadIdx.x] = tap_offset((int)threadIdx.x, k_h, k_w, hp, wp);
    float acc[DIRECT_MAX_TAPS + 1], carry[DIRECT_MAX_TAPS + 1];
    SIMT_UNROLL
    for (int t = 0; t <= DIRECT_MAX_TAPS; ++t) acc[t] = carry[t] = 0.0f;

    for (int n = n0; n < n1; ++n) {
        __syncthreads();  // the previous image's readers are done with xs
        stage_image(x, direct_shared, n, in_c, in_h, in_w, pad);
        __syncthreads();
        if (o >= out_c) continue;
        const long long plane = (long long)n * out_c + o;
        const T* yo = y + plane * pixels;
        const T* dpo = d_pooled + plane * ph * pw;
        float part[DIRECT_MAX_TAPS + 1];
        SIMT_UNROLL
        for (int t = 0; t <= DIRECT_MAX_TAPS; ++t) part[t] = 0.0f;
        // DIRECT_BATCH pixels a lane at a time: their loads in flight together.
        for (int r0 = lane; r0 < region; r0 += 32 * DIRECT_BATCH) {
            float dy[DIRECT_BATCH];
            int at[DIRECT_BATCH];
            SIMT_UNROLL
            for (int u = 0; u < DIRECT_BATCH; ++u) {
                const int r = r0 + 32 * u, p = r / region_w, q = r % region_w;
                dy[u] = 0.0f;
                at[u] = 0;
                if (r < region) {
                    const float d = (float)dpo[(p / 2) * pw + q / 2] * 0.25f;
                    dy[u] = (float)yo[p * out_w + q] > 0.0f ? d : 0.0f;
                    at[u] = p * stride * wp + q * stride;
                }
            }
            SIMT_UNROLL
            for (int u = 0; u < DIRECT_BATCH; ++u) {
                SIMT_UNROLL
                for (int t = 0; t < DIRECT_MAX_TAPS; ++t)
                    if (t < taps) part[t] = fmaf(dy[u], direct_shared[at[u] + offset[t]], part[t]);
                part[DIRECT_MAX_TAPS] += dy[u];
            }
        }
        SIMT_UNROLL
        for (int t = 0; t <= DIRECT_MAX_TAPS; ++t) {
            const float v = part[t] - carry[t], sum = acc[t] + v;
            carry[t] = (sum - acc[t]) - v;
            acc[t] = sum;
        }
    }

    // The warp's lanes' totals, by a butterfly (every lane ends with the same sum); lane t
    // keeps tap t's (lane K: db's).
    const int row = taps + 1;  // a channel's elements in a slot: K taps, then db
    float mine = 0.0f;
    SIMT_UNROLL
    for (int t = 0; t <= DIRECT_MAX_TAPS; ++t) {
        if (t >= taps && t < DIRECT_MAX_TAPS) continue;  // no such tap (uniform over the warp)
        float v = acc[t] - carry[t];
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == (t < DIRECT_MAX_TAPS ? t : taps)) mine = v;
    }
    const int t = lane;
    auto write = [&](int oc, int tap, float v) {
        if (tap < taps) dw[oc * taps + tap] = v;
        else db[oc] = v;
    };
    if (splits == 1) {
        if (o < out_c && t < row) write(o, t, mine);
        return;
    }
    const long long slot = (long long)out_c * row;  // conv.cu's layout: dw (O·K), then db (O)
    auto place = [&](int e) -> long long {  // element e of this block's channels
        const int oc = blockIdx.y * DIRECT_WARPS + e / row, tap = e % row;
        if (oc >= out_c) return -1;
        return tap < taps ? (long long)oc * taps + tap : (long long)out_c * taps + oc;
    };
    if (o < out_c && t < row) scratch[s * slot + place((threadIdx.x / 32) * row + t)] = mine;
    split_reduce(counters, blockIdx.y, s, splits, [&](int first, int count, int into) {
        split_sum_each<4>(scratch, slot, first, count, (int)threadIdx.x, DIRECT_WARPS * row, (int)blockDim.x, place,
                          [&](int e, float sum) {
                              if (into >= 0) scratch[into * slot + place(e)] = sum;
                              else write(blockIdx.y * DIRECT_WARPS + e / row, e % row, sum);
                          });
    });
}

NANODDP_ENTRY_EACH_TYPE(conv_direct_relu_pool_filter, (128),
    (const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ d_pooled, float* __restrict__ dw,
     float* __restrict__ db, float* __restrict__ scratch, int* __restrict__ counters, int batch, int in_c, int in_h,
     int in_w, int out_c, int k_h, int k_w, int stride, int pad, int out_h, int out_w),
    (x, y, d_pooled, dw, db, scratch, counters, batch, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w))
