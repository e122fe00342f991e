//! The native profile file: Apache Parquet, one row per sample (see docs/profile-format.md).
//!
//! Strings (thread names, functions, modules, files) are written as Arrow dictionary arrays
//! whose keys are the profile's own string ids, so writing costs no string copies and Parquet
//! stores each distinct string once per row group. Frames are stored leaf first.
//!
//! A file to read may come from anyone, and Parquet compresses well: a few kilobytes can
//! describe a stack of millions of frames. [`read`] checks the file against [`Limits`]
//! before decoding what its metadata declares (rows, frames and uncompressed bytes per row
//! group), then the depth of every stack from its repetition levels alone (a few bytes per
//! frame), and the rest while reading (string lengths, distinct call paths); past a limit it
//! stops with [`ParquetError::TooLarge`].

mod read;
mod write;

pub use read::{read, read_with};
pub use write::write;

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use arrow_array::types::Int32Type;
use arrow_array::{
    Array, ArrayRef, BooleanArray, DictionaryArray, Int32Array, Int64Array, LargeStringArray,
    ListArray, RecordBatch, StringArray, StringViewArray, StructArray, UInt64Array,
};
use arrow_buffer::{OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, Fields, Schema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::{KeyValue, ParquetMetaData};
use parquet::file::properties::WriterProperties;

use crate::{Frame, Meta, Profile, SampleKind, StackId, StrId};

/// Version of the file layout, in the `superprof.format_version` metadata key.
pub const FORMAT_VERSION: &str = "3";

/// Why a profile could not be written or read as Parquet.
#[derive(Debug, thiserror::Error)]
pub enum ParquetError {
    /// The file could not be opened, read or written.
    #[error("cannot open: {0}")]
    Io(#[from] std::io::Error),
    /// The parquet crate refused the file (not Parquet, or damaged) or could not write.
    #[error("not a readable Parquet file ({0})")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// Arrow refused the data (a column of a type it cannot decode, a batch it cannot build).
    #[error("not a readable Parquet file ({0})")]
    Arrow(#[from] arrow_schema::ArrowError),
    /// A Parquet file, but not laid out as superprof's: a column missing or of another type.
    #[error("not a superprof profile: {0}")]
    Schema(String),
    /// The file holds more than [`Limits`] allow (a damaged or hostile file).
    #[error("past superprof's limits: {0}")]
    TooLarge(String),
    /// The parquet crate gave up on the file with a panic (it asserts on some damaged
    /// encodings); contained, and said as an error.
    #[error("not a readable Parquet file (damaged: {0})")]
    Damaged(String),
}

/// Caps on what [`read`] takes from a file. The defaults hold any profile superprof writes
/// (its unwinder stops at 1024 frames, plus inlined and kernel frames) with room to spare,
/// and bound the memory a crafted file can make `report` use to a few hundred MB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Samples (rows) in the file.
    pub max_rows: u64,
    /// Frames in one sample's stack.
    pub max_stack_depth: usize,
    /// Frames in one row group (what one batch may have to decode at once).
    pub max_frames_per_row_group: u64,
    /// Uncompressed bytes of one column chunk, as its metadata declares them.
    pub max_chunk_bytes: u64,
    /// Uncompressed bytes of one page, as its header declares them (what the parquet crate
    /// allocates at once to inflate it; superprof's own pages are about 1 MiB).
    pub max_page_bytes: u64,
    /// Bytes of one string (function, module, file or thread name).
    pub max_string_len: usize,
    /// Bytes of all distinct strings.
    pub max_string_bytes: u64,
    /// Distinct call paths (nodes of the stack trie).
    pub max_stacks: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_rows: 50_000_000,
            max_stack_depth: MAX_STACK_DEPTH,
            max_frames_per_row_group: 64 << 20,
            max_chunk_bytes: 1 << 30,
            max_page_bytes: 64 << 20,
            max_string_len: 1 << 20,
            max_string_bytes: 256 << 20,
            max_stacks: 16 << 20,
        }
    }
}

/// The deepest stack a file may hold (the default of [`Limits::max_stack_depth`]).
pub const MAX_STACK_DEPTH: usize = 8192;

