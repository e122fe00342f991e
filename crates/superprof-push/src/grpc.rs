//! One unary gRPC call, as `record --push` needs it for Parca's WriteRaw and OTLP's Export,
//! through tonic (HTTP/2 by h2 and hyper, TLS by rustls with ring and the webpki roots, the
//! crates already in the binary): `http://` URLs speak HTTP/2 in clear from the first byte
//! ("prior knowledge", as gRPC does), `https://` ones over TLS with ALPN `h2`. The message
//! is carried as bytes (the caller encodes and decodes it with prost). The server is a peer:
//! the answer's headers and message are capped, the whole call has a deadline, and whatever
//! it sends wrong is an error, never a panic.

/// How a call failed.
#[derive(Debug)]
#[cfg_attr(not(feature = "grpc"), allow(dead_code))] // (only a refusal without gRPC)
pub enum CallError {
    /// The connection: refused, reset, timed out.
    Transport(String),
    /// The server broke HTTP/2 or gRPC (or speaks something else): trying again will not
    /// help.
    Protocol(String),
    /// The server's grpc-status (not 0) and grpc-message (an HTTP status other than 200 is
    /// one too: tonic maps 429, 502, 503 and 504 to UNAVAILABLE, as gRPC's clients do).
    Status(u32, String),
}

impl CallError {
    /// Whether trying again later may help: the server down or overloaded, not a refusal of
    /// the request itself.
    pub fn transient(&self) -> bool {
        match self {
            CallError::Transport(_) => true,
            CallError::Protocol(_) => false,
            // DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, UNAVAILABLE.
            CallError::Status(c, _) => matches!(c, 4 | 8 | 10 | 14),
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Transport(e) | CallError::Protocol(e) => write!(f, "{e}"),
            CallError::Status(c, m) if m.is_empty() => {
                write!(f, "gRPC status {c} ({})", code_name(*c))
            }
            CallError::Status(c, m) => write!(f, "gRPC status {c} ({}): {m}", code_name(*c)),
        }
    }
}

/// The name of a gRPC status code.
fn code_name(c: u32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    NAMES.get(c as usize).copied().unwrap_or("unknown code")
}

#[cfg_attr(not(feature = "grpc"), allow(dead_code))]
fn transport(e: impl std::fmt::Display) -> CallError {
    CallError::Transport(e.to_string())
}

fn protocol(e: impl std::fmt::Display) -> CallError {
    CallError::Protocol(e.to_string())
}

/// A server's address as a URL gives it: `http[s]://HOST[:PORT][/PREFIX]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `https`: over TLS.
    pub tls: bool,
    /// The host name or address.
    pub host: String,
    /// The port (the scheme's default where the URL gives none).
    pub port: u16,
    /// A path the method's goes under (a proxy's), without the final '/'.
    pub prefix: String,
}

impl Endpoint {
    /// Reads `http[s]://HOST[:PORT][/PREFIX]`; an error says what is wrong with it.
    pub fn parse(url: &str) -> Result<Endpoint, String> {
        let (tls, rest) = if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else {
            return Err(format!(
                "'{url}': the URL must start with http:// or https://"
            ));
        };
        let (hostport, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let (host, port) = match hostport.rsplit_once(':') {
            // (An IPv6 address is in brackets: its colons are inside them.)
            Some((h, p)) if !p.contains(']') => (
                h,
                p.parse::<u16>()
                    .map_err(|_| format!("'{url}': bad port '{p}'"))?,
            ),
            _ => (hostport, if tls { 443 } else { 80 }),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(format!("'{url}': no host"));
        }
        Ok(Endpoint {
            tls,
            host: host.to_owned(),
            port,
            prefix: prefix.to_owned(),
        })
    }

    #[cfg_attr(not(feature = "grpc"), allow(dead_code))]
    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Without the `grpc` feature: no gRPC destination (the HTTP ones stay).
#[cfg(not(feature = "grpc"))]
pub fn call(
    _url: &str,
    _method: &str,
    _message: &[u8],
    _metadata: &[(&str, &str)],
    _timeout: std::time::Duration,
) -> Result<Vec<u8>, CallError> {
    Err(protocol(
        "this superprof was built without gRPC (its grpc feature): push to otlp-http: or \
         pyroscope: instead",
    ))
}

#[cfg(feature = "grpc")]
pub use with_tonic::call;

/// tonic's codec for a message as it is, both ways: the caller's prost structs encode and
/// decode it (the client here; a test's server too).
#[cfg(feature = "grpc")]
#[derive(Debug, Default, Clone, Copy)]
pub struct Raw;

#[cfg(feature = "grpc")]
impl tonic::codec::Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

#[cfg(feature = "grpc")]
impl tonic::codec::Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

#[cfg(feature = "grpc")]
impl tonic::codec::Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = bytes::Buf::remaining(src);
        Ok(Some(bytes::Buf::copy_to_bytes(src, n).to_vec()))
    }
}

/// The call, through tonic.
#[cfg(feature = "grpc")]
mod with_tonic {
    use super::*;
    use std::time::Duration;

    /// The largest response message we take.
    const MAX_RESPONSE: usize = 4 << 20;
    /// The largest header block we take.
    const MAX_HEADER_BLOCK: u32 = 64 << 10;

