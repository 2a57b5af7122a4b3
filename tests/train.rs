//! The trainer end to end on the shipped Fashion-MNIST subset: the loss falls (a broken
//! backward would not get there), replicas stay bitwise identical, 1 and N devices make the
//! same update, runs are reproducible, the SIMT backend (the CUDA kernels) trains like the CPU
//! backend, and bad data and checkpoints give clear errors.

mod common;

use common::cli::{nanoddp, scratch, succeeds, SUBSET};

use nanoddp::backend::cpu::CpuDevice;
use nanoddp::backend::simt::SimtDevice;
use nanoddp::comm::communicator::CommConfig;
use nanoddp::data::{locate, read_images, read_labels, Dataset};
use nanoddp::dtype::DType;
use nanoddp::train::checkpoint::Checkpoint;
use nanoddp::train::{
    checkpoint, from_weights, initial_weights, train, Event, LossScaler, Recipe, TrainConfig,
    TrainError,
};

fn subset() -> Dataset {
    locate::load(&locate::shipped_subset()).expect("the shipped subset loads")
}

fn config(batch: usize, epochs: usize, max_steps: Option<usize>) -> TrainConfig {
    TrainConfig {
        recipe: Recipe::Default,
        epochs,
        batch,
        lr: Recipe::Default.lr(),
        momentum: Recipe::Default.momentum(),
        weight_decay: Recipe::Default.weight_decay(),
        seed: 7,
        shuffle: true,
        max_steps,
        algorithm: None,
        bucket_bytes: 64 << 10,
        stop_after: None,
        precision: DType::F32,
        comm: CommConfig::default(),
        cuda_graph: true,
    }
}

/// Trains and returns (every replica's weights, every step's loss, every epoch's test accuracy).
fn run<D>(
    devices: Vec<D>,
    data: &Dataset,
    cfg: &TrainConfig,
) -> (Vec<Vec<Vec<f32>>>, Vec<f64>, Vec<f64>)
where
    D: nanoddp::comm::transport::CommDevice + nanoddp::backend::Backend + Clone + Send + 'static,
{
    let (mut losses, mut accs) = (Vec::new(), Vec::new());
    let start = from_weights(initial_weights(cfg.recipe, cfg.seed));
    let finals = train(devices, data, start, cfg, |e| {
        match e {
            Event::Step(s) => losses.push(s.loss),
            Event::Epoch(r, _) => accs.push(r.test_acc),
            _ => {}
        }
        Ok::<(), TrainError>(())
    })
    .expect("training runs");
    (finals, losses, accs)
}

#[test]
fn training_on_the_subset_lowers_the_loss_and_learns() {
    let data = subset();
    let (_, losses, accs) = run(vec![CpuDevice::new(); 2], &data, &config(64, 4, None));
    let first = losses[0];
    let last: f64 = losses[losses.len() - 10..].iter().sum::<f64>() / 10.0;
    assert!(first > 2.0, "starts near ln 10: {first}");
    assert!(
        last < 0.8,
        "mean loss of the last 10 of {} steps is {last}",
        losses.len()
    );
    assert!(*accs.last().unwrap() > 0.7, "test accuracy {accs:?}");
}

#[test]
fn replicas_identical_runs_reproducible_and_1_vs_3_devices_agree() {
    let data = subset();
    let cfg = config(48, 1, Some(6));
    let (three, losses3, _) = run(vec![CpuDevice::new(); 3], &data, &cfg);
    for (r, w) in three.iter().enumerate() {
        assert_eq!(
            w, &three[0],
            "replica {r} differs from replica 0 bit for bit"
        );
    }
    let (again, losses_again, _) = run(vec![CpuDevice::new(); 3], &data, &cfg);
    assert_eq!(
        again[0], three[0],
        "same seed, same devices: bitwise identical weights"
    );
    assert_eq!(losses_again, losses3, "and identical losses");
    let (one, losses1, _) = run(vec![CpuDevice::new(); 1], &data, &cfg);
    for (t, (a, b)) in one[0].iter().zip(&three[0]).enumerate() {
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-5 * (1.0 + x.abs()),
                "tensor {t}[{i}]: 1 device {x}, 3 devices {y}"
            );
        }
    }
    for (a, b) in losses1.iter().zip(&losses3) {
        assert!((a - b).abs() < 1e-4, "losses {losses1:?} vs {losses3:?}");
    }
}

