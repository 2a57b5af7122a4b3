// gemm.cu — matrix products for the linear layers, fp32 and 16-bit in.
//
//   C = epilogue(alpha · op(A) · op(B) + beta · C)        op(X) = X or Xᵀ
//   epilogue: + bias[n] (per output column), then ReLU; each optional.
// Row-major with leading dimensions: op(A) is M x K, op(B) K x N, C M x N; A is stored M x K
// (trans_a = 0) or K x M (trans_a = 1), B K x N or N x K (trans_b). A linear layer
// y = x·Wᵀ + b is trans_b = 1; its backward is dx = dy·W and dW = dyᵀ·x (trans_a = 1).
// Work: 2·M·N·K FLOPs; bytes at least 4·(M·K + K·N + M·N·(1 + [beta != 0])) in fp32, half
// that for 16-bit inputs. At LeNet's sizes (M = batch 256; N, K ≤ 800) products are small
// and latency-bound.
//
// gemm_f32 — a product of at least 128 tiles of C (GEMM_BLOCKS, src/backend/kernel/ops.rs).
//   Block tile 64 x 64, K step 16, 256 threads as 16 x 16, each owning a contiguous 4 x 4 of
//   C: per K step one vector shared load of A and one of B feed 16 FMAs (A's broadcast, B's
//   fill two 128-byte phases). Operands are staged zero past the edges with the transposes
//   applied, so the inner loop never branches (rows padded by four floats against bank
//   conflicts); the next step's global loads go out before this step's products. 16 FLOP
//   per staged byte.
//   Summation: each K step's 16 products in fresh registers, joined to the total through a
//   Kahan carry, so an element's error stays near 16 additions' whatever K is (the batch, in
//   dW): 4e-8 relative over 60,000 same-sign terms, 2.0e-7 without (tests/numerics.rs).
//   Needs IEEE adds as written (no -use_fast_math).
//   Launch: grid (⌈N/64⌉, ⌈M/64⌉), block 256, two blocks an SM.
//
// gemm_f32_sliced — fewer tiles (LeNet's fc1: 8 to 52 tiles of 64 x 64 for 132 SMs): 16 x 16
//   tiles, each tile's K cut among the block's 8 warps in 16-step slices (warp g takes g,
//   g + 8, ...; a lane owns 2 x 4 elements), a round staging eight slices one round ahead;
//   the warps' sums added in warp order through shared memory (compensated), then the
//   epilogue. No partial tiles in global memory, no fences; the order depends on the shape
//   alone. 4 FLOP per staged byte, from L2. fc1 at batch 256, 52 MFLOP a product: measured on
//   an H100 (ncu) 9.4, 8.4 and 8.8 µs for forward, input and weight gradient, 8-9% of the
//   fp32 FMA rate, latency-bound (a block's chain of rounds).
//   Launch: grid (⌈N/16⌉, ⌈M/16⌉), block 256 (79 registers: three blocks an SM).
//
// gemm_{f16,bf16}_wmma_{f32,f16,bf16}out — tensor cores (nvcuda::wmma 16x16x16): 16-bit in,
//   f32 accumulation, out in f32 or the input type. bf16 needs sm_80 (the compute_75 build's
//   bf16 entries trap; the backend refuses bf16 below 8.0). Block tile 64 x 64, K step 16, 4
//   warps as 2 x 2 of 32 x 32 (2 x 2 fragments each); tiles staged zero-padded, so any shape
//   works, rows padded to 24 and 72 halves (banks, and wmma's 16-byte rule); the epilogue
//   through shared memory. Launch: grid (⌈N/64⌉, ⌈M/64⌉), block 128, for 128 tiles or more.
// gemm_{f16,bf16}_wmma_sliced_{f32,f16,bf16}out — fewer tiles, in gemm_f32_sliced's shape: a
//   16 x 16 tile a block, its K among 8 warps, each accumulating its slices in one fragment,
//   the fragments added in warp order (compensated). Launch: grid (⌈N/16⌉, ⌈M/16⌉), block 256.
#include "simt.cuh"
#include "split_sum.cuh"  // CompensatedSum

#define GEMM_BM 64
#define GEMM_BN 64
#define GEMM_BK 16

