// conv.cu — 2-D convolution (cross-correlation, as in every DL framework), NCHW, as
// implicit GEMMs with register tiles.
//
//   y[n][o][p][q] = epilogue(bias[o] + Σ_c Σ_i Σ_j x[n][c][p·s - pad + i][q·s - pad + j] · w[o][c][i][j])
//   x: batch x C x H x W, w: O x C x KH x KW, y: batch x O x P x Q, P = (H + 2·pad - KH) / s + 1,
//   Q likewise; taps off the input read zero. K = C·KH·KW.
//
// Each pass is a matrix product whose operands are gathered as they are staged in shared
// memory (no im2col buffer in memory):
//   forward:         Y[o][(n,p,q)] = Σ_k W[o][k] · X̂[k][(n,p,q)]; M = O, N = batch·P·Q (with a
//                    2x2 pool after it, only the pixels its windows read)
//   input gradient:  where planes fit shared memory (conv_backward_input_planes), for a group
//                    of G channels D[(c,i,j)][(n,p,q)] = Σ_o W[o][(c,i,j)] · dY[o][(n,p,q)], then
//                    each dX pixel adds the taps that came from it (col2im in shared memory);
//                    else dX[c][(n,h,w)] = Σ_(o,i,j) W[o][c][i][j] · dŶ[(o,i,j)][(n,h,w)], dŶ
//                    being dy at the pixel whose window put tap (i, j) on (h, w), else 0
//   filter gradient: dW[o][k] = Σ_(n,p,q) dY[o][(n,p,q)] · X̂[k][(n,p,q)], over slices of the
//                    pixels (below); db[o] = Σ dY[o][:] from the same loads of dY.
//
// The tile: a block computes BM x BN of the product, 16 reduction steps at a time, both
// operands' slices staged in shared memory (converted to float as they load); each thread
// owns TM x TN outputs at contiguous rows and columns, so a step's operands come in one vector
// load each (2 shared loads for TM·TN FMAs; A's broadcast, B's fill 128-byte phases). The
// next slice's global loads go out before this slice's products. Positions ((c, i, j) of a
// tap, (n, p, q) of a pixel) advance with the reduction by carries, not divisions.
// Configurations (the launcher picks by shape): 64x64, 4x4 a thread, 256 threads for M > 32;
// 32x128, 4x4, 256 threads for M ≤ 32; 32x16, 2x2, 128 threads for a filter gradient with
// K ≤ 16 (conv1-like); 128x64, 8x4, 256 threads for the input gradient by planes.
// Tensor cores (f16 and bf16, bf16 from sm_80; every pass but the implicit-GEMM input
// gradient): the slices staged as stored, 16-bit, and each warp's corner of the tile
// multiplied by wmma 16x16x16 into f32 fragments (the filter gradient a fresh fragment a
// slice, added through Kahan carries); sums return through shared memory to the epilogue.
//
// Work at LeNet's conv2 (batch 256; O 50, C 20, 5x5 on 13x13 -> 9x9, pooled from its top-left
// 8x8): 0.82 GFLOP a pass over the 64 pixels the pool reads, 7.7 MB compulsory, ~110 FLOP/B:
// compute-bound on an H100 (ridge ~20 FLOP/B). Tiles pad M (50 of 64 rows); a warp whose rows
// all lie in the padding stages but does not multiply. Measured on an H100 (ncu
// --clock-control none, fp32, one training step): forward with bias, ReLU and pool 48 µs
// (17.0 TFLOP/s useful, 25% of the 67 TFLOP/s fp32 FMA rate), input gradient by planes 59 µs
// (21%), filter and bias gradients through the pool 96 µs (13%). conv1 (one channel, 3x3)
// runs in conv_direct.cu.
//
// Summation: the forward and input-gradient dot products blocked (each 16-step slice into
// fresh registers, added to the total once); the filter and bias gradients, batch·P·Q terms
// (173,056 for conv1), blocked and compensated (Kahan over the slices), so an element's error
// stays near 16 additions' however long the reduction. The filter gradient's split: S slices
// of the pixels, S a function of the shape only (enough blocks for an H100, never the GPU's
// own size); each block's partial tile goes to `scratch`, and the last blocks to finish add
// the partials in slice order, compensated, in two levels (split_sum.cuh): the same bits on
// every run and GPU. conv2d_backward_bias: db[o] = Σ dy[:, o] (the linear layers' too), a
// block per channel, a compensated sum per thread, then a fixed tree.
#include "simt.cuh"
#include "split_sum.cuh"

#define CONV_BK 16          // reduction steps staged per pass
#define CONV_THREADS 256    // conv2d_backward_bias's block

// The reduction index's part of every gathered address, per 16-step slice: one entry per
// step, computed by 16 threads (divisions allowed: 16 per slice per block), double-buffered
// so that the next slice's entries are written while this slice's loads read theirs. An
// entry is (offset into B, row, column, offset into A, offset into the pooled gradient); the
// row is OFF_PLANE and the A offset -1 where the index is past the reduction's end, so every
// bounds test fails.
#define OFF_PLANE (1 << 29)

struct Tap {
    int b, row, col, a, pooled;
};
__device__ __forceinline__ Tap tap(int b, int row, int col, int a, int pooled) {
    Tap t;
    t.b = b;
    t.row = row;
    t.col = col;
    t.a = a;
    t.pooled = pooled;
    return t;
}
__device__ __forceinline__ Tap no_tap() { return tap(0, OFF_PLANE, 0, -1, -1); }

// Four times the convolution's output gradient at a pixel of a window of the 2x2, stride-2
// average pool that follows its ReLU: d_pooled of the window where the ReLU passed (y > 0),
// else 0. Exact in T, so it can be staged as T for tensor cores; the pool's 1/4 (a power of
// two: exact) is applied to what is summed from it (POOL_SCALE).
template <class T>
__device__ __forceinline__ float through_pool(const T* __restrict__ d_pooled, const T* __restrict__ y, int y_at,
                                              int pooled_at) {
    const float d = (float)d_pooled[pooled_at];  // both loads in flight at once
    return (float)y[y_at] > 0.0f ? d : 0.0f;
}
#define POOL_SCALE 0.25f

template <int BM_, int BN_, int TM_, int TN_>
struct Tile {
    static constexpr int BM = BM_, BN = BN_, TM = TM_, TN = TN_;
    static constexpr int TY = BM / TM, TX = BN / TN, THREADS = TX * TY;
    // A staged A row's stride: a multiple of 4 floats (vector loads), 4 past BM so that a
    // store's 16 lanes spread over 8 banks (2-way), not one.
    static constexpr int AS = BM + 4;
    // Loads per slice: A by rows (lane % BK the step: weights are contiguous along it), B by
    // columns (lane % BN the column: pixels are contiguous along it).
    static constexpr int A_ROWS = THREADS / CONV_BK, A_PER = BM / A_ROWS;
    static constexpr int B_ROWS = THREADS / BN, B_PER = CONV_BK / B_ROWS;
};

