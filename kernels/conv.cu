// conv.cu — 2-D convolution (cross-correlation, as in every DL framework), NCHW, as
// implicit GEMMs with register tiles.
//
//   y[n][o][p][q] = epilogue(bias[o] + Σ_c Σ_i Σ_j x[n][c][p·s - pad + i][q·s - pad + j] · w[o][c][i][j])
//   x: batch x C x H x W, w: O x C x KH x KW, y: batch x O x P x Q with
//   P = (H + 2·pad - KH) / s + 1, Q likewise. Out-of-range input taps read zero (padding).
//
// Each pass is a matrix product whose operands are gathered from the tensors as they are
// staged in shared memory (no im2col buffer in memory), K = C·KH·KW:
//   forward:         Y[o][(n,p,q)]  = Σ_k W[o][k] · X̂[k][(n,p,q)]        M = O, N = batch·P·Q
//   input gradient:  dX[c][(n,h,w)] = Σ_(o,i,j) W[o][c][i][j] · dŶ[(o,i,j)][(n,h,w)]
//                    M = C, N = batch·H·W, reduction O·KH·KW; dŶ is dy at the output pixel
//                    whose window put tap (i, j) on (h, w), zero where there is none
//   filter gradient: dW[o][k] = Σ_(n,p,q) dY[o][(n,p,q)] · X̂[k][(n,p,q)]   M = O, N = K,
//                    reduction batch·P·Q, split over images (below); the bias gradient
//                    db[o] = Σ dY[o][:] comes from the same loads of dY.
//
// The tile (struct Tile): a block computes a BM x BN tile of the product, 16 reduction
// steps at a time. Both operands' 16-step slices are staged in shared memory (converted to
// float as they load: any storage type), then each thread multiplies from registers: TM x TN
// outputs at rows ty + TY·i and columns tx + TX·j (strided, so a warp's shared-memory reads
// of a B row hit consecutive banks, its A reads broadcast, and its stores to y coalesce).
// Per step a thread reads TM + TN floats from shared memory for TM·TN FMAs.
// Configurations (the launcher picks by shape): 64x64 with 4x4 per thread (256 threads)
// for M > 32; 32x128 with 4x4 (256 threads) for M ≤ 32; 32x16 with 2x2 (128 threads) for
// the filter gradient of a layer with K ≤ 16 (LeNet's conv1: 20 x 9).
//
// Gathering: each thread loads fixed rows or columns of the staged slices; the positions
// they stand for ((c, i, j) of a filter tap, (n, p, q) of a pixel) advance with the
// reduction by carries, not divisions.
//
// Work at LeNet's conv2 (batch 256: O 50, C 20, 5x5 on 13x13 → 9x9): 1.04 GFLOP per pass,
// compulsory bytes 7.7 MB, 134 FLOP/B: compute-bound on an H100 (ridge ~20 FLOP/B). The
// tiles pad M (50 of 64 rows, 20 of 32) and the input gradient's reduction includes the
// taps that fall off the output plane (zeros: 52% of them at 13x13 from 9x9), so the
// kernels execute 1.33, 2.6 and 1.33 GFLOP for forward, input and filter gradient. At
// 16.7 TFLOP/s (25% of the fp32 FMA rate) each would take 60-160 µs; measured figures are
// in docs/kernels.md.
//
// Summation: the forward and input-gradient dot products (500 and 1,250 terms for LeNet's
// conv2) are blocked: each 16-step slice sums into fresh registers, added to the total once.
// The filter and bias gradients reduce over batch·P·Q terms (173,056 for conv1 at batch
// 256): blocked and compensated (Kahan over the slices' sums), so an element's error stays
// near that of 16 additions however long the reduction.
//
// The filter gradient's split: S slices of the batch (S a function of the shape only:
// enough blocks for a GPU, never the GPU's own size, so results are the same bits on every
// GPU). Each block writes its slice's partial tile into `scratch`; the last block of a tile
// to finish (an integer counter per tile, reset by that block) adds the S partials in slice
// order, compensated, and writes dw and db. Deterministic: the order never depends on
// which block finishes last. With S = 1 the blocks write dw and db directly.
//
// conv2d_backward_bias: db[o] = Σ dy[:, o] (the linear layers' bias gradients too); one
// block per output channel, a compensated running sum per thread, then a tree (fixed order).
#include "simt.cuh"

