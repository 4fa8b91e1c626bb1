//! CIFAR-10 and CIFAR-100, "binary version".
//!
//! CIFAR-10 records are `<label><3072 pixels>`, CIFAR-100 records
//! `<coarse><fine><3072 pixels>`; pixels are 1024 R, 1024 G, 1024 B bytes.
//! Sizes are always checked; with verification on (the default) each file's
//! MD5 must equal the published one. Pixels are normalised with mean and std
//! 0.5 per channel, as in the FedCor code.

use std::path::Path;

use super::{Dataset, FederatedData, Inputs, read_file};
use crate::digest::md5_hex;
use crate::error::DataError;

/// CIFAR-10 subdirectory of the data directory.
pub const DIR10: &str = "cifar-10-batches-bin";
/// CIFAR-100 subdirectory of the data directory.
pub const DIR100: &str = "cifar-100-binary";

const PIXELS: usize = 3072;

const CIFAR10_TRAIN: [(&str, &str); 5] = [
    ("data_batch_1.bin", "5dd7e06a14cb22eb9f671a540d1b7c25"),
    ("data_batch_2.bin", "5ea93a67294ea407fff1d09f752e9692"),
    ("data_batch_3.bin", "942cd6a4bcdd0dd3c604fbe906cb4421"),
    ("data_batch_4.bin", "ae636b3ba5c66a11e91e8cb52e771fcb"),
    ("data_batch_5.bin", "53f37980c15c3d472c316c40844f3f0d"),
];
const CIFAR10_TEST: (&str, &str) = ("test_batch.bin", "803d5f7f4d78ea53de84dbe85f74fb6d");
const CIFAR100_TRAIN: (&str, &str) = ("train.bin", "6172c7755cfe09b2fe270c85cebc1b15");
const CIFAR100_TEST: (&str, &str) = ("test.bin", "4499cfba6c016c1be1438163640a0898");

/// The record layout and published files of CIFAR-10 or CIFAR-100.
pub struct Variant {
    name: &'static str,
    /// Label bytes before the pixels.
    label_bytes: usize,
    /// Which of them is the label used.
    label_at: usize,
    classes: usize,
    /// Records per file in the published copy.
    records: (usize, usize),
    hint: &'static str,
}

/// CIFAR-10: one label byte per record.
pub const V10: Variant = Variant {
    name: "cifar10",
    label_bytes: 1,
    label_at: 0,
    classes: 10,
    records: (10_000, 10_000),
    hint: "Download https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz, extract it in the data directory (it creates cifar-10-batches-bin/), and point --data-dir or FEDSEL_DATA there.",
};
/// CIFAR-100: coarse and fine label bytes per record; the fine one is used.
pub const V100: Variant = Variant {
    name: "cifar100",
    label_bytes: 2,
    label_at: 1,
    classes: 100,
    records: (50_000, 10_000),
    hint: "Download https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz, extract it in the data directory (it creates cifar-100-binary/), and point --data-dir or FEDSEL_DATA there.",
};

/// Whether every CIFAR-10 file is present under `dir`.
pub fn available10(dir: &Path) -> bool {
    CIFAR10_TRAIN
        .iter()
        .chain([&CIFAR10_TEST])
        .all(|f| dir.join(f.0).is_file())
}

/// Whether every CIFAR-100 file is present under `dir`.
pub fn available100(dir: &Path) -> bool {
    [CIFAR100_TRAIN, CIFAR100_TEST]
        .iter()
        .all(|f| dir.join(f.0).is_file())
}

/// Parses files of `variant` into one dataset.
fn read_files(
    dir: &Path,
    files: &[(&str, &str)],
    v: &Variant,
    published: usize,
    verify: bool,
) -> Result<Dataset, DataError> {
    let missing: Vec<&str> = files
        .iter()
        .filter(|f| !dir.join(f.0).is_file())
        .map(|f| f.0)
        .collect();
    if !missing.is_empty() {
        return Err(DataError::Missing {
            dataset: v.name.into(),
            dir: dir.to_path_buf(),
            missing: missing.join(", "),
            hint: v.hint.into(),
        });
    }
    let record = v.label_bytes + PIXELS;
    let mut values = Vec::new();
    let mut labels = Vec::new();
    for (name, md5) in files {
        let path = dir.join(name);
        let bytes = read_file(&path)?;
        if verify {
            if bytes.len() != published * record {
                return Err(DataError::corrupt(
                    &path,
                    format!(
                        "{} bytes, the published file has {}",
                        bytes.len(),
                        published * record
                    ),
                ));
            }
            let got = md5_hex(&bytes);
            if got != *md5 {
                return Err(DataError::corrupt(
                    &path,
                    format!(
                        "MD5 is {got}, expected {md5} (set verify_checksums = false to load a modified copy)"
                    ),
                ));
            }
        }
        parse_records(&path, &bytes, v, &mut labels, &mut values)?;
    }
    Ok(Dataset {
        inputs: Inputs::Dense {
            shape: vec![3, 32, 32],
            values,
        },
        labels,
        classes: v.classes,
    })
}