// N consecutive floats from 4N-byte-aligned shared memory (16-byte aligned for 8), in one
// vector load (two for 8).
template <int N>
__device__ __forceinline__ void load_vector(const float* __restrict__ p, float (&out)[N]) {
    static_assert(N == 2 || N == 4 || N == 8, "vector loads of 2, 4 or 8 floats");
    if constexpr (N == 8) {
        const float4 u = *reinterpret_cast<const float4*>(p), v = *reinterpret_cast<const float4*>(p + 4);
        out[0] = u.x, out[1] = u.y, out[2] = u.z, out[3] = u.w;
        out[4] = v.x, out[5] = v.y, out[6] = v.z, out[7] = v.w;
    } else if constexpr (N == 4) {
        const float4 v = *reinterpret_cast<const float4*>(p);
        out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
    } else {
        const float2 v = *reinterpret_cast<const float2*>(p);
        out[0] = v.x, out[1] = v.y;
    }
}

// acc[i][j] += Σ_k as[k][ty·TM + i] · bs[k][tx·TN + j] over the first `steps` steps of one
// staged slice (CONV_BK but in a reduction's last, shorter slice: a constant where inlined,
// so a full slice tests nothing), the slice's products summed into fresh registers first
// (blocked summation); COMPENSATED adds them to acc through a Kahan sum (carry).
template <class Cfg, bool COMPENSATED>
__device__ __forceinline__ void multiply_slice(const float (*as)[Cfg::AS], const float (*bs)[Cfg::BN],
                                               float (&acc)[Cfg::TM][Cfg::TN], float (&carry)[Cfg::TM][Cfg::TN],
                                               int ty, int tx, int steps) {
    float part[Cfg::TM][Cfg::TN];
    for (int i = 0; i < Cfg::TM; ++i)
        for (int j = 0; j < Cfg::TN; ++j) part[i][j] = 0.0f;
    for (int k = 0; k < CONV_BK; ++k) {
        if (k >= steps) break;
        float a[Cfg::TM], b[Cfg::TN];
        load_vector<Cfg::TM>(&as[k][ty * Cfg::TM], a);
        load_vector<Cfg::TN>(&bs[k][tx * Cfg::TN], b);
        for (int i = 0; i < Cfg::TM; ++i)
            for (int j = 0; j < Cfg::TN; ++j) part[i][j] = fmaf(a[i], b[j], part[i][j]);
    }
    for (int i = 0; i < Cfg::TM; ++i)
        for (int j = 0; j < Cfg::TN; ++j) {
            if (COMPENSATED) {
                const float y = part[i][j] - carry[i][j];
                const float t = acc[i][j] + y;
                carry[i][j] = (t - acc[i][j]) - y;
                acc[i][j] = t;
            } else {
                acc[i][j] += part[i][j];
            }
        }
}

// Whether a product staged as TS runs on tensor cores: f32 on CUDA cores, the 16-bit types
// (the forward's operands, staged as they are stored) by wmma with f32 accumulation.
template <class TS>
struct OnTensorCores {
    static constexpr bool value = true;
};
template <>
struct OnTensorCores<float> {
    static constexpr bool value = false;
};

// How a Cfg tile's warps share it on tensor cores: BN / 32 warps to a row of corners, each
// corner FM 16-row fragments by two 16-column ones (64x64 and 32x128: 16 x 32; 128x64: 32 x 32).
template <class Cfg>
struct WarpTile {
    static constexpr int WARPS_N = Cfg::BN >= 32 ? Cfg::BN / 32 : 1;
    static constexpr int WARPS_M = Cfg::THREADS >= 32 * WARPS_N ? Cfg::THREADS / 32 / WARPS_N : 1;
    static constexpr int FM = Cfg::BM >= 16 * WARPS_M ? Cfg::BM / 16 / WARPS_M : 1;
    // Whether the warps cover the tile exactly so (not the 32x16 filter tile's four warps).
    static constexpr bool fits =
        FM * 16 * WARPS_M == Cfg::BM && WARPS_N * 32 == Cfg::BN && WARPS_M * WARPS_N * 32 == Cfg::THREADS;
};

// The first row and column of this warp's corner.
template <class Cfg>
__device__ __forceinline__ int2 warp_corner() {
    using W = WarpTile<Cfg>;
    static_assert(W::fits, "the warps tile the block in corners of 16·FM x 32");
    const int warp = threadIdx.x / 32;
    return make_int2(warp / W::WARPS_N * 16 * W::FM, warp % W::WARPS_N * 32);
}

// A warp's share of a tile's sums on tensor cores: its corner's fragments, f[row][column].
template <class Cfg>
struct ConvSums {
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> f[WarpTile<Cfg>::FM][2];
};

// sums (the warp's corner) += the slice's product on tensor cores: A staged k-major
// (as[k][m], a column-major fragment), B row-major (bs[k][n]); every step of the slice is
// multiplied (past the reduction's end the staged operands are zeros). COMPENSATED: the
// slice's product into fresh fragments first, then added to sums through a Kahan carry,
// element by element (accumulator fragments of one shape share their layout).
template <class Cfg, bool COMPENSATED, int AS, int BS, class TS>
__device__ __forceinline__ void mma_slice(const TS (*as)[AS], const TS (*bs)[BS], ConvSums<Cfg>& sums,
                                          ConvSums<Cfg>& carries) {
    using namespace nvcuda;
    const int2 corner = warp_corner<Cfg>();
    const int wm = corner.x, wn = corner.y;
    constexpr int FM = WarpTile<Cfg>::FM;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, TS, wmma::col_major> a[FM];
    SIMT_UNROLL
    for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(a[i], &as[0][wm + 16 * i], AS);
    SIMT_UNROLL
    for (int j = 0; j < 2; ++j) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, TS, wmma::row_major> b;
        wmma::load_matrix_sync(b, &bs[0][wn + 16 * j], BS);
        SIMT_UNROLL
        for (int i = 0; i < FM; ++i) {
            auto& sum = sums.f[i][j];
            if constexpr (COMPENSATED) {
                auto& carry = carries.f[i][j];
                wmma::fragment<wmma::accumulator, 16, 16, 16, float> part;
                wmma::fill_fragment(part, 0.0f);
                wmma::mma_sync(part, a[i], b, part);
                SIMT_UNROLL
                for (int e = 0; e < part.num_elements; ++e) {
                    const float y = part.x[e] - carry.x[e];
                    const float t = sum.x[e] + y;
                    carry.x[e] = (t - sum.x[e]) - y;
                    sum.x[e] = t;
                }
            } else {
                wmma::mma_sync(sum, a[i], b, sum);
            }
        }
    }
}

