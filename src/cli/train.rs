//! `nanoddp train`: LeNet on Fashion-MNIST, data-parallel over N devices of one backend.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressStyle};
use nanoddp::backend::cpu::CpuDevice;
use nanoddp::backend::cuda::CudaDevice;
use nanoddp::backend::simt::SimtDevice;
use nanoddp::backend::BackendError;
use nanoddp::comm::communicator::CommConfig;
use nanoddp::data::{find_dataset, locate, DataError, Dataset};
use nanoddp::dtype::DType;
use nanoddp::train::{
    check_data, checkpoint, from_weights, initial_weights, test_accuracy, train, Event, Recipe,
    TrainConfig, TrainError,
};

use super::args::{backend_values, check_ranks, counted, AlgoArg, BackendArg, CommArg};
use super::CliError;

/// The recipe on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RecipeArg {
    /// The reference chapter: N(0, 0.01²) init, plain SGD, lr 0.2.
    Chapter,
    /// Ours: He init, momentum 0.9, cosine decay from lr 0.05.
    Default,
}

/// Data order on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ShuffleArg {
    /// Reshuffle every epoch (seeded).
    Epoch,
    /// File order, every epoch (for debugging and cross-checks).
    None,
}

/// A feature turned on or off on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    /// Used where it can be.
    On,
    /// Not used.
    Off,
}

/// Every `train` option.
#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// Devices (model replicas), each taking a shard of every batch.
    #[arg(long, default_value_t = 1)]
    pub devices: usize,
    /// Where the replicas run.
    #[arg(long, default_value = "cpu", value_parser = backend_values([
        "The native CPU backend, one thread per device",
        "The CUDA kernels under the SIMT emulator (slow: for studying the kernels)",
        "GPUs 0..devices; with fewer GPUs than devices the ranks share them round-robin (one \
         GPU runs --devices 4 for real). Without a GPU: \
         LD_LIBRARY_PATH=target/release/cuda-standin runs this path on nanoddp's CPU stand-in \
         for the CUDA driver, slowly",
    ]))]
    pub backend: BackendArg,
    /// Gradient allreduce algorithm.
    #[arg(long, value_enum, default_value_t = AlgoArg::Auto)]
    pub algo: AlgoArg,
    /// local: all devices in this process; mpi: one process per mpirun rank, each driving
    /// --devices local devices (global batch split over processes × devices; needs a build
    /// with --features mpi). With --algo mpi the processes' leaders use MPI's own allreduce.
    #[arg(long, value_enum, default_value_t = CommArg::Local)]
    pub comm: CommArg,
    /// CUDA graphs: on captures each batch shape's training step once (after a first step
    /// run from the stream) and replays it, so the host queues one launch a step instead of
    /// dozens; off runs the same kernels from the stream, step after step. Both give the same
    /// results, bit for bit. At one rank the whole step is one graph; at several, the compute
    /// between the step's collectives is (a graph per stretch: five at the default buckets),
    /// and the collectives run from the stream between them. The CUDA backend only; other
    /// backends ignore it.
    #[arg(long, value_enum, default_value_t = Switch::On)]
    pub cuda_graph: Switch,
    /// Gradient bucket size in KiB: gradients are reduced in buckets (in the order backward
    /// finishes them, as PyTorch DDP does) that start while backward still runs; 0 reduces
    /// everything after backward.
    #[arg(long, default_value_t = 64)]
    pub bucket_kb: usize,
    /// The recipe: the chapter's, or ours (better: see the README).
    #[arg(long, value_enum, default_value_t = RecipeArg::Default)]
    pub recipe: RecipeArg,
    /// Passes over the training set.
    #[arg(long, default_value_t = 10)]
    pub epochs: usize,
    /// Global batch size (split over the devices).
    #[arg(long, default_value_t = 256)]
    pub batch: usize,
    /// Learning rate (default: 0.2 for the chapter recipe, 0.05 for ours).
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f32>,
    /// Momentum (default: 0 for the chapter recipe, 0.9 for ours).
    #[arg(long, allow_negative_numbers = true)]
    pub momentum: Option<f32>,
    /// L2 weight decay (default: 0 for the chapter recipe, 5e-4 for ours).
    #[arg(long, allow_negative_numbers = true)]
    pub weight_decay: Option<f32>,
    /// Seed of the initial weights and the data order.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Data order.
    #[arg(long, value_enum, default_value_t = ShuffleArg::Epoch)]
    pub shuffle: ShuffleArg,
    /// Stop after this many steps.
    #[arg(long)]
    pub max_steps: Option<usize>,
    /// Evaluate each epoch on the first N test images only (default: all of them): quicker
    /// epochs for a smoke run, where the test accuracy then describes those N images.
    #[arg(long, value_name = "N")]
    pub test_images: Option<usize>,
    /// Activation storage: fp32, or fp16 (half activations and weight copies, f32 master
    /// weights, dynamic loss scaling from 2^16).
    #[arg(long, value_enum, default_value_t = DType::F32)]
    pub precision: DType,
    /// Folder with the four IDX(.gz) files (default: $NANODDP_DATA, then
    /// /usr/share/datasets/fashion-mnist, then ./data/fashion-mnist). A folder named here or
    /// in $NANODDP_DATA must hold them: it is never passed over for another.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Write one JSON record per step and per epoch here (JSON lines, each record written
    /// whole or not at all).
    #[arg(long)]
    pub metrics: Option<PathBuf>,
    /// Draw the loss and accuracy curves here after every epoch, as PNG or SVG by the name's
    /// ending (.png, .svg). Text is in the built-in DejaVu Sans, or in the TrueType font
    /// $NANODDP_FONT names.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Save a safetensors checkpoint here after every epoch, atomically, before any other
    /// output of the epoch. An existing file is replaced only if it is a nanoddp checkpoint
    /// (else --overwrite); a run that diverges never saves over it: it stops with exit code
    /// 1 at the first step whose loss is not finite or over 230 (100 times an untrained
    /// model's ln 10). Without --save, a --resume run saves to the checkpoint it resumed.
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Start from the weights in this safetensors checkpoint (a fresh run otherwise).
    #[arg(long, conflicts_with = "resume")]
    pub init: Option<PathBuf>,
    /// Continue the run saved in this checkpoint (weights, momentum, epoch, step): with the
    /// same options it ends exactly where the uninterrupted run would. The checkpoint records
    /// the settings that define its run (devices, batch, epochs, max steps, recipe, lr,
    /// momentum, weight decay, seed, shuffle, precision, training images); a command line that differs in any
    /// is refused, naming it. --metrics keeps the earlier records and appends.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Replace an existing --metrics file, or a --save file that is not a nanoddp
    /// checkpoint (a new run refuses to, so that nothing is lost by accident).
    #[arg(long)]
    pub overwrite: bool,
    /// Seconds a device waits for the others in a collective before the run fails with an
    /// error (a hang always ends in an error). Time the whole process was stopped (Ctrl-Z, kill
    /// -STOP, a paused VM) is not counted.
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true, default_value_t = CommConfig::default().timeout.as_secs_f64())]
    pub timeout: f64,
}

