//! Multinomial logistic regression: one linear layer (FedProx, FedGS and F3AST on Synthetic).

use burn::tensor::Tensor;

use super::{Architecture, Batch, Dropout, ParamSpec, dense};

/// `inputs → classes` linear model.
#[derive(Debug, Clone)]
pub struct LogReg {
    /// Input features.
    pub inputs: usize,
    /// Classes.
    pub classes: usize,
}

impl Architecture for LogReg {
    fn name(&self) -> &'static str {
        "logreg"
    }

    fn params(&self) -> Vec<ParamSpec> {
        ParamSpec::linear("fc", self.inputs, self.classes).to_vec()
    }

    fn forward(&self, p: &[Tensor<1>], x: Batch, _: Option<&mut Dropout<'_>>) -> Tensor<2> {
        let w = p[0].clone().reshape([self.inputs, self.classes]);
        dense(x).matmul(w) + p[1].clone().unsqueeze::<2>()
    }
}