// The product's main loop over the reduction range [begin, end), 16 steps a slice, for the
// tile at row m0 of a product of `rows` rows (M): entry(k) gives step k's table entry
// (OFF_PLANE row past end); load_a(m, r, e) the A element of tile row m (this thread's r-th
// A row) at the step of entry e; load_b(e) this thread's B column at the step of entry e,
// each called once per slice, slices in order (loads only: whatever else a loaded A value
// feeds goes in stage_a(m, r, e, value), called, slices in order, when the value is stored
// to shared memory). Leaves the TM x TN sums in acc (minus
// carry when COMPENSATED). Staged as TS: float, multiplied on CUDA cores (multiply_slice), or
// a 16-bit type on tensor cores (mma_slice: the warp's sums are left in `sums`, their carries
// folded in; gathered_product then moves them through shared memory into acc, carry zero).
// Pipelined: the next slice's global loads are issued into registers before this slice's
// products, and stored to shared memory after them, so their latency hides behind the FMAs.
struct NoStage {
    __device__ __forceinline__ void operator()(int, int, Tap, float) const {}
};
template <class Cfg, bool COMPENSATED, class TS, class Entry, class LoadA, class LoadB, class StageA>
__device__ __forceinline__ void gathered_sums(int begin, int end, int m0, int rows, Entry entry, LoadA load_a,
                                              LoadB load_b,
                                              float (&acc)[Cfg::TM][Cfg::TN], float (&carry)[Cfg::TM][Cfg::TN],
                                              StageA stage_a, ConvSums<Cfg>& sums) {
    constexpr bool TC = OnTensorCores<TS>::value;
    // The staged rows: A's Cfg::AS floats and B's BN; for wmma 8 16-bit values past BM and BN
    // (a multiple of 8, wmma's ldm, whose 16-byte offset per row spreads the banks).
    constexpr int AS = TC ? Cfg::BM + 8 : Cfg::AS, BS = TC ? Cfg::BN + 8 : Cfg::BN;
    __shared__ __align__(32) TS as[CONV_BK][AS];
    __shared__ __align__(32) TS bs[CONV_BK][BS];
    __shared__ Tap table[2][CONV_BK];
    ConvSums<Cfg> carries;  // tensor cores, COMPENSATED only
    if constexpr (TC)
        for (int i = 0; i < WarpTile<Cfg>::FM; ++i)
            for (int j = 0; j < 2; ++j) {
                nvcuda::wmma::fill_fragment(sums.f[i][j], 0.0f);
                nvcuda::wmma::fill_fragment(carries.f[i][j], 0.0f);
            }
    const int tid = threadIdx.x, tx = tid % Cfg::TX, ty = tid / Cfg::TX;
    const int a_k = tid % CONV_BK, a_m = tid / CONV_BK;
    const int b_col = tid % Cfg::BN, b_row = tid / Cfg::BN;
    for (int i = 0; i < Cfg::TM; ++i)
        for (int j = 0; j < Cfg::TN; ++j) acc[i][j] = carry[i][j] = 0.0f;
    float ra[Cfg::A_PER], rb[Cfg::B_PER];  // the next slice's operands, on their way
    auto fetch = [&](int t) {
        const Tap ea = table[t][a_k];
        SIMT_UNROLL
        for (int r = 0; r < Cfg::A_PER; ++r) ra[r] = load_a(m0 + a_m + Cfg::A_ROWS * r, r, ea);
        SIMT_UNROLL
        for (int r = 0; r < Cfg::B_PER; ++r) rb[r] = load_b(table[t][b_row + Cfg::B_ROWS * r]);
    };
    // On CUDA cores a warp whose tile rows all lie at or past `rows` (the tile's padding:
    // LeNet's conv2 has 50 output channels in a 64-row tile) stages its share but multiplies
    // nothing. (On tensor cores the test cost more than it saved: no LeNet tile has such a
    // warp there.)
    const bool busy = TC || m0 + tid / 32 * 32 / Cfg::TX * Cfg::TM < rows;
    if (begin >= end) return;
    if (tid < CONV_BK) table[0][tid] = entry(begin + tid);
    __syncthreads();
    fetch(0);
    if (tid < CONV_BK) table[1][tid] = entry(begin + CONV_BK + tid);
    int now = 0;
    for (int k0 = begin; k0 < end; k0 += CONV_BK) {
        const Tap ea = table[now][a_k];
        SIMT_UNROLL
        for (int r = 0; r < Cfg::A_PER; ++r) {
            as[a_k][a_m + Cfg::A_ROWS * r] = (TS)ra[r];  // exact: ra came from TS
            stage_a(m0 + a_m + Cfg::A_ROWS * r, r, ea, ra[r]);
        }
        SIMT_UNROLL
        for (int r = 0; r < Cfg::B_PER; ++r) bs[b_row + Cfg::B_ROWS * r][b_col] = (TS)rb[r];
        __syncthreads();  // the slice staged; table[now ^ 1] (the next slice's entries) written
        if (k0 + CONV_BK < end) fetch(now ^ 1);
        if (busy) {
            if constexpr (TC)
                mma_slice<Cfg, COMPENSATED, AS, BS>(as, bs, sums, carries);
            else if (k0 + CONV_BK < end)
                multiply_slice<Cfg, COMPENSATED>(as, bs, acc, carry, ty, tx, CONV_BK);
            else  // the last slice: its steps past the end would multiply zeros
                multiply_slice<Cfg, COMPENSATED>(as, bs, acc, carry, ty, tx, end - k0);
        }
        __syncthreads();  // the slice and table[now] read by every thread
        if (tid < CONV_BK) table[now][tid] = entry(k0 + 2 * CONV_BK + tid);
        now ^= 1;
    }
    if constexpr (TC && COMPENSATED)  // the carries folded into the sums
        for (int i = 0; i < WarpTile<Cfg>::FM; ++i)
            for (int j = 0; j < 2; ++j)
                SIMT_UNROLL
                for (int e = 0; e < sums.f[i][j].num_elements; ++e) sums.f[i][j].x[e] -= carries.f[i][j].x[e];
}

// gathered_sums, then on tensor cores the warps' fragments through shared memory into each
// thread's acc (carry zero).
template <class Cfg, bool COMPENSATED, class TS = float, class Entry, class LoadA, class LoadB,
          class StageA = NoStage>
