//! The same schedules over messages: a [`Schedule`] is written for ranks that read and write
//! each other's memory and wait on each other's step counters. Ranks that are processes
//! (MPI) share no memory, so this module lowers a schedule to one program per rank of sends,
//! receives and local steps, then runs such a program over any [`Wire`].
//!
//! The lowering follows the happens-before order the schedule's waits define (vector
//! clocks, [`super::happens_before`], as the verifier's):
//! * a step of rank r that **reads** peer p's memory receives those elements from p; p sends
//!   them right after completing the steps that happen before the read (the verifier's
//!   race freedom guarantees p writes them neither later nor concurrently);
//! * a step of rank r that **writes** peer q's memory (a push) sends the result to q, which
//!   stores it just before its first step that happens after the push (or before returning).
//!
//! Sends are non-blocking; a receive blocks only where the shared-memory rank would have
//! waited anyway, so the message programs cannot deadlock where the schedule does not.
//! Within one position the sends and stores are ordered by a linear extension of the
//! happens-before order. Reductions are computed locally in the same order and arithmetic
//! as the in-process transports (f32 accumulation in source order, one rounding at the
//! store), so results are bitwise identical to theirs.

use std::collections::HashMap;

use super::communicator::CommError;
use super::happens_before::{self, Stuck};
use super::schedule::{Buffer, Operand, Schedule};
use crate::backend::Precision;

/// A contiguous range of one of the executing rank's own buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// Which buffer.
    pub buffer: Buffer,
    /// First element.
    pub offset: usize,
}

/// Where a step's operand comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The rank's own memory.
    Local(Region),
    /// A message from `from` with `tag` (the peer's elements, sent for this step).
    Received {
        /// Sender.
        from: usize,
        /// Its tag on the (from, to) pair.
        tag: u32,
    },
}

/// One action of a rank's message program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send `len` elements of own memory at `region` to `to`.
    Send {
        /// Receiver.
        to: usize,
        /// Tag on the (self, to) pair.
        tag: u32,
        /// What to send.
        region: Region,
        /// Elements.
        len: usize,
    },
    /// Receive a peer's push into own memory.
    Store {
        /// Sender.
        from: usize,
        /// Tag on the (from, self) pair.
        tag: u32,
        /// Where it goes.
        region: Region,
        /// Elements.
        len: usize,
    },
    /// A local step: reduce `sources` (in order) into every local destination, then send
    /// the result to each remote destination.
    Step {
        /// Operands, summed in this order.
        sources: Vec<Source>,
        /// Own memory written.
        local: Vec<Region>,
        /// Pushes: (receiver, tag).
        remote: Vec<(usize, u32)>,
        /// Elements.
        len: usize,
    },
}

/// Per rank, its actions in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// Ranks.
    pub n: usize,
    /// Each rank's actions.
    pub actions: Vec<Vec<Action>>,
    /// Scratch elements each rank needs.
    pub scratch: usize,
}

impl Program {
    /// Messages the program sends in all.
    pub fn messages(&self) -> usize {
        self.actions
            .iter()
            .flatten()
            .map(|a| match a {
                Action::Send { .. } => 1,
                Action::Step { remote, .. } => remote.len(),
                Action::Store { .. } => 0,
            })
            .sum()
    }
}

fn region(o: &Operand) -> Region {
    Region {
        buffer: o.buffer,
        offset: o.offset,
    }
}

/// Same memory? Input and Output are one buffer when the collective runs in place.
fn same_buffer(a: Buffer, b: Buffer, in_place: bool) -> bool {
    a == b || (in_place && a != Buffer::Scratch && b != Buffer::Scratch)
}

