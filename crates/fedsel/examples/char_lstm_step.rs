//! One SGD step of the Shakespeare char-LSTM (batch 10, sequence 80), fused path and
//! autodiff reference alternating rep by rep, then the evaluation of a 10,000-sequence
//! test set in batches of 500 (the Shakespeare configs' `eval.batch_size`), fused
//! forward pass and burn's alternating; the fedsel side of `bench/torch_reference.py`.
//!
//! Usage: `cargo run --release --example char_lstm_step [REPS [EVAL_REPS]]` (threads:
//! `RAYON_NUM_THREADS`; `EVAL_REPS` 0 skips the evaluation).

use fedsel::bench::{eval_times, random_dataset, step_times};
use fedsel::model::AutodiffOnly;
use fedsel::model::lstm::CharLstm;

fn main() {
    let count = |i: usize, default: usize| {
        std::env::args()
            .nth(i)
            .map_or(Ok(default), |s| s.parse::<usize>())
            .expect("REPS and EVAL_REPS are counts of timed runs")
    };
    let (reps, eval_reps) = (count(1, 7), count(2, 3));
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
    if eval_reps == 0 {
        return;
    }
    let test = random_dataset(&[], Some(80), 10_000, 80);
    let t = eval_times(&[&lstm, &reference], &test, 500, eval_reps, &device);
    println!(
        "char_lstm eval 10k batch 500 threads={} fused_ms={:.1} burn_ms={:.1}",
        rayon::current_num_threads(),
        t[0].as_secs_f64() * 1e3,
        t[1].as_secs_f64() * 1e3
    );
}