__device__ __forceinline__ void gathered_product(int begin, int end, int m0, int rows, Entry entry, LoadA load_a,
                                                 LoadB load_b, float (&acc)[Cfg::TM][Cfg::TN],
                                                 float (&carry)[Cfg::TM][Cfg::TN], StageA stage_a = StageA()) {
    ConvSums<Cfg> sums;  // tensor cores only
    gathered_sums<Cfg, COMPENSATED, TS>(begin, end, m0, rows, entry, load_a, load_b, acc, carry, stage_a, sums);
    if constexpr (OnTensorCores<TS>::value) {
        if (begin >= end) return;
        constexpr int LDC = Cfg::BN + 4;  // floats: a multiple of 4 (wmma's ldm)
        __shared__ __align__(32) float cs[Cfg::BM][LDC];
        const int2 corner = warp_corner<Cfg>();
        SIMT_UNROLL
        for (int i = 0; i < WarpTile<Cfg>::FM; ++i)
            SIMT_UNROLL
            for (int j = 0; j < 2; ++j)
                nvcuda::wmma::store_matrix_sync(&cs[corner.x + 16 * i][corner.y + 16 * j], sums.f[i][j], LDC,
                                                nvcuda::wmma::mem_row_major);
        __syncthreads();
        const int ty = threadIdx.x / Cfg::TX, tx = threadIdx.x % Cfg::TX;
        SIMT_UNROLL
        for (int i = 0; i < Cfg::TM; ++i)
            SIMT_UNROLL
            for (int j = 0; j < Cfg::TN; ++j) acc[i][j] = cs[ty * Cfg::TM + i][tx * Cfg::TN + j];
    }
}

// ---------------------------------------------------------------- forward
// The output pixel (p, q) of column `idx` of an image's columns. Plain order: row-major,
// P·Q columns. Pooled order (a 2x2, stride-2 average pool fused into the epilogue): the pool's
// windows, four consecutive columns each (so the one thread holding them adds them in
// registers), and only those: the pixels no window reads (the last row and column of an odd
// plane) are neither computed nor written, as neither the pool nor the backward through it
// reads them.
__device__ __forceinline__ int2 pixel_of(int idx, int out_w, bool pooled) {
    if (!pooled) {
        const int p = idx / out_w;
        return make_int2(p, idx - p * out_w);
    }
    const int pw = out_w / 2, win = idx >> 2, e = idx & 3, wh = win / pw;
    return make_int2(2 * wh + (e >> 1), 2 * (win - wh * pw) + (e & 1));
}

// Columns per image: P·Q, or in pooled order 4 a window.
__device__ __forceinline__ int image_columns(int out_h, int out_w, bool pooled) {
    return pooled ? 4 * (out_h / 2) * (out_w / 2) : out_h * out_w;
}

// The type the forward and the filter gradient stage their operands in: the 16-bit types as
// they are, for tensor cores; f32 as it is, for CUDA cores. bf16 below sm_80 (Turing's
// tensor cores lack it) takes CUDA cores, staged as f32: other bits than on sm_80 and later.
template <class T>
struct ConvStagedOf {
    using type = T;
};
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
template <>
struct ConvStagedOf<__nv_bfloat16> {
    using type = float;
};
#endif
// That type for a tile whose warps cover it in corners (WarpTile); float for one they do not
// (the 32x16 filter-gradient tile).
template <class T, class Cfg, bool CORNERS = WarpTile<Cfg>::fits>
struct ConvStagedFor {
    using type = typename ConvStagedOf<T>::type;
};
template <class T, class Cfg>
struct ConvStagedFor<T, Cfg, false> {
    using type = float;
};
template <class T, class Cfg>
using ConvStaged = typename ConvStagedFor<T, Cfg>::type;

// Grid (ceil(batch·columns / BN), ceil(O / BM)). A = w[o][k] (rows of the filter), B = x̂[k][(n,p,q)]:
// entry(k = (c, i, j)) = (c·H·W + i·W + j, i, j, k); each thread's B column is one output pixel.
// With `pooled_or_null` the columns are in pooled order and the epilogue also writes the 2x2
// average of each window of ReLU outputs (from the f32 values, before rounding to T).
template <class T, class Cfg>
__device__ __forceinline__ void conv_forward(const T* __restrict__ x, const T* __restrict__ w,
                                             const float* __restrict__ bias, T* __restrict__ y,
                                             T* __restrict__ pooled, int batch, int in_c, int in_h, int in_w,
                                             int out_c, int k_h, int k_w, int stride, int pad, int out_h, int out_w,
                                             int relu) {
    const int m0 = blockIdx.y * Cfg::BM, n0 = blockIdx.x * Cfg::BN;
    const bool pool = pooled != nullptr;
    const int pixels = out_h * out_w, span = image_columns(out_h, out_w, pool), cols = batch * span;
    const int window = k_h * k_w, depth = in_c * window;
    const int col = n0 + (int)threadIdx.x % Cfg::BN;
    int x_col = 0, ih0 = OFF_PLANE, iw0 = 0;
    if (col < cols) {
        const int img = col / span;
        const int2 pq = pixel_of(col - img * span, out_w, pool);
        ih0 = pq.x * stride - pad;
        iw0 = pq.y * stride - pad;
        x_col = img * in_c * in_h * in_w + ih0 * in_w + iw0;
    }
    auto entry = [&](int k) {
        if (k >= depth) return no_tap();
        const int c = k / window, ij = k - c * window, i = ij / k_w, j = ij - i * k_w;
        return tap(c * in_h * in_w + i * in_w + j, i, j, k, 0);
    };
    auto load_a = [&](int m, int, Tap e) {
        return (e.a >= 0 && m < out_c) ? (float)w[m * depth + e.a] : 0.0f;
    };
    auto load_b = [&](Tap e) {
        const int ih = ih0 + e.row, iw = iw0 + e.col;
        return ((unsigned)ih < (unsigned)in_h && (unsigned)iw < (unsigned)in_w) ? (float)x[x_col + e.b] : 0.0f;
    };
    float acc[Cfg::TM][Cfg::TN], carry[Cfg::TM][Cfg::TN];
    gathered_product<Cfg, false, ConvStaged<T, Cfg>>(0, depth, m0, out_c, entry, load_a, load_b, acc, carry);
    const int tx = threadIdx.x % Cfg::TX, ty = threadIdx.x / Cfg::TX;
    const int ph = out_h / 2, pw = out_w / 2;
    static_assert(Cfg::TN == 4, "pooled order: a thread's four columns are one window");
    // The thread's columns: a multiple of 4 first, so in pooled order (4 columns a window, a
    // multiple of 4 an image) one window; in plain order they may span two images.
    const int c0 = n0 + tx * Cfg::TN;
    int at[Cfg::TN];  // each column's offset in y past its channel's plane, or -1
    SIMT_UNROLL
    for (int j = 0; j < Cfg::TN; ++j) {
        const int c = c0 + j;
        at[j] = -1;
        if (c < cols) {
            const int n = c / span;
            const int2 pq = pixel_of(c - n * span, out_w, pool);
            at[j] = n * out_c * pixels + pq.x * out_w + pq.y;
        }
    }
    const bool in_window = pool && c0 < cols;
    const int img = in_window ? c0 / span : 0, idx0 = c0 - img * span;
    SIMT_UNROLL
    for (int i = 0; i < Cfg::TM; ++i) {
        const int o = m0 + ty * Cfg::TM + i;
        if (o >= out_c) continue;
        float v[Cfg::TN];
        SIMT_UNROLL
        for (int j = 0; j < Cfg::TN; ++j) {
            v[j] = acc[i][j];
            if (bias) v[j] += bias[o];
            if (relu) v[j] = fmaxf(v[j], 0.0f);
            if (at[j] >= 0) y[at[j] + o * pixels] = (T)v[j];
        }
        // The window's four values, added as (v0 + v1) + (v2 + v3).
        if (in_window)
            pooled[(img * out_c + o) * ph * pw + (idx0 >> 2)] = (T)(((v[0] + v[1]) + (v[2] + v[3])) * 0.25f);
    }
}