#[test]
fn gradient_buckets_overlapping_backward_change_nothing_but_timing() {
    // Every tensor in exactly one bucket, in the order backward finishes them.
    for cap in [0, 1, 4096, 64 << 10, 1 << 30] {
        let buckets = nanoddp::train::gradient_buckets(cap);
        let flat: Vec<usize> = buckets.iter().flatten().copied().collect();
        assert_eq!(
            flat,
            nanoddp::model::BACKWARD_ORDER,
            "cap {cap}: {buckets:?}"
        );
    }
    assert_eq!(nanoddp::train::gradient_buckets(1).len(), 8);
    assert_eq!(nanoddp::train::gradient_buckets(0).len(), 1);
    // One tensor per bucket (each allreduce starts the moment its gradient is written),
    // DDP-sized buckets, and everything after backward: the same sums in the same order, so
    // bitwise identical weights. A bucket reduced before backward finished writing it, or
    // never reduced, would differ (and the replicas would disagree).
    let data = subset();
    let mut results = Vec::new();
    for cap in [0, 1, 64 << 10] {
        let cfg = TrainConfig {
            bucket_bytes: cap,
            ..config(60, 1, Some(5))
        };
        let (mut finals, losses, _) = run(vec![CpuDevice::new(); 3], &data, &cfg);
        for w in &finals {
            assert_eq!(w, &finals[0], "cap {cap}: replicas differ");
        }
        results.push((finals.swap_remove(0), losses));
    }
    assert_eq!(
        results[1], results[0],
        "one tensor per bucket vs no overlap"
    );
    assert_eq!(results[2], results[0], "64 KiB buckets vs no overlap");
}

