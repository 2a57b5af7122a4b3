//! Every collective schedule, for every rank count 1..=16, proven without a device: no race
//! under any interleaving the waits allow, no deadlock, and each output element the sum of
//! every rank's input exactly once, with the same expression (so the same bits) on every rank.

use std::collections::BTreeSet;

use nanoddp::comm::schedule::{self, Algorithm};
use nanoddp::comm::tree::double_binary_tree;
use nanoddp::comm::verify::{verify, Expr};

fn check_all_reduce(algo: Algorithm, n: usize, count: usize, slice: usize, in_place: bool) {
    let s = schedule::all_reduce(algo, n, count, slice, in_place);
    let outputs = verify(&s, count, count, in_place).unwrap_or_else(|e| {
        panic!("{algo:?} n={n} count={count} slice={slice} in_place={in_place}: {e}")
    });
    for j in 0..count {
        let first = &outputs[0][j];
        let mut leaves = first.leaves();
        leaves.sort();
        let want: Vec<(usize, usize)> = (0..n).map(|r| (r, j)).collect();
        assert_eq!(
            leaves, want,
            "{algo:?} n={n} count={count}: element {j} is {first:?}"
        );
        for (r, out) in outputs.iter().enumerate() {
            assert_eq!(
                &out[j], first,
                "{algo:?} n={n}: rank {r} computes element {j} differently from rank 0"
            );
        }
    }
}

#[test]
fn every_allreduce_schedule_is_exact_and_race_free_for_1_to_16_ranks() {
    for n in 1usize..=16 {
        // Counts: 0, 1, fewer elements than ranks, not a multiple of n, several slices.
        for count in [0, 1, n.saturating_sub(1), 2 * n + 3, 7 * n + 5] {
            for slice in [1, 3, 64] {
                for algo in Algorithm::ALL {
                    for in_place in [false, true] {
                        check_all_reduce(algo, n, count, slice, in_place);
                    }
                }
            }
        }
    }
}

#[test]
fn reduce_scatter_all_gather_broadcast_barrier_are_correct() {
    for n in 1..=16 {
        for count in [0, 1, 5] {
            let s = schedule::reduce_scatter(n, count);
            let out = verify(&s, n * count, count, false)
                .unwrap_or_else(|e| panic!("reduce_scatter n={n}: {e}"));
            for (r, o) in out.iter().enumerate() {
                for (j, e) in o.iter().enumerate() {
                    let mut leaves = e.leaves();
                    leaves.sort();
                    assert_eq!(
                        leaves,
                        (0..n).map(|p| (p, r * count + j)).collect::<Vec<_>>()
                    );
                }
            }
            let s = schedule::all_gather(n, count);
            let out = verify(&s, count, n * count, false)
                .unwrap_or_else(|e| panic!("all_gather n={n}: {e}"));
            for o in &out {
                for (j, e) in o.iter().enumerate() {
                    assert_eq!(
                        **e,
                        Expr::Input {
                            rank: j / count.max(1),
                            index: j % count.max(1)
                        }
                    );
                }
            }
            for root in [0, n - 1, n / 2] {
                for in_place in [false, true] {
                    let s = schedule::broadcast(n, count, root, in_place);
                    let out = verify(&s, count, count, in_place)
                        .unwrap_or_else(|e| panic!("broadcast n={n}: {e}"));
                    for o in &out {
                        for (j, e) in o.iter().enumerate() {
                            assert_eq!(
                                **e,
                                Expr::Input {
                                    rank: root,
                                    index: j
                                }
                            );
                        }
                    }
                }
            }
            verify(&schedule::barrier(n), 0, 0, false)
                .unwrap_or_else(|e| panic!("barrier n={n}: {e}"));
        }
    }
}

#[test]
fn a_schedule_missing_a_wait_is_caught() {
    // Drop each wait of a ring schedule in turn: the verifier must object to every one
    // that matters, and at least one must matter.
    let base = schedule::all_reduce(Algorithm::Ring, 4, 11, 2, true);
    let mut caught = 0;
    for r in 0..4 {
        for i in 0..base.steps[r].len() {
            for w in 0..base.steps[r][i].waits.len() {
                let mut s = base.clone();
                s.steps[r][i].waits.remove(w);
                if verify(&s, 11, 11, true).is_err() {
                    caught += 1;
                }
            }
        }
    }
    assert!(caught > 0);
    let mut s = base.clone();
    s.final_waits[0].clear();
    assert!(
        verify(&s, 11, 11, true).is_err(),
        "returning before peers finished reading must be a race"
    );
}

#[test]
fn double_binary_trees_are_binary_shallow_and_complementary() {
    for n in 1..=64 {
        let trees = double_binary_tree(n);
        for t in &trees {
            assert_eq!(
                t.pre_order().iter().copied().collect::<BTreeSet<_>>().len(),
                n,
                "n={n}: every rank once"
            );
            assert!(t.children.iter().all(|c| c.len() <= 2), "n={n}: binary");
            let depth_bound = usize::BITS as usize - n.leading_zeros() as usize + 1;
            assert!(
                t.depth() <= depth_bound,
                "n={n}: depth {} > {depth_bound}",
                t.depth()
            );
        }
        if n % 2 == 0 {
            for r in 0..n {
                let interior = trees.iter().filter(|t| !t.children[r].is_empty()).count();
                assert!(interior <= 1, "n={n}: rank {r} is interior in both trees");
            }
        }
    }
}
