// simt_api.h — the SIMT emulator's C interface: what Rust (src/backend/simt.rs, which mirrors
// these structs with #[repr(C)]) and the ASan test driver call. Implemented in simt_host.cpp.
#pragma once

#include <cstddef>

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
};

enum simt_error_kind {
    SIMT_OK = 0,
    SIMT_BARRIER_DIVERGENCE = 1,
    SIMT_DEADLOCK = 2,
    SIMT_WARP_MISUSE = 3,
    SIMT_MEMORY_FAULT = 4,
    SIMT_STACK_OVERFLOW = 5,
    SIMT_BAD_LAUNCH = 6,
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
}
