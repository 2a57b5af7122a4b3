//! Proves a [`Schedule`] correct without running it on any device.
//!
//! 1. **Liveness**: the steps can all run under the waits (no wait names a step that can
//!    never complete); simulated to the end.
//! 2. **Race freedom under every interleaving**: the waits define a happens-before order
//!    (vector clocks, [`super::happens_before`]). Every two accesses to overlapping memory of which one writes must be
//!    ordered by it, including the caller's reuse of a rank's buffers after that rank returns.
//!    Then every execution the waits allow computes the same thing.
//! 3. **Values**: one execution is run symbolically; each element is an expression over the
//!    inputs, returned for the caller to compare with what the collective promises (each
//!    input exactly once, in the same order on every rank).

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::rc::Rc;

use super::happens_before::{self, Stuck};
use super::schedule::{Buffer, Schedule};

/// A symbolic value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Expr {
    /// Element `index` of rank `rank`'s input.
    Input {
        /// Whose input.
        rank: usize,
        /// Which element.
        index: usize,
    },
    /// Whatever was in a buffer before the collective (must never survive).
    Garbage,
    /// The sum of the parts, added in this order.
    Sum(Vec<Rc<Expr>>),
}

impl Expr {
    /// The inputs this value adds up, in the order they are added.
    pub fn leaves(&self) -> Vec<(usize, usize)> {
        match self {
            Expr::Input { rank, index } => vec![(*rank, *index)],
            Expr::Garbage => vec![(usize::MAX, usize::MAX)],
            Expr::Sum(parts) => parts.iter().flat_map(|p| p.leaves()).collect(),
        }
    }
}

/// Why a schedule is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerifyError {
    /// Some steps can never run.
    Deadlock {
        /// Steps completed per rank when nothing could run any more.
        progress: Vec<usize>,
    },
    /// Two unordered accesses to the same memory, at least one a write.
    Race {
        /// The memory: (rank, buffer).
        memory: (usize, Buffer),
        /// Description of the two accesses.
        between: String,
    },
    /// A step reads or writes outside its buffer.
    OutOfBounds {
        /// Which step.
        at: (usize, usize),
    },
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerifyError::Deadlock { progress } => {
                write!(f, "deadlock: steps completed per rank {progress:?}")
            }
            VerifyError::Race { memory, between } => {
                write!(f, "race on rank {}'s {:?}: {between}", memory.0, memory.1)
            }
            VerifyError::OutOfBounds { at } => {
                write!(f, "step {} of rank {} is out of bounds", at.1, at.0)
            }
        }
    }
}

/// One access to memory, for the race check.
struct Access {
    rank: usize,
    /// Step index; `usize::MAX` for the caller's reuse after the rank returned.
    step: usize,
    range: Range<usize>,
    write: bool,
}

