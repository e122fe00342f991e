//! superprof-push: profiles sent to a profile server (`record --push DEST` and `agent`; issue
//! 18).
//! - Grafana Pyroscope's ingest API: `POST /ingest?name=APP.cpu{K=V,...}&from=&until=
//!   &sampleRate=&spyName=superprof&format=pprof` with the pprof (gzip) as the body, and the
//!   tenant in `X-Scope-OrgID`.
//! - Parca: gRPC `parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw`, one series whose
//!   labels are `__name__`, `job` (the application) and the `--label`s, its one sample the
//!   pprof as `raw_profile` ([`grpc`] speaks the HTTP/2).
//! - OTLP profiles (`opentelemetry.proto.collector.profiles.v1development`, as
//!   [`superprof_profile::otlp`] pins it): `ProfilesService/Export` over gRPC, or
//!   `POST /v1development/profiles` with the protobuf body (OTLP/HTTP).
//!
//! A server that cannot be reached or refuses for the while (down, overloaded) is tried
//! again with backoff for a bounded time; a refusal of the request itself ends the tries at
//! once; then one line and a non-zero exit (the local outputs are kept).
//!
//! ```no_run
//! # fn profile() -> superprof_profile::Profile { unimplemented!() }
//! use superprof_push::{parse, push, PushArgs};
//! let (dest, opts) = parse(&PushArgs {
//!     dest: "pyroscope:http://localhost:4040".into(),
//!     app: Some("myapp".into()),
//!     labels: vec!["env=prod".into()],
//!     tenant: None,
//! })?;
//! push(&dest, &profile(), &opts, &|| false)?;
//! # Ok::<(), superprof_push::Error>(())
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod grpc;

use std::time::{Duration, Instant};

use superprof_profile::Profile;

/// A destination, label or push that failed: one line that says why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// This crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Returns early with an [`Error`] of a formatted message.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err(Error(format!($($arg)*)))
    };
}

/// Where profiles go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dest {
    /// Pyroscope's HTTP ingest at this base URL.
    Pyroscope(String),
    /// Parca's gRPC WriteRaw.
    Parca(String),
    /// An OTLP profiles receiver: over gRPC, or over HTTP (`http`).
    Otlp {
        /// The receiver's base URL.
        url: String,
        /// OTLP over HTTP (protobuf bodies) rather than gRPC.
        http: bool,
    },
}

impl Dest {
    /// `KIND:http[s]://HOST:PORT`, KIND one of pyroscope, parca, otlp, otlp-http.
    pub fn parse(s: &str) -> Result<Dest> {
        const KINDS: &str = "pyroscope, parca, otlp (gRPC) or otlp-http";
        let Some((kind, url)) = s.split_once(':') else {
            bail!(
                "--push '{s}': give KIND:URL, e.g. pyroscope:http://localhost:4040 (KIND: {KINDS})"
            );
        };
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            bail!("--push '{s}': the URL must start with http:// or https://");
        }
        let url = url.trim_end_matches('/').to_owned();
        if let Err(e) = grpc::Endpoint::parse(&url) {
            bail!("--push {e}");
        }
        match kind {
            "pyroscope" => Ok(Dest::Pyroscope(url)),
            "parca" => Ok(Dest::Parca(url)),
            "otlp" => Ok(Dest::Otlp { url, http: false }),
            "otlp-http" => Ok(Dest::Otlp { url, http: true }),
            _ => bail!("--push '{s}': unknown kind '{kind}' ({KINDS})"),
        }
    }

    /// How it is named in messages: `KIND:URL`.
    pub fn name(&self) -> String {
        match self {
            Dest::Pyroscope(u) => format!("pyroscope:{u}"),
            Dest::Parca(u) => format!("parca:{u}"),
            Dest::Otlp { url, http: false } => format!("otlp:{url}"),
            Dest::Otlp { url, http: true } => format!("otlp-http:{url}"),
        }
    }
}

/// What goes with a pushed profile.
#[derive(Debug, Clone, Default)]
pub struct PushOptions {
    /// The application (None: the command's name, from the profile).
    pub app: Option<String>,
    /// KEY=VALUE labels, checked.
    pub labels: Vec<(String, String)>,
    /// The tenant, sent as `X-Scope-OrgID` (multi-tenant servers).
    pub tenant: Option<String>,
}