/// `eval` options.
#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// The safetensors checkpoint to evaluate.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Data folder (as for train).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Devices to shard the test set over.
    #[arg(long, default_value_t = 1)]
    pub devices: usize,
    /// Images per forward pass.
    #[arg(long, default_value_t = 256)]
    pub batch: usize,
}

/// Runs `nanoddp eval`.
pub fn eval(out: &mut impl Write, args: EvalArgs) -> Result<(), CliError> {
    check_ranks("--devices", args.devices).map_err(CliError::Input)?;
    if args.batch == 0 {
        return Err(CliError::Input("--batch must be at least 1".into()));
    }
    let ckpt = checkpoint::load(&args.checkpoint)?;
    let data = load_data(args.data.as_deref(), out)?;
    check_data(&data).map_err(|e| CliError::Input(e.to_string()))?;
    let acc = test_accuracy(
        vec![CpuDevice::new(); args.devices],
        &data,
        &ckpt.weights,
        args.batch,
    )?;
    writeln!(
        out,
        "{}: {}, test accuracy {acc:.4} on {}",
        args.checkpoint.display(),
        ckpt.position(),
        counted(data.test_labels.len(), "image", "images")
    )?;
    Ok(())
}

/// The settings a run cannot make sense of, refused before anything starts.
fn check_settings(args: &TrainArgs) -> Result<(), String> {
    check_ranks("--devices", args.devices)?;
    if args.batch == 0 {
        return Err("--batch must be at least 1".into());
    }
    if args.epochs == 0 {
        return Err("--epochs 0 trains nothing: give at least 1".into());
    }
    if args.max_steps == Some(0) {
        return Err(
            "--max-steps 0 trains nothing: give at least 1, or leave it out to train every epoch"
                .into(),
        );
    }
    if args.test_images == Some(0) {
        return Err(
            "--test-images 0 evaluates nothing: give at least 1, or leave it out to evaluate \
             every test image"
                .into(),
        );
    }
    if !(args.timeout.is_finite() && args.timeout > 0.0 && args.timeout <= MAX_TIMEOUT_S) {
        return Err(format!(
            "--timeout {} is out of range: it must be above 0 and at most {MAX_TIMEOUT_S} seconds (a week)",
            args.timeout
        ));
    }
    let range = |name: &str, v: Option<f32>, lo: f32, hi: f32, what: &str| match v {
        Some(v) if !(v.is_finite() && v >= lo && v <= hi) => {
            Err(format!("--{name} {v} is out of range: it must be {what}"))
        }
        _ => Ok(()),
    };
    range(
        "lr",
        args.lr,
        f32::MIN_POSITIVE,
        100.0,
        "above 0 and at most 100",
    )?;
    // Momentum 1 or more makes the velocity grow without bound.
    range(
        "momentum",
        args.momentum,
        0.0,
        0.999,
        "at least 0 and below 1 (at most 0.999)",
    )?;
    range(
        "weight-decay",
        args.weight_decay,
        0.0,
        1.0,
        "between 0 and 1",
    )?;
    Ok(())
}

