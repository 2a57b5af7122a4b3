// loss.cu — fused softmax + cross-entropy, forward and backward in one pass, and accuracy;
// and the classifier head around it (softmax_head, below: the linear layer before the loss,
// the shard's statistics and every gradient of the two, one launch).
//
//   loss[r]    = log Σ_c exp(z[r][c]) - z[r][label[r]]          (log-sum-exp, shifted by
//                                                               the row max: no overflow)
//   grad[r][c] = (softmax(z[r])[c] - [c == label[r]]) · grad_scale
//   *correct  += 1 if the row's argmax (first on ties) equals its label
// grad_scale is 1/batch for a mean loss, times the loss scale under mixed precision, so the
// backward pass starts from the right magnitude with no extra kernel; given
// grad_scale_at_or_null, it is read from there as the kernel runs (a training step's scalars
// live in device memory: kernels/step.cu). A label ≥ classes
// yields a NaN loss (and no correct count), which the trainer's finite check then reports.
//
// Launch: one warp per row, 256-thread blocks (8 rows each), grid ceil(rows / 8). Each lane
// walks classes lane, lane + 32, ...; max, argmax and the exp-sum are warp reductions by
// __shfl_xor_sync, so every lane ends with the row's values and no shared memory is needed.
// Bytes: the logits are read from memory once (the second and third passes hit the cache),
// the gradient written once, 1 label byte and 4 loss bytes per row. FLOPs: ~5 per logit
// plus two exps; the kernel is bound by launch latency at LeNet's 10 classes.
#include "simt.cuh"

template <class T>
__device__ __forceinline__ void softmax_cross_entropy(const T* __restrict__ logits,
                                                      const unsigned char* __restrict__ labels,
                                                      float* __restrict__ loss, T* __restrict__ grad,
                                                      int* __restrict__ correct, int rows, int classes,
                                                      float grad_scale, const float* __restrict__ grad_scale_at) {
    if (grad_scale_at) grad_scale = *grad_scale_at;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;  // uniform across the warp: the shuffles below see full warps
    const T* z = logits + (long long)row * classes;

    float best = __int_as_float(0xff800000);  // -inf
    int arg = classes;
    for (int c = lane; c < classes; c += 32) {
        float v = (float)z[c];
        if (v > best || (v != v && best == best)) best = v, arg = c;
    }
    for (int off = 16; off > 0; off >>= 1) {
        float ob = __shfl_xor_sync(0xffffffffu, best, off);
        int oa = __shfl_xor_sync(0xffffffffu, arg, off);
        if (ob > best || (ob == best && oa < arg) || (ob != ob && best == best)) best = ob, arg = oa;
    }
    float sum = 0.0f;
    for (int c = lane; c < classes; c += 32) sum += expf((float)z[c] - best);
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);

    const int label = labels[row];
    const bool valid = label < classes;
    if (grad) {
        for (int c = lane; c < classes; c += 32) {
            float p = expf((float)z[c] - best) / sum;
            grad[(long long)row * classes + c] = (T)((p - (c == label ? 1.0f : 0.0f)) * grad_scale);
        }
    }
    if (lane == 0) {
        loss[row] = valid ? best + logf(sum) - (float)z[label] : __int_as_float(0x7fc00000);
        if (valid && arg == label) atomicAdd(correct, 1);
    }
}

NANODDP_ENTRY_EACH_TYPE(softmax_cross_entropy, (256),
    (const T* __restrict__ logits, const unsigned char* __restrict__ labels,
     float* __restrict__ loss, T* __restrict__ grad_or_null, int* __restrict__ correct,
     int rows, int classes, float grad_scale, const float* __restrict__ grad_scale_at_or_null),
    (logits, labels, loss, grad_or_null, correct, rows, classes, grad_scale, grad_scale_at_or_null))

