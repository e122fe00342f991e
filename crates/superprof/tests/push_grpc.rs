//! `record --push parca:URL | otlp:URL | otlp-http:URL` (issue 18): the profile goes to
//! Parca's WriteRaw and to an OTLP profiles receiver. The gRPC servers are real ones, tonic's
//! (hyper and h2 underneath), built here; their handler keeps each request, which the test
//! decodes from the published protos (Parca's messages from superprof-profile's `parca`, after
//! its profilestore.proto; OTLP's from the opentelemetry-proto crate, v1.10.0) and compares with
//! the profile written locally. Refusals and a server that is down, then up, too.

#![cfg(feature = "grpc")]

mod common;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use common::*;
use prost::Message;
use superprof_profile::parca::WriteRawRequest;
// (The client's codec, which keeps a message's bytes as they are.)
use superprof_push::grpc::Raw;

/// One call as the server saw it.
#[derive(Debug, Clone)]
struct Call {
    path: String,
    metadata: Vec<(String, String)>,
    body: Vec<u8>,
}

/// The answer to a call: a response message, or a status.
type Answer = Arc<dyn Fn(&Call, usize) -> Result<Vec<u8>, tonic::Status> + Send + Sync>;

/// Every method of every service: the call kept, the answer given.
#[derive(Clone)]
struct Server {
    calls: Arc<Mutex<Vec<Call>>>,
    answer: Answer,
}

struct Unary {
    server: Server,
    path: String,
}

impl tonic::server::UnaryService<Vec<u8>> for Unary {
    type Response = Vec<u8>;
    type Future = tonic::codegen::BoxFuture<tonic::Response<Vec<u8>>, tonic::Status>;
    fn call(&mut self, request: tonic::Request<Vec<u8>>) -> Self::Future {
        let metadata = request
            .metadata()
            .iter()
            .filter_map(|kv| match kv {
                tonic::metadata::KeyAndValueRef::Ascii(k, v) => {
                    Some((k.to_string(), v.to_str().unwrap_or_default().to_owned()))
                }
                _ => None,
            })
            .collect();
        let call = Call {
            path: self.path.clone(),
            metadata,
            body: request.into_inner(),
        };
        let n = {
            let mut calls = self.server.calls.lock().unwrap();
            calls.push(call.clone());
            calls.len()
        };
        let answer = (self.server.answer)(&call, n);
        Box::pin(async move { answer.map(tonic::Response::new) })
    }
}

impl tonic::codegen::Service<tonic::codegen::http::Request<tonic::body::Body>> for Server {
    type Response = tonic::codegen::http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;
    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: tonic::codegen::http::Request<tonic::body::Body>) -> Self::Future {
        let unary = Unary {
            server: self.clone(),
            path: req.uri().path().to_owned(),
        };
        Box::pin(async move {
            let mut grpc =
                tonic::server::Grpc::new(Raw).apply_max_message_size_config(Some(64 << 20), None);
            Ok(grpc.unary(unary, req).await)
        })
    }
}

/// Starts a gRPC server on `listener` (in a thread of its own, for the test's life);
/// returns the calls it keeps.
fn grpc_server(listener: TcpListener, answer: Answer) -> Arc<Mutex<Vec<Call>>> {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let server = Server {
        calls: calls.clone(),
        answer,
    };
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            tonic::transport::Server::builder()
                .serve_with_incoming(server, incoming)
                .await
                .unwrap();
        });
    });
    calls
}

fn ok_empty() -> Answer {
    Arc::new(|_, _| Ok(Vec::new()))
}

fn record_and_push(
    dir: &TempDir,
    exe: &std::path::Path,
    local: &std::path::Path,
    dest: &str,
    extra: &[&str],
) -> std::process::Output {
    superprof()
        .args(["record", "-q", "-o"])
        .arg(local)
        .args(["--push", dest])
        .args(extra)
        .arg("--")
        .arg(exe)
        .arg("0.5")
        .current_dir(&dir.0)
        .output()
        .unwrap()
}

