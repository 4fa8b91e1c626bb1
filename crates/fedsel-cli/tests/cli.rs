//! The command line as a user meets it: results are never overwritten by accident, a
//! finished run is not resumed, and bad inputs are errors that name them.

use std::path::Path;
use std::process::{Command, Output};

fn fedsel(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fedsel"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("the fedsel binary runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A one-seed sweep of `rounds` rounds in `dir`: (sweep file, output directory).
fn one_seed_sweep(dir: &Path, rounds: usize) -> (std::path::PathBuf, std::path::PathBuf) {
    let sweep = dir.join("s.toml");
    std::fs::write(
        &sweep,
        format!("name = \"t\"\n[config]\nrounds = {rounds}\n[axes]\nseed = [1]\n"),
    )
    .unwrap();
    (sweep, dir.join("out"))
}

/// `fedsel sweep SWEEP --out OUT EXTRA...`.
fn sweep_into(sweep: &Path, out: &Path, extra: &[&str], cwd: &Path) -> Output {
    let mut args = vec![
        "sweep",
        sweep.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend(extra);
    fedsel(&args, cwd)
}

#[test]
fn a_run_never_overwrites_another_without_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_s = out.to_str().unwrap();
    let first = fedsel(&["run", "--set", "rounds=3", "--out", out_s], dir.path());
    assert!(first.status.success(), "{}", text(&first));
    let metrics = std::fs::read_to_string(out.join("metrics.csv")).unwrap();
    // A stale file of another strategy, which must not outlive an overwrite.
    std::fs::write(out.join("gp_fits.csv"), "stale").unwrap();
    // Into the same directory: refused, and nothing of the finished run changes.
    let again = fedsel(&["run", "--set", "rounds=3", "--out", out_s], dir.path());
    assert!(!again.status.success());
    assert!(
        text(&again).contains("already holds a run; pass --overwrite to replace it, or --resume"),
        "{}",
        text(&again)
    );
    assert_eq!(
        std::fs::read_to_string(out.join("metrics.csv")).unwrap(),
        metrics
    );
    // --overwrite clears it first.
    let over = fedsel(
        &["run", "--set", "rounds=4", "--out", out_s, "--overwrite"],
        dir.path(),
    );
    assert!(over.status.success(), "{}", text(&over));
    assert!(!out.join("gp_fits.csv").exists());
    assert_eq!(
        std::fs::read_to_string(out.join("metrics.csv"))
            .unwrap()
            .lines()
            .count(),
        5
    );
    // --resume on a finished run says so and changes nothing.
    let before = std::fs::read_to_string(out.join("summary.json")).unwrap();
    let resume = fedsel(&["run", "--resume", out_s], dir.path());
    assert!(resume.status.success(), "{}", text(&resume));
    assert!(text(&resume).contains("finished"), "{}", text(&resume));
    assert_eq!(
        std::fs::read_to_string(out.join("summary.json")).unwrap(),
        before
    );
}

#[test]
fn default_directories_differ_by_overrides() {
    let dir = tempfile::tempdir().unwrap();
    for lr in ["0.01", "0.02"] {
        let o = fedsel(
            &[
                "run",
                "--set",
                "rounds=2",
                "--set",
                &format!("train.lr={lr}"),
            ],
            dir.path(),
        );
        assert!(o.status.success(), "{}", text(&o));
    }
    let runs: Vec<_> = std::fs::read_dir(dir.path().join("runs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs.iter().all(|r| r.starts_with("default-s1-")));
}

#[test]
fn mistakes_are_errors_that_name_them_and_logs_carry_no_colour() {
    let dir = tempfile::tempdir().unwrap();
    // More clients per round than clients.
    let o = fedsel(
        &[
            "run",
            "--set",
            "selection.clients_per_round=31",
            "--set",
            "rounds=1",
        ],
        dir.path(),
    );
    assert!(!o.status.success());
    assert!(
        text(&o).contains("selection.clients_per_round"),
        "{}",
        text(&o)
    );
    // A report of a directory that is not a sweep.
    let o = fedsel(&["report", dir.path().to_str().unwrap()], dir.path());
    assert!(!o.status.success());
    assert_eq!(
        text(&o).matches("not a sweep directory").count(),
        1,
        "said once, not again as its own cause: {}",
        text(&o)
    );
    // Smoothing windows that are not odd, or too short.
    for w in ["0", "4"] {
        let o = fedsel(
            &["report", dir.path().to_str().unwrap(), "--smooth", w],
            dir.path(),
        );
        assert!(!o.status.success());
        assert!(text(&o).contains("--smooth"), "{}", text(&o));
    }
    // A warning (an aggregation rule that is not the strategy's own) goes to a pipe
    // without ANSI colour codes.
    let o = fedsel(
        &[
            "run",
            "--set",
            "rounds=1",
            "--set",
            "server.aggregation=\"data_size\"",
            "--out",
            dir.path().join("w").to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("overrides uniform's own rule"), "{err}");
    assert!(!err.contains('\u{1b}'), "{err:?}");
}

/// A run that cannot start (a trace naming a client the partition lacks, a negative id)
/// fails before it makes its directory, and a corrected rerun needs no --overwrite
/// (issue 24 item 6).
#[test]
fn a_run_that_cannot_start_leaves_no_directory_behind() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let trace = dir.path().join("trace.csv");
    let run = |out: &Path| {
        fedsel(
            &[
                "run",
                "--set",
                "rounds=2",
                "--set",
                &format!(
                    "availability={{ kind = \"trace\", trace = \"{}\" }}",
                    trace.display()
                ),
                "--out",
                out.to_str().unwrap(),
            ],
            dir.path(),
        )
    };
    for (rows, needle) in [
        ("0,0\n0,99\n", "client 99 does not exist"),
        ("0,-1\n", "line 2"),
    ] {
        std::fs::write(&trace, format!("round,client\n{rows}")).unwrap();
        let o = run(&out);
        assert!(!o.status.success());
        let t = text(&o);
        assert!(t.contains(needle) && t.contains("trace.csv"), "{t}");
        assert!(!t.contains("finished rounds are in"), "{t}");
        assert!(!out.exists(), "{t}");
    }
    std::fs::write(&trace, "round,client\n0,0\n0,1\n1,2\n").unwrap();
    let o = run(&out);
    assert!(o.status.success(), "{}", text(&o));
    assert!(out.join("summary.json").is_file());
}

#[test]
fn a_smoothing_window_longer_than_the_runs_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (sweep, out) = one_seed_sweep(dir.path(), 5);
    let o = sweep_into(&sweep, &out, &[], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let o = fedsel(
        &["report", out.to_str().unwrap(), "--smooth", "7"],
        dir.path(),
    );
    assert!(!o.status.success());
    assert!(
        text(&o).contains("longer than the 5 evaluated rounds"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_diverging_run_is_flagged_in_its_summary_and_on_the_console() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("d");
    let o = fedsel(
        &[
            "run",
            "--set",
            "rounds=5",
            "--set",
            "train.lr=1e4",
            "--out",
            out.to_str().unwrap(),
        ],
        dir.path(),
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert!(summary["diverged_at"].is_u64(), "{}\n{summary}", text(&o));
    assert!(text(&o).contains("DIVERGED"), "{}", text(&o));
    // A sound run is not flagged.
    let ok = dir.path().join("ok");
    let o = fedsel(
        &["run", "--set", "rounds=5", "--out", ok.to_str().unwrap()],
        dir.path(),
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ok.join("summary.json")).unwrap()).unwrap();
    assert!(summary["diverged_at"].is_null(), "{}", text(&o));
}

/// A resume whose config no longer matches its checkpoint is refused before any row of the
/// run is dropped or its summary written.
#[test]
fn a_changed_config_is_refused_before_the_run_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r");
    let out_s = out.to_str().unwrap();
    let o = fedsel(
        &[
            "run",
            "--set",
            "rounds=5",
            "--set",
            "checkpoint_every=2",
            "--out",
            out_s,
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    // As if killed after round 4: no summary, a checkpoint from before the last rows.
    std::fs::remove_file(out.join("summary.json")).unwrap();
    let metrics = std::fs::read_to_string(out.join("metrics.csv")).unwrap();
    let cfg = out.join("config.resolved.toml");
    let edited = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("rounds = 5", "rounds = 6");
    std::fs::write(&cfg, edited).unwrap();
    let o = fedsel(&["run", "--resume", out_s], dir.path());
    assert!(!o.status.success());
    assert!(text(&o).contains("different config"), "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(out.join("metrics.csv")).unwrap(),
        metrics
    );
    assert!(!out.join("summary.json").exists());
}

/// `sweep --rounds` shortens every cell of a grid, and a second sweep on a directory
/// another sweep holds is refused.
#[test]
fn sweep_rounds_shortens_the_grid_and_the_output_is_locked() {
    let dir = tempfile::tempdir().unwrap();
    let (sweep, out) = one_seed_sweep(dir.path(), 500);
    let o = sweep_into(&sweep, &out, &["--rounds", "2"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    // The one cell's directory; its lock file (`<cell>.lock`) sits beside it.
    let cell = std::fs::read_dir(out.join("cells"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .expect("a cell directory");
    let metrics = std::fs::read_to_string(cell.join("metrics.csv")).unwrap();
    assert_eq!(metrics.lines().count(), 3, "{metrics}");
    // Hold the lock as a running sweep would.
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .open(out.join("sweep.lock"))
        .unwrap();
    lock.lock().unwrap();
    let o = sweep_into(&sweep, &out, &["--rounds", "3"], dir.path());
    assert!(!o.status.success());
    assert!(
        text(&o).contains("another sweep is running"),
        "{}",
        text(&o)
    );
}

/// A LEAF-format Synthetic set of `users` users (LEAF's `train/` and `test/` JSON files),
/// user k holding 6 + k training examples and 2 test examples of 5 features; returns each
/// user's train size.
fn write_leaf_synthetic(dir: &Path, users: usize) -> Vec<usize> {
    let sizes: Vec<usize> = (0..users).map(|k| 6 + k).collect();
    for (sub, size) in [("train", None), ("test", Some(2))] {
        let names: Vec<String> = (0..users).map(|k| format!("f_{k:05}")).collect();
        let mut data = serde_json::Map::new();
        let mut counts = Vec::new();
        for (k, name) in names.iter().enumerate() {
            let n = size.unwrap_or(sizes[k]);
            let x: Vec<Vec<f64>> = (0..n)
                .map(|i| {
                    (0..5)
                        .map(|j| ((k * 7 + i * 3 + j) % 11) as f64 / 5.0 - 1.0)
                        .collect()
                })
                .collect();
            let y: Vec<usize> = (0..n).map(|i| (k + i) % 3).collect();
            counts.push(n);
            data.insert(name.clone(), serde_json::json!({ "x": x, "y": y }));
        }
        let file = serde_json::json!({ "users": names, "num_samples": counts, "user_data": data });
        std::fs::create_dir_all(dir.join(sub)).unwrap();
        std::fs::write(dir.join(sub).join("all_data.json"), file.to_string()).unwrap();
    }
    sizes
}

/// Each client's (training, held-out) sizes from a run's `clients.csv`.
fn client_sizes(run: &Path) -> Vec<(usize, usize)> {
    std::fs::read_to_string(run.join("clients.csv"))
        .unwrap()
        .lines()
        .skip(1)
        .map(|row| {
            let c: Vec<usize> = row.split(',').take(3).map(|v| v.parse().unwrap()).collect();
            (c[1], c[2])
        })
        .collect()
}

#[test]
fn a_leaf_directory_runs_with_one_client_per_user() {
    let dir = tempfile::tempdir().unwrap();
    let leaf = dir.path().join("synthetic").join("data");
    let sizes = write_leaf_synthetic(&leaf, 20);
    let path = format!("dataset.path=\"{}\"", leaf.display());
    let run = |extra: &[&str], out: &Path| {
        let mut a = vec!["run", "--set", "dataset.kind=\"leaf\"", "--set", &path];
        a.extend(["--set", "rounds=2", "--out", out.to_str().unwrap()]);
        for e in extra {
            a.extend(["--set", e]);
        }
        fedsel(&a, dir.path())
    };
    // By default, as LEAF's baselines: every LEAF training example is trained on, and a
    // client holds out its user's own test examples (2 each).
    let out = dir.path().join("run");
    let o = run(&["selection.clients_per_round=4"], &out);
    assert!(o.status.success(), "{}", text(&o));
    let all: usize = sizes.iter().sum();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains(&format!(
            "on leaf:synthetic/data [held out: each user's LEAF test data] (20 clients, {all} train / 40 test examples"
        )),
        "{stdout}"
    );
    let (train, held): (Vec<usize>, Vec<usize>) = client_sizes(&out).into_iter().unzip();
    assert_eq!(
        train, sizes,
        "each client trains on its user's LEAF train data"
    );
    assert_eq!(train.iter().sum::<usize>(), all);
    assert_eq!(held, vec![2; 20], "and holds out its user's LEAF test data");
    // `split` keeps the earlier 80/20 split of each user's train part.
    let out = dir.path().join("split");
    let o = run(&["dataset.holdout=\"split\""], &out);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("[held out: a split of each user's LEAF train data]"));
    let held: Vec<usize> = client_sizes(&out).iter().map(|(t, h)| t + h).collect();
    assert_eq!(held, sizes, "training + held-out = each user's train part");
    assert!(client_sizes(&out).iter().all(|&(t, h)| t > 0 && h > 0));
    // Another partition of LEAF data needs `split`, and the error says so.
    let o = run(&["partition.scheme.kind=\"iid\""], &dir.path().join("iid"));
    assert!(!o.status.success());
    assert!(text(&o).contains("dataset.holdout"), "{}", text(&o));
    // The data fixes the input shape: a model that does not fit it is named.
    let o = run(&["model.kind=\"cnn_fmnist\""], &dir.path().join("cnn"));
    assert!(!o.status.success());
    assert!(text(&o).contains("model.kind"), "{}", text(&o));
}

/// The worked example of `configs/leaf/` runs on a LEAF Synthetic directory.
#[test]
fn the_shipped_leaf_example_runs() {
    let dir = tempfile::tempdir().unwrap();
    let leaf = dir.path().join("synthetic").join("data");
    let sizes = write_leaf_synthetic(&leaf, 20);
    let config =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/leaf/synthetic_fedavg.toml");
    let out = dir.path().join("run");
    let o = fedsel(
        &[
            "run",
            config.to_str().unwrap(),
            "--set",
            &format!("dataset.path=\"{}\"", leaf.display()),
            "--set",
            "rounds=3",
            "--out",
            out.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let train: Vec<usize> = client_sizes(&out).iter().map(|c| c.0).collect();
    assert_eq!(train, sizes);
    let metrics = std::fs::read_to_string(out.join("metrics.csv")).unwrap();
    assert_eq!(metrics.lines().count(), 4, "{metrics}");
}

/// Sends `signal` (`INT`, `TERM`) to a long `fedsel run` once it has written some rounds,
/// and returns its exit status, its output and its directory.
fn signal_a_long_run(signal: &str, dir: &Path) -> (std::process::ExitStatus, String) {
    let out = dir.join(signal);
    let mut child = Command::new(env!("CARGO_BIN_EXE_fedsel"))
        .args(["run", "--set", "rounds=100000", "--set", "eval.every=1000"])
        .arg("--out")
        .arg(&out)
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::fs::metadata(out.join("metrics.csv")).map_or(0, |m| m.len()) < 2000 {
        assert!(
            std::time::Instant::now() < deadline,
            "the run wrote no rounds"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the run went on for 60 s after SIG{signal}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let o = child.wait_with_output().unwrap();
    (o.status, text(&o))
}

#[test]
fn sigint_and_sigterm_stop_a_run_after_its_round_with_a_summary() {
    let dir = tempfile::tempdir().unwrap();
    for (signal, status) in [("TERM", 143), ("INT", 130)] {
        let (exit, output) = signal_a_long_run(signal, dir.path());
        assert_eq!(exit.code(), Some(status), "SIG{signal}: {output}");
        assert!(
            output.contains(&format!("SIG{signal}: interrupted after round")),
            "{output}"
        );
        let out = dir.path().join(signal);
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap())
                .unwrap();
        assert_eq!(summary["status"], "interrupted", "{summary}");
        assert!(
            summary["error"].as_str().unwrap().contains("interrupted"),
            "{summary}"
        );
        let metrics = std::fs::read_to_string(out.join("metrics.csv")).unwrap();
        let rounds: Vec<usize> = metrics
            .lines()
            .skip(1)
            .map(|l| l.split(',').next().unwrap().parse().unwrap())
            .collect();
        assert!(!rounds.is_empty() && rounds.len() < 100_000);
        assert_eq!(rounds, (0..rounds.len()).collect::<Vec<_>>());
        assert_eq!(summary["rounds_completed"], rounds.len(), "{summary}");
    }
}

#[test]
fn datasets_lists_the_path_based_kinds_and_how_to_name_them() {
    let dir = tempfile::tempdir().unwrap();
    let o = fedsel(
        &["datasets", "--data-dir", dir.path().to_str().unwrap()],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    for kind in ["leaf", "flgo"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{kind} ")))
            .unwrap_or_else(|| panic!("no {kind} line in {out}"));
        assert!(
            line.contains("by path") && line.contains(&format!("kind = \"{kind}\", path =")),
            "{line}"
        );
    }
}

#[test]
fn a_sweep_whose_first_cells_fail_alike_stops_and_says_so_once() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = dir.path().join("s.toml");
    std::fs::write(
        &sweep,
        "name = \"t\"\n[config]\nrounds = 2\ndataset = { kind = \"fmnist\" }\n[axes]\nseed = [1, 2, 3, 4]\n",
    )
    .unwrap();
    let empty = dir.path().join("no-data");
    std::fs::create_dir(&empty).unwrap();
    let data = ["--jobs", "1", "--data-dir", empty.to_str().unwrap()];
    let stopped = sweep_into(&sweep, &dir.path().join("a"), &data, dir.path());
    let said = text(&stopped);
    assert!(!stopped.status.success(), "{said}");
    assert_eq!(said.matches("files not found").count(), 1, "{said}");
    assert!(
        said.contains("the first two cells it ran failed with the same error, so 2 cells were not started (--keep-going")
            && said.contains("failed: s1, s2"),
        "{said}"
    );
    let all = sweep_into(
        &sweep,
        &dir.path().join("b"),
        &[&data[..], &["--keep-going"]].concat(),
        dir.path(),
    );
    let said = text(&all);
    assert!(!all.status.success(), "{said}");
    assert_eq!(said.matches("files not found").count(), 4, "{said}");
    assert!(said.contains("4 cells failed"), "{said}");
}

/// A parser's check that `tex` is LaTeX tables that compile: balanced braces, math and
/// environments; no special character left unescaped (`% # _ ^ ~` outside math); each
/// `tabular` row with as many cells as its column spec. Returns the number of tables.
fn check_latex_tables(tex: &str) -> Result<usize, String> {
    let chars: Vec<char> = tex.chars().collect();
    let (mut i, mut math, mut depth) = (0, false, 0usize);
    let mut envs: Vec<String> = Vec::new();
    // Per open tabular: its columns, the brace depth it sits at, and the current row's `&`s.
    let mut tabulars: Vec<(usize, usize, usize)> = Vec::new();
    let mut tables = 0;
    // The `{...}` argument starting at `from`, and the index after it.
    let arg = |from: usize| -> Result<(String, usize), String> {
        if chars.get(from) != Some(&'{') {
            return Err(format!("an argument expected at {from}"));
        }
        let end = (from..chars.len())
            .find(|&j| chars[j] == '}')
            .ok_or("an unclosed argument")?;
        Ok((chars[from + 1..end].iter().collect(), end + 1))
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\\' => {
                let name: String = chars[i + 1..]
                    .iter()
                    .take_while(|c| c.is_ascii_alphabetic())
                    .collect();
                if name.is_empty() {
                    let next = *chars.get(i + 1).ok_or("a lone backslash at the end")?;
                    if next == '\\' {
                        let (cols, _, amps) =
                            tabulars.last_mut().ok_or("\\\\ outside a tabular")?;
                        if *amps + 1 != *cols {
                            return Err(format!(
                                "a row of {} cells in a tabular of {cols}",
                                *amps + 1
                            ));
                        }
                        *amps = 0;
                    } else if !"{}_%&#$".contains(next) {
                        return Err(format!("`\\{next}` is no escape"));
                    }
                    i += 2;
                    continue;
                }
                i += 1 + name.len();
                match name.as_str() {
                    "begin" => {
                        let (env, next) = arg(i)?;
                        i = next;
                        if env == "tabular" {
                            let (spec, next) = arg(i)?;
                            i = next;
                            let cols = spec.chars().filter(|c| "lcr".contains(*c)).count();
                            tabulars.push((cols, depth, 0));
                        }
                        tables += usize::from(env == "table");
                        envs.push(env);
                    }
                    "end" => {
                        let (env, next) = arg(i)?;
                        i = next;
                        if envs.pop().as_deref() != Some(env.as_str()) {
                            return Err(format!("\\end{{{env}}} closes another environment"));
                        }
                        if env == "tabular" {
                            tabulars.pop();
                        }
                    }
                    _ => {}
                }
                continue;
            }
            '{' => depth += 1,
            '}' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or(format!("an unopened }} at {i}"))?
            }
            '$' => math = !math,
            '&' if !math => {
                let (_, at, amps) = tabulars.last_mut().ok_or("& outside a tabular")?;
                if *at != depth {
                    return Err("& inside braces".into());
                }
                *amps += 1;
            }
            '%' | '#' => return Err(format!("an unescaped {c} at {i}")),
            '_' | '^' | '~' if !math => return Err(format!("an unescaped {c} at {i}")),
            '\n' if math => return Err(format!("math left open at the end of a line, at {i}")),
            _ => {}
        }
        i += 1;
    }
    if depth != 0 || math || !envs.is_empty() {
        return Err(format!(
            "unbalanced: depth {depth}, math {math}, open {envs:?}"
        ));
    }
    Ok(tables)
}

/// The checker itself rejects what pdflatex would: an unescaped underscore, a short row,
/// an unclosed environment.
#[test]
fn the_latex_check_catches_broken_tables() {
    let good = "\\begin{table}\n\\caption{a\\_b $\\pm$}\n\\begin{tabular}{ll}\na & b \\\\\n\\end{tabular}\n\\end{table}\n";
    assert_eq!(check_latex_tables(good), Ok(1));
    for bad in [
        good.replace("a\\_b", "a_b"),
        good.replace("a & b", "a b"),
        good.replace("\\end{table}\n", ""),
        good.replace("$\\pm$", "$\\pm"),
        good.replace("a & b", "50% & b"),
    ] {
        assert!(check_latex_tables(&bad).is_err(), "{bad}");
    }
}

/// Two plain runs of different strategies make one comparison naming both, with the
/// per-client accuracy table; `--format latex` writes tables that parse (and compile, where
/// pdflatex is installed); runs of other targets are refused unless `--allow-mixed`; the
/// output may not be one of the runs.
#[test]
fn report_compares_plain_runs_in_markdown_and_latex() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for (out, strategy) in [(&a, "uniform"), (&b, "powd")] {
        let o = fedsel(
            &[
                "run",
                "--set",
                "rounds=3",
                "--set",
                &format!("selection.strategy=\"{strategy}\""),
                "--out",
                out.to_str().unwrap(),
            ],
            dir.path(),
        );
        assert!(o.status.success(), "{}", text(&o));
    }
    let (a_s, b_s) = (a.to_str().unwrap(), b.to_str().unwrap());
    let o = fedsel(&["report", a_s, b_s], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let md = std::fs::read_to_string(dir.path().join("report").join("report.md")).unwrap();
    assert!(
        md.contains("2 runs in 2 arms") && md.contains("Baseline arm: strategy=uniform"),
        "{md}"
    );
    for row in [
        "| all | strategy=uniform | 1 |",
        "| all | strategy=powd | 1 |",
        "client_acc_worst10 vs strategy=uniform",
    ] {
        assert!(md.contains(row), "{row} missing from:\n{md}");
    }
    let csv = std::fs::read_to_string(dir.path().join("report/client_accuracy.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3, "{csv}");
    let cmp = dir.path().join("cmp");
    let o = fedsel(
        &[
            "report",
            a_s,
            b_s,
            "--out",
            cmp.to_str().unwrap(),
            "--format",
            "latex",
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let tex = std::fs::read_to_string(cmp.join("report.tex")).unwrap();
    assert!(!cmp.join("report.md").exists());
    assert_eq!(check_latex_tables(&tex), Ok(5), "{tex}");
    assert!(tex.contains("final\\_acc") && tex.contains("powd"), "{tex}");
    let pdflatex = Command::new("pdflatex").arg("--version").output();
    if pdflatex.is_ok_and(|o| o.status.success()) {
        let doc =
            format!("\\documentclass{{article}}\n\\begin{{document}}\n{tex}\\end{{document}}\n");
        std::fs::write(cmp.join("doc.tex"), doc).unwrap();
        let o = Command::new("pdflatex")
            .args(["-interaction=nonstopmode", "-halt-on-error", "doc.tex"])
            .current_dir(&cmp)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
    }
    // A run with other targets is another task: refused, naming the key and the flag that
    // overrides the refusal, and accepted with it.
    let c = dir.path().join("c");
    let o = fedsel(
        &[
            "run",
            "--set",
            "rounds=3",
            "--set",
            "targets=[0.9]",
            "--out",
            c.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let c_s = c.to_str().unwrap();
    let mixed = dir.path().join("mixed");
    let mixed_s = mixed.to_str().unwrap();
    let o = fedsel(&["report", a_s, c_s, "--out", mixed_s], dir.path());
    assert!(!o.status.success());
    assert!(
        text(&o).contains("`targets` is") && text(&o).contains("--allow-mixed"),
        "{}",
        text(&o)
    );
    let o = fedsel(
        &["report", a_s, c_s, "--out", mixed_s, "--allow-mixed"],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    // Into one of the runs: refused, and the run is left as it was.
    let o = fedsel(&["report", a_s, b_s, "--out", a_s], dir.path());
    assert!(!o.status.success());
    assert!(text(&o).contains("--out"), "{}", text(&o));
    assert!(!a.join("report.md").exists());
}

/// The rows of a CSV file, its `elapsed_s` column (wall-clock time) left out.
fn rows_without_time(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let col = text
        .lines()
        .next()
        .unwrap()
        .split(',')
        .position(|c| c == "elapsed_s");
    text.lines()
        .map(|l| {
            let mut f: Vec<&str> = l.split(',').collect();
            if let Some(c) = col {
                f.remove(c);
            }
            f.join(",")
        })
        .collect()
}

/// `fedsel run --help` names every strategy and every table of the schema.
#[test]
fn run_help_prints_the_whole_schema() {
    let dir = tempfile::tempdir().unwrap();
    let o = fedsel(&["run", "--help"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let help = text(&o);
    for word in [
        "uniform",
        "md",
        "powd",
        "cpowd",
        "rpowd",
        "afl",
        "fedcor",
        "fedgp",
        "fedgs",
        "f3ast",
        "hics",
        "cs1",
        "cs2",
        "divfl",
        "oort",
        "fedcs",
        "tifl",
        "refl",
        "fedbalancer",
        "pyramidfl",
        "fedbuff",
        "[system.stale]",
        "[output]",
        "idle_s",
    ] {
        assert!(help.contains(word), "`{word}` missing from:\n{help}");
    }
}

/// A FedBuff run killed after its last checkpoint resumes from it: the rows after the
/// checkpoint are written again, equal to the uninterrupted run's, and the summary says
/// "finished" (it used to be refused, after its rows had been cut).
#[test]
fn a_killed_fedbuff_run_resumes_to_the_same_rows() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r");
    let out_s = out.to_str().unwrap();
    let o = fedsel(
        &[
            "run",
            "--set",
            "rounds=7",
            "--set",
            "checkpoint_every=3",
            "--set",
            "system.kind=\"lognormal\"",
            "--set",
            "system.round={policy=\"fedbuff\", concurrency=10, buffer_size=6}",
            "--out",
            out_s,
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let metrics = rows_without_time(&out.join("metrics.csv"));
    let selections = rows_without_time(&out.join("selections.csv"));
    // As if killed after round 6: no summary; the checkpoint resumes at round 6.
    std::fs::remove_file(out.join("summary.json")).unwrap();
    let o = fedsel(&["run", "--resume", out_s], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(rows_without_time(&out.join("metrics.csv")), metrics);
    assert_eq!(rows_without_time(&out.join("selections.csv")), selections);
    let summary = std::fs::read_to_string(out.join("summary.json")).unwrap();
    assert!(summary.contains("\"finished\""), "{summary}");
}

/// A sweep whose stale-update cell was killed after its last checkpoint resumes the cell on
/// the next sweep, to the rows of the uninterrupted cell.
#[test]
fn a_killed_stale_update_sweep_cell_resumes_to_the_same_rows() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = dir.path().join("s.toml");
    std::fs::write(
        &sweep,
        "name = \"t\"\n[config]\nrounds = 7\ncheckpoint_every = 3\n\
         system = { kind = \"lognormal\", round = { policy = \"deadline\", deadline_s = 1.5 }, stale = { stale_update = -1 } }\n\
         [axes]\nseed = [1]\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = sweep_into(&sweep, &out, &[], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let cell = std::fs::read_dir(out.join("cells"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .expect("a cell directory");
    let rows = |name: &str| rows_without_time(&cell.join(name));
    let (metrics, selections) = (rows("metrics.csv"), rows("selections.csv"));
    assert!(fedsel::checkpoint::load(&cell).is_ok());
    std::fs::remove_file(cell.join("summary.json")).unwrap();
    let o = sweep_into(&sweep, &out, &[], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(rows("metrics.csv"), metrics);
    assert_eq!(rows("selections.csv"), selections);
    let summary = std::fs::read_to_string(cell.join("summary.json")).unwrap();
    assert!(summary.contains("\"finished\""), "{summary}");
}

#[test]
fn a_runs_summary_names_the_commit_of_its_build() {
    let dir = tempfile::tempdir().unwrap();
    let out = fedsel(&["run", "--set", "rounds=2", "--out", "r"], dir.path());
    assert!(out.status.success(), "{}", text(&out));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("r/summary.json")).unwrap())
            .unwrap();
    let commit = summary["commit"].as_str().unwrap();
    assert_eq!(commit, fedsel::build_commit());
    let version = text(&fedsel(&["--version"], dir.path()));
    assert!(version.contains(&format!("({commit})")), "{version}");
    // In a checkout (CI's clone, a developer's tree) it is HEAD's, dirty or not.
    let head = Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match head {
        Some(head) => assert_eq!(commit.trim_end_matches("+dirty"), head),
        None => assert_eq!(commit, "unknown"),
    }
}
