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
use crate::model::cnn_hics_code::{BN_EPS, CnnHicsCode, batch_norm};
use crate::model::{
    Architecture, AutodiffOnly, Batch, Dropout, ParamLayout, batch, cross_entropy, dense_rows,
};
use crate::rng::{Purpose, stream};
use crate::train::evaluate;

/// Each parameter tensor's entries in the flat vector, in the order of the models'
/// `params()`, and whether it is trained.
fn tensors(net: &Net) -> Vec<(Range<usize>, bool)> {
    let plan = net.plan();
    let mut bounds = Vec::new();
    for (i, s) in net.stages.iter().enumerate() {
        let at = plan.at[i];
        let c = plan.shapes[i][0];
        match *s {
            Stage::Conv { cout, k, bias, .. } => {
                let w = cout * c * k * k;
                bounds.push((at..at + w, true));
                if bias {
                    bounds.push((at + w..at + w + cout, true));
                }
            }
            Stage::Prelu => bounds.push((at..at + 1, true)),
            Stage::BatchNorm => {
                for (j, trained) in [true, true, false, false].into_iter().enumerate() {
                    bounds.push((at + j * c..at + (j + 1) * c, trained));
                }
            }
            Stage::Relu | Stage::Pool => {}
        }
    }
    for (&(wa, ba), &width) in plan.dense_at.iter().zip(&net.dense) {
        bounds.extend([(wa..ba, true), (ba..ba + width, true)]);
    }
    bounds
}

/// The flat parameters split per tensor, in the order of the models' `params()`.
fn split(net: &Net, flat: &[f32], device: &Device) -> Vec<Tensor<1>> {
    tensors(net)
        .into_iter()
        .map(|(r, _)| {
            let n = r.len();
            Tensor::<1>::from_data(TensorData::new(flat[r].to_vec(), [n]), device)
        })
        .collect()
}