// ---------------------------------------------------------------- input gradient
// Grid (ceil(batch·H·W / BN), ceil(C / BM)). The reduction runs over (o, i, j): A =
// w[o][c][i][j] as [c][(o,i,j)], B = dy at the output pixel (p, q) with p·s = h + pad - i,
// q·s = w + pad - j (zero where that is no pixel): entry = (o·P·Q, i, j, o·C·KH·KW + i·KW + j).
// (Each dy element is read by KH·KW columns: where a pool follows, the filter gradient's pass
// writes the output gradient it computes through the pool once, for this one to read.)
template <class T, class Cfg>
__device__ __forceinline__ void conv_backward_input(const T* __restrict__ dy, const T* __restrict__ w,
                                                    T* __restrict__ dx, int batch, int in_c, int in_h, int in_w,
                                                    int out_c, int k_h, int k_w, int stride, int pad, int out_h,
                                                    int out_w) {
    const int m0 = blockIdx.y * Cfg::BM, n0 = blockIdx.x * Cfg::BN;
    const int plane = in_h * in_w, cols = batch * plane, window = k_h * k_w, depth = out_c * window;
    const int out_plane = out_h * out_w;
    const int col = n0 + (int)threadIdx.x % Cfg::BN;
    const bool col_ok = col < cols;
    int dy_img = 0, hp = -OFF_PLANE, wp = 0;  // (h + pad, w + pad); off every plane when no column
    if (col_ok) {
        const int img = col / plane, hw = col - img * plane, h = hw / in_w;
        hp = h + pad;
        wp = hw - h * in_w + pad;
        dy_img = img * out_c * out_plane;
    }
    auto entry = [&](int k) {
        if (k >= depth) return no_tap();
        const int o = k / window, ij = k - o * window, i = ij / k_w;
        return tap(o * out_plane, i, ij - i * k_w, o * in_c * window + ij, 0);
    };
    auto load_a = [&](int c, int, Tap e) {
        return (e.a >= 0 && c < in_c) ? (float)w[e.a + c * window] : 0.0f;
    };
    auto load_b = [&](Tap e) {
        int p = hp - e.row, q = wp - e.col;
        if (stride != 1) {  // uniform: no divisions at stride 1
            if (p % stride != 0 || q % stride != 0) return 0.0f;
            p /= stride;
            q /= stride;
        }
        return ((unsigned)p < (unsigned)out_h && (unsigned)q < (unsigned)out_w) ? (float)dy[dy_img + e.b + p * out_w + q]
                                                                                : 0.0f;
    };
    float acc[Cfg::TM][Cfg::TN], carry[Cfg::TM][Cfg::TN];
    gathered_product<Cfg, false>(0, depth, m0, in_c, entry, load_a, load_b, acc, carry);
    const int tx = threadIdx.x % Cfg::TX, ty = threadIdx.x / Cfg::TX;
    for (int j = 0; j < Cfg::TN; ++j) {
        const int cl = n0 + tx * Cfg::TN + j;
        if (cl >= cols) continue;
        const int n = cl / plane, hw = cl - n * plane;
        for (int i = 0; i < Cfg::TM; ++i) {
            const int c = m0 + ty * Cfg::TM + i;
            if (c < in_c) dx[(n * in_c + c) * plane + hw] = (T)acc[i][j];
        }
    }
}

