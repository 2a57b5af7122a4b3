// simt.cuh — the one header every kernels/*.cu includes.
//
// Under nvcc or NVRTC (__CUDACC__ defined) this is plain CUDA: it pulls in the fp16 and
// wmma headers and nothing else, so kernels read exactly as CUDA C++.
//
// Under a host C++ compiler it will supply the SIMT emulation layer (threadIdx & co,
// barriers, warp intrinsics, __half, wmma) so that the same kernel text runs on the CPU.
// That half is built by the SIMT emulator work; until then a host build stops here with
// a clear message instead of a wall of undefined identifiers.
#pragma once

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#include <mma.h>
#else
#error "simt.cuh: the host (SIMT emulator) build of the kernels is not available yet"
#endif

// Grid-stride loop over [0, n): every kernel that walks a flat buffer uses this shape so
// that any grid size is correct, including a grid smaller than the data.
#define SIMT_GRID_STRIDE_LOOP(i, n)                                                         \
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;  \
         i < (n); i += (unsigned long long)blockDim.x * gridDim.x)
