//! A seed model's training steps side by side, one client a thread as a round trains
//! them (`fedsel::bench::side_by_side_step_time`), for as long as a profiler needs and
//! with none of `fedsel bench`'s probes around them: the shares docs/speed.md quotes
//! come from `perf record` of this.
//!
//! Usage: `cargo run --release --example step_profile MODEL [STEPS]`, MODEL the first
//! word of one of `fedsel bench`'s steps (mlp, cnn_fmnist, cnn_hics, cnn_hics_code,
//! cnn_cifar, char_lstm); STEPS per client and run (default 100), three runs.

use fedsel::bench::{seed_steps, side_by_side_step_time};

fn main() {
    let name = std::env::args().nth(1).unwrap_or_default();
    let steps = std::env::args()
        .nth(2)
        .map_or(Ok(100), |s| s.parse::<usize>())
        .expect("STEPS is a count of steps");
    let cases = seed_steps();
    let Some((_, arch, data, batch)) = cases
        .iter()
        .find(|c| c.0.split(' ').next() == Some(name.as_str()))
    else {
        let names: Vec<&str> = cases.iter().filter_map(|c| c.0.split(' ').next()).collect();
        eprintln!("unknown model `{name}`: one of {}", names.join(", "));
        std::process::exit(2);
    };
    let device = burn::tensor::Device::flex();
    let t = side_by_side_step_time(arch.as_ref(), data, *batch, steps, 3, &device);
    println!(
        "{name}: {:.3} ms a step, {} threads side by side, products {:.0} % of the cores' time",
        t.step.as_secs_f64() * 1e3,
        rayon::current_num_threads(),
        100.0 * t.products_share
    );
}
