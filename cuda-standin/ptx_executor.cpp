// ptx_executor.cpp — the stand-in's second executor: it runs the PTX that nvcc or NVRTC
// emitted (what a GPU's driver would compile), instruction by instruction, with the SIMT
// emulator's checks. Chosen with NANODDP_STANDIN_EXEC=ptx (executor.h).
//
// Where the PTX comes from: PTX text handed to cuModuleLoadData (NVRTC's output, or any
// cudarc program's), or the PTX entries of an nvcc fatbin (nanoddp builds them uncompressed:
// build/nvcc.rs). From a fatbin it takes the newest PTX the stand-in's sm_90 could JIT.
//
// How threads run: a block's threads are interpreter states (a pc and a register file) run
// one after the other, each until it reaches a barrier, a warp-collective instruction (shfl,
// vote, bar.warp.sync, wmma) or its end — independent thread scheduling, as on sm_70+. A
// collective completes when every lane its mask names has arrived, with the same mask (and,
// for .aligned wmma, at the same instruction); a barrier when every thread of the block waits
// at the same one. What the SIMT emulator rejects is rejected here, in the same words where
// possible: divergent barriers, barriers after a thread exited, masks that disagree or name
// exited lanes, shuffles from lanes outside the mask (poison), wmma preconditions.
//
// Memory: every global access is checked against the allocations the kernel's GPU may touch
// now (the driver model's access rights, peer access and cross-stream restrictions included:
// standin::device_view), byte-exact, so a read one element past the end fails even inside the
// allocation's last page. Shared and local memory live in the executor, addressed through
// windows of the generic space that no device allocation can occupy.
//
// Blocks run side by side on worker threads (one per CPU, as the SIMT emulator's), each
// taking the next block in launch order; a block's threads stay on one worker. When blocks
// fail, the launch reports the failure of the first in launch order, as a serial run would:
// blocks are taken in order, so every block before it ran to its end. Atomics on global memory
// are made indivisible across workers by a lock per address stripe.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include "executor.h"
#include "ptx_ir.h"
#include "ptx_numeric.h"
#include "registry.h"

namespace standin {
namespace {

using namespace ptx;

constexpr std::uint64_t SHARED_WINDOW = 0x300000000000ull;  // generic addresses of shared memory
constexpr std::uint64_t LOCAL_WINDOW = 0x310000000000ull;   // generic addresses of local memory
constexpr std::uint64_t WINDOW_SIZE = 1ull << 32;
constexpr unsigned STANDIN_ARCH = 90;  // the stand-in's GPUs are sm_90

// ------------------------------------------------------------------------- PTX from images
struct PtxSource {
    std::string text;
    unsigned arch = 0;
};

// PTX texts in `image`: the image itself when it is PTX, or a fatbin's PTX entries. A
// compressed entry cannot be read (nvcc compresses unless told --no-compress) and is
// reported in `why`.
std::vector<PtxSource> ptx_of(const unsigned char* image, std::size_t size, std::string& why) {
    std::vector<PtxSource> out;
    std::uint32_t magic = 0;
    if (size >= 4) std::memcpy(&magic, image, 4);
    if (magic != 0xBA55ED50u) {
        if (size >= 4 && std::memcmp(image, "\x7f" "ELF", 4) == 0) {
            why = "the image is a cubin (machine code); the PTX executor runs PTX only";
            return out;
        }
        const char* text = reinterpret_cast<const char*>(image);
        out.push_back({std::string(text, strnlen(text, size)), 0});  // PTX ends at its NUL
        return out;
    }
    std::uint16_t header = 0;
    std::uint64_t body = 0;
    std::memcpy(&header, image + 6, 2);
    std::memcpy(&body, image + 8, 8);
    std::size_t at = header, end = std::min<std::size_t>(size, header + body);
    while (at + 64 <= end) {
        std::uint16_t kind;
        std::uint32_t entry_header;
        std::uint64_t payload;
        std::uint32_t arch;
        std::uint64_t flags, uncompressed;
        std::memcpy(&kind, image + at, 2);
        std::memcpy(&entry_header, image + at + 4, 4);
        std::memcpy(&payload, image + at + 8, 8);
        std::memcpy(&arch, image + at + 28, 4);
        std::memcpy(&flags, image + at + 40, 8);
        std::memcpy(&uncompressed, image + at + 56, 8);
        if (entry_header < 64 || at + entry_header + payload > end) break;
        if (kind == 1) {
            if ((flags & 0x2000) || (uncompressed != 0 && uncompressed != payload)) {
                why = "the fatbin's PTX (compute_" + std::to_string(arch) +
                      ") is compressed; build it with nvcc --no-compress";
            } else {
                const char* p = reinterpret_cast<const char*>(image + at + entry_header);
                std::size_t n = strnlen(p, payload);
                out.push_back({std::string(p, n), arch});
            }
        }
        at += entry_header + payload;
    }
    if (out.empty() && why.empty()) why = "the fatbin holds no PTX";
    return out;
}

// ------------------------------------------------------------------------- launch state
struct LaunchError {
    CUresult code;
    std::string message;
};

enum class State : std::uint8_t { Running, AtBarrier, AtWarp, Exited };

struct Thread {
    std::uint32_t pc = 0;
    State state = State::Running;
    unsigned linear = 0;
    unsigned tid[3] = {};
    std::uint64_t* r = nullptr;  // register slots
    std::uint8_t* local = nullptr;
    std::uint64_t clock = 0;
    unsigned warp_mask = 0;  // the mask this thread waits with (AtWarp)
};

class BlockRun;

// Everything of one launch that all blocks share.
struct LaunchCtx {
    const Kernel* k;
    LaunchShape shape;
    std::vector<std::uint8_t> params;
    std::vector<DeviceRange> view;
    std::chrono::steady_clock::time_point deadline;
    bool has_deadline = false;
    std::atomic<std::uint64_t> instructions{0};
    std::uint64_t shared_bytes = 0;
    // With LaunchShape::profile: the blocks' counts, added as each block ends.
    std::mutex profile_lock;
    LaunchProfile profile;
    std::unordered_set<std::uint64_t> read_sectors, write_sectors;
};

// The lock that makes an atomic on global memory at `p` indivisible across the workers
// running a launch's blocks (shared and local memory belong to one block, one worker).
std::mutex& atomic_lock(const void* p) {
    static std::mutex stripes[64];
    return stripes[(reinterpret_cast<std::uintptr_t>(p) >> 3) % 64];
}

class BlockRun {
public:
    BlockRun(LaunchCtx& L, unsigned bx, unsigned by, unsigned bz) : L_(L), k_(*L.k) {
        block_[0] = bx;
        block_[1] = by;
        block_[2] = bz;
        const unsigned* b = L.shape.block;
        n_ = b[0] * b[1] * b[2];
        regs_.assign(static_cast<std::size_t>(n_) * k_.slots, 0);
        local_.assign(static_cast<std::size_t>(n_) * k_.local_bytes, 0);
        shared_.assign(L.shared_bytes, 0xff);  // uninitialised shared memory reads as NaN / -1
        threads_.resize(n_);
        warps_ = (n_ + 31) / 32;
        for (unsigned i = 0; i < n_; ++i) {
            Thread& t = threads_[i];
            t.linear = i;
            t.tid[0] = i % b[0];
            t.tid[1] = (i / b[0]) % b[1];
            t.tid[2] = i / (b[0] * b[1]);
            t.r = &regs_[static_cast<std::size_t>(i) * k_.slots];
            t.local = k_.local_bytes ? &local_[static_cast<std::size_t>(i) * k_.local_bytes] : nullptr;
            fill_specials(t);
        }
    }

    void run() {
        if (L_.shape.profile) return run_profiled();
        for (;;) {
            bool ran = false;
            for (unsigned i = 0; i < n_; ++i) {
                Thread& t = threads_[L_.shape.reverse_lanes ? n_ - 1 - i : i];
                if (t.state != State::Running) continue;
                ran = true;
                step<false>(t);
            }
            if (resolve_warps()) continue;
            if (ran) continue;
            if (resolve_barrier()) continue;
            unsigned exited = 0;
            for (Thread& t : threads_) exited += t.state == State::Exited;
            if (exited == n_) {
                for (const Thread& th : threads_) L_.instructions += th.clock;
                return;
            }
            deadlock();
        }
    }

private:
    LaunchCtx& L_;
    const Kernel& k_;
    unsigned block_[3];
    unsigned n_ = 0, warps_ = 0;
    std::vector<std::uint64_t> regs_;
    std::vector<std::uint8_t> local_;
    std::vector<std::uint8_t> shared_;
    std::vector<Thread> threads_;
    unsigned exited_count_ = 0;
    unsigned at_barrier_ = 0;  // threads in State::AtBarrier
    const Thread* first_exited_ = nullptr;
    // A cache of the global range last hit.
    const DeviceRange* last_range_ = nullptr;

    // ---------------------------------------------------------------- errors
    [[noreturn]] void fail(const Thread& t, CUresult code, const std::string& what) {
        char where[160];
        std::snprintf(where, sizeof where, "block (%u,%u,%u), thread (%u,%u,%u) at PTX line %u `", block_[0], block_[1],
                      block_[2], t.tid[0], t.tid[1], t.tid[2], k_.code[t.pc].line);
        throw LaunchError{code, std::string(where) + k_.text[t.pc] + "`: " + what};
    }
    [[noreturn]] void fail_block(CUresult code, const std::string& what) {
        char where[96];
        std::snprintf(where, sizeof where, "block (%u,%u,%u): ", block_[0], block_[1], block_[2]);
        throw LaunchError{code, where + what};
    }

    void fill_specials(Thread& t) {
        const unsigned* b = L_.shape.block;
        const unsigned* gr = L_.shape.grid;
        std::uint64_t* r = t.r;
        auto set = [&](Special s, std::uint64_t v) { r[static_cast<int>(s)] = v; };
        set(Special::TidX, t.tid[0]);
        set(Special::TidY, t.tid[1]);
        set(Special::TidZ, t.tid[2]);
        set(Special::NtidX, b[0]);
        set(Special::NtidY, b[1]);
        set(Special::NtidZ, b[2]);
        set(Special::CtaidX, block_[0]);
        set(Special::CtaidY, block_[1]);
        set(Special::CtaidZ, block_[2]);
        set(Special::NctaidX, gr[0]);
        set(Special::NctaidY, gr[1]);
        set(Special::NctaidZ, gr[2]);
        unsigned lane = t.linear & 31u;
        set(Special::LaneId, lane);
        set(Special::WarpId, t.linear / 32);
        set(Special::NWarpId, 64);
        set(Special::SmId, (block_[0] + block_[1] * gr[0]) % 132);
        set(Special::NSmId, 132);
        set(Special::GridId, 1);
        set(Special::LanemaskEq, 1u << lane);
        set(Special::LanemaskLt, (1u << lane) - 1);
        set(Special::LanemaskLe, lane == 31 ? 0xffffffffu : (2u << lane) - 1);
        set(Special::LanemaskGt, ~((lane == 31 ? 0xffffffffu : (2u << lane) - 1)) & 0xffffffffu);
        set(Special::LanemaskGe, ~((1u << lane) - 1) & 0xffffffffu);
        set(Special::DynamicSmemSize, L_.shape.shared_bytes);
        set(Special::TotalSmemSize, L_.shared_bytes);
        for (const auto& [slot, value] : k_.constants) r[slot] = value;
    }

    // ---------------------------------------------------------------- operands
    std::uint64_t symbol_address(const Symbol& s) const {
        if (s.space == Space::Shared && s.dynamic) return (k_.static_shared + k_.dynamic_align - 1) / k_.dynamic_align * k_.dynamic_align;
        return s.offset;
    }