/// The logits of `net` by burn's ops, stage by stage, with BatchNorm in `mode`, and in
/// training mode the running statistics' new values by tensor index.
fn burn_forward(
    net: &Net,
    p: &[Tensor<1>],
    x: Tensor<2>,
    mode: Mode,
) -> (Tensor<2>, Vec<(usize, Tensor<1>)>) {
    let b = x.dims()[0];
    let [c, h, w] = net.input;
    let mut t = x.reshape([b, c, h, w]);
    let mut next = 0;
    let mut running = Vec::new();
    for s in net.stages {
        t = match *s {
            Stage::Conv {
                cout, k, pad, bias, ..
            } => {
                let cin = t.dims()[1];
                let weight = p[next].clone().reshape([cout, cin, k, k]);
                let bias = bias.then(|| p[next + 1].clone());
                next += 1 + usize::from(bias.is_some());
                conv2d(
                    t,
                    weight,
                    bias,
                    ConvOptions::new([1, 1], [pad, pad], [1, 1], 1),
                )
            }
            Stage::Relu => burn_relu(t),
            Stage::Pool => max_pool2d(t, MaxPoolOptions::new([2, 2])),
            Stage::Prelu => {
                next += 1;
                burn_relu(t.clone())
                    - burn_relu(t.neg()) * p[next - 1].clone().reshape([1, 1, 1, 1])
            }
            Stage::BatchNorm => {
                let q = |j: usize| p[next + j].clone();
                let (y, moved) = batch_norm(t, q(0), q(1), q(2), q(3), mode == Mode::Train);
                if let Some(r) = moved {
                    running.extend([(next + 2, r.mean), (next + 3, r.var)]);
                }
                next += 4;
                y
            }
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
    (a, running)
}

/// Loss and flat gradient by burn's autodiff through `forward`, which returns the logits
/// and the new values of the running statistics it moves (by tensor index). As the fused
/// pass returns them, a non-trainable tensor's entries hold its new value where
/// `forward` gives one, else 0.
fn autodiff(
    params: Vec<Tensor<1>>,
    trainable: &[bool],
    data: &Dataset,
    idx: &[usize],
    forward: impl FnOnce(&[Tensor<1>], Batch) -> (Tensor<2>, Vec<(usize, Tensor<1>)>),
) -> (f32, Vec<f32>) {
    let device = Device::flex();
    let ad: Vec<Tensor<1>> = params
        .into_iter()
        .zip(trainable)
        .map(|(p, &t)| {
            if t {
                p.autodiff().require_grad()
            } else {
                p.autodiff()
            }
        })
        .collect();
    let (x, y) = batch(data, idx, &device);
    let (logits, running) = forward(&ad, x);
    let loss = cross_entropy(logits, y);
    let grads = loss.backward();
    let values = |t: Tensor<1>| t.into_data().try_into_vec::<f32>().unwrap();
    let mut parts: Vec<Vec<f32>> = ad
        .iter()
        .zip(trainable)
        .map(|(p, &t)| match t {
            true => values(p.grad(&grads).unwrap()),
            false => vec![0.0; p.dims()[0]],
        })
        .collect();
    for (i, v) in running {
        parts[i] = values(v);
    }
    (loss.inner().into_scalar::<f32>(), parts.concat())
}

fn relative_error(a: &[f32], b: &[f32]) -> f64 {
    let diff: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let norm: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (diff / norm).sqrt()
}

/// Each trained tensor's fused gradient is within 1e-4 (relative, in norm) of `want`,
/// each running statistic's new value within 1e-5 (or both 0), and the losses agree to
/// 1e-5.
fn assert_close(net: &Net, got: (f32, Vec<f32>), want: (f32, Vec<f32>)) {
    let ((loss, grad), (want_loss, want)) = (got, want);
    assert!(
        (loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
        "{loss} vs {want_loss}"
    );
    for (i, (r, trained)) in tensors(net).into_iter().enumerate() {
        let (g, w) = (&grad[r.clone()], &want[r]);
        if !trained && w.iter().all(|&v| v == 0.0) {
            assert!(g.iter().all(|&v| v == 0.0), "running statistic {i}: {g:?}");
            continue;
        }
        assert!(w.iter().any(|&v| v != 0.0), "parameter {i} has no gradient");
        let err = relative_error(g, w);
        // A PReLU slope's gradient is one sum over every pixel of the batch, of terms of
        // both signs after BatchNorm's centring: burn's `f32` sums carry more rounding.
        let tol = match (trained, g.len()) {
            (false, _) => 1e-5,
            (true, 1) => 1e-3,
            (true, _) => 1e-4,
        };
        assert!(err < tol, "parameter {i}: relative error {err:e}");
    }
}

/// Parameters of `net` drawn uniformly from ±0.5, a BatchNorm's running variances
/// from 1 ± 0.5.
fn random_params(net: &Net, seed: u64) -> Vec<f32> {
    let mut rng = stream(seed, Purpose::Init, 0, 0);
    let mut p: Vec<f32> = (0..net.plan().total)
        .map(|_| rng.random_range(-0.5..0.5))
        .collect();
    let bounds = tensors(net);
    for pair in bounds.windows(2) {
        if let [(_, false), (var, false)] = pair {
            p[var.clone()].iter_mut().for_each(|v| *v += 1.0);
        }
    }
    p
}

/// Odd image sizes (pools drop a row and a column), padding on a non-square image,
/// a pool before its ReLU, two dense layers, and PReLU and BatchNorm (a convolution
/// without bias before them, a pool after the second) in training and eval mode.
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
                    bias: true,
                },
                Stage::Relu,
                Stage::Pool,
                Stage::Conv {
                    cout: 4,
                    k: 2,
                    pad: 0,
                    bias: true,
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
                    bias: true,
                },
                Stage::Relu,
                Stage::Pool,
            ],
            dense: vec![4],
        },
        Net {
            input: [2, 6, 5],
            stages: &[
                Stage::Conv {
                    cout: 3,
                    k: 3,
                    pad: 1,
                    bias: false,
                },
                Stage::Prelu,
                Stage::BatchNorm,
                Stage::Conv {
                    cout: 4,
                    k: 2,
                    pad: 0,
                    bias: true,
                },
                Stage::Prelu,
                Stage::BatchNorm,
                Stage::Pool,
            ],
            dense: vec![5, 3],
        },
    ];
    let device = Device::flex();
    for (seed, net) in nets.iter().enumerate() {
        let classes = *net.dense.last().unwrap();
        let data = random_dataset(&net.input, None, 14, classes);
        let params = random_params(net, seed as u64);
        let idx: Vec<usize> = (0..14).step_by(2).collect();
        let (x, labels) = dense_rows(&data, &idx);
        let trained: Vec<bool> = tensors(net).into_iter().map(|t| t.1).collect();
        for mode in [Mode::Train, Mode::Eval] {
            let got = net.loss_and_gradient(&params, &x, &labels, mode);
            let p = split(net, &params, &device);
            let want = autodiff(p, &trained, &data, &idx, |p, x| {
                burn_forward(net, p, crate::model::dense(x), mode)
            });
            assert_close(net, got, want);
        }
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
                bias: true,
            },
            Stage::Pool,
            Stage::Conv {
                cout: 3,
                k: 2,
                pad: 0,
                bias: true,
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
            bias: true,
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
        net.loss_and_gradient(&params, &x, &[0, 1], Mode::Train);
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

/// The instruction sets this CPU runs, narrowest first.
fn glue_isas() -> Vec<Isa> {
    let widest = glue_isa();
    [Isa::Baseline, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&i| match widest {
            Isa::Avx512 => true,
            Isa::Avx2 => i != Isa::Avx512,
            Isa::Baseline => i == Isa::Baseline,
        })
        .collect()
}

/// `f` with the loops around the products forced onto `isa`.
fn on_forced<T>(isa: Isa, f: impl FnOnce() -> T) -> T {
    FORCED_ISA.with(|c| c.set(Some(isa)));
    let out = f();
    FORCED_ISA.with(|c| c.set(None));
    out
}

/// A row edge's mask holds exactly the first `n` lanes, and all 16 from 16 on.
#[cfg(target_arch = "x86_64")]
#[test]
fn first_lanes_masks_the_first_n() {
    assert_eq!(first_lanes(0), 0);
    assert_eq!(first_lanes(3), 0b111);
    assert_eq!(first_lanes(15), 0x7fff);
    assert_eq!(first_lanes(16), 0xffff);
    assert_eq!(first_lanes(40), 0xffff);
}

/// A window's maximum is its first largest entry in row-major order, a NaN replacing
/// what came before it, on every instruction set: worked by hand on a 2×4 image, then
/// the vector copies against the one-window loop on images whose rows are shorter than,
/// as long as and longer than a vector's 16 windows, with odd edges, ties and NaNs.
#[test]
fn every_pool_copy_takes_the_same_maxima() {
    let nan = f32::NAN;
    let x = [1.0, 3.0, nan, 2.0, 3.0, 0.0, 5.0, nan];
    for isa in glue_isas() {
        let (mut out, mut idx) = (vec![0.0; 2], vec![0; 2]);
        on_forced(isa, || pool_forward(&x, [1, 2, 4], &mut out, &mut idx));
        assert_eq!(out[0], 3.0, "{}", isa.name());
        assert!(out[1].is_nan(), "{}", isa.name());
        assert_eq!(idx, [1, 7], "{}", isa.name());
    }
    let mut rng = stream(10, Purpose::Init, 0, 0);
    let values = [-1.0, -0.0, 0.0, 0.5, 2.0, nan];
    for shape in [[2, 5, 7], [3, 30, 30], [1, 9, 33], [2, 4, 65], [1, 3, 64]] {
        let [c, h, w] = shape;
        let x: Vec<f32> = (0..c * h * w)
            .map(|_| values[rng.random_range(0..values.len())])
            .collect();
        let n = c * (h / 2) * (w / 2);
        let run = |isa| {
            let (mut out, mut idx) = (vec![0.0f32; n], vec![0u32; n]);
            on_forced(isa, || pool_forward(&x, shape, &mut out, &mut idx));
            (out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), idx)
        };
        let want = run(Isa::Baseline);
        for isa in glue_isas() {
            assert_eq!(run(isa), want, "{shape:?} {}", isa.name());
        }
    }
}

