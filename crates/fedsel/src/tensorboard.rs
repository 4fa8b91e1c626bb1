//! TensorBoard event files (`fedsel run --tensorboard DIR`, `[output] tensorboard`).
//!
//! An event file is a sequence of TFRecords, each `u64` length (little-endian), the masked
//! CRC32C of those 8 bytes, the data, and the masked CRC32C of the data; each record's data
//! is a serialized `tensorflow.Event`. The few messages needed are written here as `prost`
//! structs with the field numbers of TensorBoard's `event.proto`, `summary.proto`,
//! `tensor.proto` and `tensor_shape.proto` (no build script, no protoc).
//!
//! What a run writes (docs/experiments.md, "Trackers"):
//! - every `metrics.csv` column but `round` as a scalar by round (step = the round, tag =
//!   the column's name), a round's empty cells (no evaluation) left out;
//! - where `[system]` runs a virtual clock, every column again by virtual time, tag
//!   `time/<column>`, step = the clock at the round's end in whole virtual milliseconds
//!   (TensorBoard's steps are integers; seconds would merge sub-second rounds), and at
//!   least one step after the previous round's, so that neither sub-millisecond rounds
//!   nor a clock past i64's milliseconds merge rounds into one step;
//! - the round's selection (duplicates counted) as the histogram `selection`, one bucket per
//!   selected client id;
//! - the resolved config as the text `config` (a Markdown code block, as TensorBoard's text
//!   plugin renders Markdown).
//!
//! Writing a tracker never fails or stops a run once the file is open: an error is logged
//! once, naming the file, and the tracker writes nothing more.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use prost::Message;

use crate::engine::RoundRecord;
use crate::error::{Error, Result};

/// `tensorflow.Event`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    /// Seconds since the Unix epoch when the event was written.
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    /// The x-axis of the event's values.
    #[prost(int64, tag = "2")]
    pub step: i64,
    /// The event's content.
    #[prost(oneof = "What", tags = "3, 5")]
    pub what: Option<What>,
}

/// `Event.what`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum What {
    /// `brain.Event:2`: the first event of a file.
    #[prost(string, tag = "3")]
    FileVersion(String),
    /// Values.
    #[prost(message, tag = "5")]
    Summary(Summary),
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    /// The values.
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<Value>,
}

/// `tensorflow.Summary.Value`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Value {
    /// The value's name.
    #[prost(string, tag = "1")]
    pub tag: String,
    /// Which plugin reads a tensor value.
    #[prost(message, optional, tag = "9")]
    pub metadata: Option<SummaryMetadata>,
    /// The value.
    #[prost(oneof = "Kind", tags = "2, 5, 8")]
    pub kind: Option<Kind>,
}

/// `Summary.Value.value`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Kind {
    /// A scalar.
    #[prost(float, tag = "2")]
    SimpleValue(f32),
    /// A histogram.
    #[prost(message, tag = "5")]
    Histo(HistogramProto),
    /// A tensor (text).
    #[prost(message, tag = "8")]
    Tensor(TensorProto),
}

/// `tensorflow.HistogramProto`: bucket `i` counts the values in
/// `(bucket_limit[i-1], bucket_limit[i]]`, the first from `min`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HistogramProto {
    /// Smallest value.
    #[prost(double, tag = "1")]
    pub min: f64,
    /// Largest value.
    #[prost(double, tag = "2")]
    pub max: f64,
    /// Number of values.
    #[prost(double, tag = "3")]
    pub num: f64,
    /// Their sum.
    #[prost(double, tag = "4")]
    pub sum: f64,
    /// The sum of their squares.
    #[prost(double, tag = "5")]
    pub sum_squares: f64,
    /// Right edges of the buckets.
    #[prost(double, repeated, tag = "6")]
    pub bucket_limit: Vec<f64>,
    /// Counts of the buckets.
    #[prost(double, repeated, tag = "7")]
    pub bucket: Vec<f64>,
}

/// `tensorflow.SummaryMetadata`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryMetadata {
    /// The plugin.
    #[prost(message, optional, tag = "1")]
    pub plugin_data: Option<PluginData>,
}

/// `tensorflow.SummaryMetadata.PluginData`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginData {
    /// `text` for text.
    #[prost(string, tag = "1")]
    pub plugin_name: String,
    /// The plugin's own data (none for text).
    #[prost(bytes = "vec", tag = "2")]
    pub content: Vec<u8>,
}

/// `tensorflow.TensorProto`, as much as a string scalar needs.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    /// `DataType`: 7 is `DT_STRING`.
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    /// The shape (no dimensions: a scalar).
    #[prost(message, optional, tag = "2")]
    pub tensor_shape: Option<TensorShapeProto>,
    /// The strings.
    #[prost(bytes = "vec", repeated, tag = "8")]
    pub string_val: Vec<Vec<u8>>,
}

