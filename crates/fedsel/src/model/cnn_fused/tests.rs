//! The fused CNN path against burn's autodiff, and its determinism.

use burn::tensor::activation::relu as burn_relu;
use burn::tensor::module::{conv2d, max_pool2d};
use burn::tensor::ops::{ConvOptions, MaxPoolOptions};
use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::Rng as _;

use super::*;
use crate::bench::random_dataset;
use crate::data::Dataset;
use crate::model::cnn_cifar::CnnCifar;
use crate::model::cnn_fmnist::CnnFmnist;
use crate::model::{
    Architecture, AutodiffOnly, Batch, ParamLayout, batch, cross_entropy, dense_rows,
};
use crate::rng::{Purpose, stream};
use crate::train::evaluate;

/// The flat parameters split per tensor, in the order of the models' `params()`.
fn split(net: &Net, flat: &[f32], device: &Device) -> Vec<Tensor<1>> {
    let plan = net.plan();
    let mut bounds = Vec::new();
    for (i, s) in net.stages.iter().enumerate() {
        if let Stage::Conv { cout, k, .. } = *s {
            let at = plan.conv_at[i];
            let w = cout * plan.shapes[i][0] * k * k;
            bounds.extend([at..at + w, at + w..at + w + cout]);
        }
    }
    for (&(wa, ba), &width) in plan.dense_at.iter().zip(&net.dense) {
        bounds.extend([wa..ba, ba..ba + width]);
    }
    bounds
        .into_iter()
        .map(|r| {
            let n = r.len();
            Tensor::<1>::from_data(TensorData::new(flat[r].to_vec(), [n]), device)
        })
        .collect()
}

/// The logits of `net` by burn's ops, stage by stage.
fn burn_forward(net: &Net, p: &[Tensor<1>], x: Tensor<2>) -> Tensor<2> {
    let b = x.dims()[0];
    let [c, h, w] = net.input;
    let mut t = x.reshape([b, c, h, w]);
    let mut next = 0;
    for s in net.stages {
        t = match *s {
            Stage::Conv { cout, k, pad } => {
                let cin = t.dims()[1];
                let weight = p[next].clone().reshape([cout, cin, k, k]);
                let bias = p[next + 1].clone();
                next += 2;
                conv2d(
                    t,
                    weight,
                    Some(bias),
                    ConvOptions::new([1, 1], [pad, pad], [1, 1], 1),
                )
            }
            Stage::Relu => burn_relu(t),
            Stage::Pool => max_pool2d(t, MaxPoolOptions::new([2, 2])),
        };
    }
    let mut fan_in = net.features();
    let mut a = t.reshape([b, fan_in]);
    for (l, &width) in net.dense.iter().enumerate() {
        let z = a.matmul(p[next].clone().reshape([fan_in, width]))
            + p[next + 1].clone().unsqueeze::<2>();
        next += 2;
        a = if l + 1 < net.dense.len() {
            burn_relu(z)
        } else {
            z
        };
        fan_in = width;
    }
    a
}

/// Loss and flat gradient by burn's autodiff through `forward`.
fn autodiff(
    params: Vec<Tensor<1>>,
    data: &Dataset,
    idx: &[usize],
    forward: impl Fn(&[Tensor<1>], Batch) -> Tensor<2>,
) -> (f32, Vec<f32>) {
    let device = Device::flex();
    let ad: Vec<Tensor<1>> = params
        .into_iter()
        .map(|p| p.autodiff().require_grad())
        .collect();
    let (x, y) = batch(data, idx, &device);
    let loss = cross_entropy(forward(&ad, x), y);
    let grads = loss.backward();
    let g: Vec<f32> = ad
        .iter()
        .flat_map(|p| {
            p.grad(&grads)
                .unwrap()
                .into_data()
                .try_into_vec::<f32>()
                .unwrap()
        })
        .collect();
    (loss.inner().into_scalar::<f32>(), g)
}

fn relative_error(a: &[f32], b: &[f32]) -> f64 {
    let diff: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let norm: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (diff / norm).sqrt()
}

