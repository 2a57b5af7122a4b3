//! The table nccl-tests' `all_reduce_perf` prints, which `bench allreduce` prints too (in
//! process and across MPI processes): its header, its rows, and the data every rank reduces.

use std::io::Write;

/// Rank r's input, as nccl-tests and the anchors: ((i mod 13) + 1) · (r + 1); every partial
/// sum is an integer below 2^24, so the result is exact whatever the order of additions.
pub fn input(rank: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| ((i % 13) + 1) as f32 * (rank + 1) as f32)
        .collect()
}

/// The sum of [`input`] over `n` ranks.
pub fn expected(n: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| ((i % 13) + 1) as f32 * (n * (n + 1) / 2) as f32)
        .collect()
}

/// The header: the column names and units of one column group per entry of `groups` (e.g.
/// out of place, in place), each with the extra columns in `extra`.
pub fn header(
    out: &mut impl Write,
    groups: &[&str],
    extra: &[(&str, &str)],
) -> std::io::Result<()> {
    let group_width = 9 + 8 + 8 + 7 + extra.len() * 7;
    let mut title = format!("#{:>33}", "");
    for g in groups {
        title.push_str(&format!("{g:>w$}", w = group_width));
    }
    writeln!(out, "{}", title.trim_end())?;
    for (row, cells) in [
        ["size", "count", "type", "redop"],
        ["(B)", "(elements)", "", ""],
    ]
    .iter()
    .enumerate()
    {
        let mut line = format!(
            "#{:>11} {:>10} {:>6} {:>5}",
            cells[0], cells[1], cells[2], cells[3]
        );
        for _ in groups {
            let base = if row == 0 {
                ["time", "algbw", "busbw", "#wrong"]
            } else {
                ["(us)", "(GB/s)", "(GB/s)", ""]
            };
            line.push_str(&format!(
                " {:>9} {:>7} {:>7} {:>6}",
                base[0], base[1], base[2], base[3]
            ));
            for e in extra {
                line.push_str(&format!(" {:>6}", if row == 0 { e.0 } else { e.1 }));
            }
        }
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// busbw / algbw for `ranks`: 2(n-1)/n, the share of the data each rank's link carries in a
/// bandwidth-optimal allreduce (0 for a single rank, whose data crosses no link), as
/// nccl-tests computes it.
fn busbw_factor(ranks: usize) -> f64 {
    2.0 * ranks.saturating_sub(1) as f64 / ranks.max(1) as f64
}

/// One column group's cells for a message of `bytes` reduced in `seconds` by `ranks` ranks:
/// time, algbw, busbw, #wrong.
pub fn group(bytes: usize, seconds: f64, ranks: usize, wrong: u64) -> String {
    let algbw = bytes as f64 / seconds / 1e9;
    format!(
        "{:>9.1} {:>7.3} {:>7.3} {:>6}",
        seconds * 1e6,
        algbw,
        algbw * busbw_factor(ranks),
        wrong
    )
}

/// One row: a float32 sum of `bytes`, then the column groups' cells ([`group`]).
pub fn row(out: &mut impl Write, bytes: usize, groups: &[String]) -> std::io::Result<()> {
    writeln!(
        out,
        " {:>11} {:>10} {:>6} {:>5} {}",
        bytes,
        bytes / 4,
        "float",
        "sum",
        groups.join(" ")
    )
}

/// The median of `samples` (the upper one of an even count).
pub fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}