/// The longest `--timeout`, in seconds.
const MAX_TIMEOUT_S: f64 = 7.0 * 86400.0;

fn load_data(
    explicit: Option<&std::path::Path>,
    out: &mut impl Write,
) -> Result<Dataset, DataError> {
    match find_dataset(explicit) {
        Ok(d) => Ok(d),
        // Only when nobody named a folder: a bad --data or NANODDP_DATA is an error (exit 2).
        Err(e) if locate::named_folder(explicit).is_none() => {
            let subset = locate::shipped_subset();
            // The note is a courtesy: a reader that went away does not stop the run.
            let _ = writeln!(
                out,
                "note: {e}\nnote: training on the small subset shipped in {} instead (3000 training, 1000 test images)",
                subset.display()
            );
            locate::load(&subset)
        }
        Err(e) => Err(e),
    }
}

/// Runs the command.
pub fn run(out: &mut impl Write, args: TrainArgs) -> Result<(), CliError> {
    match args.comm {
        CommArg::Local => {
            args.algo.check_local().map_err(CliError::Input)?;
            run_with(out, args, None)
        }
        #[cfg(feature = "mpi")]
        CommArg::Mpi => {
            let mpi = nanoddp::comm::mpi::Mpi::init().map_err(CliError::Input)?;
            if mpi.rank() == 0 {
                run_with(out, args, Some(&mpi))
            } else {
                // Only rank 0 reports; the others train without printing.
                run_with(&mut std::io::sink(), args, Some(&mpi))
            }
        }
        #[cfg(not(feature = "mpi"))]
        CommArg::Mpi => Err(CliError::Input(super::args::NO_MPI.into())),
    }
}

#[cfg(feature = "mpi")]
type MpiHandle<'a> = Option<&'a nanoddp::comm::mpi::Mpi>;
#[cfg(not(feature = "mpi"))]
type MpiHandle<'a> = Option<&'a std::convert::Infallible>;

/// The name the command line gives a value (`cpu`, `default`, `fp16`, ...).
fn flag_value(v: &impl ValueEnum) -> String {
    v.to_possible_value()
        .map_or_else(|| "?".into(), |p| p.get_name().to_string())
}

/// Everything a run needs, checked before its first step.
struct Prepared {
    cfg: TrainConfig,
    data: Dataset,
    start: checkpoint::Checkpoint,
    /// The metrics file, opened for appending (rank 0 only).
    metrics: Option<super::metrics::Recorder>,
    /// What the --save file held before the run, if it was a nanoddp checkpoint: (epoch,
    /// step).
    saved_before: Option<checkpoint::Position>,
    /// The curves so far (a resumed run's earlier part included).
    curves: super::plot::Curves,
    /// Replicas over all processes.
    ranks: usize,
    /// What a resumed run says before it starts.
    resume_note: Option<String>,
}

/// What `prepare` found: a run to do, or a reason there is nothing to do.
enum Plan {
    Train(Box<Prepared>),
    NothingToDo(String),
}

