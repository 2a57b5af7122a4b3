// simt.cuh — the one header every kernels/*.cu includes.
//
// Under nvcc or NVRTC (__CUDACC__ defined) this is plain CUDA: the fp16, bf16 and wmma
// headers and two small helpers, so kernels read exactly as CUDA C++.
//
// Under a host C++20 compiler it is the SIMT emulator's device-side half: the same kernel
// text compiles as ordinary C++ and runs on the CPU through kernels/simt_host.cpp, with
// CUDA's execution model intact:
//   * threadIdx/blockIdx/blockDim/gridDim read the running thread's state; each CUDA thread
//     is a fiber, each block runs on one worker OS thread, blocks spread over workers;
//   * __syncthreads is a counting barrier; warp intrinsics (_sync shuffles, votes,
//     __syncwarp, the wmma *_sync operations) are rendezvous of exactly the lanes in
//     their mask;
//   * misuse the hardware leaves undefined (divergent barriers, masks naming exited lanes,
//     lanes disagreeing on a mask, misaligned wmma tiles) is reported as an error naming
//     the kernel, block, thread and source line, never a hang;
//   * static __shared__ memory is per block and poisoned (0xFF bytes: NaN floats) when a
//     block first reaches its declaration; dynamic shared memory is poisoned per block.
// Kernel code needs no #ifdef. Write dynamic shared memory as SIMT_DYNAMIC_SHARED(T, name).
#pragma once

#if defined(__CUDACC__)
// ============================================================================ CUDA side
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#define SIMT_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
// Unrolls the loop that follows: register arrays indexed by its counter stay in registers.
#define SIMT_UNROLL _Pragma("unroll")

#else
// ============================================================================ host side
#include <math.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
// CUDA's alignment specifier (wmma tiles in __shared__ need 32 bytes); the host compiler
// honours it for statics and thread_locals alike, so the emulator sees the same alignment.
#define __align__(n) __attribute__((aligned(n)))
// Static shared memory: one copy per worker OS thread, and a worker runs one block at a
// time, so per block. The ASan flavour (blocks run serially) drops thread_local because
// ASan cannot see overflows of thread_local arrays. The build script's host shim follows each
// __shared__ declaration with SIMT_SHARED_REGISTER(name), which poisons it per block.
#if defined(SIMT_SERIAL_BLOCKS)
#define __shared__ static
#else
#define __shared__ static thread_local
#endif
#define SIMT_SHARED_REGISTER(name) ::simt::register_shared(&(name), sizeof(name))
#define SIMT_DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(::simt::dynamic_shared())
#define SIMT_UNROLL  // the host compiler needs no hint: the emulator has no register file

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) int2 {
    int x, y;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }

