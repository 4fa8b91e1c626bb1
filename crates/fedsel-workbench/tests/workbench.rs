//! Sweeps: every cell runs once, a rerun finishes only what is missing, and the report has every table.

use fedsel_workbench::sweep::{self, Shard, Sweep, SweepProgress};

struct Silent;
impl SweepProgress for Silent {
    fn cell_done(&self, _: &str, _: usize, _: usize, _: bool) {}
}

#[test]
fn sweep_reruns_only_unfinished_cells_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.toml");
    std::fs::write(
        &path,
        "name = \"t\"\nbaseline = \"uniform\"\n[config]\nrounds = 15\ncheckpoint_every = 5\ntargets = [0.3]\n[axes]\nstrategy = [\"uniform\", \"md\"]\nseed = [1, 2]\n",
    )
    .unwrap();
    let s = Sweep::load(&path, &[]).unwrap();
    let out = dir.path().join("out");
    let data = fedsel::data::locate::data_dir(None, None);
    let first = sweep::run(&s, &out, &data, Shard::ALL, 2, 1, false, &Silent).unwrap();
    assert_eq!((first.total, first.skipped, first.ran), (4, 0, 4));
    // Simulate a cell killed mid-run: its summary is missing, its metrics half-written.
    let cells = s.cells().unwrap();
    let victim = out.join("cells").join(&cells[1].dir_name);
    let time = fedsel::output::metric_columns()
        .iter()
        .position(|&c| c == "elapsed_s")
        .unwrap();
    let with_time = |line: &str, value: Option<&str>| -> String {
        let mut fields: Vec<&str> = line.split(',').collect();
        match value {
            Some(v) => fields[time] = v,
            None => {
                fields.remove(time);
            }
        }
        fields.join(",")
    };
    let rows = |p: &std::path::Path| -> Vec<String> {
        // Everything but the timing column.
        std::fs::read_to_string(p.join("metrics.csv"))
            .unwrap()
            .lines()
            .map(|l| with_time(l, None))
            .collect()
    };
    let metrics_before = rows(&victim);
    std::fs::remove_file(victim.join("summary.json")).unwrap();
    // The rerun continues from the checkpoint after round 10: rows before it are kept as
    // they are, which a marker in round 0's timing column shows.
    assert_eq!(fedsel::checkpoint::load(&victim).unwrap().next_round, 10);
    let m = std::fs::read_to_string(victim.join("metrics.csv")).unwrap();
    let mut lines: Vec<String> = m.lines().map(String::from).collect();
    lines[1] = with_time(&lines[1], Some("999.000"));
    std::fs::write(victim.join("metrics.csv"), lines.join("\n") + "\n").unwrap();
    let second = sweep::run(&s, &out, &data, Shard::ALL, 2, 1, false, &Silent).unwrap();
    assert_eq!((second.skipped, second.ran), (3, 1));
    assert!(
        std::fs::read_to_string(victim.join("metrics.csv"))
            .unwrap()
            .lines()
            .nth(1)
            .unwrap()
            .split(',')
            .nth(time)
            == Some("999.000")
    );
    assert_eq!(
        rows(&victim),
        metrics_before,
        "the rerun cell reproduces its rows"
    );
    let report = fedsel_workbench::report::write(&out, None).unwrap();
    for needle in [
        "Rounds to target",
        "Best and final",
        "speedup",
        "Selection counts",
        "| all | uniform | 2 |",
        "median",
        "CI ",
        "(baseline)",
        "30% vs uniform",
        "Per-client accuracy",
        "client_acc_worst10 vs uniform",
    ] {
        assert!(report.contains(needle), "{needle} missing from:\n{report}");
    }
    assert!(
        !report.contains("## TensorBoard"),
        "no run asked for a tracker"
    );
    // Every CSV field past the setting and strategy is a plain number (or empty for N/A):
    // mean and std have columns of their own, ratios carry no "x".
    for csv in [
        "rounds_to_target.csv",
        "best_final.csv",
        "speedup.csv",
        "selection_stats.csv",
        "client_accuracy.csv",
    ] {
        let text = std::fs::read_to_string(out.join(csv)).unwrap();
        let mut lines = text.lines();
        let header = lines.next().unwrap();
        for line in lines {
            for field in line.split(',').skip(2) {
                assert!(
                    field.is_empty() || field.parse::<f64>().is_ok(),
                    "{csv}: `{field}` in `{line}` under `{header}`"
                );
            }
        }
    }
    let bf = std::fs::read_to_string(out.join("best_final.csv")).unwrap();
    assert!(
        bf.starts_with("setting,strategy,best_acc_mean,best_acc_std,final_acc_mean"),
        "{bf}"
    );
    // The statistics over seeds are appended after the old columns.
    assert!(
        bf.lines().next().unwrap().ends_with(
            "final_loss_change_%,best_acc_median,best_acc_ci_lo,best_acc_ci_hi,best_acc_paired_n,best_acc_paired_above,best_acc_paired_below,best_acc_paired_diff,best_acc_p,final_acc_median,final_acc_ci_lo,final_acc_ci_hi,final_acc_paired_n,final_acc_paired_above,final_acc_paired_below,final_acc_paired_diff,final_acc_p,best_loss_median,best_loss_ci_lo,best_loss_ci_hi,best_loss_paired_n,best_loss_paired_above,best_loss_paired_below,best_loss_paired_diff,best_loss_p,final_loss_median,final_loss_ci_lo,final_loss_ci_hi,final_loss_paired_n,final_loss_paired_above,final_loss_paired_below,final_loss_paired_diff,final_loss_p"
        ),
        "{bf}"
    );
    let rtt = std::fs::read_to_string(out.join("rounds_to_target.csv")).unwrap();
    assert!(
        rtt.starts_with("setting,strategy,seeds,30%_mean,30%_std,30%_median,30%_ci_lo,30%_ci_hi,30%_reached,30%_mean_lb,30%_paired_n,"),
        "{rtt}"
    );
    // A finished cell whose metrics were cut short (mid-row) is left out and named, with
    // the reason; the rest is still reported, and the report is replaced.
    let cut = out.join("cells").join(&cells[2].dir_name);
    let header = std::fs::read_to_string(cut.join("metrics.csv"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string();
    std::fs::write(cut.join("metrics.csv"), format!("{header}\n0,0.1")).unwrap();
    std::fs::write(out.join("report.md"), "old").unwrap();
    let report = fedsel_workbench::report::write(&out, None).unwrap();
    assert!(
        report.contains(&format!(
            "- `{}`: {}: truncated: metrics.csv breaks off after 0 rows",
            cells[2].dir_name,
            cut.display()
        )),
        "{report}"
    );
    assert!(report.contains("| all | uniform | 2 |"), "{report}");
    assert_eq!(
        std::fs::read_to_string(out.join("report.md")).unwrap(),
        report
    );
    // Cells written before metrics.csv had the per-client columns still report, without
    // that table; `--format latex` on the sweep writes report.tex beside report.md.
    for cell in &cells {
        let path = out.join("cells").join(&cell.dir_name).join("metrics.csv");
        let old: Vec<String> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| l.split(',').take(time + 1).collect::<Vec<_>>().join(","))
            .collect();
        std::fs::write(&path, old.join("\n") + "\n").unwrap();
    }
    std::fs::remove_file(out.join("client_accuracy.csv")).unwrap();
    let report = fedsel_workbench::report::write(&out, None).unwrap();
    assert!(report.contains("| all | md | 1 |"), "{report}");
    assert!(!report.contains("## Per-client"), "{report}");
    assert!(!out.join("client_accuracy.csv").exists());
    let (file, tex) = fedsel_workbench::report::report(
        std::slice::from_ref(&out),
        None,
        None,
        fedsel_workbench::report::Format::Latex,
        false,
    )
    .unwrap();
    assert_eq!(file, out.join("report.tex"));
    assert!(
        tex.contains("\\begin{tabular}") && tex.contains("md & 1"),
        "{tex}"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("report.md")).unwrap(),
        report
    );
}

