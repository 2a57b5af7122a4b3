//! bf16 products by pairs of steps: their operands, packed, and their drivers. The two pair
//! engines they run on are in `engine/`: `vdpbf16ps` (AVX512-BF16: 16 lanes, two bf16
//! products added to each f32 lane per instruction) and `amx` (AMX-BF16 tiles: 16 x 16 sums
//! of 16 pairs per `tdpbf16ps`).
//!
//! Two products, both `C[o][r] = Σ_k A[o][k] · X[k][r]` with the steps of k taken two at a
//! time, each 32-bit word holding a step pair's two bf16 values ([`word`]):
//! - **the window product** ([`PairOperand::product`]): X is read in place from a group of
//!   images, `X[k][r] = x[rows[r] + steps[k]]` ([`PairWindows`]). The forward: o output
//!   channels, r output pixels, k taps, A the filter; the filter gradient: o output
//!   channels, r taps, k output pixels, A the output gradient. A **pair** is two
//!   consecutive steps at adjacent offsets (neighbouring taps of a filter row, neighbouring
//!   pixels of an output row: [`pairs`]), both of its x values one 32-bit load from the
//!   [`PairImage`] (word i holds x[i] and x[i + 1]); a step with no partner (the fifth tap of
//!   a 5-wide filter row) is a **single**: its word's high half is cleared on the way in and
//!   A's is zero, so the missing product is exactly 0 · 0, whatever x[i + 1] holds (an inf
//!   there cannot leak in). conv2's 5x5 filter is 15 pair steps per input channel instead of
//!   25 FMA steps.
//! - **the GEMM** ([`gemm_bf16`], [`gemm_amx`]): A and B packed by pairs of consecutive k
//!   ([`PairPanels`], [`PairRows`], [`PairRowsA`]; for an odd K the last pair's high halves
//!   are zero in both): the input gradient's `wᵀ · dy` by pairs of output channels, and the
//!   linear layers.
//!
//! Products of bf16 values are exact in f32; both engines add a lane's two products one
//! after the other, rounding to nearest even, with subnormals read and written as zero
//! (their fixed DAZ/FTZ), and sum over k in order ([`PairWindows::block`] pairs from zero
//! in the registers, then into the running total, on `vdpbf16ps`; all pairs in one chain on
//! AMX). Deterministic; the results differ from the f32 products' in the last bits. There is
//! no portable version: a CPU without AVX512-BF16 widens bf16 and runs the f32 engines
//! (`mod.rs`' `pair_bits` and `bf16_bits` decide for the convolutions and linear layers).

use super::isa::isa;
use super::microkernel::{c_fits, clear, pack_panels, MR};

#[cfg(target_arch = "x86_64")]
use super::engine::{amx, vdpbf16ps};

/// A word of two bf16 values: `lo` in the low half, `hi` in the high half.
pub(super) fn word(lo: u16, hi: u16) -> u32 {
    u32::from(lo) | u32::from(hi) << 16
}

/// Pair p of row i of a matrix `depth` long whose element (i, k) is `at(i, k)` (bf16 bits):
/// `at(i, 2p)` low, `at(i, 2p + 1)` high (zero past the depth).
fn pair_word(at: impl Fn(usize, usize) -> u16, depth: usize, (i, p): (usize, usize)) -> u32 {
    let hi = (2 * p + 1 < depth).then(|| at(i, 2 * p + 1));
    word(at(i, 2 * p), hi.unwrap_or(0))
}

/// How [`pairs`] groups the steps of k: `first` is the step's index and `offset` its offset;
/// `paired` says that step `first + 1`, at `offset + 1`, comes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pair {
    pub(super) first: usize,
    pub(super) offset: usize,
    pub(super) paired: bool,
}

impl Pair {
    /// The pair's word from a row of A (bf16 bit patterns, the steps in order): `row[first]`
    /// low, `row[first + 1]` high for a pair, zero high for a single.
    fn word_of(&self, row: &[u16]) -> u32 {
        let hi = if self.paired { row[self.first + 1] } else { 0 };
        word(row[self.first], hi)
    }
}

