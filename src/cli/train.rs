//! `nanoddp train`: LeNet on Fashion-MNIST, data-parallel over N devices of one backend.

use std::io::Write;
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use nanoddp::backend::cpu::CpuDevice;
use nanoddp::backend::cuda::CudaDevice;
use nanoddp::backend::simt::SimtDevice;
use nanoddp::data::{find_dataset, locate, Dataset};
use nanoddp::train::{
    checkpoint, from_weights, initial_weights, test_accuracy, train, Event, Recipe, Storage,
    TrainConfig, TrainError,
};

use super::bench_allreduce::{AlgoArg, CommArg};

/// Where the replicas run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    /// The native CPU backend, one thread per device.
    Cpu,
    /// The CUDA kernels under the SIMT emulator (slow: for studying the kernels).
    Simt,
    /// GPUs 0..devices.
    Cuda,
}

/// The recipe on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RecipeArg {
    /// The reference chapter: N(0, 0.01²) init, plain SGD, lr 0.2.
    Chapter,
    /// Ours: He init, momentum 0.9, cosine decay from lr 0.05.
    Default,
}

/// Precision on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PrecisionArg {
    /// f32 everywhere.
    Fp32,
    /// Mixed precision: half activations, f32 master weights, loss scaling.
    Fp16,
}

/// Data order on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ShuffleArg {
    /// Reshuffle every epoch (seeded).
    Epoch,
    /// File order, every epoch (for debugging and cross-checks).
    None,
}

/// Every `train` option.
#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// Devices (model replicas), each taking a shard of every batch.
    #[arg(long, default_value_t = 1)]
    pub devices: usize,
    /// Where the replicas run.
    #[arg(long, value_enum, default_value_t = BackendArg::Cpu)]
    pub backend: BackendArg,
    /// Gradient allreduce algorithm.
    #[arg(long, value_enum, default_value_t = AlgoArg::Auto)]
    pub algo: AlgoArg,
    /// local: all devices in this process; mpi: one process per mpirun rank, each driving
    /// --devices local devices (global batch split over processes × devices; needs a build
    /// with --features mpi). With --algo mpi the processes' leaders use MPI's own allreduce.
    #[arg(long, value_enum, default_value_t = CommArg::Local)]
    pub comm: CommArg,
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
    #[arg(long)]
    pub lr: Option<f32>,
    /// Momentum (default: 0 for the chapter recipe, 0.9 for ours).
    #[arg(long)]
    pub momentum: Option<f32>,
    /// L2 weight decay (default: 0 for the chapter recipe, 5e-4 for ours).
    #[arg(long)]
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
    /// Activation storage: fp32, or fp16 (half activations and weight copies, f32 master
    /// weights, dynamic loss scaling from 2^16).
    #[arg(long, value_enum, default_value_t = PrecisionArg::Fp32)]
    pub precision: PrecisionArg,
    /// Folder with the four IDX(.gz) files (default: $NANODDP_DATA, then
    /// /usr/share/datasets/fashion-mnist, then ./data/fashion-mnist).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Write one JSON record per step and per epoch here.
    #[arg(long)]
    pub metrics: Option<PathBuf>,
    /// Draw the loss and accuracy curves here after every epoch (PNG; SVG if the name ends
    /// in .svg). Needs a TrueType font: DejaVu Sans (fonts-dejavu-core) or $NANODDP_FONT.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Save a safetensors checkpoint here after every epoch (atomically).
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Start from the weights in this safetensors checkpoint (a fresh run otherwise).
    #[arg(long, conflicts_with = "resume")]
    pub init: Option<PathBuf>,
    /// Continue the run saved in this checkpoint (weights, momentum, epoch, step): with the
    /// same options it ends exactly where the uninterrupted run would.
    #[arg(long)]
    pub resume: Option<PathBuf>,
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
pub fn eval(out: &mut impl Write, args: EvalArgs) -> Result<(), Box<dyn std::error::Error>> {
    if args.devices == 0 || args.devices > 64 {
        return Err("--devices must be between 1 and 64".into());
    }
    let ckpt = checkpoint::load(&args.checkpoint)?;
    let data = load_data(args.data.as_deref(), out)?;
    let acc = test_accuracy(
        vec![CpuDevice::new(); args.devices],
        &data,
        &ckpt.weights,
        args.batch,
    )?;
    writeln!(
        out,
        "{}: epoch {}, test accuracy {acc:.4} on {} images",
        args.checkpoint.display(),
        ckpt.epoch,
        data.test_labels.len()
    )?;
    Ok(())
}

