//! Writing: a profile's samples in row groups of bounded rows and frames, its strings as
//! dictionary arrays keyed by the profile's own string ids.

use super::*;

/// Writes the profile. Samples are written in row groups of at most 1M rows and 16M frames,
/// so that a reader decodes a bounded amount at a time.
pub fn write<W: Write + Send>(profile: &Profile, w: W) -> Result<(), ParquetError> {
    write_groups(profile, w, GROUP_ROWS, GROUP_FRAMES)
}

/// [`write`], with row groups of at most `group_rows` samples and `group_frames` frames (a
/// sample deeper than that alone in its group).
pub(super) fn write_groups<W: Write + Send>(
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
    let mut event = Vec::with_capacity(n);
    let events: Vec<String> = profile
        .meta
        .event_list()
        .into_iter()
        .map(|e| e.name)
        .collect();
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
        // (An index past the list: the last event.)
        event.push(i32::from(s.event).min(events.len() as i32 - 1));
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
        Arc::new(DictionaryArray::<Int32Type>::new(
            Int32Array::from(event),
            Arc::new(StringArray::from(events)),
        )),
    ];
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}