/// Checks every setting, path and file a run depends on, before any training.
fn prepare(args: &TrainArgs, mpi: MpiHandle<'_>, out: &mut impl Write) -> Result<Plan, CliError> {
    let lead = mpi_rank(mpi) == 0;
    check_settings(args).map_err(CliError::Input)?;
    let saved_before = check_outputs(args)?;
    let recipe = match args.recipe {
        RecipeArg::Chapter => Recipe::Chapter,
        RecipeArg::Default => Recipe::Default,
    };
    let cfg = TrainConfig {
        recipe,
        epochs: args.epochs,
        batch: args.batch,
        lr: args.lr.unwrap_or(recipe.lr()),
        momentum: args.momentum.unwrap_or(recipe.momentum()),
        weight_decay: args.weight_decay.unwrap_or(recipe.weight_decay()),
        seed: args.seed,
        shuffle: args.shuffle == ShuffleArg::Epoch,
        max_steps: args.max_steps,
        algorithm: args.algo.algorithm(),
        stop_after: None,
        precision: args.precision,
        bucket_bytes: args.bucket_kb.saturating_mul(1024),
        comm: CommConfig {
            timeout: Duration::from_secs_f64(args.timeout),
            ..CommConfig::default()
        },
        cuda_graph: args.cuda_graph == Switch::On,
    };
    if args.plot.is_some() {
        super::plot::load_font().map_err(CliError::Input)?;
    }
    let mut data = load_data(args.data.as_deref(), out)?;
    check_data(&data).map_err(|e| CliError::Input(e.to_string()))?;
    if let Some(n) = args.test_images {
        let all = data.test_labels.len();
        if n > all {
            return Err(CliError::Input(format!(
                "--test-images {n}: {} holds {all} test images",
                data.dir.display()
            )));
        }
        data.keep_test_images(n);
    }
    let train_images = data.train_labels.len();
    if train_images == 0 {
        return Err(CliError::Input(format!(
            "{}: the training set has no images",
            data.dir.display()
        )));
    }
    let ranks = args.devices.saturating_mul(mpi_size(mpi));
    if cfg.batch < ranks || cfg.batch > train_images {
        return Err(CliError::Input(format!(
            "--batch {} must be between the number of devices ({ranks}) and the number of \
             training images ({train_images})",
            cfg.batch
        )));
    }
    let steps_per_epoch = train_images.div_ceil(cfg.batch);
    let total_steps = cfg
        .max_steps
        .unwrap_or(usize::MAX)
        .min(steps_per_epoch.saturating_mul(cfg.epochs));
    let mut resume_note = None;
    let start = match (&args.init, &args.resume) {
        (Some(path), _) => from_weights(checkpoint::load(path)?.weights),
        (_, Some(path)) => {
            let ckpt = checkpoint::load(path)?;
            cfg.check_resume(&ckpt, ranks, train_images).map_err(|e| {
                CliError::Input(match e {
                    TrainError::ResumeMismatch { .. } => format!(
                        "--resume {}: {e}: resume with that run's settings, or start a new \
                             run from its weights with --init",
                        path.display()
                    ),
                    e => format!("--resume {}: {e}", path.display()),
                })
            })?;
            if ckpt.step >= total_steps {
                return Ok(Plan::NothingToDo(format!(
                    "nothing to do: {} already took all {} steps of its run; to train on, \
                     start a new run from its weights with --init",
                    path.display(),
                    ckpt.step
                )));
            }
            resume_note = Some(format!(
                "resuming {} at step {} of {total_steps} (epoch {}, {} of its {steps_per_epoch} steps done)",
                path.display(),
                ckpt.step,
                ckpt.step / steps_per_epoch + 1,
                ckpt.step % steps_per_epoch
            ));
            ckpt
        }
        _ => from_weights(initial_weights(recipe, cfg.seed)),
    };
    let (metrics, curves) = match (&args.metrics, lead) {
        (Some(path), true) => {
            let (file, curves) =
                open_metrics(path, args.resume.is_some(), start.step, steps_per_epoch)
                    .map_err(CliError::Input)?;
            let recorder = super::metrics::Recorder::new(file)
                .map_err(|e| CliError::Input(format!("{}: {e}", path.display())))?;
            (Some(recorder), curves)
        }
        _ => (None, super::plot::Curves::default()),
    };
    Ok(Plan::Train(Box::new(Prepared {
        cfg,
        data,
        start,
        metrics,
        saved_before,
        curves,
        ranks,
        resume_note,
    })))
}

/// Checks every file the run writes before any work ([`super::outputs`]): each can be
/// written where it is named, the plot's name gives a format it is drawn in, no two are one
/// file (nor one a checkpoint the run reads, but for --save over the checkpoint it starts
/// from), and --save replaces only a nanoddp checkpoint unless --overwrite says otherwise.
/// Returns where the --save file's checkpoint stood, if there was one.
fn check_outputs(args: &TrainArgs) -> Result<Option<checkpoint::Position>, CliError> {
    use super::outputs::{check_format, check_outputs, Named};
    fn named<'a>(flag: &'static str, path: &'a Option<PathBuf>) -> Option<Named<'a>> {
        path.as_deref().map(|path| Named { flag, path })
    }
    let outputs: Vec<Named<'_>> = [
        named("--save", &args.save),
        named("--metrics", &args.metrics),
        named("--plot", &args.plot),
    ]
    .into_iter()
    .flatten()
    .collect();
    let inputs: Vec<Named<'_>> = [named("--init", &args.init), named("--resume", &args.resume)]
        .into_iter()
        .flatten()
        .collect();
    if let Some(plot) = named("--plot", &args.plot) {
        check_format(plot, &["png", "svg"])?;
    }
    check_outputs(
        &outputs,
        &inputs,
        &[("--save", "--init"), ("--save", "--resume")],
    )?;
    if let (Some(m), None, false) = (&args.metrics, &args.resume, args.overwrite) {
        if std::fs::metadata(m).is_ok_and(|meta| meta.len() > 0) {
            return Err(CliError::Input(format!(
                "{} already holds a run's metrics: continue that run with --resume CHECKPOINT \
                 (its metrics are kept), replace them with --overwrite, or name another file",
                m.display()
            )));
        }
    }
    let Some(save) = &args.save else {
        return Ok(None);
    };
    let before = checkpoint::position(save);
    let occupied = std::fs::metadata(save).is_ok_and(|meta| meta.len() > 0);
    if occupied && before.is_none() && !args.overwrite {
        return Err(CliError::Input(format!(
            "--save {}: the file exists and is not a nanoddp checkpoint: name another file, or \
             replace it with --overwrite",
            save.display()
        )));
    }
    Ok(before)
}

