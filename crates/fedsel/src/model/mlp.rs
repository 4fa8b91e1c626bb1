//! The FedCor MLP for Fashion-MNIST: 784-64-30-10.
//!
//! As in the FedCor code, dropout comes before each hidden ReLU:
//! Linear → Dropout → ReLU → Linear → Dropout → ReLU → Linear.

use burn::tensor::Tensor;
use burn::tensor::activation::relu;

use super::{Architecture, Batch, Dropout, ParamSpec, dense};

/// Two hidden layers of 64 and 30 units.
#[derive(Debug, Clone)]
pub struct Mlp {
    /// Input features (784 for 28×28 images).
    pub inputs: usize,
    /// Classes.
    pub classes: usize,
    /// Dropout probability (FedCor: 0.5).
    pub dropout: f64,
}

const H1: usize = 64;
const H2: usize = 30;

impl Architecture for Mlp {
    fn name(&self) -> &'static str {
        "mlp"
    }

    fn params(&self) -> Vec<ParamSpec> {
        [
            ParamSpec::linear("fc1", self.inputs, H1),
            ParamSpec::linear("fc2", H1, H2),
            ParamSpec::linear("out", H2, self.classes),
        ]
        .concat()
    }

    fn forward(
        &self,
        p: &[Tensor<1>],
        x: Batch,
        mut dropout: Option<&mut Dropout<'_>>,
    ) -> Tensor<2> {
        let layer = |i: usize, fan_in: usize, fan_out: usize, x: Tensor<2>| {
            x.matmul(p[i].clone().reshape([fan_in, fan_out])) + p[i + 1].clone().unsqueeze::<2>()
        };
        let mut drop = |h: Tensor<2>| match dropout.as_mut() {
            Some(d) => d.apply(h),
            None => h,
        };
        let h = drop(layer(0, self.inputs, H1, dense(x)));
        let h = drop(layer(2, H1, H2, relu(h)));
        layer(4, H2, self.classes, relu(h))
    }
}
