// step.cu — a training step's bookkeeping on the device, so that the host neither feeds a
// step nor waits for one: the batch gathered from the data set the device holds, the step's
// scalars (learning rate, loss scale) read and updated in device memory, and the shard's loss
// and accuracy summed where the host reads them a few steps late. Every value a step needs is
// in memory the kernels read when they run, not in their arguments, so the same launches
// captured once in a CUDA graph replay every step (a graph freezes arguments, not memory).
//
// gather_batch_T   x[i][p] = T(pixels[k][p] / 255), y[i] = labels[k], k = order[*batch·shard + i];
//                  given lr_table, the step's scalars too, as step_begin (a training step's
//                  first launch does both)
//     Launch: flat over n·image elements, 256-thread blocks, grid-stride. Bytes per pixel: 1
//     read, sizeof(T) written (plus 4 B of order and 1 B of label per image); memory-bound,
//     ~0.5 MB per 256-image fp32 batch. The division is IEEE's (correctly rounded, as the host
//     computes it), so every backend feeds the model the same bits. An index past the order
//     or the data set gives zeros and label 255 (out of range: the loss is NaN and the
//     trainer stops), never a read out of bounds.
// step_begin       lr = lr_table[*batch]; grad_scale = loss_scale / global; inv_scale = 1 / loss_scale
// step_end         the step's record (its statistics and the loss scale it ran with) into
//                  ring[*batch % slots], the loss scaler's update from the overflow flag
//                  (fp16), the flag cleared, *batch += 1
//     Launch: one thread each; a few dozen bytes. They exist so no host value enters a step.
// shard_stats      out = (Σ loss, correct, n), or += with `accumulate`; *correct = 0
//     Launch: one block of 256 threads. Each thread sums a strided slice in double, then a
//     fixed tree in shared memory: the same order on every run, so the same bits (an atomic
//     float sum would not be). n·4 B read; launch-bound.
#include "simt.cuh"

// The step's scalars (step_begin's work). A batch past the table gets a NaN learning rate:
// the weights turn NaN and the trainer reports it, instead of reading past the table.
__device__ __forceinline__ void begin_step(const float* __restrict__ lr_table, unsigned long long table_len,
                                           const unsigned int* __restrict__ batch,
                                           const float* __restrict__ loss_scale, float global, float* __restrict__ lr,
                                           float* __restrict__ grad_scale, float* __restrict__ inv_scale) {
    const unsigned b = *batch;
    *lr = b < table_len ? lr_table[b] : __int_as_float(0x7fc00000);
    const float s = *loss_scale;
    *grad_scale = s / global;
    *inv_scale = 1.0f / s;
}

template <class T>
__device__ __forceinline__ void gather_batch(const unsigned char* __restrict__ pixels,
                                             const unsigned char* __restrict__ labels,
                                             unsigned long long count, const unsigned int* __restrict__ order,
                                             unsigned long long order_len, const unsigned int* __restrict__ batch,
                                             int shard, int image, int n, T* __restrict__ x,
                                             unsigned char* __restrict__ y, const float* __restrict__ lr_table,
                                             unsigned long long table_len, const float* __restrict__ loss_scale,
                                             float global, float* __restrict__ lr, float* __restrict__ grad_scale,
                                             float* __restrict__ inv_scale) {
    if (lr_table && blockIdx.x == 0 && threadIdx.x == 0)
        begin_step(lr_table, table_len, batch, loss_scale, global, lr, grad_scale, inv_scale);
    const unsigned long long first = (unsigned long long)*batch * (unsigned)shard;
    SIMT_GRID_STRIDE_LOOP(e, (unsigned long long)n * (unsigned)image) {
        const unsigned long long i = e / (unsigned)image, p = e % (unsigned)image;
        const unsigned long long at = first + i;
        const unsigned long long k = at < order_len ? order[at] : count;
        if (k < count) {
            x[e] = (T)((float)pixels[k * (unsigned)image + p] / 255.0f);
            if (p == 0) y[i] = labels[k];
        } else {
            x[e] = (T)0.0f;
            if (p == 0) y[i] = 255;
        }
    }
}

NANODDP_ENTRY_EACH_TYPE(gather_batch, (256),
    (const unsigned char* __restrict__ pixels, const unsigned char* __restrict__ labels,
     unsigned long long count, const unsigned int* __restrict__ order, unsigned long long order_len,
     const unsigned int* __restrict__ batch, int shard, int image, int n, T* __restrict__ x,
     unsigned char* __restrict__ y, const float* __restrict__ lr_table_or_null, unsigned long long table_len,
     const float* __restrict__ loss_scale_or_null, float global, float* __restrict__ lr_or_null,
     float* __restrict__ grad_scale_or_null, float* __restrict__ inv_scale_or_null),
    (pixels, labels, count, order, order_len, batch, shard, image, n, x, y, lr_table_or_null, table_len,
     loss_scale_or_null, global, lr_or_null, grad_scale_or_null, inv_scale_or_null))

// One thread: begin_step.
extern "C" __global__ void __launch_bounds__(32)
    step_begin(const float* __restrict__ lr_table, unsigned long long table_len,
               const unsigned int* __restrict__ batch, const float* __restrict__ loss_scale, float global,
               float* __restrict__ lr, float* __restrict__ grad_scale, float* __restrict__ inv_scale) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    begin_step(lr_table, table_len, batch, loss_scale, global, lr, grad_scale, inv_scale);
}

// One thread. With `clean` (fp16's dynamic loss scaling) the scale halves (not below 1) on an
// overflow and doubles after `growth_interval` clean steps in a row, as train::LossScaler.
extern "C" __global__ void __launch_bounds__(32)
    step_end(float* __restrict__ loss_scale, int* __restrict__ clean_or_null, int* __restrict__ found_or_null,
             int growth_interval, unsigned int* __restrict__ batch, const float* __restrict__ current,
             float* __restrict__ ring, int slots) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const unsigned b = *batch;
    float* record = ring + (b % (unsigned)slots) * 4;
    for (int k = 0; k < 3; ++k) record[k] = current[k];
    record[3] = *loss_scale;
    *batch = b + 1;
    if (found_or_null) {
        if (clean_or_null) {
            if (*found_or_null != 0) {
                *loss_scale = fmaxf(*loss_scale / 2.0f, 1.0f);
                *clean_or_null = 0;
            } else if (++*clean_or_null == growth_interval) {
                *loss_scale *= 2.0f;
                *clean_or_null = 0;
            }
        }
        *found_or_null = 0;
    }
}

extern "C" __global__ void __launch_bounds__(256)
    shard_stats(const float* __restrict__ loss, int n, int* __restrict__ correct, float* __restrict__ out,
                int accumulate) {
    __shared__ double partial[256];
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += 256) s += (double)loss[i];
    partial[threadIdx.x] = s;
    __syncthreads();
    for (int stride = 128; stride > 0; stride >>= 1) {
        if ((int)threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const float sum = (float)partial[0], right = (float)*correct, count = (float)n;
        if (accumulate) {
            out[0] += sum;
            out[1] += right;
            out[2] += count;
        } else {
            out[0] = sum;
            out[1] = right;
            out[2] = count;
        }
        *correct = 0;
    }
}
