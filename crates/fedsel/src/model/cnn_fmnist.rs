//! Fashion-MNIST CNNs: conv5×5(32, pad 2) → ReLU → pool2 → conv5×5(64, pad 2)
//! → ReLU → pool2, then FC 3136→512 → ReLU → FC 512→classes (FedGS, `cnn_fmnist`)
//! or a single FC 3136→classes (HiCS-FL App. 6.1, `cnn_hics`).

use burn::tensor::Tensor;
use burn::tensor::activation::relu;
use burn::tensor::module::{conv2d, max_pool2d};
use burn::tensor::ops::{ConvOptions, MaxPoolOptions};

use super::{Architecture, Batch, Dropout, ParamSpec, dense};

/// Two conv blocks and one or two dense layers.
#[derive(Debug, Clone)]
pub struct CnnFmnist {
    /// Classes.
    pub classes: usize,
    /// Width of the hidden dense layer; `None` puts the output layer right after
    /// the convolutions (HiCS-FL's model).
    pub hidden: Option<usize>,
}

const FEATURES: usize = 64 * 7 * 7;

impl Architecture for CnnFmnist {
    fn name(&self) -> &'static str {
        match self.hidden {
            Some(_) => "cnn_fmnist",
            None => "cnn_hics",
        }
    }

    fn params(&self) -> Vec<ParamSpec> {
        let mut p = [
            ParamSpec::conv("conv1", 1, 32, 5),
            ParamSpec::conv("conv2", 32, 64, 5),
        ]
        .concat();
        match self.hidden {
            Some(h) => {
                p.extend(ParamSpec::linear("fc1", FEATURES, h));
                p.extend(ParamSpec::linear("out", h, self.classes));
            }
            None => p.extend(ParamSpec::linear("out", FEATURES, self.classes)),
        }
        p
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
        let h = conv(2, h, 32, 64).reshape([b, FEATURES]);
        let (h, width, out) = match self.hidden {
            Some(w) => (
                relu(h.matmul(p[4].clone().reshape([FEATURES, w])) + p[5].clone().unsqueeze::<2>()),
                w,
                6,
            ),
            None => (h, FEATURES, 4),
        };
        h.matmul(p[out].clone().reshape([width, self.classes]))
            + p[out + 1].clone().unsqueeze::<2>()
    }
}
