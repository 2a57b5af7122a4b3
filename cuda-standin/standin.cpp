// standin.cpp — a strict stand-in for the CUDA driver (libcuda.so.1) that runs on the CPU.
//
// Programs load it exactly as they load the real driver (cudarc dlopens libcuda.so or
// libcuda.so.1 through LD_LIBRARY_PATH); it shows NANODDP_STANDIN_GPUS (default 4) H100-like
// GPUs and runs their kernels through an Executor (executor.h). It follows the driver API's
// documented rules, and where the rules allow several behaviours it picks the one that
// exposes bugs:
//
//   * Streams are asynchronous and lazy. Each stream has its own thread that runs the
//     stream's launches, copies and memsets in order, but only when something requires
//     their completion: a synchronize, an event wait or query, a blocking copy, a stream
//     that waits on them, or a full queue. Until then their results are not there, so a
//     missing synchronization reads stale data every time, not by luck. A device-to-host
//     copy into pageable memory is asynchronous too: the destination is poisoned (0xFF
//     bytes) at once and receives the data only when the stream gets there.
//   * Every GPU has its own address range (1 TiB apart), and memory access is checked by
//     the MMU. Execution is serialized; before a kernel runs, every allocation is mapped
//     with the protection the running GPU may use: its own memory read-write; another GPU's
//     cuMemAlloc memory only after cuCtxEnablePeerAccess, and its pool (cuMemAllocAsync)
//     memory only after cuMemPoolSetAccess (peer access through the context does not cover
//     pools, as the CUDA documentation says). A kernel that touches memory it may not is
//     CUDA_ERROR_ILLEGAL_ADDRESS, sticky for its context as on real hardware, with a
//     diagnostic naming the kernel, the address, whose memory it is and the missing grant.
//     Freed memory is never reused: touching it faults and is reported as a use after free.
//   * Cross-stream hazards are reported. When an operation is enqueued, every unfinished
//     operation of another stream that nothing orders it with (no event wait, no
//     synchronization the host observed) restricts it: memory the other writes may not be
//     touched, memory the other reads may not be written. Kernels run under that
//     restriction (the MMU again, so accesses through pointers the kernel reads from memory
//     count too); copies and memsets are checked by range. A violation is a sticky
//     CUDA_ERROR_LAUNCH_FAILED naming both operations.
//   * Launches are checked: 1024 threads and (1024, 1024, 64) per block, grid y and z at
//     most 65535, the kernel's __launch_bounds__, and dynamic shared memory above 48 KiB
//     unless CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES was raised (227 KiB at most).
//     Functions and streams must belong to the current context.
//   * Every launch runs under a watchdog (NANODDP_KERNEL_TIMEOUT_S, default 300 s): a kernel
//     that never finishes becomes a sticky CUDA_ERROR_LAUNCH_TIMEOUT naming where its
//     threads are.
//   * Streams can be captured into graphs and the graphs replayed (see "stream capture"): the
//     driver's capture rules are enforced with its error codes, and a replay enqueues the
//     graph's nodes as eager work is enqueued, so every rule above holds for it too.
//   * Driver entry points it does not implement return CUDA_ERROR_NOT_SUPPORTED.
//
// nanoddp-specific extensions (absent from the real driver, looked up with dlsym):
// nanoddpStandinLastError() returns the diagnostic behind the last error (a program that shows
// a refused setting itself says so with nanoddpStandinHostReportsSettings()),
// nanoddpStandinCounters() what the stand-in counted (module loads, launches, hazards), and
// nanoddpStandinSetKernelTimeout() sets one GPU's watchdog limit, nanoddpStandinExecutor() names
// the executor kernels run on, nanoddpStandinUseExecutor() picks another for one GPU (and the
// PTX executor's lane order), and nanoddpStandinPtxSpellings() lists the instructions of a
// module's PTX as the PTX executor reads them (its coverage, for tests and docs).
//
// Environment: NANODDP_STANDIN_GPUS, CUDA_VISIBLE_DEVICES, NANODDP_STANDIN_DRIVER_VERSION (what cuDriverGetVersion
// reports, default 13000), NANODDP_STANDIN_JIT_MS (time each module load takes, modelling a
// driver JIT; default 0), NANODDP_KERNEL_TIMEOUT_S, CUDA_LAUNCH_BLOCKING=1 (every operation
// completes before its call returns, as on the real driver), NANODDP_STANDIN_EXEC (`simt`, the
// default: kernels run as their CUDA C++ source under the SIMT emulator; `ptx`: the module's
// PTX runs under the PTX executor). A value of NANODDP_STANDIN_GPUS, NANODDP_KERNEL_TIMEOUT_S,
// NANODDP_STANDIN_JIT_MS or NANODDP_STANDIN_EXEC it does not accept makes cuInit fail with
// CUDA_ERROR_INVALID_VALUE, after one line on stderr naming the variable and what it accepts.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cuda_abi.h"
#include "executor.h"

#define STANDIN_API extern "C" __attribute__((visibility("default")))

namespace {
// The mapped pinned host memory kernels may access (see cuMemHostGetDevicePointer_v2).
void append_mapped_host(std::vector<standin::DeviceRange>& view);
}  // namespace

namespace standin {

// ------------------------------------------------------------------------------ the GPUs
// H100 SXM (sm_90) as the CUDA programming guide's tables give it.
constexpr int MAX_GPUS = 16;
constexpr std::size_t GPU_MEMORY = 80ull << 30;
constexpr int SM_COUNT = 132;
constexpr unsigned STATIC_SHARED_LIMIT = 48u << 10;      // without opt-in
constexpr unsigned OPTIN_SHARED_LIMIT = 227u << 10;      // per block, with opt-in
constexpr std::uintptr_t RANGE_BASE = 0x100000000000ull;  // GPU i: RANGE_BASE + i * range
constexpr double RANGE_GIB = 1024;  // address space reserved per GPU (NANODDP_STANDIN_RANGE_GIB)
constexpr std::size_t ALLOC_ALIGN = 256;                  // what cuMemAlloc guarantees
constexpr std::uint64_t QUEUE_LIMIT = 1024;               // operations a stream holds before calls block

const std::size_t PAGE = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));

enum Prot : int { NONE = 0, READ = 1, RW = 3 };

int to_mprotect(int prot) { return prot == RW ? PROT_READ | PROT_WRITE : prot == READ ? PROT_READ : PROT_NONE; }

// ------------------------------------------------------------------------------ state
struct Context;
struct Stream;
struct Op;
struct Capture;
struct Node;

enum class AllocKind { Plain, Pool };

struct Allocation {
    std::uint64_t id = 0;
    int owner = 0;  // GPU ordinal
    AllocKind kind = AllocKind::Plain;
    std::uintptr_t map_lo = 0;  // device-range mapping: data pages, then one guard page
    std::size_t data_pages = 0;
    std::uintptr_t data_lo = 0;
    std::size_t bytes = 0;
    char* alias = nullptr;  // the same pages, always read-write, for the stand-in's own copies
    int prot = RW;          // protection of the device mapping now
    bool freed = false;
    const char* freed_by = nullptr;
    std::uintptr_t data_hi() const { return data_lo + bytes; }
    std::uintptr_t map_hi() const { return map_lo + (data_pages + 1) * PAGE; }
};

struct Pool {
    int device = 0;
    int access[MAX_GPUS] = {};  // Prot per accessing GPU; own GPU always RW
};

struct Device {
    int ordinal = 0;
    std::uintptr_t next = 0;  // bump pointer in this GPU's range (addresses are never reused)
    std::uintptr_t end = 0;
    std::size_t live_bytes = 0;
    Context* primary = nullptr;
    int primary_refs = 0;
    Pool pool;
    std::uint64_t module_loads = 0;
    std::uint64_t launches = 0;
    double kernel_timeout_s = 300.0;  // the watchdog's limit for this GPU's launches
    Executor* exec = nullptr;         // nanoddpStandinUseExecutor's choice; null: executor()
    bool reverse_lanes = false;       // run blocks' threads last to first (PTX executor)
    bool profile = false;             // nanoddpStandinProfile: count what each launch does
};

struct Module;

struct Function {
    Module* module = nullptr;
    Executor* exec = nullptr;  // the one that found it in the image, and runs it
    KernelInfo info;
    unsigned max_dynamic_shared = STATIC_SHARED_LIMIT;
};

struct Module {
    Context* ctx = nullptr;
    std::vector<std::unique_ptr<Function>> functions;
    std::vector<std::string> names;  // what the image holds that the executor can run
};

struct Context {
    Device* dev = nullptr;
    bool peer[MAX_GPUS] = {};  // cuCtxEnablePeerAccess granted towards GPU i
    CUresult sticky = CUDA_SUCCESS;
    std::string sticky_message;
    Stream* legacy = nullptr;  // the NULL stream
    std::vector<Stream*> streams;
};

// One unit of stream work, with what the hazard check needs to know about it.
struct Touch {
    std::uint64_t alloc;
    bool write;
};

struct Restriction {
    std::uint64_t alloc;
    int prot;             // the most this operation may do to the allocation
    std::string culprit;  // the unordered operation that imposes it
};

struct Op {
    Stream* stream = nullptr;
    std::uint64_t seq = 0;
    std::string what;
    std::vector<std::pair<Stream*, std::uint64_t>> deps;  // must have completed first
    std::vector<std::uint64_t> clock;                     // vector clock at enqueue
    std::vector<Touch> footprint;
    bool is_kernel = false;
    std::vector<Restriction> restrictions;  // kernels: applied through the MMU
    std::string hazard;                     // copies, memsets: found at enqueue
    std::function<LaunchOutcome(Op&)> body;
};

struct Stream {
    int id = 0;
    Context* ctx = nullptr;
    bool blocking = true;  // synchronizes with the legacy NULL stream
    bool legacy = false;
    std::mutex m;
    std::condition_variable cv;
    std::deque<std::shared_ptr<Op>> queue;
    std::uint64_t enqueued = 0;   // guarded by m
    std::uint64_t completed = 0;  // guarded by m
    std::uint64_t demand = 0;     // guarded by m
    bool closing = false;         // guarded by m
    std::vector<std::uint64_t> clock;  // for the next operation; guarded by the API lock
    // Stream capture (guarded by the API lock): the capture this stream records into (null:
    // none, work runs), and the nodes the next captured node will depend on.
    Capture* capture = nullptr;
    std::vector<Node*> capture_tail;
    std::vector<CUgraphEdgeData> capture_edges;    // cuStreamGetCaptureInfo's edge data
};

// A point in a stream's order: what an operation that waits for it depends on.
struct Point {
    Stream* stream = nullptr;  // null: nothing to wait for
    std::uint64_t seq = 0;
    std::vector<std::uint64_t> clock;  // the vector clock there, the stream's own entry included
};

struct Event : Point {
    Context* ctx = nullptr;
    // Recorded on a capturing stream: the capture (by id, 0: none) and the nodes the record
    // stood after. Such an event is a captured event until it is recorded outside a capture.
    std::uint64_t capture_id = 0;
    std::vector<Node*> capture_tail;
    bool timing = true;
    std::chrono::steady_clock::time_point when{};
    std::atomic<bool> happened{false};
};

struct Config {
    int gpus = 4;
    bool launch_blocking = false;
    double kernel_timeout_s = 300.0;
    double jit_ms = 0.0;
    std::uintptr_t range_bytes = static_cast<std::uintptr_t>(RANGE_GIB) << 30;
};

struct State {
    Config config;
    Device devices[MAX_GPUS];
    std::mutex api;    // every bookkeeping structure below, briefly
    std::mutex table;  // the allocation table (also read by the fault explainer)
    std::map<std::uintptr_t, Allocation*> allocations;  // by map_lo, freed ones included
    std::uint64_t next_alloc_id = 1;
    std::map<std::uint64_t, Allocation*> by_id;
    std::vector<Stream*> streams;  // by id
    std::vector<std::uint64_t> observed;  // per stream: completion the host has seen
    std::deque<std::shared_ptr<Op>> pending;  // unobserved operations with a footprint
    std::mutex exec;                         // one operation executes at a time
    std::mutex last_error_lock;
    std::string last_error;
    std::uint64_t hazards = 0;
    std::uint64_t faults = 0;
    // The profiles of launches on GPUs with profiling on, one line each
    // (nanoddpStandinProfileTake), oldest first.
    std::mutex profiles_lock;
    std::string profiles;
};

State* g = nullptr;
std::once_flag init_once;
CUresult init_result = CUDA_ERROR_NOT_INITIALIZED;

thread_local Context* tls_current = nullptr;

// ------------------------------------------------------------------------------ the call audit
// With NANODDP_STANDIN_STATS=1, every driver entry point counts its calls per GPU (the
// calling thread's current context's; "-" for a thread with none), and at exit the counts
// are printed to stderr, one line each, for scripts and tests to read:
//     [cuda stand-in] calls <entry point> <gpu or -> <count>
// sorted by entry point, then GPU. An entry point that only forwards to another (the `_v2`
// aliases, cuStreamCreateWithPriority, cuModuleLoad, cuMemAllocHost) is counted as the one
// it reaches. Then the kernels that ran, from a stream or as a graph's nodes, per GPU:
//     [cuda stand-in] launches <kernel> <gpu> <count>
// Off (the default) it costs one branch per call.
class Audit {
public:
    Audit() {
        const char* on = std::getenv("NANODDP_STANDIN_STATS");
        enabled_ = on && *on && std::strcmp(on, "0") != 0;
    }
    Audit(const Audit&) = delete;
    Audit& operator=(const Audit&) = delete;
    void count(const char* entry) {
        if (!enabled_) return;
        Context* ctx = tls_current;
        int gpu = ctx && ctx->dev ? ctx->dev->ordinal : -1;
        std::lock_guard<std::mutex> lock(mu_);
        ++counts_[{entry, gpu}];
    }
    void count_launch(const std::string& kernel, int gpu) {
        if (!enabled_) return;
        std::lock_guard<std::mutex> lock(mu_);
        ++launches_[{kernel, gpu}];
    }
    ~Audit() {
        if (!enabled_) return;
        std::lock_guard<std::mutex> lock(mu_);
        std::string out;
        char line[256];
        for (const auto& [key, n] : counts_) {
            if (key.second < 0) {
                std::snprintf(line, sizeof line, "[cuda stand-in] calls %s - %llu\n", key.first.c_str(), static_cast<unsigned long long>(n));
            } else {
                std::snprintf(line, sizeof line, "[cuda stand-in] calls %s %d %llu\n", key.first.c_str(), key.second, static_cast<unsigned long long>(n));
            }
            out += line;
        }
        for (const auto& [key, n] : launches_) {
            std::snprintf(line, sizeof line, "[cuda stand-in] launches %s %d %llu\n", key.first.c_str(), key.second,
                          static_cast<unsigned long long>(n));
            out += line;
        }
        // One write: lines of a process that exits while others print stay whole.
        std::fwrite(out.data(), 1, out.size(), stderr);
        std::fflush(stderr);
    }

private:
    bool enabled_ = false;
    std::mutex mu_;
    std::map<std::pair<std::string, int>, std::uint64_t> counts_;
    std::map<std::pair<std::string, int>, std::uint64_t> launches_;
};

// The process's audit, made on first use and printed when the library is unloaded at exit.
Audit& audit() {
    static Audit a;
    return a;
}

#define AUDIT() audit().count(__func__)

// The kernel executing now (set under the exec lock), for the fault explainer.
struct Executing {
    const Op* op = nullptr;
    int device = -1;
    const char* kernel = nullptr;
    bool hazard = false;  // the fault broke a cross-stream hazard restriction
};
Executing executing;

void set_last_error(const std::string& text) {
    std::lock_guard<std::mutex> lock(g->last_error_lock);
    g->last_error = text;
}

// One write to stderr per diagnostic, so concurrent ranks' messages do not interleave.
void report(const std::string& text) {
    std::string line = "nanoddp CUDA stand-in: " + text + "\n";
    ssize_t ignored = write(2, line.data(), line.size());
    (void)ignored;
    set_last_error(text);
}

std::string hex(std::uintptr_t v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%lx", static_cast<unsigned long>(v));
    return buf;
}

double env_double(const char* name, double fallback) {
    const char* v = std::getenv(name);
    if (!v || !*v) return fallback;
    char* end = nullptr;
    double d = std::strtod(v, &end);
    return end && *end == '\0' && d >= 0 ? d : fallback;
}

// Reads environment variable `name` as a number in [lo, hi] (a whole one if `whole`) into
// `out`; unset or empty gives `fallback`. False for any other value (not a number, out of
// range, trailing text): a setting is validated like a flag, never silently replaced.
bool env_number(const char* name, double fallback, double lo, double hi, bool whole, double& out) {
    const char* v = std::getenv(name);
    if (!v || !*v) {
        out = fallback;
        return true;
    }
    char* end = nullptr;
    errno = 0;
    double d = std::strtod(v, &end);
    if (end == v || *end != '\0' || errno == ERANGE || !(d >= lo && d <= hi)) return false;
    if (whole && d != std::floor(d)) return false;
    out = d;
    return true;
}

// Set by nanoddpStandinHostReportsSettings: the program shows a refused setting itself.
std::atomic<bool> host_reports_settings{false};

