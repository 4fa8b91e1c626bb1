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

/// A seed model's training step as `fedsel bench` times it: a name, the architecture,
/// random data shaped as its dataset, and the batch size of its configs.
pub type StepCase = (&'static str, Box<dyn Architecture>, Dataset, usize);

/// The steps `fedsel bench` times, one per seed model (and the logistic regression),
/// in its order; `examples/step_profile` picks one of them by its name's first word.
pub fn seed_steps() -> Vec<StepCase> {
    use crate::model::{
        cnn_cifar::CnnCifar, cnn_fmnist::CnnFmnist, cnn_hics_code::CnnHicsCode, logreg::LogReg,
        lstm::CharLstm, mlp::Mlp,
    };
    vec![
        (
            "logreg 60->10",
            Box::new(LogReg {
                inputs: 60,
                classes: 10,
            }),
            random_dataset(&[60], None, 640, 10),
            10,
        ),
        (
            "mlp 784-64-30-10",
            Box::new(Mlp {
                inputs: 784,
                classes: 10,
                dropout: 0.5,
            }),
            random_dataset(&[1, 28, 28], None, 640, 10),
            64,
        ),
        (
            "cnn_fmnist",
            Box::new(CnnFmnist {
                classes: 10,
                hidden: Some(512),
            }),
            random_dataset(&[1, 28, 28], None, 640, 10),
            64,
        ),
        (
            "cnn_hics",
            Box::new(CnnFmnist {
                classes: 10,
                hidden: None,
            }),
            random_dataset(&[1, 28, 28], None, 640, 10),
            64,
        ),
        (
            "cnn_hics_code",
            Box::new(CnnHicsCode { classes: 10 }),
            random_dataset(&[1, 28, 28], None, 640, 10),
            64,
        ),
        (
            "cnn_cifar",
            Box::new(CnnCifar { classes: 10 }),
            random_dataset(&[3, 32, 32], None, 500, 10),
            50,
        ),
        (
            "char_lstm",
            Box::new(CharLstm {
                vocab: 80,
                embed: 8,
                hidden: 256,
            }),
            random_dataset(&[], Some(80), 100, 80),
            10,
        ),
    ]
}

/// Median time of one SGD step at `batch` (plain SGD at lr 0.01, the PyTorch references'
/// optimizer and the seed configs' default), over `reps` timed runs of `steps` steps after
/// a warm-up, and the floating-point operations of one step, counted during the warm-up
/// in the fused paths' matrix products (2·m·n·k each; the elementwise work around them
/// is left out). Zero FLOPs for an architecture trained through burn's ops, which are
/// not counted.
///
/// The steps run on a thread of rayon's pool, as the engine runs a client's training
/// (inside its round's scope): from a thread outside the pool, every split a step hands
/// to rayon would wait for a worker to wake and for the result to come back, which at
/// the MLP's 0.1 ms a step cost more than the step's products.
pub fn step_time_and_flops(
    arch: &dyn Architecture,
    data: &Dataset,
    batch: usize,
    steps: usize,
    reps: usize,
    device: &Device,
) -> (Duration, u64) {
    let timed = timed_steps(&[arch], data, batch, steps, reps, 1, false, device)[0];
    (timed.step, timed.flops)
}

/// A step timed side by side ([`side_by_side_step_time`]).
#[derive(Debug, Clone, Copy)]
pub struct SideBySide {
    /// Wall time per step: a run's wall time over the steps of all its clients.
    pub step: Duration,
    /// The share of the cores' time spent in the step's counted matrix products, from
    /// one more run with the products timed: what a step's fraction of the FMA peak is
    /// bounded by when the products themselves run at the peak. The rest is the work
    /// around them (elementwise passes, copies, packing, waiting).
    pub products_share: f64,
}

/// Time per step when every thread of rayon's pool trains its own client side by side,
/// as the engine trains a round's clients (a round of FedCor's FMNIST runs five on two
/// cores): the wall time of `reps` runs of `threads` concurrent trainings of `steps`
/// steps, divided by `threads · steps`, the median. The machine's throughput in steps,
/// where [`step_time_and_flops`] is one step's latency: a step whose products are too
/// small to spread over every core still fills them when each core has its own.
pub fn side_by_side_step_time(
    arch: &dyn Architecture,
    data: &Dataset,
    batch: usize,
    steps: usize,
    reps: usize,
    device: &Device,
) -> SideBySide {
    let copies = rayon::current_num_threads();
    let timed = timed_steps(&[arch], data, batch, steps, reps, copies, true, device)[0];
    SideBySide {
        step: timed.step,
        products_share: timed.products_share.expect("the share was asked for"),
    }
}

/// `copies` trainings of `t` from `p` on `idx` side by side, each with its own stream.
fn train_side_by_side(t: &Trainer<'_>, p: &[f32], idx: &[usize], copies: usize) {
    rayon::scope(|s| {
        for c in 0..copies {
            s.spawn(move |_| {
                let mut rng = stream(0, Purpose::Training, 0, c as u64);
                t.train(p, idx, 0.01, &mut rng, None);
            });
        }
    });
}

/// Median time of one SGD step of each architecture, as [`step_time_and_flops`], with the
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
    timed_steps(archs, data, batch, steps, reps, 1, false, device)
        .into_iter()
        .map(|t| t.step)
        .collect()
}