/// Each parameter tensor's fused gradient is within 1e-4 (relative, in norm) of
/// `want`, and the losses agree to 1e-5.
fn assert_close(net: &Net, got: (f32, Vec<f32>), want: (f32, Vec<f32>)) {
    let ((loss, grad), (want_loss, want)) = (got, want);
    assert!(
        (loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
        "{loss} vs {want_loss}"
    );
    let device = Device::flex();
    let parts = |g: &[f32]| -> Vec<Vec<f32>> {
        split(net, g, &device)
            .into_iter()
            .map(|t| t.into_data().try_into_vec::<f32>().unwrap())
            .collect()
    };
    for (i, (g, w)) in parts(&grad).iter().zip(parts(&want)).enumerate() {
        assert!(w.iter().any(|&v| v != 0.0), "parameter {i} has no gradient");
        let err = relative_error(g, &w);
        assert!(err < 1e-4, "parameter {i}: relative error {err:e}");
    }
}

/// Parameters of `net` drawn uniformly from ±0.5.
fn random_params(net: &Net, seed: u64) -> Vec<f32> {
    let mut rng = stream(seed, Purpose::Init, 0, 0);
    (0..net.plan().total)
        .map(|_| rng.random_range(-0.5..0.5))
        .collect()
}

/// Odd image sizes (pools drop a row and a column), padding on a non-square image,
/// a pool before its ReLU and two dense layers.
#[test]
fn the_fused_gradient_matches_autodiff_on_small_cnns() {
    let nets = [
        Net {
            input: [2, 7, 6],
            stages: &[
                Stage::Conv {
                    cout: 3,
                    k: 3,
                    pad: 1,
                },
                Stage::Relu,
                Stage::Pool,
                Stage::Conv {
                    cout: 4,
                    k: 2,
                    pad: 0,
                },
                Stage::Pool,
                Stage::Relu,
            ],
            dense: vec![5, 3],
        },
        Net {
            input: [1, 9, 9],
            stages: &[
                Stage::Conv {
                    cout: 2,
                    k: 5,
                    pad: 2,
                },
                Stage::Relu,
                Stage::Pool,
            ],
            dense: vec![4],
        },
    ];
    let device = Device::flex();
    for (seed, net) in nets.iter().enumerate() {
        let classes = *net.dense.last().unwrap();
        let data = random_dataset(&net.input, None, 14, classes);
        let params = random_params(net, seed as u64);
        let idx: Vec<usize> = (0..14).step_by(2).collect();
        let (x, labels) = dense_rows(&data, &idx);
        let got = net.loss_and_gradient(&params, &x, &labels);
        let want = autodiff(split(net, &params, &device), &data, &idx, |p, x| {
            burn_forward(net, p, crate::model::dense(x))
        });
        assert_close(net, got, want);
    }
}

/// One step of a two-convolution net runs exactly the hand-counted multiply-adds
/// (2·m·n·k per product), as `fedsel bench` reports them. Image [1, 4, 4]:
/// conv 3×3 pad 1 to 2 channels ([2, 4, 4]: 9 taps × 16 pixels), pool ([2, 2, 2]),
/// conv 2×2 to 3 channels ([3, 1, 1]: 8 taps × 1 pixel), dense 3 → 2, batch 2.
#[test]
fn a_step_counts_the_hand_counted_flops() {
    let net = Net {
        input: [1, 4, 4],
        stages: &[
            Stage::Conv {
                cout: 2,
                k: 3,
                pad: 1,
            },
            Stage::Pool,
            Stage::Conv {
                cout: 3,
                k: 2,
                pad: 0,
            },
        ],
        dense: vec![2],
    };
    let per_image = 2 * 2 * 9 * 16 // conv 1 forward: W [2, 9] · col [9, 16]
        + 2 * 3 * 8 // conv 2 forward: W [3, 8] · col [8, 1]
        + 2 * 3 * 8 // conv 2 ∂W: δy [3, 1] · colᵀ [1, 8]
        + 2 * 8 * 3 // conv 2 δcol: Wᵀ [8, 3] · δy [3, 1]
        + 2 * 2 * 16 * 9; // conv 1 ∂W: δy [2, 16] · colᵀ [16, 9]; no δcol for the input
    let dense = 3 * (2 * 2 * 3 * 2); // forward a·W, ∂W = aᵀ·δz, δa = δz·Wᵀ: [2, 3]·[3, 2] each
    assert_eq!(counted_flops(&net), (2 * per_image + dense) as u64);

    // 14 × 14 = 196 output pixels: the patch matrix is padded to 208 columns
    // (`patch_stride`), and the padding's products are not counted.
    assert_eq!(patch_stride(196), 208);
    let padded = Net {
        input: [1, 14, 14],
        stages: &[Stage::Conv {
            cout: 2,
            k: 3,
            pad: 1,
        }],
        dense: vec![2],
    };
    let per_image = 2 * 2 * 9 * 196 // forward: W [2, 9] · col [9, 196]
        + 2 * 2 * 196 * 9; // ∂W: δy [2, 196] · colᵀ [196, 9]; no δcol for the input
    let dense = 3 * (2 * 2 * 392 * 2); // [2, 392]·[392, 2] and its two gradients
    assert_eq!(counted_flops(&padded), (2 * per_image + dense) as u64);
}

/// FLOPs counted in one training step of `net` on two images, on one thread.
fn counted_flops(net: &Net) -> u64 {
    let params = random_params(net, 3);
    let pixels: usize = net.input.iter().product();
    let x: Vec<f32> = (0..2 * pixels)
        .map(|i| (i % 7) as f32 * 0.1 - 0.3)
        .collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    pool.install(|| {
        let before = crate::model::matmul::flops_counted();
        net.loss_and_gradient(&params, &x, &[0, 1]);
        crate::model::matmul::flops_counted() - before
    })
}

/// Summing eight rows side by side gives each row's sequential sum bit for bit,
/// signed zeros included, with rows left over after the blocks of eight.
#[test]
fn row_sums_side_by_side_equal_sequential_sums() {
    let mut rng = stream(9, Purpose::Init, 0, 0);
    let (rows, len) = (19, 37);
    let mut g: Vec<f32> = (0..rows * len)
        .map(|_| rng.random_range(-1.0f32..1.0) * 10f32.powi(rng.random_range(-8..8)))
        .collect();
    g[3 * len..4 * len].fill(-0.0);
    g[17 * len..18 * len].fill(-0.0);
    let start: Vec<f32> = (0..rows)
        .map(|r| if r % 3 == 0 { -0.0 } else { r as f32 })
        .collect();
    let mut got = start.clone();
    add_row_sums(&mut got, &g, len);
    for (r, (&got, &s)) in got.iter().zip(&start).enumerate() {
        let want = s + g[r * len..][..len].iter().sum::<f32>();
        assert_eq!(got.to_bits(), want.to_bits(), "row {r}");
    }
}

/// The three seed models at their real shapes, against their own burn forward pass.
fn models() -> Vec<(Box<dyn Architecture>, Net, Dataset)> {
    let fmnist = |hidden| {
        let m = CnnFmnist {
            classes: 10,
            hidden,
        };
        let net = m.net();
        (
            Box::new(m) as Box<dyn Architecture>,
            net,
            random_dataset(&[1, 28, 28], None, 12, 10),
        )
    };
    let cifar = CnnCifar { classes: 10 };
    vec![
        fmnist(Some(512)),
        fmnist(None),
        (
            Box::new(cifar.clone()),
            cifar.net(),
            random_dataset(&[3, 32, 32], None, 12, 10),
        ),
    ]
}

#[test]
fn the_fused_gradient_matches_autodiff_on_the_seed_models() {
    let device = Device::flex();
    for (seed, (arch, net, data)) in models().into_iter().enumerate() {
        let layout = ParamLayout::of(arch.as_ref());
        assert_eq!(layout.total, net.plan().total, "{}", arch.name());
        let params = layout.init(seed as u64);
        let idx = [1, 4, 5, 7, 10];
        let got = arch
            .loss_gradient()
            .expect("the CNNs have a fused gradient")
            .loss_and_gradient(&params, &data, &idx);
        let want = autodiff(layout.to_tensors(&params, &device), &data, &idx, |p, x| {
            arch.forward(p, x, None)
        });
        assert_close(&net, got, want);
    }
}

/// Batches of 9 cut into chunks of 4, 4 and 1; the dense products split into blocks.
#[test]
fn the_fused_gradient_does_not_depend_on_the_thread_count() {
    for (arch, _, data) in models() {
        let params = ParamLayout::of(arch.as_ref()).init(5);
        let idx: Vec<usize> = (0..9).collect();
        let f = arch
            .loss_gradient()
            .expect("the CNNs have a fused gradient");
        let run = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| f.loss_and_gradient(&params, &data, &idx))
        };
        let (loss, grad) = run(1);
        for threads in [2, 3, 4] {
            let (l, g) = run(threads);
            assert_eq!(l.to_bits(), loss.to_bits(), "{} {threads}", arch.name());
            assert!(
                g.iter().zip(&grad).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{} {threads} threads",
                arch.name()
            );
        }
    }
}

