//! `nanoddp schedule --svg` draws exactly the schedule the transports execute: every block
//! of the picture is one step of one rank, with that step's operands, length and waits, and
//! nothing else is drawn as a step.

mod common;

use common::cli::{nanoddp, succeeds};
use nanoddp::comm::picture::schedule_svg;
use nanoddp::comm::schedule::{all_reduce, Algorithm, Buffer, Operand, Step};

fn attr<'a>(tag: &'a str, name: &str) -> &'a str {
    let key = format!("{name}=\"");
    let at = tag
        .find(&key)
        .unwrap_or_else(|| panic!("{name} missing in {tag}"))
        + key.len();
    &tag[at..at + tag[at..].find('"').expect("closing quote")]
}

/// Reads back a block's operand list: `r{rank}.{in|out|scratch}[{offset}]`, space-separated.
fn operands(list: &str) -> Vec<Operand> {
    list.split_whitespace()
        .map(|op| {
            let parsed = op.strip_prefix('r').and_then(|o| {
                let (rank, rest) = o.split_once('.')?;
                let (buffer, offset) = rest.strip_suffix(']')?.split_once('[')?;
                let buffer = match buffer {
                    "in" => Buffer::Input,
                    "out" => Buffer::Output,
                    "scratch" => Buffer::Scratch,
                    _ => return None,
                };
                Some(Operand {
                    rank: rank.parse().ok()?,
                    buffer,
                    offset: offset.parse().ok()?,
                })
            });
            parsed.unwrap_or_else(|| panic!("not an operand: {op}"))
        })
        .collect()
}

/// Reads back a block's waits: `r{rank}:{steps}`, space-separated.
fn waits(list: &str) -> Vec<(usize, usize)> {
    list.split_whitespace()
        .map(|w| {
            let parsed = w.strip_prefix('r').and_then(|w| {
                let (rank, steps) = w.split_once(':')?;
                Some((rank.parse().ok()?, steps.parse().ok()?))
            });
            parsed.unwrap_or_else(|| panic!("not a wait: {w}"))
        })
        .collect()
}

#[test]
fn every_block_is_one_step_of_the_executed_schedule() {
    for algorithm in Algorithm::ALL {
        for n in 1..=6 {
            for (count, slice) in [(1, 1), (7, 7), (16, 5), (101, 101)] {
                for in_place in [true, false] {
                    let schedule = all_reduce(algorithm, n, count, slice, in_place);
                    let svg = schedule_svg(&schedule, count, "t");
                    let columns = schedule.steps.iter().map(Vec::len).max().unwrap_or(0);
                    let root = svg.lines().next().unwrap();
                    assert_eq!(attr(root, "data-steps"), columns.to_string());
                    assert_eq!(attr(root, "data-ranks"), n.to_string());
                    // (rank, step, offset drawn at, the step): read back from the picture...
                    let mut drawn: Vec<(usize, usize, usize, Step)> = svg
                        .lines()
                        .filter(|l| l.starts_with("<g data-rank="))
                        .map(|g| {
                            (
                                attr(g, "data-rank").parse().unwrap(),
                                attr(g, "data-step").parse().unwrap(),
                                attr(g, "data-offset").parse().unwrap(),
                                Step {
                                    dsts: operands(attr(g, "data-dsts")),
                                    len: attr(g, "data-len").parse().unwrap(),
                                    sources: operands(attr(g, "data-sources")),
                                    waits: waits(attr(g, "data-waits")),
                                },
                            )
                        })
                        .collect();
                    drawn.sort_by_key(|&(rank, k, ..)| (rank, k));
                    // ... and as the schedule has them: a block sits at its first destination.
                    let mut expected = Vec::new();
                    for (rank, steps) in schedule.steps.iter().enumerate() {
                        for (k, s) in steps.iter().enumerate() {
                            let offset = s.dsts.first().map_or(0, |d| d.offset);
                            expected.push((rank, k, offset, s.clone()));
                        }
                    }
                    assert_eq!(
                        drawn, expected,
                        "{algorithm:?} n={n} count={count} in_place={in_place}"
                    );
                }
            }
        }
    }
}

#[test]
fn the_command_draws_ring_with_2_n_minus_1_steps() {
    let path = std::env::temp_dir().join(format!("nanoddp-ring-{}.svg", std::process::id()));
    succeeds(
        nanoddp()
            .args(["schedule", "--algo", "ring", "-n", "5", "--svg"])
            .arg(&path),
    );
    let svg = std::fs::read_to_string(&path).unwrap();
    let root = svg.lines().next().unwrap();
    assert_eq!(attr(root, "data-steps"), "8", "ring: 2(n-1) steps");
    assert_eq!(svg.matches("<g data-rank=").count(), 5 * 8);
    std::fs::remove_file(&path).unwrap();
    let auto = nanoddp()
        .args(["schedule", "--algo", "auto"])
        .output()
        .unwrap();
    assert_eq!(auto.status.code(), Some(2));
}