#define CONV_BK 16          // reduction steps staged per pass
#define CONV_THREADS 256    // conv2d_backward_bias's block

// A position (a, b, c) in a box of extent (·, B, C) that advances along the flattened index
// by carries: a filter tap (c, i, j) in C x KH x KW, or a pixel (n, p, q) in batch x P x Q.
struct Index3 {
    int a, b, c;
    __device__ __forceinline__ void start(int flat, int nb, int nc) {
        a = flat / (nb * nc);
        const int rest = flat - a * nb * nc;
        b = rest / nc;
        c = rest - b * nc;
    }
    __device__ __forceinline__ void advance(int step, int nb, int nc) {
        c += step;
        while (c >= nc) { c -= nc; ++b; }
        while (b >= nb) { b -= nb; ++a; }
    }
};

template <int BM_, int BN_, int TM_, int TN_>
struct Tile {
    static constexpr int BM = BM_, BN = BN_, TM = TM_, TN = TN_;
    static constexpr int TY = BM / TM, TX = BN / TN, THREADS = TX * TY;
};

// acc[i][j] += Σ_k as[k][ty + TY·i] · bs[k][tx + TX·j] over one staged slice, the slice's
// products summed into fresh registers first (blocked summation); with `carry`, added to
// acc through a Kahan sum.
template <class Cfg, bool COMPENSATED>
__device__ __forceinline__ void multiply_slice(const float (*as)[Cfg::BM], const float (*bs)[Cfg::BN],
                                               float (&acc)[Cfg::TM][Cfg::TN], float (&carry)[Cfg::TM][Cfg::TN],
                                               int ty, int tx) {
    float part[Cfg::TM][Cfg::TN];
    for (int i = 0; i < Cfg::TM; ++i)
        for (int j = 0; j < Cfg::TN; ++j) part[i][j] = 0.0f;
    for (int k = 0; k < CONV_BK; ++k) {
        float a[Cfg::TM], b[Cfg::TN];
        for (int i = 0; i < Cfg::TM; ++i) a[i] = as[k][ty + Cfg::TY * i];
        for (int j = 0; j < Cfg::TN; ++j) b[j] = bs[k][tx + Cfg::TX * j];
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

// ---------------------------------------------------------------- forward
// Grid (ceil(batch·P·Q / BN), ceil(O / BM)). Slices: A = w[o][k] (rows of the filter,
// contiguous in k), B = x̂[k][(n,p,q)], each thread loading one fixed column of B.
template <class T, class Cfg>
__device__ __forceinline__ void conv_forward(const T* __restrict__ x, const T* __restrict__ w,
                                             const float* __restrict__ bias, T* __restrict__ y, int batch, int in_c,
                                             int in_h, int in_w, int out_c, int k_h, int k_w, int stride, int pad,
                                             int out_h, int out_w, int relu) {
    __shared__ float as[CONV_BK][Cfg::BM];
    __shared__ float bs[CONV_BK][Cfg::BN];
    const int tid = threadIdx.x, tx = tid % Cfg::TX, ty = tid / Cfg::TX;
    const int m0 = blockIdx.y * Cfg::BM, n0 = blockIdx.x * Cfg::BN;
    const int pixels = out_h * out_w, cols = batch * pixels, depth = in_c * k_h * k_w;
    // B: this thread's column and its first reduction rows (every THREADS / BN-th).
    constexpr int B_ROWS = Cfg::THREADS / Cfg::BN;  // rows loaded per pass, one per thread group
    const int b_col = tid % Cfg::BN, b_row = tid / Cfg::BN;
    const int col = n0 + b_col;
    const bool col_ok = col < cols;
    int img = 0, ih0 = 0, iw0 = 0;
    if (col_ok) {
        img = col / pixels;
        const int pq = col - img * pixels, p = pq / out_w;
        ih0 = p * stride - pad;
        iw0 = (pq - p * out_w) * stride - pad;
    }
    const T* x_img = x + (long long)img * in_c * in_h * in_w;
    constexpr int B_PER = CONV_BK / B_ROWS;  // rows of B per thread per slice
    Index3 tap[B_PER];
    for (int r = 0; r < B_PER; ++r) tap[r].start(b_row + B_ROWS * r, k_h, k_w);
    // A: rows m0 + tid / BK + (THREADS / BK)·r, column tid % BK.
    constexpr int A_ROWS = Cfg::THREADS / CONV_BK, A_PER = Cfg::BM / A_ROWS;
    const int a_k = tid % CONV_BK, a_m = tid / CONV_BK;

    float acc[Cfg::TM][Cfg::TN], carry[Cfg::TM][Cfg::TN];
    for (int i = 0; i < Cfg::TM; ++i)
        for (int j = 0; j < Cfg::TN; ++j) acc[i][j] = carry[i][j] = 0.0f;
    for (int k0 = 0; k0 < depth; k0 += CONV_BK) {
        for (int r = 0; r < A_PER; ++r) {
            const int m = m0 + a_m + A_ROWS * r, k = k0 + a_k;
            as[a_k][a_m + A_ROWS * r] = (m < out_c && k < depth) ? (float)w[(long long)m * depth + k] : 0.0f;
        }
        for (int r = 0; r < B_PER; ++r) {
            const int k = k0 + b_row + B_ROWS * r;
            const int ih = ih0 + tap[r].b, iw = iw0 + tap[r].c;
            float v = 0.0f;
            if (col_ok && k < depth && ih >= 0 && ih < in_h && iw >= 0 && iw < in_w)
                v = (float)x_img[((long long)tap[r].a * in_h + ih) * in_w + iw];
            bs[b_row + B_ROWS * r][b_col] = v;
            tap[r].advance(CONV_BK, k_h, k_w);
        }
        __syncthreads();
        multiply_slice<Cfg, false>(as, bs, acc, carry, ty, tx);
        __syncthreads();
    }
    for (int j = 0; j < Cfg::TN; ++j) {
        const int c = n0 + tx + Cfg::TX * j;
        if (c >= cols) continue;
        const int n = c / pixels, pq = c - n * pixels;
        for (int i = 0; i < Cfg::TM; ++i) {
            const int o = m0 + ty + Cfg::TY * i;
            if (o >= out_c) continue;
            float v = acc[i][j];
            if (bias) v += bias[o];
            if (relu) v = fmaxf(v, 0.0f);
            y[((long long)n * out_c + o) * pixels + pq] = (T)v;
        }
    }
}

// ---------------------------------------------------------------- input gradient
// Grid (ceil(batch·H·W / BN), ceil(C / BM)). Reduction over (o, i, j): A = w[o][c][i][j]
// read as [c][(o,i,j)], B = dy at the output pixel (p, q) with p·s = h + pad - i,
// q·s = w + pad - j (zero where that is no pixel).
template <class T, class Cfg>
__device__ __forceinline__ void conv_backward_input(const T* __restrict__ dy, const T* __restrict__ w,
                                                    T* __restrict__ dx, int batch, int in_c, int in_h, int in_w,
                                                    int out_c, int k_h, int k_w, int stride, int pad, int out_h,
                                                    int out_w) {
    __shared__ float as[CONV_BK][Cfg::BM];
    __shared__ float bs[CONV_BK][Cfg::BN];
    const int tid = threadIdx.x, tx = tid % Cfg::TX, ty = tid / Cfg::TX;
    const int m0 = blockIdx.y * Cfg::BM, n0 = blockIdx.x * Cfg::BN;
    const int plane = in_h * in_w, cols = batch * plane, window = k_h * k_w, depth = out_c * window;
    const int out_plane = out_h * out_w;
    constexpr int B_ROWS = Cfg::THREADS / Cfg::BN, B_PER = CONV_BK / B_ROWS;
    const int b_col = tid % Cfg::BN, b_row = tid / Cfg::BN;
    const int col = n0 + b_col;
    const bool col_ok = col < cols;
    int img = 0, h = 0, wc = 0;
    if (col_ok) {
        img = col / plane;
        const int hw = col - img * plane;
        h = hw / in_w;
        wc = hw - h * in_w;
    }
    const T* dy_img = dy + (long long)img * out_c * out_plane;
    Index3 tap[B_PER];  // (o, i, j) of this thread's rows of B
    for (int r = 0; r < B_PER; ++r) tap[r].start(b_row + B_ROWS * r, k_h, k_w);
    constexpr int A_ROWS = Cfg::THREADS / CONV_BK, A_PER = Cfg::BM / A_ROWS;
    const int a_k = tid % CONV_BK, a_m = tid / CONV_BK;
    Index3 a_tap;  // (o, i·KW + j) of this thread's column of A, as (o, 0, ij)
    a_tap.start(a_k, 1, window);

    float acc[Cfg::TM][Cfg::TN], carry[Cfg::TM][Cfg::TN];
    for (int i = 0; i < Cfg::TM; ++i)
        for (int j = 0; j < Cfg::TN; ++j) acc[i][j] = carry[i][j] = 0.0f;
    for (int k0 = 0; k0 < depth; k0 += CONV_BK) {
        const bool a_ok = k0 + a_k < depth;
        for (int r = 0; r < A_PER; ++r) {
            const int c = m0 + a_m + A_ROWS * r;
            as[a_k][a_m + A_ROWS * r] =
                (a_ok && c < in_c) ? (float)w[((long long)a_tap.a * in_c + c) * window + a_tap.c] : 0.0f;
        }
        a_tap.advance(CONV_BK, 1, window);
        for (int r = 0; r < B_PER; ++r) {
            const int k = k0 + b_row + B_ROWS * r;
            int p = h + pad - tap[r].b, q = wc + pad - tap[r].c;
            bool ok = col_ok && k < depth && p >= 0 && q >= 0;
            if (stride != 1) {  // uniform: no divisions at stride 1
                ok = ok && p % stride == 0 && q % stride == 0;
                p /= stride;
                q /= stride;
            }
            ok = ok && p < out_h && q < out_w;
            bs[b_row + B_ROWS * r][b_col] = ok ? (float)dy_img[(long long)tap[r].a * out_plane + p * out_w + q] : 0.0f;
            tap[r].advance(CONV_BK, k_h, k_w);
        }
        __syncthreads();
        multiply_slice<Cfg, false>(as, bs, acc, carry, ty, tx);
        __syncthreads();
    }
    for (int j = 0; j < Cfg::TN; ++j) {
        const int cl = n0 + tx + Cfg::TX * j;
        if (cl >= cols) continue;
        const int n = cl / plane, hw = cl - n * plane;
        for (int i = 0; i < Cfg::TM; ++i) {
            const int c = m0 + ty + Cfg::TY * i;
            if (c < in_c) dx[((long long)n * in_c + c) * plane + hw] = (T)acc[i][j];
        }
    }
}

// ---------------------------------------------------------------- filter and bias gradients
// Grid (ceil(K / BN), ceil(O / BM), S). Block (bx, by, s) reduces images
// [s·per, min(batch, (s + 1)·per)), per = ceil(batch / S), over (n, p, q): A = dy[o][(n,p,q)],
// B = x̂[(n,p,q)][k], each thread loading one fixed column k of B.
// `scratch`: S·(O·K + O) floats of partials; `counters`: one int per tile, zero between
// launches (the last block of each tile resets its own). Neither is used when S = 1.
// `db_or_null`: no bias gradient when null.
template <class T, class Cfg>
__device__ __forceinline__ void conv_backward_filter(const T* __restrict__ x, const T* __restrict__ dy,
                                                     float* __restrict__ dw, float* __restrict__ db_or_null,
                                                     float* __restrict__ scratch, int* __restrict__ counters,
                                                     int batch, int in_c, int in_h,
                                                     int in_w, int out_c, int k_h, int k_w, int stride, int pad,
                                                     int out_h, int out_w, int splits) {
    __shared__ float as[CONV_BK][Cfg::BM];
    __shared__ float bs[CONV_BK][Cfg::BN];
    __shared__ int last;
    const int tid = threadIdx.x, tx = tid % Cfg::TX, ty = tid / Cfg::TX;
    const int m0 = blockIdx.y * Cfg::BM, n0 = blockIdx.x * Cfg::BN, s = blockIdx.z;
    const int pixels = out_h * out_w, window = k_h * k_w, depth = in_c * window;
    const int per = (batch + splits - 1) / splits;
    const int img0 = min(batch, s * per), img1 = min(batch, img0 + per);
    const int r0 = img0 * pixels, r1 = img1 * pixels;
    const bool with_bias = db_or_null != nullptr && blockIdx.x == 0;
    // B: column k = n0 + b_col (a fixed filter tap), rows every B_ROWS-th pixel.
    constexpr int B_ROWS = Cfg::THREADS / Cfg::BN, B_PER = CONV_BK / B_ROWS;
    const int b_col = tid % Cfg::BN, b_row = tid / Cfg::BN;
    const int kc = n0 + b_col;
    const bool col_ok = kc < depth;
    Index3 tap;
    tap.start(col_ok ? kc : 0, k_h, k_w);
    const long long x_tap = (long long)tap.a * in_h * in_w;
    Index3 pix[B_PER];  // (n, p, q) of this thread's rows of B
    for (int r = 0; r < B_PER; ++r) pix[r].start(r0 + b_row + B_ROWS * r, out_h, out_w);
    // A: rows o = m0 + a_m + A_ROWS·r, one pixel per thread per slice.
    constexpr int A_ROWS = Cfg::THREADS / CONV_BK, A_PER = Cfg::BM / A_ROWS;
    const int a_k = tid % CONV_BK, a_m = tid / CONV_BK;
    Index3 a_pix;  // (n, 0, p·Q + q)
    a_pix.start(r0 + a_k, 1, pixels);
    float bias_acc[A_PER], bias_carry[A_PER];
    for (int r = 0; r < A_PER; ++r) bias_acc[r] = bias_carry[r] = 0.0f;

    float acc[Cfg::TM][Cfg::TN], carry[Cfg::TM][Cfg::TN];
    for (int i = 0; i < Cfg::TM; ++i)
        for (int j = 0; j < Cfg::TN; ++j) acc[i][j] = carry[i][j] = 0.0f;
    const long long x_image = (long long)in_c * in_h * in_w, dy_image = (long long)out_c * pixels;
    for (int k0 = r0; k0 < r1; k0 += CONV_BK) {
        const bool a_ok = k0 + a_k < r1;
        for (int r = 0; r < A_PER; ++r) {
            const int o = m0 + a_m + A_ROWS * r;
            float v = 0.0f;
            if (a_ok && o < out_c) v = (float)dy[a_pix.a * dy_image + (long long)o * pixels + a_pix.c];
            as[a_k][a_m + A_ROWS * r] = v;
            if (with_bias) {  // Kahan, one term at a time: these lanes' share of db
                const float yv = v - bias_carry[r];
                const float t = bias_acc[r] + yv;
                bias_carry[r] = (t - bias_acc[r]) - yv;
                bias_acc[r] = t;
            }
        }
        a_pix.advance(CONV_BK, 1, pixels);
        for (int r = 0; r < B_PER; ++r) {
            const int k = k0 + b_row + B_ROWS * r;
            const int ih = pix[r].b * stride - pad + tap.b, iw = pix[r].c * stride - pad + tap.c;
            float v = 0.0f;
            if (col_ok && k < r1 && ih >= 0 && ih < in_h && iw >= 0 && iw < in_w)
                v = (float)x[pix[r].a * x_image + x_tap + (long long)ih * in_w + iw];
            bs[b_row + B_ROWS * r][b_col] = v;
            pix[r].advance(CONV_BK, out_h, out_w);
        }
        __syncthreads();
        multiply_slice<Cfg, true>(as, bs, acc, carry, ty, tx);
        __syncthreads();
    }
    // The bias partials: the CONV_BK lanes sharing each row of A (consecutive lanes) added
    // by a fixed tree of shuffles.
    float bias_part[A_PER];
    for (int r = 0; r < A_PER; ++r) {
        float v = bias_acc[r] - bias_carry[r];
        for (int off = CONV_BK / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
        bias_part[r] = v;
    }
    const int total = out_c * depth + out_c;
    float* slot = splits == 1 ? nullptr : scratch + (long long)s * total;
    // This block's partial tile: dw's elements, then (first column of tiles) db's.
    for (int i = 0; i < Cfg::TM; ++i) {
        const int o = m0 + ty + Cfg::TY * i;
        if (o >= out_c) continue;
        for (int j = 0; j < Cfg::TN; ++j) {
            const int k = n0 + tx + Cfg::TX * j;
            if (k >= depth) continue;
            const float v = acc[i][j] - carry[i][j];
            if (slot) slot[(long long)o * depth + k] = v;
            else dw[(long long)o * depth + k] = v;
        }
    }
    if (with_bias && a_k == 0)
        for (int r = 0; r < A_PER; ++r) {
            const int o = m0 + a_m + A_ROWS * r;
            if (o >= out_c) continue;
            if (slot) slot[out_c * depth + o] = bias_part[r];
            else db_or_null[o] = bias_part[r];
        }
    if (!slot) return;
    // The last block of this tile to finish adds the S partials, in slice order.
    const int tile = blockIdx.y * gridDim.x + blockIdx.x;
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        const int done = atomicAdd(&counters[tile], 1);
        last = done == splits - 1;
        if (last) counters[tile] = 0;  // ready for the next launch
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int e = tid; e < Cfg::BM * Cfg::BN; e += Cfg::THREADS) {
        const int o = m0 + e / Cfg::BN, k = n0 + e % Cfg::BN;
        if (o >= out_c || k >= depth) continue;
        float sum = 0.0f, c = 0.0f;
        for (int t = 0; t < splits; ++t) {
            const float yv = ((volatile float*)scratch)[(long long)t * total + (long long)o * depth + k] - c;
            const float u = sum + yv;
            c = (u - sum) - yv;
            sum = u;
        }
        dw[(long long)o * depth + k] = sum - c;
    }
    if (db_or_null && blockIdx.x == 0)
        for (int o = m0 + tid; o < min(out_c, m0 + Cfg::BM); o += Cfg::THREADS) {
            float sum = 0.0f, c = 0.0f;
            for (int t = 0; t < splits; ++t) {
                const float yv = ((volatile float*)scratch)[(long long)t * total + out_c * depth + o] - c;
                const float u = sum + yv;
                c = (u - sum) - yv;
                sum = u;
            }
            db_or_null[o] = sum - c;
        }
}

// ---------------------------------------------------------------- bias gradient alone

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

#define CONV_FORWARD_PARAMS                                                                                   \
    (const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ bias_or_null, T* __restrict__ y, \
     int batch, int in_c, int in_h, int in_w, int out_c, int k_h, int k_w, int stride, int pad, int out_h,     \
     int out_w, int relu)
#define CONV_FORWARD_ARGS \
    (x, w, bias_or_null, y, batch, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w, relu)
#define CONV_INPUT_PARAMS                                                                                      \
    (const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx, int batch, int in_c, int in_h,     \
     int in_w, int out_c, int k_h, int k_w, int stride, int pad, int out_h, int out_w)
#define CONV_INPUT_ARGS (dy, w, dx, batch, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w)
#define CONV_FILTER_PARAMS                                                                                     \
    (const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ dw, float* __restrict__ db_or_null, \
     float* __restrict__ scratch, int* __restrict__ counters, int batch, int in_c, int in_h, int in_w,          \
     int out_c, int k_h, int k_w, int stride, int pad, int out_h, int out_w, int splits)
#define CONV_FILTER_ARGS \
    (x, dy, dw, db_or_null, scratch, counters, batch, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w, splits)

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
template <class T> __device__ __forceinline__ void conv2d_backward_filter_64x64 CONV_FILTER_PARAMS {
    conv_backward_filter<T, Tile64x64> CONV_FILTER_ARGS;
}
template <class T> __device__ __forceinline__ void conv2d_backward_filter_32x16 CONV_FILTER_PARAMS {
    conv_backward_filter<T, Tile32x16> CONV_FILTER_ARGS;
}

NANODDP_ENTRY_EACH_TYPE(conv2d_forward_64x64, (256, 2),
    (const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ bias_or_null, T* __restrict__ y,
     int batch, int in_c, int in_h, int in_w, int out_c, int k_h, int k_w, int stride, int pad, int out_h,
     int out_w, int relu),
    (x, w, bias_or_null, y, batch, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w, relu))
NANODDP_ENTRY_EACH_TYPE(conv2d_forward_32x128, (256, 2),
    (const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ bias_or_null, T* __restrict__ y,
     int batch, int in_c, int in_h, int in_w, int out_c, int k_h, int k_w, int stride, int pad, int out_h,
     int out_w, int relu),
    (x, w, bias_or_null, y, batch, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w, relu))
NANODDP_ENTRY_EACH_TYPE(conv2d_backward_input_64x64, (256, 2),
    (const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx, int batch, int in_c, int in_h,
     int in_w, int out_c, int k_h, int k_w, int stride, int pad, int out_h, int out_w),
    (dy, w, dx, batch, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w))
NANODDP_ENTRY_EACH_TYPE(conv2d_backward_input_32x128, (256, 2),
    (const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx, int batch, int in_c, int in_h,
     int in_w, int out_c, int k_h, int k_w, int stride, int pad, int out_h, int out_w),
    (dy, w, dx, batch, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w))
NANODDP_ENTRY_EACH_TYPE(conv2d_backward_filter_64x64, (256, 2),
    (const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ dw, float* __restrict__ db_or_null,
     float* __restrict__ scratch, int* __restrict__ counters, int batch, int in_c, int in_h, int in_w,
     int out_c, int k_h, int k_w, int stride, int pad, int out_h, int out_w, int splits),
    (x, dy, dw, db_or_null, scratch, counters, batch, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w, splits))
NANODDP_ENTRY_EACH_TYPE(conv2d_backward_filter_32x16, (128),
    (const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ dw, float* __restrict__ db_or_null,
     float* __restrict__ scratch, int* __restrict__ counters, int batch, int in_c, int in_h, int in_w,
     int out_c, int k_h, int k_w, int stride, int pad, int out_h, int out_w, int splits),
    (x, dy, dw, db_or_null, scratch, counters, batch, in_c, in_h, in_w, out_c, k_h, k_w, stride, pad, out_h, out_w, splits))

NANODDP_ENTRY_EACH_TYPE(conv2d_backward_bias, (256),
    (const T* __restrict__ dy, float* __restrict__ db, int batch, int out_c, int pixels),
    (dy, db, batch, out_c, pixels))
