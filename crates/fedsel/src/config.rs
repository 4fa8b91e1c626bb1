//! The run configuration: a TOML schema with a default for every key.
//!
//! A file only needs the keys it changes. Unknown keys are errors that name
//! the key, and [`Config::validate`] rejects out-of-range values by key.
//! [`Config::to_resolved_toml`] writes every default out, with the version,
//! so that any result can be traced back to the exact choices behind it.
//!
//! The options of each selection strategy (the sections of [`SelectionConfig`]) are
//! defined in the strategy's module under [`select`](crate::select), and those of each
//! availability model (what an [`AvailabilityConfig`] kind carries) in the model's module
//! under [`availability`](crate::availability), each with its defaults and its part of
//! validation: an option is read, documented and checked in one place, beside the code
//! that uses it. This module ties them into the schema, and loads, overrides, validates
//! and hashes the whole; it re-exports those option types so that the schema can be
//! named from here.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

pub use crate::aggregate::{AggregationRule, ServerConfig, ServerOptimizer};
pub use crate::availability::AvailabilityConfig;
pub use crate::availability::budget::BudgetConfig;
pub use crate::availability::f3ast::{HomeDeviceConfig, ScarceConfig, SmartphonesConfig};
pub use crate::availability::fedgs::{
    LdfConfig, LnConfig, MdfConfig, SlnConfig, SlnPhase, YcConfig, YmfConfig,
};
pub use crate::availability::trace::TraceConfig;
pub use crate::select::afl::AflConfig;
pub use crate::select::divfl::DivflConfig;
pub use crate::select::f3ast::F3astConfig;
pub use crate::select::fedcor::FedCorConfig;
pub use crate::select::fedgs::FedGsConfig;
pub use crate::select::hics::HicsConfig;
pub use crate::select::md::{MdConfig, MdPool};
pub use crate::select::oort::OortConfig;
pub use crate::select::powd::PowdConfig;
pub use crate::select::{ClientSize, SelectionConfig};
pub use crate::system::{RoundPolicy, SystemConfig, SystemKind};
use crate::validate::{check, check_pos, check_prob};

/// A whole run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Free-form name, used for the default output directory.
    pub name: String,
    /// Master seed of every random stream.
    pub seed: u64,
    /// Seed of the data itself: a generated dataset, the partition and each client's
    /// held-out split. Unset, it is `seed`, so each run seed draws its own data; pinned,
    /// the seeds of a sweep vary only training, as in papers that ran every seed on one
    /// task (FedGS's Synthetic). The resolved config records the value used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_seed: Option<u64>,
    /// Number of communication rounds.
    pub rounds: usize,
    /// Test accuracies (0..1) whose first-reaching round is reported.
    pub targets: Vec<f64>,
    /// Where dataset files live; `FEDSEL_DATA` or a per-user default otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Compute device: `flex` (CPU) or `cuda` (needs the `cuda` feature).
    pub device: String,
    /// Check dataset files against their published checksums.
    pub verify_checksums: bool,
    /// Write a resumable checkpoint every this many rounds (0 = never).
    pub checkpoint_every: usize,
    /// Version of fedsel that resolved this config; informational.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fedsel_version: Option<String>,
    /// The dataset.
    pub dataset: DatasetConfig,
    /// How the training data is split over clients.
    pub partition: PartitionConfig,
    /// The model.
    pub model: ModelConfig,
    /// Local training on the clients.
    pub train: TrainConfig,
    /// Aggregation and server optimizer.
    pub server: ServerConfig,
    /// Client selection.
    pub selection: SelectionConfig,
    /// Client availability.
    pub availability: AvailabilityConfig,
    /// Communication budget K_t.
    pub budget: BudgetConfig,
    /// Evaluation of the global model.
    pub eval: EvalConfig,
    /// Device profiles and the virtual clock. Absent, there is no clock, and neither the
    /// resolved config nor its hash mentions it, so older configs keep their hash.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<SystemConfig>,
    /// Where the run's results go besides its directory (experiment trackers). Absent, the
    /// resolved config does not mention it; it never enters the config's hash, since it
    /// changes nothing a run computes.
    #[serde(skip_serializing_if = "OutputConfig::is_empty")]
    pub output: OutputConfig,
}

/// Outputs besides the run directory's own files.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutputConfig {
    /// A directory for TensorBoard event files (`fedsel run --tensorboard DIR`); a sweep
    /// gives each cell the subdirectory named as the cell's run directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensorboard: Option<PathBuf>,
}

impl OutputConfig {
    /// Whether no output is asked for (the section is then left out of the resolved config).
    pub fn is_empty(&self) -> bool {
        self.tensorboard.is_none()
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            name: "default".into(),
            seed: 1,
            data_seed: None,
            rounds: 200,
            targets: vec![0.5, 0.6, 0.7],
            data_dir: None,
            device: "flex".into(),
            verify_checksums: true,
            checkpoint_every: 25,
            fedsel_version: None,
            dataset: DatasetConfig::default(),
            partition: PartitionConfig::default(),
            model: ModelConfig::default(),
            train: TrainConfig::default(),
            server: ServerConfig::default(),
            selection: SelectionConfig::default(),
            availability: AvailabilityConfig::default(),
            budget: BudgetConfig::default(),
            eval: EvalConfig::default(),
            system: None,
            output: OutputConfig::default(),
        }
    }
}

/// Which dataset to load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DatasetConfig {
    /// FedProx's Synthetic(α, β) generator (built in, no files).
    Synthetic {
        /// Std of the per-user model mean u_k (heterogeneity of the models).
        #[serde(default = "half")]
        alpha: f64,
        /// Std of the per-user feature mean B_k (heterogeneity of the inputs).
        #[serde(default = "half")]
        beta: f64,
        /// Number of users (each becomes one client under the natural partition).
        #[serde(default = "thirty")]
        users: usize,
        /// Input dimension.
        #[serde(default = "sixty")]
        dim: usize,
        /// Number of classes.
        #[serde(default = "ten")]
        classes: usize,
        /// Fraction of each user's samples kept for the global test set.
        #[serde(default = "tenth")]
        test_fraction: f64,
        /// Which program's draws make the data (see [`SyntheticGenerator`]).
        #[serde(default)]
        generator: SyntheticGenerator,
    },
    /// Fashion-MNIST from the four IDX files.
    Fmnist {
        /// How pixels in [0, 1] are normalised: `mnist` (0.1307, 0.3081), as the FedCor code,
        /// or `half` (0.5, 0.5), as the HiCS-FL code. Written out only when not the default,
        /// so that configs from before the key keep their hash.
        #[serde(default, skip_serializing_if = "FmnistNormalize::is_default")]
        normalize: FmnistNormalize,
    },
    /// CIFAR-10 binary version.
    Cifar10,
    /// CIFAR-100 binary version (fine labels).
    Cifar100,
    /// Shakespeare, LEAF preprocessing of the Gutenberg text.
    Shakespeare {
        /// Fraction of each role's windows used for training (LEAF `--tf`).
        #[serde(default = "eight_tenths")]
        train_fraction: f64,
        /// Roles with fewer windows are dropped (LEAF `-k`).
        #[serde(default)]
        min_samples: usize,
        /// Keep at most this many roles (0 = all), taken in a seeded order.
        #[serde(default)]
        max_clients: usize,
        /// Keep at most this many windows per role (0 = all), for CPU-sized runs.
        #[serde(default)]
        max_samples_per_client: usize,
    },
    /// A LEAF data directory (`train/*.json`, `test/*.json`): one client per user
    /// (`data::leaf`).
    Leaf {
        /// The directory holding `train/` and `test/` (relative to the config file).
        path: PathBuf,
        /// Where each client's held-out part comes from; always written out, so a run
        /// resolved before the key existed (a split) does not resume as `leaf_test`.
        #[serde(default)]
        holdout: LeafHoldout,
        /// Reshapes each feature vector (FEMNIST: `[1, 28, 28]` for the CNNs).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        shape: Option<Vec<usize>>,
        /// Number of classes (default: one more than the largest label).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        classes: Option<usize>,
    },
    /// An FLGo or easyFL task directory, read from its `data.json` (`data::flgo`).
    Flgo {
        /// The task directory (relative to the config file).
        path: PathBuf,
        /// The dataset an index task's indices point into (fmnist, cifar10, cifar100),
        /// loaded from the data directory as for `kind` = that dataset.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source: Option<FlgoSource>,
        /// Reshapes each feature vector of a task that stores its examples.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        shape: Option<Vec<usize>>,
        /// Number of classes of a task that stores its examples (default: one more than
        /// the largest label).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        classes: Option<usize>,
    },
}

