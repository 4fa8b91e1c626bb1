//! FedScale device and behave pickles written with NumPy scalars and arrays, by numpy 1.x
//! and 2.x at pickle protocols 0, 2, 4 and 5 (`tests/data/fedscale/make_numpy_pickles.py`
//! wrote them): the reader gets the values the script put there, and they drive a run.

#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};

use common::Collect;
use fedsel::config::Config;
use fedsel::data::locate;
use fedsel::engine::{self, Experiment};
use fedsel::system::behave::Activity;
use fedsel::system::fedscale::{load_behave, load_devices};
use fedsel::system::profile::Profile;

fn fixtures() -> Vec<(String, PathBuf, PathBuf)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fedscale");
    let mut out = Vec::new();
    for numpy in ["np1", "np2"] {
        for protocol in [0, 2, 4, 5] {
            let stem = format!("{numpy}-p{protocol}");
            out.push((
                stem.clone(),
                dir.join(format!("{stem}-device.pkl")),
                dir.join(format!("{stem}-behave.pkl")),
            ));
        }
    }
    out
}

#[test]
fn numpy_scalars_and_arrays_read_as_the_values_the_script_wrote() {
    let profile = |c: f64, b: f64| Profile {
        compute_ms_per_sample: c,
        bandwidth_kbps: b,
    };
    // Client k reads the device of key (k + 1) mod 4 and the trace at position (k + 1) mod 3.
    let devices = vec![
        profile(20.25, 1500.5),
        profile(30.0, 2500.0),
        profile(40.125, 3200.0),
        profile(10.5, 800.0),
    ];
    let traces = vec![
        Activity::new(vec![5.0, 60.0], vec![30.0, 90.0], 500.0).unwrap(),
        Activity::new(vec![0.0], vec![40.0], 400.0).unwrap(),
        Activity::new(vec![0.0, 100.0, 250.5], vec![50.0, 200.0, 300.0], 1000.0).unwrap(),
    ];
    for (name, device, behave) in fixtures() {
        assert_eq!(load_devices(&device, 4).unwrap(), devices, "{name}");
        assert_eq!(load_behave(&behave, 3).unwrap(), traces, "{name}");
    }
}

#[test]
fn a_numpy_type_fedsel_does_not_read_is_refused_naming_it_and_the_conversion() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fedscale");
    for numpy in ["np1", "np2"] {
        for protocol in [0, 2, 4, 5] {
            let path = dir.join(format!("{numpy}-p{protocol}-float16.pkl"));
            let err = load_devices(&path, 1).unwrap_err().to_string();
            assert!(
                err.contains("float16.pkl")
                    && err.contains("numpy.float16")
                    && err.contains(".item()")
                    && err.contains(".tolist()"),
                "{numpy} protocol {protocol}: {err}"
            );
        }
    }
}

#[test]
fn big_endian_arrays_are_read_and_a_2d_array_is_refused() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fedscale");
    for numpy in ["np1", "np2"] {
        let big = load_behave(&dir.join(format!("{numpy}-bigendian.pkl")), 1).unwrap();
        let want = Activity::new(vec![0.0, 100.5], vec![50.0, 200.0], 1000.0).unwrap();
        assert_eq!(big, vec![want], "{numpy}");
        let err = load_devices(&dir.join(format!("{numpy}-2d.pkl")), 1)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("shape [2, 2]") && err.contains(".tolist()"),
            "{numpy}: {err}"
        );
    }
}

#[test]
fn numpy_pickles_drive_a_run() {
    for (name, device, behave) in fixtures() {
        let set = vec![
            "rounds=2".to_string(),
            "train.work={steps=2}".into(),
            "selection.clients_per_round=5".into(),
            "system.kind=\"fedscale\"".into(),
            format!("system.path={:?}", device.display().to_string()),
            format!("system.behave_trace={:?}", behave.display().to_string()),
        ];
        let config = Config::load(None, &set).unwrap();
        let exp = Experiment::prepare(config, &locate::data_dir(None, None)).unwrap();
        let mut c = Collect::default();
        engine::run(&exp, &mut c).unwrap();
        assert_eq!(c.0.len(), 2, "{name}");
        // At 0 s the traces at positions 0 and 2 are online, position 1 (from 5 s) is not:
        // client k reads position (k + 1) mod 3.
        let clients = exp.config.partition.clients;
        let online: Vec<usize> = (0..clients).filter(|k| (k + 1) % 3 != 1).collect();
        assert_eq!(c.0[0].available, online, "{name}");
        assert!(c.0[0].clock.is_some(), "{name}");
    }
}
