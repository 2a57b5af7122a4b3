//! The happens-before order a [`Schedule`]'s waits define, as vector clocks: the one
//! computation behind the verifier's race check ([`super::verify`]) and the lowering of
//! schedules to message programs ([`super::messages`]).
//!
//! A rank's clock holds, for every rank, how many of its steps are known complete. A step
//! starts with its rank's clock after its previous step, joined (element-wise maximum) with
//! the clock of every step it waits for; once it completes, its own entry counts it. Step
//! `(p, k)` happens before step `(r, j)` exactly when `start[r][j][p] > k`.

use super::schedule::Schedule;

/// Every step's vector clocks, for a schedule all of whose steps can run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clocks {
    /// `start[r][j]`: rank `r`'s clock when its step `j` starts.
    pub start: Vec<Vec<Vec<usize>>>,
    /// `done[r][k]`: rank `r`'s clock once it has completed `k` steps (`done[r][0]` is all
    /// zeros).
    pub done: Vec<Vec<Vec<usize>>>,
}

/// Why the clocks could not be computed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stuck<E> {
    /// Some steps can never run: the steps completed per rank when nothing could run any
    /// more.
    Deadlock(Vec<usize>),
    /// The visitor refused a step.
    Refused(E),
}

/// Runs the schedule's steps in rounds (each rank as far as its waits allow, rank by rank,
/// until nothing moves), calling `visit(rank, step)` as each step runs (one execution the
/// waits allow, in that order), and returns every step's clocks. A wait on a rank or step
/// that does not exist never completes (a deadlock).
pub fn clocks<E>(
    schedule: &Schedule,
    mut visit: impl FnMut(usize, usize) -> Result<(), E>,
) -> Result<Clocks, Stuck<E>> {
    let n = schedule.n;
    let steps = &schedule.steps;
    let mut done: Vec<Vec<Vec<usize>>> = (0..n).map(|_| vec![vec![0; n]]).collect();
    let mut start: Vec<Vec<Vec<usize>>> = (0..n).map(|_| Vec::new()).collect();
    loop {
        let mut moved = false;
        for r in 0..n {
            while start[r].len() < steps[r].len() {
                let j = start[r].len();
                let mut clock = done[r][j].clone();
                let mut ready = true;
                for &(p, k) in &steps[r][j].waits {
                    match done.get(p).and_then(|d| d.get(k)) {
                        Some(w) => clock.iter_mut().zip(w).for_each(|(a, b)| *a = (*a).max(*b)),
                        None => {
                            ready = false;
                            break;
                        }
                    }
                }
                if !ready {
                    break;
                }
                visit(r, j).map_err(Stuck::Refused)?;
                start[r].push(clock.clone());
                clock[r] = j + 1;
                done[r].push(clock);
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    if (0..n).any(|r| start[r].len() < steps[r].len()) {
        return Err(Stuck::Deadlock(start.iter().map(Vec::len).collect()));
    }
    Ok(Clocks { start, done })
}

impl Clocks {
    /// Rank `rank`'s clock when it returns: after its last step and `final_waits` (the
    /// schedule's for it). `None` if one of them names a step that does not exist.
    pub fn at_return(&self, rank: usize, final_waits: &[(usize, usize)]) -> Option<Vec<usize>> {
        let mut clock = self.done[rank].last()?.clone();
        for &(p, k) in final_waits {
            let w = self.done.get(p)?.get(k)?;
            clock.iter_mut().zip(w).for_each(|(a, b)| *a = (*a).max(*b));
        }
        Some(clock)
    }
}