    /// Calls `method` (`/package.Service/Method`) of the server at `url` with `message` and the
    /// `metadata` headers; its answer, within `timeout` for the whole call (the connection
    /// included).
    pub fn call(
        url: &str,
        method: &str,
        message: &[u8],
        metadata: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Vec<u8>, CallError> {
        let ep = Endpoint::parse(url).map_err(transport)?;
        // (A runtime of this thread's for the one call: the recording is over, nothing else runs.)
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(transport)?;
        rt.block_on(async {
            match tokio::time::timeout(timeout, call_async(&ep, method, message, metadata, timeout))
                .await
            {
                Ok(r) => r,
                Err(_) => Err(transport(format!(
                    "no answer from {} in {} s",
                    ep.authority(),
                    timeout.as_secs_f64()
                ))),
            }
        })
    }

    async fn call_async(
        ep: &Endpoint,
        method: &str,
        message: &[u8],
        metadata: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Vec<u8>, CallError> {
        let scheme = if ep.tls { "https" } else { "http" };
        let mut endpoint =
            tonic::transport::Endpoint::from_shared(format!("{scheme}://{}", ep.authority()))
                .map_err(transport)?
                .connect_timeout(timeout)
                .timeout(timeout)
                .http2_max_header_list_size(MAX_HEADER_BLOCK)
                .user_agent(format!("superprof/{}", env!("CARGO_PKG_VERSION")))
                .map_err(transport)?;
        if ep.tls {
            endpoint = endpoint
                .tls_config(
                    tonic::transport::ClientTlsConfig::new()
                        .with_webpki_roots()
                        .domain_name(ep.host.clone()),
                )
                .map_err(transport)?;
        }
        let channel = endpoint.connect().await.map_err(|e| {
            transport(format!(
                "cannot connect to {}: {}",
                ep.authority(),
                chain(&e)
            ))
        })?;
        let mut client = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_RESPONSE);
        client.ready().await.map_err(|e| transport(chain(&e)))?;
        // (The prefix of a proxy's URL is ours to add: the channel keeps only the authority.)
        let path = http::uri::PathAndQuery::try_from(format!("{}{method}", ep.prefix))
            .map_err(|e| transport(format!("bad path {}{method}: {e}", ep.prefix)))?;
        let mut request = tonic::Request::new(message.to_vec());
        for &(k, v) in metadata {
            let key = tonic::metadata::MetadataKey::from_bytes(k.as_bytes())
                .map_err(|e| transport(format!("bad header name {k}: {e}")))?;
            let value = v
                .parse()
                .map_err(|e| transport(format!("bad header value for {k}: {e}")))?;
            request.metadata_mut().insert(key, value);
        }
        request.set_timeout(timeout);
        match client.unary(request, path, Raw).await {
            Ok(answer) => Ok(answer.into_inner()),
            Err(status) => Err(from_status(&status)),
        }
    }

    /// What a failed call's status says: the server's own grpc-status, or, when tonic made the
    /// status of an error of its own (it has a source), the connection's failure: HTTP/2 broken by
    /// the peer (a protocol error: trying again will not help) or the transport (it may).
    pub(super) fn from_status(status: &tonic::Status) -> CallError {
        let Some(source) = std::error::Error::source(status) else {
            let message: String = status.message().chars().take(500).collect();
            return CallError::Status(status.code() as u32, message);
        };
        let why = chain(source);
        let mut e: Option<&(dyn std::error::Error + 'static)> = Some(source);
        while let Some(err) = e {
            if let Some(h2) = err.downcast_ref::<h2::Error>() {
                // HTTP/2 broken: a protocol error h2 found in what the server sent, or the
                // server's own GOAWAY with an error. (A stream refused or reset is left to
                // the transport: the server may take it later.)
                let broken = h2.reason().is_some_and(|r| r != h2::Reason::NO_ERROR)
                    && (h2.is_library() || h2.is_go_away());
                if broken {
                    // (A server that answers the preface in HTTP/1 says so: its bytes do not
                    // parse as an HTTP/2 frame.)
                    return protocol(format!(
                        "the server broke HTTP/2 (is it an HTTP/1, not HTTP/2, port?): {why}"
                    ));
                }
            }
            e = err.source();
        }
        transport(why)
    }

    /// An error and its sources, as one line.
    fn chain(e: &(dyn std::error::Error + 'static)) -> String {
        let mut out = e.to_string();
        let mut next = e.source();
        while let Some(s) = next {
            let s_text = s.to_string();
            if !out.contains(&s_text) {
                out.push_str(": ");
                out.push_str(&s_text);
            }
            next = s.source();
        }
        out.chars().take(500).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(feature = "grpc")]
    use with_tonic::from_status;

    #[test]
    fn endpoints() {
        let e = Endpoint::parse("http://localhost:7070").unwrap();
        assert_eq!(
            (e.tls, e.host.as_str(), e.port, e.prefix.as_str()),
            (false, "localhost", 7070, "")
        );
        let e = Endpoint::parse("https://grpc.example.com/proxy/").unwrap();
        assert_eq!((e.tls, e.port, e.prefix.as_str()), (true, 443, "/proxy"));
        let e = Endpoint::parse("http://[::1]:4317").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 4317));
        assert_eq!(e.authority(), "[::1]:4317");
        assert!(Endpoint::parse("grpc://h:1").is_err());
        assert!(Endpoint::parse("http://h:99999").is_err());
        assert!(Endpoint::parse("http://:80").is_err());
    }

    #[test]
    fn messages_and_codes() {
        assert!(CallError::Status(14, String::new()).transient());
        assert!(!CallError::Status(3, String::new()).transient());
        // The server's status, and tonic's own for a failure of the call.
        #[cfg(feature = "grpc")]
        {
            assert!(matches!(
                from_status(&tonic::Status::invalid_argument("bad label: x")),
                CallError::Status(3, m) if m == "bad label: x"
            ));
            let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
            let local = tonic::Status::from_error(Box::new(io));
            assert!(from_status(&local).transient(), "{}", from_status(&local));
        }
        assert_eq!(
            CallError::Status(12, "no".into()).to_string(),
            "gRPC status 12 (UNIMPLEMENTED): no"
        );
    }
}