/// Max-pool backward writes `0 + g` at each window's maximum where the ReLU passes and
/// zeros everywhere else, on every instruction set: the 2×4 image of
/// [`every_pool_copy_takes_the_same_maxima`] by hand (a −0 gradient lands as +0), then
/// the vector copies against the plain loop on odd shapes, into buffers full of garbage.
#[test]
fn every_pool_backward_copy_writes_the_same_gradient() {
    let nan = f32::NAN;
    for isa in glue_isas() {
        let mut d = vec![7.0; 8];
        on_forced(isa, || {
            pool_backward(&mut d, [1, 2, 4], &[1, 7], &[-0.0, 2.5], None)
        });
        let bits: Vec<u32> = d.iter().map(|v| v.to_bits()).collect();
        let want = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.5f32].map(f32::to_bits);
        assert_eq!(bits, want, "{}", isa.name());
        let maxima = [-1.0, nan];
        on_forced(isa, || {
            pool_backward(&mut d, [1, 2, 4], &[1, 7], &[3.0, 2.5], Some(&maxima));
        });
        assert_eq!(
            d,
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.5],
            "{}",
            isa.name()
        );
    }
    let mut rng = stream(12, Purpose::Init, 0, 0);
    for shape in [
        [2, 5, 7],
        [3, 30, 30],
        [1, 9, 33],
        [2, 4, 65],
        [1, 3, 64],
        [64, 13, 13],
    ] {
        let [c, h, w] = shape;
        let x: Vec<f32> = (0..c * h * w)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        let n = c * (h / 2) * (w / 2);
        let (mut maxima, mut idx) = (vec![0.0; n], vec![0; n]);
        pool_forward(&x, shape, &mut maxima, &mut idx);
        let g: Vec<f32> = (0..n)
            .map(|i| {
                if i % 5 == 0 {
                    -0.0
                } else {
                    rng.random_range(-1.0f32..1.0)
                }
            })
            .collect();
        for relu in [None, Some(&maxima[..])] {
            let run = |isa| {
                let mut d = vec![nan; c * h * w];
                on_forced(isa, || pool_backward(&mut d, shape, &idx, &g, relu));
                d.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            let want = run(Isa::Baseline);
            for isa in glue_isas() {
                assert_eq!(run(isa), want, "{shape:?} {}", isa.name());
            }
        }
    }
}