#[test]
fn a_recording_is_pushed_to_parcas_write_raw() {
    let _cpu = cpu_share();
    let dir = TempDir::new("push-parca");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let calls = grpc_server(listener, ok_empty());
    let local = dir.path("p.pb.gz");
    let out = record_and_push(
        &dir,
        &exe,
        &local,
        &format!("parca:http://127.0.0.1:{port}"),
        &[
            "--app",
            "split-test",
            "--label",
            "env=ci",
            "--tenant",
            "team-a",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("pushed") && stderr.contains("parca:"),
        "{stderr}"
    );
    let calls = calls.lock().unwrap();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        calls[0].path,
        "/parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw"
    );
    let req = WriteRawRequest::decode(&calls[0].body[..]).unwrap();
    assert_eq!(req.tenant, "team-a");
    assert!(req.normalized);
    assert_eq!(req.series.len(), 1);
    let labels: BTreeMap<String, String> = req.series[0]
        .labels
        .as_ref()
        .unwrap()
        .labels
        .iter()
        .map(|l| (l.name.clone(), l.value.clone()))
        .collect();
    assert_eq!(labels["__name__"], "superprof_cpu");
    assert_eq!(labels["job"], "split-test");
    assert_eq!(labels["env"], "ci");
    // The pushed profile is the local one, byte for byte.
    assert_eq!(req.series[0].samples.len(), 1);
    assert_eq!(
        req.series[0].samples[0].raw_profile,
        std::fs::read(&local).unwrap()
    );
}

/// The folded stacks of an OTLP request (thread name first, as superprof's folded output
/// has them), in sampling periods.
fn otlp_folded(
    req: &opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest,
) -> BTreeMap<String, u64> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    let d = req.dictionary.as_ref().expect("a dictionary");
    let s = |i: i32| d.string_table[i as usize].clone();
    assert_eq!(d.string_table[0], "");
    let mut out = BTreeMap::new();
    assert_eq!(req.resource_profiles.len(), 1);
    let scopes = &req.resource_profiles[0].scope_profiles;
    assert_eq!(scopes.len(), 1);
    for p in &scopes[0].profiles {
        let st = p.sample_type.unwrap();
        assert_eq!(
            (s(st.type_strindex), s(st.unit_strindex)),
            ("cpu".into(), "nanoseconds".into())
        );
        assert!(p.period > 0 && p.time_unix_nano > 0 && p.duration_nano > 0);
        for sm in &p.samples {
            let mut thread = None;
            for &a in &sm.attribute_indices {
                let kv = &d.attribute_table[a as usize];
                if s(kv.key_strindex) == "thread.name" {
                    if let Some(Value::StringValue(v)) =
                        kv.value.as_ref().and_then(|v| v.value.clone())
                    {
                        thread = Some(v);
                    }
                }
            }
            let mut names = Vec::new();
            for &l in &d.stack_table[sm.stack_index as usize].location_indices {
                for line in &d.location_table[l as usize].lines {
                    names.push(s(
                        d.function_table[line.function_index as usize].name_strindex
                    ));
                }
            }
            names.reverse();
            if names.is_empty() {
                names.push("[unknown]".into());
            }
            let key = format!("{};{}", thread.expect("a thread.name"), names.join(";"));
            assert_eq!(sm.values.len(), 1);
            *out.entry(key).or_default() += (sm.values[0] / p.period) as u64;
        }
    }
    out
}

fn local_folded(path: &std::path::Path) -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .map(|l| {
            let (stack, n) = l.rsplit_once(' ').unwrap();
            (stack.to_owned(), n.parse().unwrap())
        })
        .collect()
}

