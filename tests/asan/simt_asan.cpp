// simt_asan.cpp — the SIMT emulator's self-tests under AddressSanitizer.
//
// Built by .ci/run, not by cargo:
//   g++ -std=c++20 -O1 -g -fsanitize=address -fno-omit-frame-pointer -DSIMT_SERIAL_BLOCKS \
//       -I kernels kernels/simt_host.cpp tests/asan/simt_asan.cpp -o target/simt_asan
// In this flavour blocks run one at a time and static __shared__ arrays are plain statics,
// which ASan surrounds with redzones (it cannot see into thread_local arrays), and every
// fiber switch is announced to ASan (__sanitizer_start/finish_switch_fiber).
//
//   simt_asan                   run the correct kernels (exact results, two lane orders) and
//                               the misuse kernels (each must be reported); exit 0 if all pass
//   simt_asan --shared-overflow run a kernel that overflows a __shared__ array: ASan must
//                               abort with a global-buffer-overflow report
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "selftest.cu"

#include "simt_api.h"

// Let the emulator's own SIGSEGV handler see guard-page faults.
extern "C" const char* __asan_default_options() { return "handle_segv=0:detect_leaks=1"; }

namespace {

int failures = 0;
int lane_order = 0;
unsigned long long timeout_ms = 0;  // the launch time limit; 0: none

void check(bool ok, const char* what) {
    std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    if (!ok) ++failures;
}

// kernelParams unpacking, as the build script generates it for the Rust side.
template <class... A, std::size_t... I>
void unpack(void (*k)(A...), void* const* p, std::index_sequence<I...>) {
    k(*static_cast<std::remove_reference_t<A>*>(p[I])...);
}
template <class... A>
constexpr std::size_t arity(void (*)(A...)) {
    return sizeof...(A);
}
template <auto K>
void entry(void* const* p) {
    unpack(K, p, std::make_index_sequence<arity(K)>{});
}

template <auto K, class... A>
int launch(const char* name, unsigned grid, unsigned block, unsigned shared, simt_error* err, A... args) {
    void* params[] = {static_cast<void*>(&args)...};
    simt_launch_desc d{entry<K>, name, {grid, 1, 1}, {block, 1, 1}, shared, params, lane_order, 7, 1, timeout_ms};
    return simt_launch(&d, err);
}

template <class T>
T* device(const std::vector<T>& host) {
    T* p = static_cast<T*>(simt_alloc(host.size() * sizeof(T), alignof(T)));
    std::memcpy(p, host.data(), host.size() * sizeof(T));
    return p;
}

void correct_kernels() {
    simt_error err;
    char what[128];
    {
        const unsigned long long n = 1000;
        std::vector<float> a(n), b(n);
        for (unsigned i = 0; i < n; ++i) a[i] = 0.5f * i, b[i] = 1.0f + i;
        float *da = device(a), *db = device(b), *dc = device(std::vector<float>(n, NAN));
        int rc = launch<vector_add>("vector_add", 3, 64, 0, &err, (const float*)da, (const float*)db, dc, n);
        bool ok = rc == 0;
        for (unsigned i = 0; i < n; ++i) ok = ok && dc[i] == a[i] + b[i];
        check(ok, "vector_add: grid-stride loop over 1000 elements");
        simt_free(da), simt_free(db), simt_free(dc);
    }
    for (unsigned threads : {1u, 33u, 256u}) {
        const unsigned blocks = 3, n = blocks * threads - 1;
        std::vector<float> in(n);
        for (unsigned i = 0; i < n; ++i) in[i] = float(int(i % 13) - 6);
        float *din = device(in), *dout = device(std::vector<float>(blocks, NAN));
        int rc = launch<block_sum>("block_sum", blocks, threads, 0, &err, (const float*)din, dout, n);
        bool ok = rc == 0;
        for (unsigned b = 0; b < blocks; ++b) {
            float want = 0;
            for (unsigned i = b * threads; i < std::min(n, (b + 1) * threads); ++i) want += in[i];
            ok = ok && dout[b] == want;
        }
        std::snprintf(what, sizeof what, "block_sum: shared memory + barriers, block size %u", threads);
        check(ok, what);
        simt_free(din), simt_free(dout);
    }
    {
        std::vector<float> in(64);
        for (int i = 0; i < 64; ++i) in[i] = float(i);
        float *din = device(in), *down = device(std::vector<float>(2, NAN)), *dx = device(std::vector<float>(64, NAN));
        int rc = launch<warp_sums>("warp_sums", 1, 64, 0, &err, (const float*)din, down, dx);
        bool ok = rc == 0 && down[0] == 496.0f && down[1] == 1520.0f;
        for (int t = 0; t < 64; ++t) ok = ok && dx[t] == (t < 32 ? 496.0f : 1520.0f);
        check(ok, "warp_sums: __shfl_down_sync and __shfl_xor_sync");
        simt_free(din), simt_free(down), simt_free(dx);
    }
    {
        std::vector<int> pred(64);
        for (int i = 0; i < 64; ++i) pred[i] = (i % 3 == 0) && i >= 32;
        int* dp = device(pred);
        unsigned *ballot = device(std::vector<unsigned>(2)), *count = device(std::vector<unsigned>(2));
        int *any = device(std::vector<int>(64, -1)), *all = device(std::vector<int>(64, -1));
        int rc = launch<votes>("votes", 1, 64, 0, &err, (const int*)dp, ballot, count, any, all);
        unsigned want = 0;
        for (int l = 0; l < 32; ++l)
            if (pred[32 + l]) want |= 1u << l;
        bool ok = rc == 0 && ballot[0] == 0 && count[0] == 0 && ballot[1] == want &&
                  count[1] == unsigned(__builtin_popcount(want)) && any[0] == 0 && any[40] == 1 && all[40] == 0;
        check(ok, "votes: __ballot_sync, __any_sync, __all_sync");
        simt_free(dp), simt_free(ballot), simt_free(count), simt_free(any), simt_free(all);
    }
    {
        const unsigned long long n = 10007;
        std::vector<int> in(n);
        long long want = 0;
        for (unsigned i = 0; i < n; ++i) want += in[i] = int(i % 101) - 50;
        int *din = device(in), *total = device(std::vector<int>(1, 0));
        int rc = launch<atomic_sum>("atomic_sum", 17, 96, 0, &err, (const int*)din, total, n);
        check(rc == 0 && *total == want, "atomic_sum: atomicAdd from 17 blocks");
        simt_free(din), simt_free(total);
    }
    {
        std::vector<__half> a(256), b(256);
        std::vector<float> c(256);
        for (int i = 0; i < 256; ++i) a[i] = __half(float((i * 7) % 11 - 5) / 8), b[i] = __half(float((i * 5) % 13 - 6) / 8), c[i] = float(i % 3);
        __half *da = device(a), *db = device(b);
        float *dc = device(c), *dd = device(std::vector<float>(256, NAN));
        int rc = launch<wmma_row_major>("wmma_row_major", 1, 32, 0, &err, (const __half*)da, (const __half*)db,
                                        (const float*)dc, dd);
        bool ok = rc == 0;
        for (int m = 0; m < 16; ++m)
            for (int n = 0; n < 16; ++n) {
                double want = c[m * 16 + n];
                for (int k = 0; k < 16; ++k) want += double(float(a[m * 16 + k])) * double(float(b[k * 16 + n]));
                ok = ok && std::fabs(dd[m * 16 + n] - want) <= 1e-3 * (1 + std::fabs(want));
            }
        check(ok, "wmma 16x16x16: half inputs, float accumulate");
        simt_free(da), simt_free(db), simt_free(dc), simt_free(dd);
    }
    {
        std::vector<float> in(66);
        for (int i = 0; i < 66; ++i) in[i] = float(i);
        float *din = device(in), *dout = device(std::vector<float>(66, NAN));
        int rc = launch<reverse_in_block>("reverse_in_block", 2, 33, 33 * 4, &err, (const float*)din, dout);
        bool ok = rc == 0;
        for (int b = 0; b < 2; ++b)
            for (int t = 0; t < 33; ++t) ok = ok && dout[b * 33 + t] == in[b * 33 + 32 - t];
        check(ok, "reverse_in_block: dynamic shared memory");
        simt_free(din), simt_free(dout);
    }
    {
        float* out = device(std::vector<float>(2 * 128, NAN));
        int rc = launch<barrier_rounds>("barrier_rounds", 2, 128, 0, &err, out, 4);
        bool ok = rc == 0;
        for (int i = 0; i < 256; ++i) {
            float want = 0;
            for (int r = 0; r < 4; ++r) want += float((i % 128 + 1) % 128 + r);
            ok = ok && out[i] == want;
        }
        check(ok, "barrier_rounds: 8 barriers per thread");
        simt_free(out);
    }
}

void misuse_kernels() {
    simt_error err;
    float* f = device(std::vector<float>(1024, 0));
    int* i = device(std::vector<int>(32, 0));
    check(launch<broken_divergent_barrier>("broken_divergent_barrier", 1, 64, 0, &err, f) == 1,
          "divergent __syncthreads is reported");
    check(launch<broken_early_exit>("broken_early_exit", 1, 32, 0, &err, f) == 1, "exit before __syncthreads is reported");
    check(launch<broken_exited_lane>("broken_exited_lane", 1, 32, 0, &err, i) == 3, "mask naming an exited lane is reported");
    check(launch<broken_mask_mismatch>("broken_mask_mismatch", 1, 32, 0, &err, i) == 3, "mask disagreement is reported");
    check(launch<broken_deadlock>("broken_deadlock", 1, 32, 0, &err, i) == 2, "deadlock is reported");
    check(launch<broken_off_by_one>("broken_off_by_one", 1, 256, 0, &err, f, 1024u) == 4 &&
              std::strstr(err.message, "past the end") != nullptr,
          "write past the end of an allocation is reported");
    // The watchdog abandons the spinning fiber by siglongjmp; the next launch must run clean.
    timeout_ms = 100;
    check(launch<broken_endless>("broken_endless", 2, 64, 0, &err, f, 3) == 7 &&
              std::strstr(err.message, "__syncthreads at") != nullptr,
          "a thread that never finishes is stopped at the time limit");
    check(launch<barrier_rounds>("barrier_rounds", 1, 64, 0, &err, f, 2) == 0,
          "a launch after the timed-out one runs normally");
    timeout_ms = 0;
    simt_free(f), simt_free(i);
}

}  // namespace

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // ASan reports go to stderr; keep the order readable
    if (argc > 1 && std::strcmp(argv[1], "--shared-overflow") == 0) {
        float* out = device(std::vector<float>(64, 0));
        simt_error err;
        launch<broken_shared_overflow>("broken_shared_overflow", 1, 33, 0, &err, out);
        std::printf("shared-memory overflow went unnoticed\n");
        return 0;
    }
    for (int order : {0, 1}) {
        lane_order = order;
        std::printf("-- lane order %s\n", order ? "reverse" : "forward");
        correct_kernels();
        misuse_kernels();
    }
    std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}
