//! `nanoddp schedule`: an allreduce algorithm's steps, as text or as an SVG picture drawn
//! from the same schedule the transports execute.

use std::io::Write;
use std::path::PathBuf;

use nanoddp::comm::picture::schedule_svg;
use nanoddp::comm::schedule::{all_reduce, Buffer};

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::ValueEnum;

use nanoddp::train::checkpoint;

use super::args::{check_ranks, AlgoArg};
use super::outputs::{check_format, check_outputs, Named};
use super::CliError;

/// The algorithms a schedule exists for: `--algo`'s values less `auto` (picked per size at
/// run time) and `mpi` (MPI's own allreduce, no schedule of ours).
fn scheduled_algorithms() -> impl TypedValueParser<Value = AlgoArg> {
    PossibleValuesParser::new(
        AlgoArg::value_variants()
            .iter()
            .filter(|a| a.algorithm().is_some())
            .filter_map(ValueEnum::to_possible_value),
    )
    .try_map(|name| AlgoArg::from_str(&name, false))
}

/// `schedule` options.
#[derive(Debug, clap::Args)]
pub struct ScheduleArgs {
    /// Algorithm to draw.
    #[arg(long, default_value = "ring", value_parser = scheduled_algorithms())]
    pub algo: AlgoArg,
    /// Ranks.
    #[arg(short = 'n', long = "ranks", default_value_t = 4)]
    pub ranks: usize,
    /// Elements reduced (default: 4 per rank, so chunks are visible).
    #[arg(long)]
    pub count: Option<usize>,
    /// Pipelining slice in elements for ring and tree (default: the whole count, one slice).
    #[arg(long)]
    pub slice: Option<usize>,
    /// Out of place (input and output distinct) instead of in place.
    #[arg(long)]
    pub out_of_place: bool,
    /// Write the picture here, as SVG (the name ends in .svg), replacing the file atomically;
    /// without it the steps are printed as text.
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

/// Runs the command.
pub fn run(out: &mut impl Write, args: ScheduleArgs) -> Result<(), CliError> {
    let Some(algorithm) = args.algo.algorithm() else {
        return Err(CliError::Input(
            "--algo auto picks per size at run time and mpi is MPI's own allreduce; name one of ring, tree, direct, oneshot"
                .into(),
        ));
    };
    check_ranks("-n/--ranks", args.ranks).map_err(CliError::Input)?;
    if let Some(path) = &args.svg {
        let svg = Named {
            flag: "--svg",
            path,
        };
        check_format(svg, &["svg"])?;
        check_outputs(&[svg], &[], &[])?;
    }
    for (flag, value) in [("--count", args.count), ("--slice", args.slice)] {
        if value == Some(0) {
            return Err(CliError::Input(format!(
                "{flag} 0: a schedule moves at least 1 element; give 1 or more"
            )));
        }
    }
    let count = args.count.unwrap_or(4 * args.ranks);
    let slice = args.slice.unwrap_or(count);
    // A schedule holds every slice's steps: keep it to something a terminal can show.
    if count.div_ceil(slice) > 1 << 16 {
        return Err(CliError::Input(format!(
            "--count {count} in slices of {slice} is over 65536 slices: raise --slice"
        )));
    }
    let schedule = all_reduce(algorithm, args.ranks, count, slice, !args.out_of_place);
    let steps = schedule.steps.iter().map(Vec::len).max().unwrap_or(0);
    let title = format!(
        "{} allreduce, n = {}, {count} elements{}: {steps} steps",
        algorithm.name(),
        args.ranks,
        if args.out_of_place {
            ", out of place"
        } else {
            ", in place"
        }
    );
    match &args.svg {
        Some(path) => {
            let picture = schedule_svg(&schedule, count, &title);
            // A failed write leaves the previous file whole: exit 1, a failure while running.
            checkpoint::replace_file(path, |_, f| f.write_all(picture.as_bytes()))
                .map_err(|e| CliError::Running(format!("writing the picture: {e}")))?;
            writeln!(out, "{title}: drawn to {}", path.display())?;
        }
        None => {
            writeln!(out, "{title}")?;
            for (rank, steps) in schedule.steps.iter().enumerate() {
                for (k, s) in steps.iter().enumerate() {
                    let name = |b: Buffer| match b {
                        Buffer::Input => "in",
                        Buffer::Output => "out",
                        Buffer::Scratch => "scratch",
                    };
                    let list = |ops: &[nanoddp::comm::schedule::Operand]| {
                        ops.iter()
                            .map(|o| {
                                format!(
                                    "r{}.{}[{}..{}]",
                                    o.rank,
                                    name(o.buffer),
                                    o.offset,
                                    o.offset + s.len
                                )
                            })
                            .collect::<Vec<_>>()
                            .join(" + ")
                    };
                    writeln!(
                        out,
                        "rank {rank} step {:>2}: {} <- {}{}",
                        k + 1,
                        list(&s.dsts),
                        list(&s.sources),
                        if s.waits.is_empty() {
                            String::new()
                        } else {
                            format!(
                                "   (after {})",
                                s.waits
                                    .iter()
                                    .map(|(p, c)| format!("r{p} step {c}"))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )
                        }
                    )?;
                }
            }
        }
    }
    Ok(())
}