// C[gm][gn] = epilogue(alpha · sum + beta · C) (see the header).
template <class TOut>
__device__ __forceinline__ void gemm_epilogue(TOut* __restrict__ c, const float* __restrict__ bias, int gm, int gn,
                                              int ldc, float sum, float alpha, float beta, int relu) {
    TOut* out = &c[(long long)gm * ldc + gn];
    float v = alpha * sum;
    if (beta != 0.0f) v = fmaf(beta, (float)*out, v);  // beta = 0 never reads C (it may be garbage)
    if (bias) v += bias[gn];
    if (relu) v = fmaxf(v, 0.0f);
    *out = (TOut)v;
}

// acc += one staged 16-step slice's products for this thread's TM x 4 elements: a points at
// its first row in step 0 (TM consecutive floats, one vector load a step), b at its first
// column (4 floats), a_pitch and b_pitch floats from one step to the next. The slice's
// products go into fresh registers, then join acc through a Kahan sum (carry): see the header.
template <int TM>
__device__ __forceinline__ void gemm_slice(const float* __restrict__ a, int a_pitch, const float* __restrict__ b,
                                           int b_pitch, float (&acc)[TM][4], float (&carry)[TM][4]) {
    static_assert(TM == 2 || TM == 4, "rows a thread: one 2- or 4-float load");
    float part[TM][4];
    for (int i = 0; i < TM; ++i)
        for (int j = 0; j < 4; ++j) part[i][j] = 0.0f;
    for (int kk = 0; kk < GEMM_BK; ++kk) {
        float ar[TM];
        if constexpr (TM == 4) {
            const float4 av = *reinterpret_cast<const float4*>(a + kk * a_pitch);
            ar[0] = av.x, ar[1] = av.y, ar[2] = av.z, ar[3] = av.w;
        } else {
            const float2 av = *reinterpret_cast<const float2*>(a + kk * a_pitch);
            ar[0] = av.x, ar[1] = av.y;
        }
        const float4 bv = *reinterpret_cast<const float4*>(b + kk * b_pitch);
        const float br[4] = {bv.x, bv.y, bv.z, bv.w};
        for (int i = 0; i < TM; ++i)
            for (int j = 0; j < 4; ++j) part[i][j] = fmaf(ar[i], br[j], part[i][j]);
    }
    for (int i = 0; i < TM; ++i)
        for (int j = 0; j < 4; ++j) {
            const float y = part[i][j] - carry[i][j];
            const float t = acc[i][j] + y;
            carry[i][j] = (t - acc[i][j]) - y;
            acc[i][j] = t;
        }
}