// Refuses to start over environment variable `name`'s value: one line on stderr naming the
// variable, its value and what it accepts (unless the program said it shows it itself), the
// same text from nanoddpStandinLastError, and cuInit's result CUDA_ERROR_INVALID_VALUE.
void refuse_setting(const char* name, const std::string& expected) {
    const char* v = std::getenv(name);
    std::string text = std::string(name) + "=" + (v ? v : "") + ": expected " + expected;
    if (host_reports_settings.load()) {
        set_last_error(text);
    } else {
        report(text);
    }
    init_result = CUDA_ERROR_INVALID_VALUE;
}

// ------------------------------------------------------------------------------ allocations
const char* kind_name(AllocKind k) { return k == AllocKind::Pool ? "cuMemAllocAsync (pool)" : "cuMemAlloc"; }

std::string describe(const Allocation& a) {
    return std::to_string(a.bytes) + "-byte " + kind_name(a.kind) + " allocation of GPU " + std::to_string(a.owner) +
           " at " + hex(a.data_lo);
}

// The allocation whose mapping (guard page included) holds addr; caller holds g->table.
Allocation* allocation_at_locked(std::uintptr_t addr) {
    auto it = g->allocations.upper_bound(addr);
    if (it == g->allocations.begin()) return nullptr;
    --it;
    return addr < it->second->map_hi() ? it->second : nullptr;
}

// A live allocation holding [addr, addr + bytes), or null.
Allocation* live_range(std::uintptr_t addr, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(g->table);
    Allocation* a = allocation_at_locked(addr);
    if (!a || a->freed || addr < a->data_lo || addr + bytes > a->data_hi()) return nullptr;
    return a;
}

