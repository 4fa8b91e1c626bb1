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
    step_times(&[arch], data, batch, steps, reps, device)[0]
}

/// Median time of one SGD step of each architecture, as [`step_time`], with the
/// architectures' runs alternating rep by rep: on a loaded machine the load then falls
/// on all of them alike, and their ratio means something where separate runs' times
/// would not.
pub fn step_times(
    archs: &[&dyn Architecture],
    data: &Dataset,
    batch: usize,
    steps: usize,
    reps: usize,
    device: &Device,
) -> Vec<Duration> {
    let cfg = TrainConfig {
        work: LocalWork::Steps(steps),
        batch_size: batch,
        momentum: 0.9,
        ..TrainConfig::default()
    };
    let layouts: Vec<ParamLayout> = archs.iter().map(|a| ParamLayout::of(*a)).collect();
    let trainers: Vec<Trainer<'_>> = archs
        .iter()
        .zip(&layouts)
        .map(|(&arch, layout)| Trainer {
            arch,
            layout,
            data,
            cfg: &cfg,
            dropout: 0.0,
            device,
        })
        .collect();
    let params: Vec<Vec<f32>> = layouts.iter().map(|l| l.init(0)).collect();
    let idx: Vec<usize> = (0..data.len()).collect();
    let mut rng = stream(0, Purpose::Training, 0, 0);
    for (t, p) in trainers.iter().zip(&params) {
        t.train(p, &idx, 0.01, &mut rng, None);
    }
    let mut times = vec![Vec::with_capacity(reps); archs.len()];
    for _ in 0..reps {
        for ((t, p), out) in trainers.iter().zip(&params).zip(&mut times) {
            let started = Instant::now();
            t.train(p, &idx, 0.01, &mut rng, None);
            out.push(started.elapsed() / steps as u32);
        }
    }
    times
        .into_iter()
        .map(|mut t| {
            t.sort();
            t[reps / 2]
        })
        .collect()
}

/// Median time of evaluating all of `data` in batches of `batch` (already on the device,
/// as the server's test set), for each architecture, their runs alternating rep by rep
/// as in [`step_times`].
pub fn eval_times(
    archs: &[&dyn Architecture],
    data: &Dataset,
    batch: usize,
    reps: usize,
    device: &Device,
) -> Vec<Duration> {
    let idx: Vec<usize> = (0..data.len()).collect();
    let batches: Vec<_> = idx
        .chunks(batch)
        .map(|chunk| crate::model::batch(data, chunk, device))
        .collect();
    let params: Vec<_> = archs
        .iter()
        .map(|a| {
            let layout = ParamLayout::of(*a);
            layout.to_tensors(&layout.init(0), device)
        })
        .collect();
    let mut times = vec![Vec::with_capacity(reps); archs.len()];
    for _ in 0..reps {
        for ((a, p), out) in archs.iter().zip(&params).zip(&mut times) {
            let started = Instant::now();
            crate::train::evaluate_batches(*a, p, &batches);
            out.push(started.elapsed());
        }
    }
    times
        .into_iter()
        .map(|mut t| {
            t.sort();
            t[reps / 2]
        })
        .collect()
}

/// A query for selectors that ask clients for nothing (FedGS on its oracle graph).
struct NoReports;

impl crate::select::ClientQuery for NoReports {
    fn holdout_losses(&mut self, _: &[usize]) -> Result<Vec<f64>, crate::error::Error> {
        unreachable!("FedGS on the oracle graph asks for no losses")
    }
    fn minibatch_losses(&mut self, _: &[usize]) -> Result<Vec<f64>, crate::error::Error> {
        unreachable!("FedGS on the oracle graph asks for no losses")
    }
    fn probe(&mut self, _: &[usize], _: &[usize]) -> Result<Vec<f64>, crate::error::Error> {
        unreachable!("FedGS on the oracle graph asks for no probes")
    }
}