extern "C" __global__ void __launch_bounds__(256, 2)
    gemm_f32(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
             const float* __restrict__ bias_or_null, int m, int n, int k, int lda, int ldb, int ldc, int trans_a,
             int trans_b, float alpha, float beta, int relu) {
    // Rows four floats longer than the tile: the transposed loads store 16 consecutive lanes
    // down a column, which a 64-float row stride would put in one bank (16-way conflicts; 2-way
    // with 68), and a multiple of four keeps the inner loop's vector loads 16-byte aligned.
    __shared__ __align__(16) float as[GEMM_BK][GEMM_BM + 4];
    __shared__ __align__(16) float bs[GEMM_BK][GEMM_BN + 4];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int m0 = blockIdx.y * GEMM_BM, n0 = blockIdx.x * GEMM_BN;
    // Blocked, compensated summation (see the header): part sums one K tile's 16 products,
    // acc the parts, with carry holding what acc's additions rounded away (Kahan).
    float acc[4][4], carry[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = carry[i][j] = 0.0f;

    // Each thread's 4 elements of A's and of B's tile per K step (walking global memory
    // contiguously in either layout), loaded into registers a K step ahead so that their
    // latency hides behind the products (pipelined), then stored to shared memory.
    auto a_at = [&](int r) {  // (row, k) of this thread's r-th A element in the tile
        const int idx = threadIdx.x + 256 * r;
        return trans_a ? make_int2(idx % GEMM_BM, idx / GEMM_BM) : make_int2(idx / GEMM_BK, idx % GEMM_BK);
    };
    auto b_at = [&](int r) {  // (k, column) of its r-th B element
        const int idx = threadIdx.x + 256 * r;
        return trans_b ? make_int2(idx % GEMM_BK, idx / GEMM_BK) : make_int2(idx / GEMM_BN, idx % GEMM_BN);
    };
    float ra[4], rb[4];
    auto fetch = [&](int k0) {
        for (int r = 0; r < 4; ++r) {
            const int2 ea = a_at(r), eb = b_at(r);
            const int gm = m0 + ea.x, gk = k0 + ea.y, gn = n0 + eb.y, gkb = k0 + eb.x;
            ra[r] = 0.0f;
            if (gm < m && gk < k) ra[r] = trans_a ? a[(long long)gk * lda + gm] : a[(long long)gm * lda + gk];
            rb[r] = 0.0f;
            if (gn < n && gkb < k) rb[r] = trans_b ? b[(long long)gn * ldb + gkb] : b[(long long)gkb * ldb + gn];
        }
    };
    if (k > 0) fetch(0);
    for (int k0 = 0; k0 < k; k0 += GEMM_BK) {
        for (int r = 0; r < 4; ++r) {
            const int2 ea = a_at(r), eb = b_at(r);
            as[ea.y][ea.x] = ra[r];
            bs[eb.x][eb.y] = rb[r];
        }
        __syncthreads();
        if (k0 + GEMM_BK < k) fetch(k0 + GEMM_BK);
        gemm_slice<4>(&as[0][4 * ty], GEMM_BM + 4, &bs[0][4 * tx], GEMM_BN + 4, acc, carry);
        __syncthreads();
    }

    for (int i = 0; i < 4; ++i) {
        int gm = m0 + 4 * ty + i;
        if (gm >= m) continue;
        for (int j = 0; j < 4; ++j) {
            int gn = n0 + 4 * tx + j;
            if (gn >= n) continue;
            gemm_epilogue(c, bias_or_null, gm, gn, ldc, acc[i][j] - carry[i][j], alpha, beta, relu);
        }
    }
}

// gemm_f32_sliced: a 16 x 16 tile of C a block, its K cut among the block's 8 warps (see the
// header). Warp g multiplies 16-step slices g, g + 8, g + 16, ... of K; each round stages
// eight slices at once (16 x 128 of A, 128 x 16 of B: 8 + 8 elements a thread, loaded a
// round ahead).
#define SLICED_TILE 16
#define SLICED_WARPS 8
#define SLICED_SPAN (SLICED_WARPS * GEMM_BK)  // K staged per round
#define SLICED_APITCH 18  // staged A row (16 rows of the tile): even for the 2-float loads,
                          // 18 spreads a store's 16 steps over 16 banks
#define SLICED_BPITCH 20  // staged B row: a multiple of 4 for the 4-float loads

// A sliced kernel's staging (gemm_f32_sliced, gemm_wmma_sliced): per round, this thread's 8
// elements of A's 16 x 128 and of B's 128 x 16, loaded a round ahead (fetch) and stored to
// shared memory (store). Its r-th A element is at (row, step) = (a_row + r·a_drow, a_step +
// r·a_dstep), its B element at (b_step + r·b_dstep, b_col + r·b_dcol): lanes walk global
// memory contiguously in either layout, and both the global and the shared addresses are a
// base plus r times a stride. In shared memory A's (row, step) is at
// (step / 16)·a_slice + (step % 16)·a_kk + row·a_rowp, B's (step, column) at step·b_kk + column
// (a_dstep is 0 or a whole slice, so the A stride is one too).
template <class T>
struct SlicedStage {
    int a_row, a_drow, a_step, a_dstep, b_step, b_dstep, b_col, b_dcol;
    const T* a_base;
    const T* b_base;
    long long a_ks, b_ks, a_dr, b_dr;
    T* as_at;
    T* bs_at;
    int as_dr, bs_dr;
    T ra[8], rb[8];

    __device__ __forceinline__ SlicedStage(const T* __restrict__ a, const T* __restrict__ b, int lda, int ldb,
                                           int trans_a, int trans_b, int m0, int n0, T* as, int a_slice, int a_kk,
                                           int a_rowp, T* bs, int b_kk) {
        const int tid = threadIdx.x;
        a_row = trans_a ? tid % SLICED_TILE : tid / SLICED_SPAN;
        a_drow = trans_a ? 0 : 256 / SLICED_SPAN;
        a_step = trans_a ? tid / SLICED_TILE : tid % SLICED_SPAN;
        a_dstep = trans_a ? 256 / SLICED_TILE : 0;
        b_step = trans_b ? tid % SLICED_SPAN : tid / SLICED_TILE;
        b_dstep = trans_b ? 0 : 256 / SLICED_TILE;
        b_col = trans_b ? tid / SLICED_SPAN : tid % SLICED_TILE;
        b_dcol = trans_b ? 256 / SLICED_SPAN : 0;
        const long long a_rs = trans_a ? 1 : lda, b_cs = trans_b ? ldb : 1;
        a_ks = trans_a ? lda : 1;
        b_ks = trans_b ? 1 : ldb;
        a_dr = a_drow * a_rs + a_dstep * a_ks;
        b_dr = b_dstep * b_ks + b_dcol * b_cs;
        a_base = a + (m0 + a_row) * a_rs + a_step * a_ks;
        b_base = b + b_step * b_ks + (n0 + b_col) * b_cs;
        a_row += m0;
        b_col += n0;
        as_at = as + (a_step / GEMM_BK) * a_slice + (a_step % GEMM_BK) * a_kk + (a_row - m0) * a_rowp;
        as_dr = (a_dstep / GEMM_BK) * a_slice + a_drow * a_rowp;
        bs_at = bs + b_step * b_kk + (b_col - n0);
        bs_dr = b_dstep * b_kk + b_dcol;
    }
    // The round from step k0 into registers (zero past M, N and K).
    __device__ __forceinline__ void fetch(int k0, int m, int n, int k) {
        SIMT_UNROLL
        for (int r = 0; r < 8; ++r) {
            const bool a_in = a_row + r * a_drow < m && k0 + a_step + r * a_dstep < k;
            const bool b_in = b_col + r * b_dcol < n && k0 + b_step + r * b_dstep < k;
            ra[r] = a_in ? a_base[k0 * a_ks + r * a_dr] : (T)0.0f;
            rb[r] = b_in ? b_base[k0 * b_ks + r * b_dr] : (T)0.0f;
        }
    }
    __device__ __forceinline__ void store() {
        SIMT_UNROLL
        for (int r = 0; r < 8; ++r) {
            as_at[r * as_dr] = ra[r];
            bs_at[r * bs_dr] = rb[r];
        }
    }
};

// Σ over the block's SLICED_WARPS warps of sums[w·warp_stride + at], in warp order,
// compensated: a sliced kernel's result for one element.
__device__ __forceinline__ float sliced_warp_sum(const float* __restrict__ sums, int warp_stride, int at) {
    CompensatedSum sum;
    for (int w = 0; w < SLICED_WARPS; ++w) sum.add(sums[w * warp_stride + at]);
    return sum.total();
}

extern "C" __global__ void __launch_bounds__(256, 3)
    gemm_f32_sliced(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                    const float* __restrict__ bias_or_null, int m, int n, int k, int lda, int ldb, int ldc,
                    int trans_a, int trans_b, float alpha, float beta, int relu) {
    __shared__ __align__(16) float as[SLICED_WARPS][GEMM_BK][SLICED_APITCH];  // [slice][step][row]
    __shared__ __align__(16) float bs[SLICED_WARPS][GEMM_BK][SLICED_BPITCH];  // [slice][step][column]
    const int g = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int ty = lane / 4, tx = lane % 4;  // rows 2·ty + i (i < 2), columns 4·tx + j (j < 4)
    const int m0 = blockIdx.y * SLICED_TILE, n0 = blockIdx.x * SLICED_TILE;
    float acc[2][4], carry[2][4];
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = carry[i][j] = 0.0f;

    // [slice][step][row] and [slice][step][column]: a step's row is one slice row.
    SlicedStage<float> stage(a, b, lda, ldb, trans_a, trans_b, m0, n0, &as[0][0][0], GEMM_BK * SLICED_APITCH,
                             SLICED_APITCH, 1, &bs[0][0][0], SLICED_BPITCH);
    if (k > 0) stage.fetch(0, m, n, k);
    for (int k0 = 0; k0 < k; k0 += SLICED_SPAN) {
        stage.store();
        __syncthreads();
        if (k0 + SLICED_SPAN < k) stage.fetch(k0 + SLICED_SPAN, m, n, k);
        if (k0 + GEMM_BK * g < k)  // warp-uniform: this warp's slice holds steps of K
            gemm_slice<2>(&as[g][0][2 * ty], SLICED_APITCH, &bs[g][0][4 * tx], SLICED_BPITCH, acc, carry);
        __syncthreads();
    }

    // The warps' sums, added in warp order (compensated), one element a thread.
    float* sums = &as[0][0][0];  // [warp][row][column], SLICED_WARPS·256 ≤ as's floats
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j)
            sums[(g * SLICED_TILE + 2 * ty + i) * SLICED_TILE + 4 * tx + j] = acc[i][j] - carry[i][j];
    __syncthreads();
    const int row = threadIdx.x / SLICED_TILE, col = threadIdx.x % SLICED_TILE;
    const int gm = m0 + row, gn = n0 + col;
    if (gm >= m || gn >= n) return;
    const float sum = sliced_warp_sum(sums, SLICED_TILE * SLICED_TILE, row * SLICED_TILE + col);
    gemm_epilogue(c, bias_or_null, gm, gn, ldc, sum, alpha, beta, relu);
}