/// One architecture's figures from [`timed_steps`].
#[derive(Debug, Clone, Copy)]
struct Timed {
    /// The median time per step.
    step: Duration,
    /// FLOPs in the products of one step.
    flops: u64,
    /// The share of the cores' time in products, from one more run with them timed
    /// ([`SideBySide::products_share`]), where it was asked for.
    products_share: Option<f64>,
}

/// [`step_times`] with each architecture's FLOPs per step, as [`step_time_and_flops`];
/// each timed run trains `copies` clients side by side, each with its own stream, and
/// its time is divided by `copies · steps`. With `share_of_products`, one more run of
/// each architecture times its products.
#[allow(clippy::too_many_arguments)]
fn timed_steps(
    archs: &[&dyn Architecture],
    data: &Dataset,
    batch: usize,
    steps: usize,
    reps: usize,
    copies: usize,
    share_of_products: bool,
    device: &Device,
) -> Vec<Timed> {
    let cfg = TrainConfig {
        work: LocalWork::Steps(steps),
        batch_size: batch,
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
    let train = |t: &Trainer<'_>, p: &[f32]| train_side_by_side(t, p, &idx, copies);
    let mut times = vec![Vec::with_capacity(reps); archs.len()];
    let (flops, shares) = rayon::scope(|_| {
        let flops: Vec<u64> = trainers
            .iter()
            .zip(&params)
            .map(|(t, p)| {
                let before = crate::model::matmul::flops_counted();
                let mut rng = stream(0, Purpose::Training, 0, 0);
                t.train(p, &idx, 0.01, &mut rng, None);
                (crate::model::matmul::flops_counted() - before) / steps as u64
            })
            .collect();
        for (t, p) in trainers.iter().zip(&params) {
            train(t, p);
        }
        for _ in 0..reps {
            for ((t, p), out) in trainers.iter().zip(&params).zip(&mut times) {
                let started = Instant::now();
                train(t, p);
                out.push(started.elapsed() / (copies * steps) as u32);
            }
        }
        let share = |(t, p): (&Trainer<'_>, &Vec<f32>)| {
            crate::model::matmul::time_products(true);
            let before = crate::model::matmul::product_ns();
            let started = Instant::now();
            train(t, p);
            let wall = started.elapsed();
            let spent = crate::model::matmul::product_ns() - before;
            crate::model::matmul::time_products(false);
            spent as f64 / (wall.as_nanos() as f64 * copies as f64)
        };
        let shares: Vec<Option<f64>> = trainers
            .iter()
            .zip(&params)
            .map(|tp| share_of_products.then(|| share(tp)))
            .collect();
        (flops, shares)
    });
    times
        .into_iter()
        .zip(flops)
        .zip(shares)
        .map(|((mut t, flops), products_share)| {
            t.sort();
            Timed {
                step: t[reps / 2],
                flops,
                products_share,
            }
        })
        .collect()
}

/// What the fused paths dispatch to on this CPU.
#[derive(Debug, Clone, Copy)]
pub struct Kernels {
    /// The instruction set the CNN glue loops (im2col, col2im, ReLU, pooling, sums) run.
    pub glue: &'static str,
    /// The `gemm` kernels the matrix products run.
    pub gemm: &'static str,
}

/// The kernels chosen at run time on this CPU.
pub fn kernels() -> Kernels {
    Kernels {
        glue: crate::cpu::isa().name(),
        gemm: crate::model::matmul::gemm_isa(),
    }
}

/// The CPU's arithmetic peak, measured: the widest fused multiply-add the CPU has, run
/// as twelve independent chains (enough to fill two FMA ports of latency 4) on one
/// thread, the best of several short runs.
#[derive(Debug, Clone, Copy)]
pub struct Peak {
    /// f32 lanes of the FMA measured (16 for AVX-512, 8 for AVX2, 4 for SSE2 mul+add).
    pub lanes: usize,
    /// Measured f32 FLOP/s of one core (an FMA counts as two).
    pub per_core: f64,
    /// The nominal clock in GHz from /proc/cpuinfo's first "cpu MHz", when there is one.
    pub nominal_ghz: Option<f64>,
}

impl Peak {
    /// FMAs per cycle per core at the nominal clock: the CPU's FMA ports if the core ran
    /// at that clock (on a shared or boosting core, only an estimate).
    pub fn fma_per_cycle(&self) -> Option<f64> {
        self.nominal_ghz
            .map(|ghz| self.per_core / (2.0 * self.lanes as f64 * ghz * 1e9))
    }
}

/// Chains of FMAs of [`Peak`]'s measurement.
const CHAINS: usize = 12;

/// Runs `iters` rounds of [`CHAINS`] independent `a = a·b + c` on 16-lane vectors.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn fma_chains_512(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_set1_ps(1.0); CHAINS];
    let b = _mm512_set1_ps(std::hint::black_box(0.999_999));
    let c = _mm512_set1_ps(std::hint::black_box(1e-7));
    for _ in 0..iters {
        for a in &mut acc {
            *a = _mm512_fmadd_ps(*a, b, c);
        }
    }
    acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
}

