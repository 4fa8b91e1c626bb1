//! Models as pure functions of a flat parameter vector.
//!
//! Every architecture declares its parameters as a list of named tensors and
//! computes logits from them. Parameters travel between server and clients
//! as one `f32` vector (aggregation and update statistics work on it
//! directly), and a client materialises them as fresh tensors for each round.
//! Building fresh tensors from the flat vector instead of cloning a shared
//! module also avoids a burn-autodiff deadlock seen with parallel clones
//! (upstream issues 5573 and 2729).
//!
//! By convention the last two parameters of every architecture are the
//! output layer's weight and bias, so strategies such as HiCS-FL can address
//! the output layer's update.
//!
//! A parameter may be non-trainable ([`ParamSpec::trainable`]): BatchNorm's running
//! statistics, which PyTorch keeps as buffers in the model's state dict. They travel in
//! the flat vector and are averaged with the parameters, as the state dict is in the
//! HiCS-FL code, but take no gradient and no optimizer step: the forward pass in
//! training mode computes their new values ([`Architecture::forward_train`]).

pub mod cnn_cifar;
pub mod cnn_fmnist;
pub(crate) mod cnn_fused;
pub mod cnn_hics_code;
mod fastmath;
pub mod logreg;
pub mod lstm;
pub(crate) mod matmul;
pub mod mlp;

use std::ops::Range;

use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::Rng as _;
use rand_distr::{Distribution, StandardNormal};

use crate::config::{ModelConfig, ModelInit};
use crate::data::{Dataset, Inputs};
use crate::error::ConfigError;
use crate::rng::{Purpose, Rng, stream};

/// How a parameter is initialised (PyTorch's defaults for each layer type).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// U(−b, b); PyTorch uses b = 1/√fan_in for linear and conv layers, 1/√hidden for LSTMs.
    Uniform(f32),
    /// N(0, σ²); PyTorch's embedding default is σ = 1.
    Normal(f32),
    /// Every entry the same (BatchNorm's scale 1 and shift 0, PReLU's slope 0.25).
    Constant(f32),
}

impl Init {
    /// Xavier (Glorot) uniform with `gain`: U(−b, b), b = gain·√(6 / (fan_in + fan_out)),
    /// as PyTorch's `xavier_uniform_`.
    pub fn xavier(fan_in: usize, fan_out: usize, gain: f32) -> Self {
        Self::Uniform(gain * (6.0 / (fan_in + fan_out) as f32).sqrt())
    }
}

/// One named parameter tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// Name, e.g. `fc1.weight`.
    pub name: String,
    /// Shape as the forward pass uses it.
    pub shape: Vec<usize>,
    /// Initialisation.
    pub init: Init,
    /// Whether the optimizer trains it; `false` for running statistics, which only the
    /// forward pass in training mode changes.
    pub trainable: bool,
}

impl ParamSpec {
    fn new(name: &str, shape: &[usize], init: Init) -> Self {
        Self {
            name: name.into(),
            shape: shape.to_vec(),
            init,
            trainable: true,
        }
    }

    /// A non-trainable entry (a running statistic) of `n` values, all `value` at first.
    pub(crate) fn running(name: &str, n: usize, value: f32) -> Self {
        Self {
            trainable: false,
            ..Self::new(name, &[n], Init::Constant(value))
        }
    }

    /// A linear layer `fan_in → fan_out`: weight `[fan_in, fan_out]` and bias.
    pub(crate) fn linear(name: &str, fan_in: usize, fan_out: usize) -> [Self; 2] {
        let b = Init::Uniform(1.0 / (fan_in as f32).sqrt());
        [
            Self::new(&format!("{name}.weight"), &[fan_in, fan_out], b),
            Self::new(&format!("{name}.bias"), &[fan_out], b),
        ]
    }

    /// A 2-D convolution: weight `[out, in, k, k]` and bias.
    pub(crate) fn conv(name: &str, cin: usize, cout: usize, k: usize) -> [Self; 2] {
        let b = Init::Uniform(1.0 / ((cin * k * k) as f32).sqrt());
        [
            Self::new(&format!("{name}.weight"), &[cout, cin, k, k], b),
            Self::new(&format!("{name}.bias"), &[cout], b),
        ]
    }