    [[gnu::always_inline]] std::uint64_t value(const Thread& t, const Operand& o, Ty ty) const {
        switch (o.kind) {
            case OperandKind::Reg: {
                std::uint64_t v = t.r[o.reg];
                if (o.reg == static_cast<int>(Special::Clock) || o.reg == static_cast<int>(Special::Clock64)) v = t.clock;
                if (o.reg == static_cast<int>(Special::GlobalTimer))
                    v = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
                return o.negate ? !v : v;
            }
            case OperandKind::Imm:
                if (o.imm_is_double) {
                    double d = f64_of(o.imm);
                    if (ty == Ty::F32) return bits_of_f32(static_cast<float>(d));
                    if (ty == Ty::F64) return o.imm;
                    if (ty == Ty::F16) return to_f16(d);
                    if (ty == Ty::BF16) return to_bf16(d);
                    return static_cast<std::uint64_t>(static_cast<std::int64_t>(d));
                }
                return o.imm;
            case OperandKind::Addr: {
                const Symbol& s = k_.symbols[o.addr.symbol];
                return symbol_address(s) + o.addr.offset;
            }
            default:
                return 0;
        }
    }

    // ---------------------------------------------------------------- memory
    std::uint8_t* resolve(Thread& t, Space sp, std::uint64_t addr, unsigned bytes, bool write) {
        if (bytes > 1 && addr % bytes != 0) {
            char m[128];
            std::snprintf(m, sizeof m, "misaligned %u-byte %s at 0x%llx", bytes, write ? "write" : "read",
                          static_cast<unsigned long long>(addr));
            fail(t, CUDA_ERROR_ILLEGAL_ADDRESS, m);
        }
        if (sp == Space::Generic) {
            if (addr >= SHARED_WINDOW && addr < SHARED_WINDOW + WINDOW_SIZE) { sp = Space::Shared; addr -= SHARED_WINDOW; }
            else if (addr >= LOCAL_WINDOW && addr < LOCAL_WINDOW + WINDOW_SIZE) { sp = Space::Local; addr -= LOCAL_WINDOW; }
            else sp = Space::Global;
        }
        switch (sp) {
            case Space::Shared:
                if (addr + bytes > shared_.size() || addr + bytes < addr) {
                    char m[160];
                    std::snprintf(m, sizeof m, "%s shared memory at offset %llu, past the block's %zu bytes",
                                  write ? "writes" : "reads", static_cast<unsigned long long>(addr), shared_.size());
                    fail(t, CUDA_ERROR_ILLEGAL_ADDRESS, m);
                }
                return shared_.data() + addr;
            case Space::Local:
                if (addr + bytes > k_.local_bytes || addr + bytes < addr)
                    fail(t, CUDA_ERROR_ILLEGAL_ADDRESS, "local memory access past the thread's frame");
                return t.local + addr;
            case Space::Param:
                if (write) fail(t, CUDA_ERROR_ILLEGAL_ADDRESS, "a kernel's parameters are read-only");
                if (addr + bytes > L_.params.size()) fail(t, CUDA_ERROR_ILLEGAL_ADDRESS, "parameter read past the last parameter");
                return L_.params.data() + addr;
            default:
                break;
        }
        const DeviceRange* hit = nullptr;
        if (last_range_ && addr >= last_range_->lo && addr + bytes <= last_range_->hi) {
            hit = last_range_;
        } else {
            auto it = std::upper_bound(L_.view.begin(), L_.view.end(), addr,
                                       [](std::uint64_t a, const DeviceRange& r) { return a < r.lo; });
            if (it != L_.view.begin()) {
                --it;
                if (addr >= it->lo && addr + bytes <= it->hi) hit = &*it;
            }
        }
        if (!hit || (write ? hit->prot != 3 : hit->prot == 0)) {
            char m[600];
            if (!explain_fault(static_cast<std::uintptr_t>(addr), write, m, sizeof m)) {
                if (hit) std::snprintf(m, sizeof m, "%s 0x%llx, which this GPU may not %s", write ? "writes" : "reads",
                                       static_cast<unsigned long long>(addr), write ? "write" : "read");
                else std::snprintf(m, sizeof m, "%s %u bytes at 0x%llx, which is not in any live allocation of any GPU",
                                   write ? "writes" : "reads", bytes, static_cast<unsigned long long>(addr));
            }
            fail(t, CUDA_ERROR_ILLEGAL_ADDRESS, m);
        }
        last_range_ = hit;
        return reinterpret_cast<std::uint8_t*>(static_cast<std::uintptr_t>(addr));
    }

    std::uint64_t effective(const Thread& t, const Operand& o) const {
        std::uint64_t a = static_cast<std::uint64_t>(o.addr.offset);
        if (o.addr.reg >= 0) a += t.r[o.addr.reg];
        if (o.addr.symbol >= 0) a += symbol_address(k_.symbols[o.addr.symbol]);
        return a;
    }

    Space space_of(const Operand& o, Space declared) const {
        if (declared != Space::Generic) return declared;
        if (o.addr.symbol >= 0 && o.addr.reg < 0) return k_.symbols[o.addr.symbol].space;
        return declared;
    }

    static std::uint64_t load_bits(const std::uint8_t* p, unsigned bytes) {
        std::uint64_t v = 0;
        std::memcpy(&v, p, bytes);
        return v;
    }

    // ---------------------------------------------------------------- the profile
    LaunchProfile prof_;
    std::unordered_set<std::uint64_t> read_sectors_, write_sectors_;
    void run_profiled();
    void account(const Instr& in, Thread* const* lanes, unsigned n);
    void account_flops(const Instr& in, unsigned lanes);
    void account_memory(const Instr& in, Thread* const* lanes, const unsigned* on, unsigned m);
    void account_wmma(const Instr& in, Thread* const* lanes);
    void account_access(Space sp, bool read, bool write, const std::uint64_t* addr, const unsigned* phase, unsigned count,
                        unsigned bytes);