/// The SSE2, AVX2 and AVX-512 copies of the loops around the products (those this CPU
/// runs) give the same loss and gradient bits: results may differ across CPU kinds only
/// through `gemm`'s kernels (docs/reliability.md).
#[test]
fn every_glue_copy_gives_the_same_bits() {
    let widest = glue_isa();
    let isas: Vec<Isa> = [Isa::Baseline, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&i| match widest {
            Isa::Avx512 => true,
            Isa::Avx2 => i != Isa::Avx512,
            Isa::Baseline => i == Isa::Baseline,
        })
        .collect();
    for (arch, _, data) in models() {
        let params = ParamLayout::of(arch.as_ref()).init(7);
        let idx: Vec<usize> = (0..9).collect();
        let f = arch
            .loss_gradient()
            .expect("the CNNs have a fused gradient");
        // One thread, so that every loop runs where the override is set.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let run = |isa: Isa| {
            pool.install(|| {
                FORCED_ISA.with(|c| c.set(Some(isa)));
                let out = f.loss_and_gradient(&params, &data, &idx);
                FORCED_ISA.with(|c| c.set(None));
                out
            })
        };
        let (loss, grad) = run(Isa::Baseline);
        for &isa in &isas[1..] {
            let (l, g) = run(isa);
            assert_eq!(
                l.to_bits(),
                loss.to_bits(),
                "{} {}",
                arch.name(),
                isa.name()
            );
            assert!(
                g.iter().zip(&grad).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{} {}",
                arch.name(),
                isa.name()
            );
        }
    }
}

