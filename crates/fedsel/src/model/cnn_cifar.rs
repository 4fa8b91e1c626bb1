//! The FedCor CIFAR CNN: conv3×3(32) → pool2 → ReLU → conv3×3(64) → pool2 →
//! ReLU → conv3×3(64) → ReLU → FC 1024→64 → ReLU → FC 64→classes (no padding;
//! 32 → 30 → 15 → 13 → 6 → 4 spatially).
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

/// Three conv layers and two dense layers.
#[derive(Debug, Clone)]
pub struct CnnCifar {
    /// Classes.
    pub classes: usize,
}

const STAGES: [Stage; 8] = [
    Stage::Conv {
        cout: 32,
        k: 3,
        pad: 0,
        bias: true,
    },
    Stage::Pool,
    Stage::Relu,
    Stage::Conv {
        cout: 64,
        k: 3,
        pad: 0,
        bias: true,
    },
    Stage::Pool,
    Stage::Relu,
    Stage::Conv {
        cout: 64,
        k: 3,
        pad: 0,
        bias: true,
    },
    Stage::Relu,
];

impl CnnCifar {
    /// The network as [`super::cnn_fused`] runs it.
    pub(super) fn net(&self) -> Net {
        Net {
            input: [3, 32, 32],
            stages: &STAGES,
            dense: vec![64, self.classes],
        }
    }
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

    /// The model has no dropout and no running statistics, so the fused gradient is
    /// the exact gradient of the training pass.
    fn loss_gradient(&self) -> Option<&dyn LossGradient> {
        Some(self)
    }

    fn fused_logits(&self) -> Option<&dyn FusedLogits> {
        Some(self)
    }
}

impl LossGradient for CnnCifar {
    fn loss_and_gradient(&self, params: &[f32], data: &Dataset, idx: &[usize]) -> (f32, Vec<f32>) {
        let (x, labels) = dense_rows(data, idx);
        self.net()
            .loss_and_gradient(params, &x, &labels, Mode::Train)
    }
}

impl FusedLogits for CnnCifar {
    fn logits(&self, params: &[f32], x: &[f32], batch: usize) -> Vec<f32> {
        self.net().logits(params, x, batch)
    }
}