/// Lowers `schedule` (run in place or not) to message programs. Fails only for a schedule
/// whose data flow messages cannot express (none of this crate's; a test checks them all).
pub fn lower(schedule: &Schedule, in_place: bool) -> Result<Program, String> {
    let n = schedule.n;
    let steps = &schedule.steps;
    let clocks = happens_before::clocks(schedule, |_, _| Ok::<(), std::convert::Infallible>(()))
        .map_err(|stuck| match stuck {
            Stuck::Deadlock(progress) => format!("the schedule deadlocks: progress {progress:?}"),
            Stuck::Refused(never) => match never {},
        })?;
    let (start, done) = (&clocks.start, &clocks.done);
    let done_vc = |r: usize, k: usize| &done[r][k];
    let sum = |v: &[usize]| v.iter().sum::<usize>();

    // Positioned actions: (rank, position = steps completed before it, order key, action).
    let mut placed: Vec<(usize, usize, (usize, u8), Action)> = Vec::new();
    let mut tags: HashMap<(usize, usize), u32> = HashMap::new();
    let mut next_tag = |from: usize, to: usize| {
        let t = tags.entry((from, to)).or_insert(0);
        *t += 1;
        *t - 1
    };
    // Pushes into each rank's memory: (target rank, region, len, pusher, step, store position).
    let mut pushes: Vec<(usize, Region, usize, usize, usize, usize)> = Vec::new();
    for (r, rs) in steps.iter().enumerate() {
        for (j, step) in rs.iter().enumerate() {
            for d in step.dsts.iter().filter(|d| d.rank != r) {
                let q = d.rank;
                let at = (0..steps[q].len())
                    .find(|&s| start[q][s][r] > j)
                    .unwrap_or(steps[q].len());
                pushes.push((q, region(d), step.len, r, j, at));
            }
        }
    }
    for (r, rs) in steps.iter().enumerate() {
        for (j, step) in rs.iter().enumerate() {
            let mut sources = Vec::new();
            for s in &step.sources {
                if s.rank == r {
                    sources.push(Source::Local(region(s)));
                    continue;
                }
                let p = s.rank;
                let at = start[r][j][p];
                // Every push into the region that happens before this read must be stored first.
                for &(q, reg, len, pusher, pj, store_at) in &pushes {
                    let overlaps = q == p
                        && same_buffer(reg.buffer, s.buffer, in_place)
                        && reg.offset < s.offset + step.len
                        && s.offset < reg.offset + len;
                    if overlaps && start[r][j][pusher] > pj && store_at > at {
                        return Err(format!(
                            "rank {r} step {j} reads rank {p}'s memory pushed by rank {pusher} step {pj}, \
                             stored only after the read is served"
                        ));
                    }
                }
                let tag = next_tag(p, r);
                placed.push((
                    p,
                    at,
                    (sum(&start[r][j]), 0),
                    Action::Send {
                        to: r,
                        tag,
                        region: region(s),
                        len: step.len,
                    },
                ));
                sources.push(Source::Received { from: p, tag });
            }
            let local: Vec<Region> = step
                .dsts
                .iter()
                .filter(|d| d.rank == r)
                .map(region)
                .collect();
            let mut remote = Vec::new();
            for d in step.dsts.iter().filter(|d| d.rank != r) {
                let tag = next_tag(r, d.rank);
                remote.push((d.rank, tag));
                let store_at = (0..steps[d.rank].len())
                    .find(|&s| start[d.rank][s][r] > j)
                    .unwrap_or(steps[d.rank].len());
                placed.push((
                    d.rank,
                    store_at,
                    (sum(done_vc(r, j + 1)), 1),
                    Action::Store {
                        from: r,
                        tag,
                        region: region(d),
                        len: step.len,
                    },
                ));
            }
            // The step itself sits at position j, after everything placed there.
            placed.push((
                r,
                j,
                (usize::MAX, 2),
                Action::Step {
                    sources,
                    local,
                    remote,
                    len: step.len,
                },
            ));
        }
    }
    placed.sort_by_key(|(r, at, key, _)| (*r, *at, *key));
    let mut actions = vec![Vec::new(); n];
    for (r, _, _, a) in placed {
        actions[r].push(a);
    }
    Ok(Program {
        n,
        actions,
        scratch: schedule.scratch,
    })
}

/// Point-to-point transport between the ranks of a program.
pub trait Wire {
    /// Starts sending `bytes` to `to` (must not block on the receiver).
    fn send(&mut self, to: usize, tag: u32, bytes: Vec<u8>) -> Result<(), CommError>;
    /// Receives the message `tag` from `from` (exactly `len` bytes), blocking up to the wire's
    /// timeout.
    fn recv(&mut self, from: usize, tag: u32, len: usize) -> Result<Vec<u8>, CommError>;
    /// Waits until every send started has completed.
    fn finish(&mut self) -> Result<(), CommError>;
}

const BLOCK: usize = 1024;