/// Decodes the records of one batch file of variant `v` (`path` names it in errors),
/// appending labels and normalised pixel planes: the file must be a whole, non-zero
/// number of records and every label within the variant's classes.
pub fn parse_records(
    path: &Path,
    bytes: &[u8],
    v: &Variant,
    labels: &mut Vec<u32>,
    values: &mut Vec<f32>,
) -> Result<(), DataError> {
    let record = v.label_bytes + PIXELS;
    if bytes.is_empty() || !bytes.len().is_multiple_of(record) {
        return Err(DataError::corrupt(
            path,
            format!(
                "{} bytes is not a whole number of {record}-byte records; truncated?",
                bytes.len()
            ),
        ));
    }
    for (i, rec) in bytes.chunks_exact(record).enumerate() {
        let label = rec[v.label_at] as usize;
        if label >= v.classes {
            return Err(DataError::corrupt(
                path,
                format!("record {i} has label {label}, outside 0..{}", v.classes),
            ));
        }
        labels.push(label as u32);
        values.extend(
            rec[v.label_bytes..]
                .iter()
                .map(|&p| (p as f32 / 255.0 - 0.5) / 0.5),
        );
    }
    Ok(())
}

/// Loads CIFAR-10 from `dir` (`cifar-10-batches-bin`).
pub fn load_cifar10(dir: &Path, verify: bool) -> Result<FederatedData, DataError> {
    Ok(FederatedData {
        name: "cifar10".into(),
        train: read_files(dir, &CIFAR10_TRAIN, &V10, V10.records.0, verify)?,
        test: read_files(dir, &[CIFAR10_TEST], &V10, V10.records.1, verify)?,
        users: None,
        user_models: None,
        user_holdout: None,
    })
}

/// Loads CIFAR-100 (fine labels) from `dir` (`cifar-100-binary`).
pub fn load_cifar100(dir: &Path, verify: bool) -> Result<FederatedData, DataError> {
    Ok(FederatedData {
        name: "cifar100".into(),
        train: read_files(dir, &[CIFAR100_TRAIN], &V100, V100.records.0, verify)?,
        test: read_files(dir, &[CIFAR100_TEST], &V100, V100.records.1, verify)?,
        users: None,
        user_models: None,
        user_holdout: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_batch(path: &Path, labels: &[u8], label_bytes: usize) {
        let mut bytes = Vec::new();
        for (i, &l) in labels.iter().enumerate() {
            if label_bytes == 2 {
                bytes.push(l / 5);
            }
            bytes.push(l);
            bytes.extend((0..PIXELS).map(|p| ((p + i) % 256) as u8));
        }
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn cifar10_generated_files_load_with_normalised_planes() {
        let dir = tempfile::tempdir().unwrap();
        for (k, (name, _)) in CIFAR10_TRAIN.iter().enumerate() {
            write_batch(&dir.path().join(name), &[k as u8, 9, 3], 1);
        }
        write_batch(&dir.path().join(CIFAR10_TEST.0), &[1, 2], 1);
        let d = load_cifar10(dir.path(), false).unwrap();
        assert_eq!(d.train.len(), 15);
        assert_eq!(d.test.labels, vec![1, 2]);
        assert_eq!(&d.train.labels[..3], &[0, 9, 3]);
        let Inputs::Dense { shape, values } = &d.train.inputs else {
            panic!()
        };
        assert_eq!(shape, &vec![3, 32, 32]);
        // Pixel p of record 0 is p % 256: value 0 maps to -1, 255 to +1.
        assert_eq!(values[0], -1.0);
        assert_eq!(values[255], 1.0);
        // Verification rejects a copy that is not the published one, by name.
        let err = load_cifar10(dir.path(), true).unwrap_err().to_string();
        assert!(err.contains("data_batch_1.bin"), "{err}");
    }

    #[test]
    fn cifar100_uses_fine_labels_and_reports_truncation() {
        let dir = tempfile::tempdir().unwrap();
        write_batch(&dir.path().join("train.bin"), &[99, 42, 7], 2);
        write_batch(&dir.path().join("test.bin"), &[5], 2);
        let d = load_cifar100(dir.path(), false).unwrap();
        assert_eq!(d.train.labels, vec![99, 42, 7]);
        assert_eq!(d.train.classes, 100);
        let path = dir.path().join("test.bin");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.truncate(1000);
        std::fs::write(&path, bytes).unwrap();
        let err = load_cifar100(dir.path(), false).unwrap_err().to_string();
        assert!(
            err.contains("test.bin") && err.contains("truncated"),
            "{err}"
        );
    }

    #[test]
    fn missing_files_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        let err = load_cifar10(dir.path(), true).unwrap_err().to_string();
        assert!(
            err.contains("data_batch_1.bin") && err.contains("cifar-10-binary.tar.gz"),
            "{err}"
        );
    }
}
