// simt_host.cpp — the SIMT emulator's runtime: runs a CUDA launch on the CPU.
//
// A launch spreads its blocks over worker OS threads (the caller plus helpers), one block
// at a time per worker. Within a block every CUDA thread is a fiber on a pooled, guarded
// stack, scheduled cooperatively by a counting scheduler:
//   * a thread runs until it exits or waits (at __syncthreads or a warp rendezvous);
//   * the last thread to arrive releases the others, which run again in lane order
//     (forward, reverse, or a seeded random permutation: a launch option);
//   * "no runnable thread while some are alive" is exactly a deadlock, reported with every
//     waiting thread's site instead of hanging.
// A block whose threads never wait costs two context switches per thread: the finished
// thread's stack is handed straight to the next thread, so it runs as a plain loop.
//
// Device memory comes from simt_alloc: each allocation ends exactly at a PROT_NONE page,
// so the first byte past its end faults. The SIGSEGV handler turns faults inside a launch
// into an error naming the kernel, block, thread and the allocation overrun.
//
// The switch is a dozen instructions of x86-64 assembly (callee-saved registers, MXCSR and
// the x87 control word); a context is never moved after it is created.

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csetjmp>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sched.h>
#include <string>
#include <thread>
#include <vector>

#include "simt.cuh"

#if !defined(__x86_64__)
#error "the SIMT emulator's fiber switch is written for x86-64"
#endif

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define SIMT_ASAN 1
#else
#define SIMT_ASAN 0
#endif

#include "simt_api.h"

namespace simt {

thread_local ThreadView* tls_thread = nullptr;
thread_local BlockView* tls_block = nullptr;

// ------------------------------------------------------------------------------ fibers
extern "C" void simt_switch(void** save_sp, void* load_sp);
extern "C" void simt_fiber_start();
asm(R"(
    .pushsection .text
    .globl simt_switch
    .type simt_switch,@function
simt_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size simt_switch,.-simt_switch

    .globl simt_fiber_start
    .type simt_fiber_start,@function
simt_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size simt_fiber_start,.-simt_fiber_start
    .popsection
)");

#if SIMT_ASAN
constexpr std::size_t STACK_BYTES = 1u << 20;  // ASan frames are several times larger
#else
constexpr std::size_t STACK_BYTES = 256u << 10;
#endif
const std::size_t PAGE = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));

struct Worker;
struct ThreadState;

struct Fiber {
    void* sp = nullptr;
    char* stack_lo = nullptr;  // lowest usable byte; a guard page sits below it
    std::size_t stack_size = 0;
    Worker* worker = nullptr;
    ThreadState* thread = nullptr;
};

// Stacks are memory, not OS-thread state, so one pool serves every worker.
struct StackPool {
    std::mutex lock;
    std::vector<Fiber*> free;
    Fiber* take() {
        {
            std::lock_guard<std::mutex> g(lock);
            if (!free.empty()) {
                Fiber* f = free.back();
                free.pop_back();
                return f;
            }
        }
        std::size_t total = STACK_BYTES + PAGE;
        void* mem = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (mem == MAP_FAILED) {
            std::fprintf(stderr, "simt: cannot map a %zu-byte fiber stack\n", total);
            std::abort();
        }
        mprotect(mem, PAGE, PROT_NONE);  // stacks grow down: the guard is at the low end
        Fiber* f = new Fiber;
        f->stack_lo = static_cast<char*>(mem) + PAGE;
        f->stack_size = STACK_BYTES;
        return f;
    }
    ~StackPool() {
        for (Fiber* f : free) {
            munmap(f->stack_lo - PAGE, f->stack_size + PAGE);
            delete f;
        }
    }
    void give(Fiber* f) {
        std::lock_guard<std::mutex> g(lock);
        free.push_back(f);
    }
    bool owns_guard(std::uintptr_t addr) {
        std::lock_guard<std::mutex> g(lock);
        for (Fiber* f : free)
            if (addr >= reinterpret_cast<std::uintptr_t>(f->stack_lo) - PAGE && addr < reinterpret_cast<std::uintptr_t>(f->stack_lo))
                return true;
        return false;
    }
};
StackPool stack_pool;

// ------------------------------------------------------------------------------ scheduler state
enum class Status { NotStarted, Runnable, AtBarrier, AtWarp, Exited };