/// Samples per row group, and frames per row group, that [`write`] stays under.
const GROUP_ROWS: usize = 1 << 20;
const GROUP_FRAMES: usize = 16 << 20;
/// Rows and frames of each Arrow batch handed to the writer (several make a row group).
const BATCH_ROWS: usize = 1 << 13;
const BATCH_FRAMES: usize = 1 << 17;

fn too_large(what: String) -> ParquetError {
    ParquetError::TooLarge(what)
}

fn dict() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
}

fn frame_fields() -> Fields {
    Fields::from(vec![
        Field::new("function", dict(), false),
        Field::new("module", dict(), false),
        Field::new("file", dict(), true),
        Field::new("line", DataType::Int32, true),
        Field::new("address", DataType::UInt64, false),
        Field::new("inlined", DataType::Boolean, false),
    ])
}

/// The Arrow schema of the file.
pub fn schema() -> Schema {
    let frame = Field::new("item", DataType::Struct(frame_fields()), false);
    Schema::new(vec![
        Field::new("time_ns", DataType::Int64, false),
        Field::new("pid", DataType::Int32, false),
        Field::new("tid", DataType::Int32, false),
        Field::new("thread_name", dict(), false),
        Field::new("cpu", DataType::Int32, false),
        Field::new("weight", DataType::Int64, false),
        Field::new("stack", DataType::List(Arc::new(frame)), false),
        Field::new("kind", dict(), false),
        Field::new("event", dict(), false),
    ])
}

