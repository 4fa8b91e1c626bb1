//! The FedGS Fashion-MNIST CNN: conv5×5(32, pad 2) → ReLU → pool2 →
//! conv5×5(64, pad 2) → ReLU → pool2 → FC 3136→512 → ReLU → FC 512→classes.

use burn::tensor::Tensor;
use burn::tensor::activation::relu;
use burn::tensor::module::{conv2d, max_pool2d};
use burn::tensor::ops::{ConvOptions, MaxPoolOptions};

use super::{Architecture, Batch, Dropout, ParamSpec, dense};

/// Two conv blocks and two dense layers.
#[derive(Debug, Clone)]
pub struct CnnFmnist {
    /// Classes.
    pub classes: usize,
}

impl Architecture for CnnFmnist {
    fn name(&self) -> &'static str {
        "cnn_fmnist"
    }

    fn params(&self) -> Vec<ParamSpec> {
        [
            ParamSpec::conv("conv1", 1, 32, 5),
            ParamSpec::conv("conv2", 32, 64, 5),
            ParamSpec::linear("fc1", 64 * 7 * 7, 512),
            ParamSpec::linear("out", 512, self.classes),
        ]
        .concat()
    }

    fn forward(&self, p: &[Tensor<1>], x: Batch, _: Option<&mut Dropout<'_>>) -> Tensor<2> {
        let x = dense(x);
        let b = x.dims()[0];
        let conv = |i: usize, x: Tensor<4>, cin: usize, cout: usize| {
            let w = p[i].clone().reshape([cout, cin, 5, 5]);
            let y = conv2d(
                x,
                w,
                Some(p[i + 1].clone()),
                ConvOptions::new([1, 1], [2, 2], [1, 1], 1),
            );
            max_pool2d(relu(y), MaxPoolOptions::new([2, 2]))
        };
        let h = conv(0, x.reshape([b, 1, 28, 28]), 1, 32);
        let h = conv(2, h, 32, 64).reshape([b, 64 * 7 * 7]);
        let h =
            relu(h.matmul(p[4].clone().reshape([64 * 7 * 7, 512])) + p[5].clone().unsqueeze::<2>());
        h.matmul(p[6].clone().reshape([512, self.classes])) + p[7].clone().unsqueeze::<2>()
    }
}
