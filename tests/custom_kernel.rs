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
