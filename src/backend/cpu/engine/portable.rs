//! The portable engine: 4 lanes as a plain array, the arithmetic plain Rust the compiler
//! vectorizes for the target's baseline (SSE2 on x86-64). Multiplies and adds are separate
//! (a fused `mul_add` is a library call where the target lacks FMA).

use super::Engine;
use crate::backend::cpu::isa::EngineKind;

/// Plain Rust, 4 lanes.
pub(in crate::backend::cpu) struct Portable;

impl Engine for Portable {
    const KIND: EngineKind = EngineKind::Portable;
    const LANES: usize = 4;
    const R: usize = 4;
    const V: usize = 3;
    const GEMM_ROWS: usize = 5;
    const GEMM_VECTORS: usize = 2;
    const DOT_ROWS: usize = 2;
    const DOT_COLS: usize = 5;
    #[cfg(test)]
    const FUSED: bool = false;
    type Vector = [f32; 4];

    fn available() -> bool {
        true
    }

    #[inline(always)]
    unsafe fn run<T>(f: impl FnOnce() -> T) -> T {
        f()
    }

    #[inline(always)]
    unsafe fn load(p: *const f32) -> [f32; 4] {
        // SAFETY: the caller's: p is valid for 4 floats.
        unsafe { p.cast::<[f32; 4]>().read_unaligned() }
    }

    #[inline(always)]
    unsafe fn store(p: *mut f32, v: [f32; 4]) {
        // SAFETY: the caller's: p is valid for 4 floats.
        unsafe { p.cast::<[f32; 4]>().write_unaligned(v) }
    }

    #[inline(always)]
    unsafe fn splat(v: f32) -> [f32; 4] {
        [v; 4]
    }

    #[inline(always)]
    unsafe fn fmadd(a: [f32; 4], b: [f32; 4], c: [f32; 4]) -> [f32; 4] {
        std::array::from_fn(|i| a[i] * b[i] + c[i])
    }

    #[inline(always)]
    unsafe fn add(a: [f32; 4], b: [f32; 4]) -> [f32; 4] {
        std::array::from_fn(|i| a[i] + b[i])
    }

    #[inline(always)]
    unsafe fn sum(v: [f32; 4]) -> f32 {
        (v[0] + v[2]) + (v[1] + v[3])
    }
}
