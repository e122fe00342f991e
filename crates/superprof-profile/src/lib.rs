//! superprof-profile: the profile model and every writer.
//!
//! A [`Profile`] interns strings, frames and stacks once (a stack is a node in a prefix tree:
//! parent stack plus leaf frame), so a run with millions of samples keeps one copy of each
//! distinct frame and call path. Writers read only this model; they never see a sampler.
//! Names come from the profiled program or a file: text writers print them through
//! [`escape`], and [`parquet::read`] refuses a file past its caps ([`parquet::Limits`]).
//!
//! [`OutputFormat`] names the formats (by name or file extension) and [`output::write`]
//! writes any of them: the [`top`] table, the call [`tree`], [`folded`] stacks, an [`svg`]
//! flamegraph, [`parquet`] (the native file, which `report` reads back), [`pprof`],
//! [`speedscope`], [`firefox`] and [`html`]. [`diff`] compares two profiles, [`Filter`] keeps
//! part of one, [`otlp`] sends one as OpenTelemetry profiles, and [`write_atomic`] writes any
//! file whole.
//!
//! ```
//! use superprof_profile::{Frame, Profile};
//! let mut p = Profile::default();
//! let t = p.add_thread(1, 1, "demo");
//! let main = p.intern_frame_named("main", "demo", None, 0, 0x1000, false);
//! let hot = p.intern_frame_named("hot", "demo", None, 0, 0x1100, false);
//! let s = p.intern_stack(None, main);
//! let s = p.intern_stack(Some(s), hot);
//! p.add_sample(0, t, 0, 1, Some(s));
//! let mut out = Vec::new();
//! superprof_profile::folded::write(&p, &mut out).unwrap();
//! assert_eq!(String::from_utf8(out).unwrap(), "demo;main;hot 1\n");
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod calls;
pub mod diff;
mod escape;
pub mod filter;
pub mod firefox;
pub mod folded;
pub mod html;
mod model;
pub mod otlp;
pub mod output;
mod pages;
pub mod parca;
pub mod parquet;
pub mod pprof;
pub mod pprof_pb;
pub mod sort;
pub mod speedscope;
pub mod spill;
mod strings;
pub mod svg;
pub mod top;
pub mod tree;

pub use escape::escape;
pub use filter::{near_names, Filter};
pub use model::{
    EventInfo, Frame, FrameId, Meta, Profile, Sample, SampleKind, SampleLog, StackId, StackNode,
    StrId, Thread,
};
pub use output::{write_atomic, OutputFormat};
