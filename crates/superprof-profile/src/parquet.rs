//! The native profile file: Apache Parquet, one row per sample (see docs/profile-format.md).
//!
//! Strings (thread names, functions, modules, files) are written as Arrow dictionary arrays
//! whose keys are the profile's own string ids, so writing costs no string copies and Parquet
//! stores each distinct string once per row group. Frames are stored leaf first.

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
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

use crate::{Frame, Meta, Profile, StackId, StrId};

/// Version of the file layout, in the `superprof.format_version` metadata key.
pub const FORMAT_VERSION: &str = "1";

#[derive(Debug, thiserror::Error)]
pub enum ParquetError {
    #[error("cannot open: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a readable Parquet file ({0})")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("not a readable Parquet file ({0})")]
    Arrow(#[from] arrow_schema::ArrowError),
    #[error("not a superprof profile: {0}")]
    Schema(String),
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
    ]
    .into_iter()
    .map(|(k, v)| KeyValue::new(k.to_owned(), v))
    .collect()
}

/// Writes the profile. Samples are written in rows groups of at most 1M rows.
pub fn write<W: Write + Send>(profile: &Profile, w: W) -> Result<(), ParquetError> {
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
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .set_key_value_metadata(Some(pairs))
        .build();
    let mut writer = ArrowWriter::try_new(w, schema.clone(), Some(props))?;
    // All string columns share one dictionary: the profile's string table.
    let strings: ArrayRef = Arc::new(StringArray::from_iter_values(profile.strings()));
    for chunk in profile.samples.chunks(1 << 20) {
        let batch = batch(profile, chunk, &schema, &strings)?;
        writer.write(&batch)?;
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
    ];
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// A string column as written by superprof (dictionary) or rewritten by another tool.
enum StrCol<'a> {
    Dict(&'a DictionaryArray<Int32Type>, Vec<Option<StrId>>),
    Plain(&'a StringArray),
    Large(&'a LargeStringArray),
    View(&'a StringViewArray),
}

impl<'a> StrCol<'a> {
    fn new(a: &'a dyn Array, name: &str, p: &mut Profile) -> Result<StrCol<'a>, ParquetError> {
        let any = a.as_any();
        if let Some(d) = any.downcast_ref::<DictionaryArray<Int32Type>>() {
            let values = d.values();
            let values = values
                .as_any()
                .downcast_ref::<StringArray>()
                .ok_or_else(|| bad(name, "dictionary of strings"))?;
            let ids = (0..values.len())
                .map(|i| values.is_valid(i).then(|| p.intern_str(values.value(i))))
                .collect();
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

    fn get(&self, i: usize, p: &mut Profile) -> Option<StrId> {
        match self {
            StrCol::Dict(d, ids) => {
                if d.is_null(i) {
                    return None;
                }
                ids.get(d.keys().value(i) as usize).copied().flatten()
            }
            StrCol::Plain(s) => s.is_valid(i).then(|| p.intern_str(s.value(i))),
            StrCol::Large(s) => s.is_valid(i).then(|| p.intern_str(s.value(i))),
            StrCol::View(s) => s.is_valid(i).then(|| p.intern_str(s.value(i))),
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

/// Reads a native profile file.
pub fn read(path: &Path) -> Result<Profile, ParquetError> {
    let file = File::open(path)?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)?;
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
    let mut p = Profile::default();
    p.meta = read_meta(&kv);
    let reader = builder.with_batch_size(64 * 1024).build()?;
    let mut threads: HashMap<(u32, u32, StrId), u32> = HashMap::new();
    let mut stack_buf: Vec<crate::FrameId> = Vec::new();
    for batch in reader {
        let b = batch?;
        let time = prim::<Int64Array>(&b, "time_ns", "int64")?;
        let pid = prim::<Int32Array>(&b, "pid", "int32")?;
        let tid = prim::<Int32Array>(&b, "tid", "int32")?;
        let cpu = prim::<Int32Array>(&b, "cpu", "int32")?;
        let weight = prim::<Int64Array>(&b, "weight", "int64")?;
        let tname = StrCol::new(column(&b, "thread_name")?.as_ref(), "thread_name", &mut p)?;
        let stack = prim::<ListArray>(&b, "stack", "list")?;
        let frames = stack
            .values()
            .as_any()
            .downcast_ref::<StructArray>()
            .ok_or_else(|| bad("stack", "list of struct"))?;
        let func = StrCol::new(
            frames
                .column_by_name("function")
                .ok_or_else(|| ParquetError::Schema("no stack field 'function'".into()))?
                .as_ref(),
            "function",
            &mut p,
        )?;
        let module = StrCol::new(
            frames
                .column_by_name("module")
                .ok_or_else(|| ParquetError::Schema("no stack field 'module'".into()))?
                .as_ref(),
            "module",
            &mut p,
        )?;
        let file = StrCol::new(
            frames
                .column_by_name("file")
                .ok_or_else(|| ParquetError::Schema("no stack field 'file'".into()))?
                .as_ref(),
            "file",
            &mut p,
        )?;
        let line = sub::<Int32Array>(frames, "line", "int32")?;
        let addr = sub::<UInt64Array>(frames, "address", "uint64")?;
        let inl = sub::<BooleanArray>(frames, "inlined", "boolean")?;
        let offsets = stack.value_offsets();
        let empty = p.intern_str("");
        for row in 0..b.num_rows() {
            let name = tname.get(row, &mut p).unwrap_or(empty);
            let key = (pid.value(row) as u32, tid.value(row) as u32, name);
            let thread = match threads.get(&key) {
                Some(&t) => t,
                None => {
                    let t = p.add_thread_named(key.0, key.1, name);
                    threads.insert(key, t);
                    t
                }
            };
            stack_buf.clear();
            for i in offsets[row] as usize..offsets[row + 1] as usize {
                let frame = Frame {
                    function: func.get(i, &mut p).unwrap_or(empty),
                    module: module.get(i, &mut p).unwrap_or(empty),
                    file: file.get(i, &mut p),
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
            p.add_sample(
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
    }
}