/// Groups `steps` (offsets) into pairs of consecutive steps at adjacent offsets, in order; a
/// step whose successor is not adjacent stays single.
pub(super) fn pairs(steps: &[usize]) -> Vec<Pair> {
    let mut out = Vec::with_capacity(steps.len().div_ceil(2));
    let mut k = 0;
    while k < steps.len() {
        let paired = k + 1 < steps.len() && steps[k + 1] == steps[k] + 1;
        out.push(Pair {
            first: k,
            offset: steps[k],
            paired,
        });
        k += 1 + usize::from(paired);
    }
    out
}

/// x as overlapping pairs: element i is bf16 `x[i]` in its low half and `x[i + 1]` in its
/// high half (zero past the end). The buffer is kept between calls.
#[derive(Default)]
pub(super) struct PairImage {
    data: Vec<u32>,
}

impl PairImage {
    /// Builds the pairs of `x` (bf16 bit patterns), sixteen per step with AVX-512.
    pub(super) fn build(&mut self, x: &[u16]) -> &[u32] {
        self.data.clear();
        self.data.resize(x.len(), 0);
        #[cfg(target_arch = "x86_64")]
        if isa().avx512 {
            // SAFETY: AVX-512 F and BW were detected; data holds x.len() words.
            unsafe { vdpbf16ps::pair_image(x, &mut self.data) };
            return &self.data;
        }
        for (i, w) in self.data.iter_mut().enumerate() {
            *w = word(x[i], x.get(i + 1).copied().unwrap_or(0));
        }
        &self.data
    }
}

/// The window product's X read from the pair image: step pair p of row r is
/// `src[rows[r] + pairs[p].offset]`.
pub(super) struct PairWindows<'a> {
    /// The images as pairs ([`PairImage`]).
    pub(super) src: &'a [u32],
    /// One offset per value of r.
    pub(super) rows: &'a [usize],
    /// The steps of k grouped by [`pairs`], as A was packed.
    pub(super) pairs: &'a [Pair],
    /// Pairs summed in the registers from zero before they join the running total
    /// (blocked summation, as the lanes' `LaneWindows::block` counts taps; `vdpbf16ps`
    /// only).
    pub(super) block: usize,
}

impl PairWindows<'_> {
    /// Asserts that every window lies inside the images.
    fn assert_inside(&self) {
        let farthest = self.pairs.iter().map(|p| p.offset).max();
        if let (Some(r), Some(s)) = (self.rows.iter().max(), farthest) {
            assert!(r + s < self.src.len(), "a window lies outside the images");
            assert!(i32::try_from(*r).is_ok(), "an offset beyond i32");
        }
    }
}

/// Output channels per chunk of the `vdpbf16ps` window product's A: four 16-lane vectors.
pub(super) const CHUNK: usize = 64;

/// A bf16 operand of the window product (the filter of the forward, dy of the filter
/// gradient), packed for the engine this CPU multiplies pairs on.
pub(super) enum PairOperand {
    /// For `vdpbf16ps`: `[chunk of 64 rows][pair][64]` words, so one 512-bit load gives 16
    /// rows' pairs, zero-padded past the last row.
    Vdpbf16ps { data: Vec<u32>, rows: usize },
    /// For AMX ([`PairRowsA`]).
    Amx(PairRowsA),
}

impl Default for PairOperand {
    /// An empty operand for the engine in use (AMX where [`isa`] enabled it).
    fn default() -> Self {
        match isa().amx {
            true => PairOperand::Amx(PairRowsA::default()),
            false => PairOperand::Vdpbf16ps {
                data: Vec::new(),
                rows: 0,
            },
        }
    }
}

