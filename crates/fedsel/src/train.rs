//! Local training and evaluation on one client.
//!
//! A client receives the flat global parameters, materialises them as fresh
//! tensors, runs its optimizer for the configured steps or epochs, and
//! returns its new flat parameters. Everything random (batch order, dropout)
//! comes from the client's own stream, so the result is the same whichever
//! thread runs it.

use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::seq::SliceRandom;
use rayon::prelude::*;

use crate::config::{LocalOptimizer, LocalWork, TrainConfig};
use crate::data::{Dataset, Inputs};
use crate::model::{self, Architecture, Dropout, FusedLogits, LossGradient, ParamLayout};
use crate::rng::Rng;
use crate::select::GradientScope;

/// Optimizer state carried between a client's rounds when `persistent_state` is on.
#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerState {
    /// Steps taken so far (Adam's bias correction).
    pub step: u64,
    /// SGD momentum buffer or Adam's first moment, flat.
    pub m: Vec<f32>,
    /// Adam's second moment, flat (empty for SGD).
    pub v: Vec<f32>,
}

/// What a client sends back after training.
#[derive(Debug, Clone)]
pub struct LocalUpdate {
    /// The client's new parameters.
    pub params: Vec<f32>,
    /// Mean training loss over the steps taken.
    pub mean_loss: f64,
    /// Mini-batch steps taken.
    pub steps: usize,
    /// Optimizer state to keep, when persistent state is on.
    pub state: Option<OptimizerState>,
}

/// Everything local training needs besides the client.
#[derive(Clone, Copy)]
pub struct Trainer<'a> {
    /// The network.
    pub arch: &'a dyn Architecture,
    /// Its parameter layout.
    pub layout: &'a ParamLayout,
    /// The training pool.
    pub data: &'a Dataset,
    /// Optimizer settings.
    pub cfg: &'a TrainConfig,
    /// Dropout probability.
    pub dropout: f64,
    /// Compute device (without autodiff).
    pub device: &'a Device,
}

/// The fused path's local step on flat slices, with torch's order of operations: weight
/// decay, then the proximal term, are added to the gradient before the optimizer.
/// A coefficient is `None` where the config's (f64) value is not positive.
struct UpdateRule {
    optimizer: LocalOptimizer,
    lr: f32,
    weight_decay: Option<f32>,
    prox_mu: Option<f32>,
    momentum: Option<f32>,
    beta1: f64,
    beta2: f64,
    eps: f32,
}

impl UpdateRule {
    fn of(cfg: &TrainConfig, lr: f64) -> Self {
        Self {
            optimizer: cfg.optimizer,
            lr: lr as f32,
            weight_decay: (cfg.weight_decay > 0.0).then_some(cfg.weight_decay as f32),
            prox_mu: (cfg.prox_mu > 0.0).then_some(cfg.prox_mu as f32),
            momentum: (cfg.momentum > 0.0).then_some(cfg.momentum as f32),
            beta1: cfg.beta1,
            beta2: cfg.beta2,
            eps: cfg.eps as f32,
        }
    }

    /// Step `step` (counted from 1) on one span of parameters `p` with gradient `g`, the
    /// model received `global`, and the optimizer moments `m`, `v` (empty where the
    /// optimizer keeps none).
    fn apply(
        &self,
        step: u64,
        p: &mut [f32],
        g: &[f32],
        global: &[f32],
        m: &mut [f32],
        v: &mut [f32],
    ) {
        match (self.weight_decay.is_some(), self.prox_mu.is_some()) {
            (false, false) => self.apply_with::<false, false>(step, p, g, global, m, v),
            (true, false) => self.apply_with::<true, false>(step, p, g, global, m, v),
            (false, true) => self.apply_with::<false, true>(step, p, g, global, m, v),
            (true, true) => self.apply_with::<true, true>(step, p, g, global, m, v),
        }
    }

    /// [`UpdateRule::apply`] with the weight decay (`WD`) and the proximal term (`PROX`)
    /// chosen at compile time, so that each case is one pass over zipped slices that
    /// vectorises: the terms are added to each entry's gradient in torch's order, the
    /// same operations as a pass of their own each, and the optimizer then steps.
    fn apply_with<const WD: bool, const PROX: bool>(
        &self,
        step: u64,
        p: &mut [f32],
        g: &[f32],
        global: &[f32],
        m: &mut [f32],
        v: &mut [f32],
    ) {
        let (wd, mu) = (
            self.weight_decay.unwrap_or_default(),
            self.prox_mu.unwrap_or_default(),
        );
        let term = |g: f32, p: f32, x: f32| {
            let g = if WD { g + p * wd } else { g };
            if PROX { g + (p - x) * mu } else { g }
        };
        let lr = self.lr;
        let pgx = p.iter_mut().zip(g.iter().zip(global));
        match (self.optimizer, self.momentum) {
            (LocalOptimizer::Sgd, Some(momentum)) => {
                for ((p, (&g, &x)), m) in pgx.zip(m.iter_mut()) {
                    *m = *m * momentum + term(g, *p, x);
                    *p -= *m * lr;
                }
            }
            (LocalOptimizer::Sgd, None) => {
                for (p, (&g, &x)) in pgx {
                    *p -= term(g, *p, x) * lr;
                }
            }
            (LocalOptimizer::Adam, _) => {
                let (b1, b2, eps) = (self.beta1 as f32, self.beta2 as f32, self.eps);
                let (one_b1, one_b2) = ((1.0 - self.beta1) as f32, (1.0 - self.beta2) as f32);
                let c1 = (1.0 - self.beta1.powi(step as i32)) as f32;
                let c2 = (1.0 - self.beta2.powi(step as i32)) as f32;
                for ((p, (&g, &x)), (m, v)) in pgx.zip(m.iter_mut().zip(v.iter_mut())) {
                    let g = term(g, *p, x);
                    *m = *m * b1 + g * one_b1;
                    *v = *v * b2 + g * g * one_b2;
                    let denom = (*v / c2).sqrt() + eps;
                    *p -= (*m / c1) / denom * lr;
                }
            }
        }
    }
}

/// Parameters per task of a local step's update ([`UpdateRule::apply_pieces`]).
const UPDATE_PIECE: usize = 1 << 15;

impl UpdateRule {
    /// [`UpdateRule::apply`] in pieces of [`UPDATE_PIECE`] side by side, for spans of at
    /// least two pieces: the update is elementwise, so the pieces give its bits, and the
    /// CNNs' 1.7 M parameters no longer take a serial millisecond per step. `m` and `v`
    /// are empty or as long as `p`.
    fn apply_pieces(
        &self,
        step: u64,
        p: &mut [f32],
        g: &[f32],
        global: &[f32],
        m: &mut [f32],
        v: &mut [f32],
    ) {
        if p.len() < 2 * UPDATE_PIECE {
            return self.apply(step, p, g, global, m, v);
        }
        let n = p.len().div_ceil(UPDATE_PIECE);
        let (ms, vs) = (pieces(m, n), pieces(v, n));
        p.par_chunks_mut(UPDATE_PIECE)
            .zip(g.par_chunks(UPDATE_PIECE))
            .zip(global.par_chunks(UPDATE_PIECE))
            .zip(ms.into_par_iter().zip(vs))
            .for_each(|(((p, g), x), (m, v))| self.apply(step, p, g, x, m, v));
    }
}

