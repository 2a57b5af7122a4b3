// optim.cu — the optimizer step over one flat parameter buffer, with mixed-precision support.
//
// A mixed-precision step is two launches over the flat buffers (a global "is every gradient
// finite?" must be known before any weight changes, and a grid has no barrier):
//   1. grad_check_{f32,f16}: sets *found_nonfinite = 1 if any gradient is inf or NaN
//      (an overflow under the current loss scale); grid-stride, 2 or 4 B read per element.
//   2. sgd_step_{f32,f16}grad: if *found_nonfinite is set, returns without touching anything
//      (the step is skipped and the trainer lowers the loss scale); otherwise, per element:
//          g  = grad · inv_scale + weight_decay · w          (unscale; L2 decay, as PyTorch)
//          v  = momentum · v + g,  g = v                      (only with a momentum buffer)
//          w -= lr · g                                        (fp32 master weights)
//          w_half = half(w)                                   (optional: next forward's copy)
//      grid-stride; bytes per element: 4 (w) ×2 + grad (2 or 4) + v (4) ×2 + w_half (2).
// fp32 training uses step 2 alone with inv_scale = 1 and no flag.
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

template <class G>
__device__ __forceinline__ void sgd_step(float* __restrict__ w, const G* __restrict__ grad,
                                         float* __restrict__ velocity, __half* __restrict__ w_half,
                                         unsigned long long n, float lr, float inv_scale, float momentum,
                                         float weight_decay, const int* __restrict__ found_nonfinite) {
    if (found_nonfinite && *found_nonfinite) return;
    SIMT_GRID_STRIDE_LOOP(i, n) {
        float g = fmaf(weight_decay, w[i], (float)grad[i] * inv_scale);
        if (velocity) {
            g = fmaf(momentum, velocity[i], g);
            velocity[i] = g;
        }
        float updated = fmaf(-lr, g, w[i]);
        w[i] = updated;
        if (w_half) w_half[i] = __float2half_rn(updated);
    }
}

NANODDP_ENTRY_F32_F16(grad_check,
                      (const T* __restrict__ grad, unsigned long long n, int* __restrict__ found_nonfinite),
                      (grad, n, found_nonfinite))

// T is the gradient's type; weights, velocity and the half weight copy have theirs.
NANODDP_ENTRY_F32_F16(sgd_step,
                      (float* __restrict__ w, const T* __restrict__ grad, float* __restrict__ velocity_or_null,
                       __half* __restrict__ w_half_or_null, unsigned long long n, float lr, float inv_scale,
                       float momentum, float weight_decay, const int* __restrict__ found_nonfinite_or_null),
                      (w, grad, velocity_or_null, w_half_or_null, n, lr, inv_scale, momentum, weight_decay,
                       found_nonfinite_or_null))