/// `--shard I/N`: parts of one grid run into one directory, each cell once; the report
/// names what is missing until every part is done, and a cell another process holds is
/// left to it.
#[test]
fn shards_share_one_directory_and_run_every_cell_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.toml");
    std::fs::write(
        &path,
        "name = \"t\"\nbaseline = \"uniform\"\n[config]\nrounds = 3\n[axes]\nstrategy = [\"uniform\", \"md\"]\nseed = [1, 2, 3]\n",
    )
    .unwrap();
    let s = Sweep::load(&path, &[]).unwrap();
    let cells = s.cells().unwrap();
    let out = dir.path().join("out");
    let data = fedsel::data::locate::data_dir(None, None);
    let first = sweep::run(
        &s,
        &out,
        &data,
        "1/2".parse().unwrap(),
        1,
        1,
        false,
        &Silent,
    )
    .unwrap();
    assert_eq!((first.total, first.shard_cells, first.ran), (6, 3, 3));
    let second_part: Vec<String> = "2/2"
        .parse::<Shard>()
        .unwrap()
        .part(&cells)
        .iter()
        .map(|c| c.label.clone())
        .collect();
    assert_eq!(first.unfinished, second_part);
    let partial = fedsel_workbench::report::write(&out, None).unwrap();
    assert!(
        partial.contains("3 not finished (left out)") && partial.contains(&second_part[0]),
        "{partial}"
    );
    let second = sweep::run(
        &s,
        &out,
        &data,
        "2/2".parse().unwrap(),
        1,
        1,
        false,
        &Silent,
    )
    .unwrap();
    assert_eq!((second.shard_cells, second.ran), (3, 3));
    assert!(second.unfinished.is_empty());
    let again = sweep::run(
        &s,
        &out,
        &data,
        "1/2".parse().unwrap(),
        1,
        1,
        false,
        &Silent,
    )
    .unwrap();
    assert_eq!((again.skipped, again.ran), (3, 0));
    let report = fedsel_workbench::report::write(&out, None).unwrap();
    assert!(report.contains("6 cells, 6 finished."), "{report}");
    // A cell whose lock another process holds is left to it, not run a second time.
    let victim = out.join("cells").join(&cells[0].dir_name);
    std::fs::remove_file(victim.join("summary.json")).unwrap();
    let held = std::fs::File::create(
        out.join("cells")
            .join(format!("{}.lock", cells[0].dir_name)),
    )
    .unwrap();
    held.lock().unwrap();
    let busy = sweep::run(&s, &out, &data, Shard::ALL, 2, 1, false, &Silent).unwrap();
    assert_eq!((busy.busy, busy.ran, busy.skipped), (1, 0, 5));
    assert_eq!(busy.unfinished, vec![cells[0].label.clone()]);
}