impl PairOperand {
    /// Packs `rows` rows of `src` (row o at `o·ld`, bf16 bit patterns) by `pairs`.
    ///
    /// # Panics
    /// If an element lies outside `src`.
    pub(super) fn pack(&mut self, src: &[u16], rows: usize, ld: usize, pairs: &[Pair]) {
        // The steps the pairs cover: the depth of A's rows.
        let depth = pairs
            .last()
            .map_or(0, |p| p.first + 1 + usize::from(p.paired));
        if rows > 0 && depth > 0 {
            assert!(
                depth <= ld && (rows - 1) * ld + depth <= src.len(),
                "A outside its slice"
            );
        }
        let word = |o: usize, p: usize| pairs[p].word_of(&src[o * ld..]);
        match self {
            PairOperand::Amx(a) => a.pack_with(rows, pairs.len(), word),
            PairOperand::Vdpbf16ps { data, rows: n } => {
                *n = rows;
                data.clear();
                data.resize(rows.div_ceil(CHUNK) * pairs.len() * CHUNK, 0);
                for (chunk, packed) in data.chunks_exact_mut(pairs.len() * CHUNK).enumerate() {
                    for o in 0..CHUNK.min(rows - chunk * CHUNK) {
                        for p in 0..pairs.len() {
                            packed[p * CHUNK + o] = word(chunk * CHUNK + o, p);
                        }
                    }
                }
            }
        }
    }

    /// `C[o][r] = Σ_p A[o][p] · X[r][p]` (or `+=` when `accumulate`) for every row o of the
    /// operand and `r < x.rows.len()`, C's rows at stride `ldc`.
    ///
    /// # Panics
    /// If the CPU lacks the engine, the pairs do not match the operand's, an offset lies
    /// outside `x.src` (or beyond `i32`), or C is too short.
    pub(super) fn product(&self, x: &PairWindows, c: &mut [f32], ldc: usize, accumulate: bool) {
        let rows = match self {
            PairOperand::Amx(a) => a.rows,
            PairOperand::Vdpbf16ps { rows, .. } => *rows,
        };
        if !c_fits(c, (rows, x.rows.len()), ldc) {
            return;
        }
        x.assert_inside();
        match self {
            PairOperand::Amx(a) => {
                assert_eq!(x.pairs.len(), a.pairs, "pairs do not match A's");
                assert!(isa().amx, "the AMX window product needs AMX (isa().amx)");
                let n = x.rows.len();
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AMX is enabled for this process (asserted), with AVX-512 (which
                // `Isa::amx` requires); the bounds the gathers rely on were asserted above,
                // and each panel is filled for its own columns.
                unsafe {
                    amx::product(
                        a,
                        n,
                        |r0, b| amx::gather_panel(x, r0, b),
                        c,
                        ldc,
                        accumulate,
                    )
                };
                #[cfg(not(target_arch = "x86_64"))]
                unreachable!("AMX is x86-64 only: {n}");
            }
            PairOperand::Vdpbf16ps { data, rows } => {
                assert!(
                    isa().avx512_bf16,
                    "the vdpbf16ps window product needs AVX512-BF16"
                );
                if x.pairs.is_empty() {
                    return clear(c, (*rows, x.rows.len()), ldc, accumulate);
                }
                assert_eq!(data.len(), rows.div_ceil(CHUNK) * x.pairs.len() * CHUNK);
                for (chunk, packed) in data.chunks_exact(x.pairs.len() * CHUNK).enumerate() {
                    let width = CHUNK.min(rows - chunk * CHUNK);
                    let c = &mut c[chunk * CHUNK * ldc..];
                    match width.div_ceil(16) {
                        1 => window_tiles::<1, 24>(x, packed, width, c, ldc, accumulate),
                        2 => window_tiles::<2, 12>(x, packed, width, c, ldc, accumulate),
                        3 => window_tiles::<3, 8>(x, packed, width, c, ldc, accumulate),
                        _ => window_tiles::<4, 6>(x, packed, width, c, ldc, accumulate),
                    }
                }
            }
        }
    }
}

/// One chunk of the `vdpbf16ps` operand (`width` ≤ 64 rows, V vectors) against every value
/// of r, R at a time: R values of r by V vectors of 16 rows, each pair step one load of A
/// per vector and one broadcast per value of r into R·V `vdpbf16ps`. Past the last r the
/// last offset repeats (always inside x) and those sums are dropped.
fn window_tiles<const V: usize, const R: usize>(
    x: &PairWindows,
    packed: &[u32],
    width: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    let mut out = [[0.0f32; CHUNK]; R];
    let (block, n) = (x.block.max(1), x.rows.len());
    for r0 in (0..n).step_by(R) {
        let bases: [usize; R] = std::array::from_fn(|i| x.rows[(r0 + i).min(n - 1)]);
        for (b, pairs) in x.pairs.chunks(block).enumerate() {
            let w = &packed[b * block * CHUNK..];
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the product asserted AVX512-BF16 (with AVX-512 F, VL, BW, DQ) and
            // every bases[i] + pairs[p].offset inside src; A holds a row of 64 per pair.
            unsafe {
                vdpbf16ps::window_tile::<V, R>(x.src, &bases, pairs, w, &mut out, b > 0)
            };
            #[cfg(not(target_arch = "x86_64"))]
            unreachable!("AVX512-BF16 is x86-64 only: {w:?} {pairs:?} {bases:?}");
        }
        let count = R.min(n - r0);
        for (o, c_row) in c.chunks_mut(ldc).take(width).enumerate() {
            for (dst, sums) in c_row[r0..r0 + count].iter_mut().zip(&out) {
                *dst = if accumulate { *dst + sums[o] } else { sums[o] };
            }
        }
    }
}

/// Rows (and columns) of C per AMX block: two tiles of 16.
pub(super) const AMX_BLOCK: usize = 32;
/// Pairs per AMX tile step.
pub(super) const AMX_STEP: usize = 16;

/// A (`rows x pairs` words) in panels of [`AMX_BLOCK`] rows for AMX, each row padded to whole
/// steps of [`AMX_STEP`] pairs and the last panel to whole rows with zero words. The buffer
/// is kept between calls.
#[derive(Default)]
pub(super) struct PairRowsA {
    pub(super) data: Vec<u32>,
    pub(super) rows: usize,
    pub(super) pairs: usize,
    /// Words per row: `pairs` rounded up to a multiple of [`AMX_STEP`].
    pub(super) ld: usize,
}

impl PairRowsA {
    /// Packs the `rows x depth` matrix whose element (i, k) is `at(i, k)` (bf16 bits) by
    /// pairs of consecutive k.
    pub(super) fn pack(&mut self, rows: usize, depth: usize, at: impl Fn(usize, usize) -> u16) {
        let word = |i, p| pair_word(&at, depth, (i, p));
        self.pack_with(rows, depth.div_ceil(2), word);
    }