/// How long a server that is down is tried again.
const GIVE_UP_AFTER: Duration = Duration::from_secs(8);

/// What `--push` asks, unchecked (record's and the agent's).
#[derive(Debug, Clone)]
pub struct PushArgs {
    /// `pyroscope:URL`, `parca:URL`, `otlp:URL` or `otlp-http:URL`.
    pub dest: String,
    /// `--app NAME`.
    pub app: Option<String>,
    /// Each `--label KEY=VALUE`.
    pub labels: Vec<String>,
    /// `--tenant ID`.
    pub tenant: Option<String>,
}

/// `--push DEST` with its `--app`, `--label`s and `--tenant`, checked (before a recording:
/// a bad one costs nothing).
pub fn parse(args: &PushArgs) -> Result<(Dest, PushOptions)> {
    let labels = args
        .labels
        .iter()
        .map(|l| parse_label(l))
        .collect::<Result<Vec<_>>>()?;
    let opts = PushOptions {
        app: args.app.clone(),
        labels,
        tenant: args.tenant.clone(),
    };
    Ok((Dest::parse(&args.dest)?, opts))
}

/// The application a profile is pushed as: `--app`, else its command's name.
fn app_of(profile: &Profile, opts: &PushOptions) -> String {
    opts.app.clone().unwrap_or_else(|| {
        profile
            .meta
            .command
            .first()
            .and_then(|c| c.rsplit('/').next())
            .filter(|c| !c.is_empty())
            .unwrap_or("superprof")
            .to_owned()
    })
}

/// A `KEY=VALUE` label: the key a Prometheus-style name, the value without the characters
/// Pyroscope's name syntax uses (`{`, `}`, `,`, `=`).
pub fn parse_label(s: &str) -> Result<(String, String)> {
    let Some((k, v)) = s.split_once('=') else {
        bail!("--label '{s}': give KEY=VALUE");
    };
    let key_ok = !k.is_empty()
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !k.starts_with(|c: char| c.is_ascii_digit());
    if !key_ok {
        bail!("--label '{s}': a key is letters, digits and _, not starting with a digit");
    }
    if v.is_empty() || v.chars().any(|c| "{},=".contains(c) || c.is_control()) {
        bail!("--label '{s}': a value is not empty and holds none of {{ }} , =");
    }
    Ok((k.to_owned(), v.to_owned()))
}

/// Pyroscope's application name with its labels: `APP.cpu{K=V,...}`.
pub fn series_name(app: &str, labels: &[(String, String)]) -> String {
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{app}.cpu{{{}}}", labels.join(","))
}

