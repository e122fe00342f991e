//! `record --push DEST`: a recording sent to a profile server once written locally (issue 18).
//! Grafana Pyroscope's ingest API: `POST /ingest?name=APP.cpu{K=V,...}&from=&until=
//! &sampleRate=&spyName=superprof&format=pprof` with the pprof (gzip) as the body, and the
//! tenant in `X-Scope-OrgID`. A server that cannot be reached or refuses is tried again with
//! backoff for a bounded time; then one line and a non-zero exit (the local outputs are kept).

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use superprof_profile::Profile;

/// Where profiles go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dest {
    /// Pyroscope's HTTP ingest at this base URL.
    Pyroscope(String),
}

impl Dest {
    /// `pyroscope:http://HOST:PORT`.
    pub fn parse(s: &str) -> Result<Dest> {
        let Some((kind, url)) = s.split_once(':') else {
            bail!("--push '{s}': give KIND:URL, e.g. pyroscope:http://localhost:4040");
        };
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            bail!("--push '{s}': the URL must start with http:// or https://");
        }
        let url = url.trim_end_matches('/').to_owned();
        match kind {
            "pyroscope" => Ok(Dest::Pyroscope(url)),
            "parca" | "otlp" => bail!("--push '{s}': {kind} is not supported yet (pyroscope is)"),
            _ => bail!("--push '{s}': unknown kind '{kind}' (pyroscope)"),
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
    pub tenant: Option<String>,
}

/// How long a server that is down is tried again.
const GIVE_UP_AFTER: Duration = Duration::from_secs(8);

/// `--push DEST` with its `--app`, `--label`s and `--tenant`, checked (before a recording:
/// a bad one costs nothing).
pub fn parse(args: &crate::record::PushArgs) -> Result<(Dest, PushOptions)> {
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

/// Sends `profile` to `dest`, trying again with backoff for a bounded time (Ctrl-C, SIGTERM
/// or SIGHUP end the tries at once).
pub fn push(dest: &Dest, profile: &Profile, opts: &PushOptions) -> Result<()> {
    let Dest::Pyroscope(base) = dest;
    let mut body = Vec::new();
    superprof_profile::pprof::write(profile, &mut body)?;
    let app = app_of(profile, opts);
    let url = ingest_url(base, profile, &app, opts);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(true)
        .build()
        .into();
    let start = Instant::now();
    let mut wait = Duration::from_millis(250);
    let mut tries = 0;
    loop {
        tries += 1;
        let mut req = agent
            .post(&url)
            .header("Content-Type", "application/octet-stream");
        if let Some(t) = &opts.tenant {
            req = req.header("X-Scope-OrgID", t);
        }
        match req.send(&body[..]) {
            Ok(_) => {
                eprintln!(
                    "superprof: pushed {} bytes of pprof to pyroscope:{base} as {}",
                    body.len(),
                    series_name(&app, &opts.labels)
                );
                return Ok(());
            }
            Err(e) => {
                // A refusal of the request itself will not change on a retry.
                let permanent =
                    matches!(&e, ureq::Error::StatusCode(c) if (400..500).contains(c) && *c != 429);
                if permanent
                    || crate::sys::stop_requested()
                    || start.elapsed() + wait > GIVE_UP_AFTER
                {
                    bail!(
                        "cannot push to pyroscope:{base} ({e}; {tries} tr{}); the local outputs are kept",
                        if tries == 1 { "y" } else { "ies" }
                    );
                }
                // In short slices: a stop signal is seen at once.
                let until = Instant::now() + wait;
                while Instant::now() < until && !crate::sys::stop_requested() {
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
        assert!(Dest::parse("parca:http://h").is_err());
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