    /// Packs `A[i][p] = word(i, p)` for `rows x pairs` words.
    pub(super) fn pack_with(
        &mut self,
        rows: usize,
        pairs: usize,
        word: impl Fn(usize, usize) -> u32,
    ) {
        self.rows = rows;
        self.pairs = pairs;
        self.ld = pairs.div_ceil(AMX_STEP) * AMX_STEP;
        self.data.clear();
        self.data
            .resize(rows.div_ceil(AMX_BLOCK) * AMX_BLOCK * self.ld, 0);
        if pairs == 0 {
            return;
        }
        for (i, packed) in self.data.chunks_exact_mut(self.ld).take(rows).enumerate() {
            for (p, w) in packed[..pairs].iter_mut().enumerate() {
                *w = word(i, p);
            }
        }
    }
}

/// The GEMM's A (`rows x depth` bf16) packed by pairs of k into panels of [`MR`] rows,
/// `[panel][pair][row]`. The buffer is kept between calls.
#[derive(Default)]
pub(super) struct PairPanels {
    data: Vec<u32>,
    rows: usize,
    pairs: usize,
}

impl PairPanels {
    /// Packs the `rows x depth` matrix whose element (i, k) is `at(i, k)` (a bf16 bit
    /// pattern).
    pub(super) fn pack(&mut self, rows: usize, depth: usize, at: impl Fn(usize, usize) -> u16) {
        (self.rows, self.pairs) = (rows, depth.div_ceil(2));
        pack_panels(&mut self.data, (rows, self.pairs), |i, p| {
            pair_word(&at, depth, (i, p))
        });
    }

