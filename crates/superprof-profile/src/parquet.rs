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
pub const FORMAT_VERSION: &str = "2";

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
    ])
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
    ]
    .into_iter()
    .map(|(k, v)| KeyValue::new(k.to_owned(), v))
    .collect()
}

/// Writes the profile. Samples are written in row groups of at most 1M rows and 16M frames,
/// so that a reader decodes a bounded amount at a time.
pub fn write<W: Write + Send>(profile: &Profile, w: W) -> Result<(), ParquetError> {
    write_groups(profile, w, GROUP_ROWS, GROUP_FRAMES)
}

/// [`write`], with row groups of at most `group_rows` samples and `group_frames` frames (a
/// sample deeper than that alone in its group).
fn write_groups<W: Write + Send>(
    profile: &Profile,
    w: W,
    group_rows: usize,
    group_frames: usize,
) -> Result<(), ParquetError> {
    // The metadata goes both into the Parquet footer and into the Arrow schema, where
    // pyarrow and pandas look for it (`table.schema.metadata`).
    let pairs = meta_pairs(&profile.meta);
    let schema = Arc::new(
        schema().with_metadata(
            pairs
                .iter()
                .map(|kv| (kv.key.clone(), kv.value.clone().unwrap_or_default()))
                .collect::<HashMap<String, String>>(),
        ),
    );
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(group_rows.max(1)))
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .set_key_value_metadata(Some(pairs))
        .build();
    let mut writer = ArrowWriter::try_new(w, schema.clone(), Some(props))?;
    // All string columns share one dictionary: the profile's string table.
    let strings: ArrayRef = Arc::new(StringArray::from_iter_values(profile.strings()));
    // Samples go out in batches of at most BATCH_ROWS rows and BATCH_FRAMES frames, so that
    // the Arrow arrays built for them stay small whatever the profile's size; the writer
    // keeps only the encoded pages of the row group under way.
    let mut pending: Vec<crate::Sample> = Vec::new();
    let (mut pending_frames, mut rows, mut frames) = (0usize, 0usize, 0usize);
    for s in &profile.samples {
        let depth = profile.stack_frames(s.stack).count();
        if rows > 0 && (rows >= group_rows || frames + depth > group_frames) {
            writer.write(&batch(profile, &pending, &schema, &strings)?)?;
            writer.flush()?;
            pending.clear();
            (pending_frames, rows, frames) = (0, 0, 0);
        }
        if !pending.is_empty()
            && (pending.len() >= BATCH_ROWS || pending_frames + depth > BATCH_FRAMES)
        {
            writer.write(&batch(profile, &pending, &schema, &strings)?)?;
            pending.clear();
            pending_frames = 0;
        }
        pending.push(s);
        pending_frames += depth;
        rows += 1;
        frames += depth;
    }
    if !pending.is_empty() {
        writer.write(&batch(profile, &pending, &schema, &strings)?)?;
    }
    writer.close()?;
    Ok(())
}

fn batch(
    profile: &Profile,
    samples: &[crate::Sample],
    schema: &Arc<Schema>,
    strings: &ArrayRef,
) -> Result<RecordBatch, ParquetError> {
    let n = samples.len();
    let mut kind = Vec::with_capacity(n);
    let (mut time, mut pid, mut tid, mut tname, mut cpu, mut weight) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let mut offsets = Vec::with_capacity(n + 1);
    offsets.push(0i32);
    let (mut func, mut module, mut file, mut line, mut addr, mut inl) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    for s in samples {
        let t = &profile.threads[s.thread as usize];
        time.push(s.time_ns as i64);
        pid.push(t.pid as i32);
        tid.push(t.tid as i32);
        tname.push(t.name.0 as i32);
        cpu.push(s.cpu as i32);
        weight.push(s.weight as i64);
        kind.push(s.kind as i32);
        for fid in profile.stack_frames(s.stack) {
            let f = profile.frame(fid);
            func.push(f.function.0 as i32);
            module.push(f.module.0 as i32);
            file.push(f.file.map(|x| x.0 as i32));
            line.push((f.line > 0).then_some(f.line as i32));
            addr.push(f.address);
            inl.push(f.inlined);
        }
        offsets.push(func.len() as i32);
    }
    let d = |keys: Vec<i32>| -> ArrayRef {
        Arc::new(DictionaryArray::<Int32Type>::new(
            Int32Array::from(keys),
            strings.clone(),
        ))
    };
    let file_keys = Int32Array::from(file);
    let frames = StructArray::new(
        frame_fields(),
        vec![
            d(func),
            d(module),
            Arc::new(DictionaryArray::<Int32Type>::new(
                file_keys,
                strings.clone(),
            )),
            Arc::new(Int32Array::from(line)),
            Arc::new(UInt64Array::from(addr)),
            Arc::new(BooleanArray::from(inl)),
        ],
        None,
    );
    let DataType::List(item) = schema.field(6).data_type().clone() else {
        unreachable!("stack is a list")
    };
    let stack = ListArray::new(
        item,
        OffsetBuffer::new(ScalarBuffer::from(offsets)),
        Arc::new(frames),
        None,
    );
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(time)),
        Arc::new(Int32Array::from(pid)),
        Arc::new(Int32Array::from(tid)),
        d(tname),
        Arc::new(Int32Array::from(cpu)),
        Arc::new(Int64Array::from(weight)),
        Arc::new(stack),
        Arc::new(DictionaryArray::<Int32Type>::new(
            Int32Array::from(kind),
            Arc::new(StringArray::from(
                SampleKind::ALL.map(SampleKind::as_str).to_vec(),
            )),
        )),
    ];
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// The profile's ids of the strings of a dictionary (None: a null entry).
type DictIds = Arc<Vec<Option<StrId>>>;