/// Opens the metrics file: empty for a new run; for a resumed one, the earlier run's records
/// up to the checkpoint kept (rewritten atomically without the records after it and any
/// torn last line), then appended to. Returns the file and the curves it holds.
fn open_metrics(
    path: &std::path::Path,
    resumed: bool,
    step: usize,
    steps_per_epoch: usize,
) -> Result<(std::fs::File, super::plot::Curves), String> {
    let open_err = |e: std::io::Error| format!("{}: {e}", path.display());
    if !resumed {
        let file = std::fs::File::create(path).map_err(open_err)?;
        return Ok((file, super::plot::Curves::default()));
    }
    let history = super::metrics::history(path, step, steps_per_epoch)?;
    let mut kept = history.lines.join("\n");
    if !kept.is_empty() {
        kept.push('\n');
    }
    checkpoint::replace_file(path, |_, f| f.write_all(kept.as_bytes()))
        .map_err(|e| e.to_string())?;
    let file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(open_err)?;
    Ok((file, history.curves))
}

fn run_with(out: &mut impl Write, mut args: TrainArgs, mpi: MpiHandle<'_>) -> Result<(), CliError> {
    let lead = mpi_rank(mpi) == 0;
    // From here a Ctrl-C or SIGTERM stops the run at its next step (src/cli/interrupt.rs):
    // a save under way finishes first.
    let interrupts = super::interrupt::Interrupts::watch();
    // Resuming is continuing: without --save, the run goes on saving to the checkpoint it
    // resumed, so that a second interruption loses no more than the first.
    let saves_where_resumed = args.save.is_none()
        && args
            .resume
            .as_deref()
            .is_some_and(|p| checkpoint::position(p).is_some());
    if saves_where_resumed {
        args.save = args.resume.clone();
    }
    let prepared = match prepare(&args, mpi, out)? {
        Plan::Train(p) => *p,
        Plan::NothingToDo(why) => {
            let _ = writeln!(out, "{why}");
            return Ok(());
        }
    };
    let Prepared {
        cfg,
        data,
        start,
        mut metrics,
        saved_before,
        mut curves,
        ranks,
        resume_note,
    } = prepared;
    // Where the run stood at its last save to --save.
    let mut saved = None;
    // The GPUs this process's ranks run on. No GPU is the command line's problem: exit code 2.
    let gpus = match args.backend {
        BackendArg::Cuda => {
            let (node_rank, node_size) = mpi_node_slot(mpi);
            let visible = nanoddp::backend::cuda::device_count().map_err(CliError::Device)?;
            Some(
                mpi_gpu_ordinals(node_rank, node_size, args.devices, visible)
                    .map_err(CliError::Input)?,
            )
        }
        BackendArg::Simt if !nanoddp::backend::simt::EMULATOR_BUILT => {
            return Err(CliError::Device(BackendError::NoEmulator));
        }
        _ => None,
    };
    // Printing is a courtesy: a reader that went away (`| head -1`) ends the printing, not
    // the run; the epochs still train and the checkpoints are still written.
    let _ = writeln!(
        out,
        "LeNet on {} ({} / {}): {ranks} {} device{}{}, batch {}, {} epoch{}, \
         recipe {} (lr {}, momentum {}, weight decay {}), precision {}, allreduce {}, seed {}, \
         collective timeout {} s",
        data.dir.display(),
        counted(data.train_labels.len(), "training image", "training images"),
        counted(data.test_labels.len(), "test image", "test images"),
        flag_value(&args.backend),
        if ranks == 1 { "" } else { "s" },
        match (&gpus, mpi_size(mpi)) {
            (Some(g), 1) => format!(" ({})", placement(g)),
            (Some(g), _) => format!(" (this process's {})", placement(g)),
            _ => String::new(),
        },
        cfg.batch,
        cfg.epochs,
        if cfg.epochs == 1 { "" } else { "s" },
        flag_value(&args.recipe),
        cfg.lr,
        cfg.momentum,
        cfg.weight_decay,
        flag_value(&args.precision),
        flag_value(&args.algo),
        cfg.seed,
        args.timeout
    );
    if let Some(note) = &resume_note {
        let _ = writeln!(out, "{note}");
    }
    if let (true, Some(path)) = (saves_where_resumed, &args.save) {
        let _ = writeln!(
            out,
            "saving to {} after every epoch (--resume without --save goes on saving where it \
             resumed)",
            path.display()
        );
    }
    let _ = out.flush();
    // Files are written by rank 0 alone (they may be on a shared file system).
    let (plot_path, save_path) = if lead {
        (args.plot.clone(), args.save.clone())
    } else {
        (None, None)
    };
    let steps_per_epoch = data.train_labels.len().div_ceil(cfg.batch) as u64;
    let bar = if lead {
        ProgressBar::new(steps_per_epoch)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} {msg} ({eta} left)")
            .map_err(|e| CliError::Running(e.to_string()))?
            .progress_chars("=> "),
    );
    // The last step the run reported.
    let mut last_step = start.step;
    let mut on_event = |event: Event| -> Result<(), TrainError> {
        let metrics_failed = |source: std::io::Error| TrainError::Io {
            what: format!(
                "the metrics to {}",
                args.metrics.as_deref().unwrap_or(Path::new("")).display()
            ),
            source,
        };
        match event {
            Event::Step(s) => {
                last_step = s.step;
                if bar.length() != Some(steps_per_epoch) {
                    bar.set_length(steps_per_epoch);
                    bar.reset_eta();
                }
                bar.set_prefix(s.epoch.to_string());
                bar.set_position(((s.step - 1) as u64 % steps_per_epoch) + 1);
                bar.set_message(format!("steps, loss {:.4}", s.loss));
                curves
                    .step_loss
                    .push((s.step as f64 / steps_per_epoch as f64, s.loss));
                if let Some(m) = metrics.as_mut() {
                    m.write(&super::metrics::step_record(&s))
                        .map_err(metrics_failed)?;
                }
            }
            Event::Evaluating { done, total } => {
                // The same bar counts the test images while the epoch's evaluation runs.
                if bar.length() != Some(total as u64) {
                    bar.set_length(total as u64);
                    bar.reset_eta();
                }
                bar.set_position(done as u64);
                bar.set_message("test images evaluated");
            }
            Event::Epoch(e, state) => {
                // The library hands out only finite states (a diverged run stops with an
                // error at the step it shows), so this one may replace the last checkpoint.
                // It is written first: no other output's failure can cost it.
                if let Some(path) = &save_path {
                    checkpoint::save(path, &state)?;
                    saved = Some(state.position());
                }
                let line = format!(
                    "epoch {:>3}{}  loss {:.4}  train acc {:.4}  test acc {:.4}  {:.1} s  {:.0} img/s  allreduce {:.1}%",
                    e.epoch,
                    if e.complete { "" } else { " (part)" },
                    e.train_loss,
                    e.train_acc,
                    e.test_acc,
                    e.seconds,
                    e.images_per_s,
                    100.0 * e.allreduce_share
                );
                // The bar steps aside for the line, then starts over for the next epoch.
                bar.suspend(|| {
                    let mut stdout = std::io::stdout().lock();
                    let _ = writeln!(stdout, "{line}");
                    let _ = stdout.flush();
                });
                bar.set_length(steps_per_epoch);
                bar.reset();
                if let Some(m) = metrics.as_mut() {
                    m.write(&super::metrics::epoch_record(&e))
                        .map_err(metrics_failed)?;
                }
                curves.epochs.push(super::plot::EpochPoint {
                    at: e.step as f64 / steps_per_epoch as f64,
                    complete: e.complete,
                    train_loss: e.train_loss,
                    train_acc: e.train_acc,
                    test_acc: e.test_acc,
                });
                if let Some(path) = &plot_path {
                    super::plot::draw(path, &curves).map_err(|e| TrainError::Handler(e.into()))?;
                }
            }
            _ => {}
        }
        // A signal stops the run after the event is handled: an epoch that ended is still
        // saved, and a save under way finishes.
        interrupts
            .check()
            .map_err(|e| TrainError::Handler(Box::new(e)))
    };
    let n = args.devices;
    let run = Run {
        data: &data,
        cfg: &cfg,
        mpi,
        algo: args.algo,
    };
    let trained = match args.backend {
        BackendArg::Cpu => run.go(vec![CpuDevice::new(); n], start, &mut on_event),
        BackendArg::Simt => run.go((0..n).map(SimtDevice::new).collect(), start, &mut on_event),
        BackendArg::Cuda => {
            let devices = gpus
                .iter()
                .flatten()
                .map(|&ordinal| CudaDevice::new(ordinal))
                .collect::<Result<Vec<_>, _>>()
                .map_err(CliError::Device)?;
            run.go(devices, start, &mut on_event)
        }
    };
    bar.finish_and_clear();
    // What the --save file holds now, truly: said whenever the run ends early.
    let kept = match (&save_path, saved, saved_before) {
        (None, ..) if args.save.is_some() => "rank 0 writes the checkpoint".to_string(),
        (None, ..) => "no checkpoint was written (no --save)".to_string(),
        (Some(path), Some(at), _) => {
            format!("{} holds the last good state: {at}", path.display())
        }
        (Some(path), None, Some(at)) => format!("{} is as it was: {at}", path.display()),
        (Some(path), None, None) => format!("nothing was saved to {}", path.display()),
    };
    match trained {
        Ok(_) => Ok(()),
        Err(TrainError::Comm(e)) if e.is_timeout() => Err(CliError::Running(format!(
            "{e}\nthe devices waited over --timeout ({} s) for each other. A stopped \
                 process's pause is not counted, but a peer process stopped on its own, a \
                 loaded machine or a slow first step are: raise --timeout if that was it; \
                 with --save, --resume continues from the last checkpoint",
            args.timeout
        ))),
        Err(e @ TrainError::Diverged { .. }) => Err(CliError::Running(format!(
            "{e}; {kept}{}",
            match (&save_path, saved.or(saved_before)) {
                (Some(_), Some(_)) => "; start again from it with --init and a lower --lr",
                _ => "; lower --lr",
            }
        ))),
        Err(TrainError::Handler(e)) if e.is::<super::interrupt::Interrupted>() => {
            // The guard found it: the fallback is never taken.
            let signal = e
                .downcast_ref::<super::interrupt::Interrupted>()
                .map_or(0, |i| i.signal);
            // The run can go on from --save if it holds this run's state: one it saved, or
            // the checkpoint it resumed.
            let resumable = match (&save_path, saved, &args.resume) {
                (Some(path), Some(_), _) => Some(path),
                (Some(path), None, Some(resumed)) if path == resumed => Some(path),
                _ => None,
            };
            let next = match resumable {
                Some(path) => format!(
                    "continue with: {}",
                    super::interrupt::continue_command(std::env::args_os(), path.as_os_str())
                ),
                None if save_path.is_some() => {
                    "nothing of this run was saved: the same command starts it again".into()
                }
                None => "the same command starts it again; with --save FILE a run can be \
                         continued"
                    .into(),
            };
            Err(CliError::Interrupted {
                signal,
                message: format!("{e} after step {last_step}; {kept}; {next}"),
            })
        }
        Err(e @ (TrainError::Io { .. } | TrainError::Handler(_))) => {
            Err(CliError::Running(format!("{e}; {kept}")))
        }
        Err(e) => Err(CliError::Train(e)),
    }
}

