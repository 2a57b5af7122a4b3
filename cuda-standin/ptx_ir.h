// ptx_ir.h — PTX decoded once, for the PTX executor (ptx_executor.cpp) to run without touching
// text: every instruction is an opcode, its types and modifiers, and operands that name
// register slots, immediates, addresses or branch targets by number.
//
// The parser (ptx_parse.cpp) accepts the PTX that nvcc and NVRTC 13 emit (ISA up to 9.x):
// `.entry` kernels with scalar parameters, `.reg` / `.shared` / `.local` declarations (inline
// `{ }` scopes included), module-scope `.shared` variables and `.extern .shared` arrays.
// Anything else (an instruction, a type or a directive it does not know) is an error that
// names the kernel, the line and the text, never a silent skip.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace standin::ptx {

// Value types. B/U/S/F name the kind, the number the bits.
enum class Ty : std::uint8_t {
    None,
    Pred,
    B8, B16, B32, B64,
    U8, U16, U32, U64,
    S8, S16, S32, S64,
    F16, F16x2, BF16, BF16x2, F32, F64,
};

inline unsigned bits_of(Ty t) {
    switch (t) {
        case Ty::Pred: return 1;
        case Ty::B8: case Ty::U8: case Ty::S8: return 8;
        case Ty::B16: case Ty::U16: case Ty::S16: case Ty::F16: case Ty::BF16: return 16;
        case Ty::B32: case Ty::U32: case Ty::S32: case Ty::F32: case Ty::F16x2: case Ty::BF16x2: return 32;
        case Ty::B64: case Ty::U64: case Ty::S64: case Ty::F64: return 64;
        default: return 0;
    }
}
inline bool is_signed(Ty t) { return t == Ty::S8 || t == Ty::S16 || t == Ty::S32 || t == Ty::S64; }
// f16, bf16, f32, f64 and the packed pairs
inline bool is_float(Ty t) {
    return t == Ty::F16 || t == Ty::F16x2 || t == Ty::BF16 || t == Ty::BF16x2 || t == Ty::F32 || t == Ty::F64;
}

enum class Space : std::uint8_t { Generic, Global, Shared, Local, Param, Const };

enum class Op : std::uint8_t {
    Mov, Add, Sub, Mul, Mad, Mul24, Mad24, Div, Rem, Abs, Neg, Min, Max, Fma,
    And, Or, Xor, Not, Cnot, Shl, Shr, Popc, Clz, Brev, Bfe, Bfi, Prmt, Copysign,
    Selp, Setp, Set, Cvt, Cvta,
    Rcp, Sqrt, Rsqrt, Ex2, Lg2, Sin, Cos, Tanh, Testp,
    Ld, St, Atom, Red,
    Bra, Ret, Exit, Trap,
    BarSync, BarWarpSync, Membar, Fence,
    Shfl, Vote, Activemask,
    WmmaLoadA, WmmaLoadB, WmmaLoadC, WmmaStoreD, WmmaMma,
    Nop,  // prefetches, .pragma-like hints with no effect on results
};

// Rounding: IEEE modes for floats (.rn .rz .rm .rp) and the integer ones of cvt (.rni ...).
enum class Round : std::uint8_t { Default, Rn, Rz, Rm, Rp, Rna, Rni, Rzi, Rmi, Rpi };

enum class Cmp : std::uint8_t {
    Eq, Ne, Lt, Le, Gt, Ge, Lo, Ls, Hi, Hs,
    Equ, Neu, Ltu, Leu, Gtu, Geu, Num, Nan,
};

enum class BoolOp : std::uint8_t { None, And, Or, Xor };

// The arithmetic and atomic sub-operation named by a modifier (mul.lo / .hi / .wide, atom.add,
// shfl.up, vote.any, ...).
enum class Sub : std::uint8_t {
    None,
    Lo, Hi, Wide,                                       // mul / mad
    Add, Inc, Dec, MinA, MaxA, AndA, OrA, XorA, Exch, Cas,  // atom / red
    Up, Down, Bfly, Idx,                                // shfl
    All, Any, Uni, Ballot,                              // vote
    ToSpace, FromSpace,                                 // cvta.to.<space> / cvta.<space>
};

enum class OperandKind : std::uint8_t { None, Reg, Imm, Addr, Vec, Label, Sink };

// Special registers (%tid.x, ...) are read-only slots the executor fills per thread.
enum class Special : std::uint8_t {
    TidX, TidY, TidZ, NtidX, NtidY, NtidZ, CtaidX, CtaidY, CtaidZ, NctaidX, NctaidY, NctaidZ,
    LaneId, WarpId, NWarpId, SmId, NSmId, GridId, LanemaskEq, LanemaskLt, LanemaskLe, LanemaskGt,
    LanemaskGe, Clock, Clock64, GlobalTimer, DynamicSmemSize, TotalSmemSize,
    Count,
};