namespace simt {

// Per-CUDA-thread and per-block state the runtime keeps; kernels see them through the
// index macros below. tls_thread/tls_block are set by the scheduler before it resumes a
// fiber; fibers never move between OS threads, so thread_local reads stay valid.
struct ThreadState;
struct ThreadView {
    uint3 thread_idx;
};
struct BlockView {
    uint3 block_idx;
    dim3 block_dim;
    dim3 grid_dim;
};
// A warp rendezvous: every lane in `mask` deposits `payload`; the last to arrive calls
// `complete(payloads, mask)` (payloads indexed by lane, null outside the mask), which
// computes every lane's result through the payload pointers. `complete` returns an error
// message or null. Lanes must agree on the mask and on `complete` (the operation).
using WarpComplete = const char* (*)(void* const* payloads, unsigned mask);

// The runtime as a table of functions: how a kernel compiled separately into a shared
// library (a user's own .cu, built by nanoddp::backend::simt_module with SIMT_MODULE
// defined) reaches the runtime linked into the program, without exported symbols.
struct RuntimeTable {
    unsigned version;
    ThreadView* (*thread)();
    BlockView* (*block)();
    void (*syncthreads)(const char* file, int line);
    void* (*dynamic_shared)();
    void (*register_shared)(void* p, std::size_t bytes);
    unsigned (*active_mask)();
    void (*warp_sync)(unsigned mask, void* payload, WarpComplete complete, const char* op, const char* file, int line);
};
constexpr unsigned RUNTIME_TABLE_VERSION = 1;

#if defined(SIMT_MODULE)
// A separately compiled module: every runtime call goes through the table it was bound to.
inline const RuntimeTable* runtime = nullptr;
inline void syncthreads(const char* file, int line) { runtime->syncthreads(file, line); }
inline void* dynamic_shared() { return runtime->dynamic_shared(); }
inline void register_shared(void* p, std::size_t bytes) { runtime->register_shared(p, bytes); }
inline unsigned active_mask() { return runtime->active_mask(); }
inline void warp_sync(unsigned mask, void* payload, WarpComplete complete, const char* op, const char* file, int line) {
    runtime->warp_sync(mask, payload, complete, op, file, line);
}
#define SIMT_THREAD_VIEW (::simt::runtime->thread())
#define SIMT_BLOCK_VIEW (::simt::runtime->block())
#else
extern thread_local ThreadView* tls_thread;
extern thread_local BlockView* tls_block;
#define SIMT_THREAD_VIEW (::simt::tls_thread)
#define SIMT_BLOCK_VIEW (::simt::tls_block)

// Runtime entry points (kernels/simt_host.cpp).
void syncthreads(const char* file, int line);
void* dynamic_shared();
void register_shared(void* p, std::size_t bytes);
unsigned active_mask();
void warp_sync(unsigned mask, void* payload, WarpComplete complete, const char* op, const char* file, int line);
#endif

// ---- shuffles and votes, as payload + completion function
enum class Shfl { Idx, Up, Down, Xor };
struct ShflPayload {
    std::uint64_t value;
    std::uint64_t result;
    int arg;
    int width;
};
// Bytes read from a lane outside the mask: undefined on a GPU, poison here.
constexpr std::uint64_t POISON64 = ~std::uint64_t{0};

template <Shfl kind>
const char* complete_shfl(void* const* payloads, unsigned mask) {
    for (int lane = 0; lane < 32; ++lane) {
        if (!(mask >> lane & 1u)) continue;
        auto* me = static_cast<ShflPayload*>(payloads[lane]);
        int width = me->width;
        if (width < 1 || width > 32 || (width & (width - 1)) != 0) return "shuffle width must be a power of two in [1, 32]";
        int base = lane & ~(width - 1);
        int src = lane;
        switch (kind) {
            case Shfl::Idx: src = base + (me->arg & (width - 1)); break;
            case Shfl::Up: src = (lane - base) >= me->arg ? lane - me->arg : lane; break;
            case Shfl::Down: src = (lane - base) + me->arg < width ? lane + me->arg : lane; break;
            case Shfl::Xor: {
                int x = lane ^ me->arg;
                src = x < base + width ? x : lane;  // later groups are out of reach: own value
                break;
            }
        }
        if (src < 0 || src > 31 || !(mask >> src & 1u)) {
            me->result = POISON64;
        } else {
            me->result = static_cast<ShflPayload*>(payloads[src])->value;
        }
    }
    return nullptr;
}

struct VotePayload {
    int predicate;
    unsigned result;
};
inline const char* complete_ballot(void* const* payloads, unsigned mask) {
    unsigned bits = 0;
    for (int lane = 0; lane < 32; ++lane)
        if ((mask >> lane & 1u) && static_cast<VotePayload*>(payloads[lane])->predicate) bits |= 1u << lane;
    for (int lane = 0; lane < 32; ++lane)
        if (mask >> lane & 1u) static_cast<VotePayload*>(payloads[lane])->result = bits;
    return nullptr;
}
inline const char* complete_all(void* const* payloads, unsigned mask) {
    unsigned all = 1;
    for (int lane = 0; lane < 32; ++lane)
        if ((mask >> lane & 1u) && !static_cast<VotePayload*>(payloads[lane])->predicate) all = 0;
    for (int lane = 0; lane < 32; ++lane)
        if (mask >> lane & 1u) static_cast<VotePayload*>(payloads[lane])->result = all;
    return nullptr;
}
inline const char* complete_syncwarp(void* const*, unsigned) { return nullptr; }

template <Shfl kind, class T>
inline T shfl(const char* file, int line, const char* op, unsigned mask, T var, int arg, int width = 32) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffled types are at most 8 bytes");
    ShflPayload p{0, 0, arg, width};
    std::memcpy(&p.value, &var, sizeof(T));
    warp_sync(mask, &p, complete_shfl<kind>, op, file, line);
    T out;
    std::memcpy(&out, &p.result, sizeof(T));
    return out;
}
inline unsigned vote(const char* file, int line, const char* op, WarpComplete complete, unsigned mask, int predicate) {
    VotePayload p{predicate != 0, 0};
    warp_sync(mask, &p, complete, op, file, line);
    return p.result;
}
inline void syncwarp(const char* file, int line, unsigned mask = 0xffffffffu) {
    warp_sync(mask, nullptr, complete_syncwarp, "__syncwarp", file, line);
}

}  // namespace simt

