// simt_api.h — the SIMT emulator's C interface: what Rust (src/backend/kernel/simt.rs, which mirrors
// these structs with #[repr(C)]) and the ASan test driver call. Implemented in simt_host.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {
typedef void (*simt_entry_fn)(void* const* params);

struct simt_launch_desc {
    simt_entry_fn entry;
    const char* kernel;
    unsigned grid[3];
    unsigned block[3];
    unsigned shared_bytes;
    void* const* params;
    int lane_order;  // 0 forward, 1 reverse, 2 random
    unsigned long long seed;
    unsigned workers;  // 0: one per available core
    // Wall-clock limit for the whole launch in milliseconds; 0: none. Past it the launch
    // stops its blocks and returns SIMT_TIMEOUT, saying where every running block's
    // threads were. Keep this the last field (Rust's LaunchDesc mirrors the layout).
    unsigned long long timeout_ms;
};

enum simt_error_kind {
    SIMT_OK = 0,
    SIMT_BARRIER_DIVERGENCE = 1,
    SIMT_DEADLOCK = 2,
    SIMT_WARP_MISUSE = 3,
    SIMT_MEMORY_FAULT = 4,
    SIMT_STACK_OVERFLOW = 5,
    SIMT_BAD_LAUNCH = 6,
    SIMT_TIMEOUT = 7,
};

struct simt_error {
    int kind;
    int has_thread;
    unsigned block[3];
    unsigned thread[3];
    int line;
    char file[160];
    char message[512];
};

int simt_launch(const simt_launch_desc* desc, simt_error* err);
void* simt_alloc(size_t bytes, size_t align);
void simt_free(void* p);

// Explains a memory fault of a kernel thread that simt_alloc's bookkeeping cannot: a driver
// stand-in that hands out device memory of its own can name the allocation and the rule
// broken. Called for every fault inside a kernel thread except a fiber-stack overflow, with
// the faulting address and whether the access was a write. Return nonzero after writing a
// NUL-terminated message of at most `capacity` bytes: the launch then fails with
// SIMT_MEMORY_FAULT and that message; return 0 to let the emulator describe the fault.
//
// It runs inside the SIGSEGV/SIGBUS handler, on the faulting thread, while that thread's
// kernel code is stopped at an arbitrary instruction: it must not allocate, must not take a
// lock that kernel code or the thread's own runtime could hold (a try-lock, or a lock only
// taken outside launches, is fine), and must not throw.
typedef int (*simt_fault_explainer)(uintptr_t addr, int is_write, char* message, size_t capacity);

// Installs `fn` for every later fault (null removes it). One explainer per process copy of
// the runtime; the last call wins.
void simt_set_fault_explainer(simt_fault_explainer fn);
}