/// Where a LEAF client's held-out part (its loss reports, Pow-d's and FedCor's inputs)
/// comes from (`dataset.holdout`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeafHoldout {
    /// The user's own LEAF test examples, so clients train on all of LEAF's training
    /// examples, as LEAF's baselines do. They are appended to the training pool after the
    /// training examples (the held-out indices point there) and stay in the server's test
    /// set too; a user with no test examples has an empty held-out part. Needs the natural
    /// partition.
    #[default]
    LeafTest,
    /// A seeded split of each user's training examples by `partition.holdout_fraction`,
    /// as for any dataset (fedsel's only behaviour before `dataset.holdout` existed): the
    /// held-out share of LEAF's training examples is never trained on.
    Split,
}

/// The datasets an FLGo index task can point into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FlgoSource {
    /// Fashion-MNIST (torchvision's order is the IDX files' order).
    Fmnist,
    /// CIFAR-10 (torchvision's order is the binary batches' order).
    Cifar10,
    /// CIFAR-100, fine labels.
    Cifar100,
}

/// The program a Synthetic(α, β) dataset reproduces.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyntheticGenerator {
    /// FedProx's generator on fedsel's own seeded streams: sizes ⌊LogNormal(4, 2)⌋ + 50,
    /// each user's examples shuffled and `test_fraction` of them pooled for the test set
    /// (`data::synthetic::generate`).
    #[default]
    Fedsel,
    /// The FedGS authors' program (easyFL `benchmark/synthetic_regression/core.py`,
    /// `dist_id` 10) on numpy's legacy stream seeded `97 + data_seed`: with `data_seed = 0`
    /// it is their task `synthetic_regression_cnum30_dist10_skew0.5_seed0`, every example
    /// bit for bit; each user's examples split by position 75 % train, 15 % held out, 10 %
    /// pooled test (`data::synthetic::generate_easyfl`).
    Easyfl,
}

fn half() -> f64 {
    0.5
}
fn tenth() -> f64 {
    0.1
}
fn eight_tenths() -> f64 {
    0.8
}
fn thirty() -> usize {
    30
}
fn sixty() -> usize {
    60
}
fn ten() -> usize {
    10
}

impl Default for DatasetConfig {
    fn default() -> Self {
        Self::Synthetic {
            alpha: 0.5,
            beta: 0.5,
            users: 30,
            dim: 60,
            classes: 10,
            test_fraction: 0.1,
            generator: SyntheticGenerator::Fedsel,
        }
    }
}

impl DatasetConfig {
    /// Short name as used in `kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Synthetic { .. } => "synthetic",
            Self::Fmnist { .. } => "fmnist",
            Self::Cifar10 => "cifar10",
            Self::Cifar100 => "cifar100",
            Self::Shakespeare { .. } => "shakespeare",
            Self::Leaf { .. } => "leaf",
            Self::Flgo { .. } => "flgo",
        }
    }
}

/// How training examples are assigned to clients.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PartitionConfig {
    /// The rule.
    pub scheme: PartitionScheme,
    /// Number of clients (ignored by `natural`, which takes the dataset's users).
    pub clients: usize,
    /// Fraction of each client's examples held out for its loss reports.
    pub holdout_fraction: f64,
}

impl Default for PartitionConfig {
    fn default() -> Self {
        Self {
            scheme: PartitionScheme::Natural,
            clients: 30,
            holdout_fraction: 0.2,
        }
    }
}

/// The partition rules of the papers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum PartitionScheme {
    /// Uniformly at random, equal sizes.
    Iid,
    /// Sort by label, cut into `shards_per_client · N` shards, deal them out (1SPC/2SPC).
    Shards {
        /// Shards per client.
        shards_per_client: usize,
    },
    /// Per-client label mix q_k ~ Dir(α·prior), sizes from a min-norm QP (FedCor App. C.2).
    DirichletQp {
        /// Concentration α.
        alpha: f64,
    },
    /// Per-class Dirichlet over clients (Hsu et al.); several α give client groups (HiCS App. 6.10).
    ClassDirichlet {
        /// One α per client group; clients are split evenly over the groups.
        alphas: Vec<f64>,
        /// Where a class slice goes when the draw gives mass only to clients already full.
        /// Written out only when not the default, so that configs from before the key keep
        /// their hash.
        #[serde(default, skip_serializing_if = "AllFull::is_default")]
        all_full: AllFull,
    },
    /// Each client holds k labels, chosen to balance label use (FedGS FMNIST).
    Labels {
        /// Labels per client.
        labels_per_client: usize,
    },
    /// Log-normal client sizes with Dirichlet label mixes (FedGS CIFAR).
    LognormalDirichlet {
        /// σ of the log-normal sizes.
        sigma: f64,
        /// Dirichlet concentration of each client's label mix.
        alpha: f64,
    },
    /// The dataset's own users (Synthetic users, Shakespeare roles).
    Natural,
}

/// Model architecture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// `logreg`, `mlp`, `cnn_fmnist`, `cnn_hics` (HiCS-FL paper), `cnn_hics_code` (HiCS-FL code,
    /// with BatchNorm), `cnn_cifar` or `char_lstm`.
    pub kind: String,
    /// Dropout probability where the architecture has dropout (MLP).
    pub dropout: f64,
    /// Start the output layer's bias at zero instead of the uniform draw (the FedGS
    /// authors' logistic regression does, `self.layer.bias.data.zero_()`).
    pub zero_bias: bool,
    /// How the layers' weights are drawn: `default` (PyTorch's per-layer defaults) or
    /// `xavier_relu` (the HiCS-FL authors' scripts; `mlp` and `logreg` only). Written out
    /// only when not the default, so that configs from before the key keep their hash.
    #[serde(skip_serializing_if = "ModelInit::is_default")]
    pub init: ModelInit,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            kind: "logreg".into(),
            dropout: 0.0,
            zero_bias: false,
            init: ModelInit::Default,
        }
    }
}

/// Where `class_dirichlet` puts a class slice when every client its Dir(α) draw gives
/// mass to already holds its fair share (`partition.scheme.all_full`). With α = 0.001 the
/// draw is one-hot to double precision, so this happens whenever the class's one client
/// is already full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AllFull {
    /// Split evenly over all the group's clients (fedsel's own choice): the draw is kept,
    /// and every client of the group gets a tenth of the slice's class.
    #[default]
    Spread,
    /// All to the group's last client, as in the HiCS-FL code: its masked proportions sum
    /// to 0, NumPy's 0/0 gives NaN split points, cast to the smallest integer, so
    /// `np.split` leaves every piece but the last empty (`sampling.py`,
    /// `partition_data_various_alpha`, at 25f309d). Another client is then usually left
    /// below the minimum size and the group is drawn again.
    LastClient,
}

impl AllFull {
    /// Whether this is the default, so that configs without the key keep their hash.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// How Fashion-MNIST's pixels, scaled to [0, 1], are normalised (`dataset.normalize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FmnistNormalize {
    /// (x − 0.1307) / 0.3081, MNIST's mean and std, as the FedCor code normalises
    /// Fashion-MNIST (`transforms.Normalize((0.1307,), (0.3081,))`).
    #[default]
    Mnist,
    /// (x − 0.5) / 0.5, onto [−1, 1], as the HiCS-FL code does for every method
    /// (`transforms.Normalize((0.5), (0.5))`, `sampling.py` at 25f309d).
    Half,
}

impl FmnistNormalize {
    /// Whether this is the default, so that configs without the key keep their hash.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// How a model's weights are initialised (`model.init`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelInit {
    /// PyTorch's defaults, layer by layer: a linear layer's weight and bias
    /// U(−1/√fan_in, 1/√fan_in) (`nn.Linear.reset_parameters`).
    #[default]
    Default,
    /// Every linear layer's weight Xavier-uniform at ReLU's gain √2,
    /// U(−b, b) with b = √2·√(6 / (fan_in + fan_out)); biases keep PyTorch's default.
    /// The HiCS-FL authors' servers redraw every `nn.Linear` and `nn.Conv2d` weight so
    /// (`nn.init.xavier_uniform_(m.weight, gain=nn.init.calculate_gain('relu'))`,
    /// `server/server_base.py`, `server_poc.py`, `server_hics.py` at 25f309d), whatever the
    /// selector, which sets the training their Table 1 reports. `cnn_hics_code` draws its
    /// weights so always.
    XavierRelu,
}