/// Percent-encoding of a query value.
fn query_escaped(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The ingest URL of one profile, pushed as `app`.
pub fn ingest_url(base: &str, profile: &Profile, app: &str, opts: &PushOptions) -> String {
    let from = profile.meta.start_time_unix_ns / 1_000_000_000;
    let until =
        (profile.meta.start_time_unix_ns + profile.meta.duration_ns).div_ceil(1_000_000_000);
    let rate = match profile
        .meta
        .delivered_frequency(profile.on_cpu_samples() as usize)
    {
        r if r > 0.0 => r.round() as u64,
        _ => u64::from(profile.meta.frequency),
    };
    format!(
        "{base}/ingest?name={}&from={from}&until={}&sampleRate={rate}&spyName=superprof&format=pprof",
        query_escaped(&series_name(app, &opts.labels)),
        until.max(from + 1),
    )
}

/// One try's failure: whether another try may help.
pub struct Failure {
    /// What went wrong, in one line.
    pub message: String,
    /// Another try may help (the server unreachable, busy or failing for now).
    pub transient: bool,
}

impl From<grpc::CallError> for Failure {
    fn from(e: grpc::CallError) -> Failure {
        Failure {
            transient: e.transient(),
            message: e.to_string(),
        }
    }
}

/// An HTTP POST of `body` to `url` (`content_type`, the tenant's header if any).
fn post(url: &str, content_type: &str, body: &[u8], tenant: Option<&str>) -> Result<(), Failure> {
    // No redirect is followed: a POST redirected becomes a GET that delivers nothing (with the
    // tenant's header sent to wherever the Location points).
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(true)
        .max_redirects(0)
        .build()
        .into();
    let mut req = agent.post(url).header("Content-Type", content_type);
    if let Some(t) = tenant {
        req = req.header("X-Scope-OrgID", t);
    }
    match req.send(body) {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Failure {
            transient: false,
            message: format!(
                "the server answered {}{}: the profile was not delivered (redirects are not \
                 followed; give the final URL)",
                r.status(),
                r.headers()
                    .get("location")
                    .and_then(|l| l.to_str().ok())
                    .map(|l| format!(
                        " (to {})",
                        superprof_profile::escape(&l.chars().take(200).collect::<String>())
                    ))
                    .unwrap_or_default()
            ),
        }
        .into_err(),
        Err(e) => Failure {
            // A refusal of the request itself will not change on a retry.
            transient: !matches!(&e, ureq::Error::StatusCode(c) if (400..500).contains(c) && *c != 429),
            message: e.to_string(),
        }
        .into_err(),
    }
}

impl Failure {
    fn into_err<T>(self) -> Result<T, Failure> {
        Err(self)
    }
}

/// Parca's WriteRawRequest: one series (its labels: `__name__`, `job` = the application,
/// then the `--label`s), its one sample the gzipped pprof; the tenant in its (deprecated)
/// field.
pub fn parca_write_raw(pprof: &[u8], app: &str, opts: &PushOptions) -> Vec<u8> {
    let labels: Vec<(&str, &str)> = [("__name__", "superprof_cpu"), ("job", app)]
        .into_iter()
        .chain(opts.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .collect();
    superprof_profile::parca::write_raw(pprof, &labels, opts.tenant.as_deref())
}

/// The resource attributes of an OTLP push: `service.name` (the application), the host's
/// name, the process's (its pid and executable when one process was recorded), and the
/// `--label`s.
fn otlp_resource(profile: &Profile, app: &str, opts: &PushOptions) -> Vec<(String, String)> {
    let mut attrs = vec![("service.name".to_owned(), app.to_owned())];
    if !profile.meta.host.is_empty() {
        attrs.push(("host.name".into(), profile.meta.host.clone()));
    }
    let mut pids: Vec<u32> = profile.threads.iter().map(|t| t.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    if let [pid] = pids[..] {
        attrs.push(("process.pid".into(), pid.to_string()));
    }
    if let Some(exe) = profile.meta.command.first() {
        attrs.push((
            "process.executable.name".into(),
            exe.rsplit('/').next().unwrap_or(exe).to_owned(),
        ));
    }
    attrs.extend(opts.labels.iter().cloned());
    attrs
}

/// What was sent: its size and what it was, for the line that says so.
pub struct Sent {
    /// Bytes of the request's body.
    pub bytes: usize,
    /// What was sent, for the line that says so.
    pub what: String,
}

/// One try at sending `profile` to `dest` (no retry).
pub fn send_once(dest: &Dest, profile: &Profile, opts: &PushOptions) -> Result<Sent, Failure> {
    let app = app_of(profile, opts);
    // The gzipped pprof, for the destinations that take it (OTLP has its own encoding).
    let pprof = || {
        let mut out = Vec::new();
        superprof_profile::pprof::write(profile, &mut out)
            .map(|()| out)
            .map_err(|e| Failure {
                message: format!("cannot encode the profile: {e}"),
                transient: false,
            })
    };
    let tenant = opts.tenant.as_deref();
    let timeout = Duration::from_secs(10);
    match dest {
        Dest::Pyroscope(base) => {
            let url = ingest_url(base, profile, &app, opts);
            let pprof = pprof()?;
            post(&url, "application/octet-stream", &pprof, tenant)?;
            Ok(Sent {
                bytes: pprof.len(),
                what: format!("pprof as {}", series_name(&app, &opts.labels)),
            })
        }
        Dest::Parca(url) => {
            let body = parca_write_raw(&pprof()?, &app, opts);
            grpc::call(
                url,
                "/parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw",
                &body,
                &[],
                timeout,
            )?;
            Ok(Sent {
                bytes: body.len(),
                what: format!("pprof (WriteRaw) as job={app}"),
            })
        }
        Dest::Otlp { url, http } => {
            let resource = otlp_resource(profile, &app, opts);
            let body = superprof_profile::otlp::export_request(profile, &resource);
            let response = if *http {
                let target = if url.contains("/v1") {
                    url.clone()
                } else {
                    format!("{url}/v1development/profiles")
                };
                // (The response's body is not read: a 200 is a success.)
                post(&target, "application/x-protobuf", &body, tenant)?;
                Vec::new()
            } else {
                let metadata: Vec<(&str, &str)> =
                    tenant.map(|t| ("x-scope-orgid", t)).into_iter().collect();
                grpc::call(
                    url,
                    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export",
                    &body,
                    &metadata,
                    timeout,
                )?
            };
            if let Some(message) = superprof_profile::otlp::rejection(&response) {
                return Err(Failure {
                    message,
                    transient: false,
                });
            }
            Ok(Sent {
                bytes: body.len(),
                what: format!(
                    "OTLP profiles ({}) as service.name={app}",
                    superprof_profile::otlp::VERSION
                ),
            })
        }
    }
}

/// Sends `profile` to `dest`, trying again with backoff for a bounded time; `stop` (the
/// binary's: Ctrl-C, SIGTERM or SIGHUP came) is looked at between tries and every 50 ms of a
/// wait, and ends the tries at once.
pub fn push(
    dest: &Dest,
    profile: &Profile,
    opts: &PushOptions,
    stop: &dyn Fn() -> bool,
) -> Result<()> {
    let start = Instant::now();
    let mut wait = Duration::from_millis(250);
    let mut tries = 0;
    loop {
        tries += 1;
        match send_once(dest, profile, opts) {
            Ok(sent) => {
                superprof_unwind::say!(
                    "superprof: pushed {} bytes of {} to {}",
                    sent.bytes,
                    sent.what,
                    dest.name()
                );
                return Ok(());
            }
            Err(f) => {
                if !f.transient || stop() || start.elapsed() + wait > GIVE_UP_AFTER {
                    bail!(
                        "cannot push to {} ({}; {tries} tr{}); the local outputs are kept",
                        dest.name(),
                        f.message,
                        if tries == 1 { "y" } else { "ies" }
                    );
                }
                // In short slices: a stop signal is seen at once.
                let until = Instant::now() + wait;
                while Instant::now() < until && !stop() {
                    std::thread::sleep(Duration::from_millis(50));
                }
                wait = (wait * 2).min(Duration::from_secs(4));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_and_labels_are_checked() {
        assert_eq!(
            Dest::parse("pyroscope:http://h:4040/").unwrap(),
            Dest::Pyroscope("http://h:4040".into())
        );
        assert!(Dest::parse("pyroscope:h:4040").is_err());
        assert!(Dest::parse("nope:http://h").is_err());
        assert_eq!(
            Dest::parse("parca:http://h:7070").unwrap(),
            Dest::Parca("http://h:7070".into())
        );
        assert_eq!(
            Dest::parse("otlp-http:https://h/").unwrap(),
            Dest::Otlp {
                url: "https://h".into(),
                http: true
            }
        );
        assert!(Dest::parse("otlp:http://h:x").is_err());
        assert_eq!(
            parse_label("env=prod").unwrap(),
            ("env".into(), "prod".into())
        );
        for bad in ["env", "=x", "1a=b", "a-b=c", "a=", "a=b,c", "a={b}"] {
            assert!(parse_label(bad).is_err(), "{bad}");
        }
        let labels = vec![
            ("env".to_owned(), "prod".to_owned()),
            ("az".into(), "b".into()),
        ];
        assert_eq!(series_name("app", &labels), "app.cpu{env=prod,az=b}");
        assert_eq!(query_escaped("a.cpu{x=y}"), "a.cpu%7Bx%3Dy%7D");
    }
}