// ---------------------------------------------------------------- the classifier head
// softmax_head_T: a linear layer, the softmax cross-entropy above and the layer's backward,
// in one launch (LeNet's fc2 and loss: 7 launches before):
//   logits[r][c] = T(b[c] + Σ_k h[r][k]·w[c][k])               (as the GEMM: blocks of 16
//                                                               products, compensated)
//   loss[r], and the shard's statistics into stats as shard_stats (Σ loss in double, the
//   correct count, the rows; added with `accumulate`)
//   with d_logits: d_logits[r][c] = T((softmax(logits[r])[c] - [c == label]) · grad_scale),
//     dw[c][k] = Σ_r d_logits[r][c]·h[r][k], db[c] = Σ_r d_logits[r][c],
//     dh[r][k] = T(Σ_c d_logits[r][c]·w[c][k]) where h[r][k] > 0, else 0 (h is a ReLU's
//     output: its backward is here too), and dh_bias[k] = Σ_r dh[r][k] (the bias gradient
//     of the layer whose ReLU made h)
// Every value the unfused operations round to T is rounded to T here, at the same place.
//
// Launch: one block of HEAD_THREADS (512) per HEAD_ROWS (8) rows, dynamic shared memory for
// the block's rows of h and of dh, all of w and the rows' logits (head_shared_floats; the
// host keeps it under 48 KiB and the rows at most HEAD_MAX_PITCH: classes ≤ 32, hidden up to
// 144). Rows are padded to a multiple of 16 floats plus four (head_pitch; zeros past hidden):
// the logits' dot products take whole blocks of 16 in 4-float shared loads, two blocks in
// flight, and eight lanes of a load reading eight classes' rows hit 32 different banks. Loops
// over the block's rows run over all HEAD_ROWS (rows past the batch are zero) and unroll.
// Then the softmax, one warp per row; dh, a thread per column for two rows, its classes'
// weights read once; and the block's rows added into its share of dw, db and dh_bias, an
// element a thread at a time. With more than one block, each writes its share and its
// statistics to the scratch area and the last to finish adds them in block order
// (split_sum.cuh): the same bits on every run. At LeNet's batch 256: 32 blocks; FLOPs
// 3·2·256·10·128 = 2 M, bytes ~200 KB (h read, dh written, w per block). The kernel is a
// chain of short dependent steps, so its time follows the instructions of a block's longest
// warp: on an H100 (ncu, one fp32 step) 14.8 µs at 8 rows a block, 18.6 at 16 and 20.4 at 32.
#include "split_sum.cuh"

#define HEAD_ROWS 8
#define HEAD_THREADS 512
#define HEAD_MAX_PITCH 160  // a staged row's floats at most (a multiple of 32): hidden ≤ 144

// A staged row's floats: hidden rounded up to a multiple of 16 (the dot products' blocks,
// zeros past hidden), plus 4.
__host__ __device__ __forceinline__ int head_pitch(int hidden) { return (hidden + 15) / 16 * 16 + 4; }

// Floats of dynamic shared memory a block of softmax_head uses.
__host__ __device__ __forceinline__ int head_shared_floats(int hidden, int classes) {
    return (2 * HEAD_ROWS + classes) * head_pitch(hidden) + HEAD_ROWS * classes;
}

// Element e of a block's share (dw, then db, then dh_bias) to its place.
__device__ __forceinline__ void head_result(float* __restrict__ dw, float* __restrict__ db,
                                            float* __restrict__ dh_bias, int hidden, int classes, int e, float s) {
    if (e < classes * hidden) dw[e] = s;
    else if (e < classes * hidden + classes) db[e - classes * hidden] = s;
    else dh_bias[e - classes * hidden - classes] = s;
}

// Σ a[k]·b[k] over one block of 16 floats (4 float4s from q0), into a fresh register.
__device__ __forceinline__ float head_dot16(const float4* __restrict__ a, const float4* __restrict__ b, int q0) {
    float p = 0.0f;
    SIMT_UNROLL
    for (int q = q0; q < q0 + 4; ++q) {
        const float4 x = a[q], y = b[q];
        p = fmaf(x.x, y.x, p);
        p = fmaf(x.y, y.y, p);
        p = fmaf(x.z, y.z, p);
        p = fmaf(x.w, y.w, p);
    }
    return p;
}

