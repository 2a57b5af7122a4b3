//! The network, described once: every size the model uses (layer shapes, activation
//! buffers, the parameter table and the order the backward pass finishes it) derives from
//! [`LENET`], so a different small CNN of the same form is one edit here.

use crate::backend::{Conv2dShape, GemmShape, Pool2dShape};

/// A convolution of the description: output channels and the square kernel's side (stride
/// 1, no padding), followed by a ReLU and the architecture's average pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvLayer {
    /// Output channels.
    pub out_c: usize,
    /// Kernel side.
    pub kernel: usize,
}

/// A LeNet-form network: two convolutions, each followed by ReLU and a square average
/// pool, then a hidden linear layer with ReLU and the linear classifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Architecture {
    /// Input image side (square images).
    pub image: usize,
    /// Input channels.
    pub in_c: usize,
    /// The first convolution.
    pub conv1: ConvLayer,
    /// The second convolution.
    pub conv2: ConvLayer,
    /// The average pools' window and stride.
    pub pool: usize,
    /// Units of the hidden linear layer.
    pub hidden: usize,
    /// Classes.
    pub classes: usize,
}

/// LeNet as the reference chapter builds it:
/// `1x28x28 → conv 20@3x3 → pool 2 → conv 50@5x5 → pool 2 → 800 → 128 → 10`.
pub const LENET: Architecture = Architecture {
    image: 28,
    in_c: 1,
    conv1: ConvLayer {
        out_c: 20,
        kernel: 3,
    },
    conv2: ConvLayer {
        out_c: 50,
        kernel: 5,
    },
    pool: 2,
    hidden: 128,
    classes: 10,
};

impl Architecture {
    const fn conv_side(input: usize, layer: ConvLayer) -> usize {
        input - layer.kernel + 1
    }

    const fn pool_side(&self, input: usize) -> usize {
        (input - self.pool) / self.pool + 1
    }

    /// conv1's output side (26 for LeNet).
    const fn side1(&self) -> usize {
        Self::conv_side(self.image, self.conv1)
    }

    /// conv2's output side (9 for LeNet).
    const fn side2(&self) -> usize {
        Self::conv_side(self.pool_side(self.side1()), self.conv2)
    }

    /// The flattened features after the second pool, fc1's inputs (800 for LeNet).
    pub const fn features(&self) -> usize {
        let side = self.pool_side(self.side2());
        self.conv2.out_c * side * side
    }

    const fn conv(batch: usize, in_c: usize, side: usize, layer: ConvLayer) -> Conv2dShape {
        Conv2dShape {
            batch,
            in_c,
            in_h: side,
            in_w: side,
            out_c: layer.out_c,
            k_h: layer.kernel,
            k_w: layer.kernel,
            stride: 1,
            pad: 0,
        }
    }

    const fn pool(&self, batch: usize, channels: usize, side: usize) -> Pool2dShape {
        Pool2dShape {
            planes: batch * channels,
            in_h: side,
            in_w: side,
            k_h: self.pool,
            k_w: self.pool,
            stride: self.pool,
        }
    }

    /// conv1 at `batch` images.
    pub const fn conv1(&self, batch: usize) -> Conv2dShape {
        Self::conv(batch, self.in_c, self.image, self.conv1)
    }

    /// The pool over conv1's planes.
    pub const fn pool1(&self, batch: usize) -> Pool2dShape {
        self.pool(batch, self.conv1.out_c, self.side1())
    }

    /// conv2, on pool1's output.
    pub const fn conv2(&self, batch: usize) -> Conv2dShape {
        Self::conv(
            batch,
            self.conv1.out_c,
            self.pool_side(self.side1()),
            self.conv2,
        )
    }

    /// The pool over conv2's planes.
    pub const fn pool2(&self, batch: usize) -> Pool2dShape {
        self.pool(batch, self.conv2.out_c, self.side2())
    }

    /// fc1: the flattened features to the hidden units.
    pub const fn fc1(&self, batch: usize) -> Linear {
        Linear {
            batch,
            inputs: self.features(),
            outputs: self.hidden,
        }
    }

    /// fc2: the hidden units to the classes.
    pub const fn fc2(&self, batch: usize) -> Linear {
        Linear {
            batch,
            inputs: self.hidden,
            outputs: self.classes,
        }
    }
}

/// A linear layer `y = x·Wᵀ + b` over a batch (`W` is outputs x inputs, PyTorch's layout),
/// and the three products its forward and backward passes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Linear {
    /// Rows of `x`.
    pub batch: usize,
    /// Columns of `x`.
    pub inputs: usize,
    /// Columns of `y`.
    pub outputs: usize,
}

impl Linear {
    /// `y = x·Wᵀ`.
    pub const fn forward(&self) -> GemmShape {
        GemmShape {
            m: self.batch,
            n: self.outputs,
            k: self.inputs,
            trans_a: false,
            trans_b: true,
        }
    }

    /// `dW = dyᵀ·x`, summed over the batch.
    pub const fn weight_gradient(&self) -> GemmShape {
        GemmShape {
            m: self.outputs,
            n: self.inputs,
            k: self.batch,
            trans_a: true,
            trans_b: false,
        }
    }

    /// `dx = dy·W`.
    pub const fn input_gradient(&self) -> GemmShape {
        GemmShape {
            m: self.batch,
            n: self.inputs,
            k: self.outputs,
            trans_a: false,
            trans_b: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lenet_sizes_are_the_chapters() {
        assert_eq!(LENET.conv1(1).out_h(), 26);
        assert_eq!(LENET.pool1(1).out_h(), 13);
        assert_eq!(LENET.conv2(1).out_h(), 9);
        assert_eq!(LENET.pool2(1).out_h(), 4);
        assert_eq!(LENET.features(), 800);
        // Each layer's input is the previous one's output.
        assert_eq!(LENET.conv2(3).in_h, LENET.pool1(3).out_h());
        assert_eq!(LENET.pool2(3).in_h, LENET.conv2(3).out_h());
        assert_eq!(LENET.pool1(3).planes, 3 * LENET.conv1.out_c);
        // The parameter table and the backward order derived from it.
        let params: Vec<usize> = crate::model::PARAMS.iter().map(|p| p.len()).collect();
        assert_eq!(params, [180, 20, 25_000, 50, 102_400, 128, 1_280, 10]);
        assert_eq!(crate::model::BACKWARD_ORDER, [6, 7, 4, 5, 2, 3, 0, 1]);
    }
}
