// loss.cu — fused softmax + cross-entropy, forward and backward in one pass, and accuracy.
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
