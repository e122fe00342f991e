//! `record --push pyroscope:URL` (issue 18, first part): the profile goes to Pyroscope's ingest
//! API. No Pyroscope server package is installable here: an HTTP server in the test takes the
//! request and checks it, and its pprof body is the profile written locally, byte for byte.
//! A server that is down or refuses: one line, a non-zero exit, the local file kept.

mod common;

use std::net::TcpListener;

use common::*;

#[test]
fn a_recording_is_pushed_to_pyroscopes_ingest() {
    let _cpu = cpu_share();
    let dir = TempDir::new("push");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = serve_http_once(listener, "200 OK");
    let local = dir.path("p.pb.gz");
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let out = run_ok(
        superprof()
            .args(["record", "-q", "-o"])
            .arg(&local)
            .arg("--push")
            .arg(format!("pyroscope:http://127.0.0.1:{port}"))
            .args([
                "--app",
                "split-test",
                "--label",
                "env=ci",
                "--label",
                "az=b1",
            ])
            .args(["--tenant", "team-a", "--"])
            .arg(&exe)
            .arg("0.5"),
    );
    let (line, headers, body) = server.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("pushed"), "{stderr}");
    let (method, rest) = line.split_once(' ').unwrap();
    assert_eq!(method, "POST");
    let target = rest.rsplit_once(' ').unwrap().0;
    let (path, query) = target.split_once('?').unwrap();
    assert_eq!(path, "/ingest");
    let q: std::collections::BTreeMap<&str, &str> =
        query.split('&').filter_map(|p| p.split_once('=')).collect();
    assert_eq!(
        q["name"], "split-test.cpu%7Benv%3Dci%2Caz%3Db1%7D",
        "{query}"
    );
    assert_eq!(q["spyName"], "superprof");
    assert_eq!(q["format"], "pprof");
    let (from, until): (u64, u64) = (q["from"].parse().unwrap(), q["until"].parse().unwrap());
    assert!(
        from >= before.saturating_sub(1) && until > from && until <= from + 5,
        "{query}"
    );
    // The delivered rate, as the summary gives it.
    let rate: f64 = q["sampleRate"].parse().unwrap();
    let said: f64 = stderr
        .split(" Hz delivered")
        .next()
        .and_then(|s| s.rsplit(", ").next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!((rate - said).abs() <= 1.0, "{rate} against {said}");
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "x-scope-orgid" && v == "team-a"),
        "{headers:?}"
    );
    // The pushed profile is the local one.
    assert_eq!(body, std::fs::read(&local).unwrap());
    // And a real client reads it: go tool pprof, the split within 4σ of what the fixture
    // measured of itself.
    let own = fixture_values(&String::from_utf8_lossy(&out.stdout));
    let pushed = dir.path("pushed.pb.gz");
    std::fs::write(&pushed, &body).unwrap();
    let top = run_ok(
        std::process::Command::new("go")
            .args(["tool", "pprof", "-top", "-sample_index=samples"])
            .arg(&pushed)
            .env("HOME", &dir.0),
    );
    let text = String::from_utf8_lossy(&top.stdout);
    let total: f64 = text
        .lines()
        .find_map(|l| l.split(" of ").nth(1)?.split(" total").next()?.parse().ok())
        .unwrap_or_else(|| panic!("no total in {text}"));
    for f in ["work_alpha", "work_beta", "work_gamma"] {
        // Lines: flat flat% sum% cum cum% name
        let cum: f64 = text
            .lines()
            .find(|l| l.split_whitespace().nth(5) == Some(f))
            .and_then(|l| {
                l.split_whitespace()
                    .nth(4)?
                    .trim_end_matches('%')
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no {f} in {text}"));
        let p = own[f];
        let sigma = 100.0 * (p * (1.0 - p) / total).sqrt();
        assert!(
            (cum - 100.0 * p).abs() < 4.0 * sigma + 0.5,
            "{f}: {cum}% in go tool pprof, the program measured {p}\n{text}"
        );
    }
}

/// A non-zero exit whose last line (after the recording's own) says why the push failed.
fn failed_to_push(out: &std::process::Output, why: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("superprof: cannot push") && last.contains(why),
        "{stderr}"
    );
    assert_eq!(stderr.matches("cannot push").count(), 1, "{stderr}");
}

#[test]
fn a_server_down_or_refusing_gives_one_line_and_the_local_file() {
    let _cpu = cpu_share();
    let dir = TempDir::new("push-down");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
    // Down: a port nobody listens on.
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let local = dir.path("down.folded");
    let out = superprof()
        .args(["record", "-q", "-o"])
        .arg(&local)
        .arg("--push")
        .arg(format!("pyroscope:http://127.0.0.1:{port}"))
        .arg("--")
        .arg(&exe)
        .arg("0.2")
        .output()
        .unwrap();
    failed_to_push(&out, "Connection refused");
    assert!(local.exists());
    // Refusing (400): at once, without retrying.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = serve_http_once(listener, "400 Bad Request");
    let local = dir.path("refused.folded");
    let out = superprof()
        .args(["record", "-q", "-o"])
        .arg(&local)
        .arg("--push")
        .arg(format!("pyroscope:http://127.0.0.1:{port}"))
        .arg("--")
        .arg(&exe)
        .arg("0.2")
        .output()
        .unwrap();
    server.join().unwrap();
    failed_to_push(&out, "400");
    assert!(local.exists());
    // A bad destination costs nothing: refused before the command runs.
    let out = superprof()
        .args(["record", "--push", "parca-ish:http://x", "--"])
        .arg(&exe)
        .arg("5")
        .output()
        .unwrap();
    assert_one_line_error(&out, "--push");
}

/// Issue 31, item 7: a server that answers a push with a redirect did not get the profile; the
/// redirect is not followed (a POST redirected became a GET to the Location, carrying the
/// tenant's header, and superprof said "pushed"), and superprof says nothing was delivered.
#[test]
fn a_redirect_is_a_failure_not_a_delivery() {
    let _cpu = cpu_share();
    let dir = TempDir::new("push-redirect");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
    let elsewhere = TcpListener::bind("127.0.0.1:0").unwrap();
    let elsewhere_port = elsewhere.local_addr().unwrap().port();
    let followed = serve_http_all(elsewhere);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let status: &'static str = Box::leak(
        format!("302 Found\r\nLocation: http://127.0.0.1:{elsewhere_port}/ingest").into_boxed_str(),
    );
    let server = serve_http_once(listener, status);
    let local = dir.path("redirected.folded");
    let out = superprof()
        .args(["record", "-q", "-o"])
        .arg(&local)
        .args(["--push", &format!("pyroscope:http://127.0.0.1:{port}")])
        .args(["--tenant", "team-a", "--"])
        .arg(&exe)
        .arg("0.2")
        .output()
        .unwrap();
    let (line, _, body) = server.join().unwrap();
    assert!(line.starts_with("POST "), "{line}");
    assert!(!body.is_empty());
    failed_to_push(&out, "302");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not delivered"), "{stderr}");
    assert!(local.exists());
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        followed.lock().unwrap().is_empty(),
        "the redirect was followed"
    );
}
