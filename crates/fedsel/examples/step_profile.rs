//! A seed model's training steps side by side, one client a thread as a round trains
//! them (`fedsel::bench::side_by_side_step_time`), for as long as a profiler needs and
//! with none of `fedsel bench`'s probes around them: the shares docs/speed.md quotes
//! come from `perf record` of this.
//!
//! Usage: `cargo run --release --example step_profile MODEL [STEPS]`, MODEL one of mlp,
//! cnn_fmnist, cnn_hics, cnn_hics_code, cnn_cifar, char_lstm; STEPS per client and run
//! (default 100), three runs.

use fedsel::bench::{random_dataset, side_by_side_step_time};
use fedsel::model::Architecture;
use fedsel::model::{
    cnn_cifar::CnnCifar, cnn_fmnist::CnnFmnist, cnn_hics_code::CnnHicsCode, lstm::CharLstm,
    mlp::Mlp,
};

fn main() {
    let name = std::env::args().nth(1).unwrap_or_default();
    let steps = std::env::args()
        .nth(2)
        .map_or(Ok(100), |s| s.parse::<usize>())
        .expect("STEPS is a count of steps");
    let images = || random_dataset(&[1, 28, 28], None, 640, 10);
    let (arch, data, batch): (Box<dyn Architecture>, _, _) = match name.as_str() {
        "mlp" => {
            let mlp = Mlp {
                inputs: 784,
                classes: 10,
                dropout: 0.5,
            };
            (Box::new(mlp), images(), 64)
        }
        "cnn_fmnist" | "cnn_hics" => {
            let hidden = (name == "cnn_fmnist").then_some(512);
            let cnn = CnnFmnist {
                classes: 10,
                hidden,
            };
            (Box::new(cnn), images(), 64)
        }
        "cnn_hics_code" => (Box::new(CnnHicsCode { classes: 10 }), images(), 64),
        "cnn_cifar" => {
            let data = random_dataset(&[3, 32, 32], None, 500, 10);
            (Box::new(CnnCifar { classes: 10 }), data, 50)
        }
        "char_lstm" => {
            let lstm = CharLstm {
                vocab: 80,
                embed: 8,
                hidden: 256,
            };
            (Box::new(lstm), random_dataset(&[], Some(80), 100, 80), 10)
        }
        other => {
            eprintln!(
                "unknown model `{other}`: mlp, cnn_fmnist, cnn_hics, cnn_hics_code, cnn_cifar or char_lstm"
            );
            std::process::exit(2);
        }
    };
    let device = burn::tensor::Device::flex();
    let t = side_by_side_step_time(arch.as_ref(), &data, batch, steps, 3, &device);
    println!(
        "{name}: {:.3} ms a step, {} threads side by side, products {:.0} % of the cores' time",
        t.step.as_secs_f64() * 1e3,
        rayon::current_num_threads(),
        100.0 * t.products_share
    );
}
