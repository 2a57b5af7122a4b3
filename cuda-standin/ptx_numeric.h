// ptx_numeric.h — the PTX executor's number formats: f16 and bf16 conversions rounded to
// nearest even (subnormals, overflow to infinity, canonical NaN as PTX defines them), directed
// rounding of f32 results from an exact double-double value, and flushing subnormals (.ftz).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "ptx_ir.h"

namespace standin::ptx {

inline float f32_of(std::uint64_t bits) { return std::bit_cast<float>(static_cast<std::uint32_t>(bits)); }
inline std::uint64_t bits_of_f32(float f) { return std::bit_cast<std::uint32_t>(f); }
inline double f64_of(std::uint64_t bits) { return std::bit_cast<double>(bits); }
inline std::uint64_t bits_of_f64(double d) { return std::bit_cast<std::uint64_t>(d); }

// Subnormal f32 inputs and results become zero of the same sign under .ftz.
inline float flush(float f) {
    return std::fpclassify(f) == FP_SUBNORMAL ? std::copysign(0.0f, f) : f;
}

// Exact f16 / bf16 to double.
inline double f16_to_double(std::uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v;
    if (exp == 0x1f) v = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    else if (exp == 0) v = std::ldexp(static_cast<double>(man), -24);
    else v = std::ldexp(static_cast<double>(man | 0x400), exp - 25);
    return sign ? -v : v;
}
inline double bf16_to_double(std::uint16_t h) { return static_cast<double>(f32_of(static_cast<std::uint32_t>(h) << 16)); }

// Rounds the exact value x + tail (a TwoSum pair: |tail| at most half an ulp of x) to a
// binary format with `ebits` exponent bits and `man` fraction bits, ties to even or in the
// direction `r`, and returns its encoding: f16 is (5, 10), bf16 (8, 7), f32 (8, 23).
// Subnormals are produced (no flushing here); overflow gives infinity, or the largest finite
// value in the modes that round toward zero; NaN gives the canonical all-ones-fraction NaN.
inline std::uint32_t round_to_format(double x, double tail, int ebits, int man, Round r) {
    const int bias = (1 << (ebits - 1)) - 1;
    const std::uint32_t exp_all = (1u << ebits) - 1;
    const std::uint32_t sign = std::signbit(x) ? 1u << (ebits + man) : 0;
    const std::uint32_t inf = exp_all << man;
    if (std::isnan(x)) return (ebits + man == 15 ? 0x7fffu : (inf | ((1u << man) - 1)));
    if (std::isinf(x)) return sign | inf;
    const bool neg = sign != 0;
    double a = std::fabs(x), t = neg ? -tail : tail;  // magnitude a + t
    if (a == 0 && t == 0) return sign;
    int e = a > 0 ? std::ilogb(a) : 1 - bias;
    if (e < 1 - bias) e = 1 - bias;  // subnormals share the smallest normal binade's quantum
    const double quantum = std::ldexp(1.0, e - man), half = quantum / 2;
    double q = std::floor(a / quantum);  // exact: scaling by a power of two
    double rem = a - q * quantum;        // exact, in [0, quantum)
    enum { OnGrid, Below, Tie, Above } pos;
    if (rem == 0 && t == 0) pos = OnGrid;
    else if (rem == 0 && t < 0) { q -= 1; pos = Above; }  // just under q * quantum
    else if (rem == 0) pos = Below;
    else if (rem == half) pos = t > 0 ? Above : t < 0 ? Below : Tie;
    else pos = rem > half ? Above : Below;  // |t| is below the gap to half
    bool away;  // round the magnitude up
    switch (r) {
        case Round::Rz: case Round::Rzi: away = false; break;
        case Round::Rm: case Round::Rmi: away = neg && pos != OnGrid; break;
        case Round::Rp: case Round::Rpi: away = !neg && pos != OnGrid; break;
        default: away = pos == Above || (pos == Tie && std::fmod(q, 2.0) != 0); break;
    }
    if (away) q += 1;
    double mag = q * quantum;
    if (mag == 0) return sign;
    int me = std::ilogb(mag);
    if (me > bias) {
        bool to_zero = r == Round::Rz || (r == Round::Rm && !neg) || (r == Round::Rp && neg);
        return sign | (to_zero ? inf - 1 : inf);
    }
    if (me < 1 - bias) return sign | static_cast<std::uint32_t>(mag / std::ldexp(1.0, 1 - bias - man));
    std::uint32_t frac = static_cast<std::uint32_t>(mag / std::ldexp(1.0, me - man) - std::ldexp(1.0, man));
    return sign | (static_cast<std::uint32_t>(me + bias) << man) | frac;
}

inline std::uint16_t to_f16(double x, Round r = Round::Rn, double tail = 0) {
    return static_cast<std::uint16_t>(round_to_format(x, tail, 5, 10, r));
}
inline std::uint16_t to_bf16(double x, Round r = Round::Rn, double tail = 0) {
    return static_cast<std::uint16_t>(round_to_format(x, tail, 8, 7, r));
}
// f32 from the exact value x + tail, rounded in direction r.
inline float round_f32(double x, double tail, Round r) {
    if (std::isnan(x)) return static_cast<float>(x);
    return f32_of(round_to_format(x, tail, 8, 23, r));
}

// TwoSum: s + e == a + b exactly.
inline void two_sum(double a, double b, double& s, double& e) {
    s = a + b;
    double bb = s - a;
    e = (a - (s - bb)) + (b - bb);
}

}  // namespace standin::ptx