// ---------------------------------------------------------------- input gradient by planes
// dx = col2im(Wᵀ · dy), one image and one group of input channels a block, grid (⌈C / G⌉,
// batch): first the product D[(c,i,j)][(p,q)] = Σ_o w[o][c][i][j] · dy[n][o][p][q] for the
// group's G·KH·KW filter taps (rows, at most BM) and the output pixels of the region p <
// region_h, q < region_w (where dy may be nonzero: the pool's windows when a 2x2 pool
// follows, else the plane), BN pixels at a time, into shared memory (`planes`, the host
// sizes it); then each dx element of the group as the sum, taps (i, j) ascending, of D at the
// pixel each tap came from. Every product is one that lands on the plane: the implicit GEMM
// above also multiplies the taps that fall off it (52% of them at LeNet's conv2), and writes
// no element twice, so no atomics. A: w[o][(c,i,j)], contiguous along the group's rows; B:
// dy's planes, contiguous along the pixels.
template <class T, class Cfg>
__device__ __forceinline__ void conv_backward_input_planes(const T* __restrict__ dy, const T* __restrict__ w,
                                                           T* __restrict__ dx, int in_c, int in_h, int in_w,
                                                           int out_c, int k_h, int k_w, int stride, int pad,
                                                           int out_h, int out_w, int region_h, int region_w,
                                                           int group) {
    SIMT_DYNAMIC_SHARED(float4, planes4);  // float4: 16-byte aligned for the vector stores
    float* __restrict__ planes = reinterpret_cast<float*>(planes4);  // [nc·KH·KW][region_h·region_w]
    const int n = blockIdx.y, c0 = blockIdx.x * group, nc = min(group, in_c - c0);
    const int window = k_h * k_w, rows = nc * window, depth = in_c * window;
    const int out_plane = out_h * out_w, region = region_h * region_w;
    const T* __restrict__ dy_img = dy + (long long)n * out_c * out_plane;
    using TS = ConvStaged<T, Cfg>;
    auto entry = [&](int o) { return o < out_c ? tap(o * out_plane, 0, 0, o * depth + c0 * window, 0) : no_tap(); };
    auto load_a = [&](int m, int, Tap e) { return (e.a >= 0 && m < rows) ? (float)w[e.a + m] : 0.0f; };
    const int tx = threadIdx.x % Cfg::TX, ty = threadIdx.x / Cfg::TX;
    for (int col0 = 0; col0 < region; col0 += Cfg::BN) {
        const int col = col0 + (int)threadIdx.x % Cfg::BN;
        int at = -1;  // this thread's B column: its pixel's offset in a plane of dy, or none
        if (col < region) {
            const int p = col / region_w;
            at = p * out_w + col - p * region_w;
        }
        auto load_b = [&](Tap e) { return (e.a >= 0 && at >= 0) ? (float)dy_img[e.b + at] : 0.0f; };
        float acc[Cfg::TM][Cfg::TN], carry[Cfg::TM][Cfg::TN];
        ConvSums<Cfg> sums;  // tensor cores only
        gathered_sums<Cfg, false, TS>(0, out_c, 0, rows, entry, load_a, load_b, acc, carry, NoStage(), sums);
        if constexpr (OnTensorCores<TS>::value) {
            // Each warp's fragments into the planes through a 16 x 16 tile of its own (the
            // corner's rows past the group's taps and columns past the region dropped).
            __shared__ __align__(32) float frag[Cfg::THREADS / 32][16 * 16];
            float* __restrict__ mine = frag[threadIdx.x / 32];
            const int lane = threadIdx.x % 32;
            const int2 corner = warp_corner<Cfg>();
            SIMT_UNROLL
            for (int i = 0; i < WarpTile<Cfg>::FM; ++i)
                SIMT_UNROLL
                for (int j = 0; j < 2; ++j) {
                    nvcuda::wmma::store_matrix_sync(mine, sums.f[i][j], 16, nvcuda::wmma::mem_row_major);
                    __syncwarp();
                    for (int e = lane; e < 16 * 16; e += 32) {
                        const int m = corner.x + 16 * i + e / 16, c = col0 + corner.y + 16 * j + e % 16;
                        if (m < rows && c < region) planes[m * region + c] = mine[e];
                    }
                    __syncwarp();  // every lane has read the tile before the next overwrites it
                }
            continue;
        }
        static_assert(Cfg::TN == 4, "a thread's columns: one vector store");
        const int c = col0 + tx * Cfg::TN;
        SIMT_UNROLL
        for (int i = 0; i < Cfg::TM; ++i) {
            const int m = ty * Cfg::TM + i;
            if (m >= rows || c >= region) continue;
            float* __restrict__ at = planes + m * region + c;
            if (region % 4 == 0) {  // uniform; then every row and column group is 16-byte aligned
                *reinterpret_cast<float4*>(at) = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
            } else {
                SIMT_UNROLL
                for (int j = 0; j < Cfg::TN; ++j)
                    if (c + j < region) at[j] = acc[i][j];
            }
        }
    }
    __syncthreads();
    const int plane = in_h * in_w;
    for (int e = threadIdx.x; e < nc * plane; e += Cfg::THREADS) {
        const int cl = e / plane, hw = e - cl * plane, h = hw / in_w, x = hw - h * in_w;
        const float* __restrict__ taps = planes + cl * window * region;
        float sum = 0.0f;
        if (stride == 1) {  // the taps that land on the region: i and j in ranges, no tests
            const int i0 = max(0, h + pad - region_h + 1), i1 = min(k_h, h + pad + 1);
            const int j0 = max(0, x + pad - region_w + 1), j1 = min(k_w, x + pad + 1);
            for (int i = i0; i < i1; ++i) {
                // D[(i, j)][(h + pad - i, x + pad - j)]: one tap on is region - 1 floats on.
                const float* __restrict__ t = taps + (i * k_w + j0) * region + (h + pad - i) * region_w + x + pad - j0;
                for (int j = j0; j < j1; ++j, t += region - 1) sum += *t;
            }
        } else {
            for (int i = 0; i < k_h; ++i) {
                int p = h + pad - i;  // p·stride: decreasing with i
                if (p < 0) break;
                if (p % stride != 0) continue;
                p /= stride;
                if (p >= region_h) continue;
                for (int j = 0; j < k_w; ++j) {
                    int q = x + pad - j;
                    if (q < 0) break;
                    if (q % stride != 0) continue;
                    q /= stride;
                    if (q < region_w) sum += taps[(i * k_w + j) * region + p * region_w + q];
                }
            }
        }
        dx[((long long)n * in_c + c0 + cl) * plane + hw] = (T)sum;
    }
}

