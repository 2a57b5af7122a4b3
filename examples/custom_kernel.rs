//! Bring your own kernel: test a CUDA kernel of yours on the CPU, under the SIMT emulator.
//!
//! `examples/custom_kernel/transpose.cu` is not part of nanoddp. This program builds it at
//! run time (`SimtModule::compile`), runs it on matrices of awkward sizes under three lane
//! orders, compares every element with a plain Rust transpose, and then shows the emulator
//! catching the two bugs the file's other kernels carry: a missing `__syncthreads` (output
//! depends on the lane order; shared memory was poisoned) and missing bounds checks (a read
//! past the end of the input hits the guard page). With NVRTC present it also compiles the
//! file for a GPU. Run: `cargo run --release --example custom_kernel`.
//!
//! `tests/custom_kernel.rs` runs this same code, so the example cannot rot.

use std::error::Error;
use std::path::{Path, PathBuf};

use nanoddp::backend::nvrtc::{self, Output};
use nanoddp::backend::simt::{same_under_lane_orders, LaneOrder, OrderDependence, SimtDevice};
use nanoddp::backend::simt_module::SimtModule;
use nanoddp::backend::{BackendError, KernelArg, LaunchConfig, Memory};

/// The kernel file, next to this example.
pub fn kernel_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/custom_kernel/transpose.cu")
}

const ORDERS: [LaneOrder; 3] = [
    LaneOrder::Forward,
    LaneOrder::Reverse,
    LaneOrder::Random(0x5eed),
];

/// Runs `kernel` on a `rows x cols` matrix on `dev` and returns the output, which starts
/// poisoned with NaN so that an element the kernel never writes cannot pass for correct.
pub fn transpose(
    module: &SimtModule,
    kernel: &str,
    dev: &SimtDevice,
    input: &[f32],
    rows: usize,
    cols: usize,
) -> Result<Vec<f32>, BackendError> {
    let x = dev.upload(input)?;
    let mut y = dev.upload(&vec![f32::NAN; rows * cols])?;
    let cfg = LaunchConfig {
        grid: (cols.div_ceil(32) as u32, rows.div_ceil(32) as u32, 1),
        block: (32, 8, 1),
        shared_bytes: 0,
    };
    let args = [
        KernelArg::buffer(&x),
        KernelArg::buffer_mut(&mut y),
        KernelArg::I32(rows as i32),
        KernelArg::I32(cols as i32),
    ];
    // SAFETY: `x` holds rows·cols floats and `y` as many; `transpose` stays inside them for
    // any grid (it checks both bounds). The broken variants do not, which is the point: the
    // emulator's guard page turns their overrun into an error.
    unsafe { module.launch(dev, kernel, cfg, &args)? };
    dev.download(&y)
}

/// What the example found.
#[derive(Debug)]
pub struct Findings {
    /// Matrices checked (each under every lane order).
    pub shapes: usize,
    /// The emulator's verdict on the kernel without its barrier.
    pub missing_barrier: String,
    /// The emulator's verdict on the kernel without bounds checks.
    pub unchecked: String,
    /// PTX bytes NVRTC produced for sm_80, when NVRTC is present.
    pub ptx_bytes: Option<usize>,
}

/// Builds, tests and breaks the kernel; prints what happens when `verbose`.
pub fn run(verbose: bool) -> Result<Findings, Box<dyn Error>> {
    let say = |s: String| {
        if verbose {
            println!("{s}");
        }
    };
    let module = SimtModule::compile(kernel_file())?;
    for k in module.kernels() {
        let params: Vec<String> = k.params.iter().map(|p| format!("{:?}", p.kind)).collect();
        say(format!("built {}({})", k.name, params.join(", ")));
    }

    // Correctness: sizes that are not multiples of the 32x32 tile, 1, and primes.
    let shapes = [
        (1, 1),
        (1, 37),
        (37, 1),
        (31, 33),
        (64, 32),
        (97, 13),
        (130, 67),
    ];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for &(rows, cols) in &shapes {
        let input: Vec<f32> = (0..rows * cols)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        let out = same_under_lane_orders(&ORDERS, |dev| {
            transpose(&module, "transpose", dev, &input, rows, cols)
        })?;
        for r in 0..rows {
            for c in 0..cols {
                let (want, got) = (input[r * cols + c], out[c * rows + r]);
                if want.to_bits() != got.to_bits() {
                    return Err(format!("{rows}x{cols}: out[{c}][{r}] = {got}, want {want}").into());
                }
            }
        }
        say(format!(
            "transpose {rows:>3} x {cols:<3}: equal to the reference under {} lane orders",
            ORDERS.len()
        ));
    }

    // Bug 1: no barrier between writing and reading the shared tile.
    let (rows, cols) = (64, 64);
    let input: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
    let missing_barrier = match same_under_lane_orders(&ORDERS, |dev| {
        transpose(
            &module,
            "transpose_missing_barrier",
            dev,
            &input,
            rows,
            cols,
        )
    }) {
        Err(e @ OrderDependence::Differs { .. }) => e.to_string(),
        Err(e) => return Err(format!("missing barrier: unexpected failure {e}").into()),
        Ok(out) => {
            let wrong = (0..rows * cols)
                .filter(|&i| out[(i % cols) * rows + i / cols] != input[i])
                .count();
            if wrong == 0 {
                return Err("the missing barrier went unnoticed".into());
            }
            format!("{wrong} wrong elements (read before written: poisoned shared memory)")
        }
    };
    say(format!(
        "transpose_missing_barrier: caught: {missing_barrier}"
    ));

    // Bug 2: no bounds checks, on a size that is not a multiple of 32.
    let (rows, cols) = (33, 40);
    let input = vec![1.0f32; rows * cols];
    let unchecked = match transpose(
        &module,
        "transpose_unchecked",
        &SimtDevice::new(0),
        &input,
        rows,
        cols,
    ) {
        Err(BackendError::Emulator(e)) => e.to_string(),
        Err(e) => return Err(format!("unchecked: unexpected failure {e}").into()),
        Ok(_) => return Err("the out-of-bounds read went unnoticed".into()),
    };
    say(format!("transpose_unchecked: caught: {unchecked}"));

    // The same file for a GPU, when NVRTC is here.
    let ptx_bytes = if nvrtc::is_available() {
        let ptx = SimtModule::compile_for_gpu(kernel_file(), (8, 0), Output::Ptx)?;
        let text = String::from_utf8_lossy(&ptx);
        for k in module.kernels() {
            if !text.contains(&format!(".entry {}(", k.name)) {
                return Err(format!("NVRTC's PTX lacks .entry {}", k.name).into());
            }
        }
        say(format!(
            "NVRTC: {} bytes of PTX for sm_80 with every kernel's .entry",
            ptx.len()
        ));
        Some(ptx.len())
    } else {
        say("NVRTC not found: GPU compile skipped".into());
        None
    };
    Ok(Findings {
        shapes: shapes.len(),
        missing_barrier,
        unchecked,
        ptx_bytes,
    })
}

#[allow(dead_code)] // the test includes this file as a module and calls `run`
fn main() -> Result<(), Box<dyn Error>> {
    run(true).map(|_| ())
}