struct ThreadState : ThreadView {
    unsigned linear = 0;
    Status status = Status::NotStarted;
    Fiber* fiber = nullptr;
    const char* wait_file = nullptr;
    int wait_line = 0;
    const char* wait_op = nullptr;
};

struct WarpGroup {
    unsigned mask = 0;
    unsigned arrived = 0;
    WarpComplete complete = nullptr;
    const char* op = nullptr;
    const char* file = nullptr;
    int line = 0;
    void* payloads[32] = {};
};

struct Warp {
    unsigned existing = 0;  // lanes that exist (the last warp of a block may be partial)
    unsigned exited = 0;
    std::vector<WarpGroup> groups;
    // Each lane's last completed rendezvous, to explain a mask that names exited lanes.
    unsigned last_mask[32] = {};
    const char* last_file[32] = {};
    int last_line[32] = {};
};

struct BlockError {
    int kind = SIMT_OK;
    const ThreadState* thread = nullptr;
    const char* file = nullptr;
    int line = 0;
    std::string message;
};

struct Launch {
    const simt_launch_desc* desc;
    unsigned threads_per_block;
    std::atomic<unsigned long long> next_block{0};
    std::atomic<bool> failed{false};
    std::mutex error_lock;
    simt_error* error;
};

struct Worker : BlockView {
    Launch* launch = nullptr;
    std::vector<ThreadState> threads;
    std::vector<Warp> warps;
    std::vector<unsigned> order;     // lane order for this block
    std::vector<unsigned> run_queue; // thread indices, front at run_head
    std::size_t run_head = 0;
    unsigned exited = 0;
    const ThreadState* first_exited = nullptr;
    // Block barrier.
    unsigned barrier_count = 0;
    const char* barrier_file = nullptr;
    int barrier_line = 0;
    BlockError error;
    void* sched_sp = nullptr;
    ThreadState* current = nullptr;
    // Shared memory: dynamic (guarded, per launch) and registered static arrays.
    char* dynamic_shared = nullptr;
    std::size_t dynamic_bytes = 0;
    std::uint64_t block_epoch = 0;
    std::uint64_t rng = 0;
    sigjmp_buf fault_jump;
#if SIMT_ASAN
    const void* main_stack_lo = nullptr;
    std::size_t main_stack_size = 0;
#endif
};

thread_local Worker* tls_worker = nullptr;

struct SharedRecord {
    void* ptr;
    std::uint64_t epoch;
};
thread_local std::vector<SharedRecord> tls_shared;
thread_local std::uint64_t tls_epoch_counter = 0;

// ------------------------------------------------------------------------------ switching
inline void enter_fiber(Worker* w, Fiber* f) {
#if SIMT_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f->stack_lo, f->stack_size);
    simt_switch(&w->sched_sp, f->sp);
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
    simt_switch(&w->sched_sp, f->sp);
#endif
}

inline void leave_fiber(Worker* w, Fiber* f) {
#if SIMT_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, w->main_stack_lo, w->main_stack_size);
    simt_switch(&f->sp, w->sched_sp);
    __sanitizer_finish_switch_fiber(fake, &w->main_stack_lo, &w->main_stack_size);
#else
    simt_switch(&f->sp, w->sched_sp);
#endif
}

void on_thread_exit(Worker* w, ThreadState* t);

extern "C" void simt_fiber_main(Fiber* f) {
    Worker* w = f->worker;
#if SIMT_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &w->main_stack_lo, &w->main_stack_size);
#endif
    w->launch->desc->entry(w->launch->desc->params);
    on_thread_exit(w, f->thread);
    leave_fiber(w, f);
    std::abort();  // never resumed: a reused stack is reset to start here afresh
}

