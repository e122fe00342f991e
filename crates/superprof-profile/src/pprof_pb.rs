//! pprof's messages: github.com/google/pprof/proto/profile.proto, every field, as prost
//! structs (no build script: the file is small and fixed, and there is no protoc to run).
//! Indices into `string_table` are `i64`, ids `u64`, as the .proto says.

/// A profile: its samples, the locations, functions and mappings they refer to, and the
/// string table every name is an index into.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    /// What each of a sample's values measures (samples/count, cpu/nanoseconds, …).
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    /// The samples.
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    /// The binaries and libraries the locations are in.
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    /// The addresses samples refer to.
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    /// The functions locations' lines are in.
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// Every string of the profile; index 0 is "".
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    /// A regular expression of frames to drop (a string index).
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    /// A regular expression of frames to keep (a string index).
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    /// When the profile was taken, in Unix nanoseconds.
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    /// How long it was taken over.
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    /// What a sampling period is in.
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    /// The sampling period, in `period_type`'s unit.
    #[prost(int64, tag = "12")]
    pub period: i64,
    /// Free-form notes (string indices).
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    /// The sample type a viewer shows first (a string index).
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
    /// Where the profile's documentation is (a string index).
    #[prost(int64, tag = "15")]
    pub doc_url: i64,
}

/// A kind of value and its unit, both string indices.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    /// The kind: "cpu", "samples", …
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    /// The unit: "nanoseconds", "count", …
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// One stack's values.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// The stack's locations, leaf first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    /// One value per sample type.
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    /// Labels: the thread, its ids, the kind of time.
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// A sample's label: a string or a number.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    /// Its key (a string index).
    #[prost(int64, tag = "1")]
    pub key: i64,
    /// A string value (a string index), or 0.
    #[prost(int64, tag = "2")]
    pub str: i64,
    /// A numeric value.
    #[prost(int64, tag = "3")]
    pub num: i64,
    /// The numeric value's unit (a string index).
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

/// A binary or library mapped into the process.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    /// Its id (from 1).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Where it starts in memory.
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    /// Where it ends.
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    /// The file offset mapped at the start.
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    /// Its path (a string index).
    #[prost(int64, tag = "5")]
    pub filename: i64,
    /// Its build id (a string index).
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    /// Its locations are symbolized.
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    /// Their files are known.
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    /// Their lines are known.
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    /// Their inlined frames are known.
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

/// An address, with the lines (an inline chain, innermost first) it is in.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    /// Its id (from 1).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// The mapping it is in.
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    /// The address.
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// Its lines, innermost (inlined) first.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    /// Several call sites folded into one.
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

/// A function and line of a location.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    /// The function.
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    /// The source line.
    #[prost(int64, tag = "2")]
    pub line: i64,
    /// The source column.
    #[prost(int64, tag = "3")]
    pub column: i64,
}

/// A function: its names and file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    /// Its id (from 1).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Its name, demangled (a string index).
    #[prost(int64, tag = "2")]
    pub name: i64,
    /// Its name as the linker knows it (a string index).
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    /// Its source file (a string index).
    #[prost(int64, tag = "4")]
    pub filename: i64,
    /// The line it starts at.
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}
