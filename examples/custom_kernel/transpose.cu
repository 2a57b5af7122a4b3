// transpose.cu — a kernel that is not part of nanoddp: a matrix transpose through shared
// memory, the classic example of why __syncthreads exists. `cargo run --example
// custom_kernel` builds it for the SIMT emulator at run time and tests it there.
//
// Launch shape: block 32x8 threads, grid ceil(cols/32) x ceil(rows/32); each block moves a
// 32x32 tile: reads rows of `in` (coalesced), writes rows of `out` (coalesced) by going
// through a 32x33 shared tile (the +1 column avoids shared-memory bank conflicts).
// Moves 2·rows·cols·4 bytes, no FLOPs.
#include "simt.cuh"

#define TILE 32
#define ROWS_PER_PASS 8

// out[c][r] = in[r][c] for a rows x cols row-major matrix, one 32x32 tile per block. The
// two flags exist to make the broken variants below: `barrier` is the __syncthreads between
// writing the tile and reading it across threads, `checked` the bounds checks.
template <bool barrier, bool checked>
__device__ void transpose_tile(const float* in, float* out, int rows, int cols) {
    __shared__ float tile[TILE][TILE + 1];
    int x = blockIdx.x * TILE + threadIdx.x;  // column of `in`
    int y = blockIdx.y * TILE + threadIdx.y;  // row of `in`
    for (int j = 0; j < TILE; j += ROWS_PER_PASS) {
        if (!checked || (x < cols && y + j < rows)) tile[threadIdx.y + j][threadIdx.x] = in[(y + j) * cols + x];
    }
    if (barrier) __syncthreads();  // every element of the tile written before any is read across threads
    x = blockIdx.y * TILE + threadIdx.x;  // column of `out` = row of `in`
    y = blockIdx.x * TILE + threadIdx.y;  // row of `out` = column of `in`
    for (int j = 0; j < TILE; j += ROWS_PER_PASS) {
        if (!checked || (x < rows && y + j < cols)) out[(y + j) * rows + x] = tile[threadIdx.x][threadIdx.y + j];
    }
}

extern "C" __global__ void transpose(const float* in, float* out, int rows, int cols) {
    transpose_tile<true, true>(in, out, rows, cols);
}

// The same without the barrier: a thread may read a tile element before the thread that
// owns it has written it. Often right on a GPU by luck of scheduling; the emulator's lane
// orders and poisoned shared memory make it fail every time.
extern "C" __global__ void transpose_missing_barrier(const float* in, float* out, int rows, int cols) {
    transpose_tile<false, true>(in, out, rows, cols);
}

// The same without the bounds checks: fine when both sizes are multiples of 32, out of
// bounds otherwise. The emulator puts a guard page after every allocation, so the first
// read past the end of `in` is reported with the block and thread.
extern "C" __global__ void transpose_unchecked(const float* in, float* out, int rows, int cols) {
    transpose_tile<true, false>(in, out, rows, cols);
}
