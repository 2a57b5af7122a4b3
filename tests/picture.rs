//! `nanoddp schedule --svg` draws exactly the schedule the transports execute: every block
//! of the picture is one step of one rank, with that step's operands, length and waits, and
//! nothing else is drawn as a step.

use nanoddp::comm::picture::schedule_svg;
use nanoddp::comm::schedule::{all_reduce, Algorithm, Buffer, Operand};

fn attr<'a>(tag: &'a str, name: &str) -> &'a str {
    let key = format!("{name}=\"");
    let at = tag
        .find(&key)
        .unwrap_or_else(|| panic!("{name} missing in {tag}"))
        + key.len();
    &tag[at..at + tag[at..].find('"').expect("closing quote")]
}

fn ops(list: &[Operand]) -> String {
    list.iter()
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
                    let mut drawn: Vec<(usize, usize, String)> = svg
                        .lines()
                        .filter(|l| l.starts_with("<g data-rank="))
                        .map(|g| {
                            (
                                attr(g, "data-rank").parse().unwrap(),
                                attr(g, "data-step").parse().unwrap(),
                                format!(
                                    "{} {} | {} | {} | {}",
                                    attr(g, "data-offset"),
                                    attr(g, "data-len"),
                                    attr(g, "data-sources"),
                                    attr(g, "data-dsts"),
                                    attr(g, "data-waits")
                                ),
                            )
                        })
                        .collect();
                    drawn.sort();
                    let mut expected = Vec::new();
                    for (rank, steps) in schedule.steps.iter().enumerate() {
                        for (k, s) in steps.iter().enumerate() {
                            let waits = s
                                .waits
                                .iter()
                                .map(|(p, c)| format!("r{p}:{c}"))
                                .collect::<Vec<_>>()
                                .join(" ");
                            expected.push((
                                rank,
                                k,
                                format!(
                                    "{} {} | {} | {} | {waits}",
                                    s.dsts.first().map_or(0, |d| d.offset),
                                    s.len,
                                    ops(&s.sources),
                                    ops(&s.dsts)
                                ),
                            ));
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
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nanoddp"))
        .args(["schedule", "--algo", "ring", "-n", "5", "--svg"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = std::fs::read_to_string(&path).unwrap();
    let root = svg.lines().next().unwrap();
    assert_eq!(attr(root, "data-steps"), "8", "ring: 2(n-1) steps");
    assert_eq!(svg.matches("<g data-rank=").count(), 5 * 8);
    std::fs::remove_file(&path).unwrap();
    let auto = std::process::Command::new(env!("CARGO_BIN_EXE_nanoddp"))
        .args(["schedule", "--algo", "auto"])
        .output()
        .unwrap();
    assert_eq!(auto.status.code(), Some(2));
}