// Prepares a stack so that the first switch into it "returns" into simt_fiber_start.
void reset_fiber(Fiber* f) {
#if SIMT_ASAN
    __asan_unpoison_memory_region(f->stack_lo, f->stack_size);
#endif
    auto top = reinterpret_cast<std::uintptr_t>(f->stack_lo + f->stack_size) & ~std::uintptr_t{15};
    auto* frame = reinterpret_cast<std::uint64_t*>(top - 80);  // after the pops, rsp = top - 16 (aligned)
    std::uint32_t mxcsr = 0x1f80;
    std::uint16_t fpcw = 0x037f;
    std::memcpy(&frame[0], &mxcsr, 4);
    std::memcpy(reinterpret_cast<char*>(&frame[0]) + 4, &fpcw, 2);
    frame[1] = 0;                                              // r15
    frame[2] = 0;                                              // r14
    frame[3] = reinterpret_cast<std::uint64_t>(&simt_fiber_main);  // r13: function to call
    frame[4] = reinterpret_cast<std::uint64_t>(f);            // r12: its argument
    frame[5] = 0;                                              // rbx
    frame[6] = 0;                                              // rbp
    frame[7] = reinterpret_cast<std::uint64_t>(&simt_fiber_start);  // return address
    f->sp = frame;
}

// ------------------------------------------------------------------------------ errors
void set_error(Worker* w, int kind, const ThreadState* t, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 6, 7)));
void set_error(Worker* w, int kind, const ThreadState* t, const char* file, int line, const char* fmt, ...) {
    if (w->error.kind != SIMT_OK) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    w->error.kind = kind;
    w->error.thread = t;
    w->error.file = file;
    w->error.line = line;
    w->error.message = buf;
}

// Called on a fiber after an error: hand control back for good.
[[noreturn]] void abandon_fiber(Worker* w, ThreadState* t) {
    leave_fiber(w, t->fiber);
    std::abort();  // never resumed
}

bool same_site(const char* fa, int la, const char* fb, int lb) {
    return la == lb && (fa == fb || (fa && fb && std::strcmp(fa, fb) == 0));
}

// ------------------------------------------------------------------------------ block barrier
void wake(Worker* w, unsigned t) {
    w->threads[t].status = Status::Runnable;
    w->run_queue.push_back(t);
}

