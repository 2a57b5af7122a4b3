// conv_direct.cu — direct convolutions for one input channel and a 3x3 filter at stride 1
// (LeNet's conv1; any padding) with a ReLU and a 2x2, stride-2 average pool: the forward with
// both fused, and the filter and bias gradients through them. conv.cu's pooled kernels
// compute the same; here an implicit GEMM has no reduction to tile (9 taps, less than one
// 16-step slice). Other shapes go to conv.cu (direct_fits in src/backend/kernel/ops.rs).
//
//   y[n][o][p][q]      = relu(bias[o] + Σ_(i,j) w[o][i][j] · x[n][p - pad + i][q - pad + j])
//   pooled[n][o][a][b] = ((y[2a][2b] + y[2a][2b+1]) + (y[2a+1][2b] + y[2a+1][2b+1])) · 0.25
//                        (from the f32 values, before y is rounded to T, as conv.cu)
//   dY[n][o][p][q]     = d_pooled[n][o][p/2][q/2] · 0.25 where y > 0, else 0 (the windows'
//                        pixels only)
//   dw[o][(i,j)]       = Σ_(n,p,q) dY · x[n][p - pad + i][q - pad + j],   db[o] = Σ_(n,p,q) dY
// y is written only where the host passes it; the trainer does not (Backend::recomputes_relu):
// the filter gradient recomputes y from the staged pixels and filter in the forward's order
// and rounding, so no tensor of conv1's output size lives between the passes. Each image is
// staged in shared memory with a zero border of `pad`, so no tap is bounds-tested.
//
// A warp takes DIRECT_CHANNELS = 4 output channels, up to 8 warps a block (blockIdx.y the
// next 8), so each staged pixel a lane loads feeds 4 channels' FMAs.
// conv_direct_relu_pool_forward: grid (batch, ⌈O / 32⌉), the image staged whole; lane e of a
//   warp takes pool windows e, e + 32, ... (conv1: 169 windows, 256 blocks of 5 warps): the
//   4x4 staged pixels under a window's four filters, 9 weights a channel in registers, 144
//   FMAs. conv1 at batch 256: 62.3 MFLOP; 0.8 MB of images in, 3.5 MB pooled out (f32): 15
//   FLOP/B, memory-bound, 1.3 µs at an H100's 3.35 TB/s (5.4 µs writing y's 13.8 MB).
//   Measured (H100, ncu) writing y: 13.3 µs, 41% of that roofline; 5 warps an SM limit it.
// conv_direct_relu_pool_filter: grid (S slices, ⌈O / 32⌉). The batch's images are cut into
//   pieces, bands of `band_rows` pooled rows (the host aims at 512 pieces: conv1 at batch 256
//   takes bands of 7 and 6 of its 13 pooled rows); a slice is consecutive pieces, each
//   staged alone. Lane q takes column q of the windows' pixels down the band: per pooled row
//   the 4x3 staged pixels under two pixels' filters, the channels' pooled gradient and the
//   two pixels' ReLU outputs (read from y, or recomputed: 72 FMAs from the block's staged
//   filters and biases), then 72 FMAs and 8 adds. conv1: 2·62.3 MFLOP (3·62.3 recomputing),
//   4.3 MB in (18.1 with y): memory-bound, 1.3 µs (5.4). Measured (H100, ncu) reading y:
//   30.7 µs, 18% of that roofline, latency-bound (21% of the warps active at 122 registers).
//   Summation: a lane's terms of a piece (up to 2·band_rows) in fresh registers; the 32
//   lanes by a reduce-scatter of shuffles in a fixed order (reduce_scatter_64); the pieces of
//   a slice compensated (Kahan); the S slices' partials (scratch slot s, O·9 + O floats: dw,
//   then db) in slice order, compensated, in two levels by the last blocks to finish
//   (split_sum.cuh). S depends on the shape alone: the same bits on every run and GPU.
#include "simt.cuh"
#include "split_sum.cuh"

#define DIRECT_K 3                       // the filter: one input channel, 3x3, stride 1
#define DIRECT_MAX_TAPS (DIRECT_K * DIRECT_K)
#define DIRECT_CHANNELS 4  // output channels a warp takes: each staged x value feeds 4 of them
#define DIRECT_WARPS 8     // warps a block at most (256 threads)
#define DIRECT_WB 12       // floats a channel's filter and bias take staged: 9 taps, the bias, 2 zeros