/// `s` in `n` pieces of [`UPDATE_PIECE`], or `n` empty slices for an empty `s`.
fn pieces(s: &mut [f32], n: usize) -> Vec<&mut [f32]> {
    if s.is_empty() {
        (0..n).map(|_| Default::default()).collect()
    } else {
        s.chunks_mut(UPDATE_PIECE).collect()
    }
}

/// The mini-batches of one round: shuffled passes over `idx`, cut to size.
fn batches(idx: &[usize], work: LocalWork, batch: usize, rng: &mut Rng) -> Vec<Vec<usize>> {
    let mut order = idx.to_vec();
    let mut out = Vec::new();
    match work {
        LocalWork::Epochs(e) => {
            for _ in 0..e {
                order.shuffle(rng);
                out.extend(order.chunks(batch).map(<[usize]>::to_vec));
            }
        }
        LocalWork::Steps(s) => {
            let mut at = order.len();
            while out.len() < s {
                if at >= order.len() {
                    order.shuffle(rng);
                    at = 0;
                }
                let end = (at + batch).min(order.len());
                out.push(order[at..end].to_vec());
                at = end;
            }
        }
    }
    out
}

/// The fused paths compute on host `f32` slices: they stand in for burn's pass only
/// where burn itself would compute on the CPU. On a GPU device burn's own kernels run.
fn on_host(device: &Device) -> bool {
    *device == Device::flex()
}

impl Trainer<'_> {
    /// The architecture's hand-derived loss and gradient, when it has one and the
    /// trainer's device is the CPU (see [`on_host`]).
    fn fused(&self) -> Option<&dyn LossGradient> {
        self.arch.loss_gradient().filter(|_| on_host(self.device))
    }

    /// Trains from `global` on examples `idx` with learning rate `lr`.
    pub fn train(
        &self,
        global: &[f32],
        idx: &[usize],
        lr: f64,
        rng: &mut Rng,
        state: Option<OptimizerState>,
    ) -> LocalUpdate {
        if let Some(f) = self.fused() {
            return self.train_fused(f, global, idx, lr, rng, state);
        }
        let cfg = self.cfg;
        let layout = self.layout;
        let dev = self.device;
        let start = layout.to_tensors(global, dev);
        let mut params = start.clone();
        let n = params.len();
        let unflatten = |flat: &[f32]| {
            if flat.is_empty() {
                Vec::new()
            } else {
                layout.to_tensors(flat, dev)
            }
        };
        let (mut step, mut m, mut v) = match state {
            // Plain SGD keeps no moments, so its saved state has empty buffers.
            Some(s) => (s.step, unflatten(&s.m), unflatten(&s.v)),
            None => (0, Vec::new(), Vec::new()),
        };
        let adam = cfg.optimizer == LocalOptimizer::Adam;
        let zeros = || params.iter().map(Tensor::zeros_like).collect::<Vec<_>>();
        if (adam || cfg.momentum > 0.0) && m.is_empty() {
            m = zeros();
        }
        if adam && v.is_empty() {
            v = zeros();
        }
        let trainable = |i: usize| layout.specs[i].trainable;
        let plan = batches(idx, cfg.work, cfg.batch_size, rng);
        let mut loss_sum = Tensor::<1>::zeros([1], dev);
        for b in &plan {
            let (loss, mut grads) = {
                let ad: Vec<Tensor<1>> = params
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        let p = p.clone().autodiff();
                        if trainable(i) { p.require_grad() } else { p }
                    })
                    .collect();
                let (x, y) = model::batch(self.data, b, dev);
                let mut drop = Dropout {
                    p: self.dropout,
                    rng,
                };
                let (logits, running) = self.arch.forward_train(&ad, x, &mut drop);
                let loss = model::cross_entropy(logits, y);
                let grads = loss.backward();
                // Running statistics take the forward pass's values: no gradient, weight
                // decay, proximal term or optimizer step touches them.
                for (i, value) in running {
                    params[i] = value;
                }
                let g: Vec<Option<Tensor<1>>> = ad
                    .iter()
                    .enumerate()
                    .map(|(i, p)| trainable(i).then(|| p.grad(&grads)).flatten())
                    .collect();
                (loss.inner(), g)
            };
            loss_sum = loss_sum + loss;
            step += 1;
            for i in (0..n).filter(|&i| trainable(i)) {
                let mut g = grads[i]
                    .take()
                    .expect("every trainable parameter takes part in the forward pass");
                let p = params[i].clone();
                if cfg.weight_decay > 0.0 {
                    g = g + p.clone() * cfg.weight_decay;
                }
                if cfg.prox_mu > 0.0 {
                    g = g + (p.clone() - start[i].clone()) * cfg.prox_mu;
                }
                params[i] = match cfg.optimizer {
                    LocalOptimizer::Sgd if cfg.momentum > 0.0 => {
                        m[i] = m[i].clone() * cfg.momentum + g;
                        p - m[i].clone() * lr
                    }
                    LocalOptimizer::Sgd => p - g * lr,
                    LocalOptimizer::Adam => {
                        let (b1, b2) = (cfg.beta1, cfg.beta2);
                        m[i] = m[i].clone() * b1 + g.clone() * (1.0 - b1);
                        v[i] = v[i].clone() * b2 + g.clone() * g * (1.0 - b2);
                        let c1 = 1.0 - b1.powi(step as i32);
                        let c2 = 1.0 - b2.powi(step as i32);
                        let denom = (v[i].clone() / c2).sqrt() + cfg.eps;
                        p - (m[i].clone() / c1) / denom * lr
                    }
                };
            }
        }
        let steps = plan.len();
        let mean_loss = loss_sum.into_scalar::<f32>() as f64 / steps.max(1) as f64;
        let state = cfg.persistent_state.then(|| OptimizerState {
            step,
            m: if m.is_empty() {
                Vec::new()
            } else {
                layout.to_flat(m)
            },
            v: if v.is_empty() {
                Vec::new()
            } else {
                layout.to_flat(v)
            },
        });
        LocalUpdate {
            params: layout.to_flat(params),
            mean_loss,
            steps,
            state,
        }
    }

    /// [`Trainer::train`] for an architecture with a hand-derived gradient: parameters,
    /// gradients and optimizer moments stay flat `f32` vectors, so a step costs no
    /// copy into or out of tensors and no tensor op per parameter (at batch 64 on the
    /// FedCor MLP those were a fifth of the step). Each update is the tensor path's
    /// formula, operation for operation in `f32`, so both paths give the same bits
    /// from the same gradients.
    fn train_fused(
        &self,
        f: &dyn LossGradient,
        global: &[f32],
        idx: &[usize],
        lr: f64,
        rng: &mut Rng,
        state: Option<OptimizerState>,
    ) -> LocalUpdate {
        let cfg = self.cfg;
        let mut params = global.to_vec();
        let (mut step, mut m, mut v) = match state {
            Some(s) => (s.step, s.m, s.v),
            None => (0, Vec::new(), Vec::new()),
        };
        let adam = cfg.optimizer == LocalOptimizer::Adam;
        if (adam || cfg.momentum > 0.0) && m.is_empty() {
            m = vec![0.0; params.len()];
        }
        if adam && v.is_empty() {
            v = vec![0.0; params.len()];
        }
        let rule = UpdateRule::of(cfg, lr);
        // The trainable parameters as contiguous spans, so the update runs over plain
        // slices: a per-element `trainable` test and indexing kept it from vectorising, at
        // about a seventh of the FedCor MLP round.
        let (spans, frozen): (Vec<usize>, Vec<usize>) =
            (0..self.layout.specs.len()).partition(|&i| self.layout.specs[i].trainable);
        let spans: Vec<std::ops::Range<usize>> =
            spans.into_iter().map(|i| self.layout.range(i)).collect();
        // The running statistics, whose new values the training pass returns in place
        // of a gradient ([`LossGradient::train_loss_and_gradient`]).
        let frozen: Vec<std::ops::Range<usize>> =
            frozen.into_iter().map(|i| self.layout.range(i)).collect();
        let plan = batches(idx, cfg.work, cfg.batch_size, rng);
        let mut loss_sum = 0.0f32;
        for (i, b) in plan.iter().enumerate() {
            if let Some(next) = plan.get(i + 1) {
                self.data.prefetch(next);
            }
            let mut drop = Dropout {
                p: self.dropout,
                rng,
            };
            let (loss, grad) = f.train_loss_and_gradient(&params, self.data, b, &mut drop);
            loss_sum += loss;
            step += 1;
            for r in &frozen {
                params[r.clone()].copy_from_slice(&grad[r.clone()]);
            }
            for r in &spans {
                let r = r.clone();
                rule.apply_pieces(
                    step,
                    &mut params[r.clone()],
                    &grad[r.clone()],
                    &global[r.clone()],
                    m.get_mut(r.clone()).unwrap_or_default(),
                    v.get_mut(r).unwrap_or_default(),
                );
            }
        }
        let steps = plan.len();
        LocalUpdate {
            params,
            mean_loss: f64::from(loss_sum) / steps.max(1) as f64,
            steps,
            state: cfg
                .persistent_state
                .then_some(OptimizerState { step, m, v }),
        }
    }

    /// The gradient at `global` of the mean training loss over the examples `scope` names
    /// among `idx` (no dropout, no local step: the gradient of the model as received).
    ///
    /// - [`GradientScope::Full`]: all of `idx`, the full-batch gradient of the DivFL code
    ///   (algorithms.md §8). It runs in batches of the training batch size, each batch's
    ///   mean-loss gradient weighted by |batch| / |idx|, so the sum equals the gradient of
    ///   the mean over the concatenated batch; `rng` is unused.
    /// - [`GradientScope::Minibatch`]: one batch of the training batch size, shuffled
    ///   from `idx` with `rng`.
    pub fn gradient(
        &self,
        global: &[f32],
        idx: &[usize],
        scope: GradientScope,
        rng: &mut Rng,
    ) -> Gradient {
        let batches: Vec<Vec<usize>> = match scope {
            GradientScope::Full => idx
                .chunks(self.cfg.batch_size)
                .map(<[usize]>::to_vec)
                .collect(),
            GradientScope::Minibatch => {
                let mut order = idx.to_vec();
                order.shuffle(rng);
                order.truncate(self.cfg.batch_size);
                vec![order]
            }
        };
        let dev = self.device;
        let params = self.layout.to_tensors(global, dev);
        let examples: usize = batches.iter().map(Vec::len).sum();
        let mut sum: Vec<Tensor<1>> = params.iter().map(Tensor::zeros_like).collect();
        let specs = &self.layout.specs;
        let fused = self.fused();
        for b in batches.iter().filter(|b| !b.is_empty()) {
            let share = b.len() as f64 / examples as f64;
            if let Some(f) = fused {
                let (_, g) = f.loss_and_gradient(global, self.data, b);
                for (s, g) in sum.iter_mut().zip(self.layout.to_tensors(&g, dev)) {
                    *s = s.clone() + g * share;
                }
                continue;
            }
            let ad: Vec<Tensor<1>> = params
                .iter()
                .zip(specs)
                .map(|(p, spec)| {
                    let p = p.clone().autodiff();
                    if spec.trainable { p.require_grad() } else { p }
                })
                .collect();
            let (x, y) = model::batch(self.data, b, dev);
            let loss = model::cross_entropy(self.arch.forward(&ad, x, None), y);
            let grads = loss.backward();
            // Non-trainable entries (BatchNorm's running statistics) keep a zero gradient.
            for ((s, p), spec) in sum.iter_mut().zip(&ad).zip(specs) {
                if spec.trainable {
                    let g = p
                        .grad(&grads)
                        .expect("every trainable parameter takes part");
                    *s = s.clone() + g * share;
                }
            }
        }
        Gradient {
            values: self.layout.to_flat(sum),
            examples,
        }
    }
}

