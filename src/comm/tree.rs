//! The double binary tree (NCCL's construction): tree 0 is a binary tree built from the bits
//! of the rank numbers, tree 1 its mirror image (rank → n-1-rank) when n is even or tree 0
//! shifted by one when n is odd. Every rank is then an interior node in at most one tree, so
//! when each tree carries half the data every rank moves about the same amount, while depth
//! stays log2(n).

/// A rooted tree over ranks 0..n.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    /// The root.
    pub root: usize,
    /// Parent of each rank (`None` for the root).
    pub parent: Vec<Option<usize>>,
    /// Children of each rank, in the order their partial sums are added.
    pub children: Vec<Vec<usize>>,
}

impl Tree {
    fn from_parents(root: usize, parent: Vec<Option<usize>>) -> Self {
        let mut children = vec![Vec::new(); parent.len()];
        for (r, p) in parent.iter().enumerate() {
            if let Some(p) = p {
                children[*p].push(r);
            }
        }
        Tree {
            root,
            parent,
            children,
        }
    }

    /// Ranks with every child before its parent.
    pub fn post_order(&self) -> Vec<usize> {
        let mut out = self.pre_order();
        out.reverse();
        out
    }

    /// Ranks with every parent before its children (breadth-first from the root).
    pub fn pre_order(&self) -> Vec<usize> {
        let mut out = vec![self.root];
        let mut i = 0;
        while i < out.len() {
            out.extend(self.children[out[i]].iter().copied());
            i += 1;
        }
        out
    }

    /// Longest root-to-leaf path, in edges.
    pub fn depth(&self) -> usize {
        (0..self.parent.len())
            .map(|mut r| {
                let mut d = 0;
                while let Some(p) = self.parent[r] {
                    r = p;
                    d += 1;
                }
                d
            })
            .max()
            .unwrap_or(0)
    }
}

/// Tree 0: the parent of rank r clears r's lowest set bit and sets the next one (or just
/// clears it when that would leave 0..n); rank 0 is the root with the single child
/// 2^(⌈log2 n⌉-1).
fn binary_tree(n: usize) -> Tree {
    let parent = (0..n)
        .map(|r| {
            if r == 0 {
                return None;
            }
            let bit = r & r.wrapping_neg(); // lowest set bit
            let up = (r ^ bit) | (bit << 1);
            Some(if up >= n { r ^ bit } else { up })
        })
        .collect();
    Tree::from_parents(0, parent)
}

/// The two trees for `n` ranks.
pub fn double_binary_tree(n: usize) -> [Tree; 2] {
    let t0 = binary_tree(n);
    let map: Box<dyn Fn(usize) -> usize> = if n.is_multiple_of(2) {
        Box::new(move |r| n - 1 - r)
    } else {
        Box::new(move |r| (r + 1) % n)
    };
    let mut parent = vec![None; n];
    for (r, p) in t0.parent.iter().enumerate() {
        parent[map(r)] = p.map(&map);
    }
    let t1 = Tree::from_parents(map(t0.root), parent);
    [t0, t1]
}