/// Runs the checks for a schedule whose ranks hold `input_len` input and `output_len` output
/// elements (`in_place`: Input and Output are the same memory). Returns every rank's output.
pub fn verify(
    s: &Schedule,
    input_len: usize,
    output_len: usize,
    in_place: bool,
) -> Result<Vec<Vec<Rc<Expr>>>, VerifyError> {
    let n = s.n;
    let memory = |rank: usize, b: Buffer| {
        (
            rank,
            if in_place && b == Buffer::Input {
                Buffer::Output
            } else {
                b
            },
        )
    };
    let len_of = |b: Buffer| match b {
        Buffer::Input => input_len,
        Buffer::Output => output_len,
        Buffer::Scratch => s.scratch,
    };

    // Symbolic state.
    let mut state: HashMap<(usize, Buffer), Vec<Rc<Expr>>> = HashMap::new();
    for r in 0..n {
        let input: Vec<Rc<Expr>> = (0..input_len)
            .map(|i| Rc::new(Expr::Input { rank: r, index: i }))
            .collect();
        if in_place {
            state.insert((r, Buffer::Output), input);
        } else {
            state.insert((r, Buffer::Input), input);
            state.insert(
                (r, Buffer::Output),
                std::iter::repeat_with(|| Rc::new(Expr::Garbage))
                    .take(output_len)
                    .collect(),
            );
        }
        state.insert(
            (r, Buffer::Scratch),
            std::iter::repeat_with(|| Rc::new(Expr::Garbage))
                .take(s.scratch)
                .collect(),
        );
    }

    // Execute one interleaving symbolically, in the order the clocks' rounds run the steps.
    let mut run = |r: usize, i: usize| -> Result<(), VerifyError> {
        let step = &s.steps[r][i];
        if step
            .dsts
            .iter()
            .chain(&step.sources)
            .any(|o| o.rank >= n || o.offset + step.len > len_of(o.buffer))
        {
            return Err(VerifyError::OutOfBounds { at: (r, i) });
        }
        let values: Vec<Rc<Expr>> = (0..step.len)
            .map(|j| {
                let parts: Vec<Rc<Expr>> = step
                    .sources
                    .iter()
                    .map(|o| state[&memory(o.rank, o.buffer)][o.offset + j].clone())
                    .collect();
                if parts.len() == 1 {
                    parts[0].clone()
                } else {
                    Rc::new(Expr::Sum(parts))
                }
            })
            .collect();
        for d in &step.dsts {
            let dst = state
                .get_mut(&memory(d.rank, d.buffer))
                .expect("buffer exists");
            dst[d.offset..d.offset + step.len].clone_from_slice(&values);
        }
        Ok(())
    };
    let clocks = happens_before::clocks(s, &mut run).map_err(|stuck| match stuck {
        Stuck::Deadlock(progress) => VerifyError::Deadlock { progress },
        Stuck::Refused(e) => e,
    })?;
    // Clock of each rank's return: its last step plus its final waits.
    let finals = (0..n)
        .map(|r| clocks.at_return(r, &s.final_waits[r]))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| VerifyError::Deadlock {
            progress: s.steps.iter().map(Vec::len).collect(),
        })?;

    // Race check, per memory location.
    let mut accesses: HashMap<(usize, Buffer), Vec<Access>> = HashMap::new();
    for r in 0..n {
        for (i, step) in s.steps[r].iter().enumerate() {
            let operands = (step.sources.iter().map(|o| (o, false)))
                .chain(step.dsts.iter().map(|d| (d, true)));
            for (o, write) in operands {
                accesses
                    .entry(memory(o.rank, o.buffer))
                    .or_default()
                    .push(Access {
                        rank: r,
                        step: i,
                        range: o.offset..o.offset + step.len,
                        write,
                    });
            }
        }
        // The caller reuses all of the rank's memory once it returns.
        for b in [Buffer::Input, Buffer::Output, Buffer::Scratch] {
            let len = len_of(b);
            accesses.entry(memory(r, b)).or_default().push(Access {
                rank: r,
                step: usize::MAX,
                range: 0..len,
                write: true,
            });
        }
    }
    let clock_of = |a: &Access| {
        if a.step == usize::MAX {
            &finals[a.rank]
        } else {
            &clocks.start[a.rank][a.step]
        }
    };
    // a happens before b: b's clock has seen a complete (a's own later program order included).
    let before = |a: &Access, b: &Access| {
        if a.step == usize::MAX {
            return false;
        }
        if a.rank == b.rank {
            return b.step == usize::MAX || a.step < b.step;
        }
        clock_of(b)[a.rank] > a.step
    };
    for (mem, list) in &accesses {
        for (x, a) in list.iter().enumerate() {
            for b in &list[x + 1..] {
                let overlap = a.range.start < b.range.end && b.range.start < a.range.end;
                if !overlap || !(a.write || b.write) || (a.rank == b.rank && a.step == b.step) {
                    continue;
                }
                if !before(a, b) && !before(b, a) {
                    let show = |a: &Access| {
                        let what = if a.write { "writes" } else { "reads" };
                        if a.step == usize::MAX {
                            format!("rank {}'s caller reuses its buffers", a.rank)
                        } else {
                            format!("rank {} step {} {what} {:?}", a.rank, a.step, a.range)
                        }
                    };
                    return Err(VerifyError::Race {
                        memory: *mem,
                        between: format!("{} / {}", show(a), show(b)),
                    });
                }
            }
        }
    }
    Ok((0..n)
        .map(|r| state[&(r, Buffer::Output)].clone())
        .collect())
}