/// As [`fma_chains_512`], on 8-lane vectors.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn fma_chains_256(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_set1_ps(1.0); CHAINS];
    let b = _mm256_set1_ps(std::hint::black_box(0.999_999));
    let c = _mm256_set1_ps(std::hint::black_box(1e-7));
    for _ in 0..iters {
        for a in &mut acc {
            *a = _mm256_fmadd_ps(*a, b, c);
        }
    }
    let mut out = [0.0f32; 8];
    for a in acc {
        let mut lanes = [0.0f32; 8];
        // SAFETY: `lanes` holds 8 f32.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), a) };
        for (o, l) in out.iter_mut().zip(lanes) {
            *o += l;
        }
    }
    out.iter().sum()
}

/// As [`fma_chains_512`], on 4-lane arrays of separate multiplies and adds, which the
/// compiler keeps in SSE2 registers.
fn mul_add_chains_128(iters: u64) -> f32 {
    let mut acc = [[1.0f32; 4]; CHAINS];
    let b = std::hint::black_box(0.999_999f32);
    let c = std::hint::black_box(1e-7f32);
    for _ in 0..iters {
        for a in &mut acc {
            for v in a.iter_mut() {
                *v = *v * b + c;
            }
        }
    }
    acc.iter().flatten().sum()
}

/// Measures [`Peak`]: each of five runs of 2²⁰ rounds takes a few milliseconds.
pub fn peak() -> Peak {
    const ITERS: u64 = 1 << 20;
    let kernel: (usize, fn(u64) -> f32) = match crate::cpu::isa() {
        // SAFETY (both): cpu::isa found AVX-512F, or AVX2 and FMA, on this CPU.
        #[cfg(target_arch = "x86_64")]
        crate::cpu::Isa::Avx512 => (16, |n| unsafe { fma_chains_512(n) }),
        #[cfg(target_arch = "x86_64")]
        crate::cpu::Isa::Avx2 => (8, |n| unsafe { fma_chains_256(n) }),
        _ => (4, mul_add_chains_128),
    };
    let (lanes, run) = kernel;
    let best = (0..5)
        .map(|_| {
            let started = Instant::now();
            std::hint::black_box(run(std::hint::black_box(ITERS)));
            started.elapsed()
        })
        .min()
        .expect("five runs");
    let flops = (ITERS as usize * CHAINS * lanes * 2) as f64;
    Peak {
        lanes,
        per_core: flops / best.as_secs_f64(),
        nominal_ghz: nominal_ghz(),
    }
}

/// The memory bandwidth all threads reach, measured: what bounds the passes that do no
/// multiply-add the peak counts (the selectors' N × N matrices at thousands of clients,
/// a batch's activations between a CNN's products).
#[derive(Debug, Clone, Copy)]
pub struct Bandwidth {
    /// Bytes of the buffers each measure streams through.
    pub bytes: usize,
    /// Bytes per second read (every thread summing its share of one buffer).
    pub read: f64,
    /// Bytes per second moved by a copy between two buffers, the bytes read plus the
    /// bytes written (STREAM's convention; a plain store also reads its line first).
    pub copy: f64,
}