// ---------------------------------------------------------------- filter and bias gradients
// Grid (ceil(K / BN), ceil(O / BM), S). The reduction runs over the pixels r = (n, p, q) of
// a region of each plane, R = RH·RW of them: the plane, or with a pool the windows' pixels
// (p < 2·⌊P/2⌋, q < 2·⌊Q/2⌋: the output gradient is zero past them). Block (bx, by, s)
// reduces r in [s·per, min(batch·R, (s + 1)·per)), per = ceil(batch·R / S) rounded up to
// CONV_BK: A = dy[o][r], B = x̂[r][k], entry(r) = (n·C·H·W + (p·s - pad)·W + q·s - pad,
// p·s - pad, q·s - pad, n·O·P·Q + p·Q + q, the pixel's window in the pooled gradient, read
// only with a pool);
// each thread's B column is one filter tap (c, i, j). With `y_or_null`, `dy` is the gradient
// at a 2x2, stride-2 average pool of the ReLU output y, and A is the convolution's output
// gradient through both (through_pool), which `dy_out_or_null` receives at the windows'
// pixels (from the blocks of the first column of tiles: each element once; the rest of the
// plane is not written) for an input-gradient pass over that region to read.
// `scratch`: (S + ⌈S / ⌈√S⌉⌉)·(O·K + O) floats of partials, `counters` ⌈S / ⌈√S⌉⌉ + 1 ints
// per tile, zero between launches (split_sum.cuh). Neither is used when S = 1.
// `db_or_null`: no bias gradient when null.
template <class T, class Cfg>
__device__ __forceinline__ void conv_backward_filter(const T* __restrict__ x, const T* __restrict__ dy,
                                                     const T* __restrict__ y, T* __restrict__ dy_out,
                                                     float* __restrict__ dw,
                                                     float* __restrict__ db_or_null, float* __restrict__ scratch,
                                                     int* __restrict__ counters, int batch, int in_c, int in_h,
                                                     int in_w, int out_c, int k_h, int k_w, int stride, int pad,
                                                     int out_h, int out_w, int splits) {
    const int tid = threadIdx.x, tx = tid % Cfg::TX, ty = tid / Cfg::TX;
    const int m0 = blockIdx.y * Cfg::BM, n0 = blockIdx.x * Cfg::BN, s = blockIdx.z;
    const int pixels = out_h * out_w, window = k_h * k_w, depth = in_c * window;
    const int ph = out_h / 2, pw = out_w / 2;
    const int region_w = y ? 2 * pw : out_w, region = y ? 2 * ph * region_w : pixels;
    // Slice s: pixels [r0, r1) of the batch's regions, a multiple of CONV_BK each but the last.
    const int all = batch * region, per = ((all + splits - 1) / splits + CONV_BK - 1) / CONV_BK * CONV_BK;
    const int r0 = min(all, s * per), r1 = min(all, r0 + per);
    const bool with_bias = db_or_null != nullptr && blockIdx.x == 0;
    const int kc = n0 + tid % Cfg::BN;  // this thread's B column: filter tap (c, i, j)
    int x_tap = 0, ti = OFF_PLANE, tj = 0;
    if (kc < depth) {
        const int c = kc / window, ij = kc - c * window;
        ti = ij / k_w;
        tj = ij - ti * k_w;
        x_tap = c * in_h * in_w + ti * in_w + tj;
    }
    auto entry = [&](int r) {
        if (r >= r1) return no_tap();
        const int n = r / region, pq = r - n * region, p = pq / region_w, q = pq - p * region_w;
        const int ih0 = p * stride - pad, iw0 = q * stride - pad;
        const int window_at = n * out_c * ph * pw + (p >> 1) * pw + (q >> 1);  // read with y only
        return tap(n * in_c * in_h * in_w + ih0 * in_w + iw0, ih0, iw0, n * out_c * pixels + p * out_w + q, window_at);
    };
    float bias_acc[Cfg::A_PER], bias_carry[Cfg::A_PER];
    for (int r = 0; r < Cfg::A_PER; ++r) bias_acc[r] = bias_carry[r] = 0.0f;
    // A: dy, or through the pool 4·dy (exact in T), the sums scaled by 1/4 as they are written.
    const float scale = y ? POOL_SCALE : 1.0f;
    auto load_a = [&](int o, int, Tap e) {
        if (e.a < 0 || o >= out_c) return 0.0f;
        const int at = e.a + o * pixels;
        return y ? through_pool(dy, y, at, e.pooled + o * ph * pw) : (float)dy[at];
    };
    // What an A value feeds besides the product, once it has arrived: the output gradient
    // for the input gradient's pass, and these lanes' share of db (Kahan, a term at a time).
    auto stage_a = [&](int o, int r, Tap e, float v) {
        if (dy_out && blockIdx.x == 0 && e.a >= 0 && o < out_c) dy_out[e.a + o * pixels] = (T)(v * scale);
        if (with_bias) {
            const float yv = v - bias_carry[r];
            const float t = bias_acc[r] + yv;
            bias_carry[r] = (t - bias_acc[r]) - yv;
            bias_acc[r] = t;
        }
    };
    auto load_b = [&](Tap e) {
        const int ih = e.row + ti, iw = e.col + tj;
        return ((unsigned)ih < (unsigned)in_h && (unsigned)iw < (unsigned)in_w) ? (float)x[e.b + x_tap] : 0.0f;
    };
    float acc[Cfg::TM][Cfg::TN], carry[Cfg::TM][Cfg::TN];
    gathered_product<Cfg, true, ConvStaged<T, Cfg>>(r0, r1, m0, out_c, entry, load_a, load_b, acc, carry, stage_a);
    // The bias partials: the CONV_BK lanes sharing each row of A (consecutive lanes) added
    // by a fixed tree of shuffles.
    const int a_k = tid % CONV_BK, a_m = tid / CONV_BK;
    float bias_part[Cfg::A_PER];
    for (int r = 0; r < Cfg::A_PER; ++r) {
        float v = bias_acc[r] - bias_carry[r];
        for (int off = CONV_BK / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
        bias_part[r] = v * scale;
    }
    const int total = out_c * depth + out_c;
    float* slot = splits == 1 ? nullptr : scratch + (long long)s * total;
    // This block's partial tile: dw's elements, then (first column of tiles) db's.
    for (int i = 0; i < Cfg::TM; ++i) {
        const int o = m0 + ty * Cfg::TM + i;
        if (o >= out_c) continue;
        for (int j = 0; j < Cfg::TN; ++j) {
            const int k = n0 + tx * Cfg::TN + j;
            if (k >= depth) continue;
            const float v = (acc[i][j] - carry[i][j]) * scale;
            if (slot) slot[o * depth + k] = v;
            else dw[o * depth + k] = v;
        }
    }
    if (with_bias && a_k == 0)
        for (int r = 0; r < Cfg::A_PER; ++r) {
            const int o = m0 + a_m + Cfg::A_ROWS * r;
            if (o >= out_c) continue;
            if (slot) slot[out_c * depth + o] = bias_part[r];
            else db_or_null[o] = bias_part[r];
        }
    if (!slot) return;
    // The tile's partials added in slice order, in two levels (split_sum.cuh).
    split_reduce(counters, blockIdx.y * gridDim.x + blockIdx.x, s, splits, [&](int first, int n, int into) {
        auto place = [&](int e) -> long long {
            const int o = m0 + e / Cfg::BN, k = n0 + e % Cfg::BN;
            return o < out_c && k < depth ? o * depth + k : -1;
        };
        auto done = [&](int e, float v) {
            const int at = (m0 + e / Cfg::BN) * depth + n0 + e % Cfg::BN;
            if (into >= 0) scratch[(long long)into * total + at] = v;
            else dw[at] = v;
        };
        // Four elements' loads in flight at once; two in the 64-register 32x16 tile.
        split_sum_each<Cfg::THREADS >= 256 ? 4 : 2>(scratch, total, first, n, tid, Cfg::BM * Cfg::BN, Cfg::THREADS,
                                                   place, done);
        if (db_or_null && blockIdx.x == 0)
            for (int o = m0 + tid; o < min(out_c, m0 + Cfg::BM); o += Cfg::THREADS) {
                const float v = split_sum(scratch, out_c * depth + o, total, first, n);
                if (into >= 0) scratch[(long long)into * total + out_c * depth + o] = v;
                else db_or_null[o] = v;
            }
    });
}

// ---------------------------------------------------------------- bias gradient alone

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
    red[threadIdx.x] = acc.total();
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) db[o] = red[0];
}

// ---------------------------------------------------------------- entry points
// One per pass and tile configuration (name suffix: BM x BN), each for every storage type.
// (The declarations are written out: nanoddp's declaration parser reads them, not the
// preprocessor.)

