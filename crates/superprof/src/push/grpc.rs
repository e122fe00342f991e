//! One unary gRPC call over HTTP/2 (RFC 9113), as `record --push` needs it for Parca's
//! WriteRaw and OTLP's Export: `http://` URLs speak HTTP/2 in clear from the first byte
//! ("prior knowledge", as gRPC does), `https://` ones over TLS with ALPN `h2`. One
//! connection, one stream, flow control both ways, the response's headers through
//! [`super::hpack`]. The server is a peer: every frame length is capped, every read has the
//! call's deadline, and whatever it sends wrong is an error, never a panic.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::hpack;

/// How a call failed.
#[derive(Debug)]
pub enum CallError {
    /// The connection: refused, reset, timed out.
    Transport(String),
    /// The server broke HTTP/2 or gRPC (or speaks something else): trying again will not
    /// help.
    Protocol(String),
    /// An HTTP status other than 200 (a proxy, or a server that is not gRPC).
    Http(u16),
    /// The server's grpc-status (not 0) and grpc-message.
    Status(u32, String),
}

impl CallError {
    /// Whether trying again later may help: the server down or overloaded, not a refusal of
    /// the request itself.
    pub fn transient(&self) -> bool {
        match self {
            CallError::Transport(_) => true,
            CallError::Protocol(_) => false,
            CallError::Http(s) => matches!(s, 429 | 502 | 503 | 504),
            // DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, UNAVAILABLE.
            CallError::Status(c, _) => matches!(c, 4 | 8 | 10 | 14),
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Transport(e) | CallError::Protocol(e) => write!(f, "{e}"),
            CallError::Http(s) => write!(f, "HTTP status {s}, not a gRPC answer"),
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

fn transport(e: impl std::fmt::Display) -> CallError {
    CallError::Transport(e.to_string())
}

fn protocol(e: impl std::fmt::Display) -> CallError {
    CallError::Protocol(e.to_string())
}

/// A server's address as a URL gives it: `http[s]://HOST[:PORT][/PREFIX]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// A path the method's goes under (a proxy's), without the final '/'.
    pub prefix: String,
}

impl Endpoint {
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

    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

trait Stream: Read + Write {
    fn set_deadline(&mut self, left: Duration) -> std::io::Result<()>;
}

impl Stream for TcpStream {
    fn set_deadline(&mut self, left: Duration) -> std::io::Result<()> {
        let left = left.max(Duration::from_millis(1));
        self.set_read_timeout(Some(left))?;
        self.set_write_timeout(Some(left))
    }
}

impl Stream for rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    fn set_deadline(&mut self, left: Duration) -> std::io::Result<()> {
        self.sock.set_deadline(left)
    }
}

fn connect(ep: &Endpoint, deadline: Instant) -> Result<Box<dyn Stream>, CallError> {
    let addrs: Vec<_> = (ep.host.as_str(), ep.port)
        .to_socket_addrs()
        .map_err(|e| transport(format!("cannot resolve {}: {e}", ep.host)))?
        .collect();
    let mut last = None;
    for a in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match TcpStream::connect_timeout(&a, left) {
            Ok(mut s) => {
                let _ = s.set_nodelay(true);
                s.set_deadline(left).map_err(transport)?;
                if !ep.tls {
                    return Ok(Box::new(s));
                }
                let mut roots = rustls::RootCertStore::empty();
                roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
                let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .map_err(transport)?
                .with_root_certificates(roots)
                .with_no_client_auth();
                config.alpn_protocols = vec![b"h2".to_vec()];
                let name = rustls::pki_types::ServerName::try_from(ep.host.clone())
                    .map_err(|e| transport(format!("bad host name {}: {e}", ep.host)))?;
                let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name)
                    .map_err(transport)?;
                return Ok(Box::new(rustls::StreamOwned::new(conn, s)));
            }
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) => transport(format!("cannot connect to {}: {e}", ep.authority())),
        None => transport(format!("cannot connect to {}: timed out", ep.authority())),
    })
}

// Frame types and flags (§6).
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PUSH_PROMISE: u8 = 5;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const WINDOW_UPDATE: u8 = 8;
const CONTINUATION: u8 = 9;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// The largest frame we accept: SETTINGS_MAX_FRAME_SIZE's default, which we keep.
const MAX_FRAME: usize = 16_384;
/// The window we give the server, for the stream and the connection.
const OUR_WINDOW: u32 = 1 << 20;
/// The largest response message we take.
const MAX_RESPONSE: usize = 4 << 20;
/// The largest header block (HEADERS and CONTINUATIONs) we take.
const MAX_HEADER_BLOCK: usize = 64 << 10;
/// The one stream a call uses.
const STREAM: u32 = 1;

fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = Vec::with_capacity(9 + payload.len());
    f.extend_from_slice(&len.to_be_bytes()[1..]);
    f.push(ty);
    f.push(flags);
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

struct Frame {
    ty: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

/// A connection for one call.
struct Conn {
    io: Box<dyn Stream>,
    deadline: Instant,
    /// What we may still send: on the connection, on our stream.
    send_conn: i64,
    send_stream: i64,
    /// The server's SETTINGS_INITIAL_WINDOW_SIZE and SETTINGS_MAX_FRAME_SIZE.
    peer_initial: i64,
    peer_max_frame: usize,
    decoder: hpack::Decoder,
}

impl Conn {
    fn write(&mut self, bytes: &[u8]) -> Result<(), CallError> {
        self.tick()?;
        self.io.write_all(bytes).map_err(|e| self.io_error(e))?;
        self.io.flush().map_err(|e| self.io_error(e))
    }

    fn tick(&mut self) -> Result<(), CallError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(transport("no answer in time"));
        }
        self.io.set_deadline(left).map_err(transport)
    }

    fn io_error(&self, e: std::io::Error) -> CallError {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            transport("no answer in time")
        } else if e.kind() == std::io::ErrorKind::UnexpectedEof {
            transport("the server closed the connection")
        } else {
            transport(e)
        }
    }

    fn read_frame(&mut self) -> Result<Frame, CallError> {
        self.tick()?;
        let mut head = [0u8; 9];
        self.io
            .read_exact(&mut head)
            .map_err(|e| self.io_error(e))?;
        if head.starts_with(b"HTTP/1.") {
            return Err(protocol(
                "the server answered in HTTP/1, not HTTP/2: not a gRPC port?",
            ));
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        if len > MAX_FRAME {
            return Err(protocol(format!(
                "a frame of {len} bytes (at most {MAX_FRAME}): not HTTP/2?"
            )));
        }
        let mut payload = vec![0u8; len];
        self.io
            .read_exact(&mut payload)
            .map_err(|e| self.io_error(e))?;
        Ok(Frame {
            ty: head[3],
            flags: head[4],
            stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
            payload,
        })
    }

    /// Handles a connection-level frame; returns the frame if it is our stream's business.
    fn control(&mut self, f: Frame) -> Result<Option<Frame>, CallError> {
        match f.ty {
            SETTINGS if f.flags & ACK == 0 => {
                if !f.payload.len().is_multiple_of(6) {
                    return Err(protocol("a SETTINGS frame of a bad length"));
                }
                for s in f.payload.chunks_exact(6) {
                    let id = u16::from_be_bytes([s[0], s[1]]);
                    let v = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
                    match id {
                        4 => {
                            if v > 0x7fff_ffff {
                                return Err(protocol("a window over 2^31-1"));
                            }
                            self.send_stream += i64::from(v) - self.peer_initial;
                            self.peer_initial = i64::from(v);
                        }
                        5 => {
                            if !(16_384..=16_777_215).contains(&v) {
                                return Err(protocol("a bad SETTINGS_MAX_FRAME_SIZE"));
                            }
                            self.peer_max_frame = v as usize;
                        }
                        _ => {}
                    }
                }
                self.write(&frame(SETTINGS, ACK, 0, &[]))?;
                Ok(None)
            }
            SETTINGS => Ok(None),
            PING if f.flags & ACK == 0 => {
                if f.payload.len() != 8 {
                    return Err(protocol("a PING frame of a bad length"));
                }
                self.write(&frame(PING, ACK, 0, &f.payload))?;
                Ok(None)
            }
            PING => Ok(None),
            WINDOW_UPDATE => {
                let b: [u8; 4] = f
                    .payload
                    .as_slice()
                    .try_into()
                    .map_err(|_| protocol("a WINDOW_UPDATE frame of a bad length"))?;
                let n = i64::from(u32::from_be_bytes(b) & 0x7fff_ffff);
                match f.stream {
                    0 => self.send_conn += n,
                    STREAM => self.send_stream += n,
                    _ => {}
                }
                if self.send_conn > 0x7fff_ffff || self.send_stream > 0x7fff_ffff {
                    return Err(protocol("a flow-control window over 2^31-1"));
                }
                Ok(None)
            }
            GOAWAY => {
                let code = f
                    .payload
                    .get(4..8)
                    .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                let text = String::from_utf8_lossy(f.payload.get(8..).unwrap_or(&[]))
                    .chars()
                    .take(200)
                    .collect::<String>();
                Err(transport(format!(
                    "the server ended the connection (GOAWAY, error {code}{}{text})",
                    if text.is_empty() { "" } else { ": " }
                )))
            }
            PUSH_PROMISE => Err(protocol("a PUSH_PROMISE, which we disabled")),
            RST_STREAM if f.stream == STREAM => {
                let code = f
                    .payload
                    .get(..4)
                    .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                // REFUSED_STREAM: not processed, may be tried again.
                let e = format!("the server reset the stream (error {code})");
                Err(if code == 7 { transport(e) } else { protocol(e) })
            }
            _ if f.stream == STREAM => Ok(Some(f)),
            // Other streams' frames, unknown types, PRIORITY: nothing for us.
            _ => Ok(None),
        }
    }

    /// A HEADERS frame's header block fragment, and the rest of the block from
    /// CONTINUATION frames; decoded.
    fn header_block(&mut self, f: &Frame) -> Result<Vec<(String, String)>, CallError> {
        let mut p = f.payload.as_slice();
        let pad = if f.flags & PADDED != 0 {
            let (&n, rest) = p
                .split_first()
                .ok_or_else(|| protocol("a bad HEADERS frame"))?;
            p = rest;
            usize::from(n)
        } else {
            0
        };
        if f.flags & PRIORITY != 0 {
            p = p.get(5..).ok_or_else(|| protocol("a bad HEADERS frame"))?;
        }
        let end = p
            .len()
            .checked_sub(pad)
            .ok_or_else(|| protocol("a HEADERS frame's padding past its end"))?;
        let mut block = p[..end].to_vec();
        let mut done = f.flags & END_HEADERS != 0;
        while !done {
            let c = self.read_frame()?;
            if c.ty != CONTINUATION || c.stream != f.stream {
                return Err(protocol("a header block not continued"));
            }
            if block.len() + c.payload.len() > MAX_HEADER_BLOCK {
                return Err(protocol("a header block over 64 KiB"));
            }
            block.extend_from_slice(&c.payload);
            done = c.flags & END_HEADERS != 0;
        }
        self.decoder.decode(&block).map_err(protocol)
    }
}

