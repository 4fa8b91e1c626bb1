//! Fashion-MNIST from the four IDX files (gzip-compressed or raw).
//!
//! The loader checks each file's magic number, shape and count, then the
//! SHA-256 of its decompressed bytes against the published files, so a
//! truncated or corrupt copy is reported by name instead of training on noise.
//! Pixels are scaled to [0, 1] and normalised with (0.1307, 0.3081), as the
//! FedCor code does, or with (0.5, 0.5), as the HiCS-FL code does
//! (`dataset.normalize`, [`FmnistNormalize`]).

use std::borrow::Cow;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::{Dataset, FederatedData, Inputs, read_file};
use crate::config::FmnistNormalize;
use crate::digest::sha256_hex;
use crate::error::DataError;

/// Subdirectory of the data directory.
pub const DIR: &str = "fashion-mnist";

/// (file stem, magic, count, SHA-256 of the decompressed file).
const FILES: [(&str, u32, usize, &str); 4] = [
    (
        "train-images-idx3-ubyte",
        2051,
        60_000,
        "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    ),
    (
        "train-labels-idx1-ubyte",
        2049,
        60_000,
        "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    ),
    (
        "t10k-images-idx3-ubyte",
        2051,
        10_000,
        "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    ),
    (
        "t10k-labels-idx1-ubyte",
        2049,
        10_000,
        "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    ),
];

/// The (mean, std) each pixel in [0, 1] is normalised with.
fn mean_std(normalize: FmnistNormalize) -> (f32, f32) {
    match normalize {
        // MNIST's statistics, as the FedCor code's `transforms.Normalize((0.1307,), (0.3081,))`.
        FmnistNormalize::Mnist => (0.1307, 0.3081),
        // The HiCS-FL code's `transforms.Normalize((0.5), (0.5))` (`sampling.py`): [−1, 1].
        FmnistNormalize::Half => (0.5, 0.5),
    }
}

/// Path of `stem` under `dir`, preferring the raw file over `.gz`; `None` if neither exists.
fn find(dir: &Path, stem: &str) -> Option<PathBuf> {
    [stem.to_string(), format!("{stem}.gz")]
        .into_iter()
        .map(|n| dir.join(n))
        .find(|p| p.is_file())
}

/// Whether all four files are present under `dir`.
pub fn available(dir: &Path) -> bool {
    FILES.iter().all(|f| find(dir, f.0).is_some())
}

/// Size of the largest file of the set (training images), decompressed. A gzip stream
/// can inflate a thousandfold, so a small damaged or hostile file could otherwise fill
/// memory before any check of its contents.
const MAX_DECOMPRESSED: usize = 16 + 60_000 * 28 * 28;

/// A file's bytes, inflated if they start with the gzip magic.
fn decompress<'a>(path: &Path, raw: &'a [u8]) -> Result<Cow<'a, [u8]>, DataError> {
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return Ok(Cow::Borrowed(raw));
    }
    let mut out = Vec::with_capacity(raw.len().saturating_mul(2).min(MAX_DECOMPRESSED));
    flate2::read::GzDecoder::new(raw)
        .take(MAX_DECOMPRESSED as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| DataError::corrupt(path, format!("gzip stream is damaged: {e}")))?;
    if out.len() > MAX_DECOMPRESSED {
        return Err(DataError::corrupt(
            path,
            format!(
                "inflates to more than {MAX_DECOMPRESSED} bytes, the largest Fashion-MNIST file"
            ),
        ));
    }
    Ok(Cow::Owned(out))
}

fn be_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// Parses an IDX file's header and returns (dims, payload).
///
/// `magic` is 2049 for labels (1-D) and 2051 for images (3-D).
pub fn parse_idx<'a>(
    path: &Path,
    bytes: &'a [u8],
    magic: u32,
) -> Result<(Vec<usize>, &'a [u8]), DataError> {
    let ndim = (magic & 0xff) as usize;
    let header = 4 + 4 * ndim;
    if bytes.len() < header {
        return Err(DataError::corrupt(
            path,
            format!("file is {} bytes, shorter than its IDX header", bytes.len()),
        ));
    }
    let found = be_u32(bytes, 0);
    if found != magic {
        return Err(DataError::corrupt(
            path,
            format!("magic number is {found}, expected {magic}"),
        ));
    }
    let dims: Vec<usize> = (0..ndim)
        .map(|i| be_u32(bytes, 4 + 4 * i) as usize)
        .collect();
    let expected = dims
        .iter()
        .try_fold(1usize, |bytes, &d| bytes.checked_mul(d))
        .ok_or_else(|| {
            DataError::corrupt(
                path,
                format!("header dimensions {dims:?} promise more bytes than memory can address"),
            )
        })?;
    let payload = &bytes[header..];
    if payload.len() != expected {
        return Err(DataError::corrupt(
            path,
            format!(
                "header promises {expected} bytes of data {dims:?} but the file holds {}; truncated?",
                payload.len()
            ),
        ));
    }
    Ok((dims, payload))
}

