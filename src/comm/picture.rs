//! A schedule as a picture (SVG): ranks as lanes, one column per step, each step a block
//! colored by the chunk of the output it produces, labelled with what it reads and where it
//! writes. Drawn from the very [`Schedule`] the transports execute, and every block carries
//! its step's data as attributes (`data-rank`, `data-step`, `data-offset`, `data-len`,
//! `data-sources`, `data-dsts`, `data-waits`) so a test can check picture against schedule.

use std::fmt::Write as _;

use super::schedule::{split, Buffer, Operand, Schedule};

const LANE_H: usize = 64;
const COL_W: usize = 118;
const LEFT: usize = 70;
const TOP: usize = 58;

/// Chunk colors (Tableau 10), chunk `i` of `split(count, n)` gets color `i % 10`.
const COLORS: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

fn operands(ops: &[Operand]) -> String {
    ops.iter()
        .map(|o| {
            let b = match o.buffer {
                Buffer::Input => "in",
                Buffer::Output => "out",
                Buffer::Scratch => "scratch",
            };
            format!("r{}.{b}[{}]", o.rank, o.offset)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn ranks(ops: &[Operand]) -> String {
    let mut r: Vec<usize> = ops.iter().map(|o| o.rank).collect();
    r.dedup();
    r.iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Renders `schedule` (`count` elements) as an SVG document titled `title`.
pub fn schedule_svg(schedule: &Schedule, count: usize, title: &str) -> String {
    let n = schedule.n;
    let columns = schedule.steps.iter().map(Vec::len).max().unwrap_or(0);
    let chunks = split(count, n);
    let chunk_of = |offset: usize| {
        chunks
            .iter()
            .position(|c| c.contains(&offset))
            .unwrap_or(n - 1)
    };
    let width = LEFT + columns.max(1) * COL_W + 20;
    let height = TOP + n * LANE_H + 60;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" data-ranks="{n}" data-steps="{columns}" data-count="{count}">"#
    );
    let _ = writeln!(
        s,
        r##"<rect width="{width}" height="{height}" fill="#ffffff"/>
<text x="{LEFT}" y="24" font-size="16" font-weight="bold">{title}</text>
<text x="{LEFT}" y="44" font-size="11" fill="#555">one column per step; a block is one step of one rank: Σ sums the ranks named, ← copies, → writes to the ranks named; color = output chunk</text>"##
    );
    for k in 0..columns {
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" font-size="11" fill="#555" text-anchor="middle">step {}</text>"##,
            LEFT + k * COL_W + COL_W / 2,
            TOP - 2,
            k + 1
        );
    }
    for (rank, steps) in schedule.steps.iter().enumerate() {
        let y = TOP + rank * LANE_H;
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{}" x2="{}" y2="{}" stroke="#ddd"/>
<text x="10" y="{}" font-size="13" font-weight="bold">rank {rank}</text>"##,
            y + LANE_H / 2,
            width - 20,
            y + LANE_H / 2,
            y + LANE_H / 2 + 4
        );
        for (k, step) in steps.iter().enumerate() {
            let x = LEFT + k * COL_W + 4;
            let first = step.dsts.first();
            let scratch = first.is_some_and(|d| d.buffer == Buffer::Scratch);
            let color = match first {
                _ if step.len == 0 => "#eeeeee",
                _ if scratch => "#cccccc",
                Some(d) => COLORS[chunk_of(d.offset) % COLORS.len()],
                None => "#eeeeee",
            };
            let offset = first.map_or(0, |d| d.offset);
            let verb = if step.sources.len() > 1 {
                format!("Σ r{}", ranks(&step.sources))
            } else {
                format!("← r{}", ranks(&step.sources))
            };
            let others: Vec<Operand> = step
                .dsts
                .iter()
                .filter(|d| d.rank != rank)
                .cloned()
                .collect();
            let to = if others.is_empty() {
                String::new()
            } else {
                format!("→ r{}", ranks(&others))
            };
            let waits = step
                .waits
                .iter()
                .map(|(p, c)| format!("r{p}:{c}"))
                .collect::<Vec<_>>()
                .join(" ");
            let _ = writeln!(
                s,
                r##"<g data-rank="{rank}" data-step="{k}" data-offset="{offset}" data-len="{}" data-sources="{}" data-dsts="{}" data-waits="{waits}">
<title>rank {rank}, step {}: {} elements from {} to {}; waits {}</title>
<rect x="{x}" y="{}" width="{}" height="{}" rx="5" fill="{color}" stroke="#333" stroke-width="0.6"/>
<text x="{}" y="{}" font-size="12" text-anchor="middle" fill="#111">{verb}</text>
<text x="{}" y="{}" font-size="11" text-anchor="middle" fill="#111">{to}</text>
<text x="{}" y="{}" font-size="10" text-anchor="middle" fill="#222">[{offset}, {})</text>
</g>"##,
                step.len,
                operands(&step.sources),
                operands(&step.dsts),
                k + 1,
                step.len,
                operands(&step.sources),
                operands(&step.dsts),
                if waits.is_empty() { "none" } else { &waits },
                y + 6,
                COL_W - 8,
                LANE_H - 12,
                x + (COL_W - 8) / 2,
                y + 22,
                x + (COL_W - 8) / 2,
                y + 36,
                x + (COL_W - 8) / 2,
                y + 49,
                offset + step.len,
            );
        }
    }
    let ly = TOP + n * LANE_H + 22;
    for (i, c) in chunks.iter().enumerate().take(COLORS.len()) {
        let x = LEFT + i * 110;
        let _ = writeln!(
            s,
            r##"<rect x="{x}" y="{}" width="14" height="14" fill="{}" stroke="#333" stroke-width="0.6"/><text x="{}" y="{}" font-size="11">chunk {i} [{}, {})</text>"##,
            ly - 11,
            COLORS[i],
            x + 18,
            ly,
            c.start,
            c.end
        );
    }
    s.push_str("</svg>\n");
    s
}