/// A padded image is the image inside a zero border, whatever images of its shape or of
/// others came before it (each shape keeps its buffer, whose border is never written):
/// worked by hand.
#[test]
fn padded_images_keep_a_zero_border() {
    let mut padded = Padded::default();
    let a = [1.0, 2.0, 3.0, 4.0];
    assert_eq!(padded.of(&a, [1, 2, 2], 1), inside_a_border(&a));
    // Two channels of 1×3 with padding 2: each channel 5×7, the image in row 2.
    let b = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let got = padded.of(&b, [2, 1, 3], 2).to_vec();
    assert_eq!(got.len(), 2 * 5 * 7);
    for (i, &v) in got.iter().enumerate() {
        let (ch, r, col) = (i / 35, i % 35 / 7, i % 7);
        let want = if r == 2 && (2..5).contains(&col) {
            b[ch * 3 + col - 2]
        } else {
            0.0
        };
        assert_eq!(v, want, "entry {i}");
    }
    let c = [5.0, 6.0, 7.0, 8.0];
    assert_eq!(padded.of(&c, [1, 2, 2], 1), inside_a_border(&c));
}

/// A 2×2 image inside a border of 1: a 4×4 image, by hand.
fn inside_a_border(x: &[f32; 4]) -> [f32; 16] {
    let mut out = [0.0; 16];
    out[5] = x[0];
    out[6] = x[1];
    out[9] = x[2];
    out[10] = x[3];
    out
}