template <class T>
__device__ __forceinline__ void softmax_head(const T* __restrict__ h, const T* __restrict__ w,
                                             const float* __restrict__ b, const unsigned char* __restrict__ labels,
                                             T* __restrict__ logits, float* __restrict__ loss,
                                             float* __restrict__ stats, int accumulate, T* __restrict__ d_logits,
                                             float* __restrict__ dw, float* __restrict__ db, T* __restrict__ dh,
                                             float* __restrict__ dh_bias, int rows, int hidden, int classes, float grad_scale,
                                             const float* __restrict__ grad_scale_at, float* __restrict__ scratch,
                                             int* __restrict__ counters) {
    SIMT_DYNAMIC_SHARED(float, head_shared);
    __shared__ double row_loss[HEAD_ROWS];
    __shared__ int row_correct[HEAD_ROWS];
    const int pitch = head_pitch(hidden), blocks16 = (hidden + 15) / 16;
    float* hs = head_shared;                          // [HEAD_ROWS][pitch]
    float* ws = hs + HEAD_ROWS * pitch;               // [classes][pitch]
    float* zs = ws + classes * pitch;                 // [HEAD_ROWS][classes]: logits, then their gradient
    float* ds = zs + HEAD_ROWS * classes;             // [HEAD_ROWS][pitch]: dh, as T rounds it
    const int r0 = blockIdx.x * HEAD_ROWS, nr = min(HEAD_ROWS, rows - r0);
    const int tid = threadIdx.x, lane = tid % 32;
    const bool grad = d_logits != nullptr;
    if (grad && grad_scale_at) grad_scale = *grad_scale_at;

    // The block's rows of h, then all of w (hs and ws are one array), zero past hidden and
    // past the last row: a warp per row, a row's loads in flight together.
    for (int i = tid / 32; i < HEAD_ROWS + classes; i += HEAD_THREADS / 32) {
        float v[HEAD_MAX_PITCH / 32];
        SIMT_UNROLL
        for (int u = 0; u < HEAD_MAX_PITCH / 32; ++u) {
            const int k = lane + 32 * u;
            v[u] = 0.0f;
            if (k < hidden) {
                if (i < nr) v[u] = (float)h[(long long)(r0 + i) * hidden + k];
                else if (i >= HEAD_ROWS) v[u] = (float)w[(i - HEAD_ROWS) * hidden + k];
            }
        }
        SIMT_UNROLL
        for (int u = 0; u < HEAD_MAX_PITCH / 32; ++u)
            if (lane + 32 * u < pitch) hs[i * pitch + lane + 32 * u] = v[u];
    }
    __syncthreads();

    // Logits: blocks of 16 products, each into a fresh register (two in flight), added with
    // compensation in order.
    for (int e = tid; e < nr * classes; e += HEAD_THREADS) {
        const int i = e / classes, c = e % classes;
        const float4* hr = reinterpret_cast<const float4*>(hs + i * pitch);
        const float4* wr = reinterpret_cast<const float4*>(ws + c * pitch);
        CompensatedSum sum;
        for (int j = 0; j < blocks16; j += 2) {
            const float p0 = head_dot16(hr, wr, 4 * j), p1 = j + 1 < blocks16 ? head_dot16(hr, wr, 4 * j + 4) : 0.0f;
            sum.add(p0);
            if (j + 1 < blocks16) sum.add(p1);
        }
        const T z = (T)(sum.total() + b[c]);
        logits[(long long)(r0 + i) * classes + c] = z;
        zs[i * classes + c] = (float)z;
    }
    __syncthreads();

    // Softmax cross-entropy: one warp per row, as softmax_cross_entropy.
    for (int i = tid / 32; i < HEAD_ROWS; i += HEAD_THREADS / 32) {
        if (i >= nr) {  // a row past the batch: zero gradient, so that sums over all HEAD_ROWS rows skip it
            if (lane < classes) zs[i * classes + lane] = 0.0f;
            if (lane == 0) row_loss[i] = 0.0, row_correct[i] = 0;
            continue;
        }
        const int label = labels[r0 + i];
        const float* z = zs + i * classes;
        float best = __int_as_float(0xff800000);  // -inf
        int arg = classes;
        if (lane < classes) {
            const float v = z[lane];
            if (v > best || (v != v && best == best)) best = v, arg = lane;
        }
        for (int off = 16; off > 0; off >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, off);
            const int oa = __shfl_xor_sync(0xffffffffu, arg, off);
            if (ob > best || (ob == best && oa < arg) || (ob != ob && best == best)) best = ob, arg = oa;
        }
        float sum = lane < classes ? expf(z[lane] - best) : 0.0f;
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        const bool valid = label < classes;
        const float zl = valid ? z[label] : 0.0f;
        __syncwarp();  // every lane has read this row's logits before they are overwritten
        if (grad && lane < classes) {
            const float p = expf(z[lane] - best) / sum;
            const T d = (T)((p - (lane == label ? 1.0f : 0.0f)) * grad_scale);
            d_logits[(long long)(r0 + i) * classes + lane] = d;
            zs[i * classes + lane] = (float)d;
        }
        if (lane == 0) {
            const float l = valid ? best + logf(sum) - zl : __int_as_float(0x7fc00000);
            loss[r0 + i] = l;
            row_loss[i] = (double)l;
            row_correct[i] = valid && arg == label;
        }
    }
    __syncthreads();

    // dh: a thread per column k for rows g, g + 4, ..., g + 28 (g = tid / 128), its classes'
    // weights read once for the eight.
    const int elems = grad ? classes * hidden + classes + hidden : 0;
    if (grad) {
        constexpr int GROUPS = HEAD_THREADS / 128, PER = HEAD_ROWS / GROUPS;
        const int g = tid / 128;
        for (int k = tid % 128; k < hidden; k += 128) {
            float s[PER];
            SIMT_UNROLL
            for (int u = 0; u < PER; ++u) s[u] = 0.0f;
            for (int c = 0; c < classes; ++c) {
                const float wk = ws[c * pitch + k];
                SIMT_UNROLL
                for (int u = 0; u < PER; ++u) s[u] = fmaf(zs[(g + GROUPS * u) * classes + c], wk, s[u]);
            }
            SIMT_UNROLL
            for (int u = 0; u < PER; ++u) {
                const int i = g + GROUPS * u;
                const T d = hs[i * pitch + k] > 0.0f ? (T)s[u] : (T)0.0f;
                if (i < nr) dh[(long long)(r0 + i) * hidden + k] = d;
                ds[i * pitch + k] = i < nr ? (float)d : 0.0f;
            }
        }
        __syncthreads();
    }

    // The block's share of dw, then db, then dh_bias: its rows added in order, over all
    // HEAD_ROWS rows (those past the batch are zero in zs, hs and ds) so that the loops unroll.
    const int splits = gridDim.x;
    float* partial_stats = scratch;                  // [splits][3]: Σ loss (hi, lo), correct
    float* partials = scratch + 3 * splits;          // [splits + groups][elems]
    for (int e = tid; e < elems; e += HEAD_THREADS) {
        float s = 0.0f;
        if (e < classes * hidden) {
            const int c = e / hidden, k = e % hidden;
            SIMT_UNROLL
            for (int i = 0; i < HEAD_ROWS; ++i) s = fmaf(zs[i * classes + c], hs[i * pitch + k], s);
        } else if (e < classes * hidden + classes) {
            SIMT_UNROLL
            for (int i = 0; i < HEAD_ROWS; ++i) s += zs[i * classes + (e - classes * hidden)];
        } else {
            SIMT_UNROLL
            for (int i = 0; i < HEAD_ROWS; ++i) s += ds[i * pitch + (e - classes * hidden - classes)];
        }
        if (splits == 1) head_result(dw, db, dh_bias, hidden, classes, e, s);
        else partials[(long long)blockIdx.x * elems + e] = s;
    }
    // The block's statistics, in row order.
    double block_loss = 0.0;
    int block_correct = 0;
    if (tid == 0) {
        for (int i = 0; i < nr; ++i) block_loss += row_loss[i], block_correct += row_correct[i];
    }
    auto write_stats = [&](double sum, int right) {
        const float count = (float)rows;
        if (accumulate) {
            stats[0] += (float)sum;
            stats[1] += (float)right;
            stats[2] += count;
        } else {
            stats[0] = (float)sum;
            stats[1] = (float)right;
            stats[2] = count;
        }
    };
    if (splits == 1) {
        if (tid == 0) write_stats(block_loss, block_correct);
        return;
    }
    if (tid == 0) {
        const float hi = (float)block_loss;
        partial_stats[blockIdx.x * 3] = hi;
        partial_stats[blockIdx.x * 3 + 1] = (float)(block_loss - (double)hi);
        partial_stats[blockIdx.x * 3 + 2] = (float)block_correct;
    }
    split_reduce(counters, 0, blockIdx.x, splits, [&](int first, int count, int into) {
        split_sum_each<4>(partials, elems, first, count, tid, elems, HEAD_THREADS,
                          [](int e) -> long long { return e; }, [&](int e, float s) {
                              if (into >= 0) partials[(long long)into * elems + e] = s;
                              else head_result(dw, db, dh_bias, hidden, classes, e, s);
                          });
        if (into < 0 && tid == 0) {
            double sum = 0.0;
            int right = 0;
            for (int s = 0; s < splits; ++s) {
                sum += (double)__ldcg(partial_stats + s * 3) + (double)__ldcg(partial_stats + s * 3 + 1);
                right += (int)__ldcg(partial_stats + s * 3 + 2);
            }
            write_stats(sum, right);
        }
    });
}

NANODDP_ENTRY_EACH_TYPE(softmax_head, (512, 1),
    (const T* __restrict__ h, const T* __restrict__ w, const float* __restrict__ b,
     const unsigned char* __restrict__ labels, T* __restrict__ logits, float* __restrict__ loss,
     float* __restrict__ stats, int accumulate, T* __restrict__ d_logits_or_null, float* __restrict__ dw_or_null,
     float* __restrict__ db_or_null, T* __restrict__ dh_or_null, float* __restrict__ dh_bias_or_null, int rows,
     int hidden, int classes,
     float grad_scale, const float* __restrict__ grad_scale_at_or_null, float* __restrict__ scratch,
     int* __restrict__ counters),
    (h, w, b, labels, logits, loss, stats, accumulate, d_logits_or_null, dw_or_null, db_or_null, dh_or_null,
     dh_bias_or_null, rows, hidden, classes, grad_scale, grad_scale_at_or_null, scratch, counters))