    /// Packs the `rows x depth` bf16 matrix (bit patterns) whose element (i, k) is
    /// `src[i·rs + k·cs]`.
    ///
    /// # Panics
    /// If an element lies outside `src`.
    pub(super) fn pack_bits(
        &mut self,
        src: &[u16],
        rows: usize,
        depth: usize,
        (rs, cs): (usize, usize),
    ) {
        if rows > 0 && depth > 0 {
            assert!(
                (rows - 1) * rs + (depth - 1) * cs < src.len(),
                "A outside its slice"
            );
        }
        self.pack(rows, depth, |i, k| src[i * rs + k * cs]);
    }
}

/// The GEMM's B (`depth x cols` bf16) packed as rows of pairs of k, `[pair][column]`, each
/// row padded with zeros to whole vectors of 16. The buffer is kept between calls.
#[derive(Default)]
pub(super) struct PairRows {
    pub(super) data: Vec<u32>,
    pub(super) cols: usize,
    /// Words per row.
    pub(super) ld: usize,
    pub(super) pairs: usize,
}

impl PairRows {
    /// Packs the `depth x cols` matrix whose element (k, j) is `at(k, j)` (a bf16 bit
    /// pattern).
    pub(super) fn pack(&mut self, depth: usize, cols: usize, at: impl Fn(usize, usize) -> u16) {
        self.reset(depth, cols);
        let (pairs, ld) = (self.pairs, self.ld);
        for p in 0..pairs {
            for (j, w) in self.data[p * ld..p * ld + cols].iter_mut().enumerate() {
                *w = pair_word(|j, k| at(k, j), depth, (j, p));
            }
        }
    }

    /// Packs the `depth x cols` bf16 matrix (bit patterns) whose element (k, j) is
    /// `src[k·rs + j·cs]`; with contiguous rows (`cs == 1`) two rows are interleaved sixteen
    /// columns per step.
    ///
    /// # Panics
    /// If the CPU lacks AVX512-BF16 or an element lies outside `src`.
    pub(super) fn pack_bits(
        &mut self,
        src: &[u16],
        depth: usize,
        cols: usize,
        (rs, cs): (usize, usize),
    ) {
        if depth > 0 && cols > 0 {
            assert!(
                (depth - 1) * rs + (cols - 1) * cs < src.len(),
                "B outside its slice"
            );
        }
        if cs != 1 {
            return self.pack(depth, cols, |k, j| src[k * rs + j * cs]);
        }
        #[cfg(target_arch = "x86_64")]
        self.interleave(src, depth, cols, rs, vdpbf16ps::pair_row_bits);
    }

    /// Packs the `depth x cols` f32 matrix `src` (rows at stride `ld`) rounded to bf16 (to
    /// nearest even, as `vcvtneps2bf16` does: subnormal inputs become zero, which the product
    /// would read as zero anyway, and a NaN stays a NaN), sixteen columns per step.
    ///
    /// # Panics
    /// If the CPU lacks AVX512-BF16 or an element lies outside `src`.
    pub(super) fn pack_f32(&mut self, src: &[f32], depth: usize, cols: usize, ld: usize) {
        if depth > 0 && cols > 0 {
            assert!(
                cols <= ld && (depth - 1) * ld + cols <= src.len(),
                "B outside its slice"
            );
        }
        #[cfg(target_arch = "x86_64")]
        self.interleave(src, depth, cols, ld, vdpbf16ps::pair_row_f32);
    }

    /// Sizes the buffer for `depth x cols` (zeroed) and records the shape.
    fn reset(&mut self, depth: usize, cols: usize) {
        self.cols = cols;
        self.ld = cols.div_ceil(16) * 16;
        self.pairs = depth.div_ceil(2);
        self.data.clear();
        self.data.resize(self.pairs * self.ld, 0);
    }