std::uint64_t splitmix(std::uint64_t& s) {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Appends the threads of `waiting` (a predicate) to the run queue in this block's lane order;
// in random order, a fresh permutation each time.
template <class Pred>
void wake_in_order(Worker* w, Pred waiting) {
    std::size_t first = w->run_queue.size();
    for (unsigned t : w->order)
        if (waiting(w->threads[t])) wake(w, t);
    if (w->launch->desc->lane_order == 2) {
        for (std::size_t i = w->run_queue.size(); i > first + 1; --i) {
            std::size_t j = first + splitmix(w->rng) % (i - first);
            std::swap(w->run_queue[i - 1], w->run_queue[j]);
        }
    }
}

// Wakes the lanes of `mask` in the warp starting at thread `base`, in lane order.
void wake_lanes(Worker* w, unsigned base, unsigned mask) {
    unsigned lanes[32];
    unsigned count = 0;
    for (unsigned l = 0; l < 32; ++l)
        if (mask >> l & 1u) lanes[count++] = base + l;
    int order = w->launch->desc->lane_order;
    if (order == 1) std::reverse(lanes, lanes + count);
    if (order == 2)
        for (unsigned i = count; i > 1; --i) std::swap(lanes[i - 1], lanes[splitmix(w->rng) % i]);
    for (unsigned i = 0; i < count; ++i) wake(w, lanes[i]);
}

void syncthreads(const char* file, int line) {
    Worker* w = tls_worker;
    ThreadState* t = w->current;
    if (w->exited > 0) {
        const ThreadState* x = w->first_exited;
        set_error(w, SIMT_BARRIER_DIVERGENCE, t, file, line,
                  "__syncthreads reached after thread (%u,%u,%u) of the block exited; every thread must reach "
                  "every barrier (an early return before __syncthreads is the usual cause)",
                  x->thread_idx.x, x->thread_idx.y, x->thread_idx.z);
        abandon_fiber(w, t);
    }
    if (w->barrier_count == 0) {
        w->barrier_file = file;
        w->barrier_line = line;
    } else if (!same_site(file, line, w->barrier_file, w->barrier_line)) {
        set_error(w, SIMT_BARRIER_DIVERGENCE, t, file, line,
                  "divergent __syncthreads: this thread waits here while %u thread(s) wait at %s:%d",
                  w->barrier_count, w->barrier_file, w->barrier_line);
        abandon_fiber(w, t);
    }
    if (++w->barrier_count == w->launch->threads_per_block) {
        w->barrier_count = 0;
        wake_in_order(w, [](const ThreadState& s) { return s.status == Status::AtBarrier; });
        return;  // the last to arrive goes on first
    }
    t->status = Status::AtBarrier;
    t->wait_file = file;
    t->wait_line = line;
    t->wait_op = "__syncthreads";
    leave_fiber(w, t->fiber);
    if (w->error.kind != SIMT_OK) abandon_fiber(w, t);
}

// ------------------------------------------------------------------------------ warp rendezvous
void warp_sync(unsigned mask, void* payload, WarpComplete complete, const char* op, const char* file, int line) {
    Worker* w = tls_worker;
    ThreadState* t = w->current;
    Warp& warp = w->warps[t->linear / 32];
    unsigned lane = t->linear % 32;
    unsigned m = mask & warp.existing;  // lanes past the end of a partial warp do not exist
    if (!(m >> lane & 1u)) {
        set_error(w, SIMT_WARP_MISUSE, t, file, line, "%s with mask 0x%08x, which does not include the calling lane %u",
                  op, mask, lane);
        abandon_fiber(w, t);
    }
    if (m & warp.exited) {
        for (unsigned l = 0; l < 32; ++l) {
            if ((m & warp.exited) >> l & 1u && same_site(file, line, warp.last_file[l], warp.last_line[l]) &&
                warp.last_mask[l] != m) {
                set_error(w, SIMT_WARP_MISUSE, t, file, line,
                          "lanes disagree on the mask: lane %u calls %s with 0x%08x, but lane %u passed 0x%08x here "
                          "and has since exited",
                          lane, op, m, l, warp.last_mask[l]);
                abandon_fiber(w, t);
            }
        }
        set_error(w, SIMT_WARP_MISUSE, t, file, line,
                  "%s with mask 0x%08x names exited lane(s) 0x%08x of warp %u; exited lanes never arrive", op, mask,
                  m & warp.exited, t->linear / 32);
        abandon_fiber(w, t);
    }
    WarpGroup* group = nullptr;
    for (WarpGroup& g : warp.groups) {
        if (!(g.mask & m)) continue;
        if (g.mask != m) {
            set_error(w, SIMT_WARP_MISUSE, t, file, line,
                      "lanes disagree on the mask: lane %u calls %s with 0x%08x while lanes 0x%08x wait in %s at %s:%d "
                      "with 0x%08x",
                      lane, op, m, g.arrived, g.op, g.file, g.line, g.mask);
            abandon_fiber(w, t);
        }
        group = &g;
        break;
    }
    if (!group) {
        warp.groups.push_back(WarpGroup{});
        group = &warp.groups.back();
        group->mask = m;
        group->complete = complete;
        group->op = op;
        group->file = file;
        group->line = line;
    } else if (group->complete != complete) {
        set_error(w, SIMT_WARP_MISUSE, t, file, line, "lanes disagree on the warp operation: lane %u calls %s while lanes 0x%08x wait in %s at %s:%d",
                  lane, op, group->arrived, group->op, group->file, group->line);
        abandon_fiber(w, t);
    }
    group->payloads[lane] = payload;
    group->arrived |= 1u << lane;
    if (group->arrived == group->mask) {
        WarpGroup done = *group;
        warp.groups.erase(warp.groups.begin() + (group - warp.groups.data()));
        for (unsigned l = 0; l < 32; ++l) {
            if (done.mask >> l & 1u) {
                warp.last_mask[l] = done.mask;
                warp.last_file[l] = done.file;
                warp.last_line[l] = done.line;
            }
        }
        if (const char* problem = done.complete(done.payloads, done.mask)) {
            set_error(w, SIMT_WARP_MISUSE, t, file, line, "%s: %s", op, problem);
            abandon_fiber(w, t);
        }
        wake_lanes(w, t->linear & ~31u, done.mask & ~(1u << lane));
        return;
    }
    t->status = Status::AtWarp;
    t->wait_file = file;
    t->wait_line = line;
    t->wait_op = op;
    leave_fiber(w, t->fiber);
    if (w->error.kind != SIMT_OK) abandon_fiber(w, t);
}

unsigned active_mask() {
    Worker* w = tls_worker;
    const Warp& warp = w->warps[w->current->linear / 32];
    return warp.existing & ~warp.exited;
}

void on_thread_exit(Worker* w, ThreadState* t) {
    t->status = Status::Exited;
    if (w->exited++ == 0) w->first_exited = t;
    Warp& warp = w->warps[t->linear / 32];
    unsigned lane = t->linear % 32;
    warp.exited |= 1u << lane;
    if (w->barrier_count > 0) {
        set_error(w, SIMT_BARRIER_DIVERGENCE, t, nullptr, 0,
                  "thread exited while %u thread(s) wait at __syncthreads %s:%d; every thread must reach every barrier",
                  w->barrier_count, w->barrier_file, w->barrier_line);
        return;
    }
    for (const WarpGroup& g : warp.groups) {
        if (g.mask >> lane & 1u) {
            set_error(w, SIMT_WARP_MISUSE, t, nullptr, 0,
                      "lane %u exited while lanes 0x%08x wait for it in %s at %s:%d", lane, g.arrived, g.op, g.file, g.line);
            return;
        }
    }
}

// ------------------------------------------------------------------------------ shared memory
constexpr unsigned char POISON = 0xff;  // NaN as float, -1 as int

void* dynamic_shared() {
    Worker* w = tls_worker;
    return w->dynamic_bytes ? w->dynamic_shared : nullptr;
}

void register_shared(void* p, std::size_t bytes) {
    for (SharedRecord& r : tls_shared) {
        if (r.ptr == p) {
            if (r.epoch != tls_epoch_counter) {
                r.epoch = tls_epoch_counter;
                std::memset(p, POISON, bytes);
            }
            return;
        }
    }
    tls_shared.push_back({p, tls_epoch_counter});
    std::memset(p, POISON, bytes);
}

// ------------------------------------------------------------------------------ running a block
void release_fibers(Worker* w) {
    for (ThreadState& t : w->threads) {
        if (t.fiber) {
            stack_pool.give(t.fiber);
            t.fiber = nullptr;
        }
    }
}

void describe_deadlock(Worker* w) {
    std::string text = "deadlock: no thread can run, yet";
    int listed = 0;
    for (const ThreadState& t : w->threads) {
        if (t.status != Status::AtBarrier && t.status != Status::AtWarp) continue;
        if (listed++ < 4) {
            char buf[160];
            std::snprintf(buf, sizeof buf, " thread (%u,%u,%u) waits in %s at %s:%d;", t.thread_idx.x, t.thread_idx.y,
                          t.thread_idx.z, t.wait_op, t.wait_file, t.wait_line);
            text += buf;
        }
    }
    if (listed > 4) text += " and " + std::to_string(listed - 4) + " more";
    const ThreadState* first = nullptr;
    for (const ThreadState& t : w->threads)
        if (t.status == Status::AtBarrier || t.status == Status::AtWarp) {
            first = &t;
            break;
        }
    set_error(w, SIMT_DEADLOCK, first, first ? first->wait_file : nullptr, first ? first->wait_line : 0, "%s",
              text.c_str());
}

void run_block(Worker* w, unsigned long long block_linear) {
    const simt_launch_desc* d = w->launch->desc;
    w->block_idx.x = static_cast<unsigned>(block_linear % d->grid[0]);
    w->block_idx.y = static_cast<unsigned>(block_linear / d->grid[0] % d->grid[1]);
    w->block_idx.z = static_cast<unsigned>(block_linear / (static_cast<unsigned long long>(d->grid[0]) * d->grid[1]));
    unsigned n = w->launch->threads_per_block;
    for (unsigned i = 0; i < n; ++i) {
        ThreadState& t = w->threads[i];
        t.status = Status::NotStarted;
        t.fiber = nullptr;
    }
    for (Warp& warp : w->warps) {
        warp.exited = 0;
        warp.groups.clear();
        std::fill(std::begin(warp.last_mask), std::end(warp.last_mask), 0u);
        std::fill(std::begin(warp.last_file), std::end(warp.last_file), nullptr);
    }
    w->exited = 0;
    w->first_exited = nullptr;
    w->barrier_count = 0;
    w->error = BlockError{};
    ++tls_epoch_counter;  // static __shared__ arrays are re-poisoned at their next declaration
    if (w->dynamic_bytes) std::memset(w->dynamic_shared, POISON, w->dynamic_bytes);
    w->rng = d->seed ^ (block_linear * 0xd1b54a32d192ed03ull);
    // Lane order: the order threads start in and are woken in.
    for (unsigned i = 0; i < n; ++i) w->order[i] = d->lane_order == 1 ? n - 1 - i : i;
    if (d->lane_order == 2)
        for (unsigned i = n; i > 1; --i) std::swap(w->order[i - 1], w->order[splitmix(w->rng) % i]);
    w->run_queue.assign(w->order.begin(), w->order.end());
    w->run_head = 0;

    Fiber* spare = nullptr;  // a finished thread's stack, handed to the next thread
    while (w->run_head < w->run_queue.size() && w->error.kind == SIMT_OK) {
        ThreadState* t = &w->threads[w->run_queue[w->run_head++]];
        if (t->status == Status::NotStarted) {
            Fiber* f = spare ? spare : stack_pool.take();
            spare = nullptr;
            f->worker = w;
            f->thread = t;
            reset_fiber(f);
            t->fiber = f;
        }
        t->status = Status::Runnable;
        w->current = t;
        tls_thread = t;
        enter_fiber(w, t->fiber);
        if (t->status == Status::Exited && w->error.kind == SIMT_OK) {
            if (spare) stack_pool.give(spare);
            spare = t->fiber;
            t->fiber = nullptr;
        }
        // The run queue only grows from the back; compact it now and then.
        if (w->run_head > 4096 && w->run_head * 2 > w->run_queue.size()) {
            w->run_queue.erase(w->run_queue.begin(), w->run_queue.begin() + static_cast<long>(w->run_head));
            w->run_head = 0;
        }
    }
    if (spare) stack_pool.give(spare);
    if (w->error.kind == SIMT_OK && w->exited != n) describe_deadlock(w);
    release_fibers(w);
}

// ------------------------------------------------------------------------------ device memory
struct Allocation {
    std::uintptr_t map_lo, map_hi;  // the whole mapping, guard pages included
    std::uintptr_t data_lo, data_hi;
};
std::mutex alloc_lock;
std::map<std::uintptr_t, Allocation> allocations;  // by map_lo

// The allocation whose mapping (guard pages included) contains addr; caller holds the lock.
std::map<std::uintptr_t, Allocation>::iterator allocation_at(std::uintptr_t addr) {
    auto it = allocations.upper_bound(addr);
    if (it == allocations.begin()) return allocations.end();
    --it;
    return addr < it->second.map_hi ? it : allocations.end();
}

// For the fault handler. Kernel code never allocates, so the faulting thread cannot hold
// the lock; another thread may, briefly.
bool find_allocation(std::uintptr_t addr, Allocation* out) {
    while (!alloc_lock.try_lock()) sched_yield();
    auto it = allocation_at(addr);
    bool found = it != allocations.end();
    if (found) *out = it->second;
    alloc_lock.unlock();
    return found;
}

void* guarded_alloc(std::size_t bytes, std::size_t align) {
    if (align == 0 || (align & (align - 1)) != 0) align = 1;
    std::size_t data_pages = (bytes + PAGE - 1) / PAGE;
    std::size_t total = (data_pages + 2) * PAGE;
    void* mem = mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) return nullptr;
    auto lo = reinterpret_cast<std::uintptr_t>(mem);
    if (data_pages && mprotect(reinterpret_cast<void*>(lo + PAGE), data_pages * PAGE, PROT_READ | PROT_WRITE) != 0) {
        munmap(mem, total);
        return nullptr;
    }
    // The data ends exactly where the upper guard page begins.
    std::uintptr_t end = lo + PAGE + data_pages * PAGE;
    std::uintptr_t start = (end - bytes) & ~(align - 1);
    std::lock_guard<std::mutex> g(alloc_lock);
    allocations[lo] = Allocation{lo, lo + total, start, start + bytes};
    return reinterpret_cast<void*>(start);
}