impl ModelInit {
    /// Whether this is the default, so that configs without the key keep their hash.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// The model kinds `model.init = "xavier_relu"` applies to: every 2-D parameter of theirs is
/// a linear layer's weight `[fan_in, fan_out]` ([`crate::model::ParamLayout::with_init`]).
const XAVIER_MODELS: &[&str] = &["logreg", "mlp"];

/// Local optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LocalOptimizer {
    /// SGD with optional momentum and weight decay.
    Sgd,
    /// Adam.
    Adam,
}

/// Per-round learning-rate schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LrSchedule {
    /// The same rate every round.
    Constant,
    /// Multiply by `gamma` at the start of each listed round.
    Step {
        /// Rounds at which the rate is multiplied.
        milestones: Vec<usize>,
        /// Factor.
        gamma: f64,
    },
    /// Multiply by `gamma` every round.
    Exponential {
        /// Factor per round.
        gamma: f64,
    },
}

impl LrSchedule {
    /// Learning rate in round `t` (0-based) for a base rate `lr`.
    pub fn rate(&self, lr: f64, t: usize) -> f64 {
        match self {
            Self::Constant => lr,
            Self::Step { milestones, gamma } => {
                let passed = milestones.iter().filter(|&&m| m <= t).count();
                lr * gamma.powi(passed as i32)
            }
            Self::Exponential { gamma } => lr * gamma.powi(t as i32),
        }
    }
}

/// How long a client trains in one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum LocalWork {
    /// A fixed number of mini-batch steps.
    Steps(usize),
    /// Full passes over the local training part.
    Epochs(usize),
}

impl LocalWork {
    /// Samples a client of `n` training samples processes in one local training with
    /// batches of `batch`, as the virtual clock charges them: every step a whole batch
    /// (an epoch's last, partial batch counts as one).
    pub fn samples(self, n: usize, batch: usize) -> u64 {
        let steps = match self {
            LocalWork::Steps(s) => s,
            LocalWork::Epochs(e) => e * n.div_ceil(batch.max(1)),
        };
        steps as u64 * batch as u64
    }
}

/// Local training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Optimizer.
    pub optimizer: LocalOptimizer,
    /// Base learning rate.
    pub lr: f64,
    /// SGD momentum.
    pub momentum: f64,
    /// L2 weight decay added to the gradient.
    pub weight_decay: f64,
    /// Adam β1.
    pub beta1: f64,
    /// Adam β2.
    pub beta2: f64,
    /// Adam ε.
    pub eps: f64,
    /// Steps or epochs per round.
    pub work: LocalWork,
    /// Mini-batch size.
    pub batch_size: usize,
    /// FedProx proximal coefficient μ (0 = FedAvg).
    pub prox_mu: f64,
    /// Learning-rate schedule over rounds.
    pub schedule: LrSchedule,
    /// Keep each client's optimizer state (momentum, Adam moments) between its rounds.
    pub persistent_state: bool,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            optimizer: LocalOptimizer::Sgd,
            lr: 0.01,
            momentum: 0.0,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            work: LocalWork::Epochs(1),
            batch_size: 10,
            prox_mu: 0.0,
            schedule: LrSchedule::Constant,
            persistent_state: false,
        }
    }
}

/// Evaluation of the global model on the global test set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// Evaluate every this many rounds (the last round always is).
    pub every: usize,
    /// Batch size of evaluation passes.
    pub batch_size: usize,
    /// Evaluate on at most this many test examples (0 = all), a fixed seeded subset.
    pub max_test_samples: usize,
    /// At each evaluation, also evaluate on every client's held-out data (the per-client
    /// accuracy columns of `metrics.csv`): one more pass over about a fifth of the training
    /// set, which a long run evaluating every round may not want. Written out only when
    /// off, so that configs from before the key keep their hash (sweep cells, checkpoints).
    #[serde(skip_serializing_if = "is_true")]
    pub per_client: bool,
    /// Measure the per-client accuracies on every this many rounds (those among the
    /// evaluation rounds), and at the last round always; 1 = at every evaluation. A
    /// fairness statistic moves slowly, and measuring it every round cost a scale run up to
    /// 47 times the round's time. Written out only when it is not the default, as
    /// `per_client`.
    #[serde(skip_serializing_if = "is_default_per_client_every")]
    pub per_client_every: usize,
    /// Measure them on at most this many clients: when the partition has more, a fixed
    /// sample drawn from the data seed, the same clients for every strategy of that seed;
    /// 0 = every client. Written out only when it is not the default.
    #[serde(skip_serializing_if = "is_default_per_client_clients")]
    pub per_client_clients: usize,
}

fn is_true(b: &bool) -> bool {
    *b
}

/// `eval.per_client_every`'s default.
const PER_CLIENT_EVERY: usize = 10;
/// `eval.per_client_clients`'s default.
const PER_CLIENT_CLIENTS: usize = 1000;

fn is_default_per_client_every(n: &usize) -> bool {
    *n == PER_CLIENT_EVERY
}

fn is_default_per_client_clients(n: &usize) -> bool {
    *n == PER_CLIENT_CLIENTS
}

impl EvalConfig {
    /// Whether round `t` of `rounds`, if evaluated, also measures the per-client
    /// accuracies.
    pub fn per_client_at(&self, t: usize, rounds: usize) -> bool {
        self.per_client && ((t + 1).is_multiple_of(self.per_client_every) || t + 1 == rounds)
    }
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self {
            every: 1,
            batch_size: 1000,
            max_test_samples: 0,
            per_client: true,
            per_client_every: PER_CLIENT_EVERY,
            per_client_clients: PER_CLIENT_CLIENTS,
        }
    }
}

const MODELS: &[&str] = &[
    "logreg",
    "mlp",
    "cnn_fmnist",
    "cnn_hics",
    "cnn_hics_code",
    "cnn_cifar",
    "char_lstm",
];

/// Floats the Synthetic generator may produce (4 GB): far above every paper's size
/// (1000 users of dimension 60), far below what would exhaust a workstation.
const SYNTHETIC_MAX_FLOATS: usize = 1_000_000_000;

impl Config {
    fn validate_availability(&self) -> Result<(), ConfigError> {
        use AvailabilityConfig as A;
        match &self.availability {
            A::Always | A::Uneven => {}
            A::Mdf(c) => c.validate()?,
            A::Ldf(c) => c.validate()?,
            A::Ymf(c) => c.validate()?,
            A::Yc(c) => c.validate()?,
            A::Ln(c) => c.validate()?,
            A::Sln(c) => c.validate()?,
            A::Scarce(c) => c.validate()?,
            A::HomeDevice(c) => c.validate()?,
            A::Smartphones(c) => c.validate()?,
            A::Trace(c) => c.validate()?,
        }
        match &self.budget {
            BudgetConfig::Constant => {}
            BudgetConfig::Periodic { values, hold } => {
                check(
                    !values.is_empty(),
                    "budget.values",
                    "needs at least one value",
                )?;
                check(*hold > 0, "budget.hold", "must be at least 1")?;
            }
            BudgetConfig::Random { min, max } => check(
                min <= max,
                "budget.max",
                format!("{max} is below budget.min = {min}"),
            )?,
        }
        Ok(())
    }

    /// Parses a TOML text, applies `key=value` overrides, and validates.
    ///
    /// `source_name` names the text in error messages (usually the file path).
    pub fn from_toml_str(
        text: &str,
        source_name: &str,
        overrides: &[String],
    ) -> Result<Self, ConfigError> {
        let table = parse_toml(text, source_name)?;
        Self::from_table(table, source_name, overrides)
    }

    /// [`from_toml_str`](Self::from_toml_str) of an already parsed table.
    pub fn from_table(
        mut table: toml::Table,
        source_name: &str,
        overrides: &[String],
    ) -> Result<Self, ConfigError> {
        for o in overrides {
            apply_override(&mut table, o)?;
        }
        let mut config =
            Self::read_keys(table, source_name).map_err(|e| blame_override(e, overrides))?;
        config.validate()?;
        config.resolve();
        Ok(config)
    }