    /// Number of scalars.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A mini-batch of inputs on a device.
#[derive(Clone)]
pub enum Batch {
    /// `[batch, features]`, reshaped by the model as it needs.
    Dense(Tensor<2>),
    /// `[batch, seq_len]` token ids.
    Tokens(Tensor<2, Int>),
}

/// Randomness and rate for dropout during training.
pub struct Dropout<'a> {
    /// Probability of zeroing a unit.
    pub p: f64,
    /// The client's training stream.
    pub rng: &'a mut Rng,
}

impl Dropout<'_> {
    /// Applies inverted dropout to `x`, drawing the mask from the client's stream
    /// so that results do not depend on thread scheduling.
    pub fn apply(&mut self, x: Tensor<2>) -> Tensor<2> {
        if self.p <= 0.0 {
            return x;
        }
        let dims = x.dims();
        let mask = self.mask(dims[0] * dims[1]);
        let mask =
            Tensor::<2>::from_data(TensorData::new(mask, dims), &x.device().without_autodiff());
        x * mask
    }

    /// The multipliers of `len` units, row-major: 0 for a dropped unit, 1/(1 − p) for a
    /// kept one. [`Dropout::apply`] and hand-derived gradients both draw through here,
    /// so that the two paths consume the client's stream alike.
    ///
    ///
    /// Each unit's draw is `rng.random::<f64>()`: the top 53 bits `u` of one `u64`, times
    /// 2⁻⁵³ (exactly), so `u·2⁻⁵³ < p` exactly when `u < ⌈p·2⁵³⌉` (`p·2⁵³` is exact too).
    /// The words come in one bulk fill, which reads the stream in the same order and
    /// leaves it in the same state as one `next_u64` per unit: the same mask for a
    /// fraction of the cost (the FedCor MLP draws 6,016 a step; one by one, through
    /// `f64`, they took a twentieth of its round).
    pub fn mask(&mut self, len: usize) -> Vec<f32> {
        let keep = 1.0 / (1.0 - self.p) as f32;
        let mut words = vec![0u64; len];
        self.rng.fill(&mut words[..]);
        // `as` saturates: p ≥ 1 drops every unit, and p ≤ 0 or NaN none, as the f64
        // comparison does.
        let below = (self.p * (1u64 << 53) as f64).ceil() as u64;
        words
            .iter()
            .map(|&w| if w >> 11 < below { 0.0 } else { keep })
            .collect()
    }
}

/// A network architecture: its parameters and its forward pass.
pub trait Architecture: Send + Sync {
    /// Short name as used in configs.
    fn name(&self) -> &'static str;
    /// The parameters, output weight and bias last.
    fn params(&self) -> Vec<ParamSpec>;
    /// Logits `[batch, classes]`; `dropout` is `Some` only while training.
    fn forward(&self, p: &[Tensor<1>], x: Batch, dropout: Option<&mut Dropout<'_>>) -> Tensor<2>;

    /// Logits in training mode and the new values of the non-trainable parameters that
    /// the pass updates, as (parameter index, value) without autodiff. Architectures
    /// without non-trainable parameters keep this default.
    fn forward_train(
        &self,
        p: &[Tensor<1>],
        x: Batch,
        dropout: &mut Dropout<'_>,
    ) -> (Tensor<2>, Vec<(usize, Tensor<1>)>) {
        (self.forward(p, x, Some(dropout)), Vec::new())
    }

    /// A hand-derived loss and gradient for training, where the architecture has one;
    /// `None` (the default) and the trainer differentiates
    /// [`Architecture::forward_train`] with autodiff. An architecture provides one
    /// only where it is the exact gradient of that training-mode pass: one with
    /// dropout must override [`LossGradient::train_loss_and_gradient`] to draw its
    /// masks, and one with non-trainable parameters to return their new values.
    fn loss_gradient(&self) -> Option<&dyn LossGradient> {
        None
    }

    /// A forward pass without burn for evaluation, where the architecture has one;
    /// `None` (the default) and evaluation runs [`Architecture::forward`]. An
    /// architecture provides one only where it computes the same logits as that
    /// pass without dropout.
    fn fused_logits(&self) -> Option<&dyn FusedLogits> {
        None
    }

    /// A forward pass without burn for evaluation whose logits are bit-identical to
    /// [`Architecture::forward`]'s without dropout (the same `gemm` calls on the same
    /// shapes, the same elementwise operations), where the architecture has one. Unlike
    /// [`Architecture::fused_logits`], evaluation still reduces them with burn's loss,
    /// so taking this path changes no result; it saves burn's forward pass and the copy
    /// of the parameters into tensors.
    fn exact_logits(&self) -> Option<&dyn FusedLogits> {
        None
    }
}

/// Logits without burn, for evaluation.
pub trait FusedLogits: Sync {
    /// Logits `[batch, classes]`, row-major, of the `batch` examples `x` (one after
    /// another) at the flat parameters `params`; a token model's examples are its
    /// token ids as `f32` (exact below 2^24).
    fn logits(&self, params: &[f32], x: &[f32], batch: usize) -> Vec<f32>;
}

/// The training loss and its gradient without autodiff.
pub trait LossGradient: Sync {
    /// Mean cross-entropy of examples `idx` of `data` at the flat parameters `params`,
    /// and its flat gradient (same layout as `params`, 0 at a non-trainable parameter),
    /// of [`Architecture::forward`] without dropout.
    fn loss_and_gradient(&self, params: &[f32], data: &Dataset, idx: &[usize]) -> (f32, Vec<f32>);

