//! Gradient buckets: which gradients are reduced together, as PyTorch DDP groups them.

use crate::model::{BACKWARD_ORDER, PARAMS};

/// Gradient buckets, as PyTorch DDP forms them: tensors in the order the backward pass
/// finishes them ([`BACKWARD_ORDER`]), a bucket closed once it holds at least `cap_bytes`
/// (so a bucket is never split inside a tensor). `cap_bytes` 0 means one bucket.
///
/// ```
/// // LeNet at 64 KiB: [fc2.weight, fc2.bias, fc1.weight], [fc1.bias, conv2.weight],
/// // [conv2.bias, conv1.weight, conv1.bias].
/// assert_eq!(
///     nanoddp::train::gradient_buckets(64 << 10),
///     vec![vec![6, 7, 4], vec![5, 2], vec![3, 0, 1]]
/// );
/// ```
pub fn gradient_buckets(cap_bytes: usize) -> Vec<Vec<usize>> {
    let mut buckets = vec![Vec::new()];
    let mut bytes = 0;
    for i in BACKWARD_ORDER {
        let open = buckets.last_mut().expect("never empty");
        open.push(i);
        bytes += PARAMS[i].len() * std::mem::size_of::<f32>();
        if cap_bytes > 0 && bytes >= cap_bytes {
            buckets.push(Vec::new());
            bytes = 0;
        }
    }
    buckets.retain(|b| !b.is_empty());
    buckets
}