#define WMMA_LDA 24  // 16 + 8 halves: a 48-byte row stride spreads shared-memory banks
#define WMMA_LDB 72  // 64 + 8
#define WMMA_LDC 68  // floats

template <class TIn, class TOut>
__device__ __forceinline__ void gemm_wmma(const TIn* __restrict__ a, const TIn* __restrict__ b,
                                              TOut* __restrict__ c, const float* __restrict__ bias, int m, int n, int k,
                                              int lda, int ldb, int ldc, int trans_a, int trans_b, float alpha,
                                              float beta, int relu) {
    using namespace nvcuda;
    // wmma::load/store_matrix_sync need 256-bit (32-byte) aligned tile pointers; 16-bit and
    // float arrays alone are only 2- and 4-byte aligned. Every tile offset used below is a
    // multiple of 32 bytes (16 rows of 48 or 272 bytes; 16 columns of 2 or 4 bytes).
    __shared__ __align__(32) TIn as[GEMM_BM * WMMA_LDA];
    __shared__ __align__(32) TIn bs[GEMM_BK * WMMA_LDB];
    __shared__ __align__(32) float cs[GEMM_BM * WMMA_LDC];
    const int warp = threadIdx.x / 32;
    const int wm = (warp / 2) * 32, wn = (warp % 2) * 32;  // this warp's 32 x 32 corner
    const int m0 = blockIdx.y * GEMM_BM, n0 = blockIdx.x * GEMM_BN;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    for (int k0 = 0; k0 < k; k0 += GEMM_BK) {
        for (int r = 0; r < 8; ++r) {  // 1024 elements of each tile, 128 threads
            int idx = threadIdx.x + 128 * r;
            int am, ak;
            if (trans_a) { am = idx % GEMM_BM; ak = idx / GEMM_BM; }
            else { ak = idx % GEMM_BK; am = idx / GEMM_BK; }
            int gm = m0 + am, gk = k0 + ak;
            TIn av = (TIn)0.0f;
            if (gm < m && gk < k) av = trans_a ? a[(long long)gk * lda + gm] : a[(long long)gm * lda + gk];
            as[am * WMMA_LDA + ak] = av;
            int bk, bn;
            if (trans_b) { bk = idx % GEMM_BK; bn = idx / GEMM_BK; }
            else { bn = idx % GEMM_BN; bk = idx / GEMM_BN; }
            int gn = n0 + bn;
            gk = k0 + bk;
            TIn bv = (TIn)0.0f;
            if (gn < n && gk < k) bv = trans_b ? b[(long long)gn * ldb + gk] : b[(long long)gk * ldb + gn];
            bs[bk * WMMA_LDB + bn] = bv;
        }
        __syncthreads();
        wmma::fragment<wmma::matrix_a, 16, 16, 16, TIn, wmma::row_major> fa[2];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, TIn, wmma::row_major> fb[2];
        for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &as[(wm + 16 * i) * WMMA_LDA], WMMA_LDA);
        for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &bs[wn + 16 * j], WMMA_LDB);
        for (int i = 0; i < 2; ++i)
            for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        __syncthreads();
    }

    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(&cs[(wm + 16 * i) * WMMA_LDC + wn + 16 * j], acc[i][j], WMMA_LDC,
                                    wmma::mem_row_major);
    __syncthreads();
    for (int idx = threadIdx.x; idx < GEMM_BM * GEMM_BN; idx += 128) {
        int gm = m0 + idx / GEMM_BN, gn = n0 + idx % GEMM_BN;
        if (gm >= m || gn >= n) continue;
        gemm_epilogue(c, bias, gm, gn, ldc, cs[(idx / GEMM_BN) * WMMA_LDC + idx % GEMM_BN], alpha, beta, relu);
    }
}