/// A client's gradient of the global model and what it cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Gradient {
    /// The flat gradient.
    pub values: Vec<f32>,
    /// Training examples it passed over.
    pub examples: usize,
}

/// Loss and accuracy of a model on some examples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Mean cross-entropy.
    pub loss: f64,
    /// Fraction correct.
    pub accuracy: f64,
    /// Examples evaluated.
    pub examples: usize,
}

/// Evaluates parameters (already on the device) on examples `idx` of `data`.
pub fn evaluate(
    arch: &dyn Architecture,
    params: &[Tensor<1>],
    data: &Dataset,
    idx: &[usize],
    batch_size: usize,
    device: &Device,
) -> Evaluation {
    let batches: Vec<_> = idx
        .chunks(batch_size)
        .map(|chunk| model::batch(data, chunk, device))
        .collect();
    evaluate_batches(arch, params, &batches)
}

/// Evaluates the flat parameters `params` on examples `idx` of `data` in batches of
/// `batch_size`, with the result of [`evaluate`] on `layout`'s tensors, to the bit. An
/// architecture with [`Architecture::exact_logits`] computes each batch's logits on the
/// host, the batches side by side, and burn reduces them to the batch's loss as in
/// [`evaluate`]: no copy of the parameters into tensors and no burn forward pass.
pub fn evaluate_flat(
    arch: &dyn Architecture,
    layout: &ParamLayout,
    params: &[f32],
    data: &Dataset,
    idx: &[usize],
    batch_size: usize,
    device: &Device,
) -> Evaluation {
    let Some(exact) = host_logits(arch, data, device) else {
        let p = layout.to_tensors(params, device);
        return evaluate(arch, &p, data, idx, batch_size, device);
    };
    let batches: Vec<(f64, usize)> = idx
        .par_chunks(batch_size)
        .map(|chunk| {
            let z = exact_batch(exact, params, data, chunk);
            let classes = z.len() / chunk.len();
            let z = Tensor::<2>::from_data(TensorData::new(z, [chunk.len(), classes]), device);
            model::loss_and_correct(z, model::labels(data, chunk, device))
        })
        .collect();
    // Summed in batch order, as `evaluate_batches` does.
    let (mut loss, mut correct) = (0.0, 0);
    for (l, c) in batches {
        loss += l;
        correct += c;
    }
    let n = idx.len().max(1) as f64;
    Evaluation {
        loss: loss / n,
        accuracy: correct as f64 / n,
        examples: idx.len(),
    }
}