/// Measures [`Bandwidth`] over buffers of `bytes` (two of them for the copy), the best
/// of three passes each, the buffers written once before any pass so that no page is
/// faulted in during one.
pub fn bandwidth(bytes: usize) -> Bandwidth {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 14;
    let n = (bytes / 8).max(CHUNK);
    let mut src = vec![0.0f64; n];
    src.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(c, s)| s.fill(c as f64));
    let mut dst = vec![0.0f64; n];
    dst.par_chunks_mut(CHUNK).for_each(|d| d.fill(1.0));
    let best = |pass: &mut dyn FnMut()| {
        (0..3)
            .map(|_| {
                let started = Instant::now();
                pass();
                started.elapsed()
            })
            .min()
            .expect("three passes")
            .as_secs_f64()
    };
    let read = best(&mut || {
        let total: f64 = src
            .par_chunks(CHUNK)
            .map(|c| {
                let mut lanes = [0.0f64; 8];
                for v in c.chunks_exact(8) {
                    for (a, &x) in lanes.iter_mut().zip(v) {
                        *a += x;
                    }
                }
                lanes.iter().sum::<f64>()
            })
            .sum();
        std::hint::black_box(total);
    });
    let copy = best(&mut || {
        dst.par_chunks_mut(CHUNK)
            .zip(src.par_chunks(CHUNK))
            .for_each(|(d, s)| d.copy_from_slice(s));
        std::hint::black_box(&dst);
    });
    let moved = (n * 8) as f64;
    Bandwidth {
        bytes: n * 8,
        read: moved / read,
        copy: 2.0 * moved / copy,
    }
}

/// The first "cpu MHz" of /proc/cpuinfo, in GHz.
fn nominal_ghz() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("cpu MHz"))?;
    let mhz: f64 = line.split(':').nth(1)?.trim().parse().ok()?;
    Some(mhz / 1e3)
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

/// The clients of a selection benchmark: every report a selector can ask for, answered
/// from seeded draws instead of training, so that only the selector's own work is timed.
/// Client k's update and gradient are one fixed random vector per client (drawn on first
/// use), scaled by a per-call factor; losses are fresh draws per call. The time spent
/// answering is counted in `answering`, which [`selection_time`] takes off the
/// selector's: in a real run the clients do that work, not the server (at 10,000
/// clients, DivFL's request alone is 300 MB of gradients to draw and copy).
struct SyntheticClients {
    params: usize,
    classes: usize,
    calls: u64,
    vectors: Vec<Option<Vec<f32>>>,
    answering: Duration,
}

impl SyntheticClients {
    fn new(n: usize, params: usize, classes: usize) -> Self {
        Self {
            params,
            classes,
            calls: 0,
            vectors: vec![None; n],
            answering: Duration::ZERO,
        }
    }

    /// `answer`'s result, its time added to `answering`.
    fn timed<T>(&mut self, answer: impl FnOnce(&mut Self) -> T) -> T {
        let started = Instant::now();
        let out = answer(self);
        self.answering += started.elapsed();
        out
    }

    fn losses(&mut self, clients: &[usize]) -> Vec<f64> {
        use rand::Rng as _;
        self.calls += 1;
        let mut rng = stream(0, Purpose::Probe, self.calls, 0);
        clients.iter().map(|_| 0.5 + rng.random::<f64>()).collect()
    }

    fn vectors(&mut self, clients: &[usize], len: usize) -> Vec<Vec<f32>> {
        use rand::Rng as _;
        self.calls += 1;
        let scale = 1.0 + (self.calls % 7) as f32 * 0.01;
        let params = self.params;
        clients
            .iter()
            .map(|&k| {
                let v = self.vectors[k].get_or_insert_with(|| {
                    let mut rng = stream(0, Purpose::Strategy, 0, k as u64);
                    (0..params).map(|_| rng.random::<f32>() - 0.5).collect()
                });
                v.iter().take(len).map(|x| x * scale).collect()
            })
            .collect()
    }
}

impl crate::select::ClientQuery for SyntheticClients {
    fn holdout_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>, crate::error::Error> {
        Ok(self.timed(|c| c.losses(clients)))
    }
    fn minibatch_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>, crate::error::Error> {
        Ok(self.timed(|c| c.losses(clients)))
    }
    fn probe(&mut self, _: &[usize], evaluate: &[usize]) -> Result<Vec<f64>, crate::error::Error> {
        Ok(self.timed(|c| c.losses(evaluate)))
    }
    fn advance(
        &mut self,
        _: &[usize],
        evaluate: &[usize],
    ) -> Result<Vec<f64>, crate::error::Error> {
        Ok(self.timed(|c| c.losses(evaluate)))
    }
    fn local_updates(&mut self, clients: &[usize]) -> Result<Vec<Vec<f32>>, crate::error::Error> {
        Ok(self.timed(|c| c.vectors(clients, c.params)))
    }
    fn noise_responses(
        &mut self,
        updates: &[Vec<f32>],
        _: usize,
    ) -> Result<Vec<Vec<f64>>, crate::error::Error> {
        Ok(self.timed(|c| {
            updates
                .iter()
                .map(|u| u.iter().take(c.classes).map(|&x| f64::from(x)).collect())
                .collect()
        }))
    }
    fn secure_gram(&mut self, clients: &[usize]) -> Result<Vec<Vec<f64>>, crate::error::Error> {
        Ok(self.timed(|c| {
            let f = c.vectors(clients, c.classes);
            f.iter()
                .map(|a| {
                    f.iter()
                        .map(|b| a.iter().zip(b).map(|(x, y)| f64::from(x * y)).sum())
                        .collect()
                })
                .collect()
        }))
    }
    fn gradients(
        &mut self,
        clients: &[usize],
        _: crate::select::GradientScope,
    ) -> Result<Vec<Vec<f32>>, crate::error::Error> {
        Ok(self.timed(|c| c.vectors(clients, c.params)))
    }
}