/// Calls `method` (`/package.Service/Method`) at `url` with the protobuf `message` and the
/// extra `metadata`, within `timeout`; returns the response message.
pub fn call(
    url: &str,
    method: &str,
    message: &[u8],
    metadata: &[(&str, &str)],
    timeout: Duration,
) -> Result<Vec<u8>, CallError> {
    let ep = Endpoint::parse(url).map_err(transport)?;
    let deadline = Instant::now() + timeout;
    let io = connect(&ep, deadline)?;
    let mut c = Conn {
        io,
        deadline,
        send_conn: 65_535,
        send_stream: 65_535,
        peer_initial: 65_535,
        peer_max_frame: 16_384,
        decoder: hpack::Decoder::new(4096),
    };
    // The preface, our SETTINGS (no push; our window for the stream), the connection's
    // window, then the request's headers.
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    let mut settings = Vec::new();
    for (id, v) in [(2u16, 0u32), (4, OUR_WINDOW), (6, MAX_HEADER_BLOCK as u32)] {
        settings.extend_from_slice(&id.to_be_bytes());
        settings.extend_from_slice(&v.to_be_bytes());
    }
    out.extend(frame(SETTINGS, 0, 0, &settings));
    out.extend(frame(
        WINDOW_UPDATE,
        0,
        0,
        &(OUR_WINDOW - 65_535).to_be_bytes(),
    ));
    let mut block = Vec::new();
    let path = format!("{}{method}", ep.prefix);
    let authority = ep.authority();
    let timeout_ms = format!("{}m", timeout.as_millis().clamp(1, 99_999_999));
    let user_agent = format!("superprof/{}", env!("CARGO_PKG_VERSION"));
    for (n, v) in [
        (":method", "POST"),
        (":scheme", if ep.tls { "https" } else { "http" }),
        (":path", path.as_str()),
        (":authority", authority.as_str()),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("grpc-timeout", timeout_ms.as_str()),
        ("user-agent", user_agent.as_str()),
    ]
    .into_iter()
    .chain(metadata.iter().copied())
    {
        hpack::encode_literal(&mut block, n, v);
    }
    if block.len() > MAX_FRAME {
        return Err(protocol("the request's headers are too long"));
    }
    out.extend(frame(HEADERS, END_HEADERS, STREAM, &block));
    c.write(&out)?;

    // The message, length-prefixed, in DATA frames as the server's windows allow.
    let len = u32::try_from(message.len()).map_err(|_| protocol("a message over 4 GiB"))?;
    let mut body = Vec::with_capacity(5 + message.len());
    body.push(0);
    body.extend_from_slice(&len.to_be_bytes());
    body.extend_from_slice(message);
    let mut sent = 0;
    let mut early = None;
    while sent < body.len() {
        let room = c.send_conn.min(c.send_stream).max(0) as usize;
        let n = room.min(c.peer_max_frame).min(body.len() - sent);
        if n > 0 {
            let last = sent + n == body.len();
            let f = frame(
                DATA,
                if last { END_STREAM } else { 0 },
                STREAM,
                &body[sent..sent + n],
            );
            c.write(&f)?;
            sent += n;
            c.send_conn -= n as i64;
            c.send_stream -= n as i64;
            continue;
        }
        // No room: the server's frames until a WINDOW_UPDATE (or an early answer).
        let f = c.read_frame()?;
        if let Some(f) = c.control(f)? {
            early = Some(f);
            break;
        }
    }

    // The answer: headers, the message, trailers (or headers alone, "trailers-only").
    let mut status = None;
    let mut grpc_status = None;
    let mut grpc_message = String::new();
    let mut response = Vec::new();
    loop {
        let f = match early.take() {
            Some(f) => f,
            None => {
                let f = c.read_frame()?;
                match c.control(f)? {
                    Some(f) => f,
                    None => continue,
                }
            }
        };
        let end = f.flags & END_STREAM != 0;
        match f.ty {
            HEADERS => {
                for (n, v) in c.header_block(&f)? {
                    match n.as_str() {
                        ":status" => status = v.parse::<u16>().ok(),
                        "grpc-status" => grpc_status = v.parse::<u32>().ok(),
                        "grpc-message" => grpc_message = percent_decoded(&v),
                        _ => {}
                    }
                }
                if status.is_some_and(|s| s != 200) {
                    return Err(CallError::Http(status.unwrap_or(0)));
                }
            }
            DATA => {
                let mut p = f.payload.as_slice();
                if f.flags & PADDED != 0 {
                    let (&pad, rest) = p
                        .split_first()
                        .ok_or_else(|| protocol("a bad DATA frame"))?;
                    p = rest
                        .get(..rest.len().saturating_sub(usize::from(pad)))
                        .filter(|_| usize::from(pad) <= rest.len())
                        .ok_or_else(|| protocol("a DATA frame's padding past its end"))?;
                }
                if response.len() + p.len() > MAX_RESPONSE + 5 {
                    return Err(protocol("a response over 4 MiB"));
                }
                response.extend_from_slice(p);
                // Keep the windows open for the rest.
                if !end && !f.payload.is_empty() {
                    let n = (f.payload.len() as u32).to_be_bytes();
                    let mut w = frame(WINDOW_UPDATE, 0, 0, &n);
                    w.extend(frame(WINDOW_UPDATE, 0, STREAM, &n));
                    c.write(&w)?;
                }
            }
            _ => {}
        }
        if end {
            break;
        }
    }
    // A polite end of the connection.
    let _ = c.write(&frame(GOAWAY, 0, 0, &[0; 8]));
    if status.is_none() {
        return Err(protocol("an answer without a :status"));
    }
    match grpc_status {
        Some(0) => {}
        Some(code) => return Err(CallError::Status(code, grpc_message)),
        None => return Err(protocol("an answer without a grpc-status")),
    }
    // The response message: not compressed (we offered no encoding), its length as said.
    if response.is_empty() {
        return Ok(Vec::new());
    }
    if response.len() < 5 || response[0] != 0 {
        return Err(protocol("a malformed or compressed response message"));
    }
    let n = u32::from_be_bytes([response[1], response[2], response[3], response[4]]) as usize;
    if response.len() != 5 + n {
        return Err(protocol("a response message of the wrong length"));
    }
    Ok(response[5..].to_vec())
}

/// grpc-message's percent-encoding undone (§ "Responses" of gRPC over HTTP/2).
fn percent_decoded(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if let Some(v) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).chars().take(500).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(percent_decoded("bad%20label%3a x%zz"), "bad label: x%zz");
        assert!(CallError::Status(14, String::new()).transient());
        assert!(!CallError::Status(3, String::new()).transient());
        assert!(CallError::Http(503).transient());
        assert!(!CallError::Http(404).transient());
        assert_eq!(
            CallError::Status(12, "no".into()).to_string(),
            "gRPC status 12 (UNIMPLEMENTED): no"
        );
    }
}