    /// Packs `depth` contiguous rows of `cols` values at stride `rs`, each pair of rows
    /// interleaved into words by `pair_row` (one of `vdpbf16ps`'s; the callers asserted the
    /// rows' bounds).
    #[cfg(target_arch = "x86_64")]
    fn interleave<S>(
        &mut self,
        src: &[S],
        depth: usize,
        cols: usize,
        rs: usize,
        pair_row: unsafe fn(&[S], Option<&[S]>, &mut [u32]),
    ) {
        assert!(isa().avx512_bf16, "packing B by rows needs AVX512-BF16");
        self.reset(depth, cols);
        if cols == 0 {
            return;
        }
        for p in 0..self.pairs {
            let lo = &src[2 * p * rs..][..cols];
            let hi = (2 * p + 1 < depth).then(|| &src[(2 * p + 1) * rs..][..cols]);
            let row = &mut self.data[p * self.ld..(p + 1) * self.ld];
            // SAFETY: AVX512-BF16 (with AVX-512 F, VL, BW, DQ) asserted; lo and hi hold
            // `cols` values and `row` ⌈cols/16⌉·16 words.
            unsafe { pair_row(lo, hi, row) };
        }
    }
}

/// `C = A·B` (or `C += A·B` when `accumulate`) through `vdpbf16ps`, C's `a.rows` rows at
/// stride `ldc`. The tile is 10 rows x 32 columns, 20 accumulators; each pair step loads two
/// vectors of B and broadcasts ten words of A into 20 `vdpbf16ps`, the work of 40 FMA steps
/// of the f32 tile. Column blocks outside, panels inside: each block of B is reused by every
/// panel from cache.
///
/// # Panics
/// If the CPU lacks AVX512-BF16, A and B were packed with different depths, or C is too
/// short.
pub(super) fn gemm_bf16(a: &PairPanels, b: &PairRows, c: &mut [f32], ldc: usize, accumulate: bool) {
    const NR: usize = 32;
    assert!(isa().avx512_bf16, "gemm_bf16 needs AVX512-BF16");
    assert_eq!(a.pairs, b.pairs, "A and B have different depths");
    let (m, n) = (a.rows, b.cols);
    if !c_fits(c, (m, n), ldc) {
        return;
    }
    if a.pairs == 0 {
        return clear(c, (m, n), ldc, accumulate);
    }
    for j0 in (0..n).step_by(NR) {
        let cols = NR.min(n - j0);
        for (p, panel) in a.data.chunks_exact(a.pairs * MR).enumerate() {
            let rows = MR.min(m - p * MR);
            let c = &mut c[p * MR * ldc + j0..];
            assert!(c.len() >= (rows - 1) * ldc + cols);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX512-BF16 (with AVX-512 F, VL, BW, DQ) asserted above; the panel holds
            // pairs x MR words; each row of B is padded to whole vectors of 16, so it holds
            // 16·⌈cols/16⌉ words from j0 (j0 a multiple of 32 below n); C holds `rows` rows
            // of `cols` from c (asserted).
            unsafe {
                let b = (&b.data[j0..], b.ld);
                let (shape, c) = ((rows, cols), (c, ldc));
                if cols <= 16 {
                    vdpbf16ps::gemm_tile::<1>(panel, b, a.pairs, c, shape, accumulate)
                } else {
                    vdpbf16ps::gemm_tile::<2>(panel, b, a.pairs, c, shape, accumulate)
                }
            };
            #[cfg(not(target_arch = "x86_64"))]
            unreachable!("AVX512-BF16 is x86-64 only: {panel:?} {rows} {cols}");
        }
    }
}

/// `C = A·B` (or `C += A·B` when `accumulate`) on AMX tiles, B packed as rows of pairs
/// ([`PairRows`]: the input gradient's output gradient, by pairs of output channels), C's
/// `a.rows` rows at stride `ldc`.
///
/// # Panics
/// If AMX is not enabled (`isa().amx`), A and B were packed with different depths, or C is
/// too short.
pub(super) fn gemm_amx(a: &PairRowsA, b: &PairRows, c: &mut [f32], ldc: usize, accumulate: bool) {
    assert!(isa().amx, "gemm_amx needs AMX (isa().amx)");
    assert_eq!(a.pairs, b.pairs, "A and B have different depths");
    let n = b.cols;
    if !c_fits(c, (a.rows, n), ldc) {
        return;
    }
    // B's panel for columns r0..r0 + 32: its rows copied, zero past the last column.
    let copy = |r0: usize, panel: &mut [u32]| {
        let width = AMX_BLOCK.min(n - r0);
        for (p, dst) in panel.chunks_exact_mut(AMX_BLOCK).take(b.pairs).enumerate() {
            dst[..width].copy_from_slice(&b.data[p * b.ld + r0..][..width]);
            dst[width..].fill(0);
        }
    };
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AMX is enabled for this process (asserted), with AVX-512.
    unsafe {
        amx::product(a, n, copy, c, ldc, accumulate)
    };
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!(
        "AMX is x86-64 only: {accumulate} {}",
        std::any::type_name_of_val(&copy)
    );
}

#[cfg(test)]
mod tests {
    use half::bf16;
    use rand::Rng;