/// The fused logits match burn's forward pass, and evaluation through them matches
/// evaluation through burn.
#[test]
fn the_fused_logits_match_the_burn_forward_pass() {
    let device = Device::flex();
    for (arch, _, data) in models() {
        let layout = ParamLayout::of(arch.as_ref());
        let params = layout.init(6);
        let idx: Vec<usize> = (0..12).collect();
        let p = layout.to_tensors(&params, &device);
        let (x, _) = batch(&data, &idx, &device);
        let want = arch
            .forward(&p, x, None)
            .into_data()
            .try_into_vec::<f32>()
            .unwrap();
        let (x, _) = dense_rows(&data, &idx);
        let got = arch
            .fused_logits()
            .expect("the CNNs have fused logits")
            .logits(&params, &x, idx.len());
        let err = relative_error(&got, &want);
        assert!(err < 1e-5, "{}: relative error {err:e}", arch.name());
        let fused = evaluate(arch.as_ref(), &p, &data, &idx, 5, &device);
        let reference = evaluate(&AutodiffOnly(arch.as_ref()), &p, &data, &idx, 5, &device);
        assert_eq!(fused.accuracy, reference.accuracy, "{}", arch.name());
        assert!(
            (fused.loss - reference.loss).abs() <= 1e-5 * reference.loss,
            "{}: {} vs {}",
            arch.name(),
            fused.loss,
            reference.loss
        );
        let labels: Vec<i64> = idx.iter().map(|&i| i64::from(data.labels[i])).collect();
        let (_, correct) = crate::model::loss_and_correct_of(&got, &labels);
        let y = Tensor::<1, Int>::from_data(
            TensorData::new(labels.iter().map(|&l| l as i32).collect(), [12]),
            &device,
        );
        let logits = Tensor::<2>::from_data(TensorData::new(want, [12, 10]), &device);
        assert_eq!(correct, crate::model::loss_and_correct(logits, y).1);
    }
}
