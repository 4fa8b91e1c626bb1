//! Fashion-MNIST CNNs: conv5×5(32, pad 2) → ReLU → pool2 → conv5×5(64, pad 2)
//! → ReLU → pool2, then FC 3136→512 → ReLU → FC 512→classes (FedGS, `cnn_fmnist`)
//! or a single FC 3136→classes (HiCS-FL App. 6.1, `cnn_hics`).
//!
//! Training and evaluation do not run the burn forward pass here: [`super::cnn_fused`]
//! computes the loss, the gradient and the logits with a hand-derived backward pass
//! (DESIGN.md "Speed: the CNNs"). The burn pass is the reference it is tested against.

use burn::tensor::Tensor;
use burn::tensor::activation::relu;
use burn::tensor::module::{conv2d, max_pool2d};
use burn::tensor::ops::{ConvOptions, MaxPoolOptions};

use super::cnn_fused::{Mode, Net, Stage};
use super::{
    Architecture, Batch, Dropout, FusedLogits, LossGradient, ParamSpec, dense, dense_rows,
};
use crate::data::Dataset;

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

const STAGES: [Stage; 6] = [
    Stage::Conv {
        cout: 32,
        k: 5,
        pad: 2,
        bias: true,
    },
    Stage::Relu,
    Stage::Pool,
    Stage::Conv {
        cout: 64,
        k: 5,
        pad: 2,
        bias: true,
    },
    Stage::Relu,
    Stage::Pool,
];

impl CnnFmnist {
    /// The network as [`super::cnn_fused`] runs it.
    pub(super) fn net(&self) -> Net {
        Net {
            input: [1, 28, 28],
            stages: &STAGES,
            dense: match self.hidden {
                Some(h) => vec![h, self.classes],
                None => vec![self.classes],
            },
        }
    }
}

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

    /// The model has no dropout and no running statistics, so the fused gradient is
    /// the exact gradient of the training pass.
    fn loss_gradient(&self) -> Option<&dyn LossGradient> {
        Some(self)
    }

    fn fused_logits(&self) -> Option<&dyn FusedLogits> {
        Some(self)
    }
}

impl LossGradient for CnnFmnist {
    fn loss_and_gradient(&self, params: &[f32], data: &Dataset, idx: &[usize]) -> (f32, Vec<f32>) {
        let (x, labels) = dense_rows(data, idx);
        self.net()
            .loss_and_gradient(params, &x, &labels, Mode::Train)
    }
}

impl FusedLogits for CnnFmnist {
    fn logits(&self, params: &[f32], x: &[f32], batch: usize) -> Vec<f32> {
        self.net().logits(params, x, batch)
    }
}