using Tile64x64 = Tile<64, 64, 4, 4>;
using Tile32x128 = Tile<32, 128, 4, 4>;
using Tile32x16 = Tile<32, 16, 2, 2>;
using Tile128x64 = Tile<128, 64, 8, 4>;

#define CONV_FORWARD_PARAMS                                                                                   \
    (const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ bias_or_null, T* __restrict__ y, \
     T* __restrict__ pooled_or_null, int batch, int in_c, int in_h, int in_w, int out_c, int k_h, int k_w,     \
     int stride, int pad, int out_h, int out_w, int relu)
#define CONV_FORWARD_ARGS \
    (x, w, bias_or_null, y, pooled_or_null, batch, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w, relu)
#define CONV_INPUT_PARAMS                                                                                      \
    (const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx, int batch, int in_c, int in_h,     \
     int in_w, int out_c, int k_h, int k_w, int stride, int pad, int out_h, int out_w)
#define CONV_INPUT_ARGS (dy, w, dx, batch, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w)
#define CONV_FILTER_PARAMS                                                                                     \
    (const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ y_or_null,                         \
     T* __restrict__ dy_out_or_null, float* __restrict__ dw, float* __restrict__ db_or_null,                     \
     float* __restrict__ scratch, int* __restrict__ counters, int batch, int in_c, int in_h, int in_w,            \
     int out_c, int k_h, int k_w, int stride, int pad, int out_h, int out_w, int splits)
#define CONV_FILTER_ARGS                                                                                       \
    (x, dy, y_or_null, dy_out_or_null, dw, db_or_null, scratch, counters, batch, in_c, in_h, in_w, out_c, k_h, \
     k_w, stride, pad, out_h, out_w, splits)

template <class T> __device__ __forceinline__ void conv2d_forward_64x64 CONV_FORWARD_PARAMS {
    conv_forward<T, Tile64x64> CONV_FORWARD_ARGS;
}
template <class T> __device__ __forceinline__ void conv2d_forward_32x128 CONV_FORWARD_PARAMS {
    conv_forward<T, Tile32x128> CONV_FORWARD_ARGS;
}
template <class T> __device__ __forceinline__ void conv2d_backward_input_64x64 CONV_INPUT_PARAMS {
    conv_backward_input<T, Tile64x64> CONV_INPUT_ARGS;
}
template <class T> __device__ __forceinline__ void conv2d_backward_input_32x128 CONV_INPUT_PARAMS {
    conv_backward_input<T, Tile32x128> CONV_INPUT_ARGS;
}
template <class T>
__device__ __forceinline__ void conv2d_backward_input_planes(const T* __restrict__ dy, const T* __restrict__ w,
                                                             T* __restrict__ dx, int in_c, int in_h, int in_w,
                                                             int out_c, int k_h, int k_w, int stride, int pad,
                                                             int out_h, int out_w, int region_h, int region_w,
                                                             int group) {
    conv_backward_input_planes<T, Tile128x64>(dy, w, dx, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h,
                                              out_w, region_h, region_w, group);
}
template <class T> __device__ __forceinline__ void conv2d_backward_filter_64x64 CONV_FILTER_PARAMS {
    conv_backward_filter<T, Tile64x64> CONV_FILTER_ARGS;
}
template <class T> __device__ __forceinline__ void conv2d_backward_filter_32x16 CONV_FILTER_PARAMS {
    conv_backward_filter<T, Tile32x16> CONV_FILTER_ARGS;
}

NANODDP_ENTRY_EACH_TYPE(conv2d_forward_64x64, (256, 3),
    (const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ bias_or_null, T* __restrict__ y,
     T* __restrict__ pooled_or_null, int batch, int in_c, int in_h, int in_w, int out_c, int k_h, int k_w,
     int stride, int pad, int out_h, int out_w, int relu),
    (x, w, bias_or_null, y, pooled_or_null, batch, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w,
     relu))
NANODDP_ENTRY_EACH_TYPE(conv2d_forward_32x128, (256, 3),
    (const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ bias_or_null, T* __restrict__ y,
     T* __restrict__ pooled_or_null, int batch, int in_c, int in_h, int in_w, int out_c, int k_h, int k_w,
     int stride, int pad, int out_h, int out_w, int relu),
    (x, w, bias_or_null, y, pooled_or_null, batch, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w,
     relu))
NANODDP_ENTRY_EACH_TYPE(conv2d_backward_input_64x64, (256, 2),
    (const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx, int batch, int in_c, int in_h,
     int in_w, int out_c, int k_h, int k_w, int stride, int pad, int out_h, int out_w),
    (dy, w, dx, batch, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w))
NANODDP_ENTRY_EACH_TYPE(conv2d_backward_input_32x128, (256, 3),
    (const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx, int batch, int in_c, int in_h,
     int in_w, int out_c, int k_h, int k_w, int stride, int pad, int out_h, int out_w),
    (dy, w, dx, batch, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w))
NANODDP_ENTRY_EACH_TYPE(conv2d_backward_input_planes, (256, 2),
    (const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx, int in_c, int in_h, int in_w,
     int out_c, int k_h, int k_w, int stride, int pad, int out_h, int out_w, int region_h, int region_w,
     int group),
    (dy, w, dx, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w, region_h, region_w, group))
NANODDP_ENTRY_EACH_TYPE(conv2d_backward_filter_64x64, (256, 2),
    (const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ y_or_null,
     T* __restrict__ dy_out_or_null, float* __restrict__ dw, float* __restrict__ db_or_null,
     float* __restrict__ scratch, int* __restrict__ counters, int batch, int in_c, int in_h, int in_w, int out_c,
     int k_h, int k_w, int stride, int pad, int out_h, int out_w, int splits),
    (x, dy, y_or_null, dy_out_or_null, dw, db_or_null, scratch, counters, batch, in_c, in_h, in_w, out_c, k_h, k_w,
     stride, pad, out_h, out_w, splits))
NANODDP_ENTRY_EACH_TYPE(conv2d_backward_filter_32x16, (128, 8),
    (const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ y_or_null,
     T* __restrict__ dy_out_or_null, float* __restrict__ dw, float* __restrict__ db_or_null,
     float* __restrict__ scratch, int* __restrict__ counters, int batch, int in_c, int in_h, int in_w, int out_c,
     int k_h, int k_w, int stride, int pad, int out_h, int out_w, int splits),
    (x, dy, y_or_null, dy_out_or_null, dw, db_or_null, scratch, counters, batch, in_c, in_h, in_w, out_c, k_h, k_w,
     stride, pad, out_h, out_w, splits))

NANODDP_ENTRY_EACH_TYPE(conv2d_backward_bias, (256),
    (const T* __restrict__ dy, float* __restrict__ db, int batch, int out_c, int pixels),
    (dy, db, batch, out_c, pixels))