    /// Reads a table without validating its values: every key must be one the config has,
    /// and a wrong key or type is an error naming `source_name`. A sweep checks its base
    /// file this way, so that a mistake there names the base file, not the sweep.
    pub fn read_keys(mut table: toml::Table, source_name: &str) -> Result<Self, ConfigError> {
        let defaults = toml::Table::try_from(Config::default()).expect("the default serializes");
        inherit_kinds(&mut table, &defaults);
        let given = table.clone();
        let de = toml::Value::Table(table);
        let config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            ConfigError::Parse {
                source_name: source_name.into(),
                message: format!("key `{path}`: {}", e.into_inner()),
            }
        })?;
        let read = toml::Table::try_from(&config).expect("a Config always serializes");
        reject_ignored_keys(&given, &read, "")?;
        Ok(config)
    }

    /// Replaces every value left to the strategy or protocol (`aggregation = "auto"`,
    /// FedGS's ε and σ) by the value it stands for, so the resolved config records what
    /// ran. Loading a config does this.
    pub fn resolve(&mut self) {
        let (epsilon, sigma2) = self.selection.fedgs.edge_parameters();
        self.selection.fedgs.epsilon = Some(epsilon);
        self.selection.fedgs.sigma2 = Some(sigma2);
        if self.server.aggregation == AggregationRule::Auto {
            self.server.aggregation = crate::select::own_aggregation(&self.selection.strategy);
        }
        if let (
            "fedcs",
            None,
            Some(SystemConfig {
                round: RoundPolicy::Deadline { deadline_s },
                ..
            }),
        ) = (
            self.selection.strategy.as_str(),
            self.selection.fedcs.deadline_s,
            &self.system,
        ) {
            self.selection.fedcs.deadline_s = Some(*deadline_s);
        }
    }

    /// Reads a config file; `None` means the built-in default.
    pub fn load(path: Option<&Path>, overrides: &[String]) -> Result<Self, ConfigError> {
        match path {
            None => Self::from_toml_str("", "built-in default", overrides),
            Some(p) => {
                let name = p.display().to_string();
                let text = std::fs::read_to_string(p).map_err(|e| ConfigError::Parse {
                    source_name: name.clone(),
                    message: e.to_string(),
                })?;
                Self::from_file_text(&text, &name, p.parent().unwrap_or(Path::new("")), overrides)
            }
        }
    }

    /// Parses the text of a config file as [`Config::load`] does: relative paths in it are
    /// relative to `dir`, the file's directory; `overrides` are applied after that.
    pub fn from_file_text(
        text: &str,
        source_name: &str,
        dir: &Path,
        overrides: &[String],
    ) -> Result<Self, ConfigError> {
        let mut table = parse_toml(text, source_name)?;
        anchor_paths(&mut table, dir);
        Self::from_table(table, source_name, overrides)
    }

    /// Rejects values no run can use, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check(self.rounds > 0, "rounds", "must be at least 1")?;
        for (i, &t) in self.targets.iter().enumerate() {
            check_prob(t, &format!("targets[{i}]"), true, false)?;
        }
        check(
            matches!(self.device.as_str(), "flex" | "cuda"),
            "device",
            format!("`{}` is not one of flex, cuda", self.device),
        )?;
        match &self.dataset {
            DatasetConfig::Synthetic {
                alpha,
                beta,
                users,
                dim,
                classes,
                test_fraction,
                generator,
            } => {
                if *generator == SyntheticGenerator::Easyfl {
                    check(
                        *test_fraction == 0.1,
                        "dataset.test_fraction",
                        "the easyfl generator splits each user 75 / 15 / 10 by position, as the authors' program; leave test_fraction at 0.1",
                    )?;
                    check(
                        self.data_seed() < u64::from(u32::MAX) - 97,
                        "data_seed",
                        "the easyfl generator seeds numpy's 32-bit state with 97 + data_seed",
                    )?;
                }
                check(
                    alpha.is_finite() && *alpha >= 0.0,
                    "dataset.alpha",
                    "must be >= 0",
                )?;
                check(
                    beta.is_finite() && *beta >= 0.0,
                    "dataset.beta",
                    "must be >= 0",
                )?;
                check(*users > 0, "dataset.users", "must be at least 1")?;
                check(*dim > 0, "dataset.dim", "must be at least 1")?;
                check(*classes >= 2, "dataset.classes", "must be at least 2")?;
                // A user holds about 450 examples on average (⌊LogNormal(4, 2)⌋ + 50), so
                // users·dim floats times 450 must fit in memory; refuse before generating.
                let floats = users.saturating_mul(*dim).saturating_mul(450);
                check(
                    floats <= SYNTHETIC_MAX_FLOATS,
                    "dataset.users",
                    format!(
                        "{users} users of dimension {dim} need about {} GB; the limit is {} GB",
                        floats / 250_000_000,
                        SYNTHETIC_MAX_FLOATS / 250_000_000
                    ),
                )?;
                check(
                    classes.saturating_mul(*dim) <= 100_000_000,
                    "dataset.classes",
                    "classes × dim must stay below 1e8",
                )?;
                check_prob(*test_fraction, "dataset.test_fraction", true, true)?;
            }
            DatasetConfig::Shakespeare { train_fraction, .. } => {
                check_prob(*train_fraction, "dataset.train_fraction", true, true)?;
            }
            DatasetConfig::Leaf { shape, classes, .. }
            | DatasetConfig::Flgo { shape, classes, .. } => {
                if let Some(shape) = shape {
                    check(
                        !shape.is_empty() && shape.iter().all(|&d| d > 0),
                        "dataset.shape",
                        "must list at least one dimension, each at least 1",
                    )?;
                }
                if let Some(c) = classes {
                    check(*c >= 2, "dataset.classes", "must be at least 2")?;
                }
            }
            _ => {}
        }
        let p = &self.partition;
        if let DatasetConfig::Leaf {
            holdout: LeafHoldout::LeafTest,
            ..
        } = self.dataset
        {
            check(
                p.scheme == PartitionScheme::Natural,
                "dataset.holdout",
                "\"leaf_test\" (the default) holds out each LEAF user's own test data, so the \
                 clients must be LEAF's users (partition.scheme = natural); with another \
                 partition.scheme use dataset.holdout = \"split\"",
            )?;
        }
        check(p.clients > 0, "partition.clients", "must be at least 1")?;
        check_prob(
            p.holdout_fraction,
            "partition.holdout_fraction",
            false,
            true,
        )?;
        match &p.scheme {
            PartitionScheme::Shards { shards_per_client } => check(
                *shards_per_client > 0,
                "partition.scheme.shards_per_client",
                "must be at least 1",
            )?,
            PartitionScheme::DirichletQp { alpha } => check_pos(*alpha, "partition.scheme.alpha")?,
            PartitionScheme::ClassDirichlet { alphas, .. } => {
                check(
                    !alphas.is_empty(),
                    "partition.scheme.alphas",
                    "needs at least one α",
                )?;
                for (i, a) in alphas.iter().enumerate() {
                    check_pos(*a, &format!("partition.scheme.alphas[{i}]"))?;
                }
                check(
                    p.clients.is_multiple_of(alphas.len()),
                    "partition.clients",
                    format!(
                        "{} clients do not split evenly into {} α groups",
                        p.clients,
                        alphas.len()
                    ),
                )?;
            }
            PartitionScheme::Labels { labels_per_client } => check(
                *labels_per_client > 0,
                "partition.scheme.labels_per_client",
                "must be at least 1",
            )?,
            PartitionScheme::LognormalDirichlet { sigma, alpha } => {
                check(
                    sigma.is_finite() && *sigma >= 0.0,
                    "partition.scheme.sigma",
                    "must be >= 0",
                )?;
                check_pos(*alpha, "partition.scheme.alpha")?;
            }
            PartitionScheme::Iid | PartitionScheme::Natural => {}
        }
        check(
            MODELS.contains(&self.model.kind.as_str()),
            "model.kind",
            format!("`{}` is not one of {}", self.model.kind, MODELS.join(", ")),
        )?;
        check_prob(self.model.dropout, "model.dropout", false, true)?;
        check(
            self.model.init.is_default() || XAVIER_MODELS.contains(&self.model.kind.as_str()),
            "model.init",
            format!(
                "`xavier_relu` applies to {} only, not `{}`",
                XAVIER_MODELS.join(" and "),
                self.model.kind
            ),
        )?;
        let t = &self.train;
        check_pos(t.lr, "train.lr")?;
        check_prob(t.momentum, "train.momentum", false, true)?;
        check(
            t.weight_decay.is_finite() && t.weight_decay >= 0.0,
            "train.weight_decay",
            "must be >= 0",
        )?;
        check_prob(t.beta1, "train.beta1", false, true)?;
        check_prob(t.beta2, "train.beta2", false, true)?;
        check_pos(t.eps, "train.eps")?;
        check(t.batch_size > 0, "train.batch_size", "must be at least 1")?;
        check(
            t.prox_mu.is_finite() && t.prox_mu >= 0.0,
            "train.prox_mu",
            "must be >= 0",
        )?;
        match t.work {
            LocalWork::Steps(n) | LocalWork::Epochs(n) => {
                check(n > 0, "train.work", "steps or epochs must be at least 1")?
            }
        }
        match &t.schedule {
            LrSchedule::Constant => {}
            LrSchedule::Step { gamma, .. } | LrSchedule::Exponential { gamma } => {
                check_pos(*gamma, "train.schedule.gamma")?
            }
        }
        let s = &self.server;
        check_pos(s.lr, "server.lr")?;
        check_prob(s.beta1, "server.beta1", false, true)?;
        check_prob(s.beta2, "server.beta2", false, true)?;
        check_pos(s.tau, "server.tau")?;
        let sel = &self.selection;
        check(
            crate::select::registry::get(&sel.strategy).is_some(),
            "selection.strategy",
            crate::select::registry::unknown(&sel.strategy),
        )?;
        check(
            sel.params.is_empty()
                || crate::select::registry::get(&sel.strategy).is_some_and(|s| !s.builtin),
            "selection.params",
            format!(
                "are read only by a registered strategy, and `{}` is built in: its options are in [selection.{}]",
                sel.strategy, sel.strategy
            ),
        )?;
        check_prob(sel.fraction, "selection.fraction", true, false)?;
        sel.afl.validate()?;
        sel.fedcor.validate()?;
        sel.fedgs.validate()?;
        sel.f3ast.validate()?;
        sel.hics.validate(
            &sel.strategy,
            match &self.partition.scheme {
                PartitionScheme::ClassDirichlet { alphas, .. } => Some(alphas),
                _ => None,
            },
            crate::select::hics::LocalRegime {
                sgd: self.train.optimizer == LocalOptimizer::Sgd,
                momentum: self.train.momentum,
                persistent_state: self.train.persistent_state,
            },
        )?;
        sel.divfl.validate()?;
        sel.oort.validate()?;
        sel.fedcs.validate()?;
        sel.tifl.validate()?;
        sel.pyramidfl.validate()?;
        check(
            sel.strategy != "pyramidfl" || self.system.as_ref().is_some_and(|s| s.is_on()),
            "selection.strategy",
            "pyramidfl ranks clients by their devices' round trips: it needs a [system] clock (system.kind)",
        )?;
        // PyramidFL over-commits inside itself (⌊K·overcommit⌋ picked, the K fastest run);
        // the engine's over-commitment on top would ask it for ⌈1.3K⌉ and prune twice.
        check(
            !(sel.strategy == "pyramidfl"
                && sel.pyramidfl.overcommit > 1.0
                && matches!(
                    self.system.as_ref().map(|s| s.round),
                    Some(RoundPolicy::Overcommit { .. })
                )),
            "system.round.overcommit",
            format!(
                "over-commits pyramidfl a second time: it already picks ⌊K·{}⌋ \
                 (selection.pyramidfl.overcommit) and runs the K of shortest round trip; use \
                 system.round.policy = \"wait_all\" (PyramidFL's own over-commitment, as its \
                 code runs), or selection.pyramidfl.overcommit = 1 to over-commit in the engine \
                 instead",
                sel.pyramidfl.overcommit
            ),
        )?;
        sel.fedbalancer.validate()?;
        self.validate_availability()?;
        if let Some(system) = &self.system {
            system.validate()?;
        }
        check(self.eval.every > 0, "eval.every", "must be at least 1")?;
        check(
            self.eval.per_client_every > 0,
            "eval.per_client_every",
            "must be at least 1 (eval.per_client = false turns the measurement off)",
        )?;
        check(
            self.eval.batch_size > 0,
            "eval.batch_size",
            "must be at least 1",
        )?;
        Ok(())
    }

    /// The budgets K_t the budget schedule can give with `clients` clients. A random
    /// budget's range stops at `clients`: a larger K_t selects everyone all the same.
    fn budgets(&self, clients: usize) -> Vec<usize> {
        match &self.budget {
            BudgetConfig::Constant => vec![self.selection.per_round(clients)],
            BudgetConfig::Periodic { values, .. } => values.clone(),
            BudgetConfig::Random { min, max } => (*min..=(*max).min(clients)).collect(),
        }
    }

    /// Settings that run but almost certainly not as meant, for a run over `clients`
    /// clients (a natural partition's count is known only once its data is read). The
    /// CLI logs each with `tracing::warn!`; [`Config::validate`] rejects what cannot run.
    ///
    /// - Pow-d with an effective d ≤ K_t (other than d = 0, all clients) for some budget
    ///   K_t keeps every candidate, so its selection is just the ∝ p_k draw: FedCor's
    ///   configs once did this with d = 10 and m = 10 (FedCor App. C.1 uses d = 2m).
    /// - A non-default `selection.powd.d` beside `selection.powd.d_per_m`, which wins.
    /// - A non-default `partition.holdout_fraction` on LEAF data whose held-out parts are
    ///   the users' test data, which ignores it.
    pub fn warnings(&self, clients: usize) -> Vec<ConfigWarning> {
        let mut out = Vec::new();
        let fraction = self.partition.holdout_fraction;
        if let DatasetConfig::Leaf {
            holdout: LeafHoldout::LeafTest,
            ..
        } = self.dataset
            && fraction != PartitionConfig::default().holdout_fraction
        {
            out.push(ConfigWarning {
                key: "partition.holdout_fraction".into(),
                message: format!(
                    "{fraction} is ignored: dataset.holdout = \"leaf_test\" holds out each \
                     user's LEAF test data; dataset.holdout = \"split\" splits each user's \
                     training data by it instead"
                ),
            });
        }
        let sel = &self.selection;
        if matches!(sel.strategy.as_str(), "powd" | "cpowd" | "rpowd") {
            let p = &sel.powd;
            if p.d_per_m > 0 && p.d != PowdConfig::default().d {
                out.push(ConfigWarning {
                    key: "selection.powd.d".into(),
                    message: format!(
                        "{} is ignored: selection.powd.d_per_m = {} sets d = {} · K_t each round",
                        p.d, p.d_per_m, p.d_per_m
                    ),
                });
            }
            let all = p.d == 0 && p.d_per_m == 0;
            let degenerate = self.budgets(clients).into_iter().find_map(|k| {
                let d = p.candidates(k, clients);
                (k > 0 && d <= k && d < clients).then_some((d, k))
            });
            if let (false, Some((d, k))) = (all, degenerate) {
                out.push(ConfigWarning {
                    key: p.key().into(),
                    message: format!(
                        "gives d = {d} candidates for a budget of m = {k}: every candidate is \
                         kept and {} reduces to sampling ∝ p_k; use d > m (FedCor App. C.1: \
                         selection.powd.d_per_m = 2) or d = 0 (all clients)",
                        sel.strategy
                    ),
                });
            }
        }
        if let Some(RoundPolicy::Overcommit { overcommit }) = self.system.as_ref().map(|s| s.round)
        {
            let k = self.selection.per_round(clients);
            let asked = ((1.0 + overcommit) * k as f64).ceil();
            if asked > clients as f64 {
                out.push(ConfigWarning {
                    key: "system.round.overcommit".into(),
                    message: format!(
                        "{overcommit} asks for ⌈(1 + {overcommit}) · {k}⌉ = {asked} clients a \
                         round of the {clients} there are: every available client is selected \
                         and the {k} whose updates arrive first are kept"
                    ),
                });
            }
        }
        if self.selection.strategy == "pyramidfl" && !self.selection.oort.is_default() {
            out.push(ConfigWarning {
                key: "selection.oort".into(),
                message: "is not read by pyramidfl, whose Oort has its own options: set them in \
                          [selection.pyramidfl.oort]"
                    .into(),
            });
        }
        if let Some(RoundPolicy::Fedbuff {
            concurrency,
            buffer_size,
        }) = self.system.as_ref().map(|s| s.round)
        {
            let key = if buffer_size >= clients {
                Some("system.round.buffer_size")
            } else if concurrency > clients {
                Some("system.round.concurrency")
            } else {
                None
            };
            if let Some(key) = key {
                out.push(ConfigWarning {
                    key: key.into(),
                    message: format!(
                        "concurrency {concurrency} and buffer_size {buffer_size} over the \
                         {clients} clients there are: at most {clients} train at once (a client \
                         trains one update at a time), so {}",
                        if buffer_size >= clients {
                            "every round waits for every client's update: the run is synchronous, wait-all over the whole federation"
                        } else {
                            "fewer clients fly than asked"
                        }
                    ),
                });
            }
        }
        out
    }

    /// Hex SHA-256 of the resolved config without its version stamp: two configs with
    /// the same hash run the same experiment (sweep cells and checkpoints are keyed by it).
    pub fn hash(&self) -> String {
        let mut c = self.clone();
        c.fedsel_version = None;
        c.output = OutputConfig::default();
        // A data seed equal to the run seed is the default written out (as the resolved
        // config does): the same config.
        if c.data_seed == Some(c.seed) {
            c.data_seed = None;
        }
        crate::digest::sha256_hex(
            toml::to_string(&c)
                .expect("a Config always serializes")
                .as_bytes(),
        )
    }

    /// The seed of the data (the run seed unless `data_seed` pins another).
    pub fn data_seed(&self) -> u64 {
        self.data_seed.unwrap_or(self.seed)
    }

    /// The config with every default written out and the version stamped, as TOML.
    pub fn to_resolved_toml(&self) -> String {
        let mut c = self.clone();
        c.fedsel_version = Some(crate::VERSION.to_string());
        c.data_seed = Some(self.data_seed());
        toml::to_string_pretty(&c).expect("a Config always serializes")
    }
}

