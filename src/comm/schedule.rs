//! Collective algorithms as data: for `n` ranks and `count` elements, the list of steps each
//! rank executes. A step reads operands that may live in a peer's memory (all ranks share one
//! address space: threads, emulated devices, or GPUs with peer access), reduces or copies them
//! into a range of the rank's own output, and then publishes "I have completed k steps".
//! Before it starts, a step waits until named peers have completed a number of their steps.
//!
//! Nothing here knows about devices. [`crate::comm::verify`] proves a schedule correct for
//! every interleaving the waits allow: no read races a write, each output element ends up as
//! the sum of every rank's input exactly once, and every rank ends with the same expression
//! (so results are bitwise identical across ranks).

use std::ops::Range;

use super::tree::double_binary_tree;

/// One of a rank's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Buffer {
    /// The collective's input (the same memory as `Output` when in place).
    Input,
    /// The collective's output.
    Output,
    /// The rank's private scratch (bounded; used only by one-shot in place).
    Scratch,
}

/// A contiguous range of some rank's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operand {
    /// Whose memory.
    pub rank: usize,
    /// Which buffer.
    pub buffer: Buffer,
    /// First element.
    pub offset: usize,
}

/// What a step computes: `len` elements summed from `sources`, stored to every destination.
/// Element by element, all sources are read before any destination is written, so a
/// destination may be one of the sources (in-place reduction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Where the result goes: the executing rank's memory, or peers' (a "push").
    pub dsts: Vec<Operand>,
    /// Elements.
    pub len: usize,
    /// Summed in this order (f32 accumulation, one rounding at the store); one source is a copy.
    pub sources: Vec<Operand>,
    /// Wait until each `(rank, k)` has completed `k` steps of this collective.
    pub waits: Vec<(usize, usize)>,
}

/// Every rank's steps, plus what each rank waits for before it may return (so that no peer
/// still reads its buffers once the caller reuses them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// Ranks.
    pub n: usize,
    /// Steps per rank, in execution order.
    pub steps: Vec<Vec<Step>>,
    /// Per rank: `(peer, k)` pairs awaited after the last step.
    pub final_waits: Vec<Vec<(usize, usize)>>,
    /// Elements of scratch each rank needs.
    pub scratch: usize,
}

/// Allreduce algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Reduce-scatter then all-gather around a ring, 2(n-1) steps per slice.
    Ring,
    /// Pipelined double binary tree: two trees, each carrying half the data.
    Tree,
    /// Two-shot, fused: rank r reduces chunk r from every input and writes it to every output.
    Direct,
    /// Every rank sums every rank's whole input (small messages).
    OneShot,
}

impl Algorithm {
    /// All of them.
    pub const ALL: [Algorithm; 4] = [
        Algorithm::Ring,
        Algorithm::Tree,
        Algorithm::Direct,
        Algorithm::OneShot,
    ];

    /// Lower-case name, as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
            Algorithm::Direct => "direct",
            Algorithm::OneShot => "oneshot",
        }
    }
}

/// Splits `0..count` into `parts` contiguous ranges whose lengths differ by at most one.
pub fn split(count: usize, parts: usize) -> Vec<Range<usize>> {
    let (base, extra) = (count / parts, count % parts);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let r = start..start + len;
            start += len;
            r
        })
        .collect()
}

fn own(rank: usize, buffer: Buffer, offset: usize) -> Operand {
    Operand {
        rank,
        buffer,
        offset,
    }
}

/// Builder that tracks each rank's step count, so waits can name "the step just pushed".
struct Builder {
    steps: Vec<Vec<Step>>,
}

impl Builder {
    fn new(n: usize) -> Self {
        Builder {
            steps: vec![Vec::new(); n],
        }
    }

    /// Appends a step to `rank` and returns how many steps `rank` has after it. Empty steps
    /// are kept (they cost one flag update) so every rank's step numbering is the same
    /// function of the algorithm, whatever the count.
    fn push(&mut self, rank: usize, step: Step) -> usize {
        self.steps[rank].push(step);
        self.steps[rank].len()
    }

    /// [`push`](Self::push)es the most common step: `rank` stores the sum of `sources` into
    /// `len` elements of its own output from `offset`.
    fn push_into_output(
        &mut self,
        rank: usize,
        offset: usize,
        len: usize,
        sources: Vec<Operand>,
        waits: Vec<(usize, usize)>,
    ) -> usize {
        let step = Step {
            dsts: vec![own(rank, Buffer::Output, offset)],
            len,
            sources,
            waits,
        };
        self.push(rank, step)
    }

    fn done(&self, rank: usize) -> usize {
        self.steps[rank].len()
    }

    /// The schedule of the steps pushed, with `scratch` elements of scratch per rank and
    /// final waits making each rank outlive every read of its memory: everyone waits for
    /// everyone (one all-to-all of flags; cheap next to the data movement).
    fn finish(self, scratch: usize) -> Schedule {
        let n = self.steps.len();
        let final_waits = (0..n)
            .map(|r| {
                (0..n)
                    .filter(|&p| p != r)
                    .map(|p| (p, self.done(p)))
                    .collect()
            })
            .collect();
        Schedule {
            n,
            final_waits,
            steps: self.steps,
            scratch,
        }
    }
}

