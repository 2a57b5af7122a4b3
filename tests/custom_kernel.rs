//! Bring your own kernel: the example's kernel file, built at run time for the emulator, is
//! correct on awkward sizes under every lane order and its two broken variants are caught
//! (the example's own checks, run here so the example cannot rot); a user's mistakes in
//! the file or the launch come back as clear errors naming the file, line and argument.

#[path = "../examples/custom_kernel.rs"]
mod custom_kernel;

use nanoddp::backend::simt::SimtDevice;
use nanoddp::backend::simt_module::{ModuleError, SimtModule};
use nanoddp::backend::{BackendError, KernelArg, LaunchConfig, Memory};

fn expect_nvrtc() -> bool {
    std::env::var("NANODDP_EXPECT_NVRTC").is_ok_and(|v| v == "1")
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn the_example_kernel_is_right_and_its_bugs_are_caught() {
    let found = custom_kernel::run(false).expect("the example's checks pass");
    assert_eq!(found.shapes, 7);
    assert!(
        found.missing_barrier.contains("depends on the lane order")
            || found.missing_barrier.contains("wrong elements"),
        "{}",
        found.missing_barrier
    );
    assert!(
        found.unchecked.contains("MemoryFault") && found.unchecked.contains("past the end"),
        "{}",
        found.unchecked
    );
    if expect_nvrtc() {
        assert!(found.ptx_bytes.is_some(), "NVRTC was expected");
    }
}

fn write_kernel(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("nanoddp-byok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn user_mistakes_give_errors_that_name_the_file_and_the_argument() {
    // A compile error names the user's file and line.
    let bad = write_kernel(
        "bad.cu",
        "#include \"simt.cuh\"\nextern \"C\" __global__ void k(float* x) {\n    x[0] = undeclared;\n}\n",
    );
    match SimtModule::compile(&bad) {
        Err(ModuleError::Compile { log, .. }) => {
            assert!(
                log.contains("bad.cu:3") && log.contains("undeclared"),
                "{log}"
            )
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    let none = write_kernel("none.cu", "__device__ float f(float x) { return x; }\n");
    assert!(matches!(
        SimtModule::compile(&none),
        Err(ModuleError::NoKernels { .. })
    ));
    let two = write_kernel(
        "two.cu",
        "#include \"simt.cuh\"\nextern \"C\" __global__ void k(float* x) {\n    __shared__ float a[4], b[4];\n}\n",
    );
    match SimtModule::compile(&two) {
        Err(ModuleError::Lowering(e)) => assert!(e.contains("two.cu:3"), "{e}"),
        other => panic!("expected a lowering error, got {other:?}"),
    }
    assert!(matches!(
        SimtModule::compile("/nonexistent/k.cu"),
        Err(ModuleError::Read { .. })
    ));

    // Launches are checked against the kernel's own parameter types.
    let ok = write_kernel(
        "scale.cu",
        "#include \"simt.cuh\"\n// x[i] *= a for i < n\nextern \"C\" __global__ void scale(float* x, float a, int n) {\n    \
         SIMT_GRID_STRIDE_LOOP(i, (unsigned long long)n) x[i] *= a;\n}\n\
         extern \"C\" __global__ void diverge(float* x) {\n    if (threadIdx.x < 5) __syncthreads();\n    x[0] = 1.0f;\n}\n",
    );
    let module = SimtModule::compile(&ok).expect("builds");
    let names: Vec<&str> = module.kernels().map(|k| k.name).collect();
    assert_eq!(names, ["scale", "diverge"]);
    let dev = SimtDevice::new(0);
    let mut x = dev.upload(&[1.0f32, 2.0, 3.0]).unwrap();
    // Every launch below passes x (3 elements) or nothing.
    let launch = |name: &str, threads: usize, args: &[KernelArg]| {
        // SAFETY: `scale` touches x[0..n) with n = 3 = x's length; `diverge` touches x[0];
        // the wrong-argument launches are refused before running.
        unsafe { module.launch(&dev, name, LaunchConfig::flat(threads), args) }
    };
    let (scale, two, three) = (KernelArg::F32(-2.5), KernelArg::I32(2), KernelArg::I32(3));
    launch("scale", 3, &[KernelArg::buffer_mut(&mut x), scale, three]).unwrap();
    assert_eq!(dev.download(&x).unwrap(), [-2.5, -5.0, -7.5]);
    let wrong_type = launch("scale", 3, &[KernelArg::buffer_mut(&mut x), two, three]);
    let e = wrong_type.unwrap_err().to_string();
    assert!(e.contains("scale") && e.contains("arg1"), "{e}");
    let too_few = launch("scale", 3, &[KernelArg::buffer_mut(&mut x)]);
    assert!(too_few.is_err());
    let missing = launch("nope", 1, &[]);
    assert!(matches!(missing, Err(BackendError::NoSuchKernel { .. })));
    // A divergent barrier in the user's kernel is reported at the user's line.
    let diverged = launch("diverge", 32, &[KernelArg::buffer_mut(&mut x)]);
    match diverged {
        Err(BackendError::Emulator(e)) => {
            let text = e.to_string();
            assert!(
                text.contains("BarrierDivergence") && text.contains("scale.cu:7"),
                "{text}"
            );
        }
        other => panic!("expected a divergence error, got {other:?}"),
    }
    std::fs::remove_dir_all(bad.parent().unwrap()).unwrap();
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn a_user_kernels_launch_bounds_are_read_and_enforced() {
    let path = write_kernel(
        "bounded.cu",
        "#include \"simt.cuh\"\nextern \"C\" __global__ void __launch_bounds__(64, 2)\n\
         fill(float* x, int n) {\n    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    \
         if (i < n) x[i] = 1.0f;\n}\n",
    );
    let module = SimtModule::compile(&path).expect("builds");
    let sig = module.kernels().next().expect("one kernel");
    assert_eq!(
        (sig.name, sig.line, sig.max_threads, sig.min_blocks),
        ("fill", 2, Some(64), Some(2))
    );
    let dev = SimtDevice::new(0);
    let mut x = dev.alloc_zeros::<f32>(128).unwrap();
    let blocks_of = |threads: u32| LaunchConfig {
        grid: (128 / threads, 1, 1),
        block: (threads, 1, 1),
        shared_bytes: 0,
    };
    // SAFETY: one block of 128 threads over 128 floats, had it run.
    let refused = unsafe {
        module.launch(
            &dev,
            "fill",
            blocks_of(128),
            &[KernelArg::buffer_mut(&mut x), KernelArg::I32(128)],
        )
    };
    let e = refused.expect_err("128 threads > 64").to_string();
    assert!(
        e.contains("fill") && e.contains("128") && e.contains("(64)"),
        "{e}"
    );
    assert_eq!(dev.download(&x).unwrap(), vec![0.0; 128], "nothing ran");
    // SAFETY: two blocks of 64 threads over 128 floats.
    unsafe {
        module.launch(
            &dev,
            "fill",
            blocks_of(64),
            &[KernelArg::buffer_mut(&mut x), KernelArg::I32(128)],
        )
    }
    .expect("within the bounds");
    assert_eq!(dev.download(&x).unwrap(), vec![1.0; 128]);
    // A bound the launch checks cannot read is an error, not a kernel left unchecked.
    let macro_bound = write_kernel(
        "macro_bound.cu",
        "#include \"simt.cuh\"\n#define BLOCK 64\n\
         extern \"C\" __global__ void __launch_bounds__(BLOCK) k(float* x) {}\n",
    );
    match SimtModule::compile(&macro_bound) {
        Err(e @ ModuleError::Declaration { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("macro_bound.cu:3") && text.contains("BLOCK"),
                "{text}"
            );
        }
        other => panic!("expected a declaration error, got {other:?}"),
    }
}

/// The emulator's `__nv_bfloat16` converts as CUDA does: every bf16 bit pattern widens
/// exactly, and f32 narrows by rounding to nearest even (checked against `half::bf16` and,
/// for the ties and the overflow boundary, by hand), NaN to the canonical 0x7fff.
#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn bfloat16_conversions_round_to_nearest_even_over_every_bit_pattern() {
    let path = write_kernel(
        "bf16.cu",
        "#include \"simt.cuh\"\n\
         extern \"C\" __global__ void bf16_convert(const unsigned int* bits, float* wide,\n\
                                                   const float* x, unsigned int* narrow, int n) {\n\
             int i = blockIdx.x * blockDim.x + threadIdx.x;\n\
             if (i >= n) return;\n\
             wide[i] = __bfloat162float(__ushort_as_bfloat16((unsigned short)bits[i]));\n\
             narrow[i] = __bfloat16_as_ushort(__float2bfloat16(x[i]));\n\
         }\n",
    );
    let module = SimtModule::compile(&path).expect("builds");
    let dev = SimtDevice::new(0);
    let bits: Vec<u32> = (0..=u16::MAX as u32).collect();
    // Each bf16 value, the points halfway to its upper neighbour (ties) and just either
    // side of them, and the overflow boundary.
    let mut x: Vec<f32> = Vec::new();
    for &b in &bits {
        let f = f32::from_bits(b << 16);
        let tie = f32::from_bits((b << 16) | 0x8000);
        x.extend([
            f,
            tie,
            f32::from_bits(tie.to_bits() - 1),
            f32::from_bits(tie.to_bits() + 1),
        ]);
    }
    x.extend([f32::MAX, 3.3961776e38, f32::INFINITY, -f32::INFINITY]);
    let n = x.len();
    let mut padded_bits = bits.clone();
    padded_bits.resize(n, 0);
    let d_bits = dev.upload(&padded_bits).unwrap();
    let d_x = dev.upload(&x).unwrap();
    let mut wide = dev.upload(&vec![f32::NAN; n]).unwrap();
    let mut narrow = dev.upload(&vec![0xdead_beef_u32; n]).unwrap();
    let args = [
        KernelArg::buffer(&d_bits),
        KernelArg::buffer_mut(&mut wide),
        KernelArg::buffer(&d_x),
        KernelArg::buffer_mut(&mut narrow),
        KernelArg::I32(n as i32),
    ];
    // SAFETY: one thread per element of the n-element buffers, each touching index i < n.
    unsafe { module.launch(&dev, "bf16_convert", LaunchConfig::flat(n), &args) }.unwrap();
    let wide = dev.download(&wide).unwrap();
    for &b in &bits {
        let want = half::bf16::from_bits(b as u16).to_f32();
        let got = wide[b as usize];
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "bf16 {b:#06x} widened to {got}, want {want}"
        );
    }
    for (v, got) in x.iter().zip(dev.download(&narrow).unwrap()) {
        if v.is_nan() {
            assert_eq!(got, 0x7fff, "NaN {:#010x}", v.to_bits());
            continue;
        }
        let want = half::bf16::from_f32(*v).to_bits() as u32;
        assert_eq!(got, want, "{v:e} ({:#010x}) narrowed", v.to_bits());
    }
    // The reference itself, by hand: a tie goes to the even neighbour, just above it to the
    // upper one, and the largest finite f32 rounds up to inf.
    let narrowed = |v: f32| half::bf16::from_f32(v).to_bits();
    assert_eq!(
        narrowed(f32::from_bits(0x3f80_8000)),
        0x3f80,
        "tie to even (down)"
    );
    assert_eq!(
        narrowed(f32::from_bits(0x3f81_8000)),
        0x3f82,
        "tie to even (up)"
    );
    assert_eq!(
        narrowed(f32::from_bits(0x3f80_8001)),
        0x3f81,
        "above the tie"
    );
    assert_eq!(narrowed(f32::MAX), 0x7f80, "overflow to inf");
}