/// `superprof.calls`: the functions counted beside the samples (docs/profile-format.md).
fn calls_json(calls: &[crate::calls::FunctionCalls]) -> String {
    serde_json::Value::Array(
        calls
            .iter()
            .map(|c| {
                serde_json::json!({
                    "function": c.function,
                    "module": c.module,
                    "address": c.address,
                    "counted": c.counted,
                    "calls": c.calls,
                    "entries": c.entries,
                    "since_ns": c.since_ns,
                    "exact": c.exact,
                    "note": c.note,
                    "blocks": c.blocks.iter().map(|b| serde_json::json!(
                        [b.start, b.end, b.count, b.file, b.line]
                    )).collect::<Vec<_>>(),
                    "lines": c.lines.iter().map(|l| serde_json::json!(
                        [l.file, l.line, l.count]
                    )).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
    .to_string()
}

fn meta_pairs(m: &Meta) -> Vec<KeyValue> {
    let command = serde_json::to_string(&m.command).unwrap_or_else(|_| "[]".into());
    [
        ("superprof.format_version", FORMAT_VERSION.to_owned()),
        ("superprof.version", m.version.clone()),
        ("superprof.command", command),
        ("superprof.event", m.event.clone()),
        ("superprof.frequency_hz", m.frequency.to_string()),
        (
            "superprof.start_time_unix_ns",
            m.start_time_unix_ns.to_string(),
        ),
        ("superprof.duration_ns", m.duration_ns.to_string()),
        ("superprof.host", m.host.clone()),
        ("superprof.lost_samples", m.lost_samples.to_string()),
        ("superprof.truncated_stacks", m.truncated_stacks.to_string()),
        (
            "superprof.truncated_by",
            serde_json::to_string(&m.truncated_by).unwrap_or_default(),
        ),
        ("superprof.cpu_time_ns", m.cpu_time_ns.to_string()),
        ("superprof.off_cpu", m.off_cpu.clone()),
        (
            "superprof.events",
            serde_json::Value::Array(
                m.events
                    .iter()
                    .map(|e| serde_json::json!({"name": e.name, "counted": e.counted}))
                    .collect(),
            )
            .to_string(),
        ),
        ("superprof.calls", calls_json(&m.calls)),
    ]
    .into_iter()
    .map(|(k, v)| KeyValue::new(k.to_owned(), v))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::write::write_groups;
    use super::{read_with, Limits, ParquetError};
    use crate::Profile;
    use std::path::PathBuf;

    /// A file in the temporary folder, removed when dropped.
    struct TempFile(PathBuf);

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// `shallow` samples with a stack of 2 frames, then one with a stack of `deep` frames.
    fn profile(shallow: usize, deep: usize) -> Profile {
        let mut p = Profile::default();
        let t = p.add_thread(1, 1, "t");
        let main = p.intern_frame_named("main", "/bin/p", Some("p.c"), 1, 0x10, false);
        let f = p.intern_frame_named("f", "/bin/p", None, 0, 0x20, false);
        let root = p.intern_stack(None, main);
        let two = p.intern_stack(Some(root), f);
        for i in 0..shallow {
            p.add_sample(i as u64, t, 0, 1, Some(two));
        }
        let mut s = None;
        for i in 0..deep {
            let fr = p.intern_frame_named("rec", "/bin/p", None, 0, 0x100 + i as u64, false);
            s = Some(p.intern_stack(s, fr));
        }
        p.add_sample(shallow as u64, t, 0, 1, s);
        p
    }

    fn file(tag: &str, p: &Profile, group_rows: usize) -> TempFile {
        let path = std::env::temp_dir().join(format!(
            "superprof-parquet-test-{}-{tag}.parquet",
            std::process::id()
        ));
        let f = std::fs::File::create(&path).unwrap();
        write_groups(p, f, group_rows, 16 << 20).unwrap();
        TempFile(path)
    }

    fn refusal(f: &TempFile, limits: Limits) -> String {
        match read_with(&f.0, &limits) {
            Err(e @ ParquetError::TooLarge(_)) => e.to_string(),
            other => panic!("not refused: {:?}", other.map(|p| p.samples.len())),
        }
    }

    #[test]
    fn within_the_limits_a_profile_reads_back_whole() {
        let p = profile(10, 30);
        let f = file("whole", &p, 4);
        let back = read_with(&f.0, &Limits::default()).unwrap();
        assert_eq!(back.samples.len(), 11);
        let deepest = back
            .samples
            .iter()
            .map(|s| back.stack_frames(s.stack).count());
        assert_eq!(deepest.max(), Some(30));
    }

    #[test]
    fn kinds_and_the_off_cpu_mechanism_read_back() {
        use crate::SampleKind;
        let mut p = profile(3, 2);
        p.meta.off_cpu = "sched:sched_switch".into();
        p.meta.frequency = 999;
        let w = p.wait_frame(SampleKind::OffCpu, Some("read"));
        let leaf = p.samples.iter().next().unwrap().stack;
        let s = Some(p.intern_stack(leaf, w));
        p.add_sample_of(SampleKind::OffCpu, 10, 0, 0, 250, s);
        p.add_sample_of(SampleKind::Preempted, 11, 0, 0, 3, leaf);
        let f = file("kinds", &p, 2);
        let back = read_with(&f.0, &Limits::default()).unwrap();
        assert_eq!(back.meta.off_cpu, "sched:sched_switch");
        let kinds: Vec<(SampleKind, u64)> =
            back.samples.iter().map(|s| (s.kind, s.weight)).collect();
        assert_eq!(
            &kinds[4..],
            &[(SampleKind::OffCpu, 250), (SampleKind::Preempted, 3)]
        );
        assert!(kinds[..4].iter().all(|k| k.0 == SampleKind::OnCpu));
        assert_eq!(back.weight_by_kind(), [4, 250, 3]);
    }

    #[test]
    fn counted_calls_come_back_as_written() {
        let mut p = profile(3, 2);
        p.meta.calls = vec![
            crate::calls::FunctionCalls {
                function: "f".into(),
                module: "/bin/p".into(),
                address: 0x20,
                counted: true,
                calls: 10,
                entries: 12,
                since_ns: 5,
                exact: true,
                note: "2 of its 12 entries were its own recursive calls".into(),
                blocks: vec![crate::calls::BlockCount {
                    start: 0x20,
                    end: 0x28,
                    count: 12,
                    file: "p.c".into(),
                    line: 3,
                }],
                lines: vec![crate::calls::LineCount {
                    file: "p.c".into(),
                    line: 3,
                    count: 12,
                }],
            },
            crate::calls::FunctionCalls {
                function: "nope".into(),
                note: "no function".into(),
                ..Default::default()
            },
        ];
        let f = file("calls", &p, 1024);
        let back = read_with(&f.0, &Limits::default()).unwrap();
        assert_eq!(back.meta.calls, p.meta.calls);
    }

    #[test]
    fn hostile_calls_are_left_out_not_trusted() {
        // Not objects, missing fields, a block of the wrong shape, a line past u32.
        let calls = super::read::read_calls_for_test(
            r#"[1, {"function": "f"}, {"function": "g", "module": "m", "address": 1,
                "counted": true, "calls": 2, "entries": 2, "since_ns": 0, "exact": true,
                "blocks": [[1, 2], [1, 2, 3, "x", 99999999999], [1, 2, 3, "x", 4]]}]"#,
        );
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].function, "g");
        assert_eq!(calls[0].blocks.len(), 1);
        assert_eq!(calls[0].blocks[0].line, 4);
        assert!(super::read::read_calls_for_test("not json").is_empty());
    }

    #[test]
    fn a_stack_deeper_than_the_metadata_allows_is_refused_before_decoding() {
        let f = file("deep", &profile(0, 50), 1 << 20);
        let limits = Limits {
            max_stack_depth: 40,
            ..Limits::default()
        };
        let e = refusal(&f, limits);
        assert!(e.contains("50 frames for 1 samples"), "{e}");
    }

    #[test]
    fn one_deep_stack_among_shallow_ones_is_found_by_its_levels() {
        // 100 samples of 2 frames and one of 50: 250 frames pass 101 x 40 in the metadata.
        let f = file("skewed", &profile(100, 50), 1 << 20);
        let limits = Limits {
            max_stack_depth: 40,
            ..Limits::default()
        };
        let e = refusal(&f, limits);
        assert!(e.contains("stack of sample 100 is deeper than 40"), "{e}");
    }

    #[test]
    fn every_other_cap_refuses_with_its_reason() {
        let f = file("caps", &profile(10, 5), 4);
        let d = Limits::default();
        let cases = [
            (Limits { max_rows: 10, ..d }, "more than 10 samples"),
            (
                Limits {
                    max_frames_per_row_group: 7,
                    ..d
                },
                "a row group",
            ),
            (
                Limits {
                    max_chunk_bytes: 8,
                    ..d
                },
                "bytes uncompressed",
            ),
            (
                Limits {
                    max_string_len: 3,
                    ..d
                },
                "a string of",
            ),
            (
                Limits {
                    max_string_bytes: 8,
                    ..d
                },
                "of names",
            ),
            (Limits { max_stacks: 4, ..d }, "distinct call paths"),
        ];
        for (limits, reason) in cases {
            let e = refusal(&f, limits);
            assert!(e.contains(reason), "{e} (expected {reason})");
        }
    }

    #[test]
    fn a_panic_of_the_decoder_is_an_error() {
        let r: Result<(), ParquetError> =
            super::read::contain_panics(|| panic!("attempt to divide by zero"));
        match r {
            Err(ParquetError::Damaged(why)) => assert!(why.contains("divide by zero"), "{why}"),
            other => panic!("{other:?}"),
        }
        // Outside, panics are reported as ever (the hook is only quiet inside).
        assert!(std::panic::catch_unwind(|| panic!("still a panic")).is_err());
    }

    #[test]
    fn row_groups_stay_under_the_frame_budget() {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let p = profile(9, 3);
        let path = std::env::temp_dir().join(format!(
            "superprof-parquet-test-{}-groups.parquet",
            std::process::id()
        ));
        let f = TempFile(path);
        write_groups(&p, std::fs::File::create(&f.0).unwrap(), 1 << 20, 4).unwrap();
        let r = SerializedFileReader::new(std::fs::File::open(&f.0).unwrap()).unwrap();
        // Two frames a sample, four a group: five groups of two, the deep one alone.
        assert_eq!(r.metadata().num_row_groups(), 6);
        assert_eq!(
            read_with(&f.0, &Limits::default()).unwrap().samples.len(),
            10
        );
    }
}
