//! The FedCor CIFAR CNN: conv3×3(32) → pool2 → ReLU → conv3×3(64) → pool2 →
//! ReLU → conv3×3(64) → ReLU → FC 1024→64 → ReLU → FC 64→classes (no padding;
//! 32 → 30 → 15 → 13 → 6 → 4 spatially).

use burn::tensor::Tensor;
use burn::tensor::activation::relu;
use burn::tensor::module::{conv2d, max_pool2d};
use burn::tensor::ops::{ConvOptions, MaxPoolOptions};

use super::{Architecture, Batch, Dropout, ParamSpec, dense};

/// Three conv layers and two dense layers.
#[derive(Debug, Clone)]
pub struct CnnCifar {
    /// Classes.
    pub classes: usize,
}

impl Architecture for CnnCifar {
    fn name(&self) -> &'static str {
        "cnn_cifar"
    }

    fn params(&self) -> Vec<ParamSpec> {
        [
            ParamSpec::conv("conv1", 3, 32, 3),
            ParamSpec::conv("conv2", 32, 64, 3),
            ParamSpec::conv("conv3", 64, 64, 3),
            ParamSpec::linear("fc1", 64 * 4 * 4, 64),
            ParamSpec::linear("out", 64, self.classes),
        ]
        .concat()
    }

    fn forward(&self, p: &[Tensor<1>], x: Batch, _: Option<&mut Dropout<'_>>) -> Tensor<2> {
        let x = dense(x);
        let b = x.dims()[0];
        let conv = |i: usize, x: Tensor<4>, cin: usize, cout: usize| {
            let w = p[i].clone().reshape([cout, cin, 3, 3]);
            conv2d(
                x,
                w,
                Some(p[i + 1].clone()),
                ConvOptions::new([1, 1], [0, 0], [1, 1], 1),
            )
        };
        let pool = |x: Tensor<4>| max_pool2d(x, MaxPoolOptions::new([2, 2]));
        let h = relu(pool(conv(0, x.reshape([b, 3, 32, 32]), 3, 32)));
        let h = relu(pool(conv(2, h, 32, 64)));
        let h = relu(conv(4, h, 64, 64)).reshape([b, 64 * 4 * 4]);
        let h = relu(h.matmul(p[6].clone().reshape([1024, 64])) + p[7].clone().unsqueeze::<2>());
        h.matmul(p[8].clone().reshape([64, self.classes])) + p[9].clone().unsqueeze::<2>()
    }
}