void guarded_free(void* p) {
    if (!p) return;
    auto addr = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard<std::mutex> g(alloc_lock);
    auto it = allocation_at(addr);
    if (it == allocations.end() || it->second.data_lo != addr) {
        std::fprintf(stderr, "simt: free of %p, which is not a device allocation\n", p);
        std::abort();
    }
    munmap(reinterpret_cast<void*>(it->second.map_lo), it->second.map_hi - it->second.map_lo);
    allocations.erase(it);
}

// ------------------------------------------------------------------------------ faults
struct sigaction previous_segv;
struct sigaction previous_bus;
std::once_flag handler_once;

void fault_handler(int sig, siginfo_t* info, void* ctx) {
    Worker* w = tls_worker;
    if (!w || !w->current) {
        // Not ours: restore the previous handler and let the fault happen again under it.
        sigaction(sig, sig == SIGSEGV ? &previous_segv : &previous_bus, nullptr);
        (void)ctx;
        return;
    }
    auto addr = reinterpret_cast<std::uintptr_t>(info->si_addr);
    ThreadState* t = w->current;
    Allocation a;
    Fiber* f = t->fiber;
    auto stack_lo = f ? reinterpret_cast<std::uintptr_t>(f->stack_lo) : 0;
    if (f && addr >= stack_lo - PAGE && addr < stack_lo) {
        set_error(w, SIMT_STACK_OVERFLOW, t, nullptr, 0,
                  "stack overflow: the thread used more than its %zu KiB fiber stack (large local arrays?)",
                  f->stack_size >> 10);
    } else if (find_allocation(addr, &a)) {
        if (addr >= a.data_hi) {
            set_error(w, SIMT_MEMORY_FAULT, t, nullptr, 0,
                      "out-of-bounds access at 0x%lx: %lu byte(s) past the end of a %lu-byte device allocation at 0x%lx",
                      static_cast<unsigned long>(addr), static_cast<unsigned long>(addr - a.data_hi + 1),
                      static_cast<unsigned long>(a.data_hi - a.data_lo), static_cast<unsigned long>(a.data_lo));
        } else {
            set_error(w, SIMT_MEMORY_FAULT, t, nullptr, 0,
                      "out-of-bounds access at 0x%lx: before the start of a %lu-byte device allocation at 0x%lx",
                      static_cast<unsigned long>(addr), static_cast<unsigned long>(a.data_hi - a.data_lo),
                      static_cast<unsigned long>(a.data_lo));
        }
    } else {
        set_error(w, SIMT_MEMORY_FAULT, t, nullptr, 0,
                  "invalid memory access at 0x%lx (not inside any device allocation: a wild or host pointer?)",
                  static_cast<unsigned long>(addr));
    }
    siglongjmp(w->fault_jump, 1);
}