    /// The same in training mode, with dropout drawn from `dropout`. A non-trainable
    /// parameter has no gradient, so its entries of the returned vector hold instead the
    /// value the pass gives it (BatchNorm's running statistics), which the trainer
    /// copies as [`Architecture::forward_train`]'s. Only an architecture with dropout or
    /// non-trainable parameters overrides it; the default ignores `dropout`.
    fn train_loss_and_gradient(
        &self,
        params: &[f32],
        data: &Dataset,
        idx: &[usize],
        _dropout: &mut Dropout<'_>,
    ) -> (f32, Vec<f32>) {
        self.loss_and_gradient(params, data, idx)
    }
}

/// An architecture seen through autodiff only: it hides the wrapped architecture's
/// [`Architecture::loss_gradient`] and [`Architecture::fused_logits`], so that training
/// and evaluation take the generic burn path. The generic path is the reference for
/// hand-derived gradients and the "before" side of `fedsel bench`.
pub struct AutodiffOnly<'a>(pub &'a dyn Architecture);

impl Architecture for AutodiffOnly<'_> {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn params(&self) -> Vec<ParamSpec> {
        self.0.params()
    }

    fn forward(&self, p: &[Tensor<1>], x: Batch, dropout: Option<&mut Dropout<'_>>) -> Tensor<2> {
        self.0.forward(p, x, dropout)
    }

    fn forward_train(
        &self,
        p: &[Tensor<1>],
        x: Batch,
        dropout: &mut Dropout<'_>,
    ) -> (Tensor<2>, Vec<(usize, Tensor<1>)>) {
        self.0.forward_train(p, x, dropout)
    }
}

/// Where each parameter lives in the flat vector.
#[derive(Debug, Clone)]
pub struct ParamLayout {
    /// The parameters in order.
    pub specs: Vec<ParamSpec>,
    /// Start offset of each parameter.
    pub offsets: Vec<usize>,
    /// Total number of scalars.
    pub total: usize,
}

impl ParamLayout {
    /// The layout of an architecture.
    pub fn of(arch: &dyn Architecture) -> Self {
        let specs = arch.params();
        let mut offsets = Vec::with_capacity(specs.len());
        let mut total = 0;
        for s in &specs {
            offsets.push(total);
            total += s.numel();
        }
        Self {
            specs,
            offsets,
            total,
        }
    }

    /// The layout with `model.init` applied. Under [`ModelInit::XavierRelu`] every 2-D
    /// parameter, which in the kinds config validation admits for it (`mlp`, `logreg`) is a
    /// linear layer's weight `[fan_in, fan_out]`, is drawn Xavier-uniform at gain √2
    /// ([`Init::xavier`]); biases keep their draw, as the HiCS-FL authors' servers leave
    /// them. Only the bound changes, so the stream's draws are taken in the same order.
    pub fn with_init(mut self, init: ModelInit) -> Self {
        match init {
            ModelInit::Default => {}
            ModelInit::XavierRelu => {
                for s in &mut self.specs {
                    if let [fan_in, fan_out] = s.shape[..] {
                        s.init = Init::xavier(fan_in, fan_out, std::f32::consts::SQRT_2);
                    }
                }
            }
        }
        self
    }