/// col2im gives each pixel the sum of the patch entries read from it, over whatever the
/// image held (NaN here), on every instruction set: a 2×2 image with a 2×2 kernel and
/// padding 1 (a 3×3 output) worked by hand, then the vector copies against the plain
/// loop, bit for bit, at the seed CNNs' shapes.
#[test]
fn every_col2im_copy_adds_the_same_entries() {
    // Output 3×3; patch row (ky, kx) at output (oy, ox) reads pixel (oy + ky − 1, ox + kx − 1).
    let col: Vec<f32> = (0..4 * 9).map(|v| v as f32).collect();
    // Pixel (0, 0) is read by (ky, kx, oy, ox) = (0,0,1,1), (0,1,1,0), (1,0,0,1), (1,1,0,0):
    // entries 4, 9 + 3, 18 + 1, 27 + 0.
    let want = [
        4.0 + 12.0 + 19.0 + 27.0,
        5.0 + 13.0 + 20.0 + 28.0,
        7.0 + 15.0 + 22.0 + 30.0,
        8.0 + 16.0 + 23.0 + 31.0,
    ];
    for isa in glue_isas() {
        // What the image held is overwritten: no zeroing pass is needed before.
        let mut x = vec![f32::NAN; 4];
        on_forced(isa, || col2im(&col, [1, 2, 2], 2, 1, &mut x));
        assert_eq!(x, want, "{}", isa.name());
    }
    let mut rng = stream(11, Purpose::Init, 0, 0);
    for (shape, k, pad) in [
        ([32, 15, 15], 3, 0),
        ([64, 6, 6], 3, 0),
        ([32, 14, 14], 5, 2),
        ([3, 40, 37], 5, 2),
    ] {
        let [c, h, w] = shape;
        let (ho, wo) = (h + 2 * pad + 1 - k, w + 2 * pad + 1 - k);
        let col: Vec<f32> = (0..c * k * k * ho * wo)
            .map(|_| rng.random_range(-1.0f32..1.0) * 10f32.powi(rng.random_range(-6..6)))
            .collect();
        let run = |isa| {
            let mut x = vec![f32::NAN; c * h * w];
            on_forced(isa, || col2im(&col, shape, k, pad, &mut x));
            x.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let want = run(Isa::Baseline);
        for isa in glue_isas() {
            assert_eq!(run(isa), want, "{shape:?} k {k} {}", isa.name());
        }
    }
}

/// BatchNorm's sums and PReLU's backward give the same bits on every instruction set:
/// worked by hand on one channel, then the vector copies against the lane-group loops on
/// channels shorter than, as long as and longer than a lane group, with zeros of both
/// signs.
#[test]
fn every_batch_norm_copy_takes_the_same_sums() {
    // γ = 1, β = 0, running mean 1 and variance 4 − ε: x̂ = (x − 1)/2.
    let p = [1.0, 0.0, 1.0, 4.0 - BN_EPS as f32];
    let norm = Norm::running(&p, 1);
    let x = [1.0, 3.0, -1.0, 5.0, 2.0, 0.0, 7.0, 1.0, 9.0, -3.0];
    let g = [1.0, -2.0, 0.5, 1.0, 4.0, 2.0, -1.0, 3.0, 0.25, 1.0];
    for isa in glue_isas() {
        let (mut m, mut dm) = (Vec::new(), Vec::new());
        on_forced(isa, || {
            moments(&x, x.len(), &mut m);
            norm.sums(&g, &x, &mut dm);
        });
        assert_eq!(m, [[24.0, 180.0]], "{}", isa.name());
        // x̂ = (0, 1, −1, 2, 0.5, −0.5, 3, 0, 4, −2): Σg = 9.75 and
        // Σ g·x̂ = 0 − 2 − 0.5 + 2 + 2 − 1 − 3 + 0 + 1 − 2 = −3.5.
        assert_eq!(dm, [[9.75, -3.5]], "{}", isa.name());
        let (mut d, mut da) = (vec![f32::NAN; x.len()], 0.5);
        let xs = [1.0, -2.0, 0.0, -0.0, 3.0, -1.0, 2.0, -4.0, 1.0, -0.5];
        on_forced(isa, || prelu_backward(&mut d, &g, &xs, 0.25, &mut da));
        let want = [1.0, -0.5, 0.0, 0.0, 4.0, 0.5, -1.0, 0.75, 0.25, 0.25];
        assert_eq!(d, want, "{}", isa.name());
        // 0.5 + Σ g·x over x < 0: 4 − 2 − 12 − 0.5.
        assert_eq!(da, -10.0, "{}", isa.name());
    }
    let mut rng = stream(12, Purpose::Init, 0, 0);
    for (c, hw) in [(2, 5), (3, 8), (2, 13), (4, 196), (1, 784)] {
        let draw = |rng: &mut crate::rng::Rng| -> Vec<f32> {
            (0..c * hw)
                .map(|_| match rng.random_range(0..8) {
                    0 => 0.0,
                    1 => -0.0,
                    _ => rng.random_range(-1.0f32..1.0) * 10f32.powi(rng.random_range(-4..4)),
                })
                .collect()
        };
        let (x, g) = (draw(&mut rng), draw(&mut rng));
        let p: Vec<f32> = [vec![1.5; c], vec![-0.5; c], vec![0.1; c], vec![2.0; c]].concat();
        let norm = Norm::running(&p, c);
        let run = |isa| {
            on_forced(isa, || {
                let (mut m, mut dm) = (Vec::new(), Vec::new());
                moments(&x, hw, &mut m);
                norm.sums(&g, &x, &mut dm);
                let (mut d, mut da) = (vec![f32::NAN; x.len()], 0.0);
                prelu_backward(&mut d, &g, &x, 0.3, &mut da);
                let pairs = m.iter().chain(&dm).flatten().map(|v| v.to_bits());
                let ds = d.iter().map(|v| u64::from(v.to_bits()));
                pairs.chain(ds).chain([da.to_bits()]).collect::<Vec<u64>>()
            })
        };
        let want = run(Isa::Baseline);
        for isa in glue_isas() {
            assert_eq!(run(isa), want, "{c}×{hw} {}", isa.name());
        }
    }
}

/// A trace keeps the outputs the backward pass or a later range reads, and the
/// features; the rest pass through the scratch. Worked by hand from each stage list.
#[test]
fn traces_keep_what_is_read_again() {
    let (t, f) = (true, false);
    for (arch, net, _) in models() {
        let want: &[bool] = match arch.name() {
            // conv → ReLU (fused) → pool, twice: the pools' maxima and the features.
            "cnn_fmnist" | "cnn_hics" => &[f, f, t, f, f, t],
            // conv → pool → ReLU, three times without the last pool: each ReLU's output
            // (its backward and the next convolution read it).
            "cnn_cifar" => &[f, f, t, f, f, t, f, t],
            // conv → PReLU → BatchNorm (→ pool): each convolution's output (PReLU's
            // backward), not the PReLUs' (recomputed), the first BatchNorm's (the next
            // convolution reads it), the pools'.
            "cnn_hics_code" => &[t, f, t, t, f, f, t, t, f, f, t],
            other => panic!("a seed CNN without a case: {other}"),
        };
        assert_eq!(net.plan().kept, want, "{}", arch.name());
    }
}

/// The four seed CNNs at their real shapes, against their own burn forward pass.
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
    let code = CnnHicsCode { classes: 10 };
    vec![
        fmnist(Some(512)),
        fmnist(None),
        (
            Box::new(cifar.clone()),
            cifar.net(),
            random_dataset(&[3, 32, 32], None, 12, 10),
        ),
        (
            Box::new(code.clone()),
            code.net(),
            random_dataset(&[1, 28, 28], None, 12, 10),
        ),
    ]
}