    // ---------------------------------------------------------------- the interpreter
    // Runs `t` until it waits (a barrier, a warp collective) or exits; with `Single`, one
    // instruction only (the profile's warp-by-warp issue).
    template <bool Single>
    void step(Thread& t);
    bool resolve_warps();
    bool resolve_barrier();
    [[noreturn]] void deadlock();
    void exec_warp(unsigned w, unsigned mask);
    struct WmmaMatrix {
        std::uint64_t p, ldm;  // address and leading dimension (elements)
        Space sp;
        unsigned eb;  // bytes per element
    };
    WmmaMatrix wmma_matrix(std::vector<Thread*>& lanes, const Instr& in, const Operand& at);
    void wmma_load(std::vector<Thread*>& lanes, const Instr& in);
    void wmma_store(std::vector<Thread*>& lanes, const Instr& in);
    void wmma_mma(std::vector<Thread*>& lanes, const Instr& in);
    void exit_thread(Thread& t);
};

// Sign-extends the low `bits` of v.
inline std::int64_t sext(std::uint64_t v, unsigned bits) {
    if (bits >= 64) return static_cast<std::int64_t>(v);
    std::uint64_t m = 1ull << (bits - 1);
    v &= (1ull << bits) - 1;
    return static_cast<std::int64_t>((v ^ m) - m);
}
inline std::uint64_t zext(std::uint64_t v, unsigned bits) { return bits >= 64 ? v : v & ((1ull << bits) - 1); }

template <class T>
[[gnu::always_inline]] inline bool compare_ordered(Cmp c, T x, T y) {
    switch (c) {
        case Cmp::Eq: return x == y;
        case Cmp::Ne: return x != y;
        case Cmp::Lt: case Cmp::Lo: return x < y;
        case Cmp::Le: case Cmp::Ls: return x <= y;
        case Cmp::Gt: case Cmp::Hi: return x > y;
        case Cmp::Ge: case Cmp::Hs: return x >= y;
        default: return false;
    }
}

// setp on integers of type t: signed types compare as signed whatever the spelling
// (lo/hi are the unsigned spellings of lt/gt).
[[gnu::always_inline]] inline bool compare_int(Cmp c, std::uint64_t a, std::uint64_t b, Ty t) {
    unsigned bits = bits_of(t);
    if (is_signed(t)) return compare_ordered(c, sext(a, bits), sext(b, bits));
    return compare_ordered(c, zext(a, bits), zext(b, bits));
}

bool compare_float(Cmp c, double x, double y) {
    bool unordered = std::isnan(x) || std::isnan(y);
    switch (c) {
        case Cmp::Eq: return !unordered && x == y;
        case Cmp::Ne: return !unordered && x != y;
        case Cmp::Lt: return !unordered && x < y;
        case Cmp::Le: return !unordered && x <= y;
        case Cmp::Gt: return !unordered && x > y;
        case Cmp::Ge: return !unordered && x >= y;
        case Cmp::Equ: return unordered || x == y;
        case Cmp::Neu: return unordered || x != y;
        case Cmp::Ltu: return unordered || x < y;
        case Cmp::Leu: return unordered || x <= y;
        case Cmp::Gtu: return unordered || x > y;
        case Cmp::Geu: return unordered || x >= y;
        case Cmp::Num: return !unordered;
        case Cmp::Nan: return unordered;
        default: return false;
    }
}

// A 16-bit float lane (f16 or bf16) to double and back, rounded to nearest even.
inline double half_value(std::uint64_t bits, bool bf) {
    return bf ? bf16_to_double(static_cast<std::uint16_t>(bits)) : f16_to_double(static_cast<std::uint16_t>(bits));
}
inline std::uint64_t half_bits(double v, bool bf, Round r = Round::Rn, double tail = 0) {
    return bf ? to_bf16(v, r, tail) : to_f16(v, r, tail);
}

// Arithmetic on f16 / bf16 (one lane or the two of an x2 register), exactly rounded: the
// operation is exact in double (sums and products of 16-bit floats), then rounded once; a
// fused multiply-add keeps the sum's rounding error as a tail.
std::uint64_t half_arith(const Instr& in, std::uint64_t a, std::uint64_t b, std::uint64_t c) {
    bool bf = in.type == Ty::BF16 || in.type == Ty::BF16x2;
    int lanes = in.type == Ty::F16x2 || in.type == Ty::BF16x2 ? 2 : 1;
    std::uint64_t out = 0;
    for (int l = 0; l < lanes; ++l) {
        double x = half_value(a >> (16 * l) & 0xffff, bf), y = half_value(b >> (16 * l) & 0xffff, bf);
        double z = half_value(c >> (16 * l) & 0xffff, bf);
        double s = 0, e = 0;
        std::uint64_t r;
        switch (in.op) {
            case Op::Add: two_sum(x, y, s, e); r = half_bits(s, bf, in.round, e); break;
            case Op::Sub: two_sum(x, -y, s, e); r = half_bits(s, bf, in.round, e); break;
            case Op::Mul: r = half_bits(x * y, bf, in.round); break;
            case Op::Fma: case Op::Mad: two_sum(x * y, z, s, e); r = half_bits(s, bf, in.round, e); break;
            case Op::Neg: r = (a >> (16 * l) & 0xffff) ^ 0x8000; break;
            case Op::Abs: r = (a >> (16 * l) & 0xffff) & 0x7fff; break;
            case Op::Min: case Op::Max: {
                if (std::isnan(x)) r = b >> (16 * l) & 0xffff;
                else if (std::isnan(y)) r = a >> (16 * l) & 0xffff;
                else r = ((in.op == Op::Min) == (x < y || (x == y && std::signbit(x)))) ? a >> (16 * l) & 0xffff : b >> (16 * l) & 0xffff;
                break;
            }
            default: r = 0; break;
        }
        if (in.sat && in.op != Op::Neg && in.op != Op::Abs) {
            double v = half_value(r, bf);
            if (std::isnan(v) || v < 0) r = 0;
            else if (v > 1) r = half_bits(1.0, bf);
        }
        out |= (r & 0xffff) << (16 * l);
    }
    return out;
}

float f32_in(std::uint64_t bits, bool ftz) {
    float f = f32_of(bits);
    return ftz ? flush(f) : f;
}
std::uint64_t f32_out(float f, bool ftz, bool sat) {
    if (sat) f = std::isnan(f) ? 0.0f : std::min(1.0f, std::max(0.0f, f));
    if (ftz) f = flush(f);
    return bits_of_f32(f);
}

// Float to integer as cvt does: rounded as asked, NaN to 0, saturated to the type's range.
std::uint64_t float_to_int(double v, Round r, Ty t) {
    if (std::isnan(v)) return 0;
    switch (r) {
        case Round::Rni: v = std::nearbyint(v); break;  // the default FP environment rounds to nearest even
        case Round::Rmi: v = std::floor(v); break;
        case Round::Rpi: v = std::ceil(v); break;
        default: v = std::trunc(v); break;
    }
    unsigned bits = bits_of(t);
    if (is_signed(t)) {
        double lo = -std::ldexp(1.0, static_cast<int>(bits) - 1), hi = std::ldexp(1.0, static_cast<int>(bits) - 1);
        if (v <= lo) return zext(static_cast<std::uint64_t>(static_cast<std::int64_t>(lo)), bits);
        if (v >= hi) return zext(static_cast<std::uint64_t>(bits == 64 ? INT64_MAX : static_cast<std::int64_t>(hi) - 1), bits);
        return zext(static_cast<std::uint64_t>(static_cast<std::int64_t>(v)), bits);
    }
    if (v <= 0) return 0;
    double hi = std::ldexp(1.0, static_cast<int>(bits));
    if (v >= hi) return bits == 64 ? UINT64_MAX : (1ull << bits) - 1;
    return static_cast<std::uint64_t>(v);
}

// Any source value as an exact double pair (value, tail) for conversions.
void source_as_double(std::uint64_t bits, Ty t, double& v, double& tail) {
    tail = 0;
    switch (t) {
        case Ty::F16: v = f16_to_double(static_cast<std::uint16_t>(bits)); return;
        case Ty::BF16: v = bf16_to_double(static_cast<std::uint16_t>(bits)); return;
        case Ty::F32: v = f32_of(bits); return;
        case Ty::F64: v = f64_of(bits); return;
        default: break;
    }
    unsigned b = bits_of(t);
    if (is_signed(t)) {
        std::int64_t x = sext(bits, b);
        v = static_cast<double>(x);
        if (b == 64) tail = static_cast<double>(x - static_cast<std::int64_t>(v));  // exact when v fits
    } else {
        std::uint64_t x = zext(bits, b);
        v = static_cast<double>(x);
        if (b == 64) {
            // v may round up to 2^64, which does not convert back; compare as long double.
            long double d = static_cast<long double>(x) - static_cast<long double>(v);
            tail = static_cast<double>(d);
        }
    }
}

void BlockRun::exit_thread(Thread& t) {
    t.state = State::Exited;
    if (exited_count_++ == 0) first_exited_ = &t;
    // A lane that leaves while others wait for it in a warp collective strands them.
    unsigned base = t.linear & ~31u;
    for (unsigned l = 0; l < 32 && base + l < n_; ++l) {
        Thread& o = threads_[base + l];
        if (o.state == State::AtWarp && (o.warp_mask >> (t.linear & 31u) & 1u)) {
            char m[160];
            std::snprintf(m, sizeof m, "lane %u exited while lane %u waits for it in `%s` with mask 0x%08x",
                          t.linear & 31u, o.linear & 31u, k_.text[o.pc].c_str(), o.warp_mask);
            fail(o, CUDA_ERROR_LAUNCH_FAILED, m);
        }
    }
    if (at_barrier_ > 0)
        fail(t, CUDA_ERROR_LAUNCH_FAILED,
             "thread exited while other threads wait at bar.sync; every thread must reach every barrier");
}

template <bool Single>
void BlockRun::step(Thread& t) {
    const Instr* code = k_.code.data();
    std::uint64_t* r = t.r;
    std::uint64_t budget = 1u << 16;
    [[maybe_unused]] bool issued = false;
    for (;;) {
        if constexpr (Single) {
            if (issued) return;
            issued = true;
        }
        const Instr& in = code[t.pc];
        ++t.clock;
        if (--budget == 0) {
            budget = 1u << 16;
            if (L_.has_deadline && std::chrono::steady_clock::now() > L_.deadline)
                fail(t, CUDA_ERROR_LAUNCH_TIMEOUT, "the launch ran past the watchdog's limit");
        }
        if (in.guard >= 0 && (r[in.guard] != 0) == in.guard_negate) {
            ++t.pc;
            continue;
        }
        if (in.fast != Fast::None) {
            // Operands are plain register slots here (specialize made immediates constants).
            const Operand* o = in.ops;
            const unsigned bits = bits_of(in.type);
            std::uint64_t* d = r + (o[0].reg >= 0 ? o[0].reg : 0);  // a store's o[0] is its address
            switch (in.fast) {
                case Fast::AddF32: *d = bits_of_f32(f32_of(r[o[1].reg]) + f32_of(r[o[2].reg])); break;
                case Fast::SubF32: *d = bits_of_f32(f32_of(r[o[1].reg]) - f32_of(r[o[2].reg])); break;
                case Fast::MulF32: *d = bits_of_f32(f32_of(r[o[1].reg]) * f32_of(r[o[2].reg])); break;
                case Fast::FmaF32: *d = bits_of_f32(std::fma(f32_of(r[o[1].reg]), f32_of(r[o[2].reg]), f32_of(r[o[3].reg]))); break;
                case Fast::AddInt: *d = zext(r[o[1].reg] + r[o[2].reg], bits); break;
                case Fast::SubInt: *d = zext(r[o[1].reg] - r[o[2].reg], bits); break;
                case Fast::MulLoInt: *d = zext(r[o[1].reg] * r[o[2].reg], bits); break;
                case Fast::MadLoInt: *d = zext(r[o[1].reg] * r[o[2].reg] + r[o[3].reg], bits); break;
                case Fast::MulWideS32: *d = static_cast<std::uint64_t>(sext(r[o[1].reg], 32) * sext(r[o[2].reg], 32)); break;
                case Fast::MulWideU32: *d = zext(r[o[1].reg], 32) * zext(r[o[2].reg], 32); break;
                case Fast::SetpInt: *d = compare_int(in.cmp, r[o[1].reg], r[o[2].reg], in.type); break;
                case Fast::SetpF32: *d = compare_float(in.cmp, f32_of(r[o[1].reg]), f32_of(r[o[2].reg])); break;
                case Fast::Mov: *d = zext(r[o[1].reg], bits); break;
                case Fast::AndInt: *d = r[o[1].reg] & r[o[2].reg] & zext(~0ull, bits); break;
                case Fast::OrInt: *d = zext(r[o[1].reg] | r[o[2].reg], bits); break;
                case Fast::XorInt: *d = zext(r[o[1].reg] ^ r[o[2].reg], bits); break;
                case Fast::ShlInt: {
                    std::uint64_t n = zext(r[o[2].reg], 32);
                    *d = n >= bits ? 0 : zext(r[o[1].reg] << n, bits);
                    break;
                }
                case Fast::LdShared: case Fast::StShared: {
                    // [reg + offset] or [symbol + offset] (the symbol's address folded into
                    // imm); anything out of bounds or misaligned takes the general path,
                    // which reports it.
                    const Operand& at = o[in.fast == Fast::LdShared ? 1 : 0];
                    std::uint64_t a = (at.addr.reg >= 0 ? r[at.addr.reg] : 0) + at.imm;
                    const unsigned eb = bits / 8;
                    if (a % eb != 0 || a + eb > shared_.size() || a + eb < a) goto general;
                    if (in.fast == Fast::LdShared) {
                        std::uint64_t x = load_bits(shared_.data() + a, eb);
                        *d = is_signed(in.type) ? static_cast<std::uint64_t>(sext(x, bits)) : x;
                    } else {
                        std::memcpy(shared_.data() + a, &r[o[1].reg], eb);
                    }
                    break;
                }
                case Fast::None: break;
            }
            ++t.pc;
            continue;
        }
    general:
        const Operand* o = in.ops;
        auto v = [&](int i) __attribute__((always_inline)) { return value(t, o[i], in.type); };
        auto dst = [&](std::uint64_t val) { if (o[0].kind == OperandKind::Reg) r[o[0].reg] = val; };
        const Ty ty = in.type;
        const unsigned bits = bits_of(ty);
        switch (in.op) {
            case Op::Mov: {
                if (o[0].kind == OperandKind::Vec) {  // unpack
                    std::uint64_t x = v(1);
                    unsigned part = bits / o[0].count;
                    for (unsigned i = 0; i < o[0].count; ++i)
                        if (o[0].vec[i] >= 0) r[o[0].vec[i]] = zext(x >> (part * i), part);
                } else if (o[1].kind == OperandKind::Vec) {  // pack
                    unsigned part = bits / o[1].count;
                    std::uint64_t x = 0;
                    for (unsigned i = 0; i < o[1].count; ++i)
                        x |= zext(o[1].vec[i] >= 0 ? r[o[1].vec[i]] : 0, part) << (part * i);
                    dst(x);
                } else {
                    dst(ty == Ty::Pred ? (v(1) != 0) : zext(v(1), bits ? bits : 64));
                }
                break;
            }
            case Op::Add: case Op::Sub: case Op::Mul: case Op::Mad: case Op::Fma: case Op::Min: case Op::Max:
            case Op::Neg: case Op::Abs: case Op::Div: case Op::Rem: case Op::Copysign: {
                if (ty == Ty::F32) {
                    float a = f32_in(v(1), in.ftz);
                    float b = in.nops > 2 ? f32_in(v(2), in.ftz) : 0.0f;
                    float c = in.nops > 3 ? f32_in(v(3), in.ftz) : 0.0f;
                    bool directed = in.round == Round::Rz || in.round == Round::Rm || in.round == Round::Rp;
                    float res;
                    switch (in.op) {
                        case Op::Add:
                            if (directed) { double s, e; two_sum(a, b, s, e); res = round_f32(s, e, in.round); }
                            else res = a + b;
                            break;
                        case Op::Sub:
                            if (directed) { double s, e; two_sum(a, -static_cast<double>(b), s, e); res = round_f32(s, e, in.round); }
                            else res = a - b;
                            break;
                        case Op::Mul:
                            res = directed ? round_f32(static_cast<double>(a) * b, 0, in.round) : a * b;
                            break;
                        case Op::Mad: case Op::Fma: {
                            double s, e;
                            two_sum(static_cast<double>(a) * b, c, s, e);  // the product is exact in double
                            res = directed ? round_f32(s, e, in.round) : std::fma(a, b, c);
                            break;
                        }
                        case Op::Min: res = std::isnan(a) ? b : std::isnan(b) ? a : (a < b || (a == b && std::signbit(a))) ? a : b; break;
                        case Op::Max: res = std::isnan(a) ? b : std::isnan(b) ? a : (a > b || (a == b && !std::signbit(a))) ? a : b; break;
                        case Op::Neg: res = -a; break;
                        case Op::Abs: res = std::fabs(a); break;
                        case Op::Copysign: res = std::copysign(b, a); break;
                        case Op::Div:
                            // div.approx: a times an approximate reciprocal; for 2^126 < |b| <
                            // 2^128 that reciprocal is subnormal and flushed, giving 0 (NaN for
                            // an infinite a), as the PTX ISA documents. Elsewhere the exact
                            // quotient is inside its 2-ulp bound. div.rn and div.full: exact.
                            if (in.approx && std::isfinite(b) && std::fabs(b) > 0x1p126f)
                                res = std::isinf(a) ? std::numeric_limits<float>::quiet_NaN() : std::copysign(0.0f, a) * std::copysign(1.0f, b);
                            else
                                res = a / b;
                            break;
                        default: res = 0; break;
                    }
                    r[o[0].reg] = f32_out(res, in.ftz, in.sat);
                    break;
                }
                if (ty == Ty::F64) {
                    double a = f64_of(v(1)), b = in.nops > 2 ? f64_of(v(2)) : 0, c = in.nops > 3 ? f64_of(v(3)) : 0, res;
                    switch (in.op) {
                        case Op::Add: res = a + b; break;
                        case Op::Sub: res = a - b; break;
                        case Op::Mul: res = a * b; break;
                        case Op::Mad: case Op::Fma: res = std::fma(a, b, c); break;
                        case Op::Min: res = std::isnan(a) ? b : std::isnan(b) ? a : std::fmin(a, b); break;
                        case Op::Max: res = std::isnan(a) ? b : std::isnan(b) ? a : std::fmax(a, b); break;
                        case Op::Neg: res = -a; break;
                        case Op::Abs: res = std::fabs(a); break;
                        case Op::Div: res = a / b; break;
                        case Op::Copysign: res = std::copysign(b, a); break;
                        default: res = 0; break;
                    }
                    dst(bits_of_f64(res));
                    break;
                }
                if (ty == Ty::F16 || ty == Ty::F16x2 || ty == Ty::BF16 || ty == Ty::BF16x2) {
                    dst(half_arith(in, v(1), in.nops > 2 ? v(2) : 0, in.nops > 3 ? v(3) : 0));
                    break;
                }
                // Integers.
                std::uint64_t a = v(1), b = in.nops > 2 ? v(2) : 0, c = in.nops > 3 ? v(3) : 0;
                bool sg = is_signed(ty);
                std::uint64_t res = 0;
                switch (in.op) {
                    case Op::Add: res = a + b; break;
                    case Op::Sub: res = a - b; break;
                    case Op::Mul: case Op::Mad: {
                        std::uint64_t p;
                        if (in.sub == Sub::Wide) {
                            p = sg ? static_cast<std::uint64_t>(sext(a, bits) * sext(b, bits)) : zext(a, bits) * zext(b, bits);
                            if (bits == 64) fail(t, CUDA_ERROR_LAUNCH_FAILED, "mul.wide on 64-bit operands");
                            res = in.op == Op::Mad ? p + c : p;
                            dst(zext(res, 2 * bits));
                            goto next;
                        }
                        if (in.sub == Sub::Hi) {
                            if (bits == 64) {
                                __int128 x = sg ? static_cast<__int128>(static_cast<std::int64_t>(a)) * static_cast<std::int64_t>(b)
                                                : static_cast<__int128>(static_cast<unsigned __int128>(a) * b);
                                p = static_cast<std::uint64_t>(static_cast<unsigned __int128>(x) >> 64);
                            } else {
                                std::int64_t x = sg ? sext(a, bits) * sext(b, bits) : static_cast<std::int64_t>(zext(a, bits) * zext(b, bits));
                                p = static_cast<std::uint64_t>(x) >> bits;
                            }
                        } else {
                            p = a * b;
                        }
                        res = in.op == Op::Mad ? p + c : p;
                        break;
                    }
                    case Op::Div: case Op::Rem: {
                        if (zext(b, bits) == 0) { res = in.op == Op::Div ? ~0ull : a; break; }  // unspecified on a GPU
                        if (sg) {
                            std::int64_t x = sext(a, bits), y = sext(b, bits);
                            if (y == -1) res = in.op == Op::Div ? static_cast<std::uint64_t>(-static_cast<__int128>(x)) : 0;
                            else res = static_cast<std::uint64_t>(in.op == Op::Div ? x / y : x % y);
                        } else {
                            std::uint64_t x = zext(a, bits), y = zext(b, bits);
                            res = in.op == Op::Div ? x / y : x % y;
                        }
                        break;
                    }
                    case Op::Min: case Op::Max: {
                        bool less = sg ? sext(a, bits) < sext(b, bits) : zext(a, bits) < zext(b, bits);
                        res = (in.op == Op::Min) == less ? a : b;
                        break;
                    }
                    case Op::Neg: res = 0 - a; break;
                    case Op::Abs: { std::int64_t x = sext(a, bits); res = static_cast<std::uint64_t>(x < 0 ? -x : x); break; }
                    default: break;
                }
                dst(zext(res, bits));
                break;
            }
            case Op::Mul24: case Op::Mad24: {
                std::int64_t x = is_signed(ty) ? sext(v(1), 24) : static_cast<std::int64_t>(zext(v(1), 24));
                std::int64_t y = is_signed(ty) ? sext(v(2), 24) : static_cast<std::int64_t>(zext(v(2), 24));
                std::uint64_t p = static_cast<std::uint64_t>(x * y);
                if (in.sub == Sub::Hi) p >>= 16;
                if (in.op == Op::Mad24) p += v(3);
                dst(zext(p, 32));
                break;
            }
            case Op::And: case Op::Or: case Op::Xor: {
                std::uint64_t a = v(1), b = v(2), res = in.op == Op::And ? a & b : in.op == Op::Or ? a | b : a ^ b;
                dst(ty == Ty::Pred ? (res & 1) : zext(res, bits));
                break;
            }
            case Op::Not: dst(ty == Ty::Pred ? !v(1) : zext(~v(1), bits)); break;
            case Op::Cnot: dst(zext(v(1), bits) == 0 ? 1 : 0); break;
            case Op::Shl: case Op::Shr: {
                std::uint64_t a = v(1), n = zext(v(2), 32);
                std::uint64_t res;
                if (in.op == Op::Shl) res = n >= bits ? 0 : a << n;
                else if (is_signed(ty)) res = static_cast<std::uint64_t>(sext(a, bits) >> std::min<std::uint64_t>(n, bits - 1));
                else res = n >= bits ? 0 : zext(a, bits) >> n;
                dst(zext(res, bits));
                break;
            }
            case Op::Popc: dst(static_cast<std::uint64_t>(__builtin_popcountll(zext(v(1), bits)))); break;
            case Op::Clz: {
                std::uint64_t a = zext(v(1), bits);
                dst(a == 0 ? bits : static_cast<std::uint64_t>(__builtin_clzll(a) - (64 - bits)));
                break;
            }
            case Op::Brev: {
                std::uint64_t a = v(1), res = 0;
                for (unsigned i = 0; i < bits; ++i) res |= ((a >> i) & 1) << (bits - 1 - i);
                dst(res);
                break;
            }
            case Op::Bfe: {
                std::uint64_t a = v(1);
                unsigned pos = static_cast<unsigned>(v(2) & 0xff), len = static_cast<unsigned>(v(3) & 0xff);
                std::uint64_t res = 0;
                bool sbit = is_signed(ty) && len > 0 && ((a >> std::min(pos + len - 1, bits - 1)) & 1);
                for (unsigned i = 0; i < bits; ++i) {
                    std::uint64_t bit = i < len && pos + i < bits ? (a >> (pos + i)) & 1 : (is_signed(ty) ? sbit : 0);
                    res |= bit << i;
                }
                if (len == 0) res = 0;
                dst(zext(res, bits));
                break;
            }
            case Op::Bfi: {
                std::uint64_t a = v(1), b = v(2);
                unsigned pos = static_cast<unsigned>(v(3) & 0xff), len = static_cast<unsigned>(v(4) & 0xff);
                std::uint64_t res = b;
                for (unsigned i = 0; i < len && pos + i < bits; ++i)
                    res = (res & ~(1ull << (pos + i))) | (((a >> i) & 1) << (pos + i));
                dst(zext(res, bits));
                break;
            }
            case Op::Prmt: {
                std::uint64_t a = zext(v(1), 32), b = zext(v(2), 32), c = v(3);
                std::uint64_t bytes = a | (b << 32), res = 0;
                for (int i = 0; i < 4; ++i) {
                    unsigned sel = static_cast<unsigned>((c >> (4 * i)) & 0xf);
                    std::uint64_t byte = (bytes >> (8 * (sel & 7))) & 0xff;
                    if (sel & 8) byte = (byte & 0x80) ? 0xff : 0;
                    res |= byte << (8 * i);
                }
                dst(res);
                break;
            }
            case Op::Selp: dst(value(t, o[3], Ty::Pred) ? v(1) : v(2)); break;
            case Op::Setp: case Op::Set: {
                bool res;
                Ty ct = in.op == Op::Set ? in.type2 : ty;
                std::uint64_t a = value(t, o[1], ct), b = value(t, o[2], ct);
                if (ct == Ty::F32) res = compare_float(in.cmp, f32_in(a, in.ftz), f32_in(b, in.ftz));
                else if (ct == Ty::F64) res = compare_float(in.cmp, f64_of(a), f64_of(b));
                else if (ct == Ty::F16 || ct == Ty::BF16) res = compare_float(in.cmp, half_value(a, ct == Ty::BF16), half_value(b, ct == Ty::BF16));
                else res = compare_int(in.cmp, a, b, ct);
                bool res2 = !res;
                if (in.boolop != BoolOp::None) {
                    bool c = value(t, o[3], Ty::Pred) != 0;
                    auto combine = [&](bool x) {
                        return in.boolop == BoolOp::And ? (x && c) : in.boolop == BoolOp::Or ? (x || c) : (x != c);
                    };
                    res2 = combine(!res);
                    res = combine(res);
                }
                if (in.op == Op::Setp) {
                    r[o[0].reg] = res;
                    if (in.pred_out >= 0) r[in.pred_out] = res2;
                } else {
                    dst(ty == Ty::F32 ? (res ? 0x3f800000u : 0) : (res ? zext(~0ull, bits) : 0));
                }
                break;
            }
            case Op::Cvt: {
                Ty dt = in.type, st = in.type2;
                unsigned db = bits_of(dt);
                if ((dt == Ty::F16x2 || dt == Ty::BF16x2) && st == Ty::F32) {
                    bool bf = dt == Ty::BF16x2;
                    std::uint64_t hi = half_bits(f32_of(v(1)), bf, in.round), lo = half_bits(f32_of(value(t, o[2], Ty::F32)), bf, in.round);
                    dst((hi << 16) | lo);
                    break;
                }
                std::uint64_t s = value(t, o[1], st);
                if (!is_float(dt) && !is_float(st)) {
                    unsigned sb = bits_of(st);
                    std::uint64_t x = is_signed(st) ? static_cast<std::uint64_t>(sext(s, sb)) : zext(s, sb);
                    if (in.sat) {
                        // Clamp to the destination's range.
                        __int128 val = is_signed(st) ? static_cast<__int128>(sext(s, sb)) : static_cast<__int128>(zext(s, sb));
                        __int128 lo = is_signed(dt) ? -(static_cast<__int128>(1) << (db - 1)) : 0;
                        __int128 hi = is_signed(dt) ? (static_cast<__int128>(1) << (db - 1)) - 1 : (static_cast<__int128>(1) << db) - 1;
                        val = std::max(lo, std::min(hi, val));
                        x = static_cast<std::uint64_t>(val);
                    }
                    dst(zext(x, db));
                    break;
                }
                if (dt == Ty::F32 && (st == Ty::BF16 || st == Ty::F16) && !in.sat && !in.ftz) {
                    // Widening is exact and keeps a NaN's payload (a bf16 is the top half of
                    // an f32; an f16's payload moves up 13 bits), as the hardware's does.
                    std::uint64_t h = s & 0xffff;
                    if (st == Ty::BF16) { dst(h << 16); break; }
                    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) { dst(((h & 0x8000) << 16) | 0x7f800000u | ((h & 0x3ff) << 13)); break; }
                }
                double d, tail;
                source_as_double(s, st, d, tail);
                if (in.ftz && st == Ty::F32) d = flush(static_cast<float>(d));
                if (!is_float(dt)) { dst(float_to_int(d, in.round, dt)); break; }
                if (dt == Ty::F64) { dst(bits_of_f64(d)); break; }  // from f32 / f16 / 32-bit ints: exact
                Round rnd = in.round;
                if (rnd == Round::Rni || rnd == Round::Rzi || rnd == Round::Rmi || rnd == Round::Rpi) {
                    // Round to an integral value in the same format.
                    d = rnd == Round::Rni ? std::nearbyint(d) : rnd == Round::Rzi ? std::trunc(d) : rnd == Round::Rmi ? std::floor(d) : std::ceil(d);
                    tail = 0;
                    rnd = Round::Rn;
                }
                if (dt == Ty::F32) {
                    float f = round_f32(d, tail, rnd);
                    dst(f32_out(f, in.ftz, in.sat));
                } else if (dt == Ty::F16 || dt == Ty::BF16) {
                    if (in.sat) d = std::isnan(d) ? 0 : std::min(1.0, std::max(0.0, d));
                    dst(half_bits(d, dt == Ty::BF16, rnd, tail));
                } else {
                    fail(t, CUDA_ERROR_LAUNCH_FAILED, "this cvt is not implemented by the PTX executor");
                }
                break;
            }
            case Op::Cvta: {
                std::uint64_t a = v(1);
                std::uint64_t base = in.space == Space::Shared ? SHARED_WINDOW : in.space == Space::Local ? LOCAL_WINDOW : 0;
                if (in.sub == Sub::ToSpace) dst(base ? a - base : a);
                else dst(a + base);
                break;
            }
            case Op::Rcp: case Op::Sqrt: case Op::Rsqrt: case Op::Ex2: case Op::Lg2: case Op::Sin: case Op::Cos:
            case Op::Tanh: {
                if (ty == Ty::F64) {
                    double a = f64_of(v(1)), res;
                    switch (in.op) {
                        case Op::Rcp: res = 1.0 / a; break;
                        case Op::Sqrt: res = std::sqrt(a); break;
                        case Op::Rsqrt: res = 1.0 / std::sqrt(a); break;
                        default: res = std::nan(""); break;
                    }
                    dst(bits_of_f64(res));
                    break;
                }
                // f32: the exactly rounded ones are exact here; the .approx ones are computed
                // in double and rounded once, well inside the PTX ISA's documented errors.
                float a = f32_in(v(1), in.ftz);
                double x = a, res;
                switch (in.op) {
                    case Op::Rcp: res = 1.0 / x; break;
                    case Op::Sqrt: res = std::sqrt(x); break;
                    case Op::Rsqrt: res = 1.0 / std::sqrt(x); break;
                    case Op::Ex2: res = std::exp2(x); break;
                    case Op::Lg2: res = std::log2(x); break;
                    case Op::Sin: res = std::sin(x); break;
                    case Op::Cos: res = std::cos(x); break;
                    default: res = std::tanh(x); break;
                }
                float f = (in.op == Op::Rcp || in.op == Op::Sqrt) && !in.approx ? round_f32(res, 0, in.round) : static_cast<float>(res);
                if (in.op == Op::Rcp || in.op == Op::Sqrt) {
                    // Exactly rounded: recompute in float where double rounding could differ.
                    if (!in.approx && in.op == Op::Rcp && (in.round == Round::Rn || in.round == Round::Default)) f = 1.0f / a;
                    if (!in.approx && in.op == Op::Sqrt && (in.round == Round::Rn || in.round == Round::Default)) f = std::sqrt(a);
                }
                r[o[0].reg] = f32_out(f, in.ftz, in.sat);
                break;
            }
            case Op::Testp: {
                double x = ty == Ty::F64 ? f64_of(v(1)) : static_cast<double>(f32_of(v(1)));
                int cls = ty == Ty::F64 ? std::fpclassify(x) : std::fpclassify(f32_of(v(1)));
                bool res;
                switch (in.cmp) {
                    case Cmp::Eq: res = std::isfinite(x); break;
                    case Cmp::Ne: res = std::isinf(x); break;
                    case Cmp::Num: res = !std::isnan(x); break;
                    case Cmp::Nan: res = std::isnan(x); break;
                    case Cmp::Lt: res = cls == FP_NORMAL; break;
                    default: res = cls == FP_SUBNORMAL; break;
                }
                r[o[0].reg] = res;
                break;
            }
            case Op::Ld: {
                Space sp = space_of(o[1], in.space);
                std::uint64_t a = effective(t, o[1]);
                unsigned eb = std::max(1u, bits / 8);
                const std::uint8_t* p = resolve(t, sp, a, eb * in.vec, false);
                if (o[0].kind == OperandKind::Vec) {
                    for (unsigned i = 0; i < o[0].count; ++i)
                        if (o[0].vec[i] >= 0) {
                            std::uint64_t x = load_bits(p + i * eb, eb);
                            r[o[0].vec[i]] = is_signed(ty) ? zext(static_cast<std::uint64_t>(sext(x, bits)), 64) : x;
                        }
                } else {
                    std::uint64_t x = load_bits(p, eb);
                    dst(is_signed(ty) ? static_cast<std::uint64_t>(sext(x, bits)) : x);
                }
                break;
            }
            case Op::St: {
                Space sp = space_of(o[0], in.space);
                std::uint64_t a = effective(t, o[0]);
                unsigned eb = std::max(1u, bits / 8);
                std::uint8_t* p = resolve(t, sp, a, eb * in.vec, true);
                if (o[1].kind == OperandKind::Vec) {
                    for (unsigned i = 0; i < o[1].count; ++i) {
                        std::uint64_t x = o[1].vec[i] >= 0 ? r[o[1].vec[i]] : 0;
                        std::memcpy(p + i * eb, &x, eb);
                    }
                } else {
                    std::uint64_t x = v(1);
                    std::memcpy(p, &x, eb);
                }
                break;
            }
            case Op::Atom: case Op::Red: {
                int ai = in.op == Op::Atom ? 1 : 0;
                Space sp = space_of(o[ai], in.space);
                std::uint64_t a = effective(t, o[ai]);
                unsigned eb = bits / 8;
                std::uint8_t* p = resolve(t, sp, a, eb, true);
                std::unique_lock<std::mutex> indivisible(atomic_lock(p), std::defer_lock);
                if (sp != Space::Shared && sp != Space::Local) indivisible.lock();
                std::uint64_t b = v(ai + 1), old = load_bits(p, eb), res = old;
                switch (in.sub) {
                    case Sub::Add:
                        if (ty == Ty::F32) res = bits_of_f32(f32_of(old) + f32_of(b));
                        else if (ty == Ty::F64) res = bits_of_f64(f64_of(old) + f64_of(b));
                        else res = old + b;
                        break;
                    case Sub::Inc: res = zext(old, bits) >= zext(b, bits) ? 0 : old + 1; break;
                    case Sub::Dec: res = (zext(old, bits) == 0 || zext(old, bits) > zext(b, bits)) ? b : old - 1; break;
                    case Sub::MinA: case Sub::MaxA: {
                        bool less = is_signed(ty) ? sext(b, bits) < sext(old, bits) : zext(b, bits) < zext(old, bits);
                        if (ty == Ty::F32) less = f32_of(b) < f32_of(old);
                        res = (in.sub == Sub::MinA) == less ? b : old;
                        break;
                    }
                    case Sub::AndA: res = old & b; break;
                    case Sub::OrA: res = old | b; break;
                    case Sub::XorA: res = old ^ b; break;
                    case Sub::Exch: res = b; break;
                    case Sub::Cas: res = zext(old, bits) == zext(b, bits) ? v(ai + 2) : old; break;
                    default: break;
                }
                res = zext(res, bits);
                std::memcpy(p, &res, eb);
                if (in.op == Op::Atom) dst(old);
                break;
            }
            case Op::Bra: t.pc = static_cast<std::uint32_t>(o[0].reg); continue;
            case Op::Ret: case Op::Exit: exit_thread(t); return;
            case Op::Trap: fail(t, CUDA_ERROR_LAUNCH_FAILED, "trap (an assertion or __trap in the kernel)");
            case Op::BarSync: {
                if (in.nops > 1) fail(t, CUDA_ERROR_LAUNCH_FAILED, "bar.sync with a thread count is not implemented by the PTX executor");
                if (in.nops == 1 && v(0) != 0) fail(t, CUDA_ERROR_LAUNCH_FAILED, "named barriers other than 0 are not implemented by the PTX executor");
                if (exited_count_ > 0) {
                    char m[200];
                    std::snprintf(m, sizeof m, "bar.sync reached after thread (%u,%u,%u) of the block exited; every thread must reach every barrier",
                                  first_exited_->tid[0], first_exited_->tid[1], first_exited_->tid[2]);
                    fail(t, CUDA_ERROR_LAUNCH_FAILED, m);
                }
                t.state = State::AtBarrier;
                ++at_barrier_;
                return;
            }
            case Op::Shfl: case Op::Vote: case Op::BarWarpSync: case Op::WmmaLoadA: case Op::WmmaLoadB:
            case Op::WmmaLoadC: case Op::WmmaStoreD: case Op::WmmaMma: {
                unsigned mask;
                if (in.op == Op::Shfl) mask = static_cast<unsigned>(v(4));
                else if (in.op == Op::Vote) mask = static_cast<unsigned>(value(t, o[2], Ty::B32));
                else if (in.op == Op::BarWarpSync) mask = static_cast<unsigned>(v(0));
                else mask = 0xffffffffu;
                unsigned lane = t.linear & 31u;
                if (!(mask >> lane & 1u)) {
                    char m[128];
                    std::snprintf(m, sizeof m, "mask 0x%08x does not include the calling lane %u", mask, lane);
                    fail(t, CUDA_ERROR_LAUNCH_FAILED, m);
                }
                t.warp_mask = mask;
                t.state = State::AtWarp;
                return;
            }
            case Op::Activemask: {
                unsigned base = t.linear & ~31u, m = 0;
                for (unsigned l = 0; l < 32 && base + l < n_; ++l)
                    if (threads_[base + l].state != State::Exited) m |= 1u << l;
                dst(m);
                break;
            }
            // Blocks may run on several OS threads: a fence orders this thread's memory
            // accesses for the others as the GPU's does (the threads of one block run one
            // at a time, so it orders nothing more within a block).
            case Op::Membar: case Op::Fence: std::atomic_thread_fence(std::memory_order_seq_cst); break;
            case Op::Nop: break;
        }
    next:
        ++t.pc;
    }
}

bool BlockRun::resolve_warps() {
    bool any = false;
    for (unsigned w = 0; w < warps_; ++w) {
        unsigned base = w * 32, count = std::min(32u, n_ - base);
        unsigned existing = count == 32 ? 0xffffffffu : (1u << count) - 1;
        for (unsigned l = 0; l < count; ++l) {
            Thread& t = threads_[base + l];
            if (t.state != State::AtWarp) continue;
            unsigned m = t.warp_mask & existing;
            // Every lane of the mask must be waiting at a collective with the same mask.
            bool ready = true;
            for (unsigned j = 0; j < count; ++j) {
                if (!(m >> j & 1u)) continue;
                Thread& o = threads_[base + j];
                if (o.state == State::Exited) {
                    char msg[200];
                    std::snprintf(msg, sizeof msg, "mask 0x%08x names exited lane %u of warp %u; exited lanes never arrive", t.warp_mask, j, w);
                    fail(t, CUDA_ERROR_LAUNCH_FAILED, msg);
                }
                if (o.state != State::AtWarp) { ready = false; continue; }
                if ((o.warp_mask & existing) != m) {
                    char msg[300];
                    std::snprintf(msg, sizeof msg, "lanes disagree on the mask: lane %u passes 0x%08x while lane %u waits in `%s` with 0x%08x",
                                  l, t.warp_mask, j, k_.text[o.pc].c_str(), o.warp_mask);
                    fail(t, CUDA_ERROR_LAUNCH_FAILED, msg);
                }
                if (k_.code[o.pc].op != k_.code[t.pc].op) {
                    char msg[300];
                    std::snprintf(msg, sizeof msg, "lanes of mask 0x%08x meet at different collectives: lane %u here, lane %u at line %u `%s`",
                                  m, l, j, k_.code[o.pc].line, k_.text[o.pc].c_str());
                    fail(t, CUDA_ERROR_LAUNCH_FAILED, msg);
                }
            }
            if (!ready) continue;
            // A lane outside the mask that waits with a mask naming one of its lanes
            // disagrees with it too (a half mask against a full one).
            for (unsigned j = 0; j < count; ++j) {
                Thread& o = threads_[base + j];
                if ((m >> j & 1u) || o.state != State::AtWarp || !((o.warp_mask & existing) & m)) continue;
                char msg[300];
                std::snprintf(msg, sizeof msg, "lanes disagree on the mask: lane %u passes 0x%08x while lane %u waits in `%s` with 0x%08x",
                              l, t.warp_mask, j, k_.text[o.pc].c_str(), o.warp_mask);
                fail(t, CUDA_ERROR_LAUNCH_FAILED, msg);
            }
            exec_warp(w, m);
            any = true;
        }
    }
    return any;
}

void BlockRun::exec_warp(unsigned w, unsigned mask) {
    unsigned base = w * 32;
    std::vector<Thread*> lanes(32, nullptr);
    Thread* first = nullptr;
    for (unsigned l = 0; l < 32; ++l)
        if (mask >> l & 1u) {
            lanes[l] = &threads_[base + l];
            if (!first) first = lanes[l];
        }
    const Instr& in = k_.code[first->pc];
    bool aligned = in.op == Op::WmmaLoadA || in.op == Op::WmmaLoadB || in.op == Op::WmmaLoadC || in.op == Op::WmmaStoreD || in.op == Op::WmmaMma;
    if (aligned) {
        for (unsigned l = 0; l < 32; ++l) {
            if (!lanes[l]) {
                fail(*first, CUDA_ERROR_LAUNCH_FAILED, "wmma needs all 32 lanes of the warp");
            }
            if (lanes[l]->pc != first->pc) {
                char m[200];
                std::snprintf(m, sizeof m, "lane %u reaches a different wmma instruction (line %u) than lane 0: .aligned needs all lanes at the same one",
                              l, k_.code[lanes[l]->pc].line);
                fail(*first, CUDA_ERROR_LAUNCH_FAILED, m);
            }
        }
    }
    switch (in.op) {
        case Op::Shfl: {
            std::uint64_t src[32] = {}, outv[32] = {};
            bool outp[32] = {};
            for (unsigned l = 0; l < 32; ++l) if (lanes[l]) src[l] = value(*lanes[l], k_.code[lanes[l]->pc].ops[1], Ty::B32);
            for (unsigned l = 0; l < 32; ++l) {
                if (!lanes[l]) continue;
                Thread& t = *lanes[l];
                const Instr& me = k_.code[t.pc];
                unsigned b = static_cast<unsigned>(value(t, me.ops[2], Ty::B32)) & 31u;
                unsigned c = static_cast<unsigned>(value(t, me.ops[3], Ty::B32));
                unsigned cval = c & 31u, segmask = (c >> 8) & 31u;
                int maxlane = static_cast<int>((l & segmask) | (cval & ~segmask)), minlane = static_cast<int>(l & segmask);
                int j;
                bool p;
                switch (me.sub) {
                    case Sub::Up: j = static_cast<int>(l) - static_cast<int>(b); p = j >= maxlane; break;
                    case Sub::Down: j = static_cast<int>(l + b); p = j <= maxlane; break;
                    case Sub::Bfly: j = static_cast<int>(l ^ b); p = j <= maxlane; break;
                    default: j = minlane | static_cast<int>(b & ~segmask); p = j <= maxlane; break;
                }
                if (!p) j = static_cast<int>(l);
                outv[l] = (j >= 0 && j < 32 && lanes[j]) ? src[j] : 0xffffffffu;  // outside the mask: poison
                outp[l] = p;
            }
            for (unsigned l = 0; l < 32; ++l) {
                if (!lanes[l]) continue;
                Thread& t = *lanes[l];
                const Instr& me = k_.code[t.pc];
                if (me.ops[0].kind == OperandKind::Reg) t.r[me.ops[0].reg] = outv[l];
                if (me.pred_out >= 0) t.r[me.pred_out] = outp[l];
            }
            break;
        }
        case Op::Vote: {
            unsigned ballot = 0;
            for (unsigned l = 0; l < 32; ++l)
                if (lanes[l] && value(*lanes[l], k_.code[lanes[l]->pc].ops[1], Ty::Pred)) ballot |= 1u << l;
            for (unsigned l = 0; l < 32; ++l) {
                if (!lanes[l]) continue;
                Thread& t = *lanes[l];
                const Instr& me = k_.code[t.pc];
                std::uint64_t res = me.sub == Sub::Ballot ? ballot : me.sub == Sub::All ? (ballot == mask) : (ballot != 0);
                t.r[me.ops[0].reg] = res;
            }
            break;
        }
        case Op::WmmaLoadA: case Op::WmmaLoadB: case Op::WmmaLoadC: wmma_load(lanes, in); break;
        case Op::WmmaStoreD: wmma_store(lanes, in); break;
        case Op::WmmaMma: wmma_mma(lanes, in); break;
        default: break;  // bar.warp.sync: the rendezvous is the whole effect
    }
    for (unsigned l = 0; l < 32; ++l) {
        if (!lanes[l]) continue;
        lanes[l]->state = State::Running;
        ++lanes[l]->pc;
    }
}

// The fragment layout is the SIMT emulator's: lane l holds elements e = 8l .. 8l+7 of the
// logical 16x16 matrix in row-major order, whatever the memory layout. f16 A and B fragments
// are 8 registers of f16x2 in PTX: the first four carry the lane's 8 elements, the last four
// a copy. bf16 A/B: 4 registers; f32 accumulators: 8; f16 accumulators: 4 (f16x2).
namespace {
unsigned fragment_regs(Op op, Ty t) {
    if (op == Op::WmmaLoadA || op == Op::WmmaLoadB) return t == Ty::F16 ? 8 : 4;
    return t == Ty::F32 ? 8 : 4;
}
void put_elem(Thread& t, const Operand& frag, Ty ty, unsigned i, std::uint64_t bits) {
    if (ty == Ty::F32) { t.r[frag.vec[i]] = bits; return; }
    std::uint64_t& reg = t.r[frag.vec[i / 2]];
    unsigned shift = 16 * (i % 2);
    reg = (reg & ~(0xffffull << shift)) | ((bits & 0xffff) << shift);
}
std::uint64_t get_elem(const Thread& t, const Operand& frag, Ty ty, unsigned i) {
    if (ty == Ty::F32) return t.r[frag.vec[i]] & 0xffffffffu;
    return (t.r[frag.vec[i / 2]] >> (16 * (i % 2))) & 0xffff;
}
}  // namespace

// The matrix a wmma load or store reaches, from its address operand `at` and its optional
// ldm: every lane must pass the same ones (the SIMT emulator's rule), 32-byte aligned, with
// rows a multiple of 16 bytes.
BlockRun::WmmaMatrix BlockRun::wmma_matrix(std::vector<Thread*>& lanes, const Instr& in, const Operand& at) {
    Thread& first = *lanes[0];
    auto ldm_of = [&](Thread& t) { return in.nops > 2 ? zext(value(t, in.ops[2], Ty::U32), 32) : 16; };
    WmmaMatrix m{effective(first, at), ldm_of(first), space_of(at, in.space), in.type == Ty::F32 ? 4u : 2u};
    for (unsigned l = 1; l < 32; ++l) {
        std::uint64_t pl = effective(*lanes[l], at), ll = ldm_of(*lanes[l]);
        if (pl != m.p || ll != m.ldm) {
            char msg[200];
            std::snprintf(msg, sizeof msg, "lanes disagree: lane 0 passes (0x%llx, ldm %llu) and lane %u (0x%llx, ldm %llu); every lane must pass the same pointer, ldm and layout",
                          (unsigned long long)m.p, (unsigned long long)m.ldm, l, (unsigned long long)pl, (unsigned long long)ll);
            fail(first, CUDA_ERROR_LAUNCH_FAILED, msg);
        }
    }
    std::uint64_t shown = m.sp == Space::Shared ? m.p + SHARED_WINDOW : m.p;
    if (shown % 32 != 0) fail(first, CUDA_ERROR_LAUNCH_FAILED, "wmma pointer is not 256-bit (32-byte) aligned");
    if ((m.ldm * m.eb) % 16 != 0) fail(first, CUDA_ERROR_LAUNCH_FAILED, "wmma ldm is not a multiple of 16 bytes");
    return m;
}

// Lane l's element i of the fragment lies at this element offset of the matrix.
inline std::uint64_t wmma_offset(const Instr& in, std::uint64_t ldm, unsigned l, unsigned i) {
    unsigned e = l * 8 + i, row = e / 16, col = e % 16;
    return in.wmma_a_row ? row * ldm + col : col * ldm + row;
}

void BlockRun::wmma_load(std::vector<Thread*>& lanes, const Instr& in) {
    const WmmaMatrix m = wmma_matrix(lanes, in, in.ops[1]);
    unsigned nregs = fragment_regs(in.op, in.type);
    for (unsigned l = 0; l < 32; ++l) {
        Thread& t = *lanes[l];
        const Operand& frag = k_.code[t.pc].ops[0];
        if (frag.count != nregs) fail(t, CUDA_ERROR_LAUNCH_FAILED, "wmma fragment with an unexpected register count");
        for (unsigned i = 0; i < 8; ++i) {
            const std::uint8_t* src = resolve(t, m.sp, m.p + wmma_offset(in, m.ldm, l, i) * m.eb, m.eb, false);
            put_elem(t, frag, in.type, i, load_bits(src, m.eb));
        }
        if (nregs == 8 && in.type != Ty::F32)
            for (unsigned i = 0; i < 4; ++i) t.r[frag.vec[4 + i]] = t.r[frag.vec[i]];
    }
}

void BlockRun::wmma_store(std::vector<Thread*>& lanes, const Instr& in) {
    const WmmaMatrix m = wmma_matrix(lanes, in, in.ops[0]);
    for (unsigned l = 0; l < 32; ++l) {
        Thread& t = *lanes[l];
        const Operand& frag = k_.code[t.pc].ops[1];
        for (unsigned i = 0; i < 8; ++i) {
            std::uint8_t* dstp = resolve(t, m.sp, m.p + wmma_offset(in, m.ldm, l, i) * m.eb, m.eb, true);
            std::uint64_t x = get_elem(t, frag, in.type, i);
            std::memcpy(dstp, &x, m.eb);
        }
    }
}

void BlockRun::wmma_mma(std::vector<Thread*>& lanes, const Instr& in) {
    float A[16][16], B[16][16], C[16][16];
    bool bf = in.wmma_ab == Ty::BF16;
    for (unsigned l = 0; l < 32; ++l) {
        Thread& t = *lanes[l];
        const Instr& me = k_.code[t.pc];
        for (unsigned i = 0; i < 8; ++i) {
            unsigned e = l * 8 + i;
            A[e / 16][e % 16] = static_cast<float>(half_value(get_elem(t, me.ops[1], Ty::F16, i), bf));
            B[e / 16][e % 16] = static_cast<float>(half_value(get_elem(t, me.ops[2], Ty::F16, i), bf));
            std::uint64_t c = get_elem(t, me.ops[3], in.wmma_c, i);
            C[e / 16][e % 16] = in.wmma_c == Ty::F32 ? f32_of(c) : static_cast<float>(f16_to_double(static_cast<std::uint16_t>(c)));
        }
    }
    for (unsigned l = 0; l < 32; ++l) {
        Thread& t = *lanes[l];
        const Instr& me = k_.code[t.pc];
        for (unsigned i = 0; i < 8; ++i) {
            unsigned e = l * 8 + i, m = e / 16, n = e % 16;
            float acc = C[m][n];
            for (int k = 0; k < 16; ++k) acc += A[m][k] * B[k][n];  // products of 8- or 11-bit significands: exact
            put_elem(t, me.ops[0], in.wmma_d, i, in.wmma_d == Ty::F32 ? bits_of_f32(acc) : to_f16(acc));
        }
    }
}

// ------------------------------------------------------------------------- the profile
// With LaunchShape::profile a block's warps issue one instruction at a time: each round,
// every warp issues the instruction at the lowest pc among its running lanes, for the lanes
// there. Lowest-pc-first reconverges a warp after structured divergence (both sides of a
// branch, a loop some lanes leave early) where a GPU does, so an instruction's lanes are the
// ones a GPU would issue it for. The results are the same as run()'s for any kernel without
// a race (the order of independent threads is free); the counts are docs/kernel-profile.md's.
void BlockRun::run_profiled() {
    Thread* group[32];
    for (;;) {
        bool ran = false;
        for (unsigned w = 0; w < warps_; ++w) {
            unsigned base = w * 32, count = std::min(32u, n_ - base);
            std::uint32_t pc = std::numeric_limits<std::uint32_t>::max();
            for (unsigned l = 0; l < count; ++l) {
                const Thread& t = threads_[base + l];
                if (t.state == State::Running && t.pc < pc) pc = t.pc;
            }
            if (pc == std::numeric_limits<std::uint32_t>::max()) continue;
            unsigned n = 0;
            for (unsigned l = 0; l < count; ++l) {
                Thread& t = threads_[base + l];
                if (t.state == State::Running && t.pc == pc) group[n++] = &t;
            }
            account(k_.code[pc], group, n);
            for (unsigned i = 0; i < n; ++i) step<true>(*group[i]);
            ran = true;
        }
        if (resolve_warps()) continue;
        if (ran) continue;
        if (resolve_barrier()) continue;
        unsigned exited = 0;
        for (Thread& t : threads_) exited += t.state == State::Exited;
        if (exited != n_) deadlock();
        for (const Thread& th : threads_) L_.instructions += th.clock;
        std::lock_guard<std::mutex> lock(L_.profile_lock);
        LaunchProfile& to = L_.profile;
        const LaunchProfile& p = prof_;
        to.warp_instructions += p.warp_instructions;
        to.thread_instructions += p.thread_instructions;
        to.ffma_warp += p.ffma_warp;
        to.flops_f32 += p.flops_f32;
        to.flops_f16 += p.flops_f16;
        to.flops_f64 += p.flops_f64;
        to.flops_tensor += p.flops_tensor;
        to.global_load_requests += p.global_load_requests;
        to.global_load_sectors += p.global_load_sectors;
        to.global_store_requests += p.global_store_requests;
        to.global_store_sectors += p.global_store_sectors;
        to.global_atomic_requests += p.global_atomic_requests;
        to.global_atomic_sectors += p.global_atomic_sectors;
        to.shared_load_requests += p.shared_load_requests;
        to.shared_load_wavefronts += p.shared_load_wavefronts;
        to.shared_load_ideal += p.shared_load_ideal;
        to.shared_store_requests += p.shared_store_requests;
        to.shared_store_wavefronts += p.shared_store_wavefronts;
        to.shared_store_ideal += p.shared_store_ideal;
        to.local_requests += p.local_requests;
        to.barriers += p.barriers;
        to.shuffles += p.shuffles;
        to.branches += p.branches;
        to.divergent_branches += p.divergent_branches;
        L_.read_sectors.insert(read_sectors_.begin(), read_sectors_.end());
        L_.write_sectors.insert(write_sectors_.begin(), write_sectors_.end());
        return;
    }
}

// Counts the warp instruction `in`, issued for the `n` lanes of `lanes`, before it runs (its
// addresses are read from registers the instruction may overwrite).
void BlockRun::account(const Instr& in, Thread* const* lanes, unsigned n) {
    LaunchProfile& p = prof_;
    p.warp_instructions += 1;
    unsigned on[32], m = 0;  // the lanes whose guard lets them execute
    for (unsigned i = 0; i < n; ++i)
        if (in.guard < 0 || (lanes[i]->r[in.guard] != 0) != in.guard_negate) on[m++] = i;
    p.thread_instructions += m;
    if (in.op == Op::Bra) {
        p.branches += 1;
        if (m != 0 && m != n) p.divergent_branches += 1;
    }
    if (m == 0) return;
    switch (in.op) {
        case Op::Add: case Op::Sub: case Op::Mul: case Op::Mad: case Op::Fma: account_flops(in, m); break;
        case Op::Ld: case Op::St: case Op::Atom: case Op::Red: account_memory(in, lanes, on, m); break;
        case Op::BarSync: p.barriers += 1; break;
        case Op::Shfl: p.shuffles += 1; break;
        case Op::WmmaLoadA: case Op::WmmaLoadB: case Op::WmmaLoadC: case Op::WmmaStoreD:
            if (n == 32) account_wmma(in, lanes);  // otherwise the launch fails at the instruction
            break;
        case Op::WmmaMma: p.flops_tensor += 2 * 16 * 16 * 16; break;
        default: break;
    }
}

// Floating-point operations of `lanes` lanes: an add, subtract or multiply is 1, an FMA 2,
// each half of an f16x2 / bf16x2 register one lane's worth.
void BlockRun::account_flops(const Instr& in, unsigned lanes) {
    bool fma = in.op == Op::Fma || in.op == Op::Mad;
    std::uint64_t per = fma ? 2 : 1;
    switch (in.type) {
        case Ty::F32:
            prof_.flops_f32 += per * lanes;
            if (fma) prof_.ffma_warp += 1;
            break;
        case Ty::F64: prof_.flops_f64 += per * lanes; break;
        case Ty::F16: case Ty::BF16: prof_.flops_f16 += per * lanes; break;
        case Ty::F16x2: case Ty::BF16x2: prof_.flops_f16 += 2 * per * lanes; break;
        default: break;  // integer arithmetic
    }
}

// A load, store or atomic of the lanes `on[0..m)` of `lanes`: one request, its sectors
// (global) or wavefronts (shared), and the sectors it adds to the launch's footprint.
void BlockRun::account_memory(const Instr& in, Thread* const* lanes, const unsigned* on, unsigned m) {
    const Operand& at = in.ops[in.op == Op::Ld || in.op == Op::Atom ? 1 : 0];
    Space declared = space_of(at, in.space);
    unsigned bytes = std::max(1u, bits_of(in.type) / 8) * (in.op == Op::Ld || in.op == Op::St ? in.vec : 1);
    std::uint64_t addr[32];
    unsigned phase[32];
    Space sp = declared;
    // Lanes per phase of a shared request: 128 bytes' worth (32 lanes up to 4 bytes each).
    unsigned per_phase = std::max(1u, 128u / std::max(4u, bytes));
    for (unsigned i = 0; i < m; ++i) {
        const Thread& t = *lanes[on[i]];
        std::uint64_t a = effective(t, at);
        Space s = declared;
        if (s == Space::Generic) {
            if (a >= SHARED_WINDOW && a < SHARED_WINDOW + WINDOW_SIZE) { s = Space::Shared; a -= SHARED_WINDOW; }
            else if (a >= LOCAL_WINDOW && a < LOCAL_WINDOW + WINDOW_SIZE) { s = Space::Local; a -= LOCAL_WINDOW; }
            else s = Space::Global;
        }
        if (i == 0) sp = s;
        addr[i] = a;
        phase[i] = (t.linear & 31u) / per_phase;
    }
    bool read = in.op != Op::St, write = in.op != Op::Ld;
    account_access(sp, read, write, addr, phase, m, bytes);
    if (sp == Space::Global) {
        if (in.op == Op::Ld) prof_.global_load_requests += 1;
        else if (in.op == Op::St) prof_.global_store_requests += 1;
        else prof_.global_atomic_requests += 1;
    }
}

// A wmma load or store: one request for the warp's 256 elements, phased as 16-byte (f16,
// bf16) or 32-byte (f32) pieces per lane.
void BlockRun::account_wmma(const Instr& in, Thread* const* lanes) {
    std::vector<Thread*> all(lanes, lanes + 32);
    const WmmaMatrix mx = wmma_matrix(all, in, in.op == Op::WmmaStoreD ? in.ops[0] : in.ops[1]);
    Space sp = mx.sp;
    std::uint64_t base = mx.p;
    if (sp == Space::Generic) {
        if (base >= SHARED_WINDOW && base < SHARED_WINDOW + WINDOW_SIZE) { sp = Space::Shared; base -= SHARED_WINDOW; }
        else sp = Space::Global;
    }
    std::uint64_t addr[256];
    unsigned phase[256];
    unsigned lanes_per_phase = 128 / (8 * mx.eb);
    for (unsigned l = 0; l < 32; ++l)
        for (unsigned i = 0; i < 8; ++i) {
            addr[l * 8 + i] = base + wmma_offset(in, mx.ldm, l, i) * mx.eb;
            phase[l * 8 + i] = l / lanes_per_phase;
        }
    bool store = in.op == Op::WmmaStoreD;
    account_access(sp, !store, store, addr, phase, 256, mx.eb);
    if (sp == Space::Global) {
        if (store) prof_.global_store_requests += 1;
        else prof_.global_load_requests += 1;
    }
}

// One request touching `bytes` at each of `addr[0..count)`. Global (and local): the distinct
// 32-byte sectors. Shared: per phase (the accesses with one `phase` value), the most distinct
// 4-byte words any of the 32 banks must deliver (a word several lanes read is one); the ideal
// is each phase's distinct words over 32 banks (at least one pass a phase), so the excess is
// bank conflicts alone.
void BlockRun::account_access(Space sp, bool read, bool write, const std::uint64_t* addr, const unsigned* phase,
                              unsigned count, unsigned bytes) {
    if (sp == Space::Local) {
        prof_.local_requests += 1;
        return;
    }
    if (sp == Space::Global) {
        std::vector<std::uint64_t> sectors;
        sectors.reserve(count * 2);
        for (unsigned i = 0; i < count; ++i)
            for (std::uint64_t s = addr[i] >> 5; s <= (addr[i] + bytes - 1) >> 5; ++s) sectors.push_back(s);
        std::sort(sectors.begin(), sectors.end());
        sectors.erase(std::unique(sectors.begin(), sectors.end()), sectors.end());
        if (read && write) prof_.global_atomic_sectors += sectors.size();
        else if (read) prof_.global_load_sectors += sectors.size();
        else prof_.global_store_sectors += sectors.size();
        if (read) read_sectors_.insert(sectors.begin(), sectors.end());
        if (write) write_sectors_.insert(sectors.begin(), sectors.end());
        return;
    }
    if (sp != Space::Shared) return;  // param, const
    // (phase, word) pairs, distinct.
    std::vector<std::pair<unsigned, std::uint64_t>> words;
    words.reserve(count * 4);
    for (unsigned i = 0; i < count; ++i)
        for (std::uint64_t w = addr[i] >> 2; w <= (addr[i] + bytes - 1) >> 2; ++w) words.emplace_back(phase[i], w);
    std::sort(words.begin(), words.end());
    words.erase(std::unique(words.begin(), words.end()), words.end());
    std::uint64_t wavefronts = 0, ideal = 0;
    for (std::size_t i = 0; i < words.size();) {
        unsigned per_bank[32] = {};
        std::size_t j = i;
        for (; j < words.size() && words[j].first == words[i].first; ++j) ++per_bank[words[j].second & 31u];
        wavefronts += *std::max_element(per_bank, per_bank + 32);
        ideal += (j - i + 31) / 32;  // the phase's distinct words over 32 banks
        i = j;
    }
    if (write && !read) {
        prof_.shared_store_requests += 1;
        prof_.shared_store_wavefronts += wavefronts;
        prof_.shared_store_ideal += ideal;
    } else {
        prof_.shared_load_requests += 1;
        prof_.shared_load_wavefronts += wavefronts;
        prof_.shared_load_ideal += ideal;
    }
}

bool BlockRun::resolve_barrier() {
    const Thread* waiting = nullptr;
    for (Thread& t : threads_) {
        if (t.state == State::AtBarrier) { waiting = &t; break; }
    }
    if (!waiting) return false;
    for (Thread& t : threads_) {
        if (t.state == State::AtWarp) return false;  // deadlock() explains
        if (t.state == State::AtBarrier && t.pc != waiting->pc) {
            char m[300];
            std::snprintf(m, sizeof m, "divergent bar.sync: this thread waits here while thread (%u,%u,%u) waits at PTX line %u `%s`",
                          waiting->tid[0], waiting->tid[1], waiting->tid[2], k_.code[waiting->pc].line, k_.text[waiting->pc].c_str());
            fail(t, CUDA_ERROR_LAUNCH_FAILED, m);
        }
    }
    for (Thread& t : threads_) {
        if (t.state == State::AtBarrier) {
            t.state = State::Running;
            ++t.pc;
        }
    }
    at_barrier_ = 0;
    return true;
}

void BlockRun::deadlock() {
    for (Thread& t : threads_) {
        if (t.state == State::AtWarp) {
            char m[200];
            std::snprintf(m, sizeof m, "deadlock: lane waits in a warp collective with mask 0x%08x for lanes that are at a barrier", t.warp_mask);
            fail(t, CUDA_ERROR_LAUNCH_FAILED, m);
        }
    }
    fail_block(CUDA_ERROR_LAUNCH_FAILED, "deadlock: no thread can run");
}

// ------------------------------------------------------------------------- shortcuts
// An operand the shortcuts can read straight from its slot: a register other than the clocks
// (read through value()), or an immediate, which becomes a constant slot of the instruction's
// type. False when it is neither.
bool plain_source(Kernel& k, Operand& o, Ty ty) {
    if (o.kind == OperandKind::Reg)
        return !o.negate && o.reg != static_cast<int>(Special::Clock) && o.reg != static_cast<int>(Special::Clock64) &&
               o.reg != static_cast<int>(Special::GlobalTimer);
    if (o.kind != OperandKind::Imm || k.slots >= 32767) return false;
    std::uint64_t bits = o.imm;
    if (o.imm_is_double) {
        double d = f64_of(o.imm);
        if (ty == Ty::F32) bits = bits_of_f32(static_cast<float>(d));
        else if (ty != Ty::F64) return false;
    }
    o.kind = OperandKind::Reg;
    o.reg = static_cast<std::int32_t>(k.slots++);
    k.constants.emplace_back(static_cast<std::uint32_t>(o.reg), bits);
    return true;
}

// Marks the instructions the interpreter's shortcuts can run (Instr::fast).
void specialize(Kernel& k) {
    for (Instr& in : k.code) {
        const Ty ty = in.type;
        const unsigned bits = bits_of(ty);
        const bool int_ty = !is_float(ty) && ty != Ty::Pred && (bits == 32 || bits == 64);
        const bool plain_f32 = ty == Ty::F32 && !in.ftz && !in.sat && (in.round == Round::Default || in.round == Round::Rn);
        Operand* o = in.ops;
        auto sources = [&](unsigned from, unsigned to, Ty t) {
            if (o[0].kind != OperandKind::Reg || in.nops != to) return false;
            for (unsigned i = from; i < to; ++i)
                if (!plain_source(k, o[i], t)) return false;
            return true;
        };
        Fast f = Fast::None;
        switch (in.op) {
            case Op::Add: case Op::Sub: case Op::Mul:
                if (plain_f32) f = in.op == Op::Add ? Fast::AddF32 : in.op == Op::Sub ? Fast::SubF32 : Fast::MulF32;
                else if (int_ty && !in.sat && in.op != Op::Mul) f = in.op == Op::Add ? Fast::AddInt : Fast::SubInt;
                else if (int_ty && in.op == Op::Mul && (in.sub == Sub::None || in.sub == Sub::Lo)) f = Fast::MulLoInt;
                else if (in.op == Op::Mul && in.sub == Sub::Wide && (ty == Ty::S32 || ty == Ty::U32))
                    f = ty == Ty::S32 ? Fast::MulWideS32 : Fast::MulWideU32;
                if (f != Fast::None && !sources(1, 3, ty)) f = Fast::None;
                break;
            case Op::Fma: case Op::Mad:
                if (plain_f32) f = Fast::FmaF32;
                else if (int_ty && in.op == Op::Mad && (in.sub == Sub::None || in.sub == Sub::Lo) && !in.sat) f = Fast::MadLoInt;
                if (f != Fast::None && !sources(1, 4, ty)) f = Fast::None;
                break;
            case Op::Setp:
                if (in.boolop != BoolOp::None || in.pred_out >= 0) break;
                if (int_ty || (bits == 16 && !is_float(ty))) f = Fast::SetpInt;
                else if (ty == Ty::F32 && !in.ftz) f = Fast::SetpF32;
                if (f != Fast::None && !sources(1, 3, ty)) f = Fast::None;
                break;
            case Op::Mov:
                if ((bits == 32 || bits == 64) && o[1].kind != OperandKind::Vec && o[1].kind != OperandKind::Addr &&
                    sources(1, 2, ty))
                    f = Fast::Mov;
                break;
            case Op::And: case Op::Or: case Op::Xor:
                if (int_ty || (bits == 32 || bits == 64)) {
                    if (ty == Ty::Pred) break;
                    f = in.op == Op::And ? Fast::AndInt : in.op == Op::Or ? Fast::OrInt : Fast::XorInt;
                    if (!sources(1, 3, ty)) f = Fast::None;
                }
                break;
            case Op::Shl:
                if (bits == 32 || bits == 64) {
                    f = Fast::ShlInt;
                    if (!sources(1, 3, ty)) f = Fast::None;
                }
                break;
            case Op::Ld: case Op::St: {
                // ld.shared / st.shared of one 4- or 8-byte value at [reg + offset] or a symbol.
                Operand& at = o[in.op == Op::Ld ? 1 : 0];
                if (in.space != Space::Shared || in.vec != 1 || (bits != 32 && bits != 64) || at.kind != OperandKind::Addr)
                    break;
                if (in.op == Op::Ld ? o[0].kind != OperandKind::Reg : !plain_source(k, o[1], ty)) break;
                std::uint64_t base = 0;
                if (at.addr.symbol >= 0) {
                    const Symbol& sym = k.symbols[at.addr.symbol];
                    if (sym.space != Space::Shared) break;
                    base = sym.dynamic ? (k.static_shared + k.dynamic_align - 1) / k.dynamic_align * k.dynamic_align : sym.offset;
                }
                at.imm = base + static_cast<std::uint64_t>(at.addr.offset);
                f = in.op == Op::Ld ? Fast::LdShared : Fast::StShared;
                break;
            }
            default:
                break;
        }
        in.fast = f;
    }
}

// ------------------------------------------------------------------------- the executor
class PtxExecutor final : public Executor {
public:
    const char* name() const override { return "PTX executor"; }

