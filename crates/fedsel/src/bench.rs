//! Speed measurements behind `fedsel bench`: per-step training time of each
//! architecture on random data, and ms per round of a whole workload.

use std::time::{Duration, Instant};

use burn::tensor::Device;

use crate::config::{LocalWork, TrainConfig};
use crate::data::{Dataset, Inputs};
use crate::model::{Architecture, ParamLayout};
use crate::rng::{Purpose, stream};
use crate::train::Trainer;

/// A random dataset shaped like `inputs`, with `n` examples of `classes` classes.
pub fn random_dataset(shape: &[usize], tokens: Option<usize>, n: usize, classes: usize) -> Dataset {
    use rand::Rng as _;
    let mut rng = stream(0, Purpose::Dataset, 0, 0);
    let inputs = match tokens {
        Some(len) => Inputs::Tokens {
            len,
            values: (0..n * len)
                .map(|_| rng.random_range(0..classes as u8))
                .collect(),
        },
        None => {
            let row: usize = shape.iter().product();
            Inputs::Dense {
                shape: shape.to_vec(),
                values: (0..n * row).map(|_| rng.random::<f32>()).collect(),
            }
        }
    };
    Dataset {
        inputs,
        labels: (0..n)
            .map(|_| rng.random_range(0..classes as u32))
            .collect(),
        classes,
    }
}

/// Median time of one SGD step at `batch`, over `reps` timed runs of `steps` steps after a warm-up.
pub fn step_time(
    arch: &dyn Architecture,
    data: &Dataset,
    batch: usize,
    steps: usize,
    reps: usize,
    device: &Device,
) -> Duration {
    let layout = ParamLayout::of(arch);
    let params = layout.init(0);
    let cfg = TrainConfig {
        work: LocalWork::Steps(steps),
        batch_size: batch,
        momentum: 0.9,
        ..TrainConfig::default()
    };
    let trainer = Trainer {
        arch,
        layout: &layout,
        data,
        cfg: &cfg,
        dropout: 0.0,
        device,
    };
    let idx: Vec<usize> = (0..data.len()).collect();
    let mut rng = stream(0, Purpose::Training, 0, 0);
    trainer.train(&params, &idx, 0.01, &mut rng, None);
    let mut times: Vec<Duration> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            trainer.train(&params, &idx, 0.01, &mut rng, None);
            t.elapsed() / steps as u32
        })
        .collect();
    times.sort();
    times[reps / 2]
}
