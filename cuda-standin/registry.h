// registry.h — the kernels compiled into the stand-in for the SIMT executor. The build script
// generates the table (standin_registry.cpp in OUT_DIR) from the same parse of kernels/*.cu
// that types the Rust launchers, so the two cannot drift.
#pragma once

#include "../kernels/simt_api.h"

namespace standin {

struct RegisteredKernel {
    const char* module;
    const char* name;
    simt_entry_fn entry;
    // As KernelInfo::params: 'r' / 'w' pointers, '1' '2' '4' '8' values.
    const char* params;
    // __launch_bounds__ maximum threads per block, 0 if none.
    unsigned max_threads;
};

extern const RegisteredKernel standin_kernels[];
extern const unsigned standin_kernel_count;

}  // namespace standin