/// With `output.tensorboard` set, the report links each cell's own event directory:
/// relative to the report where the events lie inside the sweep's directory, by absolute
/// path where they lie elsewhere.
#[test]
fn the_report_links_each_cells_tensorboard_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.toml");
    std::fs::write(
        &path,
        "name = \"t\"\n[config]\nrounds = 2\n[axes]\nstrategy = [\"uniform\", \"md\"]\n",
    )
    .unwrap();
    let data = fedsel::data::locate::data_dir(None, None);
    let out = dir.path().join("out");
    let elsewhere = dir.path().join("tb");
    for (tb, inside) in [(out.join("tb"), true), (elsewhere, false)] {
        let set = toml::Value::String(tb.display().to_string());
        let s = Sweep::load(&path, &[format!("output.tensorboard={set}")]).unwrap();
        if out.exists() {
            std::fs::remove_dir_all(&out).unwrap();
        }
        let done = sweep::run(&s, &out, &data, Shard::ALL, 1, 1, false, &Silent).unwrap();
        assert_eq!(done.ran, 2);
        let report = fedsel_workbench::report::write(&out, None).unwrap();
        let cells = s.cells().unwrap();
        assert_eq!(cells.len(), 2);
        for cell in &cells {
            let cell_tb = tb.join(&cell.dir_name);
            let line = if inside {
                format!("- `{}`: [tb/{d}](tb/{d})\n", cell.label, d = cell.dir_name)
            } else {
                format!("- `{}`: `{}`\n", cell.label, cell_tb.display())
            };
            assert!(report.contains(&line), "{line} missing from:\n{report}");
            let events: Vec<String> = std::fs::read_dir(&cell_tb)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            assert!(
                events.len() == 1 && events[0].starts_with("events.out.tfevents."),
                "{events:?}"
            );
        }
        assert!(
            report.contains(&format!("`tensorboard --logdir {}`", tb.display())),
            "{report}"
        );
        // A comparison of the cells' run directories links them too, each named by its
        // run directory; `cmp/` holds neither tracker directory, so both are paths.
        let runs: Vec<_> = cells
            .iter()
            .map(|c| out.join("cells").join(&c.dir_name))
            .collect();
        let (_, text) = fedsel_workbench::report::report(
            &runs,
            Some(&out.join("cmp")),
            None,
            fedsel_workbench::report::Format::Markdown,
            false,
        )
        .unwrap();
        for (cell, run) in cells.iter().zip(&runs) {
            let line = format!(
                "- `{}`: `{}`\n",
                run.display(),
                tb.join(&cell.dir_name).display()
            );
            assert!(text.contains(&line), "{line} missing from:\n{text}");
        }
        assert!(
            !text.contains("tensorboard="),
            "the tracker directory names no arm:\n{text}"
        );
    }
}
