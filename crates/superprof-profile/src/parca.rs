//! Parca's WriteRaw messages (parca/profilestore/v1alpha1/profilestore.proto, the fields a
//! push writes), as prost structs: no maintained crate has them.

use prost::Message;

/// `WriteRawRequest`: series of raw (pprof) profiles.
#[derive(Clone, PartialEq, Message)]
pub struct WriteRawRequest {
    /// The tenant (deprecated in the .proto, still read by Parca's servers).
    #[prost(string, tag = "1")]
    pub tenant: String,
    /// The profiles, by label set.
    #[prost(message, repeated, tag = "2")]
    pub series: Vec<RawProfileSeries>,
    /// The profiles' addresses are already normalized (symbolized frames' own).
    #[prost(bool, tag = "3")]
    pub normalized: bool,
}

/// The profiles of one label set.
#[derive(Clone, PartialEq, Message)]
pub struct RawProfileSeries {
    /// Its labels.
    #[prost(message, optional, tag = "1")]
    pub labels: Option<LabelSet>,
    /// Its profiles.
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<RawSample>,
}

/// Labels.
#[derive(Clone, PartialEq, Message)]
pub struct LabelSet {
    /// The labels, in order.
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
}

/// A label: a name and its value.
#[derive(Clone, PartialEq, Message)]
pub struct Label {
    /// Its name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// One profile.
#[derive(Clone, PartialEq, Message)]
pub struct RawSample {
    /// A gzipped pprof.
    #[prost(bytes = "vec", tag = "1")]
    pub raw_profile: Vec<u8>,
}

/// A WriteRawRequest of one series (its labels in order), its one sample the gzipped pprof
/// `pprof`; the tenant, if any; `normalized`, as superprof's pprof addresses are the
/// symbolized frames' own.
pub fn write_raw(pprof: &[u8], labels: &[(&str, &str)], tenant: Option<&str>) -> Vec<u8> {
    WriteRawRequest {
        tenant: tenant.unwrap_or_default().to_owned(),
        series: vec![RawProfileSeries {
            labels: Some(LabelSet {
                labels: labels
                    .iter()
                    .map(|&(name, value)| Label {
                        name: name.to_owned(),
                        value: value.to_owned(),
                    })
                    .collect(),
            }),
            samples: vec![RawSample {
                raw_profile: pprof.to_vec(),
            }],
        }],
        normalized: true,
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_raw_request_reads_back() {
        let b = write_raw(
            b"gz",
            &[("__name__", "superprof_cpu"), ("job", "app")],
            None,
        );
        let r = WriteRawRequest::decode(&b[..]).unwrap();
        assert_eq!(r.tenant, "");
        assert!(r.normalized);
        let s = &r.series[0];
        let names: Vec<(&str, &str)> = s
            .labels
            .as_ref()
            .unwrap()
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        assert_eq!(names, [("__name__", "superprof_cpu"), ("job", "app")]);
        assert_eq!(s.samples[0].raw_profile, b"gz");
    }
}