/// Runs rank `me`'s program over `wire`: `output` starts as the input (in place) or
/// `input` is given separately; `scale` multiplies every result (1 for sum, 1/n for avg).
pub fn execute<T: Precision>(
    program: &Program,
    me: usize,
    input: Option<&[T]>,
    output: &mut [T],
    scale: f32,
    wire: &mut impl Wire,
) -> Result<(), CommError> {
    let mut scratch = vec![T::zeroed(); program.scratch];
    let invalid = |detail: String| CommError::Invalid { me, detail };
    for action in &program.actions[me] {
        match action {
            Action::Send {
                to,
                tag,
                region,
                len,
            } => {
                let data = read(region, *len, input, output, &scratch).ok_or_else(|| {
                    invalid(format!(
                        "send of {len} elements at {region:?} is out of bounds"
                    ))
                })?;
                wire.send(*to, *tag, bytemuck::cast_slice(data).to_vec())?;
            }
            Action::Store {
                from,
                tag,
                region,
                len,
            } => {
                let bytes = wire.recv(*from, *tag, len * size_of::<T>())?;
                let data: Vec<T> = bytemuck::pod_collect_to_vec(&bytes);
                write(region, &data, output, &mut scratch)
                    .ok_or_else(|| invalid(format!("store at {region:?} is out of bounds")))?;
            }
            Action::Step {
                sources,
                local,
                remote,
                len,
            } => {
                let mut received: Vec<Vec<T>> = Vec::new();
                for s in sources {
                    if let Source::Received { from, tag } = s {
                        let bytes = wire.recv(*from, *tag, len * size_of::<T>())?;
                        received.push(bytemuck::pod_collect_to_vec(&bytes));
                    }
                }
                let mut result = vec![T::zeroed(); *len];
                let mut acc = [0.0f32; BLOCK];
                let mut startb = 0;
                while startb < *len {
                    let m = BLOCK.min(len - startb);
                    let mut next_received = 0;
                    for (k, s) in sources.iter().enumerate() {
                        let src: &[T] = match s {
                            Source::Local(r) => {
                                read(r, *len, input, output, &scratch).ok_or_else(|| {
                                    invalid(format!("read at {r:?} is out of bounds"))
                                })?
                            }
                            Source::Received { .. } => {
                                next_received += 1;
                                &received[next_received - 1]
                            }
                        };
                        let src = &src[startb..startb + m];
                        if k == 0 {
                            acc[..m]
                                .iter_mut()
                                .zip(src)
                                .for_each(|(a, v)| *a = v.to_f32());
                        } else {
                            acc[..m]
                                .iter_mut()
                                .zip(src)
                                .for_each(|(a, v)| *a += v.to_f32());
                        }
                    }
                    result[startb..startb + m]
                        .iter_mut()
                        .zip(&acc[..m])
                        .for_each(|(d, a)| *d = T::from_f32(a * scale));
                    startb += m;
                }
                for r in local {
                    write(r, &result, output, &mut scratch)
                        .ok_or_else(|| invalid(format!("write at {r:?} is out of bounds")))?;
                }
                for &(to, tag) in remote {
                    wire.send(to, tag, bytemuck::cast_slice(&result).to_vec())?;
                }
            }
        }
    }
    wire.finish()
}

fn read<'a, T>(
    r: &Region,
    len: usize,
    input: Option<&'a [T]>,
    output: &'a [T],
    scratch: &'a [T],
) -> Option<&'a [T]> {
    let buf = match (r.buffer, input) {
        (Buffer::Input, Some(i)) => i,
        (Buffer::Input, None) | (Buffer::Output, _) => output,
        (Buffer::Scratch, _) => scratch,
    };
    buf.get(r.offset..r.offset.checked_add(len)?)
}

fn write<T: Copy>(r: &Region, data: &[T], output: &mut [T], scratch: &mut [T]) -> Option<()> {
    let buf = match r.buffer {
        Buffer::Input | Buffer::Output => output,
        Buffer::Scratch => scratch,
    };
    buf.get_mut(r.offset..r.offset.checked_add(data.len())?)?
        .copy_from_slice(data);
    Some(())
}

/// A [`Wire`] between threads of one process (channels): for tests and for studying the
/// message programs without MPI.
pub mod threads {
    use std::collections::HashMap;
    use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
    use std::time::{Duration, Instant};

    use super::{CommError, Wire};

    /// One rank's end: a sender to every peer and its own inbox.
    pub struct ThreadWire {
        me: usize,
        peers: Vec<Sender<(usize, u32, Vec<u8>)>>,
        inbox: Receiver<(usize, u32, Vec<u8>)>,
        early: HashMap<(usize, u32), Vec<u8>>,
        timeout: Duration,
    }

    /// `n` connected wires, one per rank.
    pub fn wires(n: usize, timeout: Duration) -> Vec<ThreadWire> {
        let (senders, inboxes): (Vec<_>, Vec<_>) = (0..n).map(|_| channel()).unzip();
        inboxes
            .into_iter()
            .enumerate()
            .map(|(me, inbox)| ThreadWire {
                me,
                peers: senders.clone(),
                inbox,
                early: HashMap::new(),
                timeout,
            })
            .collect()
    }

    impl Wire for ThreadWire {
        fn send(&mut self, to: usize, tag: u32, bytes: Vec<u8>) -> Result<(), CommError> {
            self.peers[to]
                .send((self.me, tag, bytes))
                .map_err(|_| CommError::PeerGone {
                    me: self.me,
                    peer: to,
                })
        }

        fn recv(&mut self, from: usize, tag: u32, len: usize) -> Result<Vec<u8>, CommError> {
            let deadline = Instant::now() + self.timeout;
            loop {
                if let Some(bytes) = self.early.remove(&(from, tag)) {
                    if bytes.len() != len {
                        return Err(CommError::Invalid {
                            me: self.me,
                            detail: format!(
                                "message {tag} from rank {from} has {} bytes, expected {len}",
                                bytes.len()
                            ),
                        });
                    }
                    return Ok(bytes);
                }
                let left = deadline.saturating_duration_since(Instant::now());
                match self.inbox.recv_timeout(left) {
                    Ok((f, t, b)) => {
                        self.early.insert((f, t), b);
                    }
                    Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                        return Err(CommError::Timeout {
                            me: self.me,
                            peer: from,
                            what: format!("message {tag}"),
                            seconds: self.timeout.as_secs_f64(),
                        })
                    }
                }
            }
        }

        fn finish(&mut self) -> Result<(), CommError> {
            Ok(())
        }
    }
}