fn load_data(
    explicit: Option<&std::path::Path>,
    out: &mut impl Write,
) -> Result<Dataset, Box<dyn std::error::Error>> {
    match find_dataset(explicit) {
        Ok(d) => Ok(d),
        Err(e) if explicit.is_none() => {
            let subset = locate::shipped_subset();
            writeln!(
                out,
                "note: {e}\nnote: training on the small subset shipped in {} instead (3000 training, 1000 test images)",
                subset.display()
            )?;
            Ok(locate::load(&subset)?)
        }
        Err(e) => Err(e.into()),
    }
}

/// Runs the command.
pub fn run(out: &mut impl Write, args: TrainArgs) -> Result<(), Box<dyn std::error::Error>> {
    match args.comm {
        CommArg::Local => {
            if args.algo == AlgoArg::Mpi {
                return Err("--algo mpi is MPI's own allreduce across processes: use it with --comm mpi under mpirun".into());
            }
            run_with(out, args, None)
        }
        #[cfg(feature = "mpi")]
        CommArg::Mpi => {
            let mpi = nanoddp::comm::mpi::Mpi::init()?;
            if mpi.rank() == 0 {
                run_with(out, args, Some(&mpi))
            } else {
                // Only rank 0 reports; the others train silently.
                run_with(&mut std::io::sink(), args, Some(&mpi))
            }
        }
        #[cfg(not(feature = "mpi"))]
        CommArg::Mpi => Err(super::NO_MPI.into()),
    }
}

#[cfg(feature = "mpi")]
type MpiHandle<'a> = Option<&'a nanoddp::comm::mpi::Mpi>;
#[cfg(not(feature = "mpi"))]
type MpiHandle<'a> = Option<&'a std::convert::Infallible>;

