//! The LEAF Shakespeare model: Embedding(80, 8) → 2×LSTM(256) → Dense(80)
//! on the last time step.
//!
//! Each LSTM layer has input weights `[in, 4h]`, recurrent weights `[h, 4h]`
//! and one bias `[4h]` (PyTorch's two biases add up to one, so one suffices),
//! gates in PyTorch's order i, f, g, o. The input projection of all time
//! steps is one matrix product; only the recurrence runs step by step.

use burn::tensor::Tensor;
use burn::tensor::activation::{sigmoid, tanh};
use burn::tensor::module::embedding;

use super::{Architecture, Batch, Dropout, Init, ParamSpec};

/// Character-level two-layer LSTM.
#[derive(Debug, Clone)]
pub struct CharLstm {
    /// Vocabulary size (inputs and classes).
    pub vocab: usize,
    /// Embedding width.
    pub embed: usize,
    /// Hidden units per layer.
    pub hidden: usize,
}

impl CharLstm {
    fn layer(&self, p: &[Tensor<1>], x: Tensor<3>, fan_in: usize, last_only: bool) -> Tensor<3> {
        let [b, t, _] = x.dims();
        let h4 = 4 * self.hidden;
        let wi = p[0].clone().reshape([fan_in, h4]);
        let wh = p[1].clone().reshape([self.hidden, h4]);
        let bias = p[2].clone().unsqueeze::<2>();
        let xp = (x.reshape([b * t, fan_in]).matmul(wi) + bias).reshape([b, t, h4]);
        let device = xp.device();
        let mut h = Tensor::<2>::zeros([b, self.hidden], &device);
        let mut c = Tensor::<2>::zeros([b, self.hidden], &device);
        let mut outs = Vec::with_capacity(if last_only { 1 } else { t });
        for s in 0..t {
            let g = xp.clone().narrow(1, s, 1).reshape([b, h4]) + h.matmul(wh.clone());
            let gate = |k: usize| g.clone().narrow(1, k * self.hidden, self.hidden);
            let (i, f, gg, o) = (
                sigmoid(gate(0)),
                sigmoid(gate(1)),
                tanh(gate(2)),
                sigmoid(gate(3)),
            );
            c = f * c + i * gg;
            h = o * tanh(c.clone());
            if !last_only {
                outs.push(h.clone());
            }
        }
        if last_only {
            h.unsqueeze_dim::<3>(1)
        } else {
            Tensor::stack(outs, 1)
        }
    }
}

impl Architecture for CharLstm {
    fn name(&self) -> &'static str {
        "char_lstm"
    }

    fn params(&self) -> Vec<ParamSpec> {
        let h = self.hidden;
        let b = Init::Uniform(1.0 / (h as f32).sqrt());
        let lstm = |l: usize, fan_in: usize| {
            [
                ParamSpec::new(&format!("lstm{l}.w_ih"), &[fan_in, 4 * h], b),
                ParamSpec::new(&format!("lstm{l}.w_hh"), &[h, 4 * h], b),
                ParamSpec::new(&format!("lstm{l}.bias"), &[4 * h], b),
            ]
        };
        let mut v = vec![ParamSpec::new(
            "embed",
            &[self.vocab, self.embed],
            Init::Normal(1.0),
        )];
        v.extend(lstm(1, self.embed));
        v.extend(lstm(2, h));
        v.extend(ParamSpec::linear("out", h, self.vocab));
        v
    }

    fn forward(&self, p: &[Tensor<1>], x: Batch, _: Option<&mut Dropout<'_>>) -> Tensor<2> {
        let Batch::Tokens(ids) = x else {
            unreachable!("model::build gives the LSTM token inputs only")
        };
        let b = ids.dims()[0];
        let e = embedding(p[0].clone().reshape([self.vocab, self.embed]), ids);
        let h1 = self.layer(&p[1..4], e, self.embed, false);
        let h2 = self
            .layer(&p[4..7], h1, self.hidden, true)
            .reshape([b, self.hidden]);
        h2.matmul(p[7].clone().reshape([self.hidden, self.vocab])) + p[8].clone().unsqueeze::<2>()
    }
}