    std::vector<KernelInfo> kernels_in(const unsigned char* image, std::size_t size) override {
        std::string why;
        std::vector<PtxSource> sources = ptx_of(image, size, why);
        std::vector<KernelInfo> found;
        // From a fatbin: the newest PTX an sm_90 driver could JIT.
        const PtxSource* best = nullptr;
        for (const PtxSource& s : sources)
            if (s.arch <= STANDIN_ARCH && (!best || s.arch > best->arch)) best = &s;
        if (!best) {
            std::fprintf(stderr, "[cuda stand-in] PTX executor: no PTX to run in this module: %s\n", why.c_str());
            return found;
        }
        const Module* m = parsed(best->text);
        if (!m) return found;
        for (const Kernel& k : m->kernels) {
            if (!k.error.empty()) {
                std::fprintf(stderr, "[cuda stand-in] PTX executor: kernel `%s` cannot run: %s\n", k.name.c_str(), k.error.c_str());
                continue;
            }
            KernelInfo info;
            info.name = k.name;
            info.max_threads = k.maxntid;
            info.handle = &k;
            info.params = param_kinds(k);
            found.push_back(std::move(info));
        }
        return found;
    }

    LaunchOutcome launch(const KernelInfo& kernel, const LaunchShape& shape, void* const* params, double timeout_s) override {
        const Kernel& k = *static_cast<const Kernel*>(kernel.handle);
        LaunchCtx L;
        L.k = &k;
        L.shape = shape;
        L.params.assign(k.param_bytes, 0);
        for (std::size_t i = 0; i < k.params.size(); ++i)
            std::memcpy(L.params.data() + k.params[i].offset, params[i], k.params[i].bytes);
        L.view = device_view();
        std::uint64_t dyn_base = (k.static_shared + k.dynamic_align - 1) / k.dynamic_align * k.dynamic_align;
        L.shared_bytes = shape.shared_bytes ? dyn_base + shape.shared_bytes : k.static_shared;
        if (timeout_s > 0) {
            L.has_deadline = true;
            L.deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                                std::chrono::duration<double>(timeout_s));
        }
        LaunchOutcome out;
        auto began = std::chrono::steady_clock::now();
        const unsigned long long gx = shape.grid[0], gy = shape.grid[1];
        const unsigned long long blocks = gx * gy * shape.grid[2];
        std::atomic<unsigned long long> next{0};
        std::atomic<bool> failed{false};
        std::mutex failure_lock;
        unsigned long long failed_block = blocks;  // the first failing block in launch order
        auto work = [&] {
            for (;;) {
                if (failed.load(std::memory_order_relaxed)) return;
                unsigned long long b = next.fetch_add(1, std::memory_order_relaxed);
                if (b >= blocks) return;
                try {
                    BlockRun run(L, static_cast<unsigned>(b % gx), static_cast<unsigned>(b / gx % gy),
                                 static_cast<unsigned>(b / (gx * gy)));
                    run.run();
                } catch (const LaunchError& e) {
                    std::lock_guard<std::mutex> g(failure_lock);
                    if (b < failed_block) {
                        failed_block = b;
                        out.code = e.code;
                        out.message = e.message;
                    }
                    failed.store(true, std::memory_order_relaxed);
                    return;
                }
            }
        };
        unsigned long long workers = std::max(1u, std::thread::hardware_concurrency());
        if (workers > blocks) workers = blocks;
        std::vector<std::thread> helpers;
        for (unsigned long long i = 1; i < workers; ++i) helpers.emplace_back(work);
        work();
        for (std::thread& h : helpers) h.join();
        stats_.add(L.instructions.load(), std::chrono::steady_clock::now() - began);
        if (shape.profile && out.code == CUDA_SUCCESS) {
            out.profiled = true;
            out.profile = L.profile;
            out.profile.read_footprint_sectors = L.read_sectors.size();
            out.profile.write_footprint_sectors = L.write_sectors.size();
        }
        return out;
    }

private:
    // What NANODDP_STANDIN_STATS=1 prints when the process exits: the interpreter's speed.
    struct Stats {
        std::atomic<std::uint64_t> launches{0}, instructions{0}, nanoseconds{0};
        bool enabled = false;
        Stats() {
            const char* on = std::getenv("NANODDP_STANDIN_STATS");
            enabled = on && *on && std::strcmp(on, "0") != 0;
        }
        void add(std::uint64_t n, std::chrono::steady_clock::duration d) {
            launches += 1;
            instructions += n;
            nanoseconds += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
        }
        ~Stats() {
            if (!enabled || launches == 0) return;
            double s = static_cast<double>(nanoseconds.load()) * 1e-9;
            std::fprintf(stderr, "[cuda stand-in] PTX executor: %llu launches, %llu instructions (thread-instructions) in %.3f s of launches: %.1f M instructions/s\n",
                         static_cast<unsigned long long>(launches.load()), static_cast<unsigned long long>(instructions.load()), s,
                         s > 0 ? static_cast<double>(instructions.load()) / s * 1e-6 : 0.0);
        }
    };
    static inline Stats stats_;
    std::mutex m_;
    std::map<std::string, std::unique_ptr<Module>> cache_;  // by PTX text: modules are loaded once per GPU