/// `tensorflow.TensorShapeProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {
    /// The dimensions' sizes.
    #[prost(message, repeated, tag = "2")]
    pub dim: Vec<Dim>,
}

/// `tensorflow.TensorShapeProto.Dim`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Dim {
    /// The size.
    #[prost(int64, tag = "1")]
    pub size: i64,
}

/// TFRecord's masked CRC32C: the checksum rotated right by 15 bits plus a constant, so that
/// a record holding CRCs does not checksum to something degenerate.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Appends `data` to `out` as one TFRecord.
pub fn frame_record(data: &[u8], out: &mut Vec<u8>) {
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
}

/// A histogram with one bucket per distinct id: bucket edges at `id - 0.5` and `id + 0.5`.
pub fn id_histogram(ids: &[usize]) -> HistogramProto {
    let mut sorted: Vec<usize> = ids.to_vec();
    sorted.sort_unstable();
    let mut h = HistogramProto {
        min: sorted.first().map_or(0.0, |&k| k as f64),
        max: sorted.last().map_or(0.0, |&k| k as f64),
        num: sorted.len() as f64,
        sum: sorted.iter().map(|&k| k as f64).sum(),
        sum_squares: sorted.iter().map(|&k| (k as f64) * (k as f64)).sum(),
        ..Default::default()
    };
    let mut i = 0;
    while i < sorted.len() {
        let k = sorted[i];
        let n = sorted[i..].iter().take_while(|&&j| j == k).count();
        let left = k as f64 - 0.5;
        if h.bucket_limit.last() != Some(&left) {
            // An empty bucket up to this id's left edge keeps the bucket one id wide.
            h.bucket_limit.push(left);
            h.bucket.push(0.0);
        }
        h.bucket_limit.push(k as f64 + 0.5);
        h.bucket.push(n as f64);
        i += n;
    }
    h
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn scalar(tag: impl Into<String>, v: f64) -> Value {
    Value {
        tag: tag.into(),
        metadata: None,
        kind: Some(Kind::SimpleValue(v as f32)),
    }
}

/// Numbers the event files this process opens, so that two opened in the same second (a
/// resumed run, sweep cells) have different names.
static FILES: AtomicUsize = AtomicUsize::new(0);

/// One run's TensorBoard event file.
pub struct EventWriter {
    path: PathBuf,
    /// `None` once a write failed.
    file: Option<BufWriter<File>>,
    /// The last virtual-time step written ([`time_step`]).
    last_time_step: Option<i64>,
}

/// The virtual-time step of a round that ends at `clock_s`: the clock in whole virtual
/// milliseconds, but at least one more than the previous round's (`last`), so that rounds
/// shorter than a millisecond do not merge into one step and a clock past i64's
/// milliseconds (2.9 · 10⁸ years) does not pin every later round at i64::MAX.
fn time_step(clock_s: f64, last: Option<i64>) -> i64 {
    let ms = (clock_s * 1000.0).round();
    let ms = if ms.is_finite() && ms < i64::MAX as f64 {
        ms as i64
    } else {
        i64::MIN
    };
    match last {
        Some(l) => ms.max(l.saturating_add(1)),
        None => ms.max(0),
    }
}

impl EventWriter {
    /// Creates `dir` and a new event file in it, and writes the file version and the
    /// resolved config (`config_toml`). Errors name the file.
    pub fn create(dir: &Path, config_toml: &str) -> Result<Self> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |error| Error::Output { path, error }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let wall = now();
        let name = format!(
            "events.out.tfevents.{}.fedsel.{}.{}",
            wall as u64,
            std::process::id(),
            FILES.fetch_add(1, Ordering::Relaxed)
        );
        let path = dir.join(name);
        let file = File::create(&path).map_err(io(&path))?;
        let mut w = Self {
            last_time_step: None,
            path,
            file: Some(BufWriter::new(file)),
        };
        let text = Value {
            tag: "config".into(),
            metadata: Some(SummaryMetadata {
                plugin_data: Some(PluginData {
                    plugin_name: "text".into(),
                    content: Vec::new(),
                }),
            }),
            kind: Some(Kind::Tensor(TensorProto {
                dtype: 7,
                tensor_shape: Some(TensorShapeProto::default()),
                string_val: vec![format!("```toml\n{config_toml}```\n").into_bytes()],
            })),
        };
        let events = [
            Event {
                wall_time: wall,
                step: 0,
                what: Some(What::FileVersion("brain.Event:2".into())),
            },
            Event {
                wall_time: wall,
                step: 0,
                what: Some(What::Summary(Summary { value: vec![text] })),
            },
        ];
        w.write(&events).map_err(io(&w.path))?;
        Ok(w)
    }

    /// The event file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `events` and flushes them; on an error the file is left as it is.
    fn write(&mut self, events: &[Event]) -> std::io::Result<()> {
        let Some(file) = &mut self.file else {
            return Ok(());
        };
        let mut buf = Vec::new();
        for e in events {
            frame_record(&e.encode_to_vec(), &mut buf);
        }
        file.write_all(&buf)?;
        file.flush()
    }

    /// Writes one round: its `metrics.csv` values (`values`, by column, `None` for an empty
    /// cell) by round and by virtual time, and its selection. A failed write is logged,
    /// naming the file, and stops this tracker; the run goes on.
    pub fn on_round(&mut self, r: &RoundRecord, values: &[(&str, Option<f64>)]) {
        if self.file.is_none() {
            return;
        }
        let wall = now();
        let mut by_round: Vec<Value> = values
            .iter()
            .filter(|(name, _)| *name != "round")
            .filter_map(|&(name, v)| v.map(|v| scalar(name, v)))
            .collect();
        by_round.push(Value {
            tag: "selection".into(),
            metadata: None,
            kind: Some(Kind::Histo(id_histogram(&r.selected))),
        });
        let mut events = vec![Event {
            wall_time: wall,
            step: r.round as i64,
            what: Some(What::Summary(Summary { value: by_round })),
        }];
        if let Some(c) = &r.clock {
            let by_time = values
                .iter()
                .filter_map(|&(name, v)| v.map(|v| scalar(format!("time/{name}"), v)))
                .collect();
            let step = time_step(c.clock_s, self.last_time_step);
            self.last_time_step = Some(step);
            events.push(Event {
                wall_time: wall,
                step,
                what: Some(What::Summary(Summary { value: by_time })),
            });
        }
        if let Err(e) = self.write(&events) {
            tracing::warn!(
                "writing TensorBoard events to {}: {e}; no more are written for this run",
                self.path.display()
            );
            self.file = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_steps_never_merge_rounds_nor_saturate() {
        assert_eq!(time_step(1.2344, None), 1234);
        assert_eq!(time_step(0.000_001, None), 0);
        assert_eq!(time_step(0.000_002, Some(0)), 1);
        assert_eq!(time_step(5.0, Some(1)), 5000);
        assert_eq!(time_step(1e300, Some(7)), 8);
        assert_eq!(time_step(1e300, None), 0);
    }

    /// CRC32C's check value, and the masked CRCs TFRecord writes, computed by hand from it
    /// (rotate right 15, add 0xa282ead8).
    #[test]
    fn masked_crc_of_known_vectors() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        // 0xe3069283 rotated right by 15 is 0x2507c60d; plus 0xa282ead8 is 0xc78ab0e5.
        assert_eq!(masked_crc32c(b"123456789"), 0xc78a_b0e5);
        assert_eq!(crc32c::crc32c(b""), 0);
        assert_eq!(masked_crc32c(b""), 0xa282_ead8);
    }

    /// A record is the length, its masked CRC, the data and the data's masked CRC.
    #[test]
    fn a_record_is_framed() {
        let mut out = Vec::new();
        frame_record(b"123456789", &mut out);
        assert_eq!(out.len(), 8 + 4 + 9 + 4);
        assert_eq!(&out[..8], &9u64.to_le_bytes());
        assert_eq!(
            &out[8..12],
            &masked_crc32c(&9u64.to_le_bytes()).to_le_bytes()
        );
        assert_eq!(&out[12..21], b"123456789");
        assert_eq!(&out[21..], &0xc78a_b0e5u32.to_le_bytes());
    }

    /// The file-version event's bytes, laid out by hand: field 1 (double, tag 0x09), field 2
    /// omitted (0 is proto3's default), field 3 (string, tag 0x1a).
    #[test]
    fn the_version_event_encodes_as_protobuf() {
        let e = Event {
            wall_time: 1.5,
            step: 0,
            what: Some(What::FileVersion("brain.Event:2".into())),
        };
        let mut want = vec![0x09];
        want.extend_from_slice(&1.5f64.to_le_bytes());
        want.extend_from_slice(&[0x1a, 13]);
        want.extend_from_slice(b"brain.Event:2");
        assert_eq!(e.encode_to_vec(), want);
    }

    #[test]
    fn selections_histogram_one_bucket_per_id() {
        let h = id_histogram(&[3, 1, 3, 4]);
        assert_eq!((h.min, h.max, h.num, h.sum), (1.0, 4.0, 4.0, 11.0));
        assert_eq!(h.bucket_limit, [0.5, 1.5, 2.5, 3.5, 4.5]);
        assert_eq!(h.bucket, [0.0, 1.0, 0.0, 2.0, 1.0]);
        assert!(id_histogram(&[]).bucket.is_empty());
    }
}