/// A string column as written by superprof (dictionary) or rewritten by another tool.
enum StrCol<'a> {
    Dict(&'a DictionaryArray<Int32Type>, DictIds),
    Plain(&'a StringArray),
    Large(&'a LargeStringArray),
    View(&'a StringViewArray),
}

/// What the reader has taken so far, against the [`Limits`].
struct Budget {
    limits: Limits,
    /// Strings interned so far (ids are given in order).
    strings: u32,
    string_bytes: u64,
    rows: u64,
    /// The last dictionary of each string column and its ids: batches of one row group
    /// share their dictionary, interned once.
    dicts: HashMap<&'static str, (ArrayRef, DictIds)>,
}

impl Budget {
    /// Interns a string from the file, within the limits on strings.
    fn intern(&mut self, p: &mut Profile, s: &str) -> Result<StrId, ParquetError> {
        if s.len() > self.limits.max_string_len {
            return Err(too_large(format!(
                "a string of {} bytes (at most {})",
                s.len(),
                self.limits.max_string_len
            )));
        }
        let id = p.intern_str(s);
        if id.0 >= self.strings {
            self.strings = id.0 + 1;
            self.string_bytes += s.len() as u64;
            if self.string_bytes > self.limits.max_string_bytes {
                return Err(too_large(format!(
                    "more than {} MiB of names",
                    self.limits.max_string_bytes >> 20
                )));
            }
        }
        Ok(id)
    }
}

impl<'a> StrCol<'a> {
    fn new(
        a: &'a ArrayRef,
        name: &'static str,
        p: &mut Profile,
        budget: &mut Budget,
    ) -> Result<StrCol<'a>, ParquetError> {
        let any = a.as_any();
        if let Some(d) = any.downcast_ref::<DictionaryArray<Int32Type>>() {
            let values = d.values();
            if let Some((prev, ids)) = budget.dicts.get(name) {
                if Arc::ptr_eq(prev, values) {
                    return Ok(StrCol::Dict(d, ids.clone()));
                }
            }
            let strings = values
                .as_any()
                .downcast_ref::<StringArray>()
                .ok_or_else(|| bad(name, "dictionary of strings"))?;
            let ids = (0..strings.len())
                .map(|i| {
                    strings
                        .is_valid(i)
                        .then(|| budget.intern(p, strings.value(i)))
                        .transpose()
                })
                .collect::<Result<Vec<_>, _>>()?;
            let ids = Arc::new(ids);
            budget.dicts.insert(name, (values.clone(), ids.clone()));
            return Ok(StrCol::Dict(d, ids));
        }
        if let Some(s) = any.downcast_ref::<StringArray>() {
            return Ok(StrCol::Plain(s));
        }
        if let Some(s) = any.downcast_ref::<LargeStringArray>() {
            return Ok(StrCol::Large(s));
        }
        if let Some(s) = any.downcast_ref::<StringViewArray>() {
            return Ok(StrCol::View(s));
        }
        Err(bad(name, "string"))
    }

    fn get(
        &self,
        i: usize,
        p: &mut Profile,
        budget: &mut Budget,
    ) -> Result<Option<StrId>, ParquetError> {
        match self {
            StrCol::Dict(d, ids) => {
                if d.is_null(i) {
                    return Ok(None);
                }
                let key = d.keys().value(i);
                Ok(usize::try_from(key)
                    .ok()
                    .and_then(|k| ids.get(k).copied())
                    .flatten())
            }
            StrCol::Plain(s) => s
                .is_valid(i)
                .then(|| budget.intern(p, s.value(i)))
                .transpose(),
            StrCol::Large(s) => s
                .is_valid(i)
                .then(|| budget.intern(p, s.value(i)))
                .transpose(),
            StrCol::View(s) => s
                .is_valid(i)
                .then(|| budget.intern(p, s.value(i)))
                .transpose(),
        }
    }
}

fn bad(column: &str, expected: &str) -> ParquetError {
    ParquetError::Schema(format!("column '{column}' is not of type {expected}"))
}

fn column<'a>(b: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef, ParquetError> {
    b.column_by_name(name)
        .ok_or_else(|| ParquetError::Schema(format!("no column '{name}'")))
}

fn prim<'a, T: 'static>(b: &'a RecordBatch, name: &str, ty: &str) -> Result<&'a T, ParquetError> {
    column(b, name)?
        .as_any()
        .downcast_ref::<T>()
        .ok_or_else(|| bad(name, ty))
}

fn sub<'a, T: 'static>(s: &'a StructArray, name: &str, ty: &str) -> Result<&'a T, ParquetError> {
    s.column_by_name(name)
        .ok_or_else(|| ParquetError::Schema(format!("no stack field '{name}'")))?
        .as_any()
        .downcast_ref::<T>()
        .ok_or_else(|| bad(name, ty))
}

fn stack_field<'a>(s: &'a StructArray, name: &str) -> Result<&'a ArrayRef, ParquetError> {
    s.column_by_name(name)
        .ok_or_else(|| ParquetError::Schema(format!("no stack field '{name}'")))
}

/// Whether a leaf column of the file belongs to the `stack` list.
fn in_stack(path: &parquet::schema::types::ColumnPath) -> bool {
    path.parts().first().is_some_and(|p| p == "stack")
}

/// The columns [`read`] decodes; any other column of the file is left alone.
const COLUMNS: [&str; 8] = [
    "time_ns",
    "pid",
    "tid",
    "thread_name",
    "cpu",
    "weight",
    "stack",
    "kind",
];

/// What each page's header declares, against the limits, before anything is decompressed (the
/// parquet crate allocates a page's declared size at once, and inflates into it): every page at
/// most `max_page_bytes`, and a chunk's pages together no more than its metadata declares.
fn check_pages(
    meta: &ParquetMetaData,
    mask: &ProjectionMask,
    limits: &Limits,
    file: &File,
) -> Result<(), ParquetError> {
    use std::os::unix::fs::FileExt;
    for (g, rg) in meta.row_groups().iter().enumerate() {
        for (i, c) in rg.columns().iter().enumerate() {
            if !mask.leaf_included(i) {
                continue;
            }
            // (Inside the file and not negative: check_metadata saw to it.)
            let start = c.dictionary_page_offset().unwrap_or(c.data_page_offset()) as u64;
            let len = c.compressed_size() as u64;
            let declared = u64::try_from(c.uncompressed_size()).unwrap_or(0);
            let column = c.column_path();
            let pages = crate::pages::walk_at(len, |at, buf| file.read_at(buf, start + at))
                .map_err(|why| {
                    ParquetError::Schema(format!("column '{column}' of row group {g}: {why}"))
                })?;
            if pages.largest > limits.max_page_bytes {
                return Err(too_large(format!(
                    "column '{column}' of row group {g} has a page of {} bytes uncompressed (at \
                     most {})",
                    pages.largest, limits.max_page_bytes
                )));
            }
            if pages.uncompressed > declared {
                return Err(ParquetError::Schema(format!(
                    "the pages of column '{column}' of row group {g} hold {} bytes uncompressed, \
                     its metadata {declared} (damaged?)",
                    pages.uncompressed
                )));
            }
        }
    }
    Ok(())
}

/// What the footer declares, against the limits: rows, frames per row group (the values of
/// the stack's leaf columns, at most `max_stack_depth` per row; one per row elsewhere) and
/// uncompressed bytes per column chunk. Nothing is decoded yet.
fn check_metadata(
    meta: &ParquetMetaData,
    mask: &ProjectionMask,
    limits: &Limits,
    file_len: u64,
) -> Result<(), ParquetError> {
    let mut rows: u64 = 0;
    for (g, rg) in meta.row_groups().iter().enumerate() {
        // Every column chunk inside the file: the parquet crate asserts (panics) on a negative
        // offset or size when it reads one.
        for c in rg.columns() {
            let start = c.dictionary_page_offset().unwrap_or(c.data_page_offset());
            let inside = u64::try_from(start)
                .ok()
                .zip(u64::try_from(c.data_page_offset()).ok())
                .zip(u64::try_from(c.compressed_size()).ok())
                .and_then(|((start, _), len)| start.checked_add(len))
                .is_some_and(|end| end <= file_len);
            if !inside {
                return Err(ParquetError::Schema(format!(
                    "column '{}' of row group {g} lies outside the file (damaged?)",
                    c.column_path()
                )));
            }
        }
        let n = u64::try_from(rg.num_rows())
            .map_err(|_| ParquetError::Schema(format!("row group {g} has a negative size")))?;
        rows = rows.saturating_add(n);
        if rows > limits.max_rows {
            return Err(too_large(format!("more than {} samples", limits.max_rows)));
        }
        for (i, c) in rg.columns().iter().enumerate() {
            if !mask.leaf_included(i) {
                continue;
            }
            let bytes = u64::try_from(c.uncompressed_size()).unwrap_or(u64::MAX);
            if bytes > limits.max_chunk_bytes {
                return Err(too_large(format!(
                    "column '{}' of row group {g} is {bytes} bytes uncompressed (at most {})",
                    c.column_path(),
                    limits.max_chunk_bytes
                )));
            }
            let values = u64::try_from(c.num_values()).unwrap_or(u64::MAX);
            if in_stack(c.column_path()) {
                let deepest = n.saturating_mul(limits.max_stack_depth as u64);
                if values > deepest.min(limits.max_frames_per_row_group) {
                    return Err(too_large(format!(
                        "row group {g} holds {values} frames for {n} samples (at most {} \
                         frames a stack, {} a row group)",
                        limits.max_stack_depth, limits.max_frames_per_row_group
                    )));
                }
            } else if values > n {
                return Err(ParquetError::Schema(format!(
                    "column '{}' has {values} values for {n} samples",
                    c.column_path()
                )));
            }
        }
    }
    Ok(())
}

/// The depth of every stack, from the repetition levels of the stack's `inlined` column
/// (a few bytes per frame; the frames themselves are not decoded).
fn check_depths(file: File, limits: &Limits) -> Result<(), ParquetError> {
    use parquet::basic::Type;
    use parquet::column::reader::ColumnReader;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let reader = SerializedFileReader::new(file)?;
    let meta = reader.metadata();
    let schema = meta.file_metadata().schema_descr();
    if !schema
        .root_schema()
        .get_fields()
        .iter()
        .any(|f| f.name() == "stack")
    {
        return Err(ParquetError::Schema("no column 'stack'".into()));
    }
    let col = (0..schema.num_columns())
        .find(|&i| {
            let c = schema.column(i);
            in_stack(c.path()) && c.path().parts().last().is_some_and(|l| l == "inlined")
        })
        .ok_or_else(|| ParquetError::Schema("no stack field 'inlined'".into()))?;
    let c = schema.column(col);
    if c.max_rep_level() != 1 {
        return Err(bad("stack", "list of struct"));
    }
    if c.physical_type() != Type::BOOLEAN {
        return Err(bad("inlined", "boolean"));
    }
    let mut row: u64 = 0;
    let (mut def, mut rep, mut values) = (Vec::new(), Vec::new(), Vec::new());
    for g in 0..meta.num_row_groups() {
        let ColumnReader::BoolColumnReader(mut r) =
            reader.get_row_group(g)?.get_column_reader(col)?
        else {
            return Err(bad("inlined", "boolean"));
        };
        let mut depth = 0usize;
        loop {
            def.clear();
            rep.clear();
            values.clear();
            let (records, _, _) =
                r.read_records(1024, Some(&mut def), Some(&mut rep), &mut values)?;
            if records == 0 {
                break;
            }
            for &level in &rep {
                if level == 0 {
                    depth = 0;
                    row += 1;
                }
                depth += 1;
                if depth > limits.max_stack_depth {
                    return Err(too_large(format!(
                        "the stack of sample {} is deeper than {} frames",
                        row.saturating_sub(1),
                        limits.max_stack_depth
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Reads a native profile file, within the default [`Limits`].
pub fn read(path: &Path) -> Result<Profile, ParquetError> {
    read_with(path, &Limits::default())
}

/// Reads a native profile file; a file past `limits` is refused with
/// [`ParquetError::TooLarge`].
pub fn read_with(path: &Path, limits: &Limits) -> Result<Profile, ParquetError> {
    contain_panics(|| read_checked(path, limits))
}

thread_local! {
    /// Inside [`contain_panics`] on this thread: the panic hook stays quiet.
    static CONTAINING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, turning a panic into [`ParquetError::Damaged`]. The parquet crate decodes pages
/// of a damaged file with some assertions (a division by a count read from the file, a
/// negative offset), and a file is hostile input: it must give an error, not end superprof.
/// The panic message is kept off stderr (one line of error is what the user gets).
fn contain_panics<T>(f: impl FnOnce() -> Result<T, ParquetError>) -> Result<T, ParquetError> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !CONTAINING.with(|c| c.get()) {
                previous(info);
            }
        }));
    });
    let outer = CONTAINING.with(|c| c.replace(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    CONTAINING.with(|c| c.set(outer));
    r.unwrap_or_else(|payload| {
        let why = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "the decoder failed".into());
        Err(ParquetError::Damaged(
            crate::escape::escape(&why).to_string(),
        ))
    })
}

/// (One function of 169 lines: one reader over the batches, each batch's columns borrowed from it
/// and read row by row into the Profile with the `Budget` and the `threads` map; split, the column
/// arrays and their lifetimes would travel between the pieces in a struct.)
fn read_checked(path: &Path, limits: &Limits) -> Result<Profile, ParquetError> {
    // A regular file only: a FIFO or a device would block in open or never end.
    let file = superprof_unwind::open_input(path)?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file.try_clone()?)?;
    let kv: HashMap<String, String> = builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .map(|kv| {
            kv.iter()
                .filter_map(|k| Some((k.key.clone(), k.value.clone()?)))
                .collect()
        })
        .unwrap_or_default();
    if !kv.contains_key("superprof.format_version") {
        return Err(ParquetError::Schema(
            "no superprof.format_version metadata (written by another program?)".into(),
        ));
    }
    let fields = builder.metadata().file_metadata().schema_descr();
    let roots = fields
        .root_schema()
        .get_fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| COLUMNS.contains(&f.name()))
        .map(|(i, _)| i);
    let mask = ProjectionMask::roots(fields, roots);
    let file_len = file.metadata()?.len();
    check_metadata(builder.metadata(), &mask, limits, file_len)?;
    check_pages(builder.metadata(), &mask, limits, &file)?;
    check_depths(file, limits)?;
    let mut p = Profile::default();
    p.meta = read_meta(&kv);
    let mut budget = Budget {
        limits: *limits,
        strings: 0,
        string_bytes: 0,
        rows: 0,
        dicts: HashMap::new(),
    };
    // Batches of a bounded number of frames: rows x the deepest stack.
    let reader = builder
        .with_projection(mask)
        .with_batch_size(1024)
        .build()?;
    let mut threads: HashMap<(u32, u32, StrId), u32> = HashMap::new();
    let mut stack_buf: Vec<crate::FrameId> = Vec::new();
    let empty = budget.intern(&mut p, "")?;
    for batch in reader {
        let b = batch?;
        budget.rows = budget.rows.saturating_add(b.num_rows() as u64);
        if budget.rows > limits.max_rows {
            return Err(too_large(format!("more than {} samples", limits.max_rows)));
        }
        let time = prim::<Int64Array>(&b, "time_ns", "int64")?;
        let pid = prim::<Int32Array>(&b, "pid", "int32")?;
        let tid = prim::<Int32Array>(&b, "tid", "int32")?;
        let cpu = prim::<Int32Array>(&b, "cpu", "int32")?;
        let weight = prim::<Int64Array>(&b, "weight", "int64")?;
        let tname = StrCol::new(
            column(&b, "thread_name")?,
            "thread_name",
            &mut p,
            &mut budget,
        )?;
        // (Files of format 1 before off-CPU profiles have no kind: every sample is on-CPU.)
        let kind = match b.column_by_name("kind") {
            Some(c) => Some(StrCol::new(c, "kind", &mut p, &mut budget)?),
            None => None,
        };
        let stack = prim::<ListArray>(&b, "stack", "list")?;
        let frames = stack
            .values()
            .as_any()
            .downcast_ref::<StructArray>()
            .ok_or_else(|| bad("stack", "list of struct"))?;
        let func = StrCol::new(
            stack_field(frames, "function")?,
            "function",
            &mut p,
            &mut budget,
        )?;
        let module = StrCol::new(
            stack_field(frames, "module")?,
            "module",
            &mut p,
            &mut budget,
        )?;
        let file = StrCol::new(stack_field(frames, "file")?, "file", &mut p, &mut budget)?;
        let line = sub::<Int32Array>(frames, "line", "int32")?;
        let addr = sub::<UInt64Array>(frames, "address", "uint64")?;
        let inl = sub::<BooleanArray>(frames, "inlined", "boolean")?;
        let offsets = stack.value_offsets();
        for row in 0..b.num_rows() {
            let name = tname.get(row, &mut p, &mut budget)?.unwrap_or(empty);
            let key = (pid.value(row) as u32, tid.value(row) as u32, name);
            let thread = match threads.get(&key) {
                Some(&t) => t,
                None => {
                    let t = p.add_thread_named(key.0, key.1, name);
                    threads.insert(key, t);
                    t
                }
            };
            let (Ok(lo), Ok(hi)) = (
                usize::try_from(offsets[row]),
                usize::try_from(offsets[row + 1]),
            ) else {
                return Err(ParquetError::Schema("a negative stack offset".into()));
            };
            if hi.saturating_sub(lo) > limits.max_stack_depth {
                return Err(too_large(format!(
                    "the stack of sample {} is deeper than {} frames",
                    budget.rows - (b.num_rows() - row) as u64,
                    limits.max_stack_depth
                )));
            }
            stack_buf.clear();
            for i in lo..hi {
                let frame = Frame {
                    function: func.get(i, &mut p, &mut budget)?.unwrap_or(empty),
                    module: module.get(i, &mut p, &mut budget)?.unwrap_or(empty),
                    file: file.get(i, &mut p, &mut budget)?,
                    line: if line.is_valid(i) {
                        line.value(i).max(0) as u32
                    } else {
                        0
                    },
                    address: addr.value(i),
                    inlined: inl.value(i),
                };
                stack_buf.push(p.intern_frame(frame));
            }
            let mut s: Option<StackId> = None;
            for &f in stack_buf.iter().rev() {
                s = Some(p.intern_stack(s, f));
            }
            if p.stacks().len() > limits.max_stacks {
                return Err(too_large(format!(
                    "more than {} distinct call paths",
                    limits.max_stacks
                )));
            }
            let kind = match &kind {
                Some(k) => {
                    let name = k.get(row, &mut p, &mut budget)?;
                    let name = name.map(|n| p.str(n)).unwrap_or("");
                    SampleKind::parse(name).ok_or_else(|| {
                        ParquetError::Schema(format!(
                            "unknown sample kind '{}' (cpu, off-cpu or preempted)",
                            crate::escape::escape(name)
                        ))
                    })?
                }
                None => SampleKind::OnCpu,
            };
            p.add_sample_of(
                kind,
                time.value(row).max(0) as u64,
                thread,
                cpu.value(row).max(0) as u32,
                weight.value(row).max(0) as u64,
                s,
            );
        }
    }
    Ok(p)
}

fn read_meta(kv: &HashMap<String, String>) -> Meta {
    let get = |k: &str| {
        kv.get(&format!("superprof.{k}"))
            .cloned()
            .unwrap_or_default()
    };
    let num = |k: &str| get(k).parse::<u64>().unwrap_or(0);
    Meta {
        command: serde_json::from_str(&get("command")).unwrap_or_default(),
        event: get("event"),
        frequency: num("frequency_hz") as u32,
        start_time_unix_ns: num("start_time_unix_ns"),
        duration_ns: num("duration_ns"),
        host: get("host"),
        version: get("version"),
        lost_samples: num("lost_samples"),
        truncated_stacks: num("truncated_stacks"),
        truncated_by: serde_json::from_str(&get("truncated_by")).unwrap_or_default(),
        cpu_time_ns: num("cpu_time_ns"),
        off_cpu: get("off_cpu"),
    }
}

#[cfg(test)]
mod tests {
    use super::{read_with, write_groups, Limits, ParquetError};
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
            super::contain_panics(|| panic!("attempt to divide by zero"));
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