CUresult allocate(Device& dev, std::size_t bytes, AllocKind kind, CUdeviceptr* out) {
    std::size_t data_pages = (bytes + PAGE - 1) / PAGE;
    std::size_t span = (data_pages + 1) * PAGE;
    std::uintptr_t lo;
    {
        std::lock_guard<std::mutex> lock(g->api);
        if (dev.live_bytes + bytes > GPU_MEMORY || dev.next + span > dev.end) return CUDA_ERROR_OUT_OF_MEMORY;
        lo = dev.next;
        dev.next += span;
        dev.live_bytes += bytes;
    }
    char* alias = nullptr;
    if (data_pages > 0) {
        int fd = memfd_create("nanoddp-standin", MFD_CLOEXEC);
        if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
        bool ok = ftruncate(fd, static_cast<off_t>(data_pages * PAGE)) == 0;
        ok = ok && mmap(reinterpret_cast<void*>(lo), data_pages * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                        fd, 0) != MAP_FAILED;
        if (ok) {
            void* a = mmap(nullptr, data_pages * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            ok = a != MAP_FAILED;
            alias = ok ? static_cast<char*>(a) : nullptr;
        }
        close(fd);
        if (!ok) return CUDA_ERROR_OUT_OF_MEMORY;
    }
    auto* a = new Allocation;
    a->owner = dev.ordinal;
    a->kind = kind;
    a->map_lo = lo;
    a->data_pages = data_pages;
    // The data ends as close to the guard page as 256-byte alignment allows.
    a->data_lo = (lo + data_pages * PAGE - bytes) & ~(ALLOC_ALIGN - 1);
    a->bytes = bytes;
    a->alias = alias;
    {
        std::lock_guard<std::mutex> lock(g->table);
        a->id = g->next_alloc_id++;
        g->allocations[lo] = a;
        g->by_id[a->id] = a;
    }
    *out = a->data_lo;
    return CUDA_SUCCESS;
}

// Unmaps the pages (keeping the addresses reserved, so a later touch faults); called while
// no operation executes (under g->exec).
void release(Allocation* a, const char* by) {
    if (a->data_pages > 0) {
        munmap(a->alias, a->data_pages * PAGE);
        mmap(reinterpret_cast<void*>(a->map_lo), a->data_pages * PAGE, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    }
    {
        std::lock_guard<std::mutex> lock(g->table);
        a->freed = true;
        a->freed_by = by;
        a->alias = nullptr;
        a->prot = NONE;
    }
    std::lock_guard<std::mutex> api(g->api);  // lock order: api before table, never nested the other way
    g->devices[a->owner].live_bytes -= a->bytes;
}

char* alias_of(std::uintptr_t addr) {
    std::lock_guard<std::mutex> lock(g->table);
    Allocation* a = allocation_at_locked(addr);
    if (!a || a->freed || addr < a->data_lo) return nullptr;
    return a->alias + (addr - a->map_lo);
}

// ------------------------------------------------------------------------------ access rules
// What GPU `device` may do to allocation `a` (caller holds g->api).
int access_right(const Allocation& a, int device) {
    if (a.owner == device) return RW;
    Device& owner = g->devices[a.owner];
    if (a.kind == AllocKind::Pool) return owner.pool.access[device];
    Context* mine = g->devices[device].primary;
    return mine && mine->peer[a.owner] ? RW : NONE;
}

// Maps every live allocation with what the kernel about to run may do to it. Caller holds
// g->exec (no other operation runs).
void apply_view(const Op& op, int device) {
    std::vector<std::pair<Allocation*, int>> wanted;
    {
        std::lock_guard<std::mutex> api(g->api);
        std::lock_guard<std::mutex> table(g->table);
        for (auto& [lo, a] : g->allocations) {
            if (a->freed || a->data_pages == 0) continue;
            int prot = access_right(*a, device);
            for (const Restriction& r : op.restrictions)
                if (r.alloc == a->id) prot &= r.prot;
            if (prot != a->prot) wanted.emplace_back(a, prot);
        }
    }
    for (auto& [a, prot] : wanted) {
        mprotect(reinterpret_cast<void*>(a->map_lo), a->data_pages * PAGE, to_mprotect(prot));
        a->prot = prot;
    }
}

// ------------------------------------------------------------------------------ fault explainer
// Runs in a SIGSEGV handler on the kernel's worker thread: no allocation, no blocking lock.
bool explain(std::uintptr_t addr, bool is_write, char* msg, std::size_t cap) {
    const Op* op = executing.op;
    if (!op) return false;
    while (!g->table.try_lock()) sched_yield();
    Allocation* a = allocation_at_locked(addr);
    Allocation copy;
    bool found = a != nullptr;
    if (found) copy = *a;
    g->table.unlock();
    const char* verb = is_write ? "writes" : "reads";
    const char* kernel = executing.kernel ? executing.kernel : "?";
    int dev = executing.device;
    if (!found) return false;  // not device memory: the emulator's own message says so
    if (copy.freed) {
        std::snprintf(msg, cap,
                      "kernel `%s` on GPU %d %s 0x%lx, inside a %zu-byte %s allocation of GPU %d at 0x%lx that was "
                      "freed (%s): a use after free",
                      kernel, dev, verb, static_cast<unsigned long>(addr), copy.bytes, kind_name(copy.kind), copy.owner,
                      static_cast<unsigned long>(copy.data_lo), copy.freed_by ? copy.freed_by : "freed");
        return true;
    }
    if (addr >= copy.data_hi() || addr < copy.data_lo) {
        std::snprintf(msg, cap, "kernel `%s` on GPU %d %s 0x%lx, %s the %zu-byte %s allocation of GPU %d at 0x%lx", kernel,
                      dev, verb, static_cast<unsigned long>(addr), addr >= copy.data_hi() ? "past the end of" : "before",
                      copy.bytes, kind_name(copy.kind), copy.owner, static_cast<unsigned long>(copy.data_lo));
        return true;
    }
    for (const Restriction& r : op->restrictions) {
        if (r.alloc != copy.id) continue;
        if (r.prot == RW || (r.prot == READ && !is_write)) continue;
        executing.hazard = true;
        std::snprintf(msg, cap,
                      "cross-stream hazard: kernel `%s` on GPU %d (stream %d) %s 0x%lx in the %zu-byte %s allocation of "
                      "GPU %d at 0x%lx, which %s has unfinished work on, and nothing orders the two (no event wait, no "
                      "synchronization between them)",
                      kernel, dev, op->stream->id, verb, static_cast<unsigned long>(addr), copy.bytes,
                      kind_name(copy.kind), copy.owner, static_cast<unsigned long>(copy.data_lo), r.culprit.c_str());
        return true;
    }
    // Not freed, inside the data, no hazard: the access right is missing.
    int right = NONE;
    {
        // g->api may be held by a host thread for a moment; these fields change only under
        // it, and a stale read here only changes the wording.
        right = copy.owner == dev ? RW
                : copy.kind == AllocKind::Pool
                    ? g->devices[copy.owner].pool.access[dev]
                    : (g->devices[dev].primary && g->devices[dev].primary->peer[copy.owner] ? RW : NONE);
    }
    const char* remedy =
        copy.kind == AllocKind::Pool
            ? (right == READ ? "GPU %d was granted read-only access to it (cuMemPoolSetAccess with PROT_READ)"
                             : "pool memory needs cuMemPoolSetAccess on GPU %d's memory pool; cuCtxEnablePeerAccess "
                               "does not cover memory from cuMemAllocAsync")
            : "cuCtxEnablePeerAccess from this GPU's context to GPU %d's was never called";
    char why[256];
    std::snprintf(why, sizeof why, remedy, copy.kind == AllocKind::Pool && right == READ ? dev : copy.owner);
    std::snprintf(msg, cap, "kernel `%s` on GPU %d %s 0x%lx, inside the %zu-byte %s allocation of GPU %d at 0x%lx, "
                  "which GPU %d may not %s: %s",
                  kernel, dev, verb, static_cast<unsigned long>(addr), copy.bytes, kind_name(copy.kind), copy.owner,
                  static_cast<unsigned long>(copy.data_lo), dev, is_write ? "write" : "read", why);
    return true;
}

// ------------------------------------------------------------------------------ streams
void stream_thread(Stream* s);

Stream* new_stream(Context* ctx, bool blocking, bool legacy) {
    auto* s = new Stream;
    s->ctx = ctx;
    s->blocking = blocking;
    s->legacy = legacy;
    {
        std::lock_guard<std::mutex> lock(g->api);
        s->id = static_cast<int>(g->streams.size());
        g->streams.push_back(s);
        g->observed.push_back(0);
        for (Stream* t : g->streams) t->clock.resize(g->streams.size(), 0);
        ctx->streams.push_back(s);
    }
    std::thread(stream_thread, s).detach();
    return s;
}

// Makes `s` run everything up to `seq` and waits for it. Never called with g->api held.
void complete_up_to(Stream* s, std::uint64_t seq) {
    std::unique_lock<std::mutex> lock(s->m);
    if (s->completed >= seq) return;
    if (s->demand < seq) {
        s->demand = seq;
        s->cv.notify_all();
    }
    s->cv.wait(lock, [&] { return s->completed >= seq; });
}

// Asks `s` to run up to `seq` without waiting (event and stream queries).
void nudge(Stream* s, std::uint64_t seq) {
    std::lock_guard<std::mutex> lock(s->m);
    if (s->demand < seq) {
        s->demand = seq;
        s->cv.notify_all();
    }
}

// The host has seen `s` complete up to `seq`: every later operation is ordered after those,
// and after everything they were ordered after (`clock`, the vector clock at `seq`, when the
// caller knows it: work of other streams that `s` waited for is complete too).
void observe(Stream* s, std::uint64_t seq, const std::vector<std::uint64_t>& clock = {}) {
    std::lock_guard<std::mutex> lock(g->api);
    if (g->observed[static_cast<std::size_t>(s->id)] < seq) g->observed[static_cast<std::size_t>(s->id)] = seq;
    for (std::size_t i = 0; i < clock.size() && i < g->observed.size(); ++i)
        g->observed[i] = std::max(g->observed[i], clock[i]);
    while (!g->pending.empty()) {
        const Op& front = *g->pending.front();
        if (front.seq > g->observed[static_cast<std::size_t>(front.stream->id)]) break;
        g->pending.pop_front();
    }
    auto done = [](const std::shared_ptr<Op>& op) {
        return op->seq <= g->observed[static_cast<std::size_t>(op->stream->id)];
    };
    g->pending.erase(std::remove_if(g->pending.begin(), g->pending.end(), done), g->pending.end());
}

void set_sticky(Context* ctx, CUresult code, const std::string& message) {
    std::lock_guard<std::mutex> lock(g->api);
    if (ctx->sticky == CUDA_SUCCESS) {
        ctx->sticky = code;
        ctx->sticky_message = message;
    }
}

CUresult sticky_of(Context* ctx) {
    std::lock_guard<std::mutex> lock(g->api);
    return ctx->sticky;
}

void execute(Op& op) {
    for (auto& [dep, seq] : op.deps) complete_up_to(dep, seq);
    Context* ctx = op.stream->ctx;
    if (sticky_of(ctx) != CUDA_SUCCESS) return;  // a dead context runs nothing more
    std::lock_guard<std::mutex> exec(g->exec);
    LaunchOutcome out;
    if (!op.hazard.empty()) {
        out.code = CUDA_ERROR_LAUNCH_FAILED;
        out.message = op.hazard;
        std::lock_guard<std::mutex> api(g->api);
        ++g->hazards;
    } else {
        if (op.is_kernel) apply_view(op, ctx->dev->ordinal);
        out = op.body(op);
    }
    if (out.code != CUDA_SUCCESS) {
        std::string text = op.what + ": " + out.message;
        report(text);
        set_sticky(ctx, out.code, text);
    }
}

void stream_thread(Stream* s) {
    for (;;) {
        std::shared_ptr<Op> op;
        {
            std::unique_lock<std::mutex> lock(s->m);
            s->cv.wait(lock, [&] {
                return (!s->queue.empty() && s->demand >= s->queue.front()->seq) || (s->closing && s->queue.empty());
            });
            if (s->queue.empty()) return;  // closing, and drained
            op = s->queue.front();
        }
        execute(*op);
        {
            std::lock_guard<std::mutex> lock(s->m);
            s->queue.pop_front();
            s->completed = op->seq;
            s->cv.notify_all();
        }
    }
}

// Enqueues `op` on `s`: vector clock, hazard restrictions, queue. Returns the sticky error
// of the stream's context if it is dead (nothing is enqueued then).
CUresult enqueue(Stream* s, std::shared_ptr<Op> op, const std::vector<const Point*>& waits = {}) {
    op->stream = s;
    std::uint64_t seq;
    {
        std::lock_guard<std::mutex> lock(g->api);
        if (s->ctx->sticky != CUDA_SUCCESS) return s->ctx->sticky;
        std::size_t n = g->streams.size();
        std::vector<std::uint64_t>& clock = s->clock;
        clock.resize(n, 0);
        for (std::size_t i = 0; i < n; ++i) clock[i] = std::max(clock[i], g->observed[i]);
        for (const Point* e : waits) {
            if (!e->stream) continue;
            op->deps.emplace_back(e->stream, e->seq);
            for (std::size_t i = 0; i < e->clock.size() && i < n; ++i) clock[i] = std::max(clock[i], e->clock[i]);
            clock[static_cast<std::size_t>(e->stream->id)] =
                std::max(clock[static_cast<std::size_t>(e->stream->id)], e->seq);
        }
        // The legacy NULL stream and blocking streams of a context order each other.
        for (Stream* t : s->ctx->streams) {
            if (t == s || !(s->legacy ? t->blocking : (s->blocking && t->legacy))) continue;
            std::uint64_t tail;
            {
                std::lock_guard<std::mutex> tl(t->m);
                tail = t->enqueued;
            }
            if (tail > 0) {
                op->deps.emplace_back(t, tail);
                clock[static_cast<std::size_t>(t->id)] = std::max(clock[static_cast<std::size_t>(t->id)], tail);
            }
        }
        {
            std::lock_guard<std::mutex> sl(s->m);
            seq = ++s->enqueued;
        }
        op->seq = seq;
        op->clock = clock;
        clock[static_cast<std::size_t>(s->id)] = seq;
        // Hazards: unfinished operations of other streams that nothing orders with this one.
        if (!op->footprint.empty()) {
            for (const auto& other : g->pending) {
                if (other->stream == s || other->seq <= op->clock[static_cast<std::size_t>(other->stream->id)]) continue;
                for (const Touch& t : other->footprint) {
                    int allowed = t.write ? NONE : READ;
                    if (op->is_kernel) {
                        op->restrictions.push_back({t.alloc, allowed, other->what + " (stream " +
                                                                          std::to_string(other->stream->id) + ")"});
                        continue;
                    }
                    for (const Touch& mine : op->footprint) {
                        if (mine.alloc != t.alloc || !(mine.write || t.write) || !op->hazard.empty()) continue;
                        std::lock_guard<std::mutex> table(g->table);
                        Allocation* a = g->by_id[t.alloc];
                        op->hazard = "cross-stream hazard: " + op->what + " on stream " + std::to_string(s->id) + " " +
                                     (mine.write ? "writes" : "reads") + " the " + (a ? describe(*a) : "?") +
                                     ", which " + other->what + " (stream " + std::to_string(other->stream->id) +
                                     ") " + (t.write ? "writes" : "reads") +
                                     ", and nothing orders the two (no event wait, no synchronization between them)";
                    }
                }
            }
            g->pending.push_back(op);
        }
        {
            std::lock_guard<std::mutex> sl(s->m);
            s->queue.push_back(op);
            if (g->config.launch_blocking) s->demand = seq;
            s->cv.notify_all();
        }
    }
    if (g->config.launch_blocking) {
        complete_up_to(s, seq);
        observe(s, seq);
    } else if (seq > QUEUE_LIMIT) {
        complete_up_to(s, seq - QUEUE_LIMIT);  // a full queue blocks the caller, as on a GPU
    }
    return CUDA_SUCCESS;
}

// The point after everything enqueued on `s` so far.
Point tail_of(Stream* s) {
    Point p;
    std::lock_guard<std::mutex> api(g->api);
    std::lock_guard<std::mutex> lock(s->m);
    p.stream = s;
    p.seq = s->enqueued;
    p.clock = s->clock;
    return p;
}

// Runs everything `s` holds and records that the host has seen it.
CUresult drain(Stream* s) {
    Point tail = tail_of(s);
    complete_up_to(s, tail.seq);
    observe(s, tail.seq, tail.clock);
    return sticky_of(s->ctx);
}

// ------------------------------------------------------------------------------ stream capture
// While a stream captures (cuStreamBeginCapture_v2 to cuStreamEndCapture), what is enqueued on it
// does not run: each launch, copy and memset becomes a node of a graph that depends on the nodes
// the stream's earlier work became. An event recorded on a capturing stream makes no node: it
// remembers the stream's last nodes, and a stream that waits for it depends on them, joining the
// capture if it was not in one (a fork), as the driver does. The rules the driver documents for
// what may happen meanwhile, and their errors, are enforced here; a call that breaks one
// invalidates the capture, so its cuStreamEndCapture fails with
// CUDA_ERROR_STREAM_CAPTURE_INVALIDATED. cuGraphLaunch turns the nodes back into operations
// through enqueue, so a replay meets every check eager work meets.

// One unit of stream work as the call that asked for it describes it: what runs at once, or what
// a captured graph node turns into an operation again at every launch (make_op).
struct Work {
    enum class Kind { Kernel, Copy, Memset } kind = Kind::Copy;
    std::string name;        // the entry point, for diagnostics
    Function* fn = nullptr;  // kernels
    LaunchShape shape{};
    std::shared_ptr<std::vector<std::uint64_t>> values;  // argument bytes, copied at the call
    std::uintptr_t dst = 0, src = 0;                     // copies and memsets
    bool dst_device = true, src_device = true;
    std::size_t bytes = 0;
    unsigned char value = 0;
};

struct Node {
    std::size_t index = 0;  // in capture order: a node depends only on earlier ones
    int lane = 0;           // the capturing stream it came from (0: the capture's origin)
    std::vector<Node*> deps;
    Work work;
    std::vector<void*> params;  // kernels: pointers into work.values (cuGraphKernelNodeGetParams)
    int type() const {
        return work.kind == Work::Kind::Kernel ? CU_GRAPH_NODE_TYPE_KERNEL
               : work.kind == Work::Kind::Copy ? CU_GRAPH_NODE_TYPE_MEMCPY
                                               : CU_GRAPH_NODE_TYPE_MEMSET;
    }
};

// A captured graph's nodes. Immutable once its capture ends: the CUgraph and every CUgraphExec
// made from it share them (the stand-in has no calls that edit a graph).
struct GraphData {
    Context* ctx = nullptr;
    std::deque<Node> nodes;  // a deque: node handles stay valid while the capture adds nodes
    int lanes = 1;           // streams that took part in the capture
};

struct Graph {
    std::shared_ptr<GraphData> data;
};

struct Capture {
    std::uint64_t id = 0;  // unique in the process, as cuStreamGetCaptureInfo reports it
    int mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    std::thread::id thread;  // the one that began it
    Stream* origin = nullptr;
    std::vector<Stream*> streams;  // lane i is streams[i]; the origin is lane 0
    Graph* graph = nullptr;        // what cuStreamEndCapture hands out when the capture is sound
    bool invalidated = false;
    std::string why;  // the error that invalidated it
};

// Active captures by id (guarded by g->api), and their number, read without the lock so that
// eager calls pay one load while nothing captures.
std::map<std::uint64_t, Capture*> captures;
std::uint64_t next_capture_id = 1;
std::atomic<int> active_captures{0};
// The calling thread's capture interaction mode (cuThreadExchangeStreamCaptureMode).
thread_local int tls_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

const char* mode_name(int mode) {
    return mode == CU_STREAM_CAPTURE_MODE_GLOBAL         ? "GLOBAL"
           : mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ? "THREAD_LOCAL"
                                                         : "RELAXED";
}

std::string stream_name(const Stream* s) {
    return (s->legacy ? "the legacy NULL stream" : "stream " + std::to_string(s->id)) + " of GPU " +
           std::to_string(s->ctx->dev->ordinal);
}

std::string capture_name(const Capture* c) {
    return "the " + std::string(mode_name(c->mode)) + " capture begun on " + stream_name(c->origin);
}

// Invalidates `c` (the first reason is the one cuStreamEndCapture gives). Caller holds g->api.
void invalidate_locked(Capture* c, const std::string& why) {
    if (c->invalidated) return;
    c->invalidated = true;
    c->why = why;
}

// Reports a capture rule broken by `why` and returns `code`; invalidates `c` unless null.
// Caller holds g->api.
CUresult capture_error_locked(CUresult code, Capture* c, const std::string& why) {
    if (c) invalidate_locked(c, why);
    report(why);
    return code;
}

Capture* capture_by_id_locked(std::uint64_t id) {
    auto it = captures.find(id);
    return it == captures.end() ? nullptr : it->second;
}

// A capture running on a blocking stream of `ctx`: what the legacy NULL stream, which waits for
// every blocking stream, would have to wait for. Caller holds g->api.
Capture* blocking_capture_locked(Context* ctx) {
    for (Stream* t : ctx->streams)
        if (t->capture && t->blocking && !t->legacy) return t->capture;
    return nullptr;
}

// `entry` on the legacy stream `s` while a blocking stream of its context captures:
// CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, invalidating that capture (unless `invalidate` is false,
// as for cuStreamIsCapturing); CUDA_SUCCESS otherwise. Caller holds g->api.
CUresult legacy_rule_locked(Stream* s, const std::string& entry, bool invalidate = true) {
    if (!s->legacy) return CUDA_SUCCESS;
    Capture* c = blocking_capture_locked(s->ctx);
    if (!c) return CUDA_SUCCESS;
    return capture_error_locked(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, invalidate ? c : nullptr,
                                entry + " on " + stream_name(s) + " while " + capture_name(c) +
                                    " is active: the legacy stream waits for every blocking stream, so it "
                                    "would depend on captured work (use a stream created non-blocking, or "
                                    "another stream than the NULL one)");
}

// Ends `c`: its streams capture no more. Caller holds g->api.
void terminate_locked(Capture* c) {
    for (Stream* t : c->streams) {
        t->capture = nullptr;
        t->capture_tail.clear();
    }
    captures.erase(c->id);
    active_captures.store(static_cast<int>(captures.size()));
}

// `entry` may synchronize with the device implicitly (allocating or freeing memory, a
// synchronous copy or memset, synchronizing the context, querying or synchronizing an event):
// the driver calls it potentially unsafe, and prohibits it while the calling thread's mode is
// GLOBAL and it began a capture that is not RELAXED or another thread began a GLOBAL one, or
// while its mode is THREAD_LOCAL and it began a capture that is not RELAXED. Then:
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and the captures that prohibit it are invalidated.
CUresult unsafe_call(const char* entry) {
    if (active_captures.load() == 0) return CUDA_SUCCESS;
    int mode = tls_capture_mode;
    if (mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
    std::lock_guard<std::mutex> api(g->api);
    std::thread::id me = std::this_thread::get_id();
    std::vector<Capture*> prohibiting;
    for (auto& [id, c] : captures) {
        bool own = c->thread == me && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED;
        bool others = mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c->thread != me && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
        if (own || others) prohibiting.push_back(c);
    }
    if (prohibiting.empty()) return CUDA_SUCCESS;
    Capture* c = prohibiting.front();
    bool own = c->thread == me;
    std::string why = std::string(entry) + " while " + capture_name(c) + " (by " +
                      (own ? "this thread" : "another thread") +
                      ") is active: a call that may synchronize implicitly is prohibited " +
                      (own ? "on the thread of a " + std::string(mode_name(c->mode)) + " capture"
                           : std::string("on every thread in GLOBAL mode during a GLOBAL capture")) +
                      " (make it before or after the capture, " +
                      (own ? "or switch this thread to RELAXED with cuThreadExchangeStreamCaptureMode)"
                           : "capture in THREAD_LOCAL mode, or switch this thread to RELAXED with "
                             "cuThreadExchangeStreamCaptureMode)");
    for (Capture* p : prohibiting) invalidate_locked(p, why);
    report(why);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

// Where work `entry` enqueues on `s` goes while captures exist. True when the call is done:
// `w` became a node of s's capture (code CUDA_SUCCESS), or the capture rules refused it (code
// says why). False when it runs. `w` null: work no graph node of the stand-in holds (`refusal`
// says what), refused on a capturing stream with CUDA_ERROR_NOT_SUPPORTED.
bool captured(Stream* s, const Work* w, const std::string& entry, CUresult& code, const char* refusal = nullptr) {
    code = CUDA_SUCCESS;
    if (active_captures.load() == 0) return false;
    std::lock_guard<std::mutex> api(g->api);
    Capture* c = s->capture;
    if (!c) {
        code = legacy_rule_locked(s, entry);
        return code != CUDA_SUCCESS;
    }
    if (c->invalidated) {
        code = capture_error_locked(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, nullptr,
                                    entry + " on " + stream_name(s) + ", whose capture was invalidated: " + c->why);
        return true;
    }
    if (!w) {
        code = capture_error_locked(CUDA_ERROR_NOT_SUPPORTED, c,
                                    entry + " on " + stream_name(s) + ", which " + capture_name(c) +
                                        " is capturing: " + refusal);
        return true;
    }
    GraphData& data = *c->graph->data;
    data.nodes.emplace_back();
    Node& n = data.nodes.back();
    n.index = data.nodes.size() - 1;
    n.lane = static_cast<int>(std::find(c->streams.begin(), c->streams.end(), s) - c->streams.begin());
    n.deps = s->capture_tail;
    n.work = *w;
    if (w->kind == Work::Kind::Kernel)
        for (std::uint64_t& v : *n.work.values) n.params.push_back(&v);
    s->capture_tail.assign(1, &n);
    return true;
}

// ------------------------------------------------------------------------------ init
void init() {
    g = new State;  // never freed: stream threads may outlive static destructors
    Config& c = g->config;
    // Every setting is checked before any is used: a bad one makes cuInit fail, naming it.
    double gpus = 0, timeout_s = 0, jit_ms = 0, range_gib = 0;
    if (!env_number("NANODDP_STANDIN_GPUS", 4, 0, MAX_GPUS, true, gpus)) {
        return refuse_setting("NANODDP_STANDIN_GPUS",
                              "a whole number of GPUs from 0 to " + std::to_string(MAX_GPUS) + " (default 4)");
    }
    if (!env_number("NANODDP_KERNEL_TIMEOUT_S", 300.0, 0, HUGE_VAL, false, timeout_s)) {
        return refuse_setting("NANODDP_KERNEL_TIMEOUT_S", "seconds, such as 2.5, or 0 for no limit (default 300)");
    }
    if (!env_number("NANODDP_STANDIN_JIT_MS", 0.0, 0, HUGE_VAL, false, jit_ms)) {
        return refuse_setting("NANODDP_STANDIN_JIT_MS", "milliseconds per module load, 0 or more (default 0)");
    }
    // An emulator of another CPU (qemu-user) pays for reserved address space as it pays for
    // memory: it can run the stand-in with a smaller range per GPU.
    if (!env_number("NANODDP_STANDIN_RANGE_GIB", RANGE_GIB, 1, RANGE_GIB * 16, true, range_gib)) {
        return refuse_setting("NANODDP_STANDIN_RANGE_GIB",
                              "a whole number of GiB of address space per GPU, 1 to 16384 (default 1024)");
    }
    c.range_bytes = static_cast<std::uintptr_t>(range_gib) << 30;
    if (const char* exec = std::getenv("NANODDP_STANDIN_EXEC")) {
        if (*exec && std::strcmp(exec, "simt") != 0 && std::strcmp(exec, "ptx") != 0) {
            return refuse_setting("NANODDP_STANDIN_EXEC", "`simt` (the default) or `ptx`");
        }
    }
    c.gpus = static_cast<int>(gpus);
    // CUDA_VISIBLE_DEVICES narrows what a process sees, as with the real driver: the listed
    // ordinals (up to the first invalid one), renumbered from 0.
    if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
        int shown = 0;
        std::stringstream list(visible);
        std::string item;
        while (std::getline(list, item, ',')) {
            char* end = nullptr;
            long v = std::strtol(item.c_str(), &end, 10);
            if (item.empty() || *end != '\0' || v < 0 || v >= c.gpus) break;
            ++shown;
        }
        c.gpus = shown;
    }
    const char* blocking = std::getenv("CUDA_LAUNCH_BLOCKING");
    c.launch_blocking = blocking && std::strcmp(blocking, "1") == 0;
    c.kernel_timeout_s = timeout_s;
    c.jit_ms = jit_ms;
    for (int i = 0; i < c.gpus; ++i) {
        Device& d = g->devices[i];
        d.ordinal = i;
        d.kernel_timeout_s = c.kernel_timeout_s;
        d.pool.device = i;
        d.pool.access[i] = RW;
        // Reserve this GPU's address range; allocations are mapped inside it.
        std::uintptr_t want = RANGE_BASE + static_cast<std::uintptr_t>(i) * c.range_bytes;
        void* got = mmap(reinterpret_cast<void*>(want), c.range_bytes, PROT_NONE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
        if (got == MAP_FAILED) {
            got = mmap(nullptr, c.range_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (got == MAP_FAILED) {
                init_result = CUDA_ERROR_OUT_OF_MEMORY;
                return;
            }
        }
        d.next = reinterpret_cast<std::uintptr_t>(got);
        d.end = d.next + c.range_bytes;
        // The primary context and its NULL stream exist from the start, so retaining one
        // never races with creating it.
        d.primary = new Context;
        d.primary->dev = &d;
        d.primary->legacy = new_stream(d.primary, true, true);
    }
    executor();
    init_result = c.gpus > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

bool ready() { return g && init_result == CUDA_SUCCESS; }

// The executor every launch uses, chosen once: NANODDP_STANDIN_EXEC=ptx runs the module's
// PTX, anything else (validated by init) the SIMT emulator.
Executor& executor() {
    static Executor* chosen = [] {
        const char* exec = std::getenv("NANODDP_STANDIN_EXEC");
        return exec && std::strcmp(exec, "ptx") == 0 ? &ptx_executor() : &simt_executor();
    }();
    return *chosen;
}

std::vector<DeviceRange> device_view() {
    std::vector<DeviceRange> view;
    {
        std::lock_guard<std::mutex> table(g->table);
        for (auto& [lo, a] : g->allocations) {
            if (a->freed || a->bytes == 0) continue;
            view.push_back({a->data_lo, a->data_hi(), a->prot});
        }
    }
    append_mapped_host(view);
    std::sort(view.begin(), view.end(), [](const DeviceRange& x, const DeviceRange& y) { return x.lo < y.lo; });
    return view;
}

Device* device_of(CUdevice d) {
    if (!ready() || d < 0 || d >= g->config.gpus) return nullptr;
    return &g->devices[d];
}

#define REQUIRE_INIT()                                 \
    do {                                               \
        if (!ready()) return CUDA_ERROR_NOT_INITIALIZED; \
    } while (0)

#define CURRENT_CONTEXT(ctx)                               \
    REQUIRE_INIT();                                        \
    Context* ctx = tls_current;                            \
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;           \
    if (CUresult sticky = sticky_of(ctx)) return sticky

Stream* stream_of(CUstream h, Context* fallback) {
    if (h == nullptr) return fallback ? fallback->legacy : nullptr;
    return reinterpret_cast<Stream*>(h);
}

}  // namespace standin

using namespace standin;

bool standin::explain_fault(std::uintptr_t addr, bool is_write, char* message, std::size_t capacity) {
    return g && explain(addr, is_write, message, capacity);
}

// ================================================================================ driver API
// ---- initialization, version, devices
STANDIN_API CUresult cuInit(unsigned flags) {
    AUDIT();
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    std::call_once(init_once, init);
    return init_result;
}

STANDIN_API CUresult cuDriverGetVersion(int* version) {
    AUDIT();
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = static_cast<int>(env_double("NANODDP_STANDIN_DRIVER_VERSION", 13000));
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDeviceGetCount(int* count) {
    AUDIT();
    REQUIRE_INIT();
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = g->config.gpus;
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    AUDIT();
    REQUIRE_INIT();
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (!device_of(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
    AUDIT();
    REQUIRE_INIT();
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!device_of(dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::snprintf(name, static_cast<std::size_t>(len), "NVIDIA H100 80GB HBM3 (nanoddp CPU stand-in)");
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDeviceTotalMem_v2(std::size_t* bytes, CUdevice dev) {
    AUDIT();
    REQUIRE_INIT();
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (!device_of(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = GPU_MEMORY;
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
    AUDIT();
    REQUIRE_INIT();
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    if (!device_of(dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::memset(uuid->bytes, 0, sizeof uuid->bytes);
    std::memcpy(uuid->bytes, "nanoddp-standin", 15);
    uuid->bytes[15] = static_cast<char>(dev);
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) { return cuDeviceGetUuid(uuid, dev); }

STANDIN_API CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice dev) {
    AUDIT();
    REQUIRE_INIT();
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    if (!device_of(dev)) return CUDA_ERROR_INVALID_DEVICE;
    int v;
    switch (attribute) {
        case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
        case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: v = 1024; break;
        case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
        case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
        case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 2147483647; break;
        case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: v = 65535; break;
        case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
        case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = static_cast<int>(STATIC_SHARED_LIMIT); break;
        case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 65536; break;
        case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
        case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: v = 65536; break;
        case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = 1980000; break;
        case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = SM_COUNT; break;
        case CU_DEVICE_ATTRIBUTE_INTEGRATED: v = 0; break;
        case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: v = 1; break;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: v = 0; break;
        case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: v = 1; break;
        case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: v = 1; break;
        case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = 0x18 + dev; break;
        case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: v = 0; break;
        case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: v = 2619000; break;
        case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = 5120; break;
        case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = 50 << 20; break;
        case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = 2048; break;
        case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: v = 3; break;
        case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
        case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: v = 228 << 10; break;
        case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: v = 65536; break;
        case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: v = 0; break;  // not modelled
        case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: v = static_cast<int>(OPTIN_SHARED_LIMIT); break;
        case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: v = 32; break;
        case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 1; break;
        default: return CUDA_ERROR_INVALID_VALUE;
    }
    *value = v;
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
    AUDIT();
    REQUIRE_INIT();
    if (!can) return CUDA_ERROR_INVALID_VALUE;
    if (!device_of(dev) || !device_of(peer)) return CUDA_ERROR_INVALID_DEVICE;
    *can = dev != peer ? 1 : 0;
    return CUDA_SUCCESS;
}

// ---- contexts
STANDIN_API CUresult cuDevicePrimaryCtxRetain(CUcontext* out, CUdevice dev) {
    AUDIT();
    REQUIRE_INIT();
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    Device* d = device_of(dev);
    if (!d) return CUDA_ERROR_INVALID_DEVICE;
    {
        std::lock_guard<std::mutex> lock(g->api);
        ++d->primary_refs;
    }
    *out = reinterpret_cast<CUcontext>(d->primary);
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    AUDIT();
    REQUIRE_INIT();
    Device* d = device_of(dev);
    if (!d) return CUDA_ERROR_INVALID_DEVICE;
    std::lock_guard<std::mutex> lock(g->api);
    if (d->primary_refs > 0) --d->primary_refs;
    // The primary context stays: its memory and modules outlive the last release here,
    // which only matters to programs that release and retain again.
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuCtxSetCurrent(CUcontext ctx) {
    AUDIT();
    REQUIRE_INIT();
    tls_current = reinterpret_cast<Context*>(ctx);
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuCtxGetCurrent(CUcontext* ctx) {
    AUDIT();
    REQUIRE_INIT();
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    *ctx = reinterpret_cast<CUcontext>(tls_current);
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuCtxGetDevice(CUdevice* dev) {
    AUDIT();
    CURRENT_CONTEXT(ctx);
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    *dev = ctx->dev->ordinal;
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuCtxSynchronize() {
    AUDIT();
    REQUIRE_INIT();
    Context* ctx = tls_current;
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    if (CUresult r = unsafe_call("cuCtxSynchronize")) return r;
    std::vector<Stream*> streams;
    {
        std::lock_guard<std::mutex> lock(g->api);
        // Synchronizing a context synchronizes its streams: not one that captures.
        for (Stream* s : ctx->streams)
            if (s->capture)
                return capture_error_locked(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, s->capture,
                                            "cuCtxSynchronize on GPU " + std::to_string(ctx->dev->ordinal) + " while " +
                                                stream_name(s) + " captures (" + capture_name(s->capture) +
                                                "): captured work does not run, so it cannot be waited for");
        streams = ctx->streams;
    }
    for (Stream* s : streams) drain(s);
    return sticky_of(ctx);
}

STANDIN_API CUresult cuCtxGetStreamPriorityRange(int* least, int* greatest) {
    AUDIT();
    REQUIRE_INIT();
    if (least) *least = 0;
    if (greatest) *greatest = 0;
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned flags) {
    AUDIT();
    CURRENT_CONTEXT(ctx);
    auto* p = reinterpret_cast<Context*>(peer);
    if (!p || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (p == ctx) return CUDA_ERROR_INVALID_DEVICE;
    std::lock_guard<std::mutex> lock(g->api);
    if (ctx->peer[p->dev->ordinal]) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    ctx->peer[p->dev->ordinal] = true;
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuCtxDisablePeerAccess(CUcontext peer) {
    AUDIT();
    CURRENT_CONTEXT(ctx);
    auto* p = reinterpret_cast<Context*>(peer);
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(g->api);
    if (!ctx->peer[p->dev->ordinal]) return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
    ctx->peer[p->dev->ordinal] = false;
    return CUDA_SUCCESS;
}

// ---- streams and events
STANDIN_API CUresult cuStreamCreate(CUstream* out, unsigned flags) {
    AUDIT();
    CURRENT_CONTEXT(ctx);
    if (!out || (flags & ~1u)) return CUDA_ERROR_INVALID_VALUE;
    *out = reinterpret_cast<CUstream>(new_stream(ctx, (flags & CU_STREAM_NON_BLOCKING) == 0, false));
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuStreamCreateWithPriority(CUstream* out, unsigned flags, int priority) {
    (void)priority;  // one priority: the stand-in runs one operation at a time anyway
    return cuStreamCreate(out, flags);
}

STANDIN_API CUresult cuStreamDestroy_v2(CUstream h) {
    AUDIT();
    REQUIRE_INIT();
    Stream* s = reinterpret_cast<Stream*>(h);
    if (!s || s->legacy) return CUDA_ERROR_INVALID_HANDLE;
    {
        // A stream that joined a capture leaves it (what it captured stays, and
        // cuStreamEndCapture still finds it unjoined if it was never joined back); the stream a
        // capture began on takes the capture with it, which nothing can end any more.
        std::lock_guard<std::mutex> api(g->api);
        if (Capture* c = s->capture) {
            if (c->origin == s) {
                capture_error_locked(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, c,
                                     "cuStreamDestroy of " + stream_name(s) + " while " + capture_name(c) +
                                         " is active: the capture is discarded");
                terminate_locked(c);
                delete c->graph;
                delete c;
            } else {
                s->capture = nullptr;
                s->capture_tail.clear();
            }
        }
    }
    // Work still queued completes later, as the documentation allows; the thread then ends.
    std::lock_guard<std::mutex> lock(s->m);
    s->closing = true;
    s->demand = s->enqueued;
    s->cv.notify_all();
    return CUDA_SUCCESS;
}

// Synchronizing or querying a capturing stream (whose captured work never runs), or the legacy
// stream while a blocking stream captures: the driver's errors, invalidating the capture.
CUresult sync_rule(Stream* s, const char* entry) {
    if (active_captures.load() == 0) return CUDA_SUCCESS;
    std::lock_guard<std::mutex> api(g->api);
    if (Capture* c = s->capture)
        return capture_error_locked(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, c,
                                    std::string(entry) + " on " + stream_name(s) + ", which " + capture_name(c) +
                                        " is capturing: captured work does not run until the graph is launched");
    return legacy_rule_locked(s, entry);
}

STANDIN_API CUresult cuStreamSynchronize(CUstream h) {
    AUDIT();
    REQUIRE_INIT();
    Stream* s = stream_of(h, tls_current);
    if (!s) return CUDA_ERROR_INVALID_CONTEXT;
    if (CUresult r = sync_rule(s, "cuStreamSynchronize")) return r;
    return drain(s);
}

STANDIN_API CUresult cuStreamQuery(CUstream h) {
    AUDIT();
    REQUIRE_INIT();
    Stream* s = stream_of(h, tls_current);
    if (!s) return CUDA_ERROR_INVALID_CONTEXT;
    if (CUresult sticky = sticky_of(s->ctx)) return sticky;
    if (CUresult r = sync_rule(s, "cuStreamQuery")) return r;
    Point tail = tail_of(s);
    bool done;
    {
        std::lock_guard<std::mutex> lock(s->m);
        done = s->completed >= tail.seq;
    }
    if (!done) {
        nudge(s, tail.seq);
        return CUDA_ERROR_NOT_READY;
    }
    observe(s, tail.seq, tail.clock);
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuEventCreate(CUevent* out, unsigned flags) {
    AUDIT();
    CURRENT_CONTEXT(ctx);
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    auto* e = new Event;
    e->ctx = ctx;
    e->timing = (flags & CU_EVENT_DISABLE_TIMING) == 0;
    *out = reinterpret_cast<CUevent>(e);
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuEventDestroy_v2(CUevent h) {
    AUDIT();
    REQUIRE_INIT();
    if (!h) return CUDA_ERROR_INVALID_HANDLE;
    // Freed lazily: a stream may still wait on it (leaked; events are small).
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuEventRecord(CUevent h, CUstream hs) {
    AUDIT();
    REQUIRE_INIT();
    auto* e = reinterpret_cast<Event*>(h);
    Stream* s = stream_of(hs, tls_current);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    if (!s) return CUDA_ERROR_INVALID_CONTEXT;
    if (s->ctx != e->ctx) return CUDA_ERROR_INVALID_HANDLE;  // recorded only on its own context's streams
    if (active_captures.load() != 0) {
        std::lock_guard<std::mutex> api(g->api);
        if (Capture* c = s->capture) {
            // Recorded in a capture: no node, the stream's last nodes (what a wait depends on).
            if (c->invalidated)
                return capture_error_locked(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, nullptr,
                                            "cuEventRecord on " + stream_name(s) + ", whose capture was invalidated: " + c->why);
            e->capture_id = c->id;
            e->capture_tail = s->capture_tail;
            e->happened = false;
            return CUDA_SUCCESS;
        }
        if (CUresult r = legacy_rule_locked(s, "cuEventRecord")) return r;
    }
    auto op = std::make_shared<Op>();
    op->what = "event record";
    e->happened = false;
    op->body = [e](Op&) {
        e->when = std::chrono::steady_clock::now();
        e->happened = true;
        return LaunchOutcome{};
    };
    if (CUresult r = enqueue(s, op)) return r;
    std::lock_guard<std::mutex> lock(g->api);
    e->capture_id = 0;
    e->capture_tail.clear();
    e->stream = s;
    e->seq = op->seq;
    e->clock = op->clock;
    e->clock.resize(g->streams.size(), 0);
    e->clock[static_cast<std::size_t>(s->id)] = op->seq;
    return CUDA_SUCCESS;
}

// An event last recorded in a capture stands for graph nodes, not for work that will happen:
// querying or synchronizing it is CUDA_ERROR_CAPTURED_EVENT (invalidating the capture while it
// is active; after it ended, until the event is recorded again outside a capture).
CUresult captured_event_rule(Event* e, const char* entry) {
    std::lock_guard<std::mutex> api(g->api);
    if (e->capture_id == 0) return CUDA_SUCCESS;
    Capture* c = capture_by_id_locked(e->capture_id);
    return capture_error_locked(CUDA_ERROR_CAPTURED_EVENT, c,
                                std::string(entry) + " of an event last recorded in " +
                                    (c ? capture_name(c) : std::string("a capture that has ended")) +
                                    ": it marks graph nodes, not work that runs (record it outside a capture to wait for it)");
}

STANDIN_API CUresult cuEventSynchronize(CUevent h) {
    AUDIT();
    REQUIRE_INIT();
    auto* e = reinterpret_cast<Event*>(h);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    if (CUresult r = captured_event_rule(e, "cuEventSynchronize")) return r;
    if (CUresult r = unsafe_call("cuEventSynchronize")) return r;
    Point at;
    {
        std::lock_guard<std::mutex> lock(g->api);
        at = *e;
    }
    if (!at.stream) return CUDA_SUCCESS;
    complete_up_to(at.stream, at.seq);
    observe(at.stream, at.seq, at.clock);
    return sticky_of(at.stream->ctx);
}

STANDIN_API CUresult cuEventQuery(CUevent h) {
    AUDIT();
    REQUIRE_INIT();
    auto* e = reinterpret_cast<Event*>(h);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    if (CUresult r = captured_event_rule(e, "cuEventQuery")) return r;
    if (CUresult r = unsafe_call("cuEventQuery")) return r;
    Point at;
    {
        std::lock_guard<std::mutex> lock(g->api);
        at = *e;
    }
    if (!at.stream) return CUDA_SUCCESS;
    if (CUresult sticky = sticky_of(at.stream->ctx)) return sticky;
    bool done;
    {
        std::lock_guard<std::mutex> lock(at.stream->m);
        done = at.stream->completed >= at.seq;
    }
    if (!done) {
        nudge(at.stream, at.seq);
        return CUDA_ERROR_NOT_READY;
    }
    observe(at.stream, at.seq, at.clock);
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
    AUDIT();
    REQUIRE_INIT();
    auto* a = reinterpret_cast<Event*>(start);
    auto* b = reinterpret_cast<Event*>(end);
    if (!ms || !a || !b) return CUDA_ERROR_INVALID_VALUE;
    if (!a->timing || !b->timing) return CUDA_ERROR_INVALID_HANDLE;
    if (!a->happened || !b->happened) return CUDA_ERROR_NOT_READY;
    *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuEventElapsedTime_v2(float* ms, CUevent start, CUevent end) {
    return cuEventElapsedTime(ms, start, end);
}

// cuStreamWaitEvent where a capture is involved, as the driver documents it: a capturing stream
// waiting for an event recorded in its own capture depends on the nodes the record stood after
// (a join); a stream outside any capture waiting for an event of an active capture joins that
// capture (a fork). Waiting across two captures is CUDA_ERROR_STREAM_CAPTURE_MERGE; a capturing
// stream waiting for work recorded outside captures, CUDA_ERROR_STREAM_CAPTURE_ISOLATION; an
// event whose capture has ended, CUDA_ERROR_CAPTURED_EVENT. `done`: the call is answered (else
// it is an eager wait). Caller holds g->api.
CUresult wait_in_capture_locked(Stream* s, Event* e, bool& done) {
    done = true;
    Capture* ec = e->capture_id ? capture_by_id_locked(e->capture_id) : nullptr;
    Capture* sc = s->capture;
    std::string what = "cuStreamWaitEvent on " + stream_name(s);
    if (e->capture_id && !ec)
        return capture_error_locked(CUDA_ERROR_CAPTURED_EVENT, sc,
                                    what + " for an event last recorded in a capture that has ended (record it "
                                           "outside a capture to wait for it)");
    if (sc) {
        if (sc->invalidated)
            return capture_error_locked(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, nullptr,
                                        what + ", whose capture was invalidated: " + sc->why);
        if (ec == sc) {
            for (Node* n : e->capture_tail)
                if (std::find(s->capture_tail.begin(), s->capture_tail.end(), n) == s->capture_tail.end())
                    s->capture_tail.push_back(n);
            return CUDA_SUCCESS;
        }
        if (ec) {
            invalidate_locked(ec, what + " merged two captures");
            return capture_error_locked(CUDA_ERROR_STREAM_CAPTURE_MERGE, sc,
                                        what + ", which " + capture_name(sc) + " is capturing, for an event of " +
                                            capture_name(ec) + ": two captures cannot merge");
        }
        if (e->stream)
            return capture_error_locked(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, sc,
                                        what + ", which " + capture_name(sc) +
                                            " is capturing, for an event recorded outside any capture: a graph "
                                            "cannot depend on uncaptured work (wait before beginning the capture)");
        return CUDA_SUCCESS;  // never recorded: nothing to wait for
    }
    if (ec) {
        if (ec->invalidated)
            return capture_error_locked(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, nullptr,
                                        what + " for an event of " + capture_name(ec) + ", which was invalidated: " + ec->why);
        if (s->legacy)
            return capture_error_locked(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, ec,
                                        what + " for an event of " + capture_name(ec) + ": the legacy stream cannot join a capture");
        if (s->ctx != ec->origin->ctx)
            return capture_error_locked(CUDA_ERROR_NOT_SUPPORTED, ec,
                                        what + " for an event of " + capture_name(ec) +
                                            ": the stand-in's graphs hold one GPU's work (a capture cannot fork to another GPU)");
        ec->streams.push_back(s);
        ec->graph->data->lanes = static_cast<int>(ec->streams.size());
        s->capture = ec;
        s->capture_tail = e->capture_tail;
        return CUDA_SUCCESS;
    }
    CUresult r = legacy_rule_locked(s, "cuStreamWaitEvent");
    done = r != CUDA_SUCCESS;
    return r;
}

STANDIN_API CUresult cuStreamWaitEvent(CUstream hs, CUevent h, unsigned flags) {
    AUDIT();
    REQUIRE_INIT();
    auto* e = reinterpret_cast<Event*>(h);
    Stream* s = stream_of(hs, tls_current);
    if (!e || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (!s) return CUDA_ERROR_INVALID_CONTEXT;
    // A marker operation on `s` that depends on the event; everything after it inherits the
    // order (the stream's clock). Unless captures are involved (wait_in_capture).
    Point snapshot;
    {
        std::lock_guard<std::mutex> lock(g->api);
        if (e->capture_id != 0 || s->capture || (s->legacy && active_captures.load() != 0)) {
            bool done = false;
            CUresult r = wait_in_capture_locked(s, e, done);
            if (done) return r;
        }
        snapshot = *e;
    }
    auto op = std::make_shared<Op>();
    op->what = "stream wait on an event";
    op->body = [](Op&) { return LaunchOutcome{}; };
    return enqueue(s, op, {&snapshot});
}

// ---- memory
STANDIN_API CUresult cuMemAlloc_v2(CUdeviceptr* out, std::size_t bytes) {
    AUDIT();
    CURRENT_CONTEXT(ctx);
    if (!out || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = unsafe_call("cuMemAlloc")) return r;
    return allocate(*ctx->dev, bytes, AllocKind::Plain, out);
}

STANDIN_API CUresult cuMemFree_v2(CUdeviceptr ptr) {
    AUDIT();
    REQUIRE_INIT();
    if (ptr == 0) return CUDA_SUCCESS;
    Allocation* a = live_range(ptr, 0);
    if (!a || a->data_lo != ptr || a->kind != AllocKind::Plain) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = unsafe_call("cuMemFree")) return r;
    // cuMemFree waits for the device's work on the memory: complete every stream of the
    // owner's context first.
    Context* owner = g->devices[a->owner].primary;
    if (owner) {
        std::vector<Stream*> streams;
        {
            std::lock_guard<std::mutex> lock(g->api);
            streams = owner->streams;
        }
        for (Stream* s : streams) drain(s);
    }
    std::lock_guard<std::mutex> exec(g->exec);
    release(a, "cuMemFree");
    return CUDA_SUCCESS;
}

// Why cuMemAllocAsync and cuMemFreeAsync are refused on a capturing stream (the driver would add
// memory nodes to the graph; the stand-in does not model them).
const char* const NO_MEMORY_NODES =
    "the stand-in's graphs have no memory nodes, so stream-ordered allocation and freeing inside a capture "
    "are refused (allocate before capturing, free after the graph's last launch)";

STANDIN_API CUresult cuMemAllocAsync(CUdeviceptr* out, std::size_t bytes, CUstream hs) {
    AUDIT();
    REQUIRE_INIT();
    Stream* s = stream_of(hs, tls_current);
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    if (!s) return CUDA_ERROR_INVALID_CONTEXT;
    if (CUresult sticky = sticky_of(s->ctx)) return sticky;
    CUresult code;
    if (captured(s, nullptr, "cuMemAllocAsync", code, NO_MEMORY_NODES)) return code;
    CUdeviceptr ptr = 0;
    if (CUresult r = allocate(*s->ctx->dev, bytes, AllocKind::Pool, &ptr)) return r;
    Allocation* a = live_range(ptr, 0);
    // The allocation exists in stream order: an operation that "writes" it.
    auto op = std::make_shared<Op>();
    op->what = "cuMemAllocAsync of " + std::to_string(bytes) + " bytes";
    op->footprint.push_back({a->id, true});
    op->body = [](Op&) { return LaunchOutcome{}; };
    if (CUresult r = enqueue(s, op)) return r;
    *out = ptr;
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream hs) {
    AUDIT();
    REQUIRE_INIT();
    Stream* s = stream_of(hs, tls_current);
    if (!s) return CUDA_ERROR_INVALID_CONTEXT;
    Allocation* a = live_range(ptr, 0);
    if (!a || a->data_lo != ptr || a->kind != AllocKind::Pool) return CUDA_ERROR_INVALID_VALUE;
    CUresult code;
    if (captured(s, nullptr, "cuMemFreeAsync", code, NO_MEMORY_NODES)) return code;
    auto op = std::make_shared<Op>();
    op->what = "cuMemFreeAsync of the " + describe(*a);
    op->footprint.push_back({a->id, true});
    op->body = [a](Op&) {
        release(a, "cuMemFreeAsync");
        return LaunchOutcome{};
    };
    return enqueue(s, op);
}

STANDIN_API CUresult cuMemGetInfo_v2(std::size_t* free_bytes, std::size_t* total) {
    AUDIT();
    CURRENT_CONTEXT(ctx);
    std::lock_guard<std::mutex> lock(g->api);
    if (free_bytes) *free_bytes = GPU_MEMORY - ctx->dev->live_bytes;
    if (total) *total = GPU_MEMORY;
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) {
    AUDIT();
    REQUIRE_INIT();
    Device* d = device_of(dev);
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    if (!d) return CUDA_ERROR_INVALID_DEVICE;
    *pool = reinterpret_cast<CUmemoryPool>(&d->pool);
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) { return cuDeviceGetDefaultMemPool(pool, dev); }

STANDIN_API CUresult cuMemPoolSetAccess(CUmemoryPool hp, const CUmemAccessDesc* map, std::size_t count) {
    AUDIT();
    REQUIRE_INIT();
    auto* pool = reinterpret_cast<Pool*>(hp);
    if (!pool || (!map && count)) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(g->api);
    for (std::size_t i = 0; i < count; ++i) {
        const CUmemAccessDesc& d = map[i];
        if (d.location.type != CU_MEM_LOCATION_TYPE_DEVICE || !device_of(d.location.id)) return CUDA_ERROR_INVALID_VALUE;
        if (d.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && d.flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
            d.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
        // The owning GPU's own access cannot be changed.
        if (d.location.id == pool->device) {
            if (d.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return CUDA_ERROR_INVALID_DEVICE;
            continue;
        }
        pool->access[d.location.id] = d.flags;
    }
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuMemPoolGetAccess(int* flags, CUmemoryPool hp, CUmemLocation* location) {
    AUDIT();
    REQUIRE_INIT();
    auto* pool = reinterpret_cast<Pool*>(hp);
    if (!flags || !pool || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE || !device_of(location->id))
        return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(g->api);
    *flags = pool->access[location->id];
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void* value) {
    AUDIT();
    (void)attr;
    (void)value;  // release thresholds and reuse policies do not change what a program sees
    return pool ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

STANDIN_API CUresult cuMemPoolTrimTo(CUmemoryPool pool, std::size_t keep) {
    AUDIT();
    (void)keep;
    return pool ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

namespace {

// ------------------------------------------------------------------------------ pinned host memory
// Page-locked host memory, as the driver knows it: allocated by cuMemAllocHost/cuMemHostAlloc
// (owned: cuMemFreeHost frees it) or registered by cuMemHostRegister (the caller's: only
// forgotten by cuMemHostUnregister). An async copy whose host side lies in it is a DMA the
// stream performs when it gets there: it reads (or writes) the host buffer then, not at the
// call, so a program that changes the buffer after enqueuing a copy sees the copy take the
// new bytes, as on a GPU. Pageable memory keeps the staging of copy_async.
//
// Mapped pinned memory is also the kernels' to read and write, at the address
// cuMemHostGetDevicePointer gives (the host address: the stand-in's addressing is unified, as
// every 64-bit GPU platform's is). As the driver documents it under unified addressing, all of
// cuMemHostAlloc's memory is mapped; registered memory only with CU_MEMHOSTREGISTER_DEVICEMAP.
// Every GPU may access it (device_view), and nothing orders a kernel's stores with the host's
// reads but the program's own synchronization.
struct PinnedRange {
    std::size_t bytes;
    bool owned;   // allocated here (cuMemFreeHost), else registered (cuMemHostUnregister)
    bool mapped;  // kernels may access it
};
std::mutex pinned_lock;
std::map<std::uintptr_t, PinnedRange> pinned;  // by first byte

// Whether [addr, addr + bytes) lies inside one pinned range.
bool is_pinned(std::uintptr_t addr, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(pinned_lock);
    auto it = pinned.upper_bound(addr);
    if (it == pinned.begin()) return false;
    --it;
    return addr + bytes <= it->first + it->second.bytes;
}

// Whether [addr, addr + bytes) overlaps a pinned range.
bool overlaps_pinned(std::uintptr_t addr, std::size_t bytes) {
    auto it = pinned.lower_bound(addr + bytes);
    if (it == pinned.begin()) return false;
    --it;
    return it->first + it->second.bytes > addr;
}

CUresult pin(void** out, std::size_t bytes, bool owned, void* given, bool mapped) {
    if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(pinned_lock);
    void* p = given;
    if (owned) {
        p = std::aligned_alloc(PAGE, (bytes + PAGE - 1) / PAGE * PAGE);
        if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    } else if (overlaps_pinned(reinterpret_cast<std::uintptr_t>(p), bytes)) {
        return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
    pinned[reinterpret_cast<std::uintptr_t>(p)] = PinnedRange{bytes, owned, mapped};
    if (out) *out = p;
    return CUDA_SUCCESS;
}

void append_mapped_host(std::vector<DeviceRange>& view) {
    std::lock_guard<std::mutex> lock(pinned_lock);
    for (auto& [lo, r] : pinned)
        if (r.mapped) view.push_back({lo, lo + r.bytes, RW});
}

CUresult unpin(void* p, bool owned) {
    std::lock_guard<std::mutex> lock(pinned_lock);
    auto it = pinned.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == pinned.end() || it->second.owned != owned)
        return owned ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    pinned.erase(it);
    if (owned) std::free(p);
    return CUDA_SUCCESS;
}

// A copy or memset between device memory (checked now, addressed through the alias when it
// runs, so copies never need the MMU view) and host memory.
struct Range {
    std::uintptr_t addr;
    std::size_t bytes;
    bool device;
    bool write;
};

// The footprint of a copy's or memset's device ranges. `strict` (the call): a range outside every
// live allocation is the call's CUDA_ERROR_INVALID_VALUE. Not strict (a graph node at launch,
// checked when it was captured): the range is left out, and the operation finds the memory
// freed when it runs (a sticky CUDA_ERROR_ILLEGAL_ADDRESS, as for a kernel).
CUresult check_ranges(const std::vector<Range>& ranges, Op& op, bool strict) {
    for (const Range& r : ranges) {
        if (!r.device) continue;
        Allocation* a = live_range(r.addr, r.bytes);
        if (a) op.footprint.push_back({a->id, r.write});
        else if (strict) return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

LaunchOutcome freed_outcome(std::uintptr_t addr) {
    LaunchOutcome out;
    out.code = CUDA_ERROR_ILLEGAL_ADDRESS;
    out.message = "device memory at " + hex(addr) + " was freed before this operation ran (a use after free)";
    return out;
}

std::vector<Range> ranges_of(const Work& w) {
    if (w.kind == Work::Kind::Memset) return {{w.dst, w.bytes, true, true}};
    return {{w.dst, w.bytes, w.dst_device, true}, {w.src, w.bytes, w.src_device, false}};
}

// A kernel's operation: its footprint (the allocations its pointer arguments name), and a body
// that runs it on its function's executor under the watchdog.
// Appends one launch's profile to the lines nanoddpStandinProfileTake hands out:
//     <gpu> <kernel> <grid x y z> <block x y z> <dynamic shared bytes> <key>=<count> ...
void record_profile(int device, const std::string& kernel, const LaunchShape& s, const LaunchProfile& p) {
    char head[96];
    std::snprintf(head, sizeof head, " %u %u %u %u %u %u %u", s.grid[0], s.grid[1], s.grid[2], s.block[0], s.block[1],
                  s.block[2], s.shared_bytes);
    std::string line = std::to_string(device) + " " + kernel + head;
    auto put = [&](const char* key, std::uint64_t v) { line += std::string(" ") + key + "=" + std::to_string(v); };
    put("warp_instructions", p.warp_instructions);
    put("thread_instructions", p.thread_instructions);
    put("ffma_warp", p.ffma_warp);
    put("flops_f32", p.flops_f32);
    put("flops_f16", p.flops_f16);
    put("flops_f64", p.flops_f64);
    put("flops_tensor", p.flops_tensor);
    put("global_load_requests", p.global_load_requests);
    put("global_load_sectors", p.global_load_sectors);
    put("global_store_requests", p.global_store_requests);
    put("global_store_sectors", p.global_store_sectors);
    put("global_atomic_requests", p.global_atomic_requests);
    put("global_atomic_sectors", p.global_atomic_sectors);
    put("shared_load_requests", p.shared_load_requests);
    put("shared_load_wavefronts", p.shared_load_wavefronts);
    put("shared_load_ideal", p.shared_load_ideal);
    put("shared_store_requests", p.shared_store_requests);
    put("shared_store_wavefronts", p.shared_store_wavefronts);
    put("shared_store_ideal", p.shared_store_ideal);
    put("local_requests", p.local_requests);
    put("barriers", p.barriers);
    put("shuffles", p.shuffles);
    put("branches", p.branches);
    put("divergent_branches", p.divergent_branches);
    put("read_footprint_sectors", p.read_footprint_sectors);
    put("write_footprint_sectors", p.write_footprint_sectors);
    line += "\n";
    std::lock_guard<std::mutex> lock(g->profiles_lock);
    g->profiles += line;
}

void kernel_op(const Work& w, Op& op, const std::string& note) {
    Function* fn = w.fn;
    op.is_kernel = true;
    for (std::size_t i = 0; i < fn->info.params.size(); ++i) {
        char kind = fn->info.params[i];
        if (kind != 'r' && kind != 'w') continue;
        std::uintptr_t ptr = (*w.values)[i];
        std::lock_guard<std::mutex> lock(g->table);
        Allocation* a = ptr ? allocation_at_locked(ptr) : nullptr;
        if (a && !a->freed) op.footprint.push_back({a->id, kind == 'w'});
    }
    Context* ctx = fn->module->ctx;
    int device = ctx->dev->ordinal;
    std::uint64_t launch_no;
    {
        std::lock_guard<std::mutex> lock(g->api);
        launch_no = ++ctx->dev->launches;
    }
    op.what = "kernel `" + fn->info.name + "` on GPU " + std::to_string(device) + " (launch #" +
              std::to_string(launch_no) + note + ")";
    LaunchShape shape = w.shape;
    auto values = w.values;
    op.body = [fn, shape, values, device](Op& self) {
        std::vector<void*> ptrs(values->size());
        for (std::size_t i = 0; i < values->size(); ++i) ptrs[i] = &(*values)[i];
        executing.op = &self;
        executing.device = device;
        executing.kernel = fn->info.name.c_str();
        executing.hazard = false;
        double timeout_s;
        LaunchShape run_shape = shape;
        {
            std::lock_guard<std::mutex> lock(g->api);
            timeout_s = g->devices[device].kernel_timeout_s;
            run_shape.reverse_lanes = g->devices[device].reverse_lanes;
            run_shape.profile = g->devices[device].profile;
        }
        audit().count_launch(fn->info.name, device);
        LaunchOutcome out = fn->exec->launch(fn->info, run_shape, ptrs.data(), timeout_s);
        if (out.profiled) record_profile(device, fn->info.name, run_shape, out.profile);
        if (out.code != CUDA_SUCCESS) {
            std::lock_guard<std::mutex> lock(g->api);
            ++g->faults;
            if (executing.hazard) {
                ++g->hazards;
                out.code = CUDA_ERROR_LAUNCH_FAILED;
            }
        }
        executing = Executing{};
        return out;
    };
}

// The operation that runs `w`. `node` < 0: for the call that asked for it (a pageable host
// source is staged now, so the caller may reuse its buffer at once). `node` >= 0: for that node
// of a graph at cuGraphLaunch: every host source, pinned or pageable, is read when the operation
// runs, as a graph's copy node reads it when it executes. A pageable host destination holds
// 0xFF bytes from now until the operation runs, either way.
CUresult make_op(const Work& w, long node, std::shared_ptr<Op>& out) {
    auto op = std::make_shared<Op>();
    std::string note = node < 0 ? "" : ", graph node " + std::to_string(node);
    if (w.kind == Work::Kind::Kernel) {
        kernel_op(w, *op, note);
        out = op;
        return CUDA_SUCCESS;
    }
    op->what = w.name + " of " + std::to_string(w.bytes) + " bytes" + (node < 0 ? "" : " (" + note.substr(2) + ")");
    if (CUresult r = check_ranges(ranges_of(w), *op, node < 0)) return r;
    std::uintptr_t dst = w.dst, src = w.src;
    std::size_t bytes = w.bytes;
    if (w.kind == Work::Kind::Memset) {
        unsigned char value = w.value;
        op->body = [dst, value, bytes](Op&) {
            char* to = alias_of(dst);
            if (!to) return freed_outcome(dst);
            std::memset(to, value, bytes);
            return LaunchOutcome{};
        };
    } else if (!w.src_device && (node >= 0 || is_pinned(src, bytes))) {
        // A pinned host source, or any host source of a graph node: read when the stream gets there.
        op->body = [dst, src, bytes](Op&) {
            char* to = alias_of(dst);
            if (!to) return freed_outcome(dst);
            std::memcpy(to, reinterpret_cast<const char*>(src), bytes);
            return LaunchOutcome{};
        };
    } else if (!w.src_device) {
        // Pageable host source: staged now, so the caller may reuse its buffer at once.
        auto staged = std::make_shared<std::vector<char>>(reinterpret_cast<const char*>(src),
                                                          reinterpret_cast<const char*>(src) + bytes);
        op->body = [dst, bytes, staged](Op&) {
            char* to = alias_of(dst);
            if (!to) return freed_outcome(dst);
            std::memcpy(to, staged->data(), bytes);
            return LaunchOutcome{};
        };
    } else if (!w.dst_device) {
        // Pageable host destination: the data arrives when the stream gets there; until
        // then the buffer holds 0xFF bytes (NaN as float).
        std::memset(reinterpret_cast<void*>(dst), 0xff, bytes);
        op->body = [dst, src, bytes](Op&) {
            const char* from = alias_of(src);
            if (!from) return freed_outcome(src);
            std::memcpy(reinterpret_cast<char*>(dst), from, bytes);
            return LaunchOutcome{};
        };
    } else {
        op->body = [dst, src, bytes](Op&) {
            const char* from = alias_of(src);
            char* to = alias_of(dst);
            if (!from) return freed_outcome(src);
            if (!to) return freed_outcome(dst);
            std::memmove(to, from, bytes);
            return LaunchOutcome{};
        };
    }
    out = op;
    return CUDA_SUCCESS;
}

// Runs `w` on `s`, or captures it when `s` captures. Device ranges are checked at the call
// either way (a captured copy of memory that is not there is the call's error).
CUresult submit(Stream* s, const Work& w) {
    if (w.kind != Work::Kind::Kernel) {
        Op probe;
        if (CUresult r = check_ranges(ranges_of(w), probe, true)) return r;
    }
    CUresult code;
    if (captured(s, &w, w.name, code)) return code;
    std::shared_ptr<Op> op;
    if (CUresult r = make_op(w, -1, op)) return r;
    return enqueue(s, op);
}

CUresult copy_async(std::uintptr_t dst, bool dst_device, std::uintptr_t src, bool src_device, std::size_t bytes,
                    Stream* s, const char* name) {
    if (bytes == 0) return CUDA_SUCCESS;
    if (CUresult sticky = sticky_of(s->ctx)) return sticky;
    Work w;
    w.kind = Work::Kind::Copy;
    w.name = name;
    w.dst = dst;
    w.dst_device = dst_device;
    w.src = src;
    w.src_device = src_device;
    w.bytes = bytes;
    return submit(s, w);
}

CUresult memset_async(std::uintptr_t dst, unsigned char value, std::size_t count, Stream* s) {
    if (count == 0) return CUDA_SUCCESS;
    if (CUresult sticky = sticky_of(s->ctx)) return sticky;
    Work w;
    w.kind = Work::Kind::Memset;
    w.name = "cuMemsetD8Async";
    w.dst = dst;
    w.bytes = count;
    w.value = value;
    return submit(s, w);
}

Stream* resolve(CUstream hs) { return stream_of(hs, tls_current); }

}  // namespace

#define STREAM_OR_FAIL(s, hs)                        \
    REQUIRE_INIT();                                  \
    Stream* s = resolve(hs);                         \
    if (!s) return CUDA_ERROR_INVALID_CONTEXT

STANDIN_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, std::size_t bytes, CUstream hs) {
    AUDIT();
    STREAM_OR_FAIL(s, hs);
    return copy_async(dst, true, reinterpret_cast<std::uintptr_t>(src), false, bytes, s, "cuMemcpyHtoDAsync");
}

STANDIN_API CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, std::size_t bytes, CUstream hs) {
    AUDIT();
    STREAM_OR_FAIL(s, hs);
    return copy_async(reinterpret_cast<std::uintptr_t>(dst), false, src, true, bytes, s, "cuMemcpyDtoHAsync");
}

STANDIN_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream hs) {
    AUDIT();
    STREAM_OR_FAIL(s, hs);
    return copy_async(dst, true, src, true, bytes, s, "cuMemcpyDtoDAsync");
}

STANDIN_API CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
                                       std::size_t bytes, CUstream hs) {
    AUDIT();
    STREAM_OR_FAIL(s, hs);
    if (!dst_ctx || !src_ctx) return CUDA_ERROR_INVALID_CONTEXT;
    return copy_async(dst, true, src, true, bytes, s, "cuMemcpyPeerAsync");
}

STANDIN_API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, std::size_t count, CUstream hs) {
    AUDIT();
    STREAM_OR_FAIL(s, hs);
    return memset_async(dst, value, count, s);
}

// ---- pinned host memory (see is_pinned)
STANDIN_API CUresult cuMemHostAlloc(void** pp, std::size_t bytes, unsigned flags) {
    AUDIT();
    REQUIRE_INIT();
    // CU_MEMHOSTALLOC_PORTABLE, _DEVICEMAP, _WRITECOMBINED: all hosts' memory is alike here.
    if (!pp || (flags & ~0x7u) != 0) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = unsafe_call("cuMemHostAlloc")) return r;
    return pin(pp, bytes, true, nullptr, true);
}

// cuMemHostAlloc with no flags, as the driver documents it.
STANDIN_API CUresult cuMemAllocHost_v2(void** pp, std::size_t bytes) { return cuMemHostAlloc(pp, bytes, 0); }

STANDIN_API CUresult cuMemFreeHost(void* p) {
    AUDIT();
    REQUIRE_INIT();
    if (CUresult r = unsafe_call("cuMemFreeHost")) return r;
    return unpin(p, true);
}

STANDIN_API CUresult cuMemHostRegister_v2(void* p, std::size_t bytes, unsigned flags) {
    AUDIT();
    REQUIRE_INIT();
    // CU_MEMHOSTREGISTER_PORTABLE, _DEVICEMAP, _IOMEMORY, _READ_ONLY.
    if (!p || (flags & ~0xFu) != 0) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = unsafe_call("cuMemHostRegister")) return r;
    return pin(nullptr, bytes, false, p, (flags & CU_MEMHOSTREGISTER_DEVICEMAP) != 0);
}

// The address kernels use for mapped pinned memory: the host's own (unified addressing). Memory
// that is not pinned, or registered without CU_MEMHOSTREGISTER_DEVICEMAP, has none.
STANDIN_API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* out, void* p, unsigned flags) {
    AUDIT();
    REQUIRE_INIT();
    if (!out || !p || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    auto addr = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard<std::mutex> lock(pinned_lock);
    auto it = pinned.upper_bound(addr);
    if (it == pinned.begin()) return CUDA_ERROR_INVALID_VALUE;
    --it;
    if (addr >= it->first + it->second.bytes || !it->second.mapped) return CUDA_ERROR_INVALID_VALUE;
    *out = static_cast<CUdeviceptr>(addr);
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuMemHostUnregister(void* p) {
    AUDIT();
    REQUIRE_INIT();
    if (CUresult r = unsafe_call("cuMemHostUnregister")) return r;
    return unpin(p, false);
}

// The synchronous forms: the legacy NULL stream of the current context, then wait.
STANDIN_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, std::size_t bytes) {
    AUDIT();
    CURRENT_CONTEXT(ctx);
    if (CUresult r = unsafe_call("cuMemcpyHtoD")) return r;
    if (CUresult r = copy_async(dst, true, reinterpret_cast<std::uintptr_t>(src), false, bytes, ctx->legacy,
                                "cuMemcpyHtoD"))
        return r;
    return drain(ctx->legacy);
}

STANDIN_API CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, std::size_t bytes) {
    AUDIT();
    CURRENT_CONTEXT(ctx);
    if (CUresult r = unsafe_call("cuMemcpyDtoH")) return r;
    if (CUresult r = copy_async(reinterpret_cast<std::uintptr_t>(dst), false, src, true, bytes, ctx->legacy,
                                "cuMemcpyDtoH"))
        return r;
    return drain(ctx->legacy);
}

STANDIN_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes) {
    AUDIT();
    CURRENT_CONTEXT(ctx);
    if (CUresult r = unsafe_call("cuMemcpyDtoD")) return r;
    if (CUresult r = copy_async(dst, true, src, true, bytes, ctx->legacy, "cuMemcpyDtoD")) return r;
    return drain(ctx->legacy);
}

STANDIN_API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, std::size_t count) {
    AUDIT();
    CURRENT_CONTEXT(ctx);
    if (CUresult r = unsafe_call("cuMemsetD8")) return r;
    if (CUresult r = memset_async(dst, value, count, ctx->legacy)) return r;
    return drain(ctx->legacy);
}

// ---- modules and functions
namespace {

// Bytes of a module image: a fatbin (its header gives the size), an ELF cubin (up to the
// end of its section header table), or NUL-terminated PTX text.
std::size_t image_size(const unsigned char* p) {
    std::uint32_t magic;
    std::memcpy(&magic, p, 4);
    if (magic == 0xBA55ED50u) {  // fatbin
        std::uint16_t header;
        std::uint64_t body;
        std::memcpy(&header, p + 6, 2);
        std::memcpy(&body, p + 8, 8);
        return header + body;
    }
    if (std::memcmp(p, "\x7f" "ELF", 4) == 0) {
        std::uint64_t shoff;
        std::uint16_t shentsize, shnum;
        std::memcpy(&shoff, p + 0x28, 8);
        std::memcpy(&shentsize, p + 0x3a, 2);
        std::memcpy(&shnum, p + 0x3c, 2);
        return shoff + static_cast<std::size_t>(shentsize) * shnum;
    }
    return std::strlen(reinterpret_cast<const char*>(p));
}

bool looks_like_ptx(const unsigned char* p, std::size_t n) {
    std::string head(reinterpret_cast<const char*>(p), std::min<std::size_t>(n, 4096));
    return head.find(".version") != std::string::npos && head.find(".target") != std::string::npos;
}

// The PTX ISA a driver of `version` (e.g. 13000) JIT-compiles: 9.0 for 13.0, one minor per
// minor release; 12.x drivers take 8.x.
int supported_ptx_isa(int version) {
    int major = version / 1000, minor = (version % 1000) / 10;
    if (major >= 13) return 90 + minor;
    if (major == 12) return 80 + std::min(minor, 8);
    return 70;
}

}  // namespace

STANDIN_API CUresult cuModuleLoadData(CUmodule* out, const void* image) {
    AUDIT();
    CURRENT_CONTEXT(ctx);
    if (!out || !image) return CUDA_ERROR_INVALID_VALUE;
    const auto* p = static_cast<const unsigned char*>(image);
    std::size_t size = image_size(p);
    std::uint32_t magic;
    std::memcpy(&magic, p, 4);
    bool fatbin = magic == 0xBA55ED50u, elf = std::memcmp(p, "\x7f" "ELF", 4) == 0;
    if (!fatbin && !elf && !looks_like_ptx(p, size)) return CUDA_ERROR_INVALID_IMAGE;
    if (!fatbin && !elf) {
        // PTX must be JIT-compiled by the driver: its ISA version must be one the driver knows.
        std::string text(reinterpret_cast<const char*>(p), std::min<std::size_t>(size, 4096));
        std::size_t at = text.find(".version");
        int maj = 0, min = 0;
        if (at == std::string::npos || std::sscanf(text.c_str() + at, ".version %d.%d", &maj, &min) != 2)
            return CUDA_ERROR_INVALID_PTX;
        int driver = 0;
        cuDriverGetVersion(&driver);
        if (maj * 10 + min > supported_ptx_isa(driver)) {
            report("PTX ISA " + std::to_string(maj) + "." + std::to_string(min) +
                   " is newer than this driver (CUDA " + std::to_string(driver / 1000) + "." +
                   std::to_string((driver % 1000) / 10) + ") can JIT-compile");
            return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
        }
    }
    Executor* exec;
    {
        std::lock_guard<std::mutex> lock(g->api);
        exec = ctx->dev->exec ? ctx->dev->exec : &executor();
    }
    // Machine code is for a GPU this is not: the PTX executor runs PTX only (a real driver
    // refuses a cubin of another architecture the same way, and a caller then tries PTX).
    if (elf && exec == &ptx_executor()) {
        report("cuModuleLoadData: the image is a cubin (machine code), and this GPU's PTX executor runs PTX only");
        return CUDA_ERROR_NO_BINARY_FOR_GPU;
    }
    if (g->config.jit_ms > 0)
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(g->config.jit_ms));
    auto* m = new Module;
    m->ctx = ctx;
    for (KernelInfo& k : exec->kernels_in(p, size)) {
        auto f = std::make_unique<Function>();
        f->module = m;
        f->exec = exec;
        f->info = std::move(k);
        m->names.push_back(f->info.name);
        m->functions.push_back(std::move(f));
    }
    {
        std::lock_guard<std::mutex> lock(g->api);
        ++ctx->dev->module_loads;
    }
    *out = reinterpret_cast<CUmodule>(m);
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuModuleLoad(CUmodule* out, const char* path) {
    REQUIRE_INIT();
    if (!path) return CUDA_ERROR_INVALID_VALUE;
    std::ifstream in(path, std::ios::binary);
    if (!in) return CUDA_ERROR_NOT_FOUND;
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    bytes.push_back('\0');
    return cuModuleLoadData(out, bytes.data());
}

STANDIN_API CUresult cuModuleUnload(CUmodule h) {
    AUDIT();
    REQUIRE_INIT();
    if (!h) return CUDA_ERROR_INVALID_HANDLE;
    // Kept alive: queued launches may still name its functions.
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuModuleGetFunction(CUfunction* out, CUmodule h, const char* name) {
    AUDIT();
    REQUIRE_INIT();
    auto* m = reinterpret_cast<Module*>(h);
    if (!out || !m || !name) return CUDA_ERROR_INVALID_VALUE;
    for (auto& f : m->functions) {
        if (f->info.name == name) {
            *out = reinterpret_cast<CUfunction>(f.get());
            return CUDA_SUCCESS;
        }
    }
    Executor* exec = m->ctx->dev->exec ? m->ctx->dev->exec : &executor();
    report(std::string("cuModuleGetFunction: the module has no kernel `") + name + "` the " + exec->name() +
           " can run");
    return CUDA_ERROR_NOT_FOUND;
}

STANDIN_API CUresult cuFuncGetAttribute(int* value, int attribute, CUfunction h) {
    AUDIT();
    REQUIRE_INIT();
    auto* f = reinterpret_cast<Function*>(h);
    if (!value || !f) return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
        case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = f->info.max_threads ? static_cast<int>(f->info.max_threads) : 1024; break;
        case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *value = 0; break;
        case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: *value = 0; break;
        case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: *value = 0; break;
        case CU_FUNC_ATTRIBUTE_NUM_REGS: *value = 32; break;
        case CU_FUNC_ATTRIBUTE_PTX_VERSION: *value = 90; break;
        case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *value = 90; break;
        case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *value = static_cast<int>(f->max_dynamic_shared); break;
        default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuFuncSetAttribute(CUfunction h, int attribute, int value) {
    AUDIT();
    REQUIRE_INIT();
    auto* f = reinterpret_cast<Function*>(h);
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (attribute != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) return CUDA_SUCCESS;  // hints only
    if (value < 0 || static_cast<unsigned>(value) > OPTIN_SHARED_LIMIT) return CUDA_ERROR_INVALID_VALUE;
    f->max_dynamic_shared = static_cast<unsigned>(value);
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuFuncSetCacheConfig(CUfunction h, int config) {
    AUDIT();
    (void)config;
    return h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

STANDIN_API CUresult cuLaunchKernel(CUfunction h, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned shared, CUstream hs, void** params, void** extra) {
    AUDIT();
    CURRENT_CONTEXT(ctx);
    auto* f = reinterpret_cast<Function*>(h);
    Stream* s = stream_of(hs, ctx);
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (extra) return CUDA_ERROR_NOT_SUPPORTED;
    // A function and a stream belong to one context, which must be the current one.
    if (f->module->ctx != ctx || s->ctx != ctx) {
        report("cuLaunchKernel of `" + f->info.name + "`: the " +
               std::string(f->module->ctx != ctx ? "function's module" : "stream") +
               " belongs to another GPU's context than the current one (GPU " + std::to_string(ctx->dev->ordinal) + ")");
        return CUDA_ERROR_INVALID_HANDLE;
    }
    const std::string& name = f->info.name;
    unsigned long long threads = static_cast<unsigned long long>(bx) * by * bz;
    auto bad = [&](CUresult code, const std::string& why) {
        report("cuLaunchKernel of `" + name + "`: " + why);
        return code;
    };
    if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0)
        return bad(CUDA_ERROR_INVALID_VALUE, "a grid or block dimension is 0");
    if (bx > 1024 || by > 1024 || bz > 64 || threads > 1024)
        return bad(CUDA_ERROR_INVALID_VALUE, "block (" + std::to_string(bx) + ", " + std::to_string(by) + ", " +
                                                 std::to_string(bz) + ") exceeds 1024 threads or (1024, 1024, 64)");
    if (gx > 2147483647u || gy > 65535 || gz > 65535)
        return bad(CUDA_ERROR_INVALID_VALUE, "grid (" + std::to_string(gx) + ", " + std::to_string(gy) + ", " +
                                                 std::to_string(gz) + ") exceeds (2^31-1, 65535, 65535)");
    if (f->info.max_threads && threads > f->info.max_threads)
        return bad(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
                   std::to_string(threads) + " threads per block, but the kernel is compiled with __launch_bounds__(" +
                       std::to_string(f->info.max_threads) + ")");
    if (shared > f->max_dynamic_shared)
        return bad(CUDA_ERROR_INVALID_VALUE,
                   std::to_string(shared) + " bytes of dynamic shared memory, above the kernel's limit of " +
                       std::to_string(f->max_dynamic_shared) +
                       (f->max_dynamic_shared == STATIC_SHARED_LIMIT
                            ? " (48 KiB unless CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES is raised)"
                            : ""));
    if (!params && !f->info.params.empty()) return bad(CUDA_ERROR_INVALID_VALUE, "kernelParams is null");
    // Arguments are copied now, as the driver does; the launch runs later (or, captured, at
    // every launch of the graph, with the values of this call).
    Work w;
    w.kind = Work::Kind::Kernel;
    w.name = "cuLaunchKernel of `" + name + "`";
    w.fn = f;
    w.shape = LaunchShape{{gx, gy, gz}, {bx, by, bz}, shared};
    w.values = std::make_shared<std::vector<std::uint64_t>>(f->info.params.size(), 0);
    for (std::size_t i = 0; i < f->info.params.size(); ++i) {
        char kind = f->info.params[i];
        std::size_t bytes = kind == 'r' || kind == 'w' ? 8 : static_cast<std::size_t>(kind - '0');
        std::memcpy(&(*w.values)[i], params[i], bytes);
    }
    return submit(s, w);
}

// ---- stream capture (see "stream capture" above)
STANDIN_API CUresult cuStreamBeginCapture_v2(CUstream hs, int mode) {
    AUDIT();
    REQUIRE_INIT();
    Stream* s = stream_of(hs, tls_current);
    if (!s) return CUDA_ERROR_INVALID_CONTEXT;
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    if (CUresult sticky = sticky_of(s->ctx)) return sticky;
    std::lock_guard<std::mutex> api(g->api);
    if (s->legacy)
        return capture_error_locked(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, nullptr,
                                    "cuStreamBeginCapture on " + stream_name(s) + ": the legacy stream cannot be captured");
    if (s->capture)
        return capture_error_locked(CUDA_ERROR_ILLEGAL_STATE, nullptr,
                                    "cuStreamBeginCapture on " + stream_name(s) + ", which " + capture_name(s->capture) +
                                        " is capturing already");
    auto* c = new Capture;
    c->id = next_capture_id++;
    c->mode = mode;
    c->thread = std::this_thread::get_id();
    c->origin = s;
    c->streams.push_back(s);
    c->graph = new Graph;
    c->graph->data = std::make_shared<GraphData>();
    c->graph->data->ctx = s->ctx;
    s->capture = c;
    s->capture_tail.clear();
    captures[c->id] = c;
    active_captures.store(static_cast<int>(captures.size()));
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuStreamEndCapture(CUstream hs, CUgraph* out) {
    AUDIT();
    REQUIRE_INIT();
    Stream* s = stream_of(hs, tls_current);
    if (!s) return CUDA_ERROR_INVALID_CONTEXT;
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> api(g->api);
    Capture* c = s->capture;
    std::string what = "cuStreamEndCapture on " + stream_name(s);
    if (!c) return capture_error_locked(CUDA_ERROR_ILLEGAL_STATE, nullptr, what + ", which is not capturing");
    if (c->origin != s)
        return capture_error_locked(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, c,
                                    what + ", which joined " + capture_name(c) + ": a capture ends on the stream it began on");
    if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && c->thread != std::this_thread::get_id())
        return capture_error_locked(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, nullptr,
                                    what + " from another thread than began " + capture_name(c) +
                                        " (a GLOBAL or THREAD_LOCAL capture ends on the thread that began it; RELAXED "
                                        "captures may end anywhere)");
    std::vector<Node*> origin_tail = s->capture_tail;
    terminate_locked(c);
    *out = nullptr;
    CUresult code = CUDA_SUCCESS;
    if (c->invalidated) {
        code = capture_error_locked(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, nullptr,
                                    what + ": the capture was invalidated: " + c->why);
    } else {
        // Joined: every node without dependents is one the origin's next work would depend on.
        const GraphData& data = *c->graph->data;
        std::vector<bool> has_dependents(data.nodes.size(), false);
        for (const Node& n : data.nodes)
            for (const Node* d : n.deps) has_dependents[d->index] = true;
        std::string unjoined;
        for (const Node& n : data.nodes) {
            if (has_dependents[n.index] || std::find(origin_tail.begin(), origin_tail.end(), &n) != origin_tail.end())
                continue;
            std::string name = stream_name(c->streams[static_cast<std::size_t>(n.lane)]);
            if (unjoined.find(name) == std::string::npos) unjoined += (unjoined.empty() ? "" : ", ") + name;
        }
        if (!unjoined.empty())
            code = capture_error_locked(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, nullptr,
                                        what + ": work forked to " + unjoined +
                                            " was never joined back (record an event there and make the origin "
                                            "stream wait for it before ending the capture)");
    }
    if (code == CUDA_SUCCESS) *out = reinterpret_cast<CUgraph>(c->graph);
    else delete c->graph;
    delete c;
    return code;
}

STANDIN_API CUresult cuStreamIsCapturing(CUstream hs, int* status) {
    AUDIT();
    REQUIRE_INIT();
    Stream* s = stream_of(hs, tls_current);
    if (!s) return CUDA_ERROR_INVALID_CONTEXT;
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> api(g->api);
    // Asked of the legacy stream while a blocking stream captures: the documented error, but the
    // capture stays valid.
    if (CUresult r = legacy_rule_locked(s, "cuStreamIsCapturing", false)) return r;
    Capture* c = s->capture;
    *status = !c ? CU_STREAM_CAPTURE_STATUS_NONE
              : c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                               : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    return CUDA_SUCCESS;
}

// The capture `hs` takes part in: its status, and while active its id, graph, and the nodes the
// stream's next captured work will depend on (with default edge data). The arrays stay valid
// until the stream's next captured call.
STANDIN_API CUresult cuStreamGetCaptureInfo_v3(CUstream hs, int* status, std::uint64_t* id, CUgraph* graph,
                                               const CUgraphNode** deps, const CUgraphEdgeData** edges,
                                               std::size_t* count) {
    AUDIT();
    REQUIRE_INIT();
    Stream* s = stream_of(hs, tls_current);
    if (!s) return CUDA_ERROR_INVALID_CONTEXT;
    if (!status || (edges && !deps)) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> api(g->api);
    if (CUresult r = legacy_rule_locked(s, "cuStreamGetCaptureInfo", false)) return r;
    Capture* c = s->capture;
    *status = !c ? CU_STREAM_CAPTURE_STATUS_NONE
              : c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                               : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    if (!c || c->invalidated) return CUDA_SUCCESS;
    if (id) *id = c->id;
    if (graph) *graph = reinterpret_cast<CUgraph>(c->graph);
    s->capture_edges.assign(s->capture_tail.size(), CUgraphEdgeData{});
    if (deps) *deps = reinterpret_cast<const CUgraphNode*>(s->capture_tail.data());
    if (edges) *edges = s->capture_edges.data();
    if (count) *count = s->capture_tail.size();
    return CUDA_SUCCESS;
}

// cuStreamGetCaptureInfo_v3 without edge data (CUDA 11.3 to 12.2's cuStreamGetCaptureInfo).
STANDIN_API CUresult cuStreamGetCaptureInfo_v2(CUstream hs, int* status, std::uint64_t* id, CUgraph* graph,
                                               const CUgraphNode** deps, std::size_t* count) {
    return cuStreamGetCaptureInfo_v3(hs, status, id, graph, deps, nullptr, count);
}

STANDIN_API CUresult cuThreadExchangeStreamCaptureMode(int* mode) {
    AUDIT();
    REQUIRE_INIT();
    if (!mode || *mode < CU_STREAM_CAPTURE_MODE_GLOBAL || *mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    std::swap(*mode, tls_capture_mode);
    return CUDA_SUCCESS;
}

// ---- graphs
namespace {

// A graph ready to launch: its nodes, and a stream per lane beyond the first (lane 0 runs on the
// launch stream), so that nodes the capture left unordered stay unordered at every launch and a
// hazard between them is reported as between two streams.
struct GraphExec {
    std::shared_ptr<GraphData> data;
    Context* ctx = nullptr;
    std::vector<Stream*> lanes;  // [0] unused: the launch stream
    Point last_end;              // where the previous launch ended: the next is ordered after it
};

// The point just after `op`, which enqueue has placed.
Point point_after(const Op& op) {
    Point p;
    p.stream = op.stream;
    p.seq = op.seq;
    p.clock = op.clock;
    p.clock.resize(std::max(p.clock.size(), static_cast<std::size_t>(op.stream->id) + 1), 0);
    p.clock[static_cast<std::size_t>(op.stream->id)] = op.seq;
    return p;
}

// An operation that does nothing but order: what it waits for comes before what follows it.
std::shared_ptr<Op> marker(const std::string& what) {
    auto op = std::make_shared<Op>();
    op->what = what;
    op->body = [](Op&) { return LaunchOutcome{}; };
    return op;
}

// What cuGraphLaunch and cuGraphUpload check of their graph and stream.
CUresult graph_stream_rules(GraphExec* x, Stream* s, const char* entry) {
    if (s->ctx != x->ctx) {
        report(std::string(entry) + ": the graph was instantiated on GPU " + std::to_string(x->ctx->dev->ordinal) +
               " and " + stream_name(s) + " belongs to another");
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (CUresult sticky = sticky_of(s->ctx)) return sticky;
    CUresult code;
    if (captured(s, nullptr, entry, code,
                 "a graph launched into a capture would become a child graph node, which the stand-in does not model"))
        return code;
    return CUDA_SUCCESS;
}

}  // namespace

STANDIN_API CUresult cuGraphInstantiateWithFlags(CUgraphExec* out, CUgraph hg, unsigned long long flags) {
    AUDIT();
    REQUIRE_INIT();
    auto* graph = reinterpret_cast<Graph*>(hg);
    if (!out || !graph) return CUDA_ERROR_INVALID_VALUE;
    // AUTO_FREE_ON_LAUNCH and USE_NODE_PRIORITY change nothing here (no memory nodes, one
    // priority); UPLOAD needs cuGraphInstantiateWithParams' stream; a device launch excludes
    // AUTO_FREE_ON_LAUNCH, and is not modelled.
    const unsigned long long known = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                     CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH |
                                     CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
    if ((flags & ~known) != 0) return CUDA_ERROR_INVALID_VALUE;
    if (flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH) {
        if (flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) return CUDA_ERROR_INVALID_VALUE;
        report("cuGraphInstantiateWithFlags: CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH (graphs launched from the "
               "device) is not modelled by the stand-in");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    auto* x = new GraphExec;
    x->data = graph->data;
    x->ctx = graph->data->ctx;
    x->lanes.assign(static_cast<std::size_t>(x->data->lanes), nullptr);
    for (std::size_t i = 1; i < x->lanes.size(); ++i) x->lanes[i] = new_stream(x->ctx, false, false);
    *out = reinterpret_cast<CUgraphExec>(x);
    return CUDA_SUCCESS;
}

// CUDA 11's form: no error node or log to give (instantiation fails only on flags here).
STANDIN_API CUresult cuGraphInstantiate_v2(CUgraphExec* out, CUgraph hg, CUgraphNode* error_node, char* log,
                                           std::size_t log_size) {
    if (error_node) *error_node = nullptr;
    if (log && log_size) log[0] = '\0';
    return cuGraphInstantiateWithFlags(out, hg, 0);
}

// Nothing to upload ahead of a launch here; the graph and stream are checked as a launch would.
STANDIN_API CUresult cuGraphUpload(CUgraphExec hx, CUstream hs) {
    AUDIT();
    REQUIRE_INIT();
    auto* x = reinterpret_cast<GraphExec*>(hx);
    Stream* s = stream_of(hs, tls_current);
    if (!x) return CUDA_ERROR_INVALID_VALUE;
    if (!s) return CUDA_ERROR_INVALID_CONTEXT;
    return graph_stream_rules(x, s, "cuGraphUpload");
}

// Enqueues the graph's nodes through enqueue, as eager work is: a marker on `hs` after its
// earlier work and the graph's previous launch; each node, in capture order, on its lane's
// stream, waiting for its dependencies on other lanes; a marker on `hs` that waits for every
// lane. The nodes' operations are made anew (make_op): kernels with the arguments frozen at
// capture, host sources read when the copy runs. No node is a cuLaunchKernel call to the audit.
STANDIN_API CUresult cuGraphLaunch(CUgraphExec hx, CUstream hs) {
    AUDIT();
    REQUIRE_INIT();
    auto* x = reinterpret_cast<GraphExec*>(hx);
    Stream* s = stream_of(hs, tls_current);
    if (!x) return CUDA_ERROR_INVALID_VALUE;
    if (!s) return CUDA_ERROR_INVALID_CONTEXT;
    if (CUresult r = graph_stream_rules(x, s, "cuGraphLaunch")) return r;
    const GraphData& data = *x->data;
    auto start = marker("cuGraphLaunch: start");
    if (CUresult r = enqueue(s, start, {&x->last_end})) return r;
    std::vector<Point> lane_end(x->lanes.size());
    lane_end[0] = point_after(*start);
    for (std::size_t i = 1; i < x->lanes.size(); ++i) {
        auto fork = marker("cuGraphLaunch: lane " + std::to_string(i) + " start");
        if (CUresult r = enqueue(x->lanes[i], fork, {&lane_end[0]})) return r;
        lane_end[i] = point_after(*fork);
    }
    std::vector<Point> done(data.nodes.size());
    for (const Node& n : data.nodes) {
        std::shared_ptr<Op> op;
        make_op(n.work, static_cast<long>(n.index), op);
        std::vector<const Point*> waits;
        for (const Node* d : n.deps)
            if (d->lane != n.lane) waits.push_back(&done[d->index]);
        Stream* lane = n.lane == 0 ? s : x->lanes[static_cast<std::size_t>(n.lane)];
        if (CUresult r = enqueue(lane, op, waits)) return r;
        done[n.index] = point_after(*op);
        lane_end[static_cast<std::size_t>(n.lane)] = done[n.index];
    }
    auto end = marker("cuGraphLaunch: end");
    std::vector<const Point*> lanes;
    for (std::size_t i = 1; i < lane_end.size(); ++i) lanes.push_back(&lane_end[i]);
    if (CUresult r = enqueue(s, end, lanes)) return r;
    x->last_end = point_after(*end);
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuGraphExecDestroy(CUgraphExec hx) {
    AUDIT();
    REQUIRE_INIT();
    auto* x = reinterpret_cast<GraphExec*>(hx);
    if (!x) return CUDA_ERROR_INVALID_VALUE;
    // Launches still queued complete (their operations hold what they need); the lanes' threads
    // then end, as a destroyed stream's do.
    for (std::size_t i = 1; i < x->lanes.size(); ++i) {
        Stream* lane = x->lanes[i];
        std::lock_guard<std::mutex> lock(lane->m);
        lane->closing = true;
        lane->demand = lane->enqueued;
        lane->cv.notify_all();
    }
    delete x;
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuGraphDestroy(CUgraph hg) {
    AUDIT();
    REQUIRE_INIT();
    auto* graph = reinterpret_cast<Graph*>(hg);
    if (!graph) return CUDA_ERROR_INVALID_VALUE;
    delete graph;  // its nodes live on in the executables made from it
    return CUDA_SUCCESS;
}

// ---- graph inspection
// The nodes in capture order. As the driver documents: a null `nodes` asks for the count; a
// larger *count than there are nodes gets null entries after them and the true count.
STANDIN_API CUresult cuGraphGetNodes(CUgraph hg, CUgraphNode* nodes, std::size_t* count) {
    AUDIT();
    REQUIRE_INIT();
    auto* graph = reinterpret_cast<Graph*>(hg);
    if (!graph || !count) return CUDA_ERROR_INVALID_VALUE;
    std::deque<Node>& all = graph->data->nodes;
    if (nodes) {
        for (std::size_t i = 0; i < *count; ++i)
            nodes[i] = i < all.size() ? reinterpret_cast<CUgraphNode>(&all[i]) : nullptr;
        *count = std::min(*count, all.size());
    } else {
        *count = all.size();
    }
    return CUDA_SUCCESS;
}

STANDIN_API CUresult cuGraphNodeGetType(CUgraphNode hn, int* type) {
    AUDIT();
    REQUIRE_INIT();
    auto* n = reinterpret_cast<Node*>(hn);
    if (!n || !type) return CUDA_ERROR_INVALID_VALUE;
    *type = n->type();
    return CUDA_SUCCESS;
}

// A kernel node's launch: its function and shape, and kernelParams pointing into the graph's
// own copy of the arguments (the values of the captured call).
STANDIN_API CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode hn, CUDA_KERNEL_NODE_PARAMS* p) {
    AUDIT();
    REQUIRE_INIT();
    auto* n = reinterpret_cast<Node*>(hn);
    if (!n || !p || n->work.kind != Work::Kind::Kernel) return CUDA_ERROR_INVALID_VALUE;
    const Work& w = n->work;
    *p = CUDA_KERNEL_NODE_PARAMS{};
    p->func = reinterpret_cast<CUfunction>(w.fn);
    p->gridDimX = w.shape.grid[0];
    p->gridDimY = w.shape.grid[1];
    p->gridDimZ = w.shape.grid[2];
    p->blockDimX = w.shape.block[0];
    p->blockDimY = w.shape.block[1];
    p->blockDimZ = w.shape.block[2];
    p->sharedMemBytes = w.shape.shared_bytes;
    p->kernelParams = n->params.data();
    p->ctx = reinterpret_cast<CUcontext>(w.fn->module->ctx);
    return CUDA_SUCCESS;
}

// The dependency edges (from: the node depended on), with default edge data. Null `from` and
// `to` ask for the count; otherwise as cuGraphGetNodes fills its array.
STANDIN_API CUresult cuGraphGetEdges_v2(CUgraph hg, CUgraphNode* from, CUgraphNode* to, CUgraphEdgeData* edges,
                                        std::size_t* count) {
    AUDIT();
    REQUIRE_INIT();
    auto* graph = reinterpret_cast<Graph*>(hg);
    if (!graph || !count || (!from != !to) || (edges && !from)) return CUDA_ERROR_INVALID_VALUE;
    std::vector<std::pair<Node*, Node*>> all;
    for (Node& n : graph->data->nodes)
        for (Node* d : n.deps) all.emplace_back(d, &n);
    if (!from) {
        *count = all.size();
        return CUDA_SUCCESS;
    }
    for (std::size_t i = 0; i < *count; ++i) {
        bool real = i < all.size();
        from[i] = real ? reinterpret_cast<CUgraphNode>(all[i].first) : nullptr;
        to[i] = real ? reinterpret_cast<CUgraphNode>(all[i].second) : nullptr;
        if (edges) edges[i] = CUgraphEdgeData{};
    }
    *count = std::min(*count, all.size());
    return CUDA_SUCCESS;
}

// cuGraphGetEdges_v2 without edge data (CUDA 12.2 and earlier).
STANDIN_API CUresult cuGraphGetEdges(CUgraph hg, CUgraphNode* from, CUgraphNode* to, std::size_t* count) {
    return cuGraphGetEdges_v2(hg, from, to, nullptr, count);
}

STANDIN_API CUresult cuGetErrorName(CUresult code, const char** out) {
    AUDIT();
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    switch (code) {
#define NAME(c) \
    case c:     \
        *out = #c; \
        return CUDA_SUCCESS;
        NAME(CUDA_SUCCESS)
        NAME(CUDA_ERROR_INVALID_VALUE)
        NAME(CUDA_ERROR_OUT_OF_MEMORY)
        NAME(CUDA_ERROR_NOT_INITIALIZED)
        NAME(CUDA_ERROR_NO_DEVICE)
        NAME(CUDA_ERROR_INVALID_DEVICE)
        NAME(CUDA_ERROR_INVALID_IMAGE)
        NAME(CUDA_ERROR_INVALID_CONTEXT)
        NAME(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED)
        NAME(CUDA_ERROR_INVALID_PTX)
        NAME(CUDA_ERROR_UNSUPPORTED_PTX_VERSION)
        NAME(CUDA_ERROR_INVALID_HANDLE)
        NAME(CUDA_ERROR_ILLEGAL_STATE)
        NAME(CUDA_ERROR_NOT_FOUND)
        NAME(CUDA_ERROR_NOT_READY)
        NAME(CUDA_ERROR_ILLEGAL_ADDRESS)
        NAME(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)
        NAME(CUDA_ERROR_LAUNCH_TIMEOUT)
        NAME(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
        NAME(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)
        NAME(CUDA_ERROR_LAUNCH_FAILED)
        NAME(CUDA_ERROR_NOT_SUPPORTED)
        NAME(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
        NAME(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
        NAME(CUDA_ERROR_STREAM_CAPTURE_MERGE)
        NAME(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED)
        NAME(CUDA_ERROR_STREAM_CAPTURE_UNJOINED)
        NAME(CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
        NAME(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
        NAME(CUDA_ERROR_CAPTURED_EVENT)
        NAME(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD)
        NAME(CUDA_ERROR_UNKNOWN)
#undef NAME
        default:
            *out = nullptr;
            return CUDA_ERROR_INVALID_VALUE;
    }
}

STANDIN_API CUresult cuGetErrorString(CUresult code, const char** out) {
    AUDIT();
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    switch (code) {
        case CUDA_SUCCESS: *out = "no error"; break;
        case CUDA_ERROR_INVALID_VALUE: *out = "invalid argument"; break;
        case CUDA_ERROR_OUT_OF_MEMORY: *out = "out of memory"; break;
        case CUDA_ERROR_NOT_INITIALIZED: *out = "initialization error"; break;
        case CUDA_ERROR_NO_DEVICE: *out = "no CUDA-capable device is detected"; break;
        case CUDA_ERROR_INVALID_DEVICE: *out = "invalid device ordinal"; break;
        case CUDA_ERROR_INVALID_IMAGE: *out = "device kernel image is invalid"; break;
        case CUDA_ERROR_INVALID_CONTEXT: *out = "invalid device context"; break;
        case CUDA_ERROR_NO_BINARY_FOR_GPU: *out = "no kernel image is available for execution on the device"; break;
        case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: *out = "peer access is not supported between these two devices"; break;
        case CUDA_ERROR_INVALID_PTX: *out = "a PTX JIT compilation failed"; break;
        case CUDA_ERROR_UNSUPPORTED_PTX_VERSION: *out = "the provided PTX was compiled with an unsupported toolchain."; break;
        case CUDA_ERROR_INVALID_HANDLE: *out = "invalid resource handle"; break;
        case CUDA_ERROR_ILLEGAL_STATE: *out = "the operation cannot be performed in the present state"; break;
        case CUDA_ERROR_NOT_FOUND: *out = "named symbol not found"; break;
        case CUDA_ERROR_NOT_READY: *out = "device not ready"; break;
        case CUDA_ERROR_ILLEGAL_ADDRESS: *out = "an illegal memory access was encountered"; break;
        case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: *out = "too many resources requested for launch"; break;
        case CUDA_ERROR_LAUNCH_TIMEOUT: *out = "the launch timed out and was terminated"; break;
        case CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: *out = "peer access is already enabled"; break;
        case CUDA_ERROR_PEER_ACCESS_NOT_ENABLED: *out = "peer access has not been enabled"; break;
        case CUDA_ERROR_LAUNCH_FAILED: *out = "unspecified launch failure"; break;
        case CUDA_ERROR_NOT_SUPPORTED: *out = "operation not supported"; break;
        case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: *out = "operation not permitted when stream is capturing"; break;
        case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: *out = "operation failed due to a previous error during capture"; break;
        case CUDA_ERROR_STREAM_CAPTURE_MERGE: *out = "operation would result in a merge of separate capture sequences"; break;
        case CUDA_ERROR_STREAM_CAPTURE_UNMATCHED: *out = "capture was not ended in the same stream as it began"; break;
        case CUDA_ERROR_STREAM_CAPTURE_UNJOINED: *out = "capturing stream has unjoined work"; break;
        case CUDA_ERROR_STREAM_CAPTURE_ISOLATION: *out = "dependency created on uncaptured work in another stream"; break;
        case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
            *out = "operation would make the legacy stream depend on a capturing blocking stream";
            break;
        case CUDA_ERROR_CAPTURED_EVENT: *out = "operation not permitted on an event last recorded in a capturing stream"; break;
        case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD:
            *out = "attempt to terminate a thread-local capture sequence from another thread";
            break;
        case CUDA_ERROR_UNKNOWN: *out = "unknown error"; break;
        default:
            *out = nullptr;
            return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

// ---- nanoddp extensions
// The program shows a refused setting's diagnostic itself (from nanoddpStandinLastError), so
// cuInit refuses without writing it to stderr too. Call it before cuInit.
STANDIN_API void nanoddpStandinHostReportsSettings() {
    standin::host_reports_settings.store(true);
}

// The diagnostic behind the most recent error the stand-in reported (empty if none). The
// pointer stays valid until the calling thread calls this again.
STANDIN_API const char* nanoddpStandinLastError() {
    thread_local std::string copy;
    if (!g) return "";
    std::lock_guard<std::mutex> lock(g->last_error_lock);
    copy = g->last_error;
    return copy.c_str();
}

// The diagnostic behind `device`'s sticky error when its context has one, else the most
// recent error reported (as nanoddpStandinLastError). Same lifetime rule.
STANDIN_API const char* nanoddpStandinDeviceError(int device) {
    thread_local std::string copy;
    if (!ready() || !device_of(device)) return "";
    {
        std::lock_guard<std::mutex> lock(g->api);
        Context* ctx = g->devices[device].primary;
        if (ctx && ctx->sticky != CUDA_SUCCESS) {
            copy = ctx->sticky_message;
            return copy.c_str();
        }
    }
    return nanoddpStandinLastError();
}

// Counters for tests: out[0] module loads on `device`, out[1] launches on it, out[2] hazards
// reported (all GPUs), out[3] kernels that failed (all GPUs). Returns how many it wrote.
STANDIN_API int nanoddpStandinCounters(int device, unsigned long long* out, int n) {
    if (!ready() || !out || !device_of(device)) return 0;
    std::lock_guard<std::mutex> lock(g->api);
    unsigned long long values[4] = {g->devices[device].module_loads, g->devices[device].launches, g->hazards, g->faults};
    int k = std::min(n, 4);
    for (int i = 0; i < k; ++i) out[i] = values[i];
    return k;
}

// Sets the watchdog's limit for `device`'s later launches (seconds; 0: none). For tests that
// want one GPU's endless kernel stopped quickly while the others keep the generous default.
// Chooses the executor for modules loaded on GPU `device` from now on: "simt" or "ptx", and
// for "ptx" whether blocks run their threads last to first. Lets one process compare the two
// executors (or two lane orders) on the same inputs. Returns CUDA_ERROR_INVALID_VALUE for an
// unknown GPU or name, or reverse lanes under "simt" (its order is not varied here), and
// CUDA_ERROR_ILLEGAL_STATE for a change once the GPU has loaded a module (which would keep
// its executor).
STANDIN_API int nanoddpStandinUseExecutor(int device, const char* name, int reverse_lanes) {
    if (!ready() || !device_of(device) || !name) return CUDA_ERROR_INVALID_VALUE;
    Executor* exec;
    if (std::strcmp(name, "simt") == 0 && !reverse_lanes) exec = &simt_executor();
    else if (std::strcmp(name, "ptx") == 0) exec = &ptx_executor();
    else return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(g->api);
    Device& d = g->devices[device];
    if (d.exec == exec && d.reverse_lanes == (reverse_lanes != 0)) return CUDA_SUCCESS;
    if (d.module_loads) return CUDA_ERROR_ILLEGAL_STATE;
    g->devices[device].exec = exec;
    g->devices[device].reverse_lanes = reverse_lanes != 0;
    return CUDA_SUCCESS;
}

// Turns the launch profile on or off for `device`'s later launches. Only the PTX executor
// counts: CUDA_ERROR_NOT_SUPPORTED when the GPU's kernels run under another (choose it with
// NANODDP_STANDIN_EXEC=ptx or nanoddpStandinUseExecutor before the GPU loads a module).
STANDIN_API int nanoddpStandinProfile(int device, int on) {
    if (!ready() || !device_of(device)) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(g->api);
    Device& d = g->devices[device];
    Executor* exec = d.exec ? d.exec : &executor();
    if (on && exec != &ptx_executor()) return CUDA_ERROR_NOT_SUPPORTED;
    d.profile = on != 0;
    return CUDA_SUCCESS;
}

// Hands out the profile lines of the launches run since the last call (record_profile's
// format) and forgets them: copies them NUL-terminated into `out` when `capacity` holds them,
// and returns their length either way (call again with a larger buffer when it is not less
// than `capacity`; nothing is forgotten then).
STANDIN_API long nanoddpStandinProfileTake(char* out, std::size_t capacity) {
    if (!ready()) return 0;
    std::lock_guard<std::mutex> lock(g->profiles_lock);
    long n = static_cast<long>(g->profiles.size());
    if (out && capacity > g->profiles.size()) {
        std::memcpy(out, g->profiles.c_str(), g->profiles.size() + 1);
        g->profiles.clear();
    }
    return n;
}

STANDIN_API int nanoddpStandinSetKernelTimeout(int device, double seconds) {
    if (!ready() || !device_of(device) || seconds < 0) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(g->api);
    g->devices[device].kernel_timeout_s = seconds;
    return CUDA_SUCCESS;
}

// ---- the driver's private interfaces: NVIDIA's own libraries in the process (NVRTC among
// them) look for a loaded libcuda and ask it for its export tables; without these two
// entry points NVRTC dereferences a null table and crashes. There are none here.
STANDIN_API CUresult cuGetExportTable(const void** table, const void* id) {
    AUDIT();
    (void)id;
    if (table) *table = nullptr;
    return CUDA_ERROR_NOT_SUPPORTED;
}

STANDIN_API CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, unsigned long long flags,
                                         int* status) {
    AUDIT();
    (void)symbol;
    (void)version;
    (void)flags;
    if (pfn) *pfn = nullptr;
    if (status) *status = 1;  // CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
    return CUDA_ERROR_NOT_FOUND;
}

// ---- everything else cudarc can reach: not implemented, and saying so.
#define NOT_SUPPORTED(name) \
    STANDIN_API CUresult name() { return CUDA_ERROR_NOT_SUPPORTED; }
NOT_SUPPORTED(cuCtxCreate_v3)
NOT_SUPPORTED(cuCtxCreate_v4)
NOT_SUPPORTED(cuCtxDestroy_v2)
NOT_SUPPORTED(cuCtxGetCacheConfig)
NOT_SUPPORTED(cuCtxSetCacheConfig)
NOT_SUPPORTED(cuCtxGetLimit)
NOT_SUPPORTED(cuCtxSetLimit)
NOT_SUPPORTED(cuCtxSetFlags)
NOT_SUPPORTED(cuDeviceSetMemPool)
NOT_SUPPORTED(cuDestroyExternalMemory)
NOT_SUPPORTED(cuExternalMemoryGetMappedBuffer)
NOT_SUPPORTED(cuImportExternalMemory)
NOT_SUPPORTED(cuLaunchCooperativeKernel)
NOT_SUPPORTED(cuLaunchHostFunc)
NOT_SUPPORTED(cuMemAdvise_v2)
NOT_SUPPORTED(cuMemAllocFromPoolAsync)
NOT_SUPPORTED(cuMemAllocManaged)
NOT_SUPPORTED(cuMemPoolCreate)
NOT_SUPPORTED(cuMemPoolDestroy)
NOT_SUPPORTED(cuMemPoolGetAttribute)
NOT_SUPPORTED(cuMemPrefetchAsync_v2)
NOT_SUPPORTED(cuModuleGetGlobal_v2)
NOT_SUPPORTED(cuOccupancyAvailableDynamicSMemPerBlock)
NOT_SUPPORTED(cuOccupancyMaxActiveBlocksPerMultiprocessor)
NOT_SUPPORTED(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags)
NOT_SUPPORTED(cuOccupancyMaxActiveClusters)
NOT_SUPPORTED(cuOccupancyMaxPotentialBlockSize)
NOT_SUPPORTED(cuOccupancyMaxPotentialBlockSizeWithFlags)
NOT_SUPPORTED(cuOccupancyMaxPotentialClusterSize)
NOT_SUPPORTED(cuProfilerStart)
NOT_SUPPORTED(cuProfilerStop)
NOT_SUPPORTED(cuStreamAttachMemAsync)
NOT_SUPPORTED(cuLaunchKernelEx)
NOT_SUPPORTED(cuMemsetD32Async)
NOT_SUPPORTED(cuMemsetD16Async)
NOT_SUPPORTED(cuMemcpyAsync)
NOT_SUPPORTED(cuMemcpy)
#undef NOT_SUPPORTED

// The executor kernels run on: "SIMT emulator" or "PTX executor".
STANDIN_API const char* nanoddpStandinExecutor() { return executor().name(); }

// Reads `image` (PTX text, or a fatbin with uncompressed PTX entries; `size` bytes) as the PTX
// executor would and writes the distinct instruction spellings of all its PTX (opcode with
// modifiers, e.g. `ld.global.nc.f32`), one per line, into `out`. Returns the bytes needed
// (call again with a larger buffer when it exceeds `capacity`), or -1 when some instruction or
// directive is one the executor does not implement: then `out` holds why.
STANDIN_API long nanoddpStandinPtxSpellings(const void* image, std::size_t size, char* out, std::size_t capacity) {
    if (!image || (!out && capacity)) return -1;
    std::vector<std::string> spellings;
    std::string error, text;
    bool ok = ptx_spellings(static_cast<const unsigned char*>(image), size, spellings, error);
    if (ok)
        for (const std::string& s : spellings) text += s + "\n";
    else
        text = error;
    if (capacity) {
        std::size_t n = std::min(capacity - 1, text.size());
        std::memcpy(out, text.data(), n);
        out[n] = '\0';
    }
    return ok ? static_cast<long>(text.size() + 1) : -1;
}