/// Processes in the run (1 without MPI).
#[cfg(feature = "mpi")]
fn mpi_size(mpi: MpiHandle<'_>) -> usize {
    mpi.map_or(1, |m| m.size())
}

#[cfg(not(feature = "mpi"))]
fn mpi_size(_: MpiHandle<'_>) -> usize {
    1
}

#[cfg(feature = "mpi")]
fn mpi_rank(mpi: MpiHandle<'_>) -> usize {
    mpi.map_or(0, |m| m.rank())
}

#[cfg(not(feature = "mpi"))]
fn mpi_rank(_: MpiHandle<'_>) -> usize {
    0
}

/// This process's rank among the processes on its node, and how many there are (0 of 1
/// without MPI).
#[cfg(feature = "mpi")]
fn mpi_node_slot(mpi: MpiHandle<'_>) -> (usize, usize) {
    mpi.map_or((0, 1), |m| m.node_slot())
}

#[cfg(not(feature = "mpi"))]
fn mpi_node_slot(_: MpiHandle<'_>) -> (usize, usize) {
    (0, 1)
}

/// The GPU ordinals for the process of node rank `local_rank` among `local_size` processes
/// on its node, each driving `per_process` ranks, when it sees `visible` GPUs.
///
/// Launchers show a process its GPUs in one of two ways. A plain `mpirun` shows every
/// process all the node's GPUs: then process p takes p·n .. p·n + n - 1, so that the node's
/// processes do not share a GPU. Slurm's GPU binding, or a CUDA_VISIBLE_DEVICES set per
/// rank, shows each process only its own, numbered from 0: then every process takes
/// 0 .. n - 1 (by node rank, all but the first would ask for GPUs they cannot see). Seeing
/// enough GPUs for the whole node is taken as the first view, else enough for one process
/// as the second. With fewer GPUs than ranks, ranks share them round-robin: the node's rank
/// slot s = p·n + i runs on visible GPU s mod visible (ranks on one GPU need no peer
/// access), so one GPU runs the multi-rank path for real. In one process (no MPI): slot 0
/// of 1 (`bench allreduce` places its ranks so too).
pub(super) fn mpi_gpu_ordinals(
    local_rank: usize,
    local_size: usize,
    per_process: usize,
    visible: usize,
) -> Result<Vec<usize>, String> {
    if local_rank >= local_size {
        return Err(format!(
            "node rank {local_rank} is not below the node's {local_size} process(es)"
        ));
    }
    if visible == 0 {
        return Err(
            "this process sees no GPU; CUDA_VISIBLE_DEVICES, when set, hides every GPU it does \
             not list"
                .into(),
        );
    }
    let node_wide = local_size.saturating_mul(per_process);
    let first = local_rank * per_process; // < node_wide
    if visible >= node_wide {
        return Ok((first..first + per_process).collect());
    }
    if visible >= per_process {
        return Ok((0..per_process).collect());
    }
    Ok((first..first + per_process).map(|s| s % visible).collect())
}

