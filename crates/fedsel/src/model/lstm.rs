//! The LEAF Shakespeare model: Embedding(80, 8) → 2×LSTM(256) → Dense(80)
//! on the last time step.
//!
//! Each LSTM layer has input weights `[in, 4h]`, recurrent weights `[h, 4h]`
//! and one bias `[4h]` (PyTorch's two biases add up to one, so one suffices),
//! gates in PyTorch's order i, f, g, o. The input projection of all time
//! steps is one matrix product; only the recurrence runs step by step.
//!
//! Training does not differentiate this forward pass: [`fused`] computes the loss and
//! gradient with a hand-derived backward pass through time (about twice as fast at the
//! Shakespeare shapes, DESIGN.md "Speed: the char-LSTM"). The burn forward pass here is the reference it is tested
//! against, and serves evaluation.

mod fused;
mod kernel;

use burn::tensor::Tensor;
use burn::tensor::activation::{sigmoid, tanh};
use burn::tensor::module::embedding;

use super::{Architecture, Batch, Dropout, FusedLogits, Init, LossGradient, ParamSpec};
use crate::data::{Dataset, Inputs};

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

    /// The model has no dropout and no running statistics, so the fused gradient is
    /// the exact gradient of the training pass.
    fn loss_gradient(&self) -> Option<&dyn LossGradient> {
        Some(self)
    }

    /// The fused forward pass computes [`Architecture::forward`]'s logits (there is
    /// no dropout) with the training pass's own arithmetic.
    fn fused_logits(&self) -> Option<&dyn FusedLogits> {
        Some(self)
    }
}

impl FusedLogits for CharLstm {
    fn logits(&self, params: &[f32], x: &[f32], batch: usize) -> Vec<f32> {
        assert!(
            batch > 0 && x.len().is_multiple_of(batch),
            "whole sequences"
        );
        let tokens: Vec<usize> = x
            .iter()
            .map(|&t| {
                assert!(t >= 0.0 && t.fract() == 0.0, "token id {t} is not an index");
                t as usize
            })
            .collect();
        fused::logits(self, params, &tokens, x.len() / batch)
    }
}

impl LossGradient for CharLstm {
    fn loss_and_gradient(&self, params: &[f32], data: &Dataset, idx: &[usize]) -> (f32, Vec<f32>) {
        let Inputs::Tokens { len, values } = &data.inputs else {
            unreachable!("model::build gives the LSTM token inputs only")
        };
        let mut tokens = Vec::with_capacity(idx.len() * len);
        for &i in idx {
            tokens.extend_from_slice(&values[i * len..(i + 1) * len]);
        }
        let labels: Vec<u32> = idx.iter().map(|&i| data.labels[i]).collect();
        fused::loss_and_gradient(self, params, &tokens, &labels, *len)
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::Device;

    use super::*;
    use crate::bench::random_dataset;
    use crate::model::{AutodiffOnly, ParamLayout, batch, cross_entropy};
    use crate::train::evaluate;

    /// Loss and flat gradient by burn's autodiff through [`CharLstm::forward`].
    fn autodiff(net: &CharLstm, params: &[f32], data: &Dataset, idx: &[usize]) -> (f32, Vec<f32>) {
        let device = Device::flex();
        let layout = ParamLayout::of(net);
        let ad: Vec<Tensor<1>> = layout
            .to_tensors(params, &device)
            .into_iter()
            .map(|p| p.autodiff().require_grad())
            .collect();
        let (x, y) = batch(data, idx, &device);
        let loss = cross_entropy(net.forward(&ad, x, None), y);
        let grads = loss.backward();
        let g = ad.iter().map(|p| p.grad(&grads).unwrap()).collect();
        (loss.inner().into_scalar::<f32>(), layout.to_flat(g))
    }

    fn relative_error(a: &[f32], b: &[f32]) -> f64 {
        let diff: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
        let norm: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
        (diff / norm).sqrt()
    }

    /// Every parameter's fused gradient is within 1e-4 (relative, in norm) of autodiff's,
    /// and the losses agree to 1e-5.
    fn check(net: &CharLstm, seq: usize, batch: usize, seed: u64) {
        let data = random_dataset(&[], Some(seq), 2 * batch, net.vocab);
        let layout = ParamLayout::of(net);
        let params = layout.init(seed);
        let idx: Vec<usize> = (0..2 * batch).step_by(2).collect();
        let (loss, grad) = net.loss_and_gradient(&params, &data, &idx);
        let (want_loss, want) = autodiff(net, &params, &data, &idx);
        assert!(
            (loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
            "{loss} vs {want_loss}"
        );
        for (i, spec) in layout.specs.iter().enumerate() {
            let r = layout.range(i);
            // Only a one-step sequence leaves the recurrent weights without gradient.
            if seq == 1 && spec.name.ends_with("w_hh") {
                assert!(want[r.clone()].iter().chain(&grad[r]).all(|&g| g == 0.0));
                continue;
            }
            assert!(want[r.clone()].iter().any(|&g| g != 0.0), "{}", spec.name);
            let err = relative_error(&grad[r.clone()], &want[r]);
            assert!(err < 1e-4, "{}: relative error {err:e}", spec.name);
        }
    }

    #[test]
    fn the_fused_gradient_matches_autodiff_on_a_small_lstm() {
        let net = CharLstm {
            vocab: 7,
            embed: 3,
            hidden: 5,
        };
        check(&net, 6, 4, 1);
        check(&net, 1, 3, 2);
        // Three row groups, the last a single row.
        check(&net, 6, 13, 6);
    }

    #[test]
    fn the_fused_gradient_matches_autodiff_at_the_shakespeare_shape() {
        let net = CharLstm {
            vocab: 80,
            embed: 8,
            hidden: 256,
        };
        check(&net, 5, 10, 3);
    }

    /// Batch 10 makes two row groups (6 and 4 rows), and the products are split into
    /// enough pieces here to run on several threads.
    #[test]
    fn the_fused_gradient_does_not_depend_on_the_thread_count() {
        let net = CharLstm {
            vocab: 80,
            embed: 8,
            hidden: 256,
        };
        let data = random_dataset(&[], Some(12), 10, 80);
        let params = ParamLayout::of(&net).init(4);
        let idx: Vec<usize> = (0..10).collect();
        let run = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| net.loss_and_gradient(&params, &data, &idx))
        };
        let (loss, grad) = run(1);
        for threads in [2, 3, 4] {
            let (l, g) = run(threads);
            assert_eq!(l.to_bits(), loss.to_bits(), "{threads} threads");
            assert!(
                g.iter().zip(&grad).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{threads} threads"
            );
        }
    }