    /// Range of parameter `i` in the flat vector.
    pub fn range(&self, i: usize) -> Range<usize> {
        self.offsets[i]..self.offsets[i] + self.specs[i].numel()
    }

    /// Range of the output layer's bias (the last parameter).
    pub fn output_bias(&self) -> Range<usize> {
        self.range(self.specs.len() - 1)
    }

    /// Range of the output layer's weight (the second-to-last parameter).
    pub fn output_weight(&self) -> Range<usize> {
        self.range(self.specs.len() - 2)
    }

    /// Initial parameters drawn from the run's `Init` stream.
    pub fn init(&self, seed: u64) -> Vec<f32> {
        let mut rng = stream(seed, Purpose::Init, 0, 0);
        let mut out = Vec::with_capacity(self.total);
        for s in &self.specs {
            match s.init {
                Init::Uniform(b) => out.extend((0..s.numel()).map(|_| rng.random_range(-b..=b))),
                Init::Normal(sd) => out.extend((0..s.numel()).map(|_| {
                    let z: f32 = StandardNormal.sample(&mut rng);
                    z * sd
                })),
                Init::Constant(v) => out.extend(std::iter::repeat_n(v, s.numel())),
            }
        }
        out
    }

    /// One 1-D tensor per parameter, copied from the flat vector.
    pub fn to_tensors(&self, flat: &[f32], device: &Device) -> Vec<Tensor<1>> {
        (0..self.specs.len())
            .map(|i| {
                let r = self.range(i);
                let n = r.len();
                Tensor::<1>::from_data(TensorData::new(flat[r].to_vec(), [n]), device)
            })
            .collect()
    }

    /// Copies tensors back into a flat vector.
    pub fn to_flat(&self, tensors: Vec<Tensor<1>>) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.total);
        for t in tensors {
            out.extend(
                t.into_data()
                    .try_into_vec::<f32>()
                    .expect("parameters are f32"),
            );
        }
        out
    }
}

/// Builds the architecture a config names, shaped for the dataset.
pub fn build(cfg: &ModelConfig, data: &Dataset) -> Result<Box<dyn Architecture>, ConfigError> {
    let classes = data.classes;
    let mismatch = |what: &str| {
        ConfigError::invalid(
            "model.kind",
            format!(
                "`{}` needs {what}; this dataset does not provide it",
                cfg.kind
            ),
        )
    };
    match (&data.inputs, cfg.kind.as_str()) {
        (Inputs::Dense { shape, .. }, "logreg") => Ok(Box::new(logreg::LogReg {
            inputs: shape.iter().product(),
            classes,
        })),
        (Inputs::Dense { shape, .. }, "mlp") => Ok(Box::new(mlp::Mlp {
            inputs: shape.iter().product(),
            classes,
            dropout: cfg.dropout,
        })),
        (Inputs::Dense { shape, .. }, "cnn_fmnist") if shape[..] == [1, 28, 28] => {
            Ok(Box::new(cnn_fmnist::CnnFmnist {
                classes,
                hidden: Some(512),
            }))
        }
        (Inputs::Dense { shape, .. }, "cnn_hics") if shape[..] == [1, 28, 28] => {
            Ok(Box::new(cnn_fmnist::CnnFmnist {
                classes,
                hidden: None,
            }))
        }
        (Inputs::Dense { shape, .. }, "cnn_hics_code") if shape[..] == [1, 28, 28] => {
            Ok(Box::new(cnn_hics_code::CnnHicsCode { classes }))
        }
        (_, "cnn_fmnist" | "cnn_hics" | "cnn_hics_code") => Err(mismatch("1×28×28 images")),
        (Inputs::Dense { shape, .. }, "cnn_cifar") if shape[..] == [3, 32, 32] => {
            Ok(Box::new(cnn_cifar::CnnCifar { classes }))
        }
        (_, "cnn_cifar") => Err(mismatch("3×32×32 images")),
        (Inputs::Tokens { .. }, "char_lstm") => Ok(Box::new(lstm::CharLstm {
            vocab: classes,
            embed: 8,
            hidden: 256,
        })),
        (_, "char_lstm") => Err(mismatch("token sequences")),
        (Inputs::Tokens { .. }, _) => Err(mismatch("real-valued inputs")),
        (_, other) => Err(ConfigError::invalid(
            "model.kind",
            format!("unknown model `{other}`"),
        )),
    }
}