void install_fault_handler() {
    std::call_once(handler_once, [] {
        struct sigaction sa;
        std::memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = fault_handler;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &previous_segv);
        sigaction(SIGBUS, &sa, &previous_bus);
    });
}

// A fault on a fiber's guard page leaves no stack to handle it on: make sure this OS
// thread has an alternate signal stack (Rust's threads already do; helpers may not).
struct AltStack {
    void* mem = nullptr;
    ~AltStack() {
        if (mem) {
            stack_t none;
            std::memset(&none, 0, sizeof none);
            none.ss_flags = SS_DISABLE;
            sigaltstack(&none, nullptr);
            std::free(mem);
        }
    }
};
thread_local AltStack tls_alt_stack;

void ensure_alt_stack() {
    stack_t current;
    if (sigaltstack(nullptr, &current) == 0 && !(current.ss_flags & SS_DISABLE)) return;
    std::size_t size = 64 * 1024;
    tls_alt_stack.mem = std::malloc(size);
    stack_t ss;
    std::memset(&ss, 0, sizeof ss);
    ss.ss_sp = tls_alt_stack.mem;
    ss.ss_size = size;
    sigaltstack(&ss, nullptr);
}

// ------------------------------------------------------------------------------ workers
void record_launch_error(Launch* l, Worker* w) {
    std::lock_guard<std::mutex> g(l->error_lock);
    if (l->failed.exchange(true)) return;
    simt_error* e = l->error;
    e->kind = w->error.kind;
    e->block[0] = w->block_idx.x;
    e->block[1] = w->block_idx.y;
    e->block[2] = w->block_idx.z;
    e->has_thread = w->error.thread != nullptr;
    if (w->error.thread) {
        e->thread[0] = w->error.thread->thread_idx.x;
        e->thread[1] = w->error.thread->thread_idx.y;
        e->thread[2] = w->error.thread->thread_idx.z;
    }
    e->line = w->error.line;
    std::snprintf(e->file, sizeof e->file, "%s", w->error.file ? w->error.file : "");
    std::snprintf(e->message, sizeof e->message, "%s", w->error.message.c_str());
}

