//! The Firefox Profiler's processed format, through the fxprof-processed-profile crate: one
//! process per pid, one thread per thread, sample times kept so the timeline works. Frames are
//! already symbolized, so they go in as labels; kernel frames get their own category.

use std::collections::HashMap;
use std::io::{self, Write};
use std::time::Duration;

use fxprof_processed_profile::{
    CategoryColor, CpuDelta, Frame, FrameFlags, FrameInfo, Profile as FxProfile,
    ReferenceTimestamp, SamplingInterval, Timestamp,
};

use crate::Profile;

/// Writes `profile` as a Firefox Profiler JSON file (open it at profiler.firefox.com).
pub fn write(profile: &Profile, w: &mut dyn Write) -> io::Result<()> {
    let interval = if profile.meta.frequency > 0 {
        SamplingInterval::from_hz(profile.meta.frequency as f32)
    } else {
        SamplingInterval::from_millis(1)
    };
    let product = profile
        .meta
        .command
        .first()
        .map(|c| c.rsplit('/').next().unwrap_or(c).to_owned())
        .unwrap_or_else(|| "superprof".to_owned());
    let reference = ReferenceTimestamp::from_duration_since_unix_epoch(Duration::from_nanos(
        profile.meta.start_time_unix_ns,
    ));
    let mut fx = FxProfile::new(&product, reference, interval);
    let user = fx.add_category("User", CategoryColor::Yellow).into();
    let kernel = fx.add_category("Kernel", CategoryColor::Orange).into();
    // Off-CPU time (record --off-cpu): the profiler's own name for time not on a CPU.
    let idle = fx.add_category("Idle", CategoryColor::Transparent).into();
    let interval_ns = interval.nanos();

    let mut processes = HashMap::new();
    let mut threads = HashMap::new();
    // Each thread's first sample, in one pass (the samples may be read back from a file).
    let mut firsts: HashMap<u32, u64> = HashMap::new();
    for s in &profile.samples {
        firsts.entry(s.thread).or_insert(s.time_ns);
    }
    for (i, t) in profile.threads.iter().enumerate() {
        let first = firsts.get(&(i as u32)).copied().unwrap_or(0);
        let start = Timestamp::from_nanos_since_reference(first);
        let process = *processes
            .entry(t.pid)
            .or_insert_with(|| fx.add_process(&product, t.pid, start));
        let handle = fx.add_thread(process, t.tid, start, t.tid == t.pid);
        fx.set_thread_name(handle, profile.str(t.name));
        threads.insert(i as u32, handle);
    }
    // Stacks are interned per thread by the crate; memoize ours per (thread, stack).
    let mut stacks = HashMap::new();
    for s in &profile.samples {
        let thread = threads[&s.thread];
        let stack = *stacks.entry((s.thread, s.stack)).or_insert_with(|| {
            let mut frames: Vec<_> = profile.stack_frames(s.stack).collect();
            frames.reverse();
            let infos: Vec<FrameInfo> = frames
                .iter()
                .map(|&fid| {
                    let f = profile.frame(fid);
                    let category = match profile.str(f.module) {
                        "[kernel.kallsyms]" => kernel,
                        crate::model::WAIT_MODULE => idle,
                        _ => user,
                    };
                    FrameInfo {
                        frame: Frame::Label(fx.intern_string(profile.str(f.function))),
                        category_pair: category,
                        flags: FrameFlags::empty(),
                    }
                })
                .collect();
            fx.intern_stack_frames(thread, infos.into_iter())
        });
        fx.add_sample(
            thread,
            Timestamp::from_nanos_since_reference(s.time_ns),
            stack,
            // Time off the CPU used none.
            CpuDelta::from_nanos(if s.kind.is_off_cpu() {
                0
            } else {
                interval_ns.saturating_mul(s.weight)
            }),
            s.weight as i32,
        );
    }
    fx.set_symbolicated(true);
    serde_json::to_writer(&mut *w, &fx)?;
    Ok(())
}