#define threadIdx (SIMT_THREAD_VIEW->thread_idx)
#define blockIdx (SIMT_BLOCK_VIEW->block_idx)
#define blockDim (SIMT_BLOCK_VIEW->block_dim)
#define gridDim (SIMT_BLOCK_VIEW->grid_dim)
#define warpSize 32

#define __syncthreads() ::simt::syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) ::simt::syncwarp(__FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__)
#define __activemask() ::simt::active_mask()
#define __shfl_sync(...) ::simt::shfl<::simt::Shfl::Idx>(__FILE__, __LINE__, "__shfl_sync", __VA_ARGS__)
#define __shfl_up_sync(...) ::simt::shfl<::simt::Shfl::Up>(__FILE__, __LINE__, "__shfl_up_sync", __VA_ARGS__)
#define __shfl_down_sync(...) ::simt::shfl<::simt::Shfl::Down>(__FILE__, __LINE__, "__shfl_down_sync", __VA_ARGS__)
#define __shfl_xor_sync(...) ::simt::shfl<::simt::Shfl::Xor>(__FILE__, __LINE__, "__shfl_xor_sync", __VA_ARGS__)
#define __ballot_sync(mask, pred) ::simt::vote(__FILE__, __LINE__, "__ballot_sync", ::simt::complete_ballot, (mask), (pred))
#define __any_sync(mask, pred) \
    static_cast<int>(::simt::vote(__FILE__, __LINE__, "__any_sync", ::simt::complete_ballot, (mask), (pred)) != 0u)
#define __all_sync(mask, pred) \
    static_cast<int>(::simt::vote(__FILE__, __LINE__, "__all_sync", ::simt::complete_all, (mask), (pred)))

// ---- atomics: blocks run on several OS threads at once, so these are real atomics.
// Relaxed ordering, as CUDA's atomics are; __threadfence orders.
#define SIMT_ATOMIC_INT(T)                                                                               \
    inline T atomicAdd(T* a, T v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }                \
    inline T atomicSub(T* a, T v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); }                \
    inline T atomicExch(T* a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_RELAXED); }              \
    inline T atomicCAS(T* a, T expected, T desired) {                                                    \
        __atomic_compare_exchange_n(a, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);   \
        return expected;                                                                                 \
    }                                                                                                    \
    inline T atomicMax(T* a, T v) {                                                                      \
        T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                                    \
        while (old < v && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) { \
        }                                                                                                \
        return old;                                                                                      \
    }                                                                                                    \
    inline T atomicMin(T* a, T v) {                                                                      \
        T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                                    \
        while (old > v && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) { \
        }                                                                                                \
        return old;                                                                                      \
    }
SIMT_ATOMIC_INT(int)
SIMT_ATOMIC_INT(unsigned int)
SIMT_ATOMIC_INT(unsigned long long)
#undef SIMT_ATOMIC_INT