    use super::super::product_check::{
        check_pair_product, check_product, conv2_pixels, conv2_taps, seeded,
    };
    use super::*;

    /// The pair image's word i is `x[i]` low and `x[i + 1]` high (zero past the end), for
    /// every length from 0 to 40 (ragged vectors) on random bit patterns.
    #[test]
    fn the_pair_image_pairs_each_element_with_the_next() {
        let mut rng = seeded(3);
        let mut image = PairImage::default();
        for n in 0..=40 {
            let x: Vec<u16> = (0..n).map(|_| rng.gen()).collect();
            let want: Vec<u32> = (0..n)
                .map(|i| word(x[i], x.get(i + 1).copied().unwrap_or(0)))
                .collect();
            assert_eq!(image.build(&x), want, "length {n}");
        }
    }

    /// Steps at adjacent offsets pair up, in order; the rest stay single.
    #[test]
    fn steps_pair_where_their_offsets_are_adjacent() {
        let group = |steps: &[usize]| -> Vec<(usize, usize, bool)> {
            pairs(steps)
                .iter()
                .map(|p| (p.first, p.offset, p.paired))
                .collect()
        };
        // A 5-wide filter row, then the next row 13 further on.
        let taps = [0, 1, 2, 3, 4, 13, 14, 15, 16, 17];
        assert_eq!(
            group(&taps),
            [
                (0, 0, true),
                (2, 2, true),
                (4, 4, false),
                (5, 13, true),
                (7, 15, true),
                (9, 17, false)
            ]
        );
        assert_eq!(group(&[7]), [(0, 7, false)]);
        assert!(pairs(&[]).is_empty());
        assert_eq!(group(&[3, 2, 3]), [(0, 3, false), (1, 2, true)]);
    }

    /// The pair engines this CPU has, each with an empty operand: `vdpbf16ps` where it has
    /// AVX512-BF16, AMX where the OS enabled it. Says which it cannot run.
    fn pair_engines() -> Vec<PairOperand> {
        let mut out = Vec::new();
        if isa().avx512_bf16 {
            out.push(PairOperand::Vdpbf16ps {
                data: Vec::new(),
                rows: 0,
            });
        } else {
            println!("this CPU has no AVX512-BF16: the f32 engines serve bf16 here");
        }
        if isa().amx {
            out.push(PairOperand::Amx(PairRowsA::default()));
        } else {
            println!("this CPU (or OS) gives no AMX: the AMX products do not run here");
        }
        out
    }

    /// Each pair engine's window product against a float64 product of the same bf16 values,
    /// for offsets shaped like conv2's forward (5-wide filter rows: pairs and singles) and
    /// filter gradient (9-pixel output rows), offsets that never pair, row counts covering
    /// every tile shape, ragged chunks and panels, r not a multiple of a tile, pair counts
    /// below, at and past a step of 16, overwrite and accumulate, blocks of 3 pairs and one
    /// block; C's padding poisoned; infinities placed right after every single's element
    /// must not leak in.
    #[test]
    fn the_window_products_match_float64() {
        let (taps, pixels) = (conv2_taps(75), conv2_pixels(97));
        let sparse: Vec<usize> = (0..45).map(|i| 2 * i + i / 7).collect();
        let cases: Vec<(usize, &[usize], &[usize])> = vec![
            (50, &pixels, &taps),
            (20, &taps, &pixels),
            (20, &sparse, &taps[..20]),
            (1, &pixels[..7], &taps[..3]),
            (16, &taps[..1], &pixels),
            (64, &pixels[..33], &taps[..32]),
            (67, &pixels[..13], &taps[..9]),
            (130, &taps[..31], &pixels[..40]),
        ];
        for mut operand in pair_engines() {
            check_pair_product(12, &cases, |windows, w, (rows, ld), c, ldc, accumulate| {
                operand.pack(w, rows, ld, windows.pairs);
                operand.product(windows, c, ldc, accumulate);
            });
        }
    }