/// Where each rank runs, for the run's first line: `rank 0 on GPU 0, ...`, runs of ranks on
/// one GPU folded (`ranks 0-3 on GPU 0`).
fn placement(ordinals: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ordinals.len() {
        let mut j = i + 1;
        while j < ordinals.len() && ordinals[j] == ordinals[i] {
            j += 1;
        }
        parts.push(if j - i == 1 {
            format!("rank {i} on GPU {}", ordinals[i])
        } else {
            format!("ranks {i}-{} on GPU {}", j - 1, ordinals[i])
        });
        i = j;
    }
    parts.join(", ")
}

/// What every backend's training run shares.
struct Run<'a> {
    data: &'a Dataset,
    cfg: &'a TrainConfig,
    mpi: MpiHandle<'a>,
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))] // read across processes only
    algo: AlgoArg,
}

impl Run<'_> {
    fn go<D>(
        &self,
        devices: Vec<D>,
        start: checkpoint::Checkpoint,
        on_event: impl FnMut(Event) -> Result<(), TrainError>,
    ) -> Result<Vec<Vec<Vec<f32>>>, TrainError>
    where
        D: nanoddp::comm::transport::CommDevice
            + nanoddp::backend::Backend
            + Clone
            + Send
            + 'static,
        <D as nanoddp::backend::Memory>::Buffer<f32>: Send,
    {
        match self.mpi {
            None => train(devices, self.data, start, self.cfg, on_event),
            #[cfg(feature = "mpi")]
            Some(mpi) => {
                use nanoddp::comm::mpi::MpiAlgorithm;
                let across = (self.algo == AlgoArg::Mpi).then_some(MpiAlgorithm::Native);
                // Across processes too, emulated devices need the time their kernels take.
                let config = self.cfg.comm.scaled_for(&devices);
                let ranks =
                    nanoddp::train::mpi::Hierarchical::connect(devices, mpi.world(config), across)?;
                nanoddp::train::train_ranks(ranks, self.data, start, self.cfg, on_event)
            }
            #[cfg(not(feature = "mpi"))]
            Some(never) => match *never {},
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{mpi_gpu_ordinals, placement};

    #[test]
    fn node_wide_and_per_process_views_both_give_each_process_its_own_gpus() {
        // (node rank, processes on the node, GPUs per process, GPUs visible) -> ordinals
        let cases = [
            ((0, 1, 1, 1), vec![0]),    // one process, one GPU
            ((0, 1, 2, 8), vec![0, 1]), // one process takes the first GPUs it sees
            ((0, 4, 1, 4), vec![0]),    // mpirun: all four GPUs visible to all four processes
            ((3, 4, 1, 4), vec![3]),    // ... the last takes the last
            ((1, 2, 2, 4), vec![2, 3]), // two GPUs each out of the node's four
            ((1, 2, 2, 8), vec![2, 3]), // more GPUs than needed: still split by node rank
            ((3, 4, 1, 1), vec![0]),    // Slurm binding: each process sees only its own GPU
            ((1, 2, 2, 2), vec![0, 1]), // ... or its own two
            ((1, 2, 2, 3), vec![0, 1]), // too few for the node, enough for one: its own
            ((0, 8, 1, 1), vec![0]),    // the first of eight bound processes
            ((7, 8, 1, 7), vec![0]),    // 7 of the 8 needed: taken as a per-process view
        ];
        for ((rank, size, per, visible), want) in cases {
            assert_eq!(
                mpi_gpu_ordinals(rank, size, per, visible),
                Ok(want),
                "rank {rank} of {size}, {per} per process, {visible} visible"
            );
        }
    }

    #[test]
    fn fewer_gpus_than_ranks_are_shared_round_robin_and_none_is_an_error() {
        let cases = [
            ((0, 1, 4, 1), vec![0, 0, 0, 0]), // one GPU runs all four ranks
            ((0, 1, 4, 3), vec![0, 1, 2, 0]), // three GPUs, four ranks
            ((1, 2, 2, 1), vec![0, 0]),       // a bound process's one GPU, two ranks
            ((1, 4, 4, 3), vec![1, 2, 0, 1]), // slots 4..7 over three GPUs
        ];
        for ((rank, size, per, visible), want) in cases {
            assert_eq!(mpi_gpu_ordinals(rank, size, per, visible), Ok(want));
        }
        let e = mpi_gpu_ordinals(0, 1, 2, 0).expect_err("no GPU");
        assert!(
            e.contains("sees no GPU") && e.contains("CUDA_VISIBLE_DEVICES"),
            "{e}"
        );
        let e = mpi_gpu_ordinals(2, 2, 1, 8).expect_err("bad node rank");
        assert!(e.contains("node rank 2") && e.contains("not below"), "{e}");
    }

    #[test]
    fn the_placement_line_folds_ranks_that_share_a_gpu() {
        assert_eq!(placement(&[0, 0, 0, 0]), "ranks 0-3 on GPU 0");
        assert_eq!(placement(&[0, 1]), "rank 0 on GPU 0, rank 1 on GPU 1");
        assert_eq!(
            placement(&[0, 1, 2, 0]),
            "rank 0 on GPU 0, rank 1 on GPU 1, rank 2 on GPU 2, rank 3 on GPU 0"
        );
    }
}
