//! Reading a file that may come from anyone: its metadata, pages and stack depths checked
//! against [`Limits`] before the samples are decoded, strings and call paths counted while
//! they are.

use super::*;

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
const COLUMNS: [&str; 9] = [
    "time_ns",
    "pid",
    "tid",
    "thread_name",
    "cpu",
    "weight",
    "stack",
    "kind",
    "event",
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
pub(super) fn contain_panics<T>(
    f: impl FnOnce() -> Result<T, ParquetError>,
) -> Result<T, ParquetError> {
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
    let events = p.meta.event_list();
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
        // (Files before format 3 have no event column: one event.)
        let event = match b.column_by_name("event") {
            Some(c) => Some(StrCol::new(c, "event", &mut p, &mut budget)?),
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
            let event = match &event {
                Some(e) => {
                    let name = e.get(row, &mut p, &mut budget)?;
                    let name = name.map(|n| p.str(n)).unwrap_or("");
                    let i = events.iter().position(|e| e.name == name).ok_or_else(|| {
                        ParquetError::Schema(format!(
                            "sample of event '{}', which superprof.events does not list",
                            crate::escape::escape(name)
                        ))
                    })?;
                    i.min(255) as u8
                }
                None => 0,
            };
            p.samples.push(crate::Sample {
                time_ns: time.value(row).max(0) as u64,
                thread,
                cpu: cpu.value(row).max(0) as u32,
                weight: weight.value(row).max(0) as u64,
                stack: s,
                kind,
                event,
            });
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
        events: read_events(&get("events")),
        calls: read_calls(&get("calls")),
    }
}

#[cfg(test)]
pub(super) fn read_calls_for_test(json: &str) -> Vec<crate::calls::FunctionCalls> {
    read_calls(json)
}

/// At most this many counted functions, and blocks of each, are read from a file.
const CALLS_MAX: usize = 4096;
const BLOCKS_MAX: usize = 65536;

/// `superprof.calls` (see `calls_json`): entries that are not objects of the right fields
/// are left out, and so are blocks that are not `[start, end, count, file, line]`.
fn read_calls(json: &str) -> Vec<crate::calls::FunctionCalls> {
    let Ok(serde_json::Value::Array(list)) = serde_json::from_str::<serde_json::Value>(json) else {
        return Vec::new();
    };
    let text =
        |e: &serde_json::Value, k: &str| e.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    let num = |e: &serde_json::Value, k: &str| e.get(k).and_then(|v| v.as_u64());
    let flag = |e: &serde_json::Value, k: &str| e.get(k).and_then(|v| v.as_bool());
    list.iter()
        .filter_map(|e| {
            let blocks = e
                .get("blocks")
                .and_then(|b| b.as_array())
                .map(|b| {
                    b.iter()
                        .filter_map(|b| {
                            let b = b.as_array()?;
                            Some(crate::calls::BlockCount {
                                start: b.first()?.as_u64()?,
                                end: b.get(1)?.as_u64()?,
                                count: b.get(2)?.as_u64()?,
                                file: b.get(3)?.as_str()?.to_owned(),
                                line: u32::try_from(b.get(4)?.as_u64()?).ok()?,
                            })
                        })
                        .take(BLOCKS_MAX)
                        .collect()
                })
                .unwrap_or_default();
            Some(crate::calls::FunctionCalls {
                function: text(e, "function")?,
                module: text(e, "module")?,
                address: num(e, "address")?,
                counted: flag(e, "counted")?,
                calls: num(e, "calls")?,
                entries: num(e, "entries")?,
                since_ns: num(e, "since_ns")?,
                exact: flag(e, "exact")?,
                note: text(e, "note").unwrap_or_default(),
                blocks,
                lines: e
                    .get("lines")
                    .and_then(|l| l.as_array())
                    .map(|l| {
                        l.iter()
                            .filter_map(|l| {
                                let l = l.as_array()?;
                                Some(crate::calls::LineCount {
                                    file: l.first()?.as_str()?.to_owned(),
                                    line: u32::try_from(l.get(1)?.as_u64()?).ok()?,
                                    count: l.get(2)?.as_u64()?,
                                })
                            })
                            .take(BLOCKS_MAX)
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        })
        .take(CALLS_MAX)
        .collect()
}

/// `superprof.events`: `[{"name": ..., "counted": ...}, ...]` (at most 256; anything else
/// in the list is left out).
fn read_events(json: &str) -> Vec<crate::EventInfo> {
    let Ok(serde_json::Value::Array(list)) = serde_json::from_str::<serde_json::Value>(json) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|e| {
            Some(crate::EventInfo {
                name: e.get("name")?.as_str()?.to_owned(),
                counted: e.get("counted")?.as_bool()?,
            })
        })
        .take(256)
        .collect()
}