// Stages rows [r0, r0 + rows) of image n (one channel), as padded with a zero border of
// `pad`, into `xs`, converted to float: row r0 + i at i·pitch, pitch = W + 2·pad rounded up
// to even (direct_pitch: the forward's pairs of pixels are 8-byte aligned), zero past W + 2·pad.
__device__ __forceinline__ int direct_pitch(int in_w, int pad) { return (in_w + 2 * pad + 1) / 2 * 2; }

template <class T>
__device__ __forceinline__ void stage_rows(const T* __restrict__ x, float* __restrict__ xs, int n, int in_h, int in_w,
                                           int pad, int r0, int rows) {
    const int pitch = direct_pitch(in_w, pad), all = rows * pitch;
    const T* img = x + (long long)n * in_h * in_w;
    for (int e = threadIdx.x; e < all; e += blockDim.x) {
        const int r = r0 + e / pitch - pad, q = e % pitch - pad;
        xs[e] = r >= 0 && r < in_h && q >= 0 && q < in_w ? (float)img[r * in_w + q] : 0.0f;
    }
}

// The first output channel of this block: warps take DIRECT_CHANNELS channels each,
// blockIdx.y the next group of warps.
__device__ __forceinline__ int direct_block_first_channel() {
    return blockIdx.y * (blockDim.x / 32) * DIRECT_CHANNELS;
}

// The first output channel of this thread's warp.
__device__ __forceinline__ int direct_first_channel() {
    return direct_block_first_channel() + threadIdx.x / 32 * DIRECT_CHANNELS;
}

// The ReLU's output at one pixel: its 9 taps' products, in tap order, from the staged pixels
// xp[r0..r0 + 3][c0..c0 + 3], then the bias. The forward computes it and the filter gradient,
// without y, recomputes it the same way: the same bits.
template <int ROWS, int COLS>
__device__ __forceinline__ float direct_relu(const float (&wr)[DIRECT_MAX_TAPS], float bias,
                                             const float (&xp)[ROWS][COLS], int r0, int c0) {
    float sum = 0.0f;
    SIMT_UNROLL
    for (int t = 0; t < DIRECT_MAX_TAPS; ++t) sum = fmaf(wr[t], xp[r0 + t / DIRECT_K][c0 + t % DIRECT_K], sum);
    return fmaxf(sum + bias, 0.0f);
}

// The forward's pool windows of lane `lane` (e, e + 32, ...) for the warp's channels o0..:
// y (with KEEP_Y) and the pooled outputs. A template, so the loop without y has no test in it
// (a run-time test there made ptxas spill).
template <bool KEEP_Y, class T>
__device__ __forceinline__ void direct_forward_windows(const float* __restrict__ xs, int pitch,
                                                       const float (&wr)[DIRECT_CHANNELS][DIRECT_MAX_TAPS],
                                                       const float (&br)[DIRECT_CHANNELS], T* __restrict__ y,
                                                       T* __restrict__ pooled, int n, int o0, int out_c, int out_h,
                                                       int out_w, int lane) {
    const int ph = out_h / 2, pw = out_w / 2, windows = ph * pw, pixels = out_h * out_w;
    for (int e = lane; e < windows; e += 32) {
        const int a = e / pw, b = e - a * pw;
        // The 4x4 staged pixels under the window's four 3x3 filters, from (2a, 2b): two
        // 8-byte loads a row (the lanes of one pooled row, two pixels apart, read contiguous
        // bytes; the stand-in still counts 46% of the wavefronts as conflicts, where a
        // warp's lanes span two or three pooled rows).
        float xp[DIRECT_K + 1][DIRECT_K + 1];
        const float* at = xs + (2 * a) * pitch + 2 * b;
        SIMT_UNROLL
        for (int i = 0; i <= DIRECT_K; ++i) {
            const float2 l = *reinterpret_cast<const float2*>(at + i * pitch);
            const float2 r = *reinterpret_cast<const float2*>(at + i * pitch + 2);
            xp[i][0] = l.x, xp[i][1] = l.y, xp[i][2] = r.x, xp[i][3] = r.y;
        }
        SIMT_UNROLL
        for (int c = 0; c < DIRECT_CHANNELS; ++c) {
            if (o0 + c >= out_c) break;
            float v[4];  // pixels (2a, 2b), (2a, 2b + 1), (2a + 1, 2b), (2a + 1, 2b + 1)
            SIMT_UNROLL
            for (int u = 0; u < 4; ++u) v[u] = direct_relu(wr[c], br[c], xp, u / 2, u % 2);
            const long long plane = (long long)n * out_c + o0 + c;
            if (KEEP_Y) {
                T* yo = y + plane * pixels + (2 * a) * out_w + 2 * b;
                yo[0] = (T)v[0];
                yo[1] = (T)v[1];
                yo[out_w] = (T)v[2];
                yo[out_w + 1] = (T)v[3];
            }
            pooled[plane * windows + e] = (T)(((v[0] + v[1]) + (v[2] + v[3])) * 0.25f);
        }
    }
}