/// Per-round FedGS selection time (graph already built) for `n` clients and `m` per
/// round: `rounds` rounds with every client available, then `rounds` with each client
/// available with probability ½. Clients hold two of ten labels, as in FedGS's FMNIST
/// setting. Returns (mean ms, max ms) over all rounds.
pub fn fedgs_selection_time(n: usize, m: usize, rounds: usize) -> (f64, f64) {
    use crate::select::{Feedback, RoundContext, Selector, Setup, fedgs::FedGs};
    use rand::Rng as _;
    let features: Vec<Vec<f64>> = (0..n)
        .map(|k| {
            let mut f = vec![0.0; 10];
            f[k % 10] = 0.5;
            f[(k / 10 + k) % 10] += 0.5;
            f
        })
        .collect();
    let mut s = FedGs::new(crate::config::FedGsConfig::default());
    s.setup(&Setup {
        sizes: vec![600; n],
        weights: vec![1.0 / n as f64; n],
        per_round: m,
        rounds: 2 * rounds,
        num_params: 1,
        classes: 10,
        oracle_label_histograms: None,
        oracle_features: Some(features),
    });
    s.initial_phase(&mut NoReports)
        .expect("the oracle graph needs no reports");
    let mut rng = stream(0, Purpose::Availability, 0, 0);
    let mut times = Vec::with_capacity(2 * rounds);
    for t in 0..2 * rounds {
        let available: Vec<usize> = if t < rounds {
            (0..n).collect()
        } else {
            (0..n).filter(|_| rng.random::<f64>() < 0.5).collect()
        };
        let ctx = RoundContext {
            round: t,
            available: &available,
            budget: m,
        };
        let started = Instant::now();
        let sel = s
            .select(&ctx, &mut NoReports, &mut rng)
            .expect("the oracle graph needs no reports");
        times.push(started.elapsed().as_secs_f64() * 1e3);
        s.observe(&Feedback {
            round: t,
            selected: &sel.clients,
            train_losses: &vec![0.0; sel.clients.len()],
            updates: None,
        });
    }
    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
    let max = times.iter().copied().fold(0.0, f64::max);
    (mean, max)
}

/// Per-round HiCS-FL selection time after warm-up for `n` clients, `k` per round and
/// `classes` output classes (hidden width 64): Ĥ, the Eq. 9 distances, Ward clustering and
/// the draws. Returns (mean ms, max ms) over `rounds` rounds.
pub fn hics_selection_time(n: usize, k: usize, classes: usize, rounds: usize) -> (f64, f64) {
    use crate::select::{Feedback, RoundContext, Selector, Setup, hics::Hics};
    use rand::Rng as _;
    let mut s = Hics::new(crate::config::HicsConfig {
        entropy_report: false,
        ..crate::config::HicsConfig::default()
    });
    s.setup(&Setup {
        sizes: vec![600; n],
        weights: vec![1.0 / n as f64; n],
        per_round: k,
        rounds: rounds + n,
        num_params: 1,
        classes,
        oracle_label_histograms: None,
        oracle_features: None,
    });
    let mut rng = stream(0, Purpose::Strategy, 0, 0);
    let all: Vec<usize> = (0..n).collect();
    let mut times = Vec::with_capacity(rounds);
    let mut t = 0;
    while times.len() < rounds {
        let ctx = RoundContext {
            round: t,
            available: &all,
            budget: k,
        };
        let warm = t < n.div_ceil(k);
        let started = Instant::now();
        let sel = s
            .select(&ctx, &mut NoReports, &mut rng)
            .expect("no reports needed");
        if !warm {
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
        let updates: Vec<Vec<f32>> = sel
            .clients
            .iter()
            .map(|_| {
                (0..classes * 65)
                    .map(|_| rng.random::<f32>() * 0.01)
                    .collect()
            })
            .collect();
        s.observe(&Feedback {
            round: t,
            selected: &sel.clients,
            train_losses: &vec![0.0; sel.clients.len()],
            updates: Some(&updates),
        });
        t += 1;
    }
    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
    (mean, times.iter().copied().fold(0.0, f64::max))
}