/// The training or the test half of the set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// 60 000 examples.
    Train,
    /// 10 000 examples.
    Test,
}

impl Split {
    /// Indices into [`FILES`] of the images and the labels.
    fn files(self) -> (usize, usize) {
        match self {
            Self::Train => (0, 1),
            Self::Test => (2, 3),
        }
    }
}

/// Reads one split's two files and parses them.
fn load_split(
    dir: &Path,
    split: Split,
    verify: bool,
    normalize: FmnistNormalize,
) -> Result<Dataset, DataError> {
    let read = |i: usize| -> Result<(PathBuf, Vec<u8>), DataError> {
        let (stem, ..) = FILES[i];
        let path = find(dir, stem).ok_or_else(|| missing(dir, stem))?;
        let bytes = read_file(&path)?;
        Ok((path, bytes))
    };
    let (images, labels) = split.files();
    let (ipath, ibytes) = read(images)?;
    let (lpath, lbytes) = read(labels)?;
    parse_split(
        split,
        (&ipath, &ibytes),
        (&lpath, &lbytes),
        verify,
        normalize,
    )
}

/// Parses one split from the bytes of its image and label files (each gzip-compressed
/// or raw, with the path errors name), with every check [`load`] makes: magic numbers,
/// shapes, counts, labels and, when `verify` is on, the published SHA-256; pixels are
/// normalised as `normalize` says.
pub fn parse_split(
    split: Split,
    (ipath, iraw): (&Path, &[u8]),
    (lpath, lraw): (&Path, &[u8]),
    verify: bool,
    normalize: FmnistNormalize,
) -> Result<Dataset, DataError> {
    let (images, labels) = split.files();
    let ibytes = decompress(ipath, iraw)?;
    let lbytes = decompress(lpath, lraw)?;
    let (idims, ipix) = parse_idx(ipath, &ibytes, FILES[images].1)?;
    let (_, lab) = parse_idx(lpath, &lbytes, FILES[labels].1)?;
    for (path, dims0, i) in [(ipath, idims[0], images), (lpath, lab.len(), labels)] {
        if dims0 != FILES[i].2 {
            return Err(DataError::corrupt(
                path,
                format!("holds {dims0} items, Fashion-MNIST has {}", FILES[i].2),
            ));
        }
    }
    if idims[1..] != [28, 28] {
        return Err(DataError::corrupt(
            ipath,
            format!("images are {}x{}, expected 28x28", idims[1], idims[2]),
        ));
    }
    if verify {
        for (path, bytes, i) in [(ipath, &ibytes, images), (lpath, &lbytes, labels)] {
            let got = sha256_hex(bytes);
            if got != FILES[i].3 {
                return Err(DataError::corrupt(
                    path,
                    format!(
                        "SHA-256 of the decompressed file is {got}, expected {}",
                        FILES[i].3
                    ),
                ));
            }
        }
    }
    if let Some(bad) = lab.iter().find(|&&l| l > 9) {
        return Err(DataError::corrupt(
            lpath,
            format!("label {bad} is outside 0..9"),
        ));
    }
    let (mean, std) = mean_std(normalize);
    Ok(Dataset {
        inputs: Inputs::Dense {
            shape: vec![1, 28, 28],
            values: ipix
                .iter()
                .map(|&p| (p as f32 / 255.0 - mean) / std)
                .collect(),
        },
        labels: lab.iter().map(|&l| l as u32).collect(),
        classes: 10,
    })
}

fn missing(dir: &Path, stem: &str) -> DataError {
    DataError::Missing {
        dataset: "fmnist".into(),
        dir: dir.to_path_buf(),
        missing: format!("{stem}[.gz]"),
        hint: "Get the four files from https://github.com/zalandoresearch/fashion-mnist (data/fashion) or `apt-get install dataset-fashion-mnist`, and point --data-dir or FEDSEL_DATA at their parent directory.".into(),
    }
}