    /// Each pair engine's GEMM against a float64 product of the same bf16 values: rows and
    /// columns around the tile edges (1, 9, 10, 11, 16, 17, 32, 33, 50, 67, 500), odd and
    /// even depths (0, 1, 2, 17, 49, 50, 128: the last pair a single), conv2's input
    /// gradient (500 taps x 50 channels x 648 pixels), overwrite and accumulate; C's padding
    /// poisoned.
    #[test]
    fn the_pair_gemms_match_float64() {
        let mut rng = seeded(13);
        let bf = |v: f32| bf16::from_f32(v).to_bits();
        let value = |b: u16| f64::from(bf16::from_bits(b).to_f32());
        let cases = [
            (1, 1, 1),
            (10, 32, 2),
            (9, 17, 49),
            (11, 33, 50),
            (16, 16, 0),
            (50, 97, 128),
            (500, 97, 50),
            (33, 31, 17),
            (67, 97, 33),
            (500, 648, 50),
        ];
        for engine in pair_engines() {
            for (m, n, k) in cases {
                let a: Vec<u16> = (0..m * k).map(|_| bf(rng.gen_range(-1.0..1.0))).collect();
                let b: Vec<u16> = (0..k * n).map(|_| bf(rng.gen_range(-1.0..1.0))).collect();
                // B column-major: the packers take any layout.
                let mut pb = PairRows::default();
                pb.pack(k, n, |kk, j| b[j * k + kk]);
                let ldc = n + 3;
                let c0: Vec<f32> = (0..m * ldc).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let term =
                    |i: usize, j: usize, kk: usize| value(a[i * k + kk]) * value(b[j * k + kk]);
                let what = format!("{m} x {n} x {k}");
                check_product(&c0, (m, n, ldc), k, &term, &what, |c, accumulate| {
                    let at = |i: usize, kk: usize| a[i * k + kk];
                    if let PairOperand::Amx(_) = engine {
                        let mut pa = PairRowsA::default();
                        pa.pack(m, k, at);
                        gemm_amx(&pa, &pb, c, ldc, accumulate);
                    } else {
                        let mut pa = PairPanels::default();
                        pa.pack(m, k, at);
                        gemm_bf16(&pa, &pb, c, ldc, accumulate);
                    }
                });
            }
        }
    }

    /// The vectorized packing of B rounds f32 as the scalar conversion does (to nearest even,
    /// ties included) and moves bf16 bits as they are, at widths around the vector edge and
    /// for odd and even depths.
    #[test]
    fn vector_packing_of_b_matches_the_scalar_packing() {
        if !isa().avx512_bf16 {
            println!("this CPU has no AVX512-BF16: B is never packed by rows here");
            return;
        }
        let mut rng = seeded(14);
        for (depth, cols) in [(1, 1), (2, 15), (3, 16), (5, 17), (50, 648)] {
            let ld = cols + 2;
            let mut src: Vec<f32> = (0..depth * ld).map(|_| rng.gen_range(-4.0..4.0)).collect();
            // Ties: exactly halfway between two bf16 values, both parities.
            src[0] = f32::from_bits(0x3f80_8000);
            if src.len() > 1 {
                src[1] = f32::from_bits(0x3f81_8000);
            }
            let bits: Vec<u16> = src.iter().map(|v| bf16::from_f32(*v).to_bits()).collect();
            let mut scalar = PairRows::default();
            scalar.pack(depth, cols, |k, j| bits[k * ld + j]);
            let (mut from_f32, mut from_bits) = (PairRows::default(), PairRows::default());
            from_f32.pack_f32(&src, depth, cols, ld);
            from_bits.pack_bits(&bits, depth, cols, (ld, 1));
            assert_eq!(from_f32.data, scalar.data, "f32, {depth} x {cols}");
            assert_eq!(from_bits.data, scalar.data, "bits, {depth} x {cols}");
        }
    }
}