template <class T>
__device__ __forceinline__ void conv_direct_relu_pool_forward(
    const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ bias, T* __restrict__ y,
    T* __restrict__ pooled, int batch, int in_c, int in_h, int in_w, int out_c, int k_h, int k_w, int stride, int pad,
    int out_h, int out_w) {
    SIMT_DYNAMIC_SHARED(float, xs);  // [H + 2·pad][pitch]
    const int pitch = direct_pitch(in_w, pad);
    const int n = blockIdx.x, lane = threadIdx.x % 32, o0 = direct_first_channel();
    stage_rows(x, xs, n, in_h, in_w, pad, 0, in_h + 2 * pad);
    __syncthreads();
    if (o0 >= out_c) return;  // no barrier follows
    // The warp's filters and biases, in registers.
    float wr[DIRECT_CHANNELS][DIRECT_MAX_TAPS], br[DIRECT_CHANNELS];
    SIMT_UNROLL
    for (int c = 0; c < DIRECT_CHANNELS; ++c) {
        const bool here = o0 + c < out_c;
        br[c] = here && bias ? bias[o0 + c] : 0.0f;
        SIMT_UNROLL
        for (int t = 0; t < DIRECT_MAX_TAPS; ++t) wr[c][t] = here ? (float)w[(o0 + c) * DIRECT_MAX_TAPS + t] : 0.0f;
    }

    if (y != nullptr) direct_forward_windows<true>(xs, pitch, wr, br, y, pooled, n, o0, out_c, out_h, out_w, lane);
    else direct_forward_windows<false>(xs, pitch, wr, br, y, pooled, n, o0, out_c, out_h, out_w, lane);
}

NANODDP_ENTRY_EACH_TYPE(conv_direct_relu_pool_forward, (256),
    (const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ bias_or_null, T* __restrict__ y_or_null,
     T* __restrict__ pooled, int batch, int in_c, int in_h, int in_w, int out_c, int k_h, int k_w, int stride,
     int pad, int out_h, int out_w),
    (x, w, bias_or_null, y_or_null, pooled, batch, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w))

// Sums v over the warp's 32 lanes, leaving lane L the sums of elements 2L and 2L + 1 in
// v[0] and v[1] (a reduce-scatter: at each level a lane sends the half of its elements it
// gives away and adds the partner's half of those it keeps; 62 shuffles for 64 elements where
// a butterfly per element takes 320). Fixed order: the same bits on every run.
template <int H>  // one level: elements [0, 2H) to [0, H), partners lane ^ (H / 2)
__device__ __forceinline__ void reduce_scatter_level(float (&v)[64], int lane) {
    const bool upper = (lane & (H / 2)) != 0;
    SIMT_UNROLL
    for (int i = 0; i < H; ++i) {
        const float give = upper ? v[i] : v[i + H], keep = upper ? v[i + H] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, give, H / 2);
    }
}
__device__ __forceinline__ void reduce_scatter_64(float (&v)[64], int lane) {
    reduce_scatter_level<32>(v, lane);
    reduce_scatter_level<16>(v, lane);
    reduce_scatter_level<8>(v, lane);
    reduce_scatter_level<4>(v, lane);
    reduce_scatter_level<2>(v, lane);
}

// Elements of a warp's share in the filter gradient: DIRECT_CHANNELS rows of
// DIRECT_MAX_TAPS + 1 (the taps, then the bias).
#define DIRECT_ROW (DIRECT_MAX_TAPS + 1)
#define DIRECT_SHARE (DIRECT_CHANNELS * DIRECT_ROW)