/// The allreduce schedule of `algorithm` for `n` ranks and `count` elements. `slice` is the
/// pipelining granularity in elements (ring and tree move the data in pieces of about this
/// size, so several are in flight and each stays in cache); `in_place` says whether Input and
/// Output are the same memory.
pub fn all_reduce(
    algorithm: Algorithm,
    n: usize,
    count: usize,
    slice: usize,
    in_place: bool,
) -> Schedule {
    assert!(n >= 1 && slice >= 1);
    if n == 1 {
        let mut b = Builder::new(1);
        if !in_place {
            b.push_into_output(0, 0, count, vec![own(0, Buffer::Input, 0)], vec![]);
        }
        return Schedule {
            n,
            final_waits: vec![vec![]],
            steps: b.steps,
            scratch: 0,
        };
    }
    match algorithm {
        Algorithm::Ring => ring(n, count, slice),
        Algorithm::Tree => tree(n, count, slice),
        Algorithm::Direct => direct(n, count),
        Algorithm::OneShot => one_shot(n, count, in_place),
    }
}

/// Ring, read-based. Per slice (n chunks), reduce-scatter step s: rank r sets chunk
/// (r-1-s) mod n to its own input plus rank r-1's partial of that chunk, which r-1 produced at
/// its previous step; after n-1 steps rank r holds the full sum of chunk (r+1) mod n. All-gather
/// step t: rank r copies chunk (r-t) mod n from rank r-1. Before overwriting a chunk that rank
/// r+1 still has to read as a partial, rank r waits for r+1 to have read it.
fn ring(n: usize, count: usize, slice: usize) -> Schedule {
    let mut b = Builder::new(n);
    // Each slice is n chunks of about `slice` elements: big enough to stream, small enough
    // that several slices are in flight around the ring.
    let slices = split(count, count.div_ceil(slice * n).max(1));
    for span in slices {
        let chunks: Vec<Range<usize>> = split(span.len(), n)
            .into_iter()
            .map(|c| c.start + span.start..c.end + span.start)
            .collect();
        let start: Vec<usize> = (0..n).map(|r| b.done(r)).collect(); // steps done before this slice
        let chunk = |i: isize| chunks[i.rem_euclid(n as isize) as usize].clone();
        // Reduce-scatter.
        for s in 0..n - 1 {
            for r in 0..n {
                let left = (r + n - 1) % n;
                let c = chunk(r as isize - 1 - s as isize);
                let peer_buf = if s == 0 {
                    Buffer::Input
                } else {
                    Buffer::Output
                };
                // Step 0 reads left's input, which left overwrites only after we have read it
                // (its all-gather waits for us); later steps need left's previous partial.
                let waits = if s == 0 {
                    vec![]
                } else {
                    vec![(left, start[left] + s)]
                };
                b.push_into_output(
                    r,
                    c.start,
                    c.len(),
                    vec![own(r, Buffer::Input, c.start), own(left, peer_buf, c.start)],
                    waits,
                );
            }
        }
        // All-gather.
        for t in 0..n - 1 {
            for r in 0..n {
                let (left, right) = ((r + n - 1) % n, (r + 1) % n);
                let c = chunk(r as isize - t as isize);
                // Left holds the final chunk after its reduce-scatter (t = 0) or its step t-1.
                // Right reads our partial of chunk (r - t) at its reduce-scatter step t: wait
                // until it has, before overwriting it with the final sum.
                let waits = vec![
                    (left, start[left] + n - 1 + t),
                    (right, start[right] + t + 1),
                ];
                b.push_into_output(
                    r,
                    c.start,
                    c.len(),
                    vec![own(left, Buffer::Output, c.start)],
                    waits,
                );
            }
        }
    }
    b.finish(0)
}