/// The workload of a selection benchmark: issue 23's, Fashion-MNIST split iid over `n`
/// clients with logistic regression (7,850 parameters, 10 classes, the whole model as
/// output layer), `k` clients a round, every client available.
#[derive(Debug, Clone, Copy)]
pub struct SelectionWorkload {
    /// Clients.
    pub n: usize,
    /// Clients per round.
    pub k: usize,
    /// Rounds timed, after the strategy's warm-up (FedCor's R_w + 1 rounds, HiCS-FL's
    /// ⌈n/k⌉ rounds of its first sweep, and above 1,000 clients one more, one round for
    /// the rest).
    pub rounds: usize,
}

/// One strategy's timing at one workload.
#[derive(Debug, Clone, Copy)]
pub struct SelectionTime {
    /// Seconds of the setup and initial phase (FedGS's graph, before round 0).
    pub setup_s: f64,
    /// Mean milliseconds per timed round: `select` plus `observe`.
    pub mean_ms: f64,
    /// Slowest timed round, in milliseconds.
    pub max_ms: f64,
}

/// Times `strategy` (with its default options) on `w`: its setup, its warm-up untimed,
/// then `w.rounds` rounds of `select` and `observe`. The reports it asks for come from
/// [`SyntheticClients`], so client work is not in the figure (DivFL's n gradients a
/// round, for one, are a pass over every client's data in a real run).
pub fn selection_time(
    strategy: &str,
    w: SelectionWorkload,
) -> Result<SelectionTime, crate::error::Error> {
    use crate::select::{Feedback, RoundContext, Setup, UpdateKind};
    let (params, classes) = (7850, 10);
    // "divfl-stale": DivFL under the refresh of the DivFL code, the default being "ideal".
    let cfg = match strategy {
        "divfl-stale" => crate::config::SelectionConfig {
            strategy: "divfl".into(),
            divfl: crate::select::divfl::DivflConfig {
                refresh: crate::select::divfl::DivflRefresh::Stale,
                ..Default::default()
            },
            ..Default::default()
        },
        _ => crate::config::SelectionConfig {
            strategy: strategy.into(),
            ..Default::default()
        },
    };
    let mut s = crate::select::build(&cfg)?;
    let needs = s.needs();
    let n = w.n;
    // Two labels per client, as FedGS's FMNIST setting, for the oracle's features.
    let histograms: Vec<Vec<usize>> = (0..n)
        .map(|k| {
            let mut h = vec![0; classes];
            h[k % classes] += 30;
            h[(k / classes + k) % classes] += 30;
            h
        })
        .collect();
    let size = (60_000 / n).max(1);
    let started = Instant::now();
    s.setup(&Setup {
        sizes: vec![size; n],
        weights: vec![1.0 / n as f64; n],
        per_round: w.k,
        rounds: w.rounds + n,
        num_params: params,
        classes,
        oracle_label_histograms: needs.oracle_label_histograms.then(|| histograms.clone()),
        oracle_features: needs.oracle_features.then(|| {
            histograms
                .iter()
                .map(|h| h.iter().map(|&c| c as f64 / 60.0).collect())
                .collect()
        }),
        durations: None,
    });
    let mut clients = SyntheticClients::new(n, params, classes);
    s.initial_phase(&mut clients)?;
    let setup_s = started.elapsed().as_secs_f64();
    let warmup = match strategy {
        // Above 1,000 clients the first clustering after the sweep is the exact Θ(N³) one
        // that the kept distances start from: part of the warm-up, as FedCor's R_w + 1.
        "hics" => n.div_ceil(w.k) + usize::from(n > crate::select::ward::EXACT_UP_TO),
        "fedcor" | "fedgp" => cfg.fedcor.warmup + 1,
        _ => 1,
    };
    let all: Vec<usize> = (0..n).collect();
    let update_len = match needs.updates {
        UpdateKind::None => 0,
        UpdateKind::Full | UpdateKind::OutputLayer => params,
    };
    let mut times = Vec::with_capacity(w.rounds);
    for t in 0..warmup + w.rounds {
        let mut rng = stream(0, Purpose::Selection, t as u64, 0);
        let ctx = RoundContext {
            round: t,
            available: &all,
            budget: w.k,
            clock_s: None,
        };
        let answered = clients.answering;
        let began = Instant::now();
        let sel = s.select(&ctx, &mut clients, &mut rng)?;
        let mut elapsed = began.elapsed() - (clients.answering - answered);
        let updates = (update_len > 0).then(|| clients.vectors(&sel.clients, update_len));
        let losses = clients.losses(&sel.clients);
        // Round trips that differ by client (1 to 100 s), so that a system-aware strategy
        // pays for its duration bookkeeping as it would under a clock.
        let durations: Vec<f64> = sel
            .clients
            .iter()
            .map(|&k| 1.0 + (k % 100) as f64)
            .collect();
        let began = Instant::now();
        s.observe(&Feedback {
            round: t,
            selected: &sel.clients,
            train_losses: &losses,
            updates: updates.as_deref(),
            durations: Some(&durations),
            dropped: None,
        });
        elapsed += began.elapsed();
        if let Some(e) = s.take_failure() {
            return Err(e);
        }
        if t >= warmup {
            times.push(elapsed.as_secs_f64() * 1e3);
        }
    }
    Ok(SelectionTime {
        setup_s,
        mean_ms: times.iter().sum::<f64>() / times.len().max(1) as f64,
        max_ms: times.iter().copied().fold(0.0, f64::max),
    })
}