/// Step losses and the weights after training agree with the CPU backend's to float tolerance.
fn assert_trains_like_the_cpu(
    what: &str,
    got: (&[Vec<Vec<f32>>], &[f64]),
    cpu: (&[Vec<Vec<f32>>], &[f64]),
) {
    let ((weights, losses), (cpu_weights, cpu_losses)) = (got, cpu);
    assert_eq!(losses.len(), cpu_losses.len(), "{what}: steps");
    for (a, b) in losses.iter().zip(cpu_losses) {
        assert!(
            (a - b).abs() < 1e-4,
            "{what}: step losses {losses:?} vs cpu {cpu_losses:?}"
        );
    }
    for (a, b) in weights[0]
        .iter()
        .flatten()
        .zip(cpu_weights[0].iter().flatten())
    {
        assert!(
            (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
            "{what}: weights after training: {a} vs cpu {b}"
        );
    }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn the_simt_backend_trains_like_the_cpu_backend() {
    let mut data = subset();
    data.keep_test_images(32); // the emulator is slow; 32 images prove the evaluation
    let cfg = config(32, 1, Some(3));
    let (simt, losses_simt, _) = run((0..2).map(SimtDevice::new).collect(), &data, &cfg);
    let (cpu, losses_cpu, _) = run(vec![CpuDevice::new(); 2], &data, &cfg);
    assert_trains_like_the_cpu("simt", (&simt, &losses_simt), (&cpu, &losses_cpu));
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn the_cuda_backend_trains_like_the_cpu_on_1_2_and_4_gpus_and_4_ranks_on_one() {
    // On the CPU stand-in for the driver when there is no GPU: lazy streams, the gradients'
    // reduction on its own queue overlapping backward (one tensor per bucket, the most
    // overlap), peer access per allocation kind. Replicas bitwise identical, losses and
    // weights as the CPU backend's to float tolerance.
    let mut data = subset();
    // The stand-in is slow: two steps (the second runs on the weights the first updated) and
    // an evaluation of the first 32 test images prove the path; on the PTX executor, whose
    // pass checks the emitted code, at 4 devices only (every kind of communication) and a
    // batch of 16.
    data.keep_test_images(32);
    let lean = common::on_the_ptx_executor();
    let cfg = TrainConfig {
        bucket_bytes: 1,
        ..config(if lean { 16 } else { 32 }, 1, Some(2))
    };
    // Never none: the stand-in shows 8 GPUs, a real machine at least one. Each placement
    // lists the GPU of every rank; four ranks sharing GPU 0 run the multi-rank path on any
    // machine with a GPU (ranks on one GPU need no peer access).
    let gpus = common::cuda_gpus();
    let placements: Vec<Vec<usize>> = if lean {
        vec![(0..gpus.min(4)).collect()]
    } else {
        [1, 2, 4]
            .into_iter()
            .filter(|&n| n <= gpus)
            .map(|n| (0..n).collect())
            .chain([vec![0; 4]])
            .collect()
    };
    for placement in placements {
        let n = placement.len();
        let devices = placement.iter().map(|&g| common::cuda_device(g)).collect();
        let (cuda, losses_cuda, accs) = run(devices, &data, &cfg);
        for (r, w) in cuda.iter().enumerate() {
            assert_eq!(
                w, &cuda[0],
                "GPUs {placement:?}: replica {r} differs from replica 0"
            );
        }
        let (cpu, losses_cpu, _) = run(vec![CpuDevice::new(); n], &data, &cfg);
        let what = format!("cuda, ranks on GPUs {placement:?}");
        assert_trains_like_the_cpu(&what, (&cuda, &losses_cuda), (&cpu, &losses_cpu));
        assert!(accs.iter().all(|a| a.is_finite() && *a > 0.0), "{accs:?}");
    }
}

#[test]
fn checkpoints_round_trip_and_reject_garbage() {
    let dir = scratch("ckpt");
    let path = dir.join("lenet.safetensors");
    let ckpt = Checkpoint {
        weights: initial_weights(Recipe::Default, 3),
        velocity: Some(initial_weights(Recipe::Default, 4)),
        epoch: 4,
        step: 940,
        loss_scale: Some((32768.0, 1234)),
        settings: config(64, 4, None).run_settings(2, 3000),
    };
    checkpoint::save(&path, &ckpt).unwrap();
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        1,
        "the temporary file is renamed away"
    );
    assert_eq!(checkpoint::load(&path).unwrap(), ckpt);
    // Bitwise reproducible files: the same state saved again gives the same bytes (the
    // metadata would otherwise come out in a random order).
    let first = std::fs::read(&path).unwrap();
    for _ in 0..5 {
        checkpoint::save(&path, &ckpt).unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            first,
            "checkpoint bytes differ"
        );
    }
    std::fs::write(&path, b"not a checkpoint at all").unwrap();
    let e = checkpoint::load(&path).unwrap_err().to_string();
    assert!(
        e.contains("lenet.safetensors") && e.contains("safetensors"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn corrupt_data_files_name_the_file_and_the_problem() {
    let dir = scratch("data");
    let bad = dir.join("truncated-images");
    let mut bytes = vec![0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 28, 0, 0, 0, 28];
    bytes.extend(vec![0u8; 28 * 28 + 5]); // one and a bit images instead of two
    std::fs::write(&bad, &bytes).unwrap();
    let e = read_images(&bad).unwrap_err().to_string();
    assert!(
        e.contains("truncated-images") && e.contains("1568 bytes"),
        "{e}"
    );
    let labels = dir.join("labels");
    std::fs::write(&labels, [0, 0, 8, 1, 0, 0, 0, 3, 1, 12, 2]).unwrap();
    let e = read_labels(&labels, 10).unwrap_err().to_string();
    assert!(e.contains("label 12 at index 1"), "{e}");
    let garbage = dir.join("garbage.gz");
    std::fs::write(&garbage, [0x1f, 0x8b, 1, 2, 3]).unwrap();
    assert!(read_images(&garbage)
        .unwrap_err()
        .to_string()
        .contains("gzip"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_command_line_reports_user_errors_with_exit_code_2() {
    let out = nanoddp()
        .args(["train", "--data", "/nonexistent/folder", "--epochs", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/nonexistent/folder")
            && err.contains("apt-get install dataset-fashion-mnist"),
        "{err}"
    );
    let out = nanoddp()
        .args(["train", "--devices", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = nanoddp()
        .args(["train", "--plot", "x.png"])
        .env(
            "NANODDP_FONT",
            concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Cargo.toml: not a TrueType font"), "{err}");
    let ok = succeeds(nanoddp().args([
        "train",
        "--data",
        SUBSET,
        "--epochs",
        "1",
        "--max-steps",
        "3",
        "--devices",
        "2",
    ]));
    assert!(String::from_utf8_lossy(&ok.stdout).contains("epoch   1"));
}

#[test]
fn a_resumed_run_ends_exactly_where_the_uninterrupted_one_does() {
    for precision in DType::ALL {
        resume_matches(TrainConfig {
            precision,
            ..config(100, 2, None)
        });
    }
    // The loss scaler's progress toward its next doubling survives a checkpoint: 1500
    // clean steps, saved and restored, then 500 more double the scale, as without the stop.
    let mut scaler = LossScaler::new(true);
    for _ in 0..1500 {
        scaler.update(false);
    }
    let (scale, clean) = scaler.state();
    let mut restored = LossScaler::restored(scale, clean);
    for _ in 0..500 {
        restored.update(false);
    }
    assert_eq!(restored.scale, 2.0 * LossScaler::INITIAL);
}

fn resume_matches(cfg: TrainConfig) {
    // 600 training images: two epochs of six shuffled steps, of which the resumed run
    // retraces the last six; 100 test images for the evaluations.
    let mut data = subset();
    data.keep_train_images(600);
    data.keep_test_images(100);
    let (straight, losses, _) = run(vec![CpuDevice::new(); 2], &data, &cfg);
    // Stop after epoch 1, keeping what `--save` would write, then resume for epoch 2.
    let mut saved = None;
    let first = TrainConfig {
        stop_after: Some(1),
        ..cfg
    };
    train(
        vec![CpuDevice::new(); 2],
        &data,
        from_weights(initial_weights(cfg.recipe, cfg.seed)),
        &first,
        |e| {
            if let Event::Epoch(_, state) = e {
                saved = Some(state);
            }
            Ok::<(), TrainError>(())
        },
    )
    .unwrap();
    let saved = saved.expect("epoch 1 checkpoint");
    assert_eq!(saved.epoch, 1);
    assert_eq!(
        saved.loss_scale.is_some(),
        cfg.precision == DType::F16,
        "the loss scale is saved exactly for fp16 runs"
    );
    let mut resumed_losses = Vec::new();
    let resumed = train(vec![CpuDevice::new(); 2], &data, saved, &cfg, |e| {
        if let Event::Step(s) = e {
            resumed_losses.push(s.loss);
        }
        Ok::<(), TrainError>(())
    })
    .unwrap();
    assert_eq!(
        resumed_losses,
        losses[losses.len() - resumed_losses.len()..].to_vec()
    );
    assert_eq!(
        resumed[0], straight[0],
        "{:?}: bitwise identical weights",
        cfg.precision
    );
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn mixed_precision_trains_and_the_loss_scale_backs_off_on_overflow() {
    let data = subset();
    let cfg = TrainConfig {
        precision: DType::F16,
        ..config(64, 3, None)
    };
    let (finals, losses, accs) = run(vec![CpuDevice::new(); 2], &data, &cfg);
    let last: f64 = losses[losses.len() - 10..].iter().sum::<f64>() / 10.0;
    assert!(last < 0.9, "fp16: mean loss of the last 10 steps is {last}");
    assert!(*accs.last().unwrap() > 0.65, "fp16 test accuracy {accs:?}");
    assert_eq!(finals[0], finals[1], "fp16 replicas stay identical");
    // The f16 kernels under the emulator agree with the CPU backend's f16 path.
    let short = TrainConfig {
        precision: DType::F16,
        ..config(32, 1, Some(2))
    };
    let (_, l_simt, _) = run((0..2).map(SimtDevice::new).collect(), &data, &short);
    let (_, l_cpu, _) = run(vec![CpuDevice::new(); 2], &data, &short);
    for (a, b) in l_simt.iter().zip(&l_cpu) {
        assert!(
            (a - b).abs() < 2e-3,
            "fp16 losses simt {l_simt:?} vs cpu {l_cpu:?}"
        );
    }

    let mut s = LossScaler::new(true);
    assert_eq!(s.scale, 65536.0);
    s.update(true);
    assert_eq!(s.scale, 32768.0, "an overflow halves the scale");
    for _ in 0..LossScaler::GROWTH_INTERVAL {
        s.update(false);
    }
    assert_eq!(s.scale, 65536.0, "2000 clean steps double it");
    let off = LossScaler::new(false);
    assert_eq!((off.scale, off.enabled), (1.0, false));
}

/// bf16 trains without loss scaling (every step reports scale 1), its replicas stay
/// identical, the emulator's bf16 kernels agree with the CPU backend's bf16 path, and a step
/// whose gradients are not finite is skipped rather than poisoning the weights.
#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn bf16_trains_without_loss_scaling_and_skips_non_finite_steps() {
    let data = subset();
    let cfg = TrainConfig {
        precision: DType::BF16,
        ..config(64, 3, None)
    };
    let mut scales = Vec::new();
    let start = from_weights(initial_weights(cfg.recipe, cfg.seed));
    let (mut losses, mut accs) = (Vec::new(), Vec::new());
    let finals = train(vec![CpuDevice::new(); 2], &data, start, &cfg, |e| {
        match e {
            Event::Step(s) => {
                losses.push(s.loss);
                scales.push(s.loss_scale);
            }
            Event::Epoch(r, _) => accs.push(r.test_acc),
            _ => {}
        }
        Ok::<(), TrainError>(())
    })
    .expect("training runs");
    assert!(
        scales.iter().all(|s| *s == 1.0),
        "bf16 never scales the loss: {scales:?}"
    );
    let last: f64 = losses[losses.len() - 10..].iter().sum::<f64>() / 10.0;
    assert!(last < 0.9, "bf16: mean loss of the last 10 steps is {last}");
    assert!(*accs.last().unwrap() > 0.65, "bf16 test accuracy {accs:?}");
    assert_eq!(finals[0], finals[1], "bf16 replicas stay identical");

    let short = TrainConfig {
        precision: DType::BF16,
        ..config(32, 1, Some(2))
    };
    let (_, l_simt, _) = run((0..2).map(SimtDevice::new).collect(), &data, &short);
    let (_, l_cpu, _) = run(vec![CpuDevice::new(); 2], &data, &short);
    for (a, b) in l_simt.iter().zip(&l_cpu) {
        assert!(
            (a - b).abs() < 1e-2,
            "bf16 losses simt {l_simt:?} vs cpu {l_cpu:?}"
        );
    }

    // A learning rate that blows the run up: bf16 skips the steps whose gradients are not
    // finite, so the weights stay finite, but the loss shows it, and the run stops at the
    // first step whose loss is not finite or past the divergence bound (on every rank at
    // once), handing out no state.
    let wild = TrainConfig {
        precision: DType::BF16,
        lr: 1e6,
        ..config(64, 1, Some(8))
    };
    let start = from_weights(initial_weights(wild.recipe, wild.seed));
    let (mut losses, mut epochs) = (Vec::new(), 0);
    let stopped = train(vec![CpuDevice::new(); 2], &data, start, &wild, |e| {
        match e {
            Event::Step(s) => losses.push(s.loss),
            Event::Epoch(..) => epochs += 1,
            _ => {}
        }
        Ok::<(), TrainError>(())
    });
    let Err(TrainError::Diverged { step, epoch, .. }) = stopped else {
        panic!("the run must diverge and stop: {stopped:?}, losses {losses:?}");
    };
    assert_eq!((step, epoch, epochs), (losses.len(), 1, 0), "{losses:?}");
    let diverged = |l: f64| !l.is_finite() || l > nanoddp::train::diverged_loss();
    assert!(
        !losses[..step - 1].iter().any(|&l| diverged(l)) && diverged(losses[step - 1]),
        "stopped at the first step whose loss is not finite or past the bound: {losses:?}"
    );
}

/// The points of the SVG polylines drawn in `color` with exactly `n` points.
fn polylines(svg: &str, color: &str, n: usize) -> Vec<Vec<(f64, f64)>> {
    svg.lines()
        .filter(|l| l.starts_with("<polyline") && l.contains(&format!("stroke=\"{color}\"")))
        .filter_map(|l| {
            let pts = l.split("points=\"").nth(1)?.split('"').next()?;
            let p: Vec<(f64, f64)> = pts
                .split_whitespace()
                .map(|xy| {
                    let (x, y) = xy.split_once(',').expect("x,y");
                    (x.parse().unwrap(), y.parse().unwrap())
                })
                .collect();
            (p.len() == n).then_some(p)
        })
        .collect()
}

#[test]
fn the_plot_draws_the_curves_the_metrics_record() {
    let dir = scratch("plot");
    let (svg, png, metrics) = (dir.join("c.svg"), dir.join("c.png"), dir.join("m.jsonl"));
    for plot in [&svg, &png] {
        let out = succeeds(
            nanoddp()
                .args(["train", "--data", SUBSET, "--epochs", "3", "--batch", "500"])
                .args(["--test-images", "200"])
                .args(["--devices", "2", "--plot"])
                .arg(plot)
                .arg("--metrics")
                .arg(&metrics)
                .arg("--overwrite"),
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("(3000 training images / 200 test images)"),
            "--test-images 200 evaluates 200: {stdout}"
        );
    }
    // 3000 images in batches of 500: 6 steps per epoch, 18 in all.
    let records: Vec<serde_json::Value> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let step_loss: Vec<f64> = records
        .iter()
        .filter_map(|r| r.get("loss")?.as_f64())
        .collect();
    let test_acc: Vec<f64> = records
        .iter()
        .filter_map(|r| r.get("test_acc")?.as_f64())
        .collect();
    assert_eq!((step_loss.len(), test_acc.len()), (18, 3));
    let svg = std::fs::read_to_string(&svg).unwrap();
    // Higher values sit higher on the picture (smaller y), pair by pair.
    let agrees = |values: &[f64], points: &[(f64, f64)]| {
        for i in 0..values.len() {
            for j in 0..values.len() {
                if values[i] > values[j] + 1e-3 {
                    assert!(points[i].1 <= points[j].1, "{values:?} drawn as {points:?}");
                }
            }
            if i > 0 {
                assert!(points[i].0 > points[i - 1].0, "x increases: {points:?}");
            }
        }
    };
    let steps = polylines(&svg, "#96B4E6", 18);
    assert_eq!(steps.len(), 1, "one per-step loss curve of 18 points");
    agrees(&step_loss, &steps[0]);
    let test = polylines(&svg, "#D62728", 3);
    assert_eq!(test.len(), 1, "one test-accuracy curve of 3 points");
    agrees(&test_acc, &test[0]);
    // The PNG: the promised size, with test-accuracy red actually painted.
    let decoder = png::Decoder::new(std::fs::File::open(&png).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (1200, 450));
    assert_eq!(info.color_type, png::ColorType::Rgb);
    let red = buf.chunks(3).filter(|p| p == &[214, 39, 40]).count();
    assert!(red > 200, "{red} test-accuracy pixels");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn a_graph_replays_the_streams_steps_bit_for_bit_in_fp32_and_fp16() {
    // 12 training images in batches of 8: a full batch and one of 4 an epoch, three epochs.
    // Each batch shape's step runs from the stream in epoch 1, is captured in epoch 2 and
    // replayed in epoch 3; so is the evaluation's. The same kernels in the same order either
    // way: the same losses, loss scales, test accuracies and weights, bit for bit, graphs on
    // or off. At one rank the step is one graph; at four (on two GPUs, two ranks each) the
    // compute between the step's collectives is, the collectives running between the
    // stretches (8 images: one shape, the stand-in being slow at four ranks).
    let mut data = subset();
    data.train_images.truncate(12);
    data.train_labels.truncate(12);
    data.keep_test_images(8);
    let mut eight = data.clone();
    eight.train_images.truncate(8);
    eight.train_labels.truncate(8);
    // On the stand-in's SIMT executor only (no `cuda` in the name: the PTX pass, which
    // checks the emitted code, has graphs replayed in tests/cuda_standin.rs). fp16 has the
    // loss scale and the overflow flag on the device; bf16's step is fp16's without the
    // scale (the audit test sees its graph launch).
    let cases = [
        (DType::F32, vec![0], &data),
        (DType::F16, vec![0], &data),
        (DType::F32, vec![0, 0, 1, 1], &eight),
    ];
    for (precision, placement, data) in cases {
        let steps = |cuda_graph: bool| {
            let cfg = TrainConfig {
                precision,
                cuda_graph,
                ..config(8, 3, None)
            };
            let devices = placement.iter().map(|&g| common::cuda_device(g)).collect();
            let mut reports = Vec::new();
            let start = from_weights(initial_weights(cfg.recipe, cfg.seed));
            let finals = train(devices, data, start, &cfg, |e| {
                match e {
                    Event::Step(s) => {
                        reports.push((s.step, s.loss.to_bits(), s.lr.to_bits(), s.loss_scale))
                    }
                    // The evaluation's own graphs: captured at the second epoch's.
                    Event::Epoch(r, _) => reports.push((0, r.test_acc.to_bits(), 0, 0.0)),
                    _ => {}
                }
                Ok::<(), TrainError>(())
            })
            .expect("training runs");
            (finals, reports)
        };
        let (graphed, with) = steps(true);
        let (streamed, without) = steps(false);
        let what = format!("{precision} on GPUs {placement:?}");
        let steps = data.train_labels.len().div_ceil(8);
        assert_eq!(
            with.len(),
            3 * (steps + 1),
            "{what}: every step and epoch reported"
        );
        assert_eq!(
            with, without,
            "{what}: losses, rates, loss scales, accuracies"
        );
        assert_eq!(graphed, streamed, "{what}: every replica's weights");
    }
}