namespace simt {
// Floating-point read-modify-write as a compare-and-swap loop on the bit pattern.
template <class F, class Bits, class Op>
inline F atomic_float_rmw(F* a, Op op) {
    Bits* p = reinterpret_cast<Bits*>(a);
    Bits old = __atomic_load_n(p, __ATOMIC_RELAXED);
    for (;;) {
        F cur;
        std::memcpy(&cur, &old, sizeof(F));
        F next = op(cur);
        Bits want;
        std::memcpy(&want, &next, sizeof(F));
        if (__atomic_compare_exchange_n(p, &old, want, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return cur;
    }
}
}  // namespace simt
inline float atomicAdd(float* a, float v) {
    return simt::atomic_float_rmw<float, std::uint32_t>(a, [v](float x) { return x + v; });
}
inline double atomicAdd(double* a, double v) {
    return simt::atomic_float_rmw<double, std::uint64_t>(a, [v](double x) { return x + v; });
}
inline float atomicExch(float* a, float v) {
    return simt::atomic_float_rmw<float, std::uint32_t>(a, [v](float) { return v; });
}
// CUDA's float atomicMax does not exist; kernels use the int trick or CAS. Nothing here.
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---- device math that plain C++ lacks
template <class T>
inline T min(T a, T b) { return b < a ? b : a; }
template <class T>
inline T max(T a, T b) { return a < b ? b : a; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x != x ? 0.0f : (x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x)); }
inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
inline int __float_as_int(float f) {
    int i;
    std::memcpy(&i, &f, 4);
    return i;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
template <class T>
inline T __ldg(const T* p) { return *p; }
// CUDA's load past the L1 (other blocks' writes, ordered by their fence and an atomic): the
// emulator has no L1, and its atomics and fences order memory between the worker threads.
template <class T>
inline T __ldcg(const T* p) { return *p; }

// ---- __half: IEEE binary16 storage, arithmetic in float rounded back to nearest even.
// For + - * / this equals correctly rounded half arithmetic (float has > 2*11+2 bits).
namespace simt {
inline std::uint16_t f32_to_f16_bits(float f) {
    std::uint32_t x;
    std::memcpy(&x, &f, 4);
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    const std::uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fffu;                  // NaN: CUDA's canonical quiet NaN
    if (a >= 0x47800000u) return sign | 0x7c00u;          // >= 65536 (and inf): inf
    if (a >= 0x38800000u) {                               // half normal range (>= 2^-14)
        std::uint32_t h = (a >> 13) - (112u << 10);       // rebias exponent 127 -> 15
        const std::uint32_t rem = a & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // ties to even; may carry to inf
        return static_cast<std::uint16_t>(sign | h);
    }
    const std::uint32_t e = a >> 23;
    if (e < 102) return static_cast<std::uint16_t>(sign);  // < 2^-25: rounds to zero
    // Subnormal half: value = m * 2^-24 with m = M * 2^(e - 126), M the 24-bit significand.
    const std::uint32_t m_full = (a & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - e;                  // 14..24
    std::uint32_t m = m_full >> shift;
    const std::uint32_t rem = m_full & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (m & 1u))) ++m;     // may carry into the smallest normal
    return static_cast<std::uint16_t>(sign | m);
}
inline float f16_bits_to_f32(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    std::uint32_t e = (h >> 10) & 0x1fu;
    std::uint32_t m = h & 0x3ffu;
    std::uint32_t bits;
    if (e == 0x1f) {
        bits = sign | 0x7f800000u | (m << 13);
    } else if (e == 0) {
        if (m == 0) {
            bits = sign;
        } else {  // subnormal: normalize
            int exp = -14;
            while (!(m & 0x400u)) {
                m <<= 1;
                --exp;
            }
            bits = sign | static_cast<std::uint32_t>(exp + 127) << 23 | (m & 0x3ffu) << 13;
        }
    } else {
        bits = sign | (e + 112u) << 23 | m << 13;
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}
}  // namespace simt

namespace simt {
// A 16-bit float's storage, raw bits in `x`, converted to and from float by `Format`'s
// `from_f32` and `to_f32`: __half and __nv_bfloat16 are this with their formats.
template <class Format>
struct Float16 {
    std::uint16_t x;
    Float16() = default;
    Float16(float f) : x(Format::from_f32(f)) {}
    Float16(double d) : x(Format::from_f32(static_cast<float>(d))) {}
    Float16(int i) : x(Format::from_f32(static_cast<float>(i))) {}
    operator float() const { return Format::to_f32(x); }
};
struct Binary16 {
    static std::uint16_t from_f32(float f) { return f32_to_f16_bits(f); }
    static float to_f32(std::uint16_t h) { return f16_bits_to_f32(h); }
};
}  // namespace simt

using __half = simt::Float16<simt::Binary16>;
using half = __half;
struct __half2 {
    __half x, y;
};
static_assert(sizeof(__half) == 2 && sizeof(__half2) == 4, "half layout matches CUDA");

// ---- __nv_bfloat16: bfloat16 storage (the top 16 bits of an f32), converted from float
// by rounding to nearest even and NaN to the canonical quiet NaN 0x7fff, as cuda_bf16.h's
// __float2bfloat16 and PTX's cvt.rn.bf16.f32 do. Arithmetic is float rounded back: for
// + - * that is correctly rounded bf16 arithmetic (float has > 2*8+2 bits).
namespace simt {
inline std::uint16_t f32_to_bf16_bits(float f) {
    std::uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
    // Adding 0x7fff rounds up past the halfway point; the low result bit breaks ties to even.
    // Overflow carries into the exponent, up to inf, as rounding should.
    return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
inline float bf16_bits_to_f32(std::uint16_t h) {
    const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}
struct Bfloat16 {
    static std::uint16_t from_f32(float f) { return f32_to_bf16_bits(f); }
    static float to_f32(std::uint16_t h) { return bf16_bits_to_f32(h); }
};
}  // namespace simt

using __nv_bfloat16 = simt::Float16<simt::Bfloat16>;
static_assert(sizeof(__nv_bfloat16) == 2, "bfloat16 layout matches CUDA");

// __half and __nv_bfloat16 share what does not depend on the format: raw bits in `x`, and
// + - * / computed in float and rounded back by the constructor.
namespace simt {
template <class H>
constexpr bool is_float16 = std::is_same_v<H, __half> || std::is_same_v<H, __nv_bfloat16>;
template <class H>
inline H from_bits(unsigned short u) {
    H h;
    h.x = u;
    return h;
}
}  // namespace simt
template <class H, class = std::enable_if_t<simt::is_float16<H>>>
inline H __hadd(H a, H b) { return H(float(a) + float(b)); }
template <class H, class = std::enable_if_t<simt::is_float16<H>>>
inline H __hsub(H a, H b) { return H(float(a) - float(b)); }
template <class H, class = std::enable_if_t<simt::is_float16<H>>>
inline H __hmul(H a, H b) { return H(float(a) * float(b)); }
template <class H, class = std::enable_if_t<simt::is_float16<H>>>
inline H __hdiv(H a, H b) { return H(float(a) / float(b)); }

inline __half __float2half_rn(float f) { return __half(f); }
inline __half __float2half(float f) { return __half(f); }
inline float __half2float(__half h) { return static_cast<float>(h); }
inline __half __ushort_as_half(unsigned short u) { return simt::from_bits<__half>(u); }
inline unsigned short __half_as_ushort(__half h) { return h.x; }

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return static_cast<float>(h); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return simt::from_bits<__nv_bfloat16>(u); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
namespace simt {
// double -> half with a single rounding: go through float rounding to odd (truncate, then
// set the last bit if anything was lost), which float's 13 spare bits make exact for the
// final round-to-nearest-even to half.
inline __half f64_to_half(double d) {
    float f = static_cast<float>(d);
    if (static_cast<double>(f) != d && f == f && std::isfinite(f)) {
        if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
        std::uint32_t bits;
        std::memcpy(&bits, &f, 4);
        bits |= 1u;
        std::memcpy(&f, &bits, 4);
    }
    return __half(f);
}
}  // namespace simt
// Fused: a*b is exact in double and fma rounds the sum once; the conversion to half rounds
// once more, exactly (see f64_to_half), so the result is the correctly rounded a*b+c.
inline __half __hfma(__half a, __half b, __half c) {
    return simt::f64_to_half(std::fma(double(float(a)), double(float(b)), double(float(c))));
}
inline __half __hneg(__half a) { return __ushort_as_half(a.x ^ 0x8000u); }
inline __half __habs(__half a) { return __ushort_as_half(a.x & 0x7fffu); }
inline bool __hisnan(__half a) { return (a.x & 0x7fffu) > 0x7c00u; }
inline int __hisinf(__half a) { return (a.x & 0x7fffu) == 0x7c00u ? ((a.x & 0x8000u) ? -1 : 1) : 0; }
inline __half __hmax(__half a, __half b) { return float(a) < float(b) ? b : a; }
inline __half __hmin(__half a, __half b) { return float(b) < float(a) ? b : a; }
inline __half operator+(__half a, __half b) { return __hadd(a, b); }
inline __half operator-(__half a, __half b) { return __hsub(a, b); }
inline __half operator*(__half a, __half b) { return __hmul(a, b); }
inline __half operator/(__half a, __half b) { return __hdiv(a, b); }
inline __half operator-(__half a) { return __hneg(a); }
inline bool operator==(__half a, __half b) { return float(a) == float(b); }
inline bool operator!=(__half a, __half b) { return float(a) != float(b); }
inline bool operator<(__half a, __half b) { return float(a) < float(b); }
inline bool operator>(__half a, __half b) { return float(a) > float(b); }
inline bool operator<=(__half a, __half b) { return float(a) <= float(b); }
inline bool operator>=(__half a, __half b) { return float(a) >= float(b); }

inline __half2 __halves2half2(__half a, __half b) { return {a, b}; }
inline __half2 __floats2half2_rn(float a, float b) { return {__half(a), __half(b)}; }
inline __half2 __float2half2_rn(float a) { return {__half(a), __half(a)}; }
inline __half2 __float22half2_rn(float2 f) { return {__half(f.x), __half(f.y)}; }
inline float2 __half22float2(__half2 h) { return {float(h.x), float(h.y)}; }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline float __low2float(__half2 h) { return float(h.x); }
inline float __high2float(__half2 h) { return float(h.y); }
inline __half2 __hadd2(__half2 a, __half2 b) { return {__hadd(a.x, b.x), __hadd(a.y, b.y)}; }
inline __half2 __hmul2(__half2 a, __half2 b) { return {__hmul(a.x, b.x), __hmul(a.y, b.y)}; }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) { return {__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)}; }

// ---- nvcuda::wmma, 16x16x16 with __half or __nv_bfloat16 inputs and float or 16-bit
// accumulators.
// The element-to-lane mapping is unspecified in CUDA; here lane l holds the 8 elements
// e = 8l..8l+7 of the fragment's logical 16x16 matrix in row-major order (row e/16,
// column e%16). Each lane loads and stores its own elements, after a rendezvous of the
// whole warp that checks the operation's preconditions; mma_sync is a rendezvous too.
namespace nvcuda {
namespace wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the SIMT emulator models the 16x16x16 shape");
    static constexpr int num_elements = 8;
    T x[8];
};

namespace detail {
inline int lane() { return static_cast<int>((threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y) & 31u); }
template <class Layout>
constexpr bool is_row() { return std::is_same_v<Layout, row_major>; }
struct MmaPayload {
    void* d;
    const void* a;
    const void* b;
    const void* c;
};
template <class TI, class TC, class TD>
const char* complete_mma(void* const* payloads, unsigned mask) {
    if (mask != 0xffffffffu) return "wmma::mma_sync needs all 32 lanes of the warp";
    float A[16][16], B[16][16], C[16][16];
    for (int l = 0; l < 32; ++l) {
        auto* p = static_cast<MmaPayload*>(payloads[l]);
        for (int i = 0; i < 8; ++i) {
            int e = l * 8 + i;
            A[e / 16][e % 16] = float(static_cast<const TI*>(p->a)[i]);
            B[e / 16][e % 16] = float(static_cast<const TI*>(p->b)[i]);
            C[e / 16][e % 16] = float(static_cast<const TC*>(p->c)[i]);
        }
    }
    for (int l = 0; l < 32; ++l) {
        auto* p = static_cast<MmaPayload*>(payloads[l]);
        for (int i = 0; i < 8; ++i) {
            int e = l * 8 + i, m = e / 16, n = e % 16;
            float acc = C[m][n];
            for (int k = 0; k < 16; ++k) acc += A[m][k] * B[k][n];  // 11- or 8-bit products: exact in float
            static_cast<TD*>(p->d)[i] = TD(acc);
        }
    }
    return nullptr;
}
}  // namespace detail

template <class Use, int M, int N, int K, class T, class L, class V>
inline void fill_fragment(fragment<Use, M, N, K, T, L>& f, const V& v) {
    for (int i = 0; i < 8; ++i) f.x[i] = T(v);
}

namespace detail {
// load_matrix_sync and store_matrix_sync move a tile with the whole warp, and CUDA states
// their preconditions: every lane passes the same pointer, ldm and layout; the pointer is
// 256-bit (32-byte) aligned; ldm is a multiple of 16 bytes (8 halves, 4 floats). A GPU may
// fault or move the wrong elements when one is broken, and a 2-byte-aligned __shared__
// tile is often 32-byte aligned by luck, so the emulator checks them on every call, in a
// rendezvous of the warp (which is also how it sees all lanes' arguments).
struct TilePayload {
    const void* p;
    unsigned ldm;
    int layout;  // 0 row major, 1 column major
};
template <class T>
const char* complete_tile(void* const* payloads, unsigned mask) {
    // The message outlives this call until the runtime has copied it (on this thread).
    thread_local char message[192];
    if (mask != 0xffffffffu) return "needs all 32 lanes of the warp";
    const auto* first = static_cast<const TilePayload*>(payloads[0]);
    for (int l = 1; l < 32; ++l) {
        const auto* me = static_cast<const TilePayload*>(payloads[l]);
        if (me->p != first->p || me->ldm != first->ldm || me->layout != first->layout) {
            std::snprintf(message, sizeof message,
                          "lanes disagree: lane 0 passes (%p, ldm %u) and lane %d (%p, ldm %u); every lane must "
                          "pass the same pointer, ldm and layout",
                          first->p, first->ldm, l, me->p, me->ldm);
            return message;
        }
    }
    if (reinterpret_cast<std::uintptr_t>(first->p) % 32 != 0) {
        std::snprintf(message, sizeof message,
                      "pointer %p is not 256-bit (32-byte) aligned (declare shared-memory tiles __align__(32))", first->p);
        return message;
    }
    constexpr unsigned multiple = 16 / sizeof(T);
    if (first->ldm % multiple != 0) {
        std::snprintf(message, sizeof message, "ldm %u is not a multiple of %u (16 bytes of %s)", first->ldm, multiple,
                      sizeof(T) == 2 ? "16-bit elements" : "float");
        return message;
    }
    return nullptr;
}
// The call site comes from the caller's default arguments, so an error names the kernel's
// line rather than this header's.
template <class T>
inline void check_tile(const T* p, unsigned ldm, int layout, const char* op, const char* file, int line) {
    TilePayload payload{p, ldm, layout};
    ::simt::warp_sync(0xffffffffu, &payload, complete_tile<T>, op, file, line);
}
// Every load_matrix_sync: the emulator's fragment layout gives lane l elements 8l .. 8l+7 of
// the 16x16 tile in row-major order, whichever way the tile lies in memory.
template <class T>
inline void load_tile(T* x, const T* p, unsigned ldm, bool row_major, const char* file, int line) {
    check_tile(p, ldm, row_major ? 0 : 1, "wmma::load_matrix_sync", file, line);
    for (int i = 0; i < 8; ++i) {
        int e = lane() * 8 + i, r = e / 16, c = e % 16;
        x[i] = row_major ? p[r * ldm + c] : p[c * ldm + r];
    }
}
}  // namespace detail

template <class TI, class Layout, class = std::enable_if_t<simt::is_float16<TI>>>
inline void load_matrix_sync(fragment<matrix_a, 16, 16, 16, TI, Layout>& f, const TI* p, unsigned ldm,
                             const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    detail::load_tile(f.x, p, ldm, detail::is_row<Layout>(), file, line);  // A is M x K
}
template <class TI, class Layout, class = std::enable_if_t<simt::is_float16<TI>>>
inline void load_matrix_sync(fragment<matrix_b, 16, 16, 16, TI, Layout>& f, const TI* p, unsigned ldm,
                             const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    detail::load_tile(f.x, p, ldm, detail::is_row<Layout>(), file, line);  // B is K x N
}
template <class T>
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, T>& f, const T* p, unsigned ldm, layout_t layout,
                             const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    detail::load_tile(f.x, p, ldm, layout == mem_row_major, file, line);
}
template <class T>
inline void store_matrix_sync(T* p, const fragment<accumulator, 16, 16, 16, T>& f, unsigned ldm, layout_t layout,
                              const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    detail::check_tile<T>(p, ldm, layout == mem_row_major ? 0 : 1, "wmma::store_matrix_sync", file, line);
    for (int i = 0; i < 8; ++i) {
        int e = detail::lane() * 8 + i, r = e / 16, c = e % 16;
        (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[i];
    }
}
// A and B hold the same 16-bit type (__half, or __nv_bfloat16 with float accumulators
// only, as CUDA allows).
template <class TI, class LA, class LB, class TC, class TD>
inline void mma_sync(fragment<accumulator, 16, 16, 16, TD>& d, const fragment<matrix_a, 16, 16, 16, TI, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, TI, LB>& b,
                     const fragment<accumulator, 16, 16, 16, TC>& c) {
    static_assert(simt::is_float16<TI>, "wmma inputs are __half or __nv_bfloat16");
    static_assert(std::is_same_v<TI, __half> || (std::is_same_v<TC, float> && std::is_same_v<TD, float>),
                  "bf16 wmma accumulates in float only");
    detail::MmaPayload p{d.x, a.x, b.x, c.x};
    // d may alias c: the completion reads every C before writing any D.
    ::simt::warp_sync(0xffffffffu, &p, detail::complete_mma<TI, TC, TD>, "wmma::mma_sync", __FILE__, __LINE__);
}
}  // namespace wmma
}  // namespace nvcuda