// The filter gradient: see the header. A piece is a band of `band_rows` pooled rows of an
// image (the pixel rows 2a and 2a + 1 of each pooled row a); block s takes pieces
// [s·per, (s + 1)·per) of the batch's, in order, each staged alone (its input rows, at most
// (2·band_rows - 1)·stride + KH of them). `scratch` and `counters` as conv.cu's filter
// gradient (split_sum.cuh), unused with one slice (gridDim.x = 1).
template <class T>
__device__ __forceinline__ void conv_direct_relu_pool_filter(
    const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ w, const float* __restrict__ bias,
    const T* __restrict__ d_pooled, float* __restrict__ dw, float* __restrict__ db, float* __restrict__ scratch,
    int* __restrict__ counters, int batch, int in_c, int in_h, int in_w, int out_c, int k_h, int k_w, int stride,
    int pad, int out_h, int out_w, int band_rows) {
    SIMT_DYNAMIC_SHARED(float, xs);  // [band's input rows][pitch]
    // Without y, the block's channels' filters and biases, staged for the recompute (a
    // channel's in three 16-byte loads); the first piece's barrier publishes them.
    __shared__ __align__(16) float wb[DIRECT_WARPS * DIRECT_CHANNELS][DIRECT_WB];
    const int pitch = direct_pitch(in_w, pad), rows = 2 * band_rows + DIRECT_K - 1;
    const int lane = threadIdx.x % 32, o0 = direct_first_channel(), first = direct_block_first_channel();
    const bool recompute = y == nullptr;
    if (recompute) {
        for (int e = threadIdx.x; e < (int)(blockDim.x / 32) * DIRECT_CHANNELS * DIRECT_WB; e += blockDim.x) {
            const int o = first + e / DIRECT_WB, t = e % DIRECT_WB;
            const bool tap = t < DIRECT_MAX_TAPS, b = t == DIRECT_MAX_TAPS && bias != nullptr;
            wb[e / DIRECT_WB][t] = o >= out_c ? 0.0f : tap ? (float)w[o * DIRECT_MAX_TAPS + t] : b ? bias[o] : 0.0f;
        }
    }
    const int ph = out_h / 2, pw = out_w / 2, region_w = 2 * pw, pixels = out_h * out_w;
    const int bands = (ph + band_rows - 1) / band_rows, pieces = batch * bands;
    const int splits = gridDim.x, s = blockIdx.x;
    const int per = (pieces + splits - 1) / splits, k0 = min(pieces, s * per), k1 = min(pieces, k0 + per);
    // Lane L holds elements 2L and 2L + 1 of its warp's share, compensated sums over the pieces.
    float acc[2] = {0.0f, 0.0f}, carry[2] = {0.0f, 0.0f};

    for (int k = k0; k < k1; ++k) {
        const int n = k / bands, a0 = k % bands * band_rows, a1 = min(ph, a0 + band_rows);
        __syncthreads();  // the previous piece's readers are done with xs
        stage_rows(x, xs, n, in_h, in_w, pad, 2 * a0, rows);
        __syncthreads();
        if (o0 >= out_c) continue;
        // The warp's channels' planes (a channel past out_c reads channel o0's: its sums are
        // never written).
        const T* yc[DIRECT_CHANNELS];
        const T* dc[DIRECT_CHANNELS];
        SIMT_UNROLL
        for (int c = 0; c < DIRECT_CHANNELS; ++c) {
            const long long plane = (long long)n * out_c + (o0 + c < out_c ? o0 + c : o0);
            yc[c] = recompute ? nullptr : y + plane * pixels;
            dc[c] = d_pooled + plane * ph * pw;
        }
        float part[64];  // the share (DIRECT_SHARE) and zeros, for reduce_scatter_64
        SIMT_UNROLL
        for (int i = 0; i < 64; ++i) part[i] = 0.0f;
        // Lane q a column of the windows' pixels, down the band's pooled rows: the 4x3 staged
        // pixels under the two pixels' filters, and per channel a pooled gradient and the two
        // pixels' ReLU outputs (loaded together, or recomputed from the staged pixels).
        for (int q = lane; q < region_w; q += 32) {
            for (int a = a0; a < a1; ++a) {
                float xp[DIRECT_K + 1][DIRECT_K];
                const float* at = xs + 2 * (a - a0) * pitch + q;
                SIMT_UNROLL
                for (int i = 0; i <= DIRECT_K; ++i)
                    SIMT_UNROLL
                    for (int j = 0; j < DIRECT_K; ++j) xp[i][j] = at[i * pitch + j];
                float dy[2][DIRECT_CHANNELS];
                SIMT_UNROLL
                for (int c = 0; c < DIRECT_CHANNELS; ++c) {
                    const float d = (float)dc[c][a * pw + q / 2] * 0.25f;
                    float y0, y1;
                    if (recompute) {
                        const float4* f = reinterpret_cast<const float4*>(wb[(threadIdx.x / 32) * DIRECT_CHANNELS + c]);
                        const float4 l = f[0], m = f[1], r = f[2];
                        const float wr[DIRECT_MAX_TAPS] = {l.x, l.y, l.z, l.w, m.x, m.y, m.z, m.w, r.x};
                        // As the forward would have stored them: rounded to T.
                        y0 = (float)(T)direct_relu(wr, r.y, xp, 0, 0);
                        y1 = (float)(T)direct_relu(wr, r.y, xp, 1, 0);
                    } else {
                        y0 = (float)yc[c][2 * a * out_w + q], y1 = (float)yc[c][(2 * a + 1) * out_w + q];
                    }
                    dy[0][c] = y0 > 0.0f ? d : 0.0f;
                    dy[1][c] = y1 > 0.0f ? d : 0.0f;
                }
                SIMT_UNROLL
                for (int u = 0; u < 2; ++u)
                    SIMT_UNROLL
                    for (int c = 0; c < DIRECT_CHANNELS; ++c) {
                        SIMT_UNROLL
                        for (int t = 0; t < DIRECT_MAX_TAPS; ++t)
                            part[c * DIRECT_ROW + t] =
                                fmaf(dy[u][c], xp[u + t / DIRECT_K][t % DIRECT_K], part[c * DIRECT_ROW + t]);
                        part[c * DIRECT_ROW + DIRECT_MAX_TAPS] += dy[u][c];
                    }
            }
        }
        reduce_scatter_64(part, lane);
        SIMT_UNROLL
        for (int h = 0; h < 2; ++h) {
            const float v = part[h] - carry[h], sum = acc[h] + v;
            carry[h] = (sum - acc[h]) - v;
            acc[h] = sum;
        }
    }

    // Element e of this block's warps' shares to its place in a slot (conv.cu's layout: dw,
    // O·K floats, then db), or -1 past the channels.
    auto place = [&](int e) -> long long {
        const int o = first + e / DIRECT_ROW, t = e % DIRECT_ROW;
        if (o >= out_c) return -1;
        return t < DIRECT_MAX_TAPS ? (long long)o * DIRECT_MAX_TAPS + t : (long long)out_c * DIRECT_MAX_TAPS + o;
    };
    auto write = [&](int e, float v) {
        const int o = first + e / DIRECT_ROW, t = e % DIRECT_ROW;
        if (t < DIRECT_MAX_TAPS) dw[o * DIRECT_MAX_TAPS + t] = v;
        else db[o] = v;
    };
    const int warp_first = (threadIdx.x / 32) * DIRECT_SHARE;  // the warp's share among the block's
    const long long slot = (long long)out_c * (DIRECT_MAX_TAPS + 1);
    SIMT_UNROLL
    for (int h = 0; h < 2; ++h) {
        const int j = 2 * lane + h, e = warp_first + j;
        const long long at = j < DIRECT_SHARE ? place(e) : -1;
        if (at < 0) continue;
        if (splits == 1) write(e, acc[h] - carry[h]);
        else scratch[s * slot + at] = acc[h] - carry[h];
    }
    if (splits == 1) return;
    const int elems = (blockDim.x / 32) * DIRECT_SHARE;
    split_reduce(counters, blockIdx.y, s, splits, [&](int first_slot, int count, int into) {
        split_sum_each<4>(scratch, slot, first_slot, count, (int)threadIdx.x, elems, (int)blockDim.x, place,
                          [&](int e, float sum) {
                              if (into >= 0) scratch[into * slot + place(e)] = sum;
                              else write(e, sum);
                          });
    });
}

NANODDP_ENTRY_EACH_TYPE(conv_direct_relu_pool_filter, (256, 2),
    (const T* __restrict__ x, const T* __restrict__ y_or_null, const T* __restrict__ w_or_null,
     const float* __restrict__ bias_or_null, const T* __restrict__ d_pooled, float* __restrict__ dw,
     float* __restrict__ db, float* __restrict__ scratch, int* __restrict__ counters, int batch, int in_c, int in_h,
     int in_w, int out_c, int k_h, int k_w, int stride, int pad, int out_h, int out_w, int band_rows),
    (x, y_or_null, w_or_null, bias_or_null, d_pooled, dw, db, scratch, counters, batch, in_c, in_h, in_w, out_c, k_h,
     k_w, stride, pad, out_h, out_w, band_rows))
