//! Datasets: in-memory examples, the global test set and, where the data has
//! them, its natural users.
//!
//! Inputs are stored once, already normalised, and clients hold only index
//! lists into them, so a partition never copies examples.

pub mod builder;
pub mod cifar;
pub mod flgo;
pub mod fmnist;
pub mod leaf;
pub mod locate;
pub mod numpy_legacy;
pub mod shakespeare;
pub mod synthetic;

use std::path::Path;

use crate::config::{Config, DatasetConfig, FlgoSource, FmnistNormalize, SyntheticGenerator};
use crate::error::DataError;
pub(crate) use crate::error::read_file;

/// Example inputs, row-major, one row per example.
#[derive(Debug, Clone)]
pub enum Inputs {
    /// Real-valued features; `shape` is one example's shape (e.g. `[1, 28, 28]` or `[60]`).
    Dense {
        /// Shape of one example.
        shape: Vec<usize>,
        /// `len · prod(shape)` values.
        values: Vec<f32>,
    },
    /// Fixed-length token sequences (character indices).
    Tokens {
        /// Sequence length.
        len: usize,
        /// `examples · len` token ids.
        values: Vec<u8>,
    },
}

impl Inputs {
    /// Number of scalars in one example.
    pub fn row_len(&self) -> usize {
        match self {
            Self::Dense { shape, .. } => shape.iter().product(),
            Self::Tokens { len, .. } => *len,
        }
    }
}

/// A labelled set of examples.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// The inputs.
    pub inputs: Inputs,
    /// One label per example, in `0..classes`.
    pub labels: Vec<u32>,
    /// Number of classes.
    pub classes: usize,
}

impl Dataset {
    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Per-class counts over the given examples (all when `idx` is `None`).
    pub fn histogram(&self, idx: Option<&[usize]>) -> Vec<usize> {
        let mut h = vec![0; self.classes];
        match idx {
            Some(idx) => idx.iter().for_each(|&i| h[self.labels[i] as usize] += 1),
            None => self.labels.iter().for_each(|&l| h[l as usize] += 1),
        }
        h
    }