    /// The token ids of examples `idx` as the `f32` rows [`FusedLogits::logits`] reads.
    fn token_rows(data: &Dataset, idx: &[usize]) -> Vec<f32> {
        let Inputs::Tokens { len, values } = &data.inputs else {
            unreachable!("a token dataset")
        };
        idx.iter()
            .flat_map(|&i| values[i * len..(i + 1) * len].iter().map(|&t| f32::from(t)))
            .collect()
    }

    /// The fused logits match burn's forward pass (30 rows: a whole and a partial
    /// evaluation chunk; hidden 5: a partial unit block), and evaluation through them
    /// matches evaluation through burn.
    #[test]
    fn the_fused_logits_match_the_burn_forward_pass() {
        let device = Device::flex();
        let nets = [
            (
                CharLstm {
                    vocab: 7,
                    embed: 3,
                    hidden: 5,
                },
                6,
            ),
            (
                CharLstm {
                    vocab: 80,
                    embed: 8,
                    hidden: 256,
                },
                5,
            ),
        ];
        for (net, seq) in nets {
            let data = random_dataset(&[], Some(seq), 30, net.vocab);
            let layout = ParamLayout::of(&net);
            let params = layout.init(5);
            let idx: Vec<usize> = (0..30).collect();
            let p = layout.to_tensors(&params, &device);
            let (x, _) = batch(&data, &idx, &device);
            let want = net
                .forward(&p, x, None)
                .into_data()
                .try_into_vec::<f32>()
                .unwrap();
            let got = net.logits(&params, &token_rows(&data, &idx), idx.len());
            let err = relative_error(&got, &want);
            assert!(err < 1e-5, "hidden {}: relative error {err:e}", net.hidden);
            let fused = evaluate(&net, &p, &data, &idx, 7, &device);
            let reference = evaluate(&AutodiffOnly(&net), &p, &data, &idx, 7, &device);
            assert_eq!(fused.accuracy, reference.accuracy, "hidden {}", net.hidden);
            assert!(
                (fused.loss - reference.loss).abs() <= 1e-5 * reference.loss,
                "hidden {}: {} vs {}",
                net.hidden,
                fused.loss,
                reference.loss
            );
        }
    }

    /// 50 rows make three evaluation chunks, run on several threads.
    #[test]
    fn the_fused_logits_do_not_depend_on_the_thread_count() {
        let net = CharLstm {
            vocab: 80,
            embed: 8,
            hidden: 256,
        };
        let data = random_dataset(&[], Some(7), 50, 80);
        let params = ParamLayout::of(&net).init(8);
        let idx: Vec<usize> = (0..50).collect();
        let x = token_rows(&data, &idx);
        let run = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| net.logits(&params, &x, idx.len()))
        };
        let want = run(1);
        for threads in [2, 3, 4] {
            let got = run(threads);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{threads} threads"
            );
        }
    }
}
