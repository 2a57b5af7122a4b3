// simt_executor.cpp — the stand-in's first executor: kernels run under the SIMT emulator
// (kernels/simt_host.cpp, compiled into this library), with its fibers, barrier checks and
// guard pages.
//
// A module image is matched to kernels by name: the build script compiles every kernels/*.cu for
// the host into this library and lists the entry points in a registry (name, parameter
// kinds, __launch_bounds__). A registered kernel is in an image when the image names it the
// way nvcc and NVRTC output do: `.text.<name>` in a cubin's (or a fatbin's cubins') section
// names, or `.entry <name>(` in PTX text. The emulator runs the source, not the image: the
// code nvcc emitted is the PTX executor's business.
#include <cstring>

#include "../kernels/simt_api.h"
#include "executor.h"
#include "registry.h"

namespace standin {
namespace {

bool contains(const unsigned char* hay, std::size_t size, const std::string& needle) {
    if (needle.empty() || needle.size() > size) return false;
    const unsigned char* end = hay + size - needle.size() + 1;
    for (const unsigned char* p = hay; p < end; ++p) {
        p = static_cast<const unsigned char*>(std::memchr(p, needle[0], static_cast<std::size_t>(end - p)));
        if (!p) return false;
        if (std::memcmp(p, needle.data(), needle.size()) == 0) return true;
    }
    return false;
}

// True when `image` holds kernel `name` as a cubin section or a PTX entry.
bool image_names(const unsigned char* image, std::size_t size, const char* name) {
    std::string n(name);
    std::string section = ".text." + n;
    section.push_back('\0');
    if (contains(image, size, section)) return true;
    for (const char* sep : {" ", "\t", "\n"}) {
        if (contains(image, size, ".entry" + std::string(sep) + n + "(")) return true;
        if (contains(image, size, ".entry" + std::string(sep) + n + " (")) return true;
    }
    return false;
}

class SimtExecutor final : public Executor {
public:
    const char* name() const override { return "SIMT emulator"; }

    std::vector<KernelInfo> kernels_in(const unsigned char* image, std::size_t size) override {
        std::vector<KernelInfo> found;
        for (unsigned i = 0; i < standin_kernel_count; ++i) {
            const RegisteredKernel& k = standin_kernels[i];
            if (!image_names(image, size, k.name)) continue;
            found.push_back(KernelInfo{k.name, k.params, k.max_threads, &k});
        }
        return found;
    }

    LaunchOutcome launch(const KernelInfo& kernel, const LaunchShape& shape, void* const* params,
                         double timeout_s) override {
        const auto* k = static_cast<const RegisteredKernel*>(kernel.handle);
        simt_launch_desc desc{};
        desc.entry = k->entry;
        desc.kernel = k->name;
        for (int i = 0; i < 3; ++i) {
            desc.grid[i] = shape.grid[i];
            desc.block[i] = shape.block[i];
        }
        desc.shared_bytes = shape.shared_bytes;
        desc.params = params;
        desc.lane_order = 0;
        desc.seed = 0;
        desc.workers = 0;
        desc.timeout_ms = timeout_s > 0 ? static_cast<unsigned long long>(timeout_s * 1000.0) : 0;
        simt_error err{};
        int status = simt_launch(&desc, &err);
        LaunchOutcome out;
        if (status == SIMT_OK) return out;
        std::string where;
        char buf[96];
        std::snprintf(buf, sizeof buf, "block (%u,%u,%u)", err.block[0], err.block[1], err.block[2]);
        where = buf;
        if (err.has_thread) {
            std::snprintf(buf, sizeof buf, ", thread (%u,%u,%u)", err.thread[0], err.thread[1], err.thread[2]);
            where += buf;
        }
        if (err.file[0]) {
            std::snprintf(buf, sizeof buf, " at %s:%d", err.file, err.line);
            where += buf;
        }
        out.message = where + ": " + err.message;
        switch (status) {
            case SIMT_MEMORY_FAULT:
                out.code = CUDA_ERROR_ILLEGAL_ADDRESS;
                break;
            case SIMT_TIMEOUT:
                out.code = CUDA_ERROR_LAUNCH_TIMEOUT;
                break;
            case SIMT_BAD_LAUNCH:
                out.code = CUDA_ERROR_INVALID_VALUE;
                break;
            default:
                // Divergent barriers, deadlocks, warp misuse, stack overflow: undefined
                // behaviour on a GPU, which at best ends the kernel with an unspecified
                // launch failure (sticky, like every error raised by a running kernel).
                out.code = CUDA_ERROR_LAUNCH_FAILED;
                break;
        }
        return out;
    }
};

int explainer(std::uintptr_t addr, int is_write, char* message, std::size_t capacity) {
    return explain_fault(addr, is_write != 0, message, capacity) ? 1 : 0;
}

}  // namespace

Executor& simt_executor() {
    static SimtExecutor* simt = [] {
        simt_set_fault_explainer(explainer);
        return new SimtExecutor;  // never freed: stream threads may outlive static destructors
    }();
    return *simt;
}

}  // namespace standin