    /// Asks the CPU to start loading the inputs of examples `idx` into its caches, and
    /// returns at once: a hint, which changes no value. The trainer gives it the next
    /// mini-batch while it computes the current one. A round's clients are new to the
    /// caches, so without it the next batch's gather waits on memory: at about 9 % of
    /// the FedCor MLP round, with the cores idle meanwhile (docs/speed.md).
    pub fn prefetch(&self, idx: &[usize]) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
            /// Bytes in an x86-64 cache line.
            const LINE: usize = 64;
            let (bytes, row) = match &self.inputs {
                Inputs::Dense { values, .. } => {
                    let row = self.inputs.row_len() * size_of::<f32>();
                    (values.as_ptr().cast::<u8>(), row)
                }
                Inputs::Tokens { values, len } => (values.as_ptr(), *len),
            };
            for &i in idx.iter().filter(|&&i| i < self.len()) {
                for at in (0..row).step_by(4 * LINE) {
                    // SAFETY: example `i` exists, so its row of `row` bytes from
                    // `i · row` is inside the inputs; a prefetch reads nothing anyway.
                    unsafe { _mm_prefetch::<_MM_HINT_T1>(bytes.add(i * row + at).cast()) };
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = idx;
    }

    /// The examples at `idx`, as a new dataset (used to subsample a test set).
    pub fn subset(&self, idx: &[usize]) -> Dataset {
        let row = self.inputs.row_len();
        let inputs = match &self.inputs {
            Inputs::Dense { shape, values } => Inputs::Dense {
                shape: shape.clone(),
                values: idx
                    .iter()
                    .flat_map(|&i| values[i * row..(i + 1) * row].iter().copied())
                    .collect(),
            },
            Inputs::Tokens { len, values } => Inputs::Tokens {
                len: *len,
                values: idx
                    .iter()
                    .flat_map(|&i| values[i * row..(i + 1) * row].iter().copied())
                    .collect(),
            },
        };
        Dataset {
            inputs,
            labels: idx.iter().map(|&i| self.labels[i]).collect(),
            classes: self.classes,
        }
    }
}

/// What a run trains and tests on.
#[derive(Debug, Clone)]
pub struct FederatedData {
    /// Dataset name.
    pub name: String,
    /// The pool clients' examples are drawn from.
    pub train: Dataset,
    /// The global test set, held by the server for reported accuracy and loss.
    pub test: Dataset,
    /// The data's own users (indices into `train`), where it has them.
    pub users: Option<Vec<Vec<usize>>>,
    /// **Oracle**: each user's generating model (W_k then b_k, flattened), where the
    /// data is synthetic. FedGS's oracle 3DG uses it on Synthetic (FedGS §4.1).
    pub user_models: Option<Vec<Vec<f64>>>,
    /// Each user's own held-out examples (indices into `train`), where the data fixes
    /// them (the FedGS authors' task: a validation part by position; a LEAF user's test
    /// examples, appended to `train` after every user's training examples); the natural
    /// partition then uses them instead of a seeded split.
    pub user_holdout: Option<Vec<Vec<usize>>>,
}

/// Loads the dataset a config names; files are looked up under `data_dir`.
pub fn load(config: &Config, data_dir: &Path) -> Result<FederatedData, DataError> {
    match &config.dataset {
        DatasetConfig::Synthetic {
            alpha,
            beta,
            users,
            dim,
            classes,
            test_fraction,
            generator,
        } => {
            let spec = synthetic::SyntheticSpec {
                alpha: *alpha,
                beta: *beta,
                users: *users,
                dim: *dim,
                classes: *classes,
                test_fraction: *test_fraction,
                seed: config.data_seed(),
            };
            Ok(match generator {
                SyntheticGenerator::Fedsel => synthetic::generate(&spec),
                SyntheticGenerator::Easyfl => synthetic::generate_easyfl(&spec),
            })
        }
        DatasetConfig::Fmnist { normalize } => fmnist::load_with(
            &data_dir.join(fmnist::DIR),
            config.verify_checksums,
            *normalize,
        ),
        DatasetConfig::Cifar10 => {
            cifar::load_cifar10(&data_dir.join(cifar::DIR10), config.verify_checksums)
        }
        DatasetConfig::Cifar100 => {
            cifar::load_cifar100(&data_dir.join(cifar::DIR100), config.verify_checksums)
        }
        DatasetConfig::Shakespeare {
            train_fraction,
            min_samples,
            max_clients,
            max_samples_per_client,
        } => shakespeare::load(
            &data_dir.join(shakespeare::DIR),
            &shakespeare::ShakespeareSpec {
                train_fraction: *train_fraction,
                min_samples: *min_samples,
                max_clients: *max_clients,
                max_samples_per_client: *max_samples_per_client,
                seed: config.data_seed(),
            },
        ),
        DatasetConfig::Leaf {
            path,
            holdout,
            shape,
            classes,
        } => leaf::load(
            path,
            &leaf::LeafSpec {
                shape: shape.clone(),
                classes: *classes,
                holdout: *holdout,
            },
        ),
        DatasetConfig::Flgo {
            path,
            source,
            shape,
            classes,
        } => {
            let base = match source {
                None => None,
                Some(FlgoSource::Fmnist) => Some(fmnist::load_with(
                    &data_dir.join(fmnist::DIR),
                    config.verify_checksums,
                    FmnistNormalize::default(),
                )?),
                Some(FlgoSource::Cifar10) => Some(cifar::load_cifar10(
                    &data_dir.join(cifar::DIR10),
                    config.verify_checksums,
                )?),
                Some(FlgoSource::Cifar100) => Some(cifar::load_cifar100(
                    &data_dir.join(cifar::DIR100),
                    config.verify_checksums,
                )?),
            };
            flgo::load(
                path,
                &flgo::FlgoSpec {
                    shape: shape.clone(),
                    classes: *classes,
                },
                base,
            )
        }
    }
}