/// Wall time per round of one workload with and without the virtual clock.
#[derive(Debug, Clone, Copy)]
pub struct ClockOverhead {
    /// Median milliseconds per round without `[system]`.
    pub plain_ms: f64,
    /// Median milliseconds per round with log-normal devices and `wait_all` rounds: the
    /// same trainings as the plain run, plus the clock's bookkeeping.
    pub wait_all_ms: f64,
    /// Median milliseconds per round with log-normal devices and over-commitment (0.3),
    /// which trains ⌈1.3·K⌉ clients a round instead of K.
    pub overcommit_ms: f64,
    /// The median over the repetitions of wait_all's median over the plain run's median,
    /// each pair run back to back: steadier than the ratio of the overall medians when
    /// the machine's load drifts.
    pub paired_ratio: f64,
    /// Clients trained per round without over-commitment, and with it.
    pub trained: (usize, usize),
}

/// Times `config`'s rounds (its own, which must have no `[system]`) as given, with
/// log-normal devices under `wait_all`, and under over-commitment: `reps` runs of each,
/// alternating, so that a loaded machine slows all three alike; each figure is the median
/// over every round of its runs (a round's wall time is the difference of successive
/// rounds' `elapsed_s`).
pub fn clock_overhead(
    config: &crate::config::Config,
    data_dir: &std::path::Path,
    reps: usize,
) -> crate::error::Result<ClockOverhead> {
    use crate::engine::{self, Experiment, Observer, RoundRecord};
    use crate::system::{RoundPolicy, SystemConfig, SystemKind};

    /// Each round's wall seconds, and the clients it trained.
    #[derive(Default)]
    struct Rounds(Vec<f64>, f64, usize);
    impl Observer for Rounds {
        fn on_round(&mut self, r: &RoundRecord) -> crate::error::Result<()> {
            self.0.push(r.elapsed_s - self.1);
            self.1 = r.elapsed_s;
            self.2 = r.n_selected;
            Ok(())
        }
    }
    let with = |round| -> crate::error::Result<Experiment> {
        let mut c = config.clone();
        c.system = Some(SystemConfig {
            kind: SystemKind::Lognormal,
            round,
            ..SystemConfig::default()
        });
        Experiment::prepare(c, data_dir)
    };
    let exps = [
        Experiment::prepare(config.clone(), data_dir)?,
        with(RoundPolicy::WaitAll)?,
        with(RoundPolicy::Overcommit { overcommit: 0.3 })?,
    ];
    let median = |t: &[f64]| {
        let mut t = t.to_vec();
        t.sort_by(f64::total_cmp);
        t.get(t.len() / 2).copied().unwrap_or(0.0)
    };
    let mut times: [Vec<f64>; 3] = Default::default();
    let mut trained = [0; 3];
    let mut ratios = Vec::with_capacity(reps);
    for _ in 0..reps {
        let mut medians = [0.0; 3];
        for (i, exp) in exps.iter().enumerate() {
            let mut r = Rounds::default();
            engine::run(exp, &mut r)?;
            medians[i] = median(&r.0);
            times[i].extend(r.0);
            trained[i] = r.2;
        }
        ratios.push(medians[1] / medians[0]);
    }
    let [plain, wait_all, overcommit] = times.map(|t| median(&t) * 1e3);
    Ok(ClockOverhead {
        plain_ms: plain,
        wait_all_ms: wait_all,
        overcommit_ms: overcommit,
        paired_ratio: median(&ratios),
        trained: (trained[0], trained[2]),
    })
}

