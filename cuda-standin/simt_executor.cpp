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
#include <string_view>
#include <unordered_set>

#include "../kernels/simt_api.h"
#include "executor.h"
#include "registry.h"

namespace standin {
namespace {

// Every kernel name `image` holds, in one pass over it: after each `.text.` up to the NUL
// that ends a cubin's section name, and after each `.entry` and a space, tab or newline the
// name a PTX entry gives before `(` or ` (`. (A search of the image per registered kernel
// would read a fatbin of megabytes hundreds of times for every module a context loads.)
std::unordered_set<std::string_view> names_in(const unsigned char* image, std::size_t size) {
    const std::string_view hay(reinterpret_cast<const char*>(image), size);
    std::unordered_set<std::string_view> names;
    auto after_each = [&](std::string_view marker, auto&& take) {
        for (auto at = hay.find(marker); at != hay.npos; at = hay.find(marker, at + 1))
            take(at + marker.size());
    };
    after_each(".text.", [&](std::size_t from) {
        const auto nul = hay.find('\0', from);
        if (nul != hay.npos) names.insert(hay.substr(from, nul - from));
    });
    after_each(".entry", [&](std::size_t from) {
        if (from >= hay.size() || (hay[from] != ' ' && hay[from] != '\t' && hay[from] != '\n')) return;
        const auto end = hay.find_first_of("( ", from + 1);
        if (end == hay.npos) return;
        if (hay[end] == '(' || hay.substr(end, 2) == " (") names.insert(hay.substr(from + 1, end - from - 1));
    });
    return names;
}

class SimtExecutor final : public Executor {
public:
    const char* name() const override { return "SIMT emulator"; }

    std::vector<KernelInfo> kernels_in(const unsigned char* image, std::size_t size) override {
        std::vector<KernelInfo> found;
        const auto names = names_in(image, size);
        for (unsigned i = 0; i < standin_kernel_count; ++i) {
            const RegisteredKernel& k = standin_kernels[i];
            if (names.count(k.name) == 0) continue;
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