/// Per example of `idx`, whether the flat `params` classify it correctly, the examples in
/// batches of `batch_size` side by side. Each example's logits do not depend on which
/// examples share its batch (every product sums over k in the same order whatever the
/// rows, and evaluation has no batch statistics), so a client's accuracy counted from
/// these flags over a pool of many clients' examples is [`evaluate_flat`]'s accuracy on
/// its examples alone, to the bit, at a fraction of the calls when clients hold a few
/// examples each.
pub fn correct_flags(
    arch: &dyn Architecture,
    layout: &ParamLayout,
    params: &[f32],
    data: &Dataset,
    idx: &[usize],
    batch_size: usize,
    device: &Device,
) -> Vec<bool> {
    per_batch_logits(
        arch,
        layout,
        params,
        data,
        idx,
        batch_size,
        device,
        |chunk, logits| {
            let predicted: Vec<usize> = match logits {
                Logits::Host(z) => z
                    .chunks_exact(z.len() / chunk.len())
                    .map(model::argmax)
                    .collect(),
                Logits::Device(z) => z
                    .argmax(1)
                    .reshape([chunk.len()])
                    .into_data()
                    .try_into_vec_as::<i64>()
                    .expect("argmax gives integers")
                    .into_iter()
                    .map(|k| k as usize)
                    .collect(),
            };
            predicted
                .into_iter()
                .zip(chunk)
                .map(|(k, &i)| k == data.labels[i] as usize)
                .collect()
        },
    )
}

/// The cross-entropy of the flat `params` on each example of `idx`, in order, the examples
/// in batches of `batch_size` side by side: the per-sample losses a client computes for a
/// sample-selection pass ([`crate::select::SampleRule`], FedBalancer's
/// `calculate_loss_on_whole_dataset_with_inference`). The model is in evaluation mode (no
/// dropout), as the FedBalancer code's `model.test`; each row's loss is computed from its
/// `f32` logits as [`model::loss_and_correct_of`] computes it, so an example's loss does
/// not depend on which examples share its batch.
pub fn example_losses(
    arch: &dyn Architecture,
    layout: &ParamLayout,
    params: &[f32],
    data: &Dataset,
    idx: &[usize],
    batch_size: usize,
    device: &Device,
) -> Vec<f64> {
    per_batch_logits(
        arch,
        layout,
        params,
        data,
        idx,
        batch_size,
        device,
        |chunk, logits| {
            let z: Vec<f32> = match logits {
                Logits::Host(z) => z,
                Logits::Device(z) => z.into_data().try_into_vec::<f32>().expect("f32 logits"),
            };
            let classes = z.len() / chunk.len();
            z.chunks_exact(classes)
                .zip(chunk)
                .map(|(row, &i)| model::loss_and_correct_of(row, &[i64::from(data.labels[i])]).0)
                .collect()
        },
    )
}

/// A batch's logits, where the fastest path the architecture and device allow left them.
enum Logits {
    /// On the host, row after row: the exact or the fused path.
    Host(Vec<f32>),
    /// On the device: the tensor forward pass (boxed: a tensor handle is several times
    /// a vector's size, and this path is a forward pass per batch anyway).
    Device(Box<Tensor<2>>),
}

/// `per_batch(chunk, logits)` over the batches of `batch_size` examples of `idx`, side by
/// side, in order: the logits of the exact host path where the architecture has one for
/// this data, else of its fused host path on a host device, else of the tensor forward
/// pass (the flat `params` made tensors once). Each example's logits are the same whatever
/// shares its batch, on every path.
#[allow(clippy::too_many_arguments)]
fn per_batch_logits<T: Send>(
    arch: &dyn Architecture,
    layout: &ParamLayout,
    params: &[f32],
    data: &Dataset,
    idx: &[usize],
    batch_size: usize,
    device: &Device,
    per_batch: impl Fn(&[usize], Logits) -> Vec<T> + Sync,
) -> Vec<T> {
    let exact = host_logits(arch, data, device);
    let tensors = exact.is_none().then(|| layout.to_tensors(params, device));
    let fused = arch
        .fused_logits()
        .filter(|_| exact.is_none() && on_host(device));
    idx.par_chunks(batch_size)
        .flat_map_iter(|chunk| {
            let logits = match (exact, fused, &tensors) {
                (Some(f), _, _) => Logits::Host(exact_batch(f, params, data, chunk)),
                (None, Some(f), _) => {
                    let x = host_values(model::batch(data, chunk, device).0);
                    Logits::Host(f.logits(params, &x, chunk.len()))
                }
                (None, None, Some(p)) => {
                    let (x, _) = model::batch(data, chunk, device);
                    Logits::Device(Box::new(arch.forward(p, x, None)))
                }
                (None, None, None) => unreachable!("tensors are made where no host path exists"),
            };
            per_batch(chunk, logits)
        })
        .collect()
}

/// A batch's inputs as the host slice [`FusedLogits::logits`] reads: dense values, or
/// token ids as `f32`.
fn host_values(x: model::Batch) -> Vec<f32> {
    match x {
        model::Batch::Dense(x) => x
            .into_data()
            .try_into_vec::<f32>()
            .expect("dense inputs are f32"),
        model::Batch::Tokens(x) => x
            .into_data()
            .try_into_vec_as::<i64>()
            .expect("token ids are integers")
            .into_iter()
            .map(|t| t as f32)
            .collect(),
    }
}

/// Whether [`evaluate_flat`] evaluates `arch` on `data` on host slices, without
/// tensors.
pub fn evaluates_on_host(arch: &dyn Architecture, data: &Dataset, device: &Device) -> bool {
    host_logits(arch, data, device).is_some()
}

/// The architecture's exact logits, where it has them, the device is the CPU (see
/// [`on_host`]) and the inputs are rows of numbers.
fn host_logits<'a>(
    arch: &'a dyn Architecture,
    data: &Dataset,
    device: &Device,
) -> Option<&'a dyn FusedLogits> {
    arch.exact_logits()
        .filter(|_| on_host(device) && matches!(data.inputs, Inputs::Dense { .. }))
}

/// The logits of the examples `chunk` (not empty) of the dense `data`, read in place
/// where they are consecutive rows (a whole test set) and gathered otherwise.
fn exact_batch(f: &dyn FusedLogits, params: &[f32], data: &Dataset, chunk: &[usize]) -> Vec<f32> {
    let Inputs::Dense { values, .. } = &data.inputs else {
        unreachable!("host_logits admits dense inputs only")
    };
    let row = data.inputs.row_len();
    let first = chunk[0];
    if chunk.iter().enumerate().all(|(j, &i)| i == first + j) {
        let rows = &values[first * row..(first + chunk.len()) * row];
        f.logits(params, rows, chunk.len())
    } else {
        f.logits(params, &model::dense_rows(data, chunk).0, chunk.len())
    }
}

