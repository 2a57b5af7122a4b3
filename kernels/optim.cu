// optim.cu — the optimizer step over one flat parameter buffer, with mixed-precision support.
//
// A mixed-precision step is two launches over the flat buffers (a global "is every gradient
// finite?" must be known before any weight changes, and a grid has no barrier):
//   1. grad_check_{f32,f16,bf16}: sets *found_nonfinite = 1 if any gradient is inf or NaN
//      (an overflow under the current loss scale); grid-stride, 2 or 4 B read per element.
//   2. sgd_step_{f32,f16,bf16}: if *found_nonfinite is set, returns without touching
//      anything (the step is skipped, and under fp16 the trainer lowers the loss scale);
//      otherwise, per element, with f32 gradients:
//          g  = grad · inv_scale + weight_decay · w          (unscale; L2 decay, as PyTorch)
//          v  = momentum · v + g,  g = v                      (only with a momentum buffer)
//          w -= lr · g                                        (fp32 master weights)
//          w_copy = T(w), rounded to nearest even             (optional: next forward's copy
//                                                              in the run's storage type T)
//      grid-stride; bytes per element: 4 (w) ×2 + 4 (grad) + v (4) ×2 + w_copy (2).
// The trainer updates all its tensors in one launch of each: grad_check_tensors and
// sgd_step_tensors_T take a table in device memory, TENSOR_WORDS words per tensor (w, grad,
// velocity or 0, w_copy or 0, n), written once for buffers kept for the run; the grid's y is
// the tensor, its x strides over that tensor's elements as above.
// fp32 training uses step 2 alone with inv_scale = 1 and no flag; bf16 training checks
// (step 1) without scaling, since bf16 has f32's range. Given lr_at / inv_scale_at, the
// kernel reads those from device memory as it runs (a training step's scalars:
// kernels/step.cu), so a captured graph sees each step's values.
#include "simt.cuh"

template <class G>
__device__ __forceinline__ void grad_check(const G* __restrict__ grad, unsigned long long n,
                                           int* __restrict__ found_nonfinite) {
    bool bad = false;
    SIMT_GRID_STRIDE_LOOP(i, n) {
        float g = (float)grad[i];
        bad |= !(g - g == 0.0f);  // inf - inf and NaN - NaN are NaN
    }
    if (bad) atomicExch(found_nonfinite, 1);
}

template <class T>
__device__ __forceinline__ void sgd_step(float* __restrict__ w, const float* __restrict__ grad,
                                         float* __restrict__ velocity, T* __restrict__ w_copy,
                                         unsigned long long n, float lr, float inv_scale, float momentum,
                                         float weight_decay, const float* __restrict__ lr_at,
                                         const float* __restrict__ inv_scale_at,
                                         const int* __restrict__ found_nonfinite) {
    if (found_nonfinite && *found_nonfinite) return;
    if (lr_at) lr = *lr_at;
    if (inv_scale_at) inv_scale = *inv_scale_at;
    SIMT_GRID_STRIDE_LOOP(i, n) {
        float g = fmaf(weight_decay, w[i], grad[i] * inv_scale);
        if (velocity) {
            g = fmaf(momentum, velocity[i], g);
            velocity[i] = g;
        }
        float updated = fmaf(-lr, g, w[i]);
        w[i] = updated;
        if (w_copy) w_copy[i] = (T)updated;
    }
}

NANODDP_ENTRY_EACH_TYPE(grad_check, (256),
    (const T* __restrict__ grad, unsigned long long n, int* __restrict__ found_nonfinite),
    (grad, n, found_nonfinite))

// T is the weight copy's type (the run's storage type); everything else is f32.
NANODDP_ENTRY_EACH_TYPE(sgd_step, (256),
    (float* __restrict__ w, const float* __restrict__ grad, float* __restrict__ velocity_or_null,
     T* __restrict__ w_copy_or_null, unsigned long long n, float lr, float inv_scale,
     float momentum, float weight_decay, const float* __restrict__ lr_at_or_null,
     const float* __restrict__ inv_scale_at_or_null, const int* __restrict__ found_nonfinite_or_null),
    (w, grad, velocity_or_null, w_copy_or_null, n, lr, inv_scale, momentum, weight_decay,
     lr_at_or_null, inv_scale_at_or_null, found_nonfinite_or_null))

// Words per tensor in the tables below: w, grad, velocity (0: none), w_copy (0: none), n.
#define TENSOR_WORDS 5

// grad_check over tensor blockIdx.y of `table` (its f32 gradient).
extern "C" __global__ void __launch_bounds__(256)
    grad_check_tensors(const unsigned long long* __restrict__ table, int* __restrict__ found_nonfinite) {
    const unsigned long long* t = table + TENSOR_WORDS * blockIdx.y;
    grad_check<float>((const float*)t[1], t[4], found_nonfinite);
}

// sgd_step over tensor blockIdx.y of `table`.
template <class T>
__device__ __forceinline__ void sgd_step_tensors(const unsigned long long* __restrict__ table, float lr,
                                                 float inv_scale, float momentum, float weight_decay,
                                                 const float* __restrict__ lr_at,
                                                 const float* __restrict__ inv_scale_at,
                                                 const int* __restrict__ found_nonfinite) {
    const unsigned long long* t = table + TENSOR_WORDS * blockIdx.y;
    sgd_step<T>((float*)t[0], (const float*)t[1], (float*)t[2], (T*)t[3], t[4], lr, inv_scale, momentum,
                weight_decay, lr_at, inv_scale_at, found_nonfinite);
}

NANODDP_ENTRY_EACH_TYPE(sgd_step_tensors, (256),
    (const unsigned long long* __restrict__ table, float lr, float inv_scale, float momentum,
     float weight_decay, const float* __restrict__ lr_at_or_null,
     const float* __restrict__ inv_scale_at_or_null, const int* __restrict__ found_nonfinite_or_null),
    (table, lr, inv_scale, momentum, weight_decay, lr_at_or_null, inv_scale_at_or_null,
     found_nonfinite_or_null))