void worker_main(Launch* l) {
    ensure_alt_stack();
    install_fault_handler();
    const simt_launch_desc* d = l->desc;
    Worker w;
    w.launch = l;
    w.block_dim = dim3(d->block[0], d->block[1], d->block[2]);
    w.grid_dim = dim3(d->grid[0], d->grid[1], d->grid[2]);
    unsigned n = l->threads_per_block;
    w.threads.resize(n);
    for (unsigned i = 0; i < n; ++i) {
        ThreadState& t = w.threads[i];
        t.linear = i;
        t.thread_idx.x = i % d->block[0];
        t.thread_idx.y = i / d->block[0] % d->block[1];
        t.thread_idx.z = i / (d->block[0] * d->block[1]);
    }
    w.warps.resize((n + 31) / 32);
    for (std::size_t i = 0; i < w.warps.size(); ++i) {
        unsigned lanes = std::min(32u, n - static_cast<unsigned>(i) * 32);
        w.warps[i].existing = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
    }
    w.order.resize(n);
    w.dynamic_bytes = d->shared_bytes;
    if (w.dynamic_bytes) w.dynamic_shared = static_cast<char*>(guarded_alloc(w.dynamic_bytes, 16));
    unsigned long long blocks = static_cast<unsigned long long>(d->grid[0]) * d->grid[1] * d->grid[2];

    tls_worker = &w;
    tls_block = &w;
    for (;;) {
        if (l->failed.load(std::memory_order_relaxed)) break;
        unsigned long long b = l->next_block.fetch_add(1, std::memory_order_relaxed);
        if (b >= blocks) break;
        if (sigsetjmp(w.fault_jump, 1) == 0) {
            run_block(&w, b);
        } else {
            // A memory fault inside a kernel thread: the handler recorded it.
            w.current = nullptr;
            release_fibers(&w);
        }
        w.current = nullptr;
        if (w.error.kind != SIMT_OK) {
            record_launch_error(l, &w);
            break;
        }
    }
    w.current = nullptr;
    tls_worker = nullptr;
    tls_block = nullptr;
    tls_thread = nullptr;
    guarded_free(w.dynamic_shared);
}

}  // namespace simt