/// A key or type error in a key that a `--set` override wrote, blamed on that override
/// rather than on the file it was applied over (`e` names the file, and its message starts
/// with the key's path).
fn blame_override(e: ConfigError, overrides: &[String]) -> ConfigError {
    let ConfigError::Parse {
        source_name,
        message,
    } = e
    else {
        return e;
    };
    let path = message
        .strip_prefix("key `")
        .and_then(|m| m.split('`').next())
        .unwrap_or("");
    let within = |k: &str| {
        path == k
            || path.starts_with(&format!("{k}."))
            || path.starts_with(&format!("{k}["))
            || k.starts_with(&format!("{path}."))
    };
    match overrides.iter().rev().find(|o| {
        o.split_once('=')
            .is_some_and(|(k, _)| !path.is_empty() && within(k.trim()))
    }) {
        Some(o) => ConfigError::Parse {
            source_name: format!("--set {o} (applied over {source_name})"),
            message,
        },
        None => ConfigError::Parse {
            source_name,
            message,
        },
    }
}

/// A setting that runs but is probably a mistake (see [`Config::warnings`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    /// Dotted path of the key concerned.
    pub key: String,
    /// What the setting does and what to use instead.
    pub message: String,
}

impl std::fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "config key `{}`: {}", self.key, self.message)
    }
}

