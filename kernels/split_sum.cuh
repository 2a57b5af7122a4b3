// split_sum.cuh — the fixed-order sum of a split reduction's partial results: conv.cu's and
// conv_direct.cu's filter gradients (split over slices of the batch) and loss.cu's head
// (split over blocks of rows); and CompensatedSum, the running Kahan sum the kernels share.
//
// A tile's S blocks each write a partial tile into slot s of the scratch area (level 1).
// Then, past 16 slots, in two levels so that no block reads more than about √S partials per
// element: the slots form groups of G = ⌈√S⌉ consecutive ones; the last block of a group to finish (an
// int counter per group and tile) adds the group's slots, in order, into a level-2 slot
// after the S level-1 ones; the last group of the tile to finish (a counter per tile) adds
// the level-2 slots in order and writes the results. Every addition is compensated (Kahan)
// and in slot order, so the result never depends on which block finished when. (One level,
// the last block of conv1's filter gradient read 256 partials per element alone.)
//
// A split of S slots takes S + groups slots of the scratch area (groups = ⌈S / G⌉) and
// groups + 1 counters per tile: counters[tile·(groups + 1) + g] for group g and
// counters[tile·(groups + 1) + groups] for the tile, each reset by the block that read its
// final count, so they are zero between launches. The host sizes splits by the same
// arithmetic (split_fits in src/backend/kernel/ops.rs).
#pragma once
#include "simt.cuh"

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

#define SPLIT_SUM_BATCH 8

// Σ partials[at + t·stride] for t in [first, first + n), in order, compensated. The loads go
// eight at a time, past the L1 (__ldcg: other blocks wrote them before their fence), before
// any is added: eight in flight where a load per addition would each wait an L2 round trip.
__device__ __forceinline__ float split_sum(const float* __restrict__ partials, long long at, long long stride,
                                           int first, int n) {
    float sum = 0.0f, carry = 0.0f;
    for (int t0 = 0; t0 < n; t0 += SPLIT_SUM_BATCH) {
        float v[SPLIT_SUM_BATCH];
        SIMT_UNROLL
        for (int u = 0; u < SPLIT_SUM_BATCH; ++u)
            v[u] = t0 + u < n ? __ldcg(partials + at + (long long)(first + t0 + u) * stride) : 0.0f;
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

// split_sum for the elements e = first_e, first_e + step, ... below count, E of them at a
// time so that their loads are in flight together (a thread's elements would otherwise wait
// an L2 round trip per batch each, one after another): place(e) is element e's offset in a
// slot, or -1 to skip it; done(e, sum) takes its sum. Each sum is split_sum's, bit for bit.
template <int E, class Place, class Done>
__device__ __forceinline__ void split_sum_each(const float* __restrict__ partials, long long stride, int first,
                                               int n, int first_e, int count, int step, Place place, Done done) {
    for (int e0 = first_e; e0 < count; e0 += E * step) {
        long long at[E];
        float sum[E], carry[E];
        SIMT_UNROLL
        for (int u = 0; u < E; ++u) {
            const int e = e0 + u * step;
            at[u] = e < count ? place(e) : -1;
            sum[u] = carry[u] = 0.0f;
        }
        for (int t0 = 0; t0 < n; t0 += SPLIT_SUM_BATCH) {
            float v[E][SPLIT_SUM_BATCH];
            SIMT_UNROLL
            for (int u = 0; u < E; ++u)
                SIMT_UNROLL
                for (int b = 0; b < SPLIT_SUM_BATCH; ++b)
                    v[u][b] = (at[u] >= 0 && t0 + b < n)
                                  ? __ldcg(partials + at[u] + (long long)(first + t0 + b) * stride)
                                  : 0.0f;
            SIMT_UNROLL
            for (int u = 0; u < E; ++u)
                SIMT_UNROLL
                for (int b = 0; b < SPLIT_SUM_BATCH; ++b) {
                    if (t0 + b >= n) break;
                    const float y = v[u][b] - carry[u];
                    const float t = sum[u] + y;
                    carry[u] = (t - sum[u]) - y;
                    sum[u] = t;
                }
        }
        SIMT_UNROLL
        for (int u = 0; u < E; ++u)
            if (at[u] >= 0) done(e0 + u * step, sum[u] - carry[u]);
    }
}

// Slots per group: all of them (one level) up to SPLIT_ONE_LEVEL, where the second level's
// extra round trip costs more than it saves (measured on an H100 with split-K GEMMs of 2 to
// 13 ranges), else G = ⌈√S⌉.
#define SPLIT_ONE_LEVEL 16
__device__ __forceinline__ int split_group(int splits) {
    if (splits <= SPLIT_ONE_LEVEL) return splits;
    int g = 1;
    while (g * g < splits) ++g;
    return g;
}

// Whether this block is the last of `expected` to arrive at `counter` (then it resets it).
// Every thread of the block calls it, after the block's writes it must publish. One thread
// fences and counts for the block: the barrier orders every thread's writes before its fence
// (fences are cumulative in the PTX memory model, the pattern of CUTLASS's semaphore), and
// the last block's reads come after its fence and the barrier that follows: one fence a
// block, not one a thread.
__device__ __forceinline__ bool split_arrive_last(int* __restrict__ counter, int expected) {
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();  // the block's writes, then the count
        const int done = atomicAdd(counter, 1);
        last = done == expected - 1;
        if (last) {
            *counter = 0;     // ready for the next launch
            __threadfence();  // the other blocks' writes, before this block reads them
        }
    }
    __syncthreads();
    return last;
}

// After this block wrote slot `s` of `splits` for tile `tile`: the two levels above.
// `reduce(first, n, into)`, the kernel's loop over its tile's elements, adds slots
// [first, first + n) of each (split_sum) and stores the sum into slot `into` (level 2), or,
// with into < 0, as the element's result.
template <class Reduce>
__device__ __forceinline__ void split_reduce(int* __restrict__ counters, int tile, int s, int splits, Reduce reduce) {
    const int group = split_group(splits), groups = (splits + group - 1) / group;
    int* tile_counters = counters + tile * (groups + 1);
    const int g = s / group, first = g * group, n = min(group, splits - first);
    if (!split_arrive_last(tile_counters + g, n)) return;
    if (groups == 1) {
        reduce(0, splits, -1);
        return;
    }
    reduce(first, n, splits + g);
    if (!split_arrive_last(tile_counters + groups, groups)) return;
    reduce(splits, groups, -1);
}
