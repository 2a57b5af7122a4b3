// executor.h — how the CUDA stand-in runs a kernel: the one interface between the driver
// model (streams, memory, access rules: standin.cpp) and whatever executes device code.
//
// Two executors exist: the SIMT emulator (simt_executor.cpp) runs the kernels' CUDA C++
// source compiled for the host, looked up by name in the registry the build script generates;
// the PTX executor (ptx_executor.cpp) runs the PTX the module was loaded with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_abi.h"

namespace standin {

// One kernel an executor can run, as found in a module image.
struct KernelInfo {
    std::string name;
    // One character per parameter, in order: 'r' read-only pointer, 'w' pointer the kernel
    // may write, '1' '2' '4' '8' a value of that many bytes.
    std::string params;
    // __launch_bounds__ maximum threads per block, or 0 when the kernel declares none.
    unsigned max_threads = 0;
    // Executor-private handle.
    const void* handle = nullptr;
};

struct LaunchShape {
    unsigned grid[3];
    unsigned block[3];
    unsigned shared_bytes;
    // Run each block's threads last to first (the PTX executor only): a kernel whose result
    // depends on the order (a missing barrier) shows it as a difference between two runs.
    bool reverse_lanes = false;
    // Count what the launch does (the PTX executor only; LaunchOutcome::profile): its warps
    // then issue one instruction at a time, as a GPU's schedulers do.
    bool profile = false;
};

// What one launch did, counted by the PTX executor warp by warp (docs/kernel-profile.md says
// how each figure is counted). Instructions are PTX instructions: ptxas's SASS differs.
struct LaunchProfile {
    std::uint64_t warp_instructions = 0;    // issued, predicated-off lanes or not
    std::uint64_t thread_instructions = 0;  // lanes that executed (predicate on)
    std::uint64_t ffma_warp = 0;            // warp instructions that are f32 fma / mad
    std::uint64_t flops_f32 = 0, flops_f16 = 0, flops_f64 = 0, flops_tensor = 0;  // an FMA is 2
    std::uint64_t global_load_requests = 0, global_load_sectors = 0;
    std::uint64_t global_store_requests = 0, global_store_sectors = 0;
    std::uint64_t global_atomic_requests = 0, global_atomic_sectors = 0;
    std::uint64_t shared_load_requests = 0, shared_load_wavefronts = 0, shared_load_ideal = 0;
    std::uint64_t shared_store_requests = 0, shared_store_wavefronts = 0, shared_store_ideal = 0;
    std::uint64_t local_requests = 0;
    std::uint64_t barriers = 0;  // bar.sync, per warp
    std::uint64_t shuffles = 0;  // shfl, per warp
    std::uint64_t branches = 0, divergent_branches = 0;
    std::uint64_t read_footprint_sectors = 0, write_footprint_sectors = 0;  // distinct 32-byte sectors
};

struct LaunchOutcome {
    // CUDA_SUCCESS, or the driver error the launch turns into (sticky ones included).
    CUresult code = CUDA_SUCCESS;
    std::string message;
    // Filled when LaunchShape::profile asked for it and the executor counts (the PTX one).
    bool profiled = false;
    LaunchProfile profile;
};

class Executor {
public:
    virtual ~Executor() = default;
    // For diagnostics: "SIMT emulator", "PTX executor".
    virtual const char* name() const = 0;
    // The kernels of `image` (a fatbin, cubin or PTX text of `size` bytes) this executor
    // can run. Kernels the image holds but the executor cannot run are simply absent, and
    // cuModuleGetFunction then reports CUDA_ERROR_NOT_FOUND for them, naming the executor.
    virtual std::vector<KernelInfo> kernels_in(const unsigned char* image, std::size_t size) = 0;
    // Runs one launch to completion on the calling thread. `params` is CUDA's kernelParams
    // array (one pointer per argument). `timeout_s` bounds the launch (0: none); slow
    // executors scale it up themselves.
    virtual LaunchOutcome launch(const KernelInfo& kernel, const LaunchShape& shape, void* const* params,
                                 double timeout_s) = 0;
};

// The executor kernels run on: the SIMT emulator unless NANODDP_STANDIN_EXEC=ptx
// (standin.cpp reads the choice once).
Executor& executor();
Executor& simt_executor();
Executor& ptx_executor();

// The distinct instruction spellings (opcode with its modifiers, `ld.global.nc.f32`) of every
// PTX text in `image` (PTX, or a fatbin's uncompressed PTX entries), sorted, each once. False,
// with `error` saying why, when an instruction or directive is one the PTX executor does not
// implement or the image holds no PTX it can read.
bool ptx_spellings(const unsigned char* image, std::size_t size, std::vector<std::string>& spellings,
                   std::string& error);

// A device allocation as the kernel running now may use it: [lo, hi) with its access right
// (0 none, 1 read, 3 read-write) after peer access, pool access and cross-stream restrictions.
// Sorted by lo. Implemented by standin.cpp; called by executors that check accesses
// themselves instead of through the MMU.
struct DeviceRange {
    std::uintptr_t lo, hi;
    int prot;
};
std::vector<DeviceRange> device_view();

// Called from a SIGSEGV handler while a kernel runs: explains a fault at `addr` (the
// driver model knows whose memory it is and what access rule was broken). Returns false
// when it has nothing to say. Implemented by standin.cpp.
bool explain_fault(std::uintptr_t addr, bool is_write, char* message, std::size_t capacity);

}  // namespace standin