/// Parses TOML text, naming `source_name` in the error.
pub fn parse_toml(text: &str, source_name: &str) -> Result<toml::Table, ConfigError> {
    text.parse()
        .map_err(|e: toml::de::Error| ConfigError::Parse {
            source_name: source_name.into(),
            message: e.to_string(),
        })
}

/// Makes the relative file paths a config file names (the availability trace, a LEAF or
/// FLGo dataset's directory, a device profile file, a behave trace) relative to
/// `dir`, the file's own directory, so a config runs the same from any working directory,
/// as a sweep's `base` already does. Paths given with `--set` stay relative to the
/// working directory.
pub fn anchor_paths(table: &mut toml::Table, dir: &Path) {
    for (section, key) in [
        ("availability", "trace"),
        ("dataset", "path"),
        ("system", "path"),
        ("system", "behave_trace"),
    ] {
        if let Some(toml::Value::String(p)) = table
            .get_mut(section)
            .and_then(toml::Value::as_table_mut)
            .and_then(|a| a.get_mut(key))
            && Path::new(p.as_str()).is_relative()
        {
            *p = dir.join(p.as_str()).display().to_string();
        }
    }
}

/// A table that names no `kind` takes the built-in default's, at any depth, so that a partial
/// override such as `--set dataset.users=50` refines the default dataset instead of naming
/// none. A key the inherited kind does not have is still an error that names it.
fn inherit_kinds(table: &mut toml::Table, defaults: &toml::Table) {
    for (key, value) in table.iter_mut() {
        let (Some(t), Some(d)) = (
            value.as_table_mut(),
            defaults.get(key).and_then(toml::Value::as_table),
        ) else {
            continue;
        };
        if !t.contains_key("kind")
            && let Some(kind) = d.get("kind")
        {
            t.insert("kind".into(), kind.clone());
        }
        inherit_kinds(t, d);
    }
}

/// Keys the resolved config leaves out while they hold their default, so that configs from
/// before they existed keep their hash. Their structs deny unknown fields, so serde itself
/// refuses a misspelt key under them; absent from what was read back, they were not ignored.
const ELIDED_AT_DEFAULT: [&str; 14] = [
    "dataset.normalize",
    "model.init",
    "eval.per_client",
    "eval.per_client_every",
    "eval.per_client_clients",
    "selection.oort",
    "selection.fedcs",
    "selection.tifl",
    "selection.ward_distances",
    "selection.pyramidfl",
    "selection.refl",
    "selection.fedbalancer",
    "selection.fedcor.protocol",
    "selection.fedcor.group_size",
];

/// Keys elided at their default (as [`ELIDED_AT_DEFAULT`]) that only one kind of their table
/// has: given at their default they are accepted under that kind alone, so that the same key
/// beside a kind that takes no settings (`kind = "iid"`), which serde drops, is still refused.
const ELIDED_AT_DEFAULT_FOR_KIND: [(&str, &str); 1] =
    [("partition.scheme.all_full", "class_dirichlet")];

/// Every key given must have been read: serde ignores extra keys beside a kind that takes
/// none (`kind = "always"`, `"iid"`, `"fmnist"`), so the keys of what was read back are
/// compared with the keys given, and one that was dropped is an error that names it.
fn reject_ignored_keys(
    given: &toml::Table,
    read: &toml::Table,
    prefix: &str,
) -> Result<(), ConfigError> {
    for (key, value) in given {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match (value, read.get(key)) {
            (_, None) if ELIDED_AT_DEFAULT.contains(&path.as_str()) => {}
            (_, None)
                if ELIDED_AT_DEFAULT_FOR_KIND.iter().any(|&(p, k)| {
                    p == path && read.get("kind").and_then(toml::Value::as_str) == Some(k)
                }) => {}
            (_, None) => {
                let kind = read.get("kind").and_then(toml::Value::as_str);
                return Err(ConfigError::invalid(
                    path,
                    match kind {
                        Some(k) => {
                            format!("is not a key of kind `{k}`, which takes no such setting")
                        }
                        None => "is not a key here".into(),
                    },
                ));
            }
            (toml::Value::Table(g), Some(toml::Value::Table(r))) => {
                reject_ignored_keys(g, r, &path)?
            }
            _ => {}
        }
    }
    Ok(())
}

