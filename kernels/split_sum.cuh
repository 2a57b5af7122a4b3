// split_sum.cuh — the fixed-order sum of a split reduction's partial results: conv.cu's
// filter gradient (split over slices of the batch) and gemm.cu's split K. The block that
// finishes a tile last adds, for each of its elements, the partials the tile's blocks wrote:
// slot t at partials[at + t·stride], t = 0..n-1, in slot order with a compensated (Kahan)
// sum, so the result does not depend on which block finished last.
//
// The loads go eight at a time, past the L1 (__ldcg: other blocks wrote them before their
// fence), before any is added: eight in flight where a load per addition would each wait a
// full L2 round trip (the last block of a tile reads every partial of the tile alone).
#pragma once
#include "simt.cuh"

#define SPLIT_SUM_BATCH 8

__device__ __forceinline__ float split_sum(const float* __restrict__ partials, long long at, long long stride,
                                           int n) {
    float sum = 0.0f, carry = 0.0f;
    for (int t0 = 0; t0 < n; t0 += SPLIT_SUM_BATCH) {
        float v[SPLIT_SUM_BATCH];
        SIMT_UNROLL
        for (int u = 0; u < SPLIT_SUM_BATCH; ++u)
            v[u] = t0 + u < n ? __ldcg(partials + at + (long long)(t0 + u) * stride) : 0.0f;
        SIMT_UNROLL
        for (int u = 0; u < SPLIT_SUM_BATCH; ++u) {
            if (t0 + u >= n) break;
            const float y = v[u] - carry;
            const float t = sum + y;
            carry = (t - sum) - y;
            sum = t;
        }
    }
    return sum - carry;
}