// ------------------------------------------------------------------------------ C interface
extern "C" int simt_launch(const simt_launch_desc* d, simt_error* err) {
    std::memset(err, 0, sizeof *err);
    unsigned long long threads = static_cast<unsigned long long>(d->block[0]) * d->block[1] * d->block[2];
    unsigned long long blocks = static_cast<unsigned long long>(d->grid[0]) * d->grid[1] * d->grid[2];
    if (threads == 0 || threads > 1024 || blocks == 0) {
        err->kind = SIMT_BAD_LAUNCH;
        std::snprintf(err->message, sizeof err->message, "invalid launch: grid %ux%ux%u, block %ux%ux%u", d->grid[0],
                      d->grid[1], d->grid[2], d->block[0], d->block[1], d->block[2]);
        return err->kind;
    }
    simt::Launch l;
    l.desc = d;
    l.threads_per_block = static_cast<unsigned>(threads);
    l.error = err;
#if defined(SIMT_SERIAL_BLOCKS)
    unsigned workers = 1;  // static __shared__ is plain static here
#else
    unsigned workers = d->workers ? d->workers : std::max(1u, std::thread::hardware_concurrency());
#endif
    if (workers > blocks) workers = static_cast<unsigned>(blocks);
    std::vector<std::thread> helpers;
    for (unsigned i = 1; i < workers; ++i) helpers.emplace_back(simt::worker_main, &l);
    simt::worker_main(&l);
    for (std::thread& h : helpers) h.join();
    return err->kind;
}

extern "C" void* simt_alloc(size_t bytes, size_t align) { return simt::guarded_alloc(bytes, align); }
extern "C" void simt_free(void* p) { simt::guarded_free(p); }

// The runtime table a separately compiled module (SIMT_MODULE) binds to.
extern "C" const simt::RuntimeTable* simt_runtime_table() {
    static const simt::RuntimeTable table = {
        simt::RUNTIME_TABLE_VERSION,
        [] { return simt::tls_thread; },
        [] { return simt::tls_block; },
        simt::syncthreads,
        simt::dynamic_shared,
        simt::register_shared,
        simt::active_mask,
        simt::warp_sync,
    };
    return &table;
}