/// Loads Fashion-MNIST from `dir`, verifying checksums, with the default normalisation.
pub fn load(dir: &Path) -> Result<FederatedData, DataError> {
    load_with(dir, true, FmnistNormalize::default())
}

/// Loads Fashion-MNIST; `verify` turns the checksum check on or off (shape checks always run),
/// and `normalize` picks the pixels' normalisation.
pub fn load_with(
    dir: &Path,
    verify: bool,
    normalize: FmnistNormalize,
) -> Result<FederatedData, DataError> {
    Ok(FederatedData {
        name: "fmnist".into(),
        train: load_split(dir, Split::Train, verify, normalize)?,
        test: load_split(dir, Split::Test, verify, normalize)?,
        users: None,
        user_models: None,
        user_holdout: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(magic: u32, dims: &[u32], payload: &[u8]) -> Vec<u8> {
        let mut bytes = magic.to_be_bytes().to_vec();
        bytes.extend(dims.iter().flat_map(|d| d.to_be_bytes()));
        bytes.extend_from_slice(payload);
        bytes
    }

    /// Pixels 0, 51, 128 and 255 of a one-image split under each normalisation:
    /// (p/255 − 0.1307)/0.3081 by default (every existing result's), (p/255 − 0.5)/0.5
    /// under `half`, so that 0 and 255 land on −1 and 1 exactly.
    #[test]
    fn pixels_are_normalised_as_the_config_says() {
        let mut pixels = vec![0u8; 784];
        pixels[..4].copy_from_slice(&[0, 51, 128, 255]);
        let images = idx(2051, &[10_000, 28, 28], &pixels.repeat(10_000));
        let labels = idx(2049, &[10_000], &[3; 10_000]);
        let parse = |normalize| {
            let d = parse_split(
                Split::Test,
                (Path::new("images"), &images),
                (Path::new("labels"), &labels),
                false,
                normalize,
            )
            .unwrap();
            let Inputs::Dense { values, .. } = d.inputs else {
                unreachable!("Fashion-MNIST is dense")
            };
            values[..4].to_vec()
        };
        let mnist = parse(FmnistNormalize::Mnist);
        let expected = [-0.424_212_96, 0.224_926_96, 1.205_001_1, 2.821_486_7];
        for (v, e) in mnist.iter().zip(expected) {
            assert!((v - e).abs() < 1e-6, "{mnist:?}");
        }
        assert_eq!(parse(FmnistNormalize::default()), mnist);
        let half = parse(FmnistNormalize::Half);
        assert_eq!(half[0], -1.0);
        assert_eq!(half[3], 1.0);
        assert!((half[1] + 0.6).abs() < 1e-6 && (half[2] - 1.0 / 255.0).abs() < 1e-6);
    }

    #[test]
    fn a_small_idx_file_parses_and_a_short_one_is_named() {
        let path = Path::new("labels");
        let bytes = idx(2049, &[3], &[1, 2, 3]);
        let (dims, payload) = parse_idx(path, &bytes, 2049).unwrap();
        assert_eq!((dims, payload), (vec![3], &[1, 2, 3][..]));
        let err = parse_idx(path, &bytes[..6], 2049).unwrap_err().to_string();
        assert!(err.contains("labels") && err.contains("header"), "{err}");
    }

    /// Found by the `idx` fuzz target (minimized): three image dimensions whose product
    /// overflows `usize` panicked in debug builds and wrapped in release ones.
    #[test]
    fn dimensions_whose_product_overflows_are_corrupt() {
        let bytes = idx(2051, &[0x8453_5a61, 0x686f_767d, 0x8400_0309], &[]);
        let err = parse_idx(Path::new("images"), &bytes, 2051)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("images") && err.contains("more bytes than"),
            "{err}"
        );
    }

    #[test]
    fn a_gzip_stream_inflating_past_the_largest_file_is_refused() {
        use std::io::Write;
        let gz = |len: usize| {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            e.write_all(&vec![0; len]).unwrap();
            e.finish().unwrap()
        };
        let path = Path::new("train-images-idx3-ubyte.gz");
        assert_eq!(
            decompress(path, &gz(MAX_DECOMPRESSED)).unwrap().len(),
            MAX_DECOMPRESSED
        );
        let bomb = gz(MAX_DECOMPRESSED + 1);
        assert!(bomb.len() < MAX_DECOMPRESSED / 500);
        let err = decompress(path, &bomb).unwrap_err().to_string();
        assert!(
            err.contains("idx3-ubyte.gz") && err.contains("inflates"),
            "{err}"
        );
    }
}