// gemm_wmma_sliced: gemm_f32_sliced's shape on tensor cores. A 16 x 16 tile of C a block;
// warp g accumulates slices g, g + 8, ... of K in one 16x16x16 fragment (f32), a round
// staging eight slices (16 x 128 of A, 128 x 16 of B, 8 + 8 elements a thread, loaded a round
// ahead); then the warps' fragments are added in warp order in shared memory, compensated,
// one element a thread, and the epilogue applied.
#define SLICED_WMMA_LDC 20  // floats: a multiple of 4 (wmma's 16 bytes), 16 rows of 80 bytes
template <class TIn, class TOut>
__device__ __forceinline__ void gemm_wmma_sliced(const TIn* __restrict__ a, const TIn* __restrict__ b,
                                                 TOut* __restrict__ c, const float* __restrict__ bias, int m, int n,
                                                 int k, int lda, int ldb, int ldc, int trans_a, int trans_b,
                                                 float alpha, float beta, int relu) {
    using namespace nvcuda;
    // Fragment pointers must be 32-byte aligned: a slice is 16 rows of WMMA_LDA halves (768
    // bytes), a warp's sums 16 rows of 20 floats (1,280 bytes).
    __shared__ __align__(32) TIn as[SLICED_WARPS * SLICED_TILE * WMMA_LDA];  // [slice][row][step]
    __shared__ __align__(32) TIn bs[SLICED_WARPS * GEMM_BK * WMMA_LDA];      // [slice][step][column]
    __shared__ __align__(32) float cs[SLICED_WARPS * SLICED_TILE * SLICED_WMMA_LDC];
    const int tid = threadIdx.x, g = tid / 32;
    const int m0 = blockIdx.y * SLICED_TILE, n0 = blockIdx.x * SLICED_TILE;
    // [slice][row][step] (row-major A fragments) and [slice][step][column].
    SlicedStage<TIn> stage(a, b, lda, ldb, trans_a, trans_b, m0, n0, as, SLICED_TILE * WMMA_LDA, 1, WMMA_LDA, bs,
                           WMMA_LDA);
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    if (k > 0) stage.fetch(0, m, n, k);
    for (int k0 = 0; k0 < k; k0 += SLICED_SPAN) {
        stage.store();
        __syncthreads();
        if (k0 + SLICED_SPAN < k) stage.fetch(k0 + SLICED_SPAN, m, n, k);
        if (k0 + GEMM_BK * g < k) {  // warp-uniform: this warp's slice holds steps of K
            wmma::fragment<wmma::matrix_a, 16, 16, 16, TIn, wmma::row_major> fa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, TIn, wmma::row_major> fb;
            wmma::load_matrix_sync(fa, &as[g * SLICED_TILE * WMMA_LDA], WMMA_LDA);
            wmma::load_matrix_sync(fb, &bs[g * GEMM_BK * WMMA_LDA], WMMA_LDA);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        __syncthreads();
    }
    wmma::store_matrix_sync(&cs[g * SLICED_TILE * SLICED_WMMA_LDC], acc, SLICED_WMMA_LDC, wmma::mem_row_major);
    __syncthreads();
    const int row = tid / SLICED_TILE, col = tid % SLICED_TILE, gm = m0 + row, gn = n0 + col;
    if (gm >= m || gn >= n) return;
    const float sum = sliced_warp_sum(cs, SLICED_TILE * SLICED_WMMA_LDC, row * SLICED_WMMA_LDC + col);
    gemm_epilogue(c, bias, gm, gn, ldc, sum, alpha, beta, relu);
}

// The entries: (input, output) types, 64x64 tiles and sliced. bf16 wmma exists from sm_80
// on; an older target (the compute_75 PTX, JIT-compiled on a Turing GPU) gets a body that
// traps instead.
#define GEMM_WMMA_PARAMS(TIn, TOut)                                                                          \
    (const TIn* __restrict__ a, const TIn* __restrict__ b, TOut* __restrict__ c,                             \
     const float* __restrict__ bias_or_null, int m, int n, int k, int lda, int ldb, int ldc, int trans_a,    \
     int trans_b, float alpha, float beta, int relu)
#define GEMM_WMMA_ARGS (a, b, c, bias_or_null, m, n, k, lda, ldb, ldc, trans_a, trans_b, alpha, beta, relu)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define GEMM_BF16_BODY(kernel, TOut) __trap()
#else
#define GEMM_BF16_BODY(kernel, TOut) kernel<__nv_bfloat16, TOut> GEMM_WMMA_ARGS
#endif

extern "C" __global__ void __launch_bounds__(128)
    gemm_f16_wmma_f32out(const __half* __restrict__ a, const __half* __restrict__ b, float* __restrict__ c,
                         const float* __restrict__ bias_or_null, int m, int n, int k, int lda, int ldb, int ldc,
                         int trans_a, int trans_b, float alpha, float beta, int relu) {
    gemm_wmma<__half, float> GEMM_WMMA_ARGS;
}

extern "C" __global__ void __launch_bounds__(128)
    gemm_f16_wmma_f16out(const __half* __restrict__ a, const __half* __restrict__ b, __half* __restrict__ c,
                         const float* __restrict__ bias_or_null, int m, int n, int k, int lda, int ldb, int ldc,
                         int trans_a, int trans_b, float alpha, float beta, int relu) {
    gemm_wmma<__half, __half> GEMM_WMMA_ARGS;
}

extern "C" __global__ void __launch_bounds__(128)
    gemm_bf16_wmma_f32out(const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ b,
                          float* __restrict__ c, const float* __restrict__ bias_or_null, int m, int n, int k, int lda,
                          int ldb, int ldc, int trans_a, int trans_b, float alpha, float beta, int relu) {
    GEMM_BF16_BODY(gemm_wmma, float);
}

extern "C" __global__ void __launch_bounds__(128)
    gemm_bf16_wmma_bf16out(const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ b,
                           __nv_bfloat16* __restrict__ c, const float* __restrict__ bias_or_null, int m, int n, int k,
                           int lda, int ldb, int ldc, int trans_a, int trans_b, float alpha, float beta, int relu) {
    GEMM_BF16_BODY(gemm_wmma, __nv_bfloat16);
}

extern "C" __global__ void __launch_bounds__(256)
    gemm_f16_wmma_sliced_f32out(const __half* __restrict__ a, const __half* __restrict__ b, float* __restrict__ c,
                                const float* __restrict__ bias_or_null, int m, int n, int k, int lda, int ldb,
                                int ldc, int trans_a, int trans_b, float alpha, float beta, int relu) {
    gemm_wmma_sliced<__half, float> GEMM_WMMA_ARGS;
}

extern "C" __global__ void __launch_bounds__(256)
    gemm_f16_wmma_sliced_f16out(const __half* __restrict__ a, const __half* __restrict__ b, __half* __restrict__ c,
                                const float* __restrict__ bias_or_null, int m, int n, int k, int lda, int ldb,
                                int ldc, int trans_a, int trans_b, float alpha, float beta, int relu) {
    gemm_wmma_sliced<__half, __half> GEMM_WMMA_ARGS;
}

extern "C" __global__ void __launch_bounds__(256)
    gemm_bf16_wmma_sliced_f32out(const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ b,
                                 float* __restrict__ c, const float* __restrict__ bias_or_null, int m, int n, int k,
                                 int lda, int ldb, int ldc, int trans_a, int trans_b, float alpha, float beta,
                                 int relu) {
    GEMM_BF16_BODY(gemm_wmma_sliced, float);
}

extern "C" __global__ void __launch_bounds__(256)
    gemm_bf16_wmma_sliced_bf16out(const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ b,
                                  __nv_bfloat16* __restrict__ c, const float* __restrict__ bias_or_null, int m, int n,
                                  int k, int lda, int ldb, int ldc, int trans_a, int trans_b, float alpha, float beta,
                                  int relu) {
    GEMM_BF16_BODY(gemm_wmma_sliced, __nv_bfloat16);
}