/// How a strategy's selection grows with the clients N (K picked a round, P parameters
/// of an update, d pow-d's candidates), as `fedsel bench` prints it beside the times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scaling {
    /// Time of a round (select and observe), in O(·).
    pub round: &'static str,
    /// N × N matrices of f64 held at once at the peak (0: memory linear in N).
    pub matrices: usize,
    /// The power of N the warm-up and rounds grow with, up to logarithms.
    pub power: i32,
    /// The power of N the setup grows with (FedGS's graph: 3).
    pub setup_power: i32,
}

/// Memory the selection benchmark lets a strategy's N × N matrices take: above it a size
/// is skipped, with the reason printed.
pub const MATRIX_BYTES: f64 = 16e9;

impl Scaling {
    /// Bytes of the strategy's N × N matrices at `n` clients.
    pub fn matrix_bytes(&self, n: usize) -> f64 {
        self.matrices as f64 * (n as f64).powi(2) * 8.0
    }
}

/// A run's round taken apart ([`round_parts`]), in ms a round, each the mean over the
/// run's rounds.
#[derive(Debug, Clone, Copy)]
pub struct RoundParts {
    /// The whole round: the run's wall time over its rounds.
    pub round_ms: f64,
    /// The round's local trainings alone: the clients the run selected that round, from
    /// the initial model, spawned as the engine spawns them.
    pub training_ms: f64,
    /// The test-set evaluation alone (in the run it goes beside the next round's
    /// training).
    pub evaluation_ms: f64,
}

impl RoundParts {
    /// What the round spends outside its trainings and its evaluation: selection,
    /// aggregation and bookkeeping, less what the evaluation's overlap with training saves.
    pub fn rest_ms(&self) -> f64 {
        self.round_ms - self.training_ms - self.evaluation_ms
    }
}

/// Runs `config` (it must evaluate every round) and then times its parts alone: each
/// round's trainings of the clients it selected, and one test evaluation a round.
pub fn round_parts(
    config: &crate::config::Config,
    data_dir: &std::path::Path,
) -> crate::error::Result<RoundParts> {
    use crate::engine::{self, Experiment, Observer, RoundRecord};

    /// Each round's selected clients.
    struct Selected(Vec<Vec<usize>>);
    impl Observer for Selected {
        fn on_round(&mut self, r: &RoundRecord) -> crate::error::Result<()> {
            self.0.push(r.selected.clone());
            Ok(())
        }
    }
    let exp = Experiment::prepare(config.clone(), data_dir)?;
    let mut selected = Selected(Vec::new());
    let summary = engine::run(&exp, &mut selected)?;
    let rounds = selected.0.len().max(1) as f64;
    let trainer = exp.trainer();
    let global = exp.layout.init(config.seed);
    let (mut training, mut evaluation) = (Duration::ZERO, Duration::ZERO);
    for (t, clients) in selected.0.iter().enumerate() {
        let started = Instant::now();
        rayon::scope_fifo(|s| {
            for &k in clients {
                let (trainer, global, own) = (&trainer, &global, &exp.clients[k].train);
                s.spawn_fifo(move |_| {
                    let mut rng = stream(config.seed, Purpose::Training, t as u64, k as u64);
                    std::hint::black_box(trainer.train(
                        global,
                        own,
                        config.train.lr,
                        &mut rng,
                        None,
                    ));
                });
            }
        });
        training += started.elapsed();
        let started = Instant::now();
        std::hint::black_box(exp.test(&global));
        evaluation += started.elapsed();
    }
    Ok(RoundParts {
        round_ms: summary.wall_s * 1e3 / rounds,
        training_ms: training.as_secs_f64() * 1e3 / rounds,
        evaluation_ms: evaluation.as_secs_f64() * 1e3 / rounds,
    })
}