#if defined(SIMT_MODULE)
// ---- entry points of a separately compiled module, generated per kernel by
// nanoddp::backend::simt_module: CUDA's kernelParams convention (one pointer per argument)
// unpacked by the kernel's own parameter types, and those types as a signature string
// ("const f32*,f32*,i32") that the Rust side checks every launch against.
#include <string>
#include <utility>
namespace simt {
template <class T>
constexpr const char* scalar_code() {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_same_v<U, float>) return "f32";
    else if constexpr (std::is_same_v<U, double>) return "f64";
    else if constexpr (std::is_same_v<U, __half>) return "f16";
    else if constexpr (std::is_same_v<U, __nv_bfloat16>) return "bf16";
    else if constexpr (std::is_same_v<U, int>) return "i32";
    else if constexpr (std::is_same_v<U, unsigned int>) return "u32";
    else if constexpr (std::is_same_v<U, long long> || std::is_same_v<U, long>) return "i64";
    else if constexpr (std::is_same_v<U, unsigned long long> || std::is_same_v<U, unsigned long>) return "u64";
    else if constexpr (std::is_same_v<U, unsigned char>) return "u8";
    else static_assert(sizeof(T) == 0, "kernel parameters must be float, double, __half, __nv_bfloat16, int, unsigned, (unsigned) long long, unsigned char, or pointers to them");
}
template <class T>
std::string param_code() {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_pointer_v<U>) {
        using P = std::remove_pointer_t<U>;
        return std::string(std::is_const_v<P> ? "const " : "") + scalar_code<P>() + "*";
    } else {
        return scalar_code<U>();
    }
}
template <class... A>
std::string signature(void (*)(A...)) {
    std::string s;
    ((s += (s.empty() ? "" : ","), s += param_code<A>()), ...);
    return s;
}
template <class... A, std::size_t... I>
void invoke_unpacked(void (*kernel)(A...), void* const* params, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<A>*>(params[I])...);
}
template <class... A>
void invoke(void (*kernel)(A...), void* const* params) {
    invoke_unpacked(kernel, params, std::index_sequence_for<A...>{});
}
}  // namespace simt
#endif  // SIMT_MODULE