/// Evaluates parameters on batches already on the device (the server's test set is
/// gathered once per run rather than every round). Architectures with
/// [`Architecture::fused_logits`] compute their logits without burn when the
/// parameters are on the CPU.
pub fn evaluate_batches(
    arch: &dyn Architecture,
    params: &[Tensor<1>],
    batches: &[(model::Batch, Tensor<1, Int>)],
) -> Evaluation {
    let mut loss = 0.0;
    let mut correct = 0;
    let mut examples = 0;
    let host = params.first().is_none_or(|p| on_host(&p.device()));
    let fused = arch.fused_logits().filter(|_| host).map(|f| {
        let flat: Vec<f32> = params
            .iter()
            .flat_map(|p| {
                p.clone()
                    .into_data()
                    .try_into_vec::<f32>()
                    .expect("parameters are f32")
            })
            .collect();
        (f, flat)
    });
    for (x, y) in batches {
        let b = y.dims()[0];
        examples += b;
        let (l, c) = match &fused {
            Some((f, flat)) => {
                let x = host_values(x.clone());
                let labels = y
                    .clone()
                    .into_data()
                    .try_into_vec_as::<i64>()
                    .expect("labels are integers");
                model::loss_and_correct_of(&f.logits(flat, &x, b), &labels)
            }
            None => model::loss_and_correct(arch.forward(params, x.clone(), None), y.clone()),
        };
        loss += l;
        correct += c;
    }
    let n = examples.max(1) as f64;
    Evaluation {
        loss: loss / n,
        accuracy: correct as f64 / n,
        examples,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Inputs;
    use crate::model::logreg::LogReg;
    use crate::rng::{Purpose, stream};

    /// The update in parallel pieces is the whole span's, bit for bit, for every
    /// optimizer, with a last piece shorter than the others.
    #[test]
    fn the_update_in_pieces_equals_the_whole() {
        use rand::Rng as _;
        let n = 3 * UPDATE_PIECE + 5;
        let mut rng = stream(4, Purpose::Dataset, 0, 0);
        let mut draw = || -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
        let (p, g, global, m, v) = (draw(), draw(), draw(), draw(), draw());
        let v: Vec<f32> = v.iter().map(|x| x.abs()).collect();
        for (optimizer, momentum) in [
            (LocalOptimizer::Sgd, None),
            (LocalOptimizer::Sgd, Some(0.9)),
            (LocalOptimizer::Adam, None),
        ] {
            let rule = UpdateRule {
                optimizer,
                lr: 0.05,
                weight_decay: Some(1e-3),
                prox_mu: Some(0.01),
                momentum,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            };
            let keeps = optimizer == LocalOptimizer::Adam || momentum.is_some();
            let moments = |x: &Vec<f32>| if keeps { x.clone() } else { Vec::new() };
            let run = |pieces: bool| {
                let (mut p, mut m, mut v) = (p.clone(), moments(&m), moments(&v));
                let v_or_none = if optimizer == LocalOptimizer::Adam {
                    &mut v[..]
                } else {
                    &mut [][..]
                };
                if pieces {
                    rule.apply_pieces(3, &mut p, &g, &global, &mut m, v_or_none);
                } else {
                    rule.apply(3, &mut p, &g, &global, &mut m, v_or_none);
                }
                (p, m)
            };
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            let (whole, pieces) = (run(false), run(true));
            assert_eq!(
                bits(&whole.0),
                bits(&pieces.0),
                "{optimizer:?} {momentum:?}"
            );
            assert_eq!(
                bits(&whole.1),
                bits(&pieces.1),
                "{optimizer:?} {momentum:?}"
            );
            assert_ne!(bits(&whole.0), bits(&p), "the update moved the parameters");
        }
    }

    /// The one-pass update gives the bits of torch's order written out as passes of
    /// their own (weight decay into the gradient, then the proximal term, then the
    /// optimizer's step), for every optimizer with and without each term.
    #[test]
    fn the_one_pass_update_is_torchs_passes_to_the_bit() {
        use rand::Rng as _;
        let n = 1000;
        let mut rng = stream(5, Purpose::Dataset, 0, 0);
        let mut draw = || -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
        let (p0, g0, global, m0, v0) = (draw(), draw(), draw(), draw(), draw());
        let v0: Vec<f32> = v0.iter().map(|x| x.abs()).collect();
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let (lr, b1, b2, eps, step) = (0.05f32, 0.9f64, 0.999f64, 1e-8f32, 3);
        for weight_decay in [None, Some(1e-3f32)] {
            for prox_mu in [None, Some(0.01f32)] {
                for (optimizer, momentum) in [
                    (LocalOptimizer::Sgd, None),
                    (LocalOptimizer::Sgd, Some(0.9f32)),
                    (LocalOptimizer::Adam, None),
                ] {
                    let (mut g, mut p, mut m, mut v) =
                        (g0.clone(), p0.clone(), m0.clone(), v0.clone());
                    for i in 0..n {
                        if let Some(wd) = weight_decay {
                            g[i] += p[i] * wd;
                        }
                    }
                    for i in 0..n {
                        if let Some(mu) = prox_mu {
                            g[i] += (p[i] - global[i]) * mu;
                        }
                    }
                    for i in 0..n {
                        match (optimizer, momentum) {
                            (LocalOptimizer::Sgd, None) => p[i] -= g[i] * lr,
                            (LocalOptimizer::Sgd, Some(mom)) => {
                                m[i] = m[i] * mom + g[i];
                                p[i] -= m[i] * lr;
                            }
                            (LocalOptimizer::Adam, _) => {
                                m[i] = m[i] * b1 as f32 + g[i] * (1.0 - b1) as f32;
                                v[i] = v[i] * b2 as f32 + g[i] * g[i] * (1.0 - b2) as f32;
                                let c1 = (1.0 - b1.powi(step)) as f32;
                                let c2 = (1.0 - b2.powi(step)) as f32;
                                p[i] -= (m[i] / c1) / ((v[i] / c2).sqrt() + eps) * lr;
                            }
                        }
                    }
                    let rule = UpdateRule {
                        optimizer,
                        lr,
                        weight_decay,
                        prox_mu,
                        momentum,
                        beta1: b1,
                        beta2: b2,
                        eps,
                    };
                    let keeps = optimizer == LocalOptimizer::Adam || momentum.is_some();
                    let (mut q, mut qm) = (p0.clone(), if keeps { m0.clone() } else { Vec::new() });
                    let mut qv = if optimizer == LocalOptimizer::Adam {
                        v0.clone()
                    } else {
                        Vec::new()
                    };
                    rule.apply(step as u64, &mut q, &g0, &global, &mut qm, &mut qv);
                    let case = format!("{optimizer:?} {momentum:?} {weight_decay:?} {prox_mu:?}");
                    assert_eq!(bits(&q), bits(&p), "{case}");
                    if keeps {
                        assert_eq!(bits(&qm), bits(&m), "{case}");
                    }
                    if optimizer == LocalOptimizer::Adam {
                        assert_eq!(bits(&qv), bits(&v), "{case}");
                    }
                }
            }
        }
    }

    /// 200 points in 4-D labelled by the sign of their first coordinate.
    fn separable() -> Dataset {
        use rand::Rng as _;
        let mut rng = stream(9, Purpose::Dataset, 0, 0);
        let values: Vec<f32> = (0..800).map(|_| rng.random_range(-1.0..1.0)).collect();
        let labels = values.chunks(4).map(|x| u32::from(x[0] > 0.0)).collect();
        Dataset {
            inputs: Inputs::Dense {
                shape: vec![4],
                values,
            },
            labels,
            classes: 2,
        }
    }

    fn run(cfg: &TrainConfig, state: Option<OptimizerState>) -> (f64, LocalUpdate, Vec<f32>) {
        let data = separable();
        let arch = LogReg {
            inputs: 4,
            classes: 2,
        };
        let layout = ParamLayout::of(&arch);
        let device = Device::flex();
        let t = Trainer {
            arch: &arch,
            layout: &layout,
            data: &data,
            cfg,
            dropout: 0.0,
            device: &device,
        };
        let idx: Vec<usize> = (0..200).collect();
        let start = layout.init(1);
        let before = evaluate(
            &arch,
            &layout.to_tensors(&start, &device),
            &data,
            &idx,
            100,
            &device,
        )
        .loss;
        let u = t.train(
            &start,
            &idx,
            cfg.lr,
            &mut stream(1, Purpose::Training, 0, 0),
            state,
        );
        let after = evaluate(
            &arch,
            &layout.to_tensors(&u.params, &device),
            &data,
            &idx,
            100,
            &device,
        )
        .loss;
        assert!(after < before, "loss {before} -> {after}");
        (after, u, start)
    }

    #[test]
    fn sgd_momentum_and_adam_reduce_the_loss() {
        let sgd = TrainConfig {
            lr: 0.1,
            momentum: 0.9,
            work: LocalWork::Epochs(3),
            batch_size: 20,
            ..TrainConfig::default()
        };
        let adam = TrainConfig {
            optimizer: LocalOptimizer::Adam,
            lr: 0.05,
            ..sgd.clone()
        };
        let (l_sgd, ..) = run(&sgd, None);
        let (l_adam, ..) = run(&adam, None);
        assert!(l_sgd < 0.4 && l_adam < 0.4, "{l_sgd} {l_adam}");
    }

    #[test]
    fn proximal_term_keeps_the_update_near_the_start() {
        let base = TrainConfig {
            lr: 0.1,
            work: LocalWork::Epochs(2),
            batch_size: 20,
            ..TrainConfig::default()
        };
        let dist = |u: &LocalUpdate, s: &[f32]| {
            u.params
                .iter()
                .zip(s)
                .map(|(a, b)| (a - b).powi(2))
                .sum::<f32>()
        };
        let (_, free, start) = run(&base, None);
        let (_, prox, _) = run(
            &TrainConfig {
                prox_mu: 5.0,
                ..base
            },
            None,
        );
        assert!(dist(&prox, &start) < 0.5 * dist(&free, &start));
    }

    #[test]
    fn persistent_state_carries_over() {
        let cfg = TrainConfig {
            optimizer: LocalOptimizer::Adam,
            lr: 0.05,
            work: LocalWork::Steps(4),
            batch_size: 20,
            persistent_state: true,
            ..TrainConfig::default()
        };
        let (_, first, _) = run(&cfg, None);
        let state = first.state.clone().unwrap();
        assert_eq!(state.step, 4);
        assert_eq!(state.m.len(), 10);
        let (_, second, _) = run(&cfg, Some(state));
        assert_eq!(second.state.as_ref().unwrap().step, 8);
        // Restored moments change the trajectory.
        assert_ne!(second.params, first.params);
        let off = TrainConfig {
            persistent_state: false,
            ..cfg.clone()
        };
        assert!(run(&off, None).1.state.is_none());
        // Plain SGD has no moments to keep: only the step count carries over.
        let sgd = TrainConfig {
            optimizer: LocalOptimizer::Sgd,
            momentum: 0.0,
            ..cfg
        };
        let state = run(&sgd, None).1.state.unwrap();
        assert!(state.m.is_empty() && state.v.is_empty());
        assert_eq!(run(&sgd, Some(state)).1.state.unwrap().step, 8);
    }

    fn relative_error(a: &[f32], b: &[f32]) -> f64 {
        let diff: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
        let norm: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
        (diff / norm).sqrt()
    }

    #[test]
    fn the_full_gradient_is_the_gradient_of_the_concatenated_batch() {
        let data = separable();
        let arch = LogReg {
            inputs: 4,
            classes: 2,
        };
        let layout = ParamLayout::of(&arch);
        let device = Device::flex();
        let small = TrainConfig {
            batch_size: 10,
            ..TrainConfig::default()
        };
        let whole = TrainConfig {
            batch_size: 25,
            ..TrainConfig::default()
        };
        let trainer = |cfg| Trainer {
            arch: &arch,
            layout: &layout,
            data: &data,
            cfg,
            dropout: 0.0,
            device: &device,
        };
        let w = layout.init(1);
        let mut rng = stream(2, Purpose::Training, 0, 0);
        // 25 examples in batches of 10, 10 and 5.
        let idx: Vec<usize> = (0..25).collect();
        let full = trainer(&small).gradient(&w, &idx, GradientScope::Full, &mut rng);
        // One mini-batch of all 25 examples (shuffled, which a mean does not see).
        let one = trainer(&whole).gradient(&w, &idx, GradientScope::Minibatch, &mut rng);
        assert_eq!((full.examples, one.examples), (25, 25));
        assert!(relative_error(&full.values, &one.values) < 1e-5);
        // It is the mean of the per-batch gradients weighted 10 : 10 : 5, not the plain mean.
        let parts: Vec<Vec<f32>> = idx
            .chunks(10)
            .map(|c| {
                trainer(&whole)
                    .gradient(&w, c, GradientScope::Full, &mut rng)
                    .values
            })
            .collect();
        let mix = |weights: [f32; 3]| -> Vec<f32> {
            (0..full.values.len())
                .map(|i| (0..3).map(|b| weights[b] * parts[b][i]).sum())
                .collect()
        };
        assert!(relative_error(&full.values, &mix([0.4, 0.4, 0.2])) < 1e-5);
        assert!(relative_error(&full.values, &mix([1.0 / 3.0; 3])) > 1e-3);
        // A mini-batch gradient passes over one batch.
        let mb = trainer(&small).gradient(&w, &idx, GradientScope::Minibatch, &mut rng);
        assert_eq!(mb.examples, 10);
        assert!(relative_error(&mb.values, &full.values) > 1e-3);
    }

    /// The running statistics of the HiCS code's CNN leave local training with the values
    /// the forward pass gives them: weight decay, the proximal term and momentum, all
    /// large here, would move them if the optimizer touched them. The one-step gradient
    /// is zero there and not elsewhere.
    #[test]
    fn running_statistics_take_no_gradient_and_no_optimizer_step() {
        use crate::model::cnn_hics_code::CnnHicsCode;
        use burn::tensor::TensorData;
        let arch = CnnHicsCode { classes: 2 };
        let layout = ParamLayout::of(&arch);
        let values: Vec<f32> = (0..4 * 784)
            .map(|i| ((i * 53) % 97) as f32 / 97.0)
            .collect();
        let data = Dataset {
            inputs: Inputs::Dense {
                shape: vec![1, 28, 28],
                values: values.clone(),
            },
            labels: vec![0, 1, 1, 0],
            classes: 2,
        };
        let cfg = TrainConfig {
            lr: 0.5,
            momentum: 0.9,
            weight_decay: 1.0,
            prox_mu: 1.0,
            work: LocalWork::Steps(1),
            batch_size: 4,
            ..TrainConfig::default()
        };
        let device = Device::flex();
        let t = Trainer {
            arch: &arch,
            layout: &layout,
            data: &data,
            cfg: &cfg,
            dropout: 0.0,
            device: &device,
        };
        let start = layout.init(2);
        let idx = [0, 1, 2, 3];
        let u = t.train(
            &start,
            &idx,
            cfg.lr,
            &mut stream(1, Purpose::Training, 0, 0),
            None,
        );
        let x = model::Batch::Dense(Tensor::<2>::from_data(
            TensorData::new(values, [4, 784]),
            &device,
        ));
        let mut rng = stream(1, Purpose::Training, 0, 0);
        let mut drop = Dropout {
            p: 0.0,
            rng: &mut rng,
        };
        let (_, running) = arch.forward_train(&layout.to_tensors(&start, &device), x, &mut drop);
        assert_eq!(running.len(), 6);
        for (i, value) in running {
            assert!(!layout.specs[i].trainable);
            let want = value.into_data().try_into_vec::<f32>().unwrap();
            for (a, b) in u.params[layout.range(i)].iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "{}: {a} vs {b}", layout.specs[i].name);
            }
        }
        assert_ne!(u.params[layout.range(0)], start[layout.range(0)]);
        let g = t
            .gradient(
                &start,
                &idx,
                GradientScope::Full,
                &mut stream(1, Purpose::Training, 0, 0),
            )
            .values;
        for (i, spec) in layout.specs.iter().enumerate() {
            let zero = g[layout.range(i)].iter().all(|&v| v == 0.0);
            assert_eq!(zero, !spec.trainable, "{}", spec.name);
        }
    }

    /// `net`'s fused trainer and its autodiff one ([`AutodiffOnly`]) from the same start
    /// (`net`'s init of seed 5) on all of `data`: the start, then each one's local update
    /// and full one-step gradient, the fused first.
    fn fused_and_autodiff(
        net: &dyn Architecture,
        data: &Dataset,
        cfg: &TrainConfig,
    ) -> (Vec<f32>, [(LocalUpdate, Vec<f32>); 2]) {
        use crate::model::AutodiffOnly;
        let reference = AutodiffOnly(net);
        assert!(net.loss_gradient().is_some() && reference.loss_gradient().is_none());
        let layout = ParamLayout::of(net);
        let device = Device::flex();
        let start = layout.init(5);
        let idx: Vec<usize> = (0..data.len()).collect();
        let run = |arch: &dyn Architecture| {
            let t = Trainer {
                arch,
                layout: &layout,
                data,
                cfg,
                dropout: 0.0,
                device: &device,
            };
            let rng = || stream(1, Purpose::Training, 0, 0);
            let update = t.train(&start, &idx, cfg.lr, &mut rng(), None);
            let gradient = t.gradient(&start, &idx, GradientScope::Full, &mut rng());
            (update, gradient.values)
        };
        let both = [run(net), run(&reference)];
        (start, both)
    }

    /// The trainer takes the char-LSTM's fused gradient, and its steps (momentum, weight
    /// decay, proximal term) and full gradient follow the autodiff path's.
    #[test]
    fn the_fused_lstm_path_trains_like_autodiff() {
        use crate::model::lstm::CharLstm;
        let net = CharLstm {
            vocab: 9,
            embed: 4,
            hidden: 6,
        };
        let data = crate::bench::random_dataset(&[], Some(7), 30, 9);
        let cfg = TrainConfig {
            lr: 0.5,
            momentum: 0.9,
            weight_decay: 0.01,
            prox_mu: 0.1,
            work: LocalWork::Steps(4),
            batch_size: 8,
            ..TrainConfig::default()
        };
        let (start, [(fused, fused_g), (slow, slow_g)]) = fused_and_autodiff(&net, &data, &cfg);
        let delta = |u: &LocalUpdate| -> Vec<f32> {
            u.params.iter().zip(&start).map(|(a, b)| a - b).collect()
        };
        assert!(relative_error(&delta(&fused), &delta(&slow)) < 1e-4);
        assert!((fused.mean_loss - slow.mean_loss).abs() < 1e-5 * slow.mean_loss);
        assert!(relative_error(&fused_g, &slow_g) < 1e-4);
    }

    /// The trainer takes the HiCS-FL code CNN's fused pass: its steps in the code's
    /// regime (momentum, weight decay, proximal term) and the running statistics they
    /// move follow the autodiff path's, and so does its one-step gradient (eval mode).
    #[test]
    fn the_fused_batch_norm_cnn_trains_like_autodiff() {
        use crate::model::cnn_hics_code::CnnHicsCode;
        let net = CnnHicsCode { classes: 10 };
        let data = crate::bench::random_dataset(&[1, 28, 28], None, 12, 10);
        let cfg = TrainConfig {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 5e-4,
            prox_mu: 0.5,
            work: LocalWork::Steps(3),
            batch_size: 4,
            ..TrainConfig::default()
        };
        let (start, [(fused, fused_g), (slow, slow_g)]) = fused_and_autodiff(&net, &data, &cfg);
        let delta = |u: &LocalUpdate, r: std::ops::Range<usize>| -> Vec<f32> {
            u.params[r.clone()]
                .iter()
                .zip(&start[r])
                .map(|(a, b)| a - b)
                .collect()
        };
        let layout = ParamLayout::of(&net);
        for (i, spec) in layout.specs.iter().enumerate() {
            let r = layout.range(i);
            let err = relative_error(&delta(&fused, r.clone()), &delta(&slow, r));
            assert!(err < 1e-4, "{}: relative error {err:e}", spec.name);
        }
        assert!((fused.mean_loss - slow.mean_loss).abs() < 1e-5 * slow.mean_loss);
        assert!(relative_error(&fused_g, &slow_g) < 1e-4);
    }

    /// The flat optimizer of the fused path against the tensor optimizer of the autodiff
    /// path, with dropout, for SGD with momentum and for Adam, carrying state into a
    /// second round: parameters and moments agree to 1e-4 relative, and both paths
    /// leave the client's stream in the same state.
    #[test]
    fn the_fused_mlp_path_trains_like_autodiff_with_each_optimizer() {
        use crate::model::AutodiffOnly;
        use crate::model::mlp::Mlp;
        let net = Mlp {
            inputs: 12,
            classes: 4,
            dropout: 0.5,
        };
        let reference = AutodiffOnly(&net);
        let data = crate::bench::random_dataset(&[12], None, 40, 4);
        let layout = ParamLayout::of(&net);
        let device = Device::flex();
        let start = layout.init(6);
        let idx: Vec<usize> = (0..40).collect();
        for optimizer in [LocalOptimizer::Sgd, LocalOptimizer::Adam] {
            let cfg = TrainConfig {
                optimizer,
                lr: 0.05,
                momentum: 0.9,
                weight_decay: 0.01,
                prox_mu: 0.1,
                persistent_state: true,
                work: LocalWork::Steps(5),
                batch_size: 8,
                ..TrainConfig::default()
            };
            let train = |arch: &dyn Architecture| {
                let trainer = Trainer {
                    arch,
                    layout: &layout,
                    data: &data,
                    cfg: &cfg,
                    dropout: net.dropout,
                    device: &device,
                };
                let mut rng = stream(2, Purpose::Training, 0, 0);
                let first = trainer.train(&start, &idx, cfg.lr, &mut rng, None);
                let second = trainer.train(&first.params, &idx, cfg.lr, &mut rng, first.state);
                (second, rng)
            };
            let ((fused, fused_rng), (slow, slow_rng)) = (train(&net), train(&reference));
            assert_eq!(fused_rng, slow_rng, "{optimizer:?}: same draws");
            let delta = |u: &LocalUpdate| -> Vec<f32> {
                u.params.iter().zip(&start).map(|(a, b)| a - b).collect()
            };
            let err = relative_error(&delta(&fused), &delta(&slow));
            assert!(err < 1e-4, "{optimizer:?}: relative error {err:e}");
            assert!((fused.mean_loss - slow.mean_loss).abs() < 1e-5 * slow.mean_loss);
            let (a, b) = (fused.state.unwrap(), slow.state.unwrap());
            assert_eq!(a.step, b.step);
            assert!(
                relative_error(&a.m, &b.m) < 1e-4,
                "{optimizer:?}: first moment"
            );
            if optimizer == LocalOptimizer::Adam {
                assert!(relative_error(&a.v, &b.v) < 1e-4, "second moment");
            }
        }
    }

    /// Evaluation through the MLP's exact logits gives burn's loss and accuracy to the
    /// bit, on consecutive rows read in place and on gathered ones, with a last batch
    /// short of the rest; the accuracy alone is the same.
    #[test]
    fn host_evaluation_is_burns_to_the_bit() {
        use crate::model::mlp::Mlp;
        let net = Mlp {
            inputs: 784,
            classes: 10,
            dropout: 0.5,
        };
        let layout = ParamLayout::of(&net);
        let data = crate::bench::random_dataset(&[784], None, 700, 10);
        let device = Device::flex();
        assert!(evaluates_on_host(&net, &data, &device));
        let params = layout.init(3);
        let p = layout.to_tensors(&params, &device);
        let consecutive: Vec<usize> = (0..700).collect();
        let gathered: Vec<usize> = (0..650).map(|i| (i * 11) % 700).collect();
        for idx in [consecutive, gathered] {
            let want = evaluate(&net, &p, &data, &idx, 300, &device);
            let got = evaluate_flat(&net, &layout, &params, &data, &idx, 300, &device);
            assert_eq!(got.loss.to_bits(), want.loss.to_bits());
            assert_eq!((got.accuracy, got.examples), (want.accuracy, want.examples));
        }
    }

    /// A client's accuracy counted from [`correct_flags`] over a pool of many clients'
    /// examples equals its accuracy evaluated alone, to the bit, on every evaluation path:
    /// the MLP's exact host logits, the CNN's fused logits and burn's forward pass
    /// (logistic regression); with batches that cut across clients.
    #[test]
    fn pooled_correct_flags_give_each_clients_own_accuracy() {
        use crate::model::cnn_fmnist::CnnFmnist;
        use crate::model::mlp::Mlp;
        let device = Device::flex();
        let dense = crate::bench::random_dataset(&[784], None, 400, 10);
        let image = crate::bench::random_dataset(&[1, 28, 28], None, 120, 10);
        let mlp = Mlp {
            inputs: 784,
            classes: 10,
            dropout: 0.5,
        };
        let logreg = LogReg {
            inputs: 784,
            classes: 10,
        };
        let cnn = CnnFmnist {
            classes: 10,
            hidden: Some(128),
        };
        let nets: [(&dyn Architecture, &Dataset); 3] =
            [(&mlp, &dense), (&logreg, &dense), (&cnn, &image)];
        for (net, data) in nets {
            let layout = ParamLayout::of(net);
            let params = layout.init(5);
            // Clients of 1 to 13 examples, gathered out of order.
            let n = data.len();
            let pool: Vec<usize> = (0..n).map(|i| (i * 7) % n).collect();
            let flags = correct_flags(net, &layout, &params, data, &pool, 64, &device);
            let (mut at, mut size) = (0, 1);
            while at < n {
                let part = &pool[at..(at + size).min(n)];
                let alone = evaluate_flat(net, &layout, &params, data, part, 64, &device);
                let right = flags[at..at + part.len()].iter().filter(|&&c| c).count();
                assert_eq!(
                    right as f64 / part.len() as f64,
                    alone.accuracy,
                    "{}",
                    net.name()
                );
                at += part.len();
                size = size % 13 + 1;
            }
        }
    }

    #[test]
    fn steps_and_epochs_give_the_right_batches() {
        let idx: Vec<usize> = (0..25).collect();
        let mut rng = stream(1, Purpose::Training, 0, 0);
        let e = batches(&idx, LocalWork::Epochs(2), 10, &mut rng);
        assert_eq!(
            e.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![10, 10, 5, 10, 10, 5]
        );
        let mut seen: Vec<usize> = e[..3].concat();
        seen.sort();
        assert_eq!(seen, idx, "one epoch visits every example once");
        let s = batches(&idx, LocalWork::Steps(7), 10, &mut rng);
        assert_eq!(s.len(), 7);
        assert!(s.iter().all(|b| !b.is_empty() && b.len() <= 10));
    }

    /// Each example's loss is the model's loss on that example alone, whatever batch it
    /// shares, and their mean is the evaluation's loss.
    #[test]
    fn example_losses_are_each_example_s_own_loss() {
        let data = separable();
        let arch = LogReg {
            inputs: 4,
            classes: 2,
        };
        let layout = ParamLayout::of(&arch);
        let device = Device::flex();
        let params = layout.init(3);
        let idx: Vec<usize> = (0..60).map(|i| (i * 7) % 200).collect();
        let losses = |b| example_losses(&arch, &layout, &params, &data, &idx, b, &device);
        let (by7, by64) = (losses(7), losses(64));
        assert_eq!(by7, by64);
        for (&i, &l) in idx.iter().zip(&by7) {
            let alone = evaluate_flat(&arch, &layout, &params, &data, &[i], 1, &device);
            assert!(
                (l - alone.loss).abs() < 1e-6,
                "example {i}: {l} vs {}",
                alone.loss
            );
        }
        let all = evaluate_flat(&arch, &layout, &params, &data, &idx, 64, &device);
        let mean = by7.iter().sum::<f64>() / by7.len() as f64;
        assert!((mean - all.loss).abs() < 1e-6, "{mean} vs {}", all.loss);
        assert!(
            by7.iter().any(|&l| (l - mean).abs() > 1e-3),
            "losses differ by example"
        );
    }
}