    const Module* parsed(const std::string& text) {
        std::lock_guard<std::mutex> lock(m_);
        auto it = cache_.find(text);
        if (it != cache_.end()) return it->second.get();
        auto m = std::make_unique<Module>();
        std::string error;
        if (!parse(text, *m, error)) {
            std::fprintf(stderr, "[cuda stand-in] PTX executor: cannot read the module's PTX: %s\n", error.c_str());
            return nullptr;
        }
        for (Kernel& k : m->kernels)
            if (k.error.empty()) specialize(k);
        const Module* p = m.get();
        cache_.emplace(text, std::move(m));
        return p;
    }

    // Parameter kinds for the driver model's hazard bookkeeping: nanoddp's own kernels say
    // which pointers they write (the registry); for others, every 64-bit parameter is a
    // pointer that is written when the kernel stores to global memory at all.
    static std::string param_kinds(const Kernel& k) {
        for (unsigned i = 0; i < standin_kernel_count; ++i)
            if (k.name == standin_kernels[i].name && std::strlen(standin_kernels[i].params) == k.params.size())
                return standin_kernels[i].params;
        std::string kinds;
        for (const Param& p : k.params) {
            if (p.bytes == 8 && !is_float(p.type)) kinds.push_back(k.writes_global ? 'w' : 'r');
            else kinds.push_back(static_cast<char>('0' + p.bytes));
        }
        return kinds;
    }
};

}  // namespace

bool ptx_spellings(const unsigned char* image, std::size_t size, std::vector<std::string>& spellings,
                   std::string& error) {
    std::vector<PtxSource> sources = ptx_of(image, size, error);
    if (sources.empty()) {
        if (error.empty()) error = "no PTX in the image";
        return false;
    }
    std::vector<std::string> all;
    for (const PtxSource& s : sources) {
        std::vector<std::string> one;
        if (!instruction_spellings(s.text, one, error)) return false;
        all.insert(all.end(), one.begin(), one.end());
    }
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    spellings = std::move(all);
    return true;
}

Executor& ptx_executor() {
    static PtxExecutor* ptx = new PtxExecutor;  // never freed: stream threads may outlive static destructors
    return *ptx;
}

}  // namespace standin