fn run_with(
    out: &mut impl Write,
    args: TrainArgs,
    mpi: MpiHandle<'_>,
) -> Result<(), Box<dyn std::error::Error>> {
    let lead = mpi_rank(mpi) == 0;
    if args.devices == 0 || args.devices > 64 {
        return Err("--devices must be between 1 and 64".into());
    }
    let recipe = match args.recipe {
        RecipeArg::Chapter => Recipe::Chapter,
        RecipeArg::Default => Recipe::Default,
    };
    let (lr, momentum, wd) = match recipe {
        Recipe::Chapter => (0.2, 0.0, 0.0),
        Recipe::Default => (0.05, 0.9, 5e-4),
    };
    let cfg = TrainConfig {
        recipe,
        epochs: args.epochs,
        batch: args.batch,
        lr: args.lr.unwrap_or(lr),
        momentum: args.momentum.unwrap_or(momentum),
        weight_decay: args.weight_decay.unwrap_or(wd),
        seed: args.seed,
        shuffle: args.shuffle == ShuffleArg::Epoch,
        max_steps: args.max_steps,
        algorithm: args.algo.algorithm(),
        stop_after: None,
        precision: match args.precision {
            PrecisionArg::Fp32 => Storage::Fp32,
            PrecisionArg::Fp16 => Storage::Fp16,
        },
        bucket_bytes: args.bucket_kb.saturating_mul(1024),
    };
    if args.plot.is_some() {
        super::plot::load_font()?;
    }
    let data = load_data(args.data.as_deref(), out)?;
    let start = match (&args.init, &args.resume) {
        (Some(path), _) => from_weights(checkpoint::load(path)?.weights),
        (_, Some(path)) => checkpoint::load(path)?,
        _ => from_weights(initial_weights(recipe, cfg.seed)),
    };
    writeln!(
        out,
        "LeNet on {} ({} train / {} test images), {} {:?} device(s), batch {}, {:?} recipe: lr {}, momentum {}, weight decay {}",
        data.dir.display(),
        data.train_labels.len(),
        data.test_labels.len(),
        args.devices,
        args.backend,
        cfg.batch,
        recipe,
        cfg.lr,
        cfg.momentum,
        cfg.weight_decay
    )?;
    // Files are written by rank 0 alone (they may be on a shared file system).
    let (metrics_path, plot_path, save_path) = if lead {
        (args.metrics.clone(), args.plot.clone(), args.save.clone())
    } else {
        (None, None, None)
    };
    let mut metrics = match &metrics_path {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?,
        )),
        None => None,
    };
    let steps_per_epoch = data.train_labels.len().div_ceil(cfg.batch) as u64;
    let bar = if lead {
        ProgressBar::new(steps_per_epoch)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template(
            "epoch {prefix} [{bar:30}] {pos}/{len} steps, loss {msg} ({eta} left)",
        )?
        .progress_chars("=> "),
    );
    let save = save_path;
    let mut curves = super::plot::Curves::default();
    let mut on_event = |event: Event| -> Result<(), TrainError> {
        let io = |e: std::io::Error| TrainError::Config(format!("writing metrics: {e}"));
        match event {
            Event::Step(s) => {
                bar.set_prefix(s.epoch.to_string());
                bar.set_position(((s.step - 1) as u64 % steps_per_epoch) + 1);
                bar.set_message(format!("{:.4}", s.loss));
                curves
                    .step_loss
                    .push((s.step as f64 / steps_per_epoch as f64, s.loss));
                if let Some(m) = metrics.as_mut() {
                    let rec = serde_json::json!({"step": s.step, "epoch": s.epoch, "loss": s.loss, "lr": s.lr, "loss_scale": s.loss_scale});
                    writeln!(m, "{rec}").map_err(io)?;
                }
            }
            Event::Epoch(e, state) => {
                bar.reset();
                println!(
                    "epoch {:>3}  loss {:.4}  train acc {:.4}  test acc {:.4}  {:.1} s  {:.0} img/s  allreduce {:.1}%",
                    e.epoch,
                    e.train_loss,
                    e.train_acc,
                    e.test_acc,
                    e.seconds,
                    e.images_per_s,
                    100.0 * e.allreduce_share
                );
                if let Some(m) = metrics.as_mut() {
                    let rec = serde_json::json!({"epoch": e.epoch, "train_loss": e.train_loss, "train_acc": e.train_acc,
                        "test_acc": e.test_acc, "seconds": e.seconds, "images_per_s": e.images_per_s, "allreduce_share": e.allreduce_share});
                    writeln!(m, "{rec}").map_err(io)?;
                    m.flush().map_err(io)?;
                }
                curves
                    .epochs
                    .push((e.epoch as f64, e.train_loss, e.train_acc, e.test_acc));
                if let Some(path) = &plot_path {
                    super::plot::draw(path, &curves).map_err(TrainError::Config)?;
                }
                if let Some(path) = &save {
                    checkpoint::save(path, &state)
                        .map_err(|e| TrainError::Config(e.to_string()))?;
                }
            }
        }
        Ok(())
    };
    let n = args.devices;
    let run = Run {
        data: &data,
        cfg: &cfg,
        mpi,
        algo: args.algo,
    };
    match args.backend {
        BackendArg::Cpu => run.go(vec![CpuDevice::new(); n], start, &mut on_event)?,
        BackendArg::Simt => run.go((0..n).map(SimtDevice::new).collect(), start, &mut on_event)?,
        BackendArg::Cuda => {
            // The p-th process on a node takes that node's GPUs p·n .. p·n + n - 1.
            let first = mpi_node_rank(mpi) * n;
            let devices = (first..first + n)
                .map(CudaDevice::new)
                .collect::<Result<Vec<_>, _>>()?;
            run.go(devices, start, &mut on_event)?
        }
    };
    bar.finish_and_clear();
    Ok(())
}

#[cfg(feature = "mpi")]
fn mpi_rank(mpi: MpiHandle<'_>) -> usize {
    mpi.map_or(0, |m| m.rank())
}

#[cfg(not(feature = "mpi"))]
fn mpi_rank(_: MpiHandle<'_>) -> usize {
    0
}

#[cfg(feature = "mpi")]
fn mpi_node_rank(mpi: MpiHandle<'_>) -> usize {
    mpi.map_or(0, |m| m.node_rank())
}

#[cfg(not(feature = "mpi"))]
fn mpi_node_rank(_: MpiHandle<'_>) -> usize {
    0
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
                use nanoddp::comm::communicator::CommConfig;
                use nanoddp::comm::mpi::MpiAlgorithm;
                let across = (self.algo == AlgoArg::Mpi).then_some(MpiAlgorithm::Native);
                let ranks = nanoddp::train::mpi::Hierarchical::connect(
                    devices,
                    mpi.world(CommConfig::default()),
                    across,
                )?;
                nanoddp::train::train_ranks(ranks, self.data, start, self.cfg, on_event)
            }
            #[cfg(not(feature = "mpi"))]
            Some(never) => match *never {},
        }
    }
}