#[test]
fn a_recording_is_exported_to_otlp_over_grpc_and_http() {
    use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
    let _cpu = cpu_share();
    let dir = TempDir::new("push-otlp");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
    // gRPC.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let calls = grpc_server(listener, ok_empty());
    let local = dir.path("g.folded");
    let out = record_and_push(
        &dir,
        &exe,
        &local,
        &format!("otlp:http://127.0.0.1:{port}"),
        &[
            "--app",
            "split-test",
            "--label",
            "env=ci",
            "--tenant",
            "team-a",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let calls = calls.lock().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].path,
        "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export"
    );
    assert!(
        calls[0]
            .metadata
            .iter()
            .any(|(k, v)| k == "x-scope-orgid" && v == "team-a"),
        "{:?}",
        calls[0].metadata
    );
    let req = ExportProfilesServiceRequest::decode(&calls[0].body[..]).unwrap();
    let attrs: BTreeMap<String, String> = req.resource_profiles[0]
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.clone()) {
                Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s)) => s,
                other => format!("{other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect();
    assert_eq!(attrs["service.name"], "split-test");
    assert_eq!(attrs["env"], "ci");
    assert!(
        attrs.contains_key("host.name") && attrs.contains_key("process.pid"),
        "{attrs:?}"
    );
    // The exported profile is the local one: the same stacks, the same counts.
    assert_eq!(otlp_folded(&req), local_folded(&local));

    // HTTP: POST /v1development/profiles with the same message.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = serve_http_once(listener, "200 OK");
    let local = dir.path("h.folded");
    let out = record_and_push(
        &dir,
        &exe,
        &local,
        &format!("otlp-http:http://127.0.0.1:{port}"),
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let (line, headers, body) = server.join().unwrap();
    assert!(line.starts_with("POST /v1development/profiles "), "{line}");
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "content-type" && v == "application/x-protobuf"),
        "{headers:?}"
    );
    let req = ExportProfilesServiceRequest::decode(&body[..]).unwrap();
    assert_eq!(otlp_folded(&req), local_folded(&local));
}

#[test]
fn grpc_refusals_end_at_once_and_an_unavailable_server_is_tried_again() {
    let _cpu = cpu_share();
    let dir = TempDir::new("push-grpc-refused");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
    // INVALID_ARGUMENT: a refusal of the request; one try, one line.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let calls = grpc_server(
        listener,
        Arc::new(|_, _| Err(tonic::Status::invalid_argument("bad label: x"))),
    );
    let local = dir.path("r.folded");
    let out = record_and_push(
        &dir,
        &exe,
        &local,
        &format!("parca:http://127.0.0.1:{port}"),
        &[],
    );
    assert_one_push_failure(&out, "gRPC status 3 (INVALID_ARGUMENT): bad label: x");
    assert_eq!(calls.lock().unwrap().len(), 1);
    assert!(local.exists());
    // UNAVAILABLE twice, then accepted: pushed on the third try.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let calls = grpc_server(
        listener,
        Arc::new(|_, n| {
            if n < 3 {
                Err(tonic::Status::unavailable("starting"))
            } else {
                Ok(Vec::new())
            }
        }),
    );
    let out = record_and_push(
        &dir,
        &exe,
        &dir.path("u.folded"),
        &format!("otlp:http://127.0.0.1:{port}"),
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(calls.lock().unwrap().len(), 3);
    // Down, then up: nobody listens at first; the server starts 1 s into the tries.
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let late = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(1500));
        grpc_server(TcpListener::bind(("127.0.0.1", port)).unwrap(), ok_empty())
    });
    let out = superprof()
        .args(["record", "-q", "-o"])
        .arg(dir.path("d.folded"))
        .args(["--push", &format!("parca:http://127.0.0.1:{port}")])
        .arg("--")
        .arg(&exe)
        .arg("0.2")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(late.join().unwrap().lock().unwrap().len(), 1);
    // Not a gRPC server at all (an HTTP/1.1 one): one try, a clear line.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for stream in listener.incoming().flatten().take(1) {
            // (All the client sent read first, and read on after the answer: unread bytes
            // at close would reset the connection before the answer is read.)
            let mut stream = stream;
            let mut buf = [0u8; 4096];
            stream
                .set_read_timeout(Some(std::time::Duration::from_millis(300)))
                .unwrap();
            while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
            let _ = stream.shutdown(std::net::Shutdown::Write);
            while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
        }
    });
    let out = record_and_push(
        &dir,
        &exe,
        &dir.path("n.folded"),
        &format!("otlp:http://127.0.0.1:{port}"),
        &[],
    );
    assert_one_push_failure(&out, "HTTP/1, not HTTP/2");
}

/// A non-zero exit whose last line says why the push failed.
fn assert_one_push_failure(out: &std::process::Output, why: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("superprof: cannot push") && last.contains(why) && last.contains("1 try"),
        "{stderr}"
    );
}