/// Gathers examples `idx` of `data` into a batch on `device`.
pub fn batch(data: &Dataset, idx: &[usize], device: &Device) -> (Batch, Tensor<1, Int>) {
    let b = idx.len();
    let y = labels(data, idx, device);
    let x = match &data.inputs {
        Inputs::Dense { values, .. } => {
            let row = data.inputs.row_len();
            let mut buf = Vec::with_capacity(b * row);
            for &i in idx {
                buf.extend_from_slice(&values[i * row..(i + 1) * row]);
            }
            Batch::Dense(Tensor::<2>::from_data(
                TensorData::new(buf, [b, row]),
                device,
            ))
        }
        Inputs::Tokens { len, values } => {
            let mut buf = Vec::with_capacity(b * len);
            for &i in idx {
                buf.extend(values[i * len..(i + 1) * len].iter().map(|&t| t as i32));
            }
            Batch::Tokens(Tensor::<2, Int>::from_data(
                TensorData::new(buf, [b, *len]),
                device,
            ))
        }
    };
    (x, y)
}

/// The labels of examples `idx` of `data` on `device`, as [`batch`] gives them.
pub fn labels(data: &Dataset, idx: &[usize], device: &Device) -> Tensor<1, Int> {
    let labels: Vec<i32> = idx.iter().map(|&i| data.labels[i] as i32).collect();
    Tensor::<1, Int>::from_data(TensorData::new(labels, [idx.len()]), device)
}

/// Mean cross-entropy of `logits` against `labels`.
pub fn cross_entropy(logits: Tensor<2>, labels: Tensor<1, Int>) -> Tensor<1> {
    let b = labels.dims()[0];
    let logp = log_softmax(logits, 1);
    logp.gather(1, labels.reshape([b, 1])).mean().neg()
}

/// Sum of cross-entropy and number of correct predictions.
pub fn loss_and_correct(logits: Tensor<2>, labels: Tensor<1, Int>) -> (f64, usize) {
    let b = labels.dims()[0];
    let pred = logits.clone().argmax(1).reshape([b]);
    let correct = pred.equal(labels.clone()).int().sum().into_scalar::<i64>() as usize;
    let loss = cross_entropy(logits, labels).into_scalar::<f32>() as f64 * b as f64;
    (loss, correct)
}

/// Examples `idx` of a dense dataset, one row after another, and their labels.
pub(crate) fn dense_rows(data: &Dataset, idx: &[usize]) -> (Vec<f32>, Vec<u32>) {
    let mut x = Vec::with_capacity(idx.len() * data.inputs.row_len());
    let mut labels = Vec::with_capacity(idx.len());
    dense_rows_into(data, idx, &mut x, &mut labels);
    (x, labels)
}

/// [`dense_rows`] into `x` and `labels`, whatever they held: for a thread's buffers
/// kept from step to step.
pub(crate) fn dense_rows_into(
    data: &Dataset,
    idx: &[usize],
    x: &mut Vec<f32>,
    labels: &mut Vec<u32>,
) {
    let Inputs::Dense { values, .. } = &data.inputs else {
        unreachable!("model::build gives dense models dense inputs only")
    };
    let row = data.inputs.row_len();
    x.clear();
    for &i in idx {
        x.extend_from_slice(&values[i * row..(i + 1) * row]);
    }
    labels.clear();
    labels.extend(idx.iter().map(|&i| data.labels[i]));
}

/// Makes `v` `n` long, keeping what it holds (only new entries are set): for buffers
/// that are then written in full, where zeroing them first would be wasted work.
pub(crate) fn fit<T: Copy + Default>(v: &mut Vec<T>, n: usize) {
    v.resize(n, T::default());
}

