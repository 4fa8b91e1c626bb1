//! One SGD step of the Shakespeare char-LSTM (batch 10, sequence 80), fused path and
//! autodiff reference alternating rep by rep; the fedsel side of `bench/torch_reference.py`.
//!
//! Usage: `cargo run --release --example char_lstm_step [REPS]` (threads: `RAYON_NUM_THREADS`).

use fedsel::bench::{random_dataset, step_times};
use fedsel::model::AutodiffOnly;
use fedsel::model::lstm::CharLstm;

fn main() {
    let reps = std::env::args()
        .nth(1)
        .map_or(Ok(7), |s| s.parse::<usize>())
        .expect("REPS is a count of timed runs");
    let device = burn::tensor::Device::flex();
    let lstm = CharLstm {
        vocab: 80,
        embed: 8,
        hidden: 256,
    };
    let reference = AutodiffOnly(&lstm);
    let data = random_dataset(&[], Some(80), 100, 80);
    let t = step_times(&[&lstm, &reference], &data, 10, 5, reps, &device);
    println!(
        "char_lstm threads={} fused_ms_per_step={:.2} autodiff_ms_per_step={:.2}",
        rayon::current_num_threads(),
        t[0].as_secs_f64() * 1e3,
        t[1].as_secs_f64() * 1e3
    );
}