#endif  // host side

// Grid-stride loop over [0, n): every kernel that walks a flat buffer uses this shape so
// that any grid size is correct, including a grid smaller than the data.
#define SIMT_GRID_STRIDE_LOOP(i, n)                                                         \
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;  \
         i < (n); i += (unsigned long long)blockDim.x * gridDim.x)

// ============================================================================ both sides
// A kernel's entry points, one per storage type, from its one template:
//
//   NANODDP_ENTRY_EACH_TYPE(avg_pool_forward, (256), (const T* __restrict__ x, T* __restrict__ y, int n), (x, y, n))
//
// defines `extern "C" __global__ void __launch_bounds__(256) avg_pool_forward_f32(const
// float* x, float* y, int n)` calling `avg_pool_forward<float>(x, y, n)`, and
// `avg_pool_forward_f16` and `_bf16` with `__half` and `__nv_bfloat16`: the storage types of
// nanoddp's DType (src/dtype.rs), in its order. The second argument is the launch bounds'
// arguments (every nanoddp kernel launches 256 threads). The parameters name the storage type `T`.
// Each entry lives in a namespace of its own where `T` is that type (extern "C" keeps its
// symbol the bare name) and is brought out by a using-declaration. nanoddp's declaration
// parser (src/kernels/declarations.rs) reads an invocation as the three declarations, so the
// launchers know each.
#define NANODDP_ENTRY_(type, suffix, name, bounds, params, args) namespace nanoddp_entry_##name##_##suffix { using T = type; extern "C" __global__ void __launch_bounds__ bounds name##_##suffix params { name<T> args; } } using nanoddp_entry_##name##_##suffix::name##_##suffix;
#define NANODDP_ENTRY_EACH_TYPE(name, bounds, params, args) NANODDP_ENTRY_(float, f32, name, bounds, params, args) NANODDP_ENTRY_(__half, f16, name, bounds, params, args) NANODDP_ENTRY_(__nv_bfloat16, bf16, name, bounds, params, args)