/// Sum of cross-entropy and number of correct predictions, as [`loss_and_correct`],
/// for row-major logits (one row per label). The prediction is the first largest
/// logit, as burn's `argmax`.
pub fn loss_and_correct_of(logits: &[f32], labels: &[i64]) -> (f64, usize) {
    let mut loss = 0.0;
    let mut correct = 0;
    if labels.is_empty() {
        return (loss, correct);
    }
    let classes = logits.len() / labels.len();
    for (row, &y) in logits.chunks_exact(classes).zip(labels) {
        let y = usize::try_from(y).expect("labels are class indices");
        correct += usize::from(argmax(row) == y);
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = row.iter().map(|z| (z - max).exp()).sum();
        loss += f64::from(max + sum.ln() - row[y]);
    }
    (loss, correct)
}

/// The index of the first largest entry of `row`, or of its first NaN, as burn's
/// `argmax` picks the prediction.
pub(crate) fn argmax(row: &[f32]) -> usize {
    let (mut best, mut arg) = (row[0], 0);
    for (j, &z) in row.iter().enumerate().skip(1) {
        if !best.is_nan() && (z.is_nan() || z > best) {
            best = z;
            arg = j;
        }
    }
    arg
}

pub(crate) fn dense(x: Batch) -> Tensor<2> {
    match x {
        Batch::Dense(t) => t,
        Batch::Tokens(_) => unreachable!("model::build rejects token inputs for dense models"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_round_trip_and_output_layer_ranges() {
        let arch = mlp::Mlp {
            inputs: 784,
            classes: 10,
            dropout: 0.5,
        };
        let layout = ParamLayout::of(&arch);
        assert_eq!(layout.total, 784 * 64 + 64 + 64 * 30 + 30 + 30 * 10 + 10);
        assert_eq!(layout.output_bias(), layout.total - 10..layout.total);
        assert_eq!(layout.output_weight().len(), 300);
        let flat = layout.init(3);
        assert_eq!(flat, layout.init(3));
        let b = 1.0 / 784f32.sqrt();
        assert!(flat[..784 * 64].iter().all(|x| x.abs() <= b));
        let device = Device::flex();
        let back = layout.to_flat(layout.to_tensors(&flat, &device));
        assert_eq!(back, flat);
    }

    /// `model.init = "xavier_relu"`: every weight within its hand-computed Xavier bound at
    /// gain √2, b = √2·√(6 / (fan_in + fan_out)), and reaching near it; the biases the same
    /// bits as under the default; every weight the default's draw rescaled (the stream's
    /// draws in the same order); the same vector for the same seed. The default's first
    /// values are pinned, so that the option leaves it unchanged bit for bit.
    #[test]
    fn xavier_relu_draws_the_weights_within_the_xavier_bound() {
        let arch = mlp::Mlp {
            inputs: 784,
            classes: 10,
            dropout: 0.0,
        };
        let default = ParamLayout::of(&arch).with_init(ModelInit::Default);
        let xavier = ParamLayout::of(&arch).with_init(ModelInit::XavierRelu);
        let (d, x) = (default.init(3), xavier.init(3));
        assert_eq!(x, xavier.init(3));
        assert_eq!(d, ParamLayout::of(&arch).init(3));
        assert_eq!(
            d[..3].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            PINNED_DEFAULT,
            "{:?}",
            &d[..3]
        );
        // √2·√(6/(784+64)) = √(12/848), √(12/94), √(12/40); biases 1/√fan_in.
        let weights = [(0, 0.118_958_3_f32), (2, 0.357_295_6), (4, 0.547_722_6)];
        let biases = [(1, 1.0 / 28.0_f32), (3, 0.125), (5, 1.0 / 30f32.sqrt())];
        for (i, b) in weights {
            let r = xavier.range(i);
            let max = x[r.clone()].iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(
                max <= b * (1.0 + 1e-6) && max > 0.95 * b,
                "{i}: {max} vs {b}"
            );
            let bd = match default.specs[i].init {
                Init::Uniform(bd) => bd,
                other => panic!("{other:?}"),
            };
            for (xv, dv) in x[r.clone()].iter().zip(&d[r]) {
                assert!((xv / b - dv / bd).abs() < 1e-5, "{xv} {dv}");
            }
        }
        for (i, b) in biases {
            let r = xavier.range(i);
            assert_eq!(x[r.clone()], d[r.clone()]);
            assert!(x[r].iter().all(|v| v.abs() <= b * (1.0 + 1e-6)));
        }
        // Logistic regression 65 → 10: √2·√(6/75) = 0.4; the bias keeps 1/√65.
        let logreg = ParamLayout::of(&logreg::LogReg {
            inputs: 65,
            classes: 10,
        })
        .with_init(ModelInit::XavierRelu);
        assert!(matches!(logreg.specs[0].init, Init::Uniform(b) if (b - 0.4).abs() < 1e-6));
        assert_eq!(logreg.specs[1].init, Init::Uniform(1.0 / 65f32.sqrt()));
    }

    /// The first three values of the MLP's default draw for seed 3 (−0.00794661,
    /// −0.028150398, −0.0048754215): what every existing MLP result started from.
    const PINNED_DEFAULT: [u32; 3] = [3_154_260_608, 3_169_229_738, 3_147_809_280];

    /// HiCS-FL's CNN puts the output layer right after the convolutions: the output
    /// weight is 3136 × classes, and a forward pass gives one row of logits per image.
    #[test]
    fn the_hics_cnn_has_one_dense_layer() {
        let arch = cnn_fmnist::CnnFmnist {
            classes: 10,
            hidden: None,
        };
        let layout = ParamLayout::of(&arch);
        let conv = 32 * 25 + 32 + 64 * 32 * 25 + 64;
        assert_eq!(layout.total, conv + 3136 * 10 + 10);
        assert_eq!(layout.output_weight().len(), 3136 * 10);
        let device = Device::flex();
        let p = layout.to_tensors(&layout.init(1), &device);
        let x = Tensor::<2>::zeros([3, 784], &device);
        assert_eq!(arch.forward(&p, Batch::Dense(x), None).dims(), [3, 10]);
    }

    /// The bulk mask is the mask of one `random::<f64>()` per unit, and leaves the
    /// stream where those draws do, from even and odd word positions and across the
    /// generator's block boundaries.
    #[test]
    fn the_bulk_mask_draws_as_one_draw_per_unit() {
        let cases = [
            (0, 1, 0.3),
            (1, 7, 0.5),
            (0, 64 * 94, 0.5),
            (3, 64 * 94, 0.3),
            (1, 33, 0.0),
            (2, 33, 1.0),
            (0, 200, 1e-300),
        ];
        for (skip, len, p) in cases {
            let mut rng = stream(4, Purpose::Training, 1, 2);
            for _ in 0..skip {
                rng.random::<u32>();
            }
            let mut one_by_one = rng.clone();
            let got = Dropout { p, rng: &mut rng }.mask(len);
            let want: Vec<f32> = (0..len)
                .map(|_| {
                    if one_by_one.random::<f64>() < p {
                        0.0
                    } else {
                        1.0 / (1.0 - p) as f32
                    }
                })
                .collect();
            assert_eq!(got, want, "skip {skip}, len {len}, p {p}");
            assert_eq!(rng, one_by_one, "skip {skip}, len {len}, p {p}");
            assert_eq!(rng.random::<u64>(), one_by_one.random::<u64>());
        }
    }

    #[test]
    fn cross_entropy_matches_hand_computation() {
        let device = Device::flex();
        let logits = Tensor::<2>::from_data(
            TensorData::new(vec![2.0f32, 0.0, 1.0, 3.0], [2, 2]),
            &device,
        );
        let y = Tensor::<1, Int>::from_data(TensorData::new(vec![0i32, 0], [2]), &device);
        // Row 1: −ln(e²/(e² + 1)); row 2: −ln(e/(e + e³)).
        let expected = ((1.0 + (-2f64).exp()).ln() + (1.0 + 2f64.exp()).ln()) / 2.0;
        let got = cross_entropy(logits.clone(), y.clone()).into_scalar::<f32>() as f64;
        assert!((got - expected).abs() < 1e-5, "{got} vs {expected}");
        let (sum, correct) = loss_and_correct(logits, y);
        assert!((sum - 2.0 * expected).abs() < 1e-5);
        assert_eq!(correct, 1);
    }
}