/// Sets `a.b.c = value` in a TOML table; the value is parsed as TOML, else taken as a string.
pub fn apply_override(table: &mut toml::Table, spec: &str) -> Result<(), ConfigError> {
    let (key, raw) = spec
        .split_once('=')
        .ok_or_else(|| ConfigError::BadOverride(spec.into()))?;
    let key = key.trim();
    if key.is_empty() || key.split('.').any(str::is_empty) {
        return Err(ConfigError::BadOverride(spec.into()));
    }
    let raw = raw.trim();
    let value = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    let parts: Vec<&str> = key.split('.').collect();
    let mut cur = table;
    for part in &parts[..parts.len() - 1] {
        let entry = cur
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = entry.as_table_mut().ok_or_else(|| {
            ConfigError::invalid(key, format!("`{part}` is a value, not a table"))
        })?;
    }
    cur.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_overrides_refine_the_default_kind() {
        let c = Config::load(None, &["dataset.users=50".into()]).unwrap();
        assert!(matches!(
            c.dataset,
            DatasetConfig::Synthetic { users: 50, .. }
        ));
        // A key the inherited kind does not have is named.
        let e = Config::load(None, &["availability.beta=0.5".into()]).unwrap_err();
        assert!(e.to_string().contains("beta"), "{e}");
        // An explicit kind still replaces the default's table.
        let c = Config::load(None, &["availability={ kind = \"ln\", beta = 0.5 }".into()]).unwrap();
        assert_eq!(
            c.availability,
            AvailabilityConfig::Ln(LnConfig { beta: 0.5 })
        );
    }

    /// Keys the resolved config leaves out at their default may still be given at their
    /// default (they were refused as "not a key here"), and a misspelt one is still named.
    #[test]
    fn keys_elided_at_their_default_can_be_given() {
        let default = Config::load(None, &[]).unwrap();
        let c = Config::load(None, &["eval.per_client=true".into()]).unwrap();
        assert!(c.eval.per_client);
        assert_eq!(c.hash(), default.hash());
        let pacer = OortConfig::default().pacer_step;
        let c = Config::load(None, &[format!("selection.oort.pacer_step={pacer}")]).unwrap();
        assert_eq!(c.hash(), default.hash());
        let e = Config::load(None, &["selection.oort.pacer_stp=3".into()]).unwrap_err();
        assert!(e.to_string().contains("pacer_stp"), "{e}");
        let e = Config::load(None, &["eval.per_clent=true".into()]).unwrap_err();
        assert!(e.to_string().contains("per_clent"), "{e}");
    }

    /// `partition.scheme.all_full` may be given at its default (`spread`, which the resolved
    /// config leaves out; it was refused as "not a key of kind `class_dirichlet`") with the
    /// hash of the config without it; `last_client` is written out; beside another kind the
    /// key is still refused by name.
    #[test]
    fn class_dirichlet_all_full_may_be_given_at_its_default() {
        let scheme = "partition.scheme={ kind = \"class_dirichlet\", alphas = [0.01, 0.5] }";
        let load = |all_full: Option<&str>| {
            let mut set = vec![scheme.to_string()];
            set.extend(all_full.map(|a| format!("partition.scheme.all_full=\"{a}\"")));
            Config::load(None, &set)
        };
        let without = load(None).unwrap();
        let spread = load(Some("spread")).unwrap();
        assert_eq!(spread.hash(), without.hash());
        assert!(!spread.to_resolved_toml().contains("all_full"));
        let last = load(Some("last_client")).unwrap();
        assert_ne!(last.hash(), without.hash());
        assert!(
            last.to_resolved_toml()
                .contains("all_full = \"last_client\"")
        );
        let e = load(Some("last")).unwrap_err().to_string();
        assert!(e.contains("`last`"), "{e}");
        let iid = [
            "partition.scheme={ kind = \"iid\" }".to_string(),
            "partition.scheme.all_full=\"spread\"".to_string(),
        ];
        let e = Config::load(None, &iid).unwrap_err().to_string();
        assert!(
            e.contains("partition.scheme.all_full") && e.contains("iid"),
            "{e}"
        );
    }

    /// `selection.fedcor.protocol` and `group_size` are elided at their defaults (every
    /// FedCor config from before them keeps its hash) and written out otherwise.
    #[test]
    fn fedcor_protocol_is_elided_at_its_default() {
        let default = Config::load(None, &[]).unwrap();
        let given = [
            "selection.fedcor.protocol=\"paper\"".into(),
            "selection.fedcor.group_size=100".into(),
        ];
        let c = Config::load(None, &given).unwrap();
        assert_eq!(c.hash(), default.hash());
        let resolved: toml::Table = default.to_resolved_toml().parse().unwrap();
        let fedcor = resolved["selection"]["fedcor"].as_table().unwrap();
        assert!(fedcor.contains_key("theta"));
        assert!(!fedcor.contains_key("protocol") && !fedcor.contains_key("group_size"));
        let code = Config::load(None, &["selection.fedcor.protocol=\"code\"".into()]).unwrap();
        assert_eq!(
            code.selection.fedcor.protocol,
            crate::select::fedcor::FedCorProtocol::Code
        );
        assert_ne!(code.hash(), default.hash());
        assert!(code.to_resolved_toml().contains("protocol = \"code\""));
        let e = Config::load(None, &["selection.fedcor.protocol=\"cod\"".into()]).unwrap_err();
        assert!(e.to_string().contains("cod"), "{e}");
    }

    /// `model.init` is elided at its default (every config from before the key keeps its
    /// hash), written out otherwise, and refused with its name on a kind it does not apply to.
    #[test]
    fn model_init_is_elided_at_its_default_and_checked_against_the_kind() {
        let default = Config::load(None, &[]).unwrap();
        let c = Config::load(None, &["model.init=\"default\"".into()]).unwrap();
        assert_eq!(c.hash(), default.hash());
        assert!(!c.to_resolved_toml().contains("init"));
        let c = Config::load(None, &["model.init=\"xavier_relu\"".into()]).unwrap();
        assert_eq!(c.model.init, ModelInit::XavierRelu);
        assert_ne!(c.hash(), default.hash());
        assert!(c.to_resolved_toml().contains("init = \"xavier_relu\""));
        let mlp = [
            "model.kind=\"mlp\"".into(),
            "model.init=\"xavier_relu\"".into(),
        ];
        Config::load(None, &mlp).unwrap();
        let cnn = [
            "model.kind=\"cnn_fmnist\"".into(),
            "model.init=\"xavier_relu\"".into(),
        ];
        let e = Config::load(None, &cnn).unwrap_err().to_string();
        assert!(e.contains("model.init") && e.contains("cnn_fmnist"), "{e}");
        let e = Config::load(None, &["model.init=\"xavier\"".into()]).unwrap_err();
        assert!(e.to_string().contains("xavier"), "{e}");
    }

    /// `dataset.normalize` is elided at its default, so every Fashion-MNIST config from
    /// before the key keeps its hash; `half` is written out; another dataset refuses it.
    #[test]
    fn fmnist_normalize_is_elided_at_its_default() {
        let fmnist = |extra: &[&str]| {
            let mut set = vec!["dataset={ kind = \"fmnist\" }".to_string()];
            set.extend(extra.iter().map(|s| s.to_string()));
            Config::from_toml_str("", "d", &set)
        };
        let default = fmnist(&[]).unwrap();
        let mnist = fmnist(&["dataset.normalize=\"mnist\""]).unwrap();
        assert_eq!(mnist.hash(), default.hash());
        assert!(!default.to_resolved_toml().contains("normalize"));
        let half = fmnist(&["dataset.normalize=\"half\""]).unwrap();
        assert_eq!(
            half.dataset,
            DatasetConfig::Fmnist {
                normalize: FmnistNormalize::Half
            }
        );
        assert_ne!(half.hash(), default.hash());
        assert!(half.to_resolved_toml().contains("normalize = \"half\""));
        let e = Config::from_toml_str("", "d", &["dataset.normalize=\"half\"".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("normalize"), "{e}");
    }

    /// A billion Synthetic users is refused by validation, before the generator runs (it
    /// used to spin until the memory ran out); the paper sizes pass.
    #[test]
    fn synthetic_size_is_bounded_before_generating() {
        let load = |users: &str| Config::load(None, &[format!("dataset.users={users}")]);
        let e = load("1000000000").unwrap_err().to_string();
        assert!(e.contains("dataset.users") && e.contains("GB"), "{e}");
        load("1000").unwrap();
    }

    #[test]
    fn default_round_trips_through_resolved_toml() {
        let mut c = Config::default();
        c.resolve();
        c.validate().unwrap();
        let text = c.to_resolved_toml();
        let back = Config::from_toml_str(&text, "resolved", &[]).unwrap();
        assert_eq!(back.fedsel_version.as_deref(), Some(crate::VERSION));
        // The data seed the run used is written out, and counts as the default.
        assert_eq!(back.data_seed, Some(c.seed));
        assert_eq!(back.hash(), c.hash());
        assert_eq!(
            Config {
                fedsel_version: None,
                data_seed: None,
                ..back
            },
            c
        );
    }

    /// λ is a mixing weight in [0, 1] under the paper's Eq. 9 and a plain weight (the
    /// code's 10) under protocol `code`; with protocol `code` and a class-Dirichlet
    /// partition, `several_alpha_groups` must say what the partition's α list says.
    #[test]
    fn hics_code_protocol_keys_are_checked_against_the_partition() {
        let load = |extra: &[&str]| {
            let mut set: Vec<String> = vec![
                "selection.strategy=\"hics\"".into(),
                "partition.clients=10".into(),
            ];
            set.extend(extra.iter().map(|s| s.to_string()));
            Config::from_toml_str("", "d", &set).map_err(|e| e.to_string())
        };
        let code = [
            "selection.hics.protocol=\"code\"",
            "train.momentum=0.9",
            "train.persistent_state=true",
        ];
        let with_code = |extra: &[&str]| load(&[&code[..], extra].concat());
        let two = "partition.scheme={ kind = \"class_dirichlet\", alphas = [0.01, 0.5] }";
        let one = "partition.scheme={ kind = \"class_dirichlet\", alphas = [0.01, 0.01] }";
        let err = load(&["selection.hics.lambda=10"]).unwrap_err();
        assert!(err.contains("selection.hics.lambda"), "{err}");
        with_code(&["selection.hics.lambda=10"]).unwrap();
        let several = "selection.hics.several_alpha_groups=true";
        let err = with_code(&[two]).unwrap_err();
        assert!(
            err.contains("several_alpha_groups") && err.contains("2 distinct"),
            "{err}"
        );
        with_code(&[two, several]).unwrap();
        let err = with_code(&[one, several]).unwrap_err();
        assert!(err.contains("1 distinct"), "{err}");
        with_code(&[one]).unwrap();
        // The paper protocol ignores the flag.
        load(&[one, several]).unwrap();
    }

    /// A HiCS-FL protocol is a whole regime (decisions.md, "No hybrid regimes"): `paper`
    /// with the code's momentum or kept optimizer state, or `code` without them, is
    /// rejected naming the training key; other strategies and Adam are not affected.
    #[test]
    fn hics_protocols_reject_the_other_protocols_training_regime() {
        let load = |extra: &[&str]| {
            let mut set = vec!["selection.strategy=\"hics\"".to_string()];
            set.extend(extra.iter().map(|s| s.to_string()));
            Config::from_toml_str("", "d", &set).map_err(|e| e.to_string())
        };
        let code = "selection.hics.protocol=\"code\"";
        let (momentum, kept) = ("train.momentum=0.9", "train.persistent_state=true");
        load(&[]).unwrap();
        for (extra, key) in [
            (&[momentum][..], "`train.momentum`"),
            (&[kept][..], "`train.persistent_state`"),
            (&[momentum, kept][..], "`train.momentum`"),
            (&[code][..], "`train.persistent_state`"),
            (&[code, momentum][..], "`train.persistent_state`"),
            (&[code, kept][..], "`train.momentum`"),
        ] {
            let err = load(extra).unwrap_err();
            assert!(err.contains(key), "{extra:?}: {err}");
        }
        load(&[code, momentum, kept]).unwrap();
        load(&["train.optimizer=\"adam\""]).unwrap();
        load(&[code, "train.optimizer=\"adam\"", kept]).unwrap();
        let other = |extra: &[&str]| {
            let mut set = vec!["selection.strategy=\"uniform\"".to_string()];
            set.extend(extra.iter().map(|s| s.to_string()));
            Config::from_toml_str("", "d", &set).map(|_| ())
        };
        other(&[momentum, kept]).unwrap();
        other(&[code]).unwrap();
    }

    #[test]
    fn unknown_key_is_named() {
        let err = Config::from_toml_str("[train]\nlr = 0.1\nlearning_rate = 3", "x.toml", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("learning_rate"), "{err}");
        assert!(err.contains("x.toml"), "{err}");
    }

    #[test]
    fn out_of_range_value_is_named() {
        let err = Config::from_toml_str("", "d", &["train.lr=-1".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("train.lr"), "{err}");
        let err = Config::from_toml_str("", "d", &["selection.strategy=\"best\"".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("selection.strategy"), "{err}");
    }

    #[test]
    fn overrides_reach_nested_and_tagged_keys() {
        let c = Config::from_toml_str(
            "",
            "d",
            &[
                "partition.scheme.kind=shards".into(),
                "partition.scheme.shards_per_client=2".into(),
                "train.work.steps=20".into(),
                "seed=7".into(),
                "name=bare-string".into(),
            ],
        )
        .unwrap();
        assert_eq!(
            c.partition.scheme,
            PartitionScheme::Shards {
                shards_per_client: 2
            }
        );
        assert_eq!(c.train.work, LocalWork::Steps(20));
        assert_eq!(c.seed, 7);
        assert_eq!(c.name, "bare-string");
    }

    fn powd(overrides: &[&str]) -> Config {
        let mut o = vec!["selection.strategy=\"powd\"".to_string()];
        o.extend(overrides.iter().map(|s| s.to_string()));
        Config::from_toml_str("", "d", &o).unwrap()
    }

    #[test]
    fn powd_with_d_at_most_m_warns_naming_the_key() {
        // FedCor 1SPC as once shipped: d = 10 with m = 10 of 100 clients.
        let w = powd(&["selection.clients_per_round=10", "selection.powd.d=10"]).warnings(100);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].key, "selection.powd.d");
        assert!(
            w[0].message
                .contains("d = 10 candidates for a budget of m = 10")
        );
        assert!(w[0].to_string().contains("`selection.powd.d`"));
        // d_per_m = 1 is d = m whatever m is.
        let w = powd(&["selection.clients_per_round=5", "selection.powd.d_per_m=1"]).warnings(100);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].key, "selection.powd.d_per_m");
        // A periodic budget that reaches 12 makes d = 10 degenerate in those rounds.
        let c = powd(&[
            "selection.powd.d=10",
            "budget.kind=\"periodic\"",
            "budget.values=[5, 12]",
        ]);
        assert!(c.warnings(100)[0].message.contains("m = 12"));
        // So does a random budget whose range reaches 10; a range far beyond N is cut at N.
        let c = powd(&[
            "selection.powd.d=10",
            "budget.kind=\"random\"",
            "budget.min=3",
            "budget.max=1000000000000",
        ]);
        assert!(c.warnings(100)[0].message.contains("m = 10"));
        // The default m = 0.2 · N: 20 of 100 clients is above the default d = 10, while
        // 6 of 30 is below it.
        assert_eq!(powd(&[]).warnings(100).len(), 1);
        assert!(powd(&[]).warnings(30).is_empty());
    }

    #[test]
    fn powd_without_degeneracy_does_not_warn() {
        for (o, n) in [
            (
                vec!["selection.clients_per_round=10", "selection.powd.d_per_m=2"],
                100,
            ),
            (
                vec!["selection.clients_per_round=5", "selection.powd.d=10"],
                100,
            ),
            // d = 0: all available clients, the "ideal" pow-d.
            (
                vec!["selection.clients_per_round=10", "selection.powd.d=0"],
                100,
            ),
            // d_per_m · m reaches every client: also all of them.
            (
                vec!["selection.clients_per_round=10", "selection.powd.d_per_m=2"],
                15,
            ),
        ] {
            assert!(powd(&o).warnings(n).is_empty(), "{o:?}");
        }
        // Other strategies ignore the pow-d table.
        let c = Config::from_toml_str(
            "",
            "d",
            &[
                "selection.clients_per_round=10".into(),
                "selection.powd.d=10".into(),
            ],
        )
        .unwrap();
        assert!(c.warnings(100).is_empty());
    }

    #[test]
    fn a_d_that_d_per_m_overrides_is_named() {
        let w = powd(&[
            "selection.clients_per_round=10",
            "selection.powd.d=30",
            "selection.powd.d_per_m=2",
        ])
        .warnings(100);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].key, "selection.powd.d");
        assert!(w[0].message.contains("30 is ignored"));
    }

    #[test]
    fn schedules_match_hand_computed_rates() {
        let s = LrSchedule::Step {
            milestones: vec![150, 300],
            gamma: 0.5,
        };
        assert_eq!(s.rate(0.005, 149), 0.005);
        assert_eq!(s.rate(0.005, 150), 0.0025);
        assert_eq!(s.rate(0.005, 300), 0.00125);
        let e = LrSchedule::Exponential { gamma: 0.9 };
        assert!((e.rate(1.0, 2) - 0.81).abs() < 1e-12);
    }

    #[test]
    fn a_set_mistake_is_blamed_on_the_set_and_a_file_mistake_on_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exp.toml");
        std::fs::write(&path, "rounds = 5\n").unwrap();
        let e = Config::load(Some(&path), &["rounds=\"ten\"".into()])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--set rounds=\"ten\""), "{e}");
        let e = Config::load(Some(&path), &["train.no_such_key=1".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--set train.no_such_key=1"), "{e}");
        std::fs::write(&path, "rounds = \"five\"\n").unwrap();
        let e = Config::load(Some(&path), &["seed=3".into()])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(&path.display().to_string()), "{e}");
    }

    #[test]
    fn oort_options_under_pyramidfl_are_said_to_be_unread() {
        let load = |set: &[&str]| {
            let set: Vec<String> = set.iter().map(|s| s.to_string()).collect();
            Config::load(None, &set).unwrap()
        };
        let c = load(&[
            "selection.strategy=\"pyramidfl\"",
            "system.kind=\"lognormal\"",
            "selection.oort.pacer_step=7",
        ]);
        let w: Vec<String> = c.warnings(30).iter().map(|w| w.to_string()).collect();
        assert!(
            w.iter()
                .any(|w| w.contains("`selection.oort`") && w.contains("[selection.pyramidfl.oort]")),
            "{w:?}"
        );
        let c = load(&["selection.strategy=\"oort\"", "selection.oort.pacer_step=7"]);
        assert!(c.warnings(30).is_empty());
    }
}