/// The model's initial parameters, its running statistics (if any) moved away from
/// their start so that eval mode reads them.
fn seed_params(layout: &ParamLayout, seed: u64) -> Vec<f32> {
    let mut params = layout.init(seed);
    for (i, spec) in layout.specs.iter().enumerate() {
        if !spec.trainable {
            for (j, v) in params[layout.range(i)].iter_mut().enumerate() {
                *v += 0.5 + 0.01 * j as f32;
            }
        }
    }
    params
}

/// No dropout, from a fixed stream.
fn no_dropout(rng: &mut crate::rng::Rng) -> Dropout<'_> {
    Dropout { p: 0.0, rng }
}

/// The fused loss and gradient of each seed model match burn's autodiff through its
/// forward pass without dropout and through its training-mode pass, BatchNorm's
/// running statistics included.
#[test]
fn the_fused_gradient_matches_autodiff_on_the_seed_models() {
    let device = Device::flex();
    for (seed, (arch, net, data)) in models().into_iter().enumerate() {
        let layout = ParamLayout::of(arch.as_ref());
        assert_eq!(layout.total, net.plan().total, "{}", arch.name());
        let params = seed_params(&layout, seed as u64);
        let trained: Vec<bool> = layout.specs.iter().map(|s| s.trainable).collect();
        let idx = [1, 4, 5, 7, 10];
        let f = arch
            .loss_gradient()
            .expect("the CNNs have a fused gradient");
        let got = f.loss_and_gradient(&params, &data, &idx);
        let p = layout.to_tensors(&params, &device);
        let want = autodiff(p, &trained, &data, &idx, |p, x| {
            (arch.forward(p, x, None), Vec::new())
        });
        assert_close(&net, got, want);
        let mut rng = stream(1, Purpose::Training, 0, 0);
        let got = f.train_loss_and_gradient(&params, &data, &idx, &mut no_dropout(&mut rng));
        let p = layout.to_tensors(&params, &device);
        let want = autodiff(p, &trained, &data, &idx, |p, x| {
            arch.forward_train(p, x, &mut no_dropout(&mut rng))
        });
        assert_close(&net, got, want);
    }
}

/// The training-mode pass (BatchNorm by the batch's statistics) without dropout.
fn train_pass(
    f: &dyn crate::model::LossGradient,
    params: &[f32],
    data: &Dataset,
    idx: &[usize],
) -> (f32, Vec<f32>) {
    let mut rng = stream(1, Purpose::Training, 0, 0);
    f.train_loss_and_gradient(params, data, idx, &mut no_dropout(&mut rng))
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
                .install(|| train_pass(f, &params, &data, &idx))
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
    let isas = glue_isas();
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
        let run =
            |isa: Isa| pool.install(|| on_forced(isa, || train_pass(f, &params, &data, &idx)));
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