/// Pipelined double binary tree. The data is halved, one half per tree; each half is cut in
/// slices that flow up (children's partials summed into the parent's output, in child order)
/// and then down (children copy the root's result from their parent).
fn tree(n: usize, count: usize, slice: usize) -> Schedule {
    let mut b = Builder::new(n);
    let trees = double_binary_tree(n);
    let halves = split(count, 2);
    // Per tree, per slice: steps are appended in slice order; interleaving the two trees' slices
    // lets a rank that is a leaf in one tree work on the other while it waits.
    let mut plans: Vec<Vec<Range<usize>>> = halves
        .iter()
        .map(|h| {
            split(h.len(), h.len().div_ceil(slice).max(1))
                .into_iter()
                .map(|s| s.start + h.start..s.end + h.start)
                .collect()
        })
        .collect();
    let most = plans.iter().map(Vec::len).max().unwrap_or(0);
    for plan in &mut plans {
        plan.resize(most, 0..0);
    }
    // Slice k of both trees, tree 0 first.
    let pairs: Vec<[Range<usize>; 2]> = (0..most)
        .map(|k| [plans[0][k].clone(), plans[1][k].clone()])
        .collect();
    for pair in pairs {
        for (tr, s) in trees.iter().zip(pair) {
            if s.is_empty() {
                continue;
            }
            // Up: children before parents (post-order). up_done[r]: rank r's step count once its
            // partial of this slice is in its output.
            let mut up_done = vec![0usize; n];
            for &r in &tr.post_order() {
                let kids = &tr.children[r];
                if kids.is_empty() {
                    continue; // a leaf's partial is its input
                }
                let mut sources = vec![own(r, Buffer::Input, s.start)];
                let mut waits = Vec::new();
                for &c in kids {
                    let leaf = tr.children[c].is_empty();
                    sources.push(own(
                        c,
                        if leaf { Buffer::Input } else { Buffer::Output },
                        s.start,
                    ));
                    if !leaf {
                        waits.push((c, up_done[c]));
                    }
                }
                up_done[r] = b.push_into_output(r, s.start, s.len(), sources, waits);
            }
            // Down: parents before children (pre-order). The root already holds the result.
            let mut final_done = up_done.clone();
            for &r in &tr.pre_order() {
                let Some(p) = tr.parent[r] else { continue };
                // Waiting for the parent's result also means the parent has read our partial (or,
                // for a leaf, our input), which this copy is about to overwrite.
                let waits = vec![(p, final_done[p])];
                final_done[r] = b.push_into_output(
                    r,
                    s.start,
                    s.len(),
                    vec![own(p, Buffer::Output, s.start)],
                    waits,
                );
            }
        }
    }
    b.finish(0)
}

/// Direct (two-shot, fused): rank r reads chunk r of every rank's input, sums it (in rank
/// order, so every chunk sees the same order) and writes the sum into chunk r of every
/// rank's output. One step per rank, and each rank reads S and writes S in total: the
/// memory-traffic minimum. No waits are needed during the step: chunk r of any buffer is
/// touched by rank r alone (in place, rank r reads a peer's chunk r before overwriting it,
/// element by element); returning waits until every peer has written its chunk into us.
fn direct(n: usize, count: usize) -> Schedule {
    let mut b = Builder::new(n);
    for (r, c) in split(count, n).into_iter().enumerate() {
        b.push(
            r,
            Step {
                dsts: (0..n).map(|p| own(p, Buffer::Output, c.start)).collect(),
                len: c.len(),
                sources: (0..n).map(|p| own(p, Buffer::Input, c.start)).collect(),
                waits: vec![],
            },
        );
    }
    b.finish(0)
}

/// One-shot: every rank sums every rank's input (rank order). In place, the sum goes to
/// scratch first, and the copy back waits until every peer has read our input.
fn one_shot(n: usize, count: usize, in_place: bool) -> Schedule {
    let mut b = Builder::new(n);
    let sources = || -> Vec<Operand> { (0..n).map(|p| own(p, Buffer::Input, 0)).collect() };
    if !in_place {
        for r in 0..n {
            b.push_into_output(r, 0, count, sources(), vec![]);
        }
        return b.finish(0);
    }
    let summed: Vec<usize> = (0..n)
        .map(|r| {
            b.push(
                r,
                Step {
                    dsts: vec![own(r, Buffer::Scratch, 0)],
                    len: count,
                    sources: sources(),
                    waits: vec![],
                },
            )
        })
        .collect();
    for r in 0..n {
        let waits = (0..n).filter(|&p| p != r).map(|p| (p, summed[p])).collect();
        b.push_into_output(r, 0, count, vec![own(r, Buffer::Scratch, 0)], waits);
    }
    b.finish(count)
}

/// Reduce-scatter: rank r's output (count elements) is the sum over ranks of their input
/// block r (inputs hold n·count elements). Direct: one step per rank.
pub fn reduce_scatter(n: usize, count: usize) -> Schedule {
    let mut b = Builder::new(n);
    for r in 0..n {
        let sources = (0..n).map(|p| own(p, Buffer::Input, r * count)).collect();
        b.push_into_output(r, 0, count, sources, vec![]);
    }
    b.finish(0)
}

/// All-gather: rank r's output (n·count) holds every rank's input (count) in rank order.
pub fn all_gather(n: usize, count: usize) -> Schedule {
    let mut b = Builder::new(n);
    for r in 0..n {
        for i in 0..n {
            let p = (r + i) % n;
            b.push_into_output(r, p * count, count, vec![own(p, Buffer::Input, 0)], vec![]);
        }
    }
    b.finish(0)
}

/// Broadcast from `root`: every rank's output becomes the root's input (in place, the root's
/// buffer is both and it does nothing).
pub fn broadcast(n: usize, count: usize, root: usize, in_place: bool) -> Schedule {
    let mut b = Builder::new(n);
    for r in (0..n).filter(|&r| !(in_place && r == root)) {
        b.push_into_output(r, 0, count, vec![own(root, Buffer::Input, 0)], vec![]);
    }
    b.finish(0)
}

/// Barrier: no data, everyone waits for everyone to arrive.
pub fn barrier(n: usize) -> Schedule {
    Schedule {
        n,
        steps: vec![Vec::new(); n],
        final_waits: (0..n)
            .map(|r| (0..n).filter(|&p| p != r).map(|p| (p, 0)).collect())
            .collect(),
        scratch: 0,
    }
}