// An address operand: [reg + offset], [symbol + offset] or [offset].
struct Address {
    std::int32_t reg = -1;  // slot of the base register, or -1
    std::int32_t symbol = -1;  // index into Kernel::symbols, or -1
    std::int64_t offset = 0;
};

struct Operand {
    OperandKind kind = OperandKind::None;
    bool negate = false;  // !%p
    std::uint8_t count = 0;  // Vec: number of registers
    bool imm_is_double = false;  // a 0d literal, converted by the user to its type
    std::int32_t reg = -1;   // Reg: slot; Label: instruction index
    // Vec: slots (-1 for `_`); an immediate in a vector (`{%rs1, 0}`) gets a slot of its own
    // that holds the constant (Kernel::constants). 16-bit slots keep an instruction small.
    std::int16_t vec[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
    std::uint64_t imm = 0;   // Imm: raw bits (floats as their IEEE bits, in the instruction's width)
    Address addr;
};

// The executor's shortcuts for the commonest instructions in their plainest forms (register
// operands, default rounding, no .ftz/.sat), chosen once after parsing (ptx_executor.cpp:
// specialize). None: the general interpreter.
enum class Fast : std::uint8_t {
    None, AddF32, SubF32, MulF32, FmaF32, AddInt, SubInt, MulLoInt, MadLoInt, MulWideS32, MulWideU32,
    SetpInt, SetpF32, Mov, AndInt, OrInt, XorInt, ShlInt, LdShared, StShared,
};

struct Instr {
    Op op = Op::Nop;
    Fast fast = Fast::None;
    Ty type = Ty::None;   // the (destination) type
    Ty type2 = Ty::None;  // cvt's source type; setp/set's destination for set
    Space space = Space::Generic;
    Sub sub = Sub::None;
    Round round = Round::Default;
    Cmp cmp = Cmp::Eq;
    BoolOp boolop = BoolOp::None;
    bool ftz = false, sat = false, approx = false, volatile_ = false, uniform = false;
    bool wmma_a_row = true, wmma_b_row = true;  // wmma layouts (mma: a and b; load/store: the one layout)
    Ty wmma_ab = Ty::None;                      // wmma inputs: f16 or bf16
    Ty wmma_d = Ty::None, wmma_c = Ty::None;    // wmma accumulator types
    std::uint8_t vec = 1;                       // ld/st .v2 / .v4
    std::uint8_t nops = 0;
    std::int32_t guard = -1;  // predicate slot, or -1
    bool guard_negate = false;
    std::int32_t pred_out = -1;  // setp / shfl's second destination (%p in `%r|%p`)
    Operand ops[5];
    std::uint32_t line = 0;  // source line, for messages
};

// A named object in a state space the kernel can address.
struct Symbol {
    std::string name;
    Space space = Space::Shared;
    std::uint64_t offset = 0;  // within the space (shared: from the block's shared base; param: from 0)
    std::uint64_t size = 0;    // bytes; 0 for the dynamic `.extern .shared` array
    std::uint32_t align = 1;
    bool dynamic = false;
};

struct Param {
    std::string name;
    Ty type = Ty::None;
    std::uint32_t bytes = 0;
    std::uint32_t offset = 0;  // in the parameter buffer
};

struct Kernel {
    std::string name;
    std::vector<Param> params;
    std::uint32_t param_bytes = 0;
    std::vector<Symbol> symbols;
    std::uint64_t static_shared = 0;  // bytes of .shared variables (dynamic shared follows, aligned)
    std::uint32_t dynamic_align = 16;
    std::uint64_t local_bytes = 0;    // per thread
    unsigned maxntid = 0;             // .maxntid x*y*z, or 0
    std::uint32_t slots = 0;          // register slots per thread (specials first)
    std::vector<std::pair<std::uint32_t, std::uint64_t>> constants;  // slots that hold a constant
    std::vector<Instr> code;
    std::vector<std::string> text;    // per instruction: its source text, for messages
    bool writes_global = false;       // any st / atom / red that may reach global memory
    std::string error;                // why the executor cannot run it (empty: it can)
};

struct Module {
    unsigned isa = 0;     // 90 for .version 9.0
    unsigned target = 0;  // 90 for .target sm_90
    std::vector<Kernel> kernels;
};

// Parses PTX text. On failure returns false and sets `error` to a message naming the line.
bool parse(const std::string& text, Module& out, std::string& error);

// Every opcode-and-modifier spelling the parser accepts, as `ld.global.nc.f32` style keys
// with registers stripped: the executor's coverage, for the coverage test and the docs.
// `spellings` gets one entry per instruction in `text` (duplicates removed, sorted); returns
// false with `error` set when some instruction is not implemented.
bool instruction_spellings(const std::string& text, std::vector<std::string>& spellings, std::string& error);

}  // namespace standin::ptx