/// [`Scaling`] of each of [`STRATEGIES`] (None for another name).
pub fn scaling(strategy: &str) -> Option<Scaling> {
    let (round, matrices, power) = match strategy {
        "uniform" => ("N", 0, 1),
        "md" => ("N + K log N", 0, 1),
        "powd" | "cpowd" | "rpowd" => ("N + d log d", 0, 1),
        "afl" | "f3ast" | "oort" | "fedcs" | "cs1" | "tifl" => ("N log N", 0, 1),
        "fedcor" | "fedgp" => ("K N (d + K)", 0, 1),
        "cs2" => ("N³ to 1,000 clients, then K N² + K N P", 4, 3),
        "hics" => ("N³ to 1,000 clients, then K N² + K N P", 4, 3),
        "divfl" => ("N² P to 1,000 clients, then N P + N² m", 1, 2),
        "divfl-stale" => ("K N P + K N²", 1, 2),
        "fedgs" => ("N² (setup N³)", 2, 2),
        // A registered strategy (one written by a user): its growth is its own, taken as
        // linear for the skip prediction.
        _ if crate::select::registry::get(strategy).is_some() => ("its own", 0, 1),
        _ => return None,
    };
    Some(Scaling {
        round,
        matrices,
        power,
        setup_power: if strategy == "fedgs" { 3 } else { power },
    })
}

impl Scaling {
    /// Seconds a measurement at `n` clients should take, from one at `m` that took
    /// `total` seconds, `setup` of them in the setup.
    pub fn predict(&self, m: usize, setup: f64, total: f64, n: usize) -> f64 {
        let r = n as f64 / m as f64;
        setup * r.powi(self.setup_power) + (total - setup).max(0.0) * r.powi(self.power)
    }
}

/// Every strategy [`selection_time`] knows, in the order `fedsel bench` prints them;
/// `divfl-stale` is DivFL under its stale refresh.
pub const STRATEGIES: &[&str] = &[
    "uniform",
    "md",
    "powd",
    "cpowd",
    "rpowd",
    "afl",
    "f3ast",
    "fedcor",
    "fedgp",
    "cs1",
    "cs2",
    "hics",
    "divfl",
    "divfl-stale",
    "fedgs",
    "oort",
    "fedcs",
    "tifl",
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The side-by-side figures of the MLP: a step's time, and a share of the cores' time
    /// in its products that is more than none and at most all of it, from a timed run
    /// that adds to the product time.
    #[test]
    fn the_side_by_side_step_reports_its_products_share() {
        let _alone = crate::model::matmul::TIMING_TESTS
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mlp = crate::model::mlp::Mlp {
            inputs: 784,
            classes: 10,
            dropout: 0.5,
        };
        let data = random_dataset(&[1, 28, 28], None, 128, 10);
        let side = side_by_side_step_time(&mlp, &data, 64, 4, 3, &Device::flex());
        assert!(side.step > Duration::ZERO);
        assert!(
            side.products_share > 0.0 && side.products_share <= 1.0,
            "share {}",
            side.products_share
        );
        let before = crate::model::matmul::product_ns();
        side_by_side_step_time(&mlp, &data, 64, 1, 1, &Device::flex());
        assert!(crate::model::matmul::product_ns() > before);
    }

    /// The stand-in clients answer whatever each strategy asks for, and a selector's
    /// rounds are timed after its warm-up.
    #[test]
    fn every_strategy_runs_on_the_stand_in_clients() {
        let w = SelectionWorkload {
            n: 40,
            k: 4,
            rounds: 2,
        };
        for s in STRATEGIES {
            let t = selection_time(s, w).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert!(t.mean_ms >= 0.0 && t.max_ms >= t.mean_ms, "{s}: {t:?}");
            assert!(scaling(s).is_some(), "{s}");
        }
        assert_eq!(scaling("nope"), None);
        // FedGS's two N × N matrices: 160 GB at 100,000 clients, 1.6 GB at 10,000.
        let fedgs = scaling("fedgs").unwrap();
        assert_eq!(fedgs.matrix_bytes(100_000), 1.6e11);
        assert!(fedgs.matrix_bytes(10_000) < MATRIX_BYTES);
        assert!(selection_time("nope", w).is_err());
    }

    /// The clock benchmark runs the three variants of a workload; over-commitment trains
    /// ⌈1.3 · 6⌉ = 8 of the default synthetic federation's clients where the others train 6.
    #[test]
    fn the_clock_benchmark_times_all_three_variants() {
        let config = crate::config::Config {
            rounds: 3,
            ..Default::default()
        };
        let dir = crate::data::locate::data_dir(None, None);
        let t = clock_overhead(&config, &dir, 1).unwrap();
        assert_eq!(t.trained, (6, 8));
        assert!(
            t.plain_ms > 0.0 && t.wait_all_ms > 0.0 && t.overcommit_ms > 0.0,
            "{t:?}"
        );
        assert!(t.paired_ratio > 0.0, "{t:?}");
    }
}
