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
// into an error naming the kernel, block, thread and the allocation overrun (or the
// message of a fault explainer a driver stand-in installed); faults that are not ours go
// on to the handler installed before, so several copies of this runtime can share a process.
//
// A launch with a time limit is watched by one shared watchdog thread: at the deadline it
// stops handing out blocks and sends SIGURG to each worker that is running kernel code; the
// handler jumps back to the worker's scheduler as a fault does, and the launch fails with
// SIMT_TIMEOUT saying where every running block's threads were (the interrupted thread's
// function, the barriers and warp operations the others wait at). Runtime code (the part
// that allocates and locks) and C-library code are never interrupted: the signal is sent
// again every few milliseconds until it lands in kernel code or the worker returns.
//
// The switch is a dozen instructions of assembly, for x86-64 (callee-saved registers, MXCSR
// and the x87 control word) and for aarch64 (x19-x30, d8-d15 and FPCR); a context is never
// moved after it is created. The fault and watchdog handlers read two things of the
// interrupted context, the program counter and whether a faulting access wrote, from the
// architecture's signal frame (`arch` below).

#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csetjmp>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "simt.cuh"

#if !defined(__x86_64__) && !defined(__aarch64__)
#error "the SIMT emulator's fiber switch is written for x86-64 and aarch64"
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
#if defined(__x86_64__)
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
#else
// x0: where to save this context's stack pointer; x1: the stack pointer to resume. A saved
// context is a 176-byte frame: x19-x28, x29 (frame pointer), x30 (return address), d8-d15,
// FPCR.
asm(R"(
    .pushsection .text
    .globl simt_switch
    .type simt_switch,%function
simt_switch:
    sub sp, sp, #176
    stp x19, x20, [sp, #0]
    stp x21, x22, [sp, #16]
    stp x23, x24, [sp, #32]
    stp x25, x26, [sp, #48]
    stp x27, x28, [sp, #64]
    stp x29, x30, [sp, #80]
    stp d8, d9, [sp, #96]
    stp d10, d11, [sp, #112]
    stp d12, d13, [sp, #128]
    stp d14, d15, [sp, #144]
    mrs x9, fpcr
    str x9, [sp, #160]
    mov x9, sp
    str x9, [x0]
    mov sp, x1
    ldr x9, [sp, #160]
    msr fpcr, x9
    ldp d14, d15, [sp, #144]
    ldp d12, d13, [sp, #128]
    ldp d10, d11, [sp, #112]
    ldp d8, d9, [sp, #96]
    ldp x29, x30, [sp, #80]
    ldp x27, x28, [sp, #64]
    ldp x25, x26, [sp, #48]
    ldp x23, x24, [sp, #32]
    ldp x21, x22, [sp, #16]
    ldp x19, x20, [sp, #0]
    add sp, sp, #176
    ret
    .size simt_switch,.-simt_switch

    .globl simt_fiber_start
    .type simt_fiber_start,%function
simt_fiber_start:
    mov x0, x19
    blr x20
    brk #0
    .size simt_fiber_start,.-simt_fiber_start
    .popsection
)");
#endif

// What the signal handlers read of an interrupted context.
namespace arch {
#if defined(__x86_64__)
std::uintptr_t program_counter(const void* ctx) {
    return static_cast<std::uintptr_t>(static_cast<const ucontext_t*>(ctx)->uc_mcontext.gregs[REG_RIP]);
}
// Bit 1 of the x86-64 page-fault error code: the access was a write.
bool fault_was_write(const void* ctx) {
    return (static_cast<const ucontext_t*>(ctx)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
}
#else
std::uintptr_t program_counter(const void* ctx) {
    return static_cast<std::uintptr_t>(static_cast<const ucontext_t*>(ctx)->uc_mcontext.pc);
}
// Linux appends records to an aarch64 signal frame (`__reserved`: each a `_aarch64_ctx`
// header of magic word and size, a zero magic last; <asm/sigcontext.h>, which glibc's
// <signal.h> includes); the ESR record holds the fault's syndrome, whose bit 6 (WnR) says
// the data access was a write.
bool fault_was_write(const void* ctx) {
    const auto& mc = static_cast<const ucontext_t*>(ctx)->uc_mcontext;
    const auto* at = reinterpret_cast<const unsigned char*>(mc.__reserved);
    const auto* end = at + sizeof mc.__reserved;
    while (at + sizeof(_aarch64_ctx) <= end) {
        _aarch64_ctx head;
        std::memcpy(&head, at, sizeof head);
        if (head.magic == 0 || head.size < sizeof head) break;
        if (head.magic == ESR_MAGIC && at + sizeof(esr_context) <= end) {
            esr_context esr;
            std::memcpy(&esr, at, sizeof esr);
            return (esr.esr >> 6) & 1;
        }
        at += head.size;
    }
    return false;
}
#endif
}  // namespace arch

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
    // A fixed buffer, not a std::string: the fault handler writes it, and must not allocate.
    char message[sizeof(simt_error::message)] = {};
};

// Where one block stood when the watchdog stopped it (see describe_stopped_block).
struct StoppedBlock {
    unsigned long long linear;
    uint3 block;
    bool has_thread;  // a thread was interrupted while running kernel code
    uint3 thread;
    std::string where;  // its threads' positions, in words, without the block index
    // `where` without the interrupted instruction's offset: blocks stopped in the same
    // state, one thread at another instruction of the same loop, are described once.
    std::string alike;
};

struct Launch {
    const simt_launch_desc* desc;
    unsigned threads_per_block;
    std::atomic<unsigned long long> next_block{0};
    std::atomic<unsigned long long> blocks_done{0};
    std::atomic<bool> failed{false};  // stop taking blocks (an error, or the time limit)
    std::atomic<bool> timed_out{false};
    std::mutex error_lock;
    simt_error* error;
    // Workers that may be running this launch's kernel code, for the watchdog to signal.
    // A worker registers before its first block and leaves before its thread can exit, so
    // every thread in `live` is alive while workers_lock is held.
    std::mutex workers_lock;
    std::vector<std::pair<pthread_t, Worker*>> live;
    // Reports of the blocks the time limit stopped (under error_lock).
    std::vector<StoppedBlock> stopped;
    // The watchdog's next look at this launch: the deadline, then every poke interval.
    std::chrono::steady_clock::time_point next_check;
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
    // A finished thread's stack, handed straight to the next thread to start. Kept here, not
    // in run_block, so that a block left by siglongjmp still returns it to the pool.
    Fiber* spare = nullptr;
    // 1 while a fiber runs kernel code, 0 in the runtime and the scheduler: the watchdog's
    // signal may abandon kernel code, never the runtime, which allocates and locks.
    // Written only by this worker's thread; read by its signal handlers (with signal
    // fences) and, as a hint, by the watchdog thread.
    std::atomic<int> in_kernel{0};
    // Set by the watchdog's signal handler: the thread it interrupted and where.
    const ThreadState* interrupted = nullptr;
    std::uintptr_t interrupted_pc = 0;
    bool stopped = false;  // this block was abandoned at the watchdog's request
#if SIMT_ASAN
    const void* main_stack_lo = nullptr;
    std::size_t main_stack_size = 0;
#endif
};

thread_local Worker* tls_worker = nullptr;

// Kernel code vs runtime code on a fiber, for the watchdog (Worker::in_kernel). Every runtime
// entry point that kernel code calls and that allocates, locks or switches fibers opens a
// RuntimeSection; the kernel is "back" when it closes. A fiber only ever resumes inside a
// section (or at its start, which marks itself), so the flag is per worker, not per fiber.
// Relaxed stores plus signal fences: only this thread's signal handlers need to see them.
inline void enter_kernel_code(Worker* w) {
    std::atomic_signal_fence(std::memory_order_seq_cst);
    w->in_kernel.store(1, std::memory_order_relaxed);
}
inline void leave_kernel_code(Worker* w) {
    w->in_kernel.store(0, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);
}
struct RuntimeSection {
    Worker* w;  // null outside a launch (a __device__ function called as plain C++)
    explicit RuntimeSection(Worker* worker) : w(worker) {
        if (w) leave_kernel_code(w);
    }
    ~RuntimeSection() {  // not run when a fiber is abandoned: the flag stays 0
        if (w) enter_kernel_code(w);
    }
    RuntimeSection(const RuntimeSection&) = delete;
    RuntimeSection& operator=(const RuntimeSection&) = delete;
};

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
    enter_kernel_code(w);
    w->launch->desc->entry(w->launch->desc->params);
    leave_kernel_code(w);
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
#if defined(__aarch64__)
    auto* frame = reinterpret_cast<std::uint64_t*>(top - 176);  // popped, sp = top (aligned)
    std::memset(frame, 0, 176);
    frame[0] = reinterpret_cast<std::uint64_t>(f);                  // x19: the argument
    frame[1] = reinterpret_cast<std::uint64_t>(&simt_fiber_main);  // x20: function to call
    frame[11] = reinterpret_cast<std::uint64_t>(&simt_fiber_start);  // x30: "return" there
    // FPCR 0: round to nearest, no traps, no flush-to-zero (the C runtime's default).
#else
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
#endif
    f->sp = frame;
}

// ------------------------------------------------------------------------------ errors
void set_error(Worker* w, int kind, const ThreadState* t, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 6, 7)));
void set_error(Worker* w, int kind, const ThreadState* t, const char* file, int line, const char* fmt, ...) {
    if (w->error.kind != SIMT_OK) return;
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(w->error.message, sizeof w->error.message, fmt, ap);
    va_end(ap);
    w->error.kind = kind;
    w->error.thread = t;
    w->error.file = file;
    w->error.line = line;
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
    RuntimeSection section(w);
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
    RuntimeSection section(w);
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
    RuntimeSection section(tls_worker);  // tls_shared may grow (allocate)
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
    if (w->spare) {
        stack_pool.give(w->spare);
        w->spare = nullptr;
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

    w->stopped = false;
    w->interrupted = nullptr;
    w->interrupted_pc = 0;
    while (w->run_head < w->run_queue.size() && w->error.kind == SIMT_OK) {
        if (w->launch->timed_out.load(std::memory_order_relaxed)) {
            w->stopped = true;  // past the launch's time limit: leave the rest of the block undone
            break;
        }
        ThreadState* t = &w->threads[w->run_queue[w->run_head++]];
        if (t->status == Status::NotStarted) {
            Fiber* f = w->spare ? w->spare : stack_pool.take();
            w->spare = nullptr;
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
            if (w->spare) stack_pool.give(w->spare);
            w->spare = t->fiber;
            t->fiber = nullptr;
        }
        // The run queue only grows from the back; compact it now and then.
        if (w->run_head > 4096 && w->run_head * 2 > w->run_queue.size()) {
            w->run_queue.erase(w->run_queue.begin(), w->run_queue.begin() + static_cast<long>(w->run_head));
            w->run_head = 0;
        }
    }
    if (w->error.kind == SIMT_OK && !w->stopped && w->exited != n) describe_deadlock(w);
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
// The handlers installed before ours, for the signals that are not ours.
struct sigaction previous_segv;
struct sigaction previous_bus;
struct sigaction previous_urg;
std::once_flag handler_once;
std::atomic<simt_fault_explainer> fault_explainer{nullptr};

// Its address tags the SIGURGs this copy of the runtime's watchdog sends (the value passed to
// pthread_sigqueue), so the handler tells them from anyone else's, another copy's included,
// before it touches any state of its own.
const char watchdog_token = 0;

void fault_handler(int sig, siginfo_t* info, void* ctx);
void watchdog_handler(int sig, siginfo_t* info, void* ctx);

// Hands a signal that is not ours to the handler installed before ours: another copy of this
// runtime (a shared library that links it too), Rust's stack-overflow reporter, or the
// default action. Runs inside a signal handler.
struct ChainFrame {
    const siginfo_t* info = nullptr;
    std::uintptr_t sp = 0;
};
thread_local ChainFrame tls_chain;

void chain_previous(int sig, siginfo_t* info, void* ctx, const struct sigaction& prev, bool fatal_default) {
    auto sp = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
    bool default_action =
        !(prev.sa_flags & SA_SIGINFO) && (prev.sa_handler == SIG_DFL || prev.sa_handler == SIG_IGN);
    bool ours = (prev.sa_flags & SA_SIGINFO) &&
                (prev.sa_sigaction == fault_handler || prev.sa_sigaction == watchdog_handler);
    // Handlers that chain in a circle would pass this same siginfo round, deeper on the stack
    // each time, until the alternate stack overflows. The frame a handler leaves behind when
    // it jumps out (another copy's siglongjmp) can share its siginfo address with a later
    // signal, but that signal's handler then runs at the same depth, never deeper: no false
    // alarm.
    bool circle = tls_chain.info == info && sp < tls_chain.sp;
    if (default_action || ours || circle) {
        if (fatal_default) {
            // A fault nobody handles: restore the default action and return, so that the
            // faulting instruction runs again and kills the process, as without us.
            struct sigaction dfl;
            std::memset(&dfl, 0, sizeof dfl);
            dfl.sa_handler = SIG_DFL;
            sigemptyset(&dfl.sa_mask);
            sigaction(sig, &dfl, nullptr);
        }
        return;  // SIGURG's default action is to ignore it
    }
    ChainFrame saved = tls_chain;
    tls_chain.info = info;
    tls_chain.sp = sp;
    if (prev.sa_flags & SA_SIGINFO)
        prev.sa_sigaction(sig, info, ctx);
    else
        prev.sa_handler(sig);
    tls_chain = saved;
}

// Asks the installed explainer (simt_set_fault_explainer) about a fault; true if it explained
// it, its message now the block's error.
bool explain_fault(Worker* w, const ThreadState* t, std::uintptr_t addr, void* ctx) {
    simt_fault_explainer explain = fault_explainer.load(std::memory_order_acquire);
    if (!explain || w->error.kind != SIMT_OK) return false;
    int is_write = arch::fault_was_write(ctx);
    // Written straight into the error: no buffer on the (small) alternate signal stack.
    char* text = w->error.message;
    text[0] = '\0';
    if (!explain(addr, is_write, text, sizeof w->error.message)) {
        text[0] = '\0';
        return false;
    }
    text[sizeof w->error.message - 1] = '\0';
    w->error.kind = SIMT_MEMORY_FAULT;
    w->error.thread = t;
    w->error.file = nullptr;
    w->error.line = 0;
    return true;
}

void fault_handler(int sig, siginfo_t* info, void* ctx) {
    Worker* w = tls_worker;
    if (!w || !w->current) {
        chain_previous(sig, info, ctx, sig == SIGSEGV ? previous_segv : previous_bus, true);
        return;
    }
    leave_kernel_code(w);  // from here on this is the runtime (SIGURG is blocked anyway)
    auto addr = reinterpret_cast<std::uintptr_t>(info->si_addr);
    ThreadState* t = w->current;
    Allocation a;
    Fiber* f = t->fiber;
    auto stack_lo = f ? reinterpret_cast<std::uintptr_t>(f->stack_lo) : 0;
    if (f && addr >= stack_lo - PAGE && addr < stack_lo) {
        set_error(w, SIMT_STACK_OVERFLOW, t, nullptr, 0,
                  "stack overflow: the thread used more than its %zu KiB fiber stack (large local arrays?)",
                  f->stack_size >> 10);
    } else if (explain_fault(w, t, addr, ctx)) {
        // The explainer knows this memory better than the allocation table below.
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

// Code the watchdog must not cut into: the C library, the dynamic loader, and the C++,
// unwinder and ASan runtimes, where an abandoned thread could leave a lock held (malloc's,
// stdio's, the loader's). Kernel code calls into them rarely (memcpy, printf); a thread
// caught there is signalled again a moment later. Only appended to, by the watchdog thread,
// before it signals; entries below the published count never change, so the handler reads
// them without a lock.
struct CodeRange {
    std::uintptr_t lo, hi;
};
CodeRange library_code[64];
std::atomic<int> library_code_count{0};

int note_library_code(dl_phdr_info* info, std::size_t, void*) {
    static const char* const libraries[] = {"libc.so", "ld-linux", "libpthread.so", "libstdc++.so",
                                            "libgcc_s.so", "libasan.so"};
    const char* name = info->dlpi_name ? info->dlpi_name : "";
    const char* slash = std::strrchr(name, '/');
    const char* base = slash ? slash + 1 : name;
    bool listed = false;
    for (const char* lib : libraries) listed = listed || std::strncmp(base, lib, std::strlen(lib)) == 0;
    if (!listed) return 0;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr)& ph = info->dlpi_phdr[i];
        if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
        CodeRange r{info->dlpi_addr + ph.p_vaddr, info->dlpi_addr + ph.p_vaddr + ph.p_memsz};
        int n = library_code_count.load(std::memory_order_relaxed);
        bool known = false;
        for (int k = 0; k < n; ++k) known = known || (library_code[k].lo == r.lo && library_code[k].hi == r.hi);
        if (known || n == static_cast<int>(std::size(library_code))) continue;
        library_code[n] = r;
        library_code_count.store(n + 1, std::memory_order_release);
    }
    return 0;
}

bool in_library_code(std::uintptr_t pc) {
    int n = library_code_count.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i)
        if (pc >= library_code[i].lo && pc < library_code[i].hi) return true;
    return false;
}

// SIGURG from the watchdog: if this worker is running kernel code of a launch past its time
// limit, note where, and jump back to the worker's scheduler as a fault does. Anywhere else
// (the runtime, the scheduler, between blocks, after the launch) it does nothing: the
// worker stops at its next turn, or the watchdog asks again.
void watchdog_handler(int sig, siginfo_t* info, void* ctx) {
    if (info->si_code != SI_QUEUE || info->si_value.sival_ptr != &watchdog_token) {
        chain_previous(sig, info, ctx, previous_urg, false);
        return;
    }
    // Sent by our watchdog, so this thread is or was one of our workers and has touched
    // tls_worker before: reading it cannot allocate.
    Worker* w = tls_worker;
    if (!w || !w->current || !w->launch->timed_out.load(std::memory_order_relaxed)) return;
    if (w->in_kernel.load(std::memory_order_relaxed) == 0) return;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    auto pc = arch::program_counter(ctx);
    if (in_library_code(pc)) return;
    leave_kernel_code(w);
    w->interrupted = w->current;
    w->interrupted_pc = pc;
    siglongjmp(w->fault_jump, 2);
}

void install_handlers() {
    std::call_once(handler_once, [] {
        // Read the previous handlers before installing ours, so that ours never runs
        // without them.
        sigaction(SIGSEGV, nullptr, &previous_segv);
        sigaction(SIGBUS, nullptr, &previous_bus);
        sigaction(SIGURG, nullptr, &previous_urg);
        struct sigaction sa;
        std::memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = fault_handler;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaddset(&sa.sa_mask, SIGURG);  // the watchdog must not cut into fault handling
        sigaction(SIGSEGV, &sa, nullptr);
        sigaction(SIGBUS, &sa, nullptr);
        struct sigaction wd;
        std::memset(&wd, 0, sizeof wd);
        wd.sa_sigaction = watchdog_handler;
        wd.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
        sigemptyset(&wd.sa_mask);
        sigaction(SIGURG, &wd, nullptr);
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

// ------------------------------------------------------------------------------ timeout reports
// "function+0xoffset" for a code address, or "module+0xoffset" when no symbol covers it.
// dladdr sees only exported symbols, and kernels linked into an executable are not exported,
// so the module's own ELF symbol table is searched too. Normal context only (it allocates).
bool elf_function(const char* path, std::uintptr_t vaddr, std::string* name, std::uintptr_t* offset) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat st;
    void* mem = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size > static_cast<off_t>(sizeof(Elf64_Ehdr)))
        mem = mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (mem == MAP_FAILED) return false;
    const auto* base = static_cast<const unsigned char*>(mem);
    auto size = static_cast<std::uint64_t>(st.st_size);
    auto in_file = [&](std::uint64_t off, std::uint64_t len) { return off <= size && len <= size - off; };
    const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(base);
    bool found = false;
    if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && eh->e_ident[EI_CLASS] == ELFCLASS64 &&
        eh->e_shentsize == sizeof(Elf64_Shdr) && in_file(eh->e_shoff, std::uint64_t{eh->e_shnum} * sizeof(Elf64_Shdr))) {
        const auto* sh = reinterpret_cast<const Elf64_Shdr*>(base + eh->e_shoff);
        for (Elf64_Word kind : {SHT_SYMTAB, SHT_DYNSYM}) {  // the full table, if not stripped
            for (unsigned i = 0; i < eh->e_shnum && !found; ++i) {
                if (sh[i].sh_type != kind || sh[i].sh_link >= eh->e_shnum || sh[i].sh_entsize != sizeof(Elf64_Sym))
                    continue;
                const Elf64_Shdr& strtab = sh[sh[i].sh_link];
                if (!in_file(sh[i].sh_offset, sh[i].sh_size) || !in_file(strtab.sh_offset, strtab.sh_size)) continue;
                const auto* syms = reinterpret_cast<const Elf64_Sym*>(base + sh[i].sh_offset);
                const char* strs = reinterpret_cast<const char*>(base + strtab.sh_offset);
                for (std::size_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); ++k) {
                    const Elf64_Sym& s = syms[k];
                    if (ELF64_ST_TYPE(s.st_info) != STT_FUNC || s.st_value == 0 || s.st_name >= strtab.sh_size) continue;
                    if (vaddr < s.st_value || vaddr - s.st_value >= std::max<std::uint64_t>(s.st_size, 1)) continue;
                    name->assign(strs + s.st_name, strnlen(strs + s.st_name, strtab.sh_size - s.st_name));
                    *offset = vaddr - s.st_value;
                    found = true;
                    break;
                }
            }
            if (found) break;
        }
    }
    munmap(mem, static_cast<std::size_t>(size));
    return found;
}

std::string symbolize(std::uintptr_t pc) {
    char buf[64];
    Dl_info info;
    link_map* map = nullptr;
    if (dladdr1(reinterpret_cast<void*>(pc), &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) == 0 || !map) {
        std::snprintf(buf, sizeof buf, "code at 0x%lx", static_cast<unsigned long>(pc));
        return buf;
    }
    std::string name;
    std::uintptr_t offset = 0;
    // The main program's link map has an empty name; its file is /proc/self/exe.
    const char* path = map->l_name && map->l_name[0] ? map->l_name : "/proc/self/exe";
    if (info.dli_sname && info.dli_saddr) {
        name = info.dli_sname;
        offset = pc - reinterpret_cast<std::uintptr_t>(info.dli_saddr);
    } else if (!elf_function(path, pc - map->l_addr, &name, &offset)) {
        const char* slash = std::strrchr(path, '/');
        std::snprintf(buf, sizeof buf, "+0x%lx", static_cast<unsigned long>(pc - reinterpret_cast<std::uintptr_t>(info.dli_fbase)));
        return std::string(slash ? slash + 1 : path) + buf;
    }
    if (name.compare(0, 2, "_Z") == 0) {
        int status = 0;
        char* plain = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
        if (plain && status == 0) name = plain;
        std::free(plain);
    }
    std::snprintf(buf, sizeof buf, "+0x%lx", static_cast<unsigned long>(offset));
    return name + buf;
}

// Where a block's threads stood when the time limit stopped it: the thread that was running
// kernel code (and in which function), how many wait at each barrier or warp operation, and
// how many were ready to run, not started (the running thread never yielded) or finished.
StoppedBlock describe_stopped_block(const Worker* w, unsigned long long linear) {
    StoppedBlock s{linear, w->block_idx, w->interrupted != nullptr, uint3{0, 0, 0}, {}, {}};
    char buf[256];
    if (w->interrupted) {
        s.thread = w->interrupted->thread_idx;
        std::string function = symbolize(w->interrupted_pc);
        std::snprintf(buf, sizeof buf, "thread (%u,%u,%u) was running in ", s.thread.x, s.thread.y, s.thread.z);
        s.where = buf + function;
        s.alike = buf + function.substr(0, function.rfind('+'));
    } else {
        s.where = "stopped between two threads' turns";
        s.alike = s.where;
    }
    std::string rest;
    struct Site {
        const char* op;
        const char* file;
        int line;
        unsigned count;
    };
    std::vector<Site> sites;
    unsigned ready = 0, not_started = 0, finished = 0;
    for (const ThreadState& t : w->threads) {
        if (&t == w->interrupted) continue;
        switch (t.status) {
            case Status::AtBarrier:
            case Status::AtWarp: {
                auto it = std::find_if(sites.begin(), sites.end(), [&](const Site& x) {
                    return std::strcmp(x.op, t.wait_op) == 0 && same_site(x.file, x.line, t.wait_file, t.wait_line);
                });
                if (it != sites.end())
                    ++it->count;
                else
                    sites.push_back({t.wait_op, t.wait_file, t.wait_line, 1});
                break;
            }
            case Status::Runnable: ++ready; break;
            case Status::NotStarted: ++not_started; break;
            case Status::Exited: ++finished; break;
        }
    }
    for (std::size_t i = 0; i < sites.size() && i < 3; ++i) {
        std::snprintf(buf, sizeof buf, ", %u wait in %s at %s:%d", sites[i].count, sites[i].op,
                      sites[i].file ? sites[i].file : "?", sites[i].line);
        rest += buf;
    }
    if (sites.size() > 3) rest += ", more wait at " + std::to_string(sites.size() - 3) + " other site(s)";
    if (ready) rest += ", " + std::to_string(ready) + " ready to run";
    if (not_started) rest += ", " + std::to_string(not_started) + " not started";
    if (finished) rest += ", " + std::to_string(finished) + " finished";
    s.where += rest;
    s.alike += rest;
    return s;
}

// The launch's SIMT_TIMEOUT error: the limit, how far the grid got, and where the stopped
// blocks' threads were (at most four blocks named; blocks stopped in the same state share
// one description, which is the common case: every block stuck the same way).
void report_timeout(Launch* l, unsigned long long blocks) {
    std::lock_guard<std::mutex> g(l->error_lock);
    std::sort(l->stopped.begin(), l->stopped.end(),
              [](const StoppedBlock& a, const StoppedBlock& b) { return a.linear < b.linear; });
    unsigned long long done = l->blocks_done.load(std::memory_order_relaxed);
    unsigned long long running = l->stopped.size();
    unsigned long long not_started = blocks > done + running ? blocks - done - running : 0;
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "the launch ran past its time limit of %llu ms: %llu of %llu block(s) finished, %llu running, %llu "
                  "not started",
                  l->desc->timeout_ms, done, blocks, running, not_started);
    std::string text = buf;
    simt_error* e = l->error;
    const std::size_t room = sizeof e->message - 8;  // keeps space for " ..."
    const std::vector<StoppedBlock>& stopped = l->stopped;
    std::vector<bool> listed(stopped.size(), false);
    int named = 0;
    bool truncated = false;
    for (std::size_t i = 0; i < stopped.size() && named < 4 && !truncated; ++i) {
        if (listed[i]) continue;
        std::string blocks_text;
        std::size_t shown = 0, more = 0;
        for (std::size_t j = i; j < stopped.size(); ++j) {
            if (listed[j] || stopped[j].alike != stopped[i].alike) continue;
            listed[j] = true;
            if (named == 4) {
                ++more;
                continue;
            }
            const uint3& b = stopped[j].block;
            std::snprintf(buf, sizeof buf, "%s(%u,%u,%u)", shown ? ", " : " ", b.x, b.y, b.z);
            blocks_text += buf;
            ++shown;
            ++named;
        }
        std::string part = shown + more > 1 ? "; blocks" : "; block";
        part += blocks_text;
        if (more) part += " and " + std::to_string(more) + " more";
        part += ": " + stopped[i].where;
        truncated = text.size() + part.size() > room;
        text += truncated ? " ..." : part;
    }
    std::size_t unnamed = static_cast<std::size_t>(std::count(listed.begin(), listed.end(), false));
    if (unnamed && !truncated) {
        std::string part = "; " + std::to_string(unnamed) + " more block(s) stopped elsewhere";
        if (text.size() + part.size() <= room) text += part;
    }
    e->kind = SIMT_TIMEOUT;
    if (!l->stopped.empty()) {
        const StoppedBlock& first = l->stopped.front();
        e->block[0] = first.block.x;
        e->block[1] = first.block.y;
        e->block[2] = first.block.z;
        e->has_thread = first.has_thread;
        e->thread[0] = first.thread.x;
        e->thread[1] = first.thread.y;
        e->thread[2] = first.thread.z;
    }
    std::snprintf(e->message, sizeof e->message, "%s", text.c_str());
}

// ------------------------------------------------------------------------------ watchdog
// One thread watches every launch that has a time limit (a thread per launch would add a
// thread creation to every small launch). It sleeps until the earliest deadline. At a
// launch's deadline it marks the launch timed out (its workers take no more blocks, and a
// scheduler between two threads' turns stops its block) and sends SIGURG to each worker
// running kernel code. It repeats the signal every POKE until the launch has returned: one
// that finds the worker in the runtime or the C library is ignored by the handler.
constexpr auto POKE = std::chrono::milliseconds(10);

class Watchdog {
public:
    // Never destroyed: its detached thread may still be waiting on it at process exit.
    static Watchdog& instance() {
        static Watchdog* w = new Watchdog;
        return *w;
    }

    // Watches `l` from now on; its deadline is l->next_check. False if no watchdog thread
    // could be started: the launch then runs without a limit.
    bool watch(Launch* l) {
        std::lock_guard<std::mutex> g(lock);
        if (!started) {
            try {
                std::thread(&Watchdog::run, this).detach();
            } catch (const std::system_error&) {
                return false;
            }
            started = true;
        }
        launches.push_back(l);
        // Wake the thread only if it sleeps past this deadline: with the usual generous
        // limits it already sleeps toward an earlier one, and a wake-up per launch would
        // cost more than the rest of the watching.
        if (l->next_check < wake_at) {
            wake_at = l->next_check;
            changed.notify_one();
        }
        return true;
    }

    // Stops watching `l`; once this returns, the watchdog never touches it again.
    void forget(Launch* l) {
        std::lock_guard<std::mutex> g(lock);
        launches.erase(std::remove(launches.begin(), launches.end(), l), launches.end());
    }

private:
    std::mutex lock;
    std::condition_variable changed;
    std::vector<Launch*> launches;
    bool started = false;
    // When the thread wakes next on its own (max: not until notified).
    std::chrono::steady_clock::time_point wake_at = std::chrono::steady_clock::time_point::max();

    [[noreturn]] void run() {
        std::unique_lock<std::mutex> g(lock);
        for (;;) {
            auto now = std::chrono::steady_clock::now();
            auto next = std::chrono::steady_clock::time_point::max();
            for (Launch* l : launches) {
                if (now >= l->next_check) {
                    if (!l->timed_out.exchange(true)) {
                        l->failed.store(true);
                        // Libraries loaded since the last timeout join the no-interrupt list.
                        dl_iterate_phdr(note_library_code, nullptr);
                    }
                    interrupt(l);
                    l->next_check = now + POKE;
                }
                next = std::min(next, l->next_check);
            }
            // Forgotten launches leave their deadlines behind: at worst one idle wake-up.
            wake_at = next;
            if (next == std::chrono::steady_clock::time_point::max())
                changed.wait(g);
            else
                changed.wait_until(g, next);
        }
    }

    static void interrupt(Launch* l) {
        std::lock_guard<std::mutex> g(l->workers_lock);  // keeps every listed thread alive
        for (const auto& [thread, worker] : l->live) {
            // A worker in the runtime or its scheduler stops at its next turn unasked.
            if (worker->in_kernel.load(std::memory_order_relaxed) == 0) continue;
            union sigval value;
            value.sival_ptr = const_cast<char*>(&watchdog_token);
            pthread_sigqueue(thread, SIGURG, value);
        }
    }
};

// After a siglongjmp from a fiber back to the worker's own stack ASan still believes the
// abandoned fiber's stack is current: tell it otherwise (dropping the fiber's fake stack).
void back_on_worker_stack(Worker* w) {
#if SIMT_ASAN
    __sanitizer_start_switch_fiber(nullptr, w->main_stack_lo, w->main_stack_size);
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#else
    (void)w;
#endif
}

// ------------------------------------------------------------------------------ workers
void record_launch_error(Launch* l, Worker* w) {
    std::lock_guard<std::mutex> g(l->error_lock);
    l->failed.store(true);
    simt_error* e = l->error;
    if (e->kind != SIMT_OK) return;  // the first error wins
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
    std::snprintf(e->message, sizeof e->message, "%s", w->error.message);
}

void worker_main(Launch* l) {
    ensure_alt_stack();
    install_handlers();
    // The watchdog interrupts workers with SIGURG: this thread must not block it (the
    // caller's mask is restored at the end).
    sigset_t urg, old_mask;
    sigemptyset(&urg);
    sigaddset(&urg, SIGURG);
    pthread_sigmask(SIG_UNBLOCK, &urg, &old_mask);
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
    {
        std::lock_guard<std::mutex> g(l->workers_lock);
        l->live.emplace_back(pthread_self(), &w);
    }
    for (;;) {
        if (l->failed.load(std::memory_order_relaxed)) break;
        unsigned long long b = l->next_block.fetch_add(1, std::memory_order_relaxed);
        if (b >= blocks) break;
        int jumped = sigsetjmp(w.fault_jump, 1);
        if (jumped == 0) {
            run_block(&w, b);
        } else {
            // Back from a signal handler, the block's fibers abandoned: a memory fault in a
            // kernel thread (1; the handler recorded it) or the watchdog (2).
            back_on_worker_stack(&w);
            leave_kernel_code(&w);
            w.stopped = jumped == 2;
            release_fibers(&w);
        }
        w.current = nullptr;
        if (w.error.kind != SIMT_OK) {
            record_launch_error(l, &w);
            break;
        }
        if (w.stopped) {
            StoppedBlock s = describe_stopped_block(&w, b);
            std::lock_guard<std::mutex> g(l->error_lock);
            l->stopped.push_back(std::move(s));
            break;
        }
        l->blocks_done.fetch_add(1, std::memory_order_relaxed);
    }
    w.current = nullptr;
    tls_worker = nullptr;  // a watchdog signal still on its way finds no worker
    std::atomic_signal_fence(std::memory_order_seq_cst);
    {
        std::lock_guard<std::mutex> g(l->workers_lock);
        auto me = std::find_if(l->live.begin(), l->live.end(), [&](const auto& e) { return e.second == &w; });
        if (me != l->live.end()) l->live.erase(me);
    }
    tls_block = nullptr;
    tls_thread = nullptr;
    guarded_free(w.dynamic_shared);
    if (sigismember(&old_mask, SIGURG)) pthread_sigmask(SIG_BLOCK, &urg, nullptr);
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
    // A limit beyond ten years is no limit (and would overflow the clock's arithmetic).
    constexpr unsigned long long MAX_TIMEOUT_MS = 10ull * 366 * 24 * 3600 * 1000;
    bool watched = false;
    if (d->timeout_ms != 0 && d->timeout_ms <= MAX_TIMEOUT_MS) {
        l.next_check = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(static_cast<std::chrono::milliseconds::rep>(d->timeout_ms));
        watched = simt::Watchdog::instance().watch(&l);
    }
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
    if (watched) simt::Watchdog::instance().forget(&l);
    // Timed out, unless every block had finished by the time the workers noticed.
    if (err->kind == SIMT_OK && l.timed_out.load() && l.blocks_done.load() < blocks) simt::report_timeout(&l, blocks);
    return err->kind;
}

extern "C" void* simt_alloc(size_t bytes, size_t align) { return simt::guarded_alloc(bytes, align); }
extern "C" void simt_free(void* p) { simt::guarded_free(p); }

extern "C" void simt_set_fault_explainer(simt_fault_explainer fn) {
    simt::fault_explainer.store(fn, std::memory_order_release);
}

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
