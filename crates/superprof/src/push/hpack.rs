//! HPACK (RFC 7541), as much as one gRPC call needs: the request's headers written as
//! literals (no Huffman, no indexing: the server's table never changes), and the response's
//! read whole, Huffman strings and the dynamic table included. Input is the server's: every
//! length and index is checked, every size capped.

use std::collections::VecDeque;

/// The static table (Appendix A); index 1 is the first entry.
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// The length in bits of each symbol's Huffman code (Appendix B; 256 is EOS). The code is
/// canonical: ordered by length, then by symbol, each code is the previous one plus one,
/// shifted left to its length. So these lengths are the whole table.
const CODE_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
];

const EOS: u16 = 256;
const MAX_CODE_BITS: usize = 30;

/// The canonical code's decoding tables: per length, the first code, how many codes, and
/// where their symbols start in `symbols` (ordered by length, then symbol).
struct Canonical {
    first: [u32; MAX_CODE_BITS + 1],
    count: [u32; MAX_CODE_BITS + 1],
    start: [u32; MAX_CODE_BITS + 1],
    symbols: [u16; 257],
}

fn canonical() -> &'static Canonical {
    static TABLE: std::sync::OnceLock<Canonical> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut c = Canonical {
            first: [0; MAX_CODE_BITS + 1],
            count: [0; MAX_CODE_BITS + 1],
            start: [0; MAX_CODE_BITS + 1],
            symbols: [0; 257],
        };
        for &l in &CODE_LENGTHS {
            c.count[usize::from(l)] += 1;
        }
        let mut code = 0u32;
        let mut index = 0u32;
        for len in 1..=MAX_CODE_BITS {
            c.first[len] = code;
            c.start[len] = index;
            code = (code + c.count[len]) << 1;
            index += c.count[len];
        }
        // Symbols by length, then by value: each goes after those of its length before it.
        let mut next = c.start;
        for (sym, &l) in CODE_LENGTHS.iter().enumerate() {
            let slot = &mut next[usize::from(l)];
            c.symbols[*slot as usize] = sym as u16;
            *slot += 1;
        }
        c
    })
}

/// The code of `sym` and its length (for the encoder of the tests).
#[cfg(test)]
fn code_of(sym: u16) -> (u32, u8) {
    let c = canonical();
    let len = CODE_LENGTHS[usize::from(sym)];
    let l = usize::from(len);
    let pos = (c.start[l]..c.start[l] + c.count[l])
        .find(|&i| c.symbols[i as usize] == sym)
        .expect("every symbol has a code");
    (c.first[l] + (pos - c.start[l]), len)
}

/// Decodes a Huffman-coded string (§5.2): the padding is at most 7 bits, all ones; EOS is
/// never part of it.
pub fn huffman_decode(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let c = canonical();
    let mut out = Vec::with_capacity(bytes.len() * 8 / 5);
    let (mut code, mut len, mut ones) = (0u32, 0usize, true);
    for &byte in bytes {
        for bit in (0..8).rev() {
            let b = u32::from(byte >> bit & 1);
            code = code << 1 | b;
            len += 1;
            ones &= b == 1;
            if len > MAX_CODE_BITS {
                return Err("a Huffman code longer than 30 bits".into());
            }
            let offset = code.wrapping_sub(c.first[len]);
            if code >= c.first[len] && offset < c.count[len] {
                let sym = c.symbols[(c.start[len] + offset) as usize];
                if sym == EOS {
                    return Err("EOS inside a Huffman string".into());
                }
                out.push(sym as u8);
                (code, len, ones) = (0, 0, true);
            }
        }
    }
    if len > 7 || !ones {
        return Err("bad padding after a Huffman string".into());
    }
    Ok(out)
}

/// The most a header block, and the strings in it, may take: a gRPC response's headers are a
/// few hundred bytes.
const MAX_BLOCK: usize = 64 * 1024;

/// Reads an integer with an `n`-bit prefix at `*pos` (§5.1).
fn integer(block: &[u8], pos: &mut usize, n: u32) -> Result<usize, String> {
    let first = *block.get(*pos).ok_or("a header block cut short")?;
    *pos += 1;
    let max = (1usize << n) - 1;
    let mut v = usize::from(first) & max;
    if v < max {
        return Ok(v);
    }
    let mut shift = 0u32;
    loop {
        let b = *block.get(*pos).ok_or("a header block cut short")?;
        *pos += 1;
        if shift > 28 {
            return Err("an integer too large in a header block".into());
        }
        v = v
            .checked_add(usize::from(b & 0x7f) << shift)
            .ok_or("an integer too large in a header block")?;
        shift += 7;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
}

/// Reads a string literal at `*pos` (§5.2).
fn string(block: &[u8], pos: &mut usize) -> Result<String, String> {
    let huffman = block.get(*pos).is_some_and(|b| b & 0x80 != 0);
    let len = integer(block, pos, 7)?;
    let end = pos
        .checked_add(len)
        .filter(|&e| e <= block.len())
        .ok_or("a header string past the end of its block")?;
    let raw = &block[*pos..end];
    *pos = end;
    let bytes = if huffman {
        huffman_decode(raw)?
    } else {
        raw.to_vec()
    };
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The decoding side's state: the dynamic table (§2.3.2), newest first.
pub struct Decoder {
    table: VecDeque<(String, String)>,
    size: usize,
    max_size: usize,
    /// The most the peer may set `max_size` to: SETTINGS_HEADER_TABLE_SIZE as we sent it.
    limit: usize,
}

impl Decoder {
    /// A decoder whose table may hold `limit` bytes (4096, HTTP/2's default, unless our
    /// SETTINGS say otherwise).
    pub fn new(limit: usize) -> Decoder {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max_size: limit,
            limit,
        }
    }

    fn entry(&self, index: usize) -> Result<(String, String), String> {
        match index {
            0 => Err("header index 0".into()),
            i if i <= STATIC.len() => {
                let (n, v) = STATIC[i - 1];
                Ok((n.to_owned(), v.to_owned()))
            }
            i => self
                .table
                .get(i - STATIC.len() - 1)
                .cloned()
                .ok_or_else(|| format!("header index {i} beyond the table")),
        }
    }

    fn evict_to(&mut self, max: usize) {
        while self.size > max {
            match self.table.pop_back() {
                Some((n, v)) => self.size -= n.len() + v.len() + 32,
                None => break,
            }
        }
    }

    fn insert(&mut self, name: String, value: String) {
        let size = name.len() + value.len() + 32;
        if size > self.max_size {
            // Larger than the table: it empties the table (§4.4).
            self.table.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max_size - size);
        self.size += size;
        self.table.push_front((name, value));
    }

    /// Decodes one header block (HEADERS and its CONTINUATIONs, put together).
    pub fn decode(&mut self, block: &[u8]) -> Result<Vec<(String, String)>, String> {
        if block.len() > MAX_BLOCK {
            return Err(format!("a header block of {} bytes", block.len()));
        }
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < block.len() {
            let b = block[pos];
            if b & 0x80 != 0 {
                // Indexed field (§6.1).
                let i = integer(block, &mut pos, 7)?;
                out.push(self.entry(i)?);
            } else if b & 0xc0 == 0x40 {
                // Literal with incremental indexing (§6.2.1).
                let i = integer(block, &mut pos, 6)?;
                let name = if i == 0 {
                    string(block, &mut pos)?
                } else {
                    self.entry(i)?.0
                };
                let value = string(block, &mut pos)?;
                self.insert(name.clone(), value.clone());
                out.push((name, value));
            } else if b & 0xe0 == 0x20 {
                // Dynamic table size update (§6.3).
                let max = integer(block, &mut pos, 5)?;
                if max > self.limit {
                    return Err(format!(
                        "a header table of {max} bytes (at most {})",
                        self.limit
                    ));
                }
                self.max_size = max;
                self.evict_to(max);
            } else {
                // Literal without indexing, or never indexed (§6.2.2, §6.2.3).
                let i = integer(block, &mut pos, 4)?;
                let name = if i == 0 {
                    string(block, &mut pos)?
                } else {
                    self.entry(i)?.0
                };
                out.push((name, string(block, &mut pos)?));
            }
        }
        Ok(out)
    }
}

/// Writes an integer with an `n`-bit prefix whose other bits are `flags`.
fn put_integer(out: &mut Vec<u8>, flags: u8, n: u32, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(flags | v as u8);
        return;
    }
    out.push(flags | max as u8);
    v -= max;
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A header as a literal without indexing, with a literal name, no Huffman (§6.2.2).
pub fn encode_literal(out: &mut Vec<u8>, name: &str, value: &str) {
    out.push(0);
    put_integer(out, 0, 7, name.len());
    out.extend_from_slice(name.as_bytes());
    put_integer(out, 0, 7, value.len());
    out.extend_from_slice(value.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_huffman_code_is_the_rfcs() {
        // Codes given in Appendix B.
        assert_eq!(code_of(0), (0x1ff8, 13));
        assert_eq!(code_of(1), (0x7fffd8, 23));
        assert_eq!(code_of(b'0'.into()), (0x0, 5));
        assert_eq!(code_of(b'a'.into()), (0x3, 5));
        assert_eq!(code_of(b' '.into()), (0x14, 6));
        assert_eq!(code_of(b'z'.into()), (0x7b, 7));
        assert_eq!(code_of(255), (0x3ffffee, 26));
        assert_eq!(code_of(EOS), (0x3fffffff, 30));
        // Every byte round-trips through a hand-rolled encoder.
        let all: Vec<u8> = (0..=255u8).collect();
        let (mut acc, mut bits, mut enc) = (0u64, 0u32, Vec::new());
        for &b in &all {
            let (code, len) = code_of(b.into());
            acc = acc << len | u64::from(code);
            bits += u32::from(len);
            while bits >= 8 {
                enc.push((acc >> (bits - 8)) as u8);
                bits -= 8;
            }
        }
        if bits > 0 {
            enc.push(((acc << (8 - bits)) as u8) | (0xff >> bits));
        }
        assert_eq!(huffman_decode(&enc).unwrap(), all);
    }

    #[test]
    fn bad_huffman_is_refused() {
        // 8 bits of padding; padding with a zero; EOS itself.
        assert!(huffman_decode(&[0xff]).is_err());
        assert!(huffman_decode(&hex("f1e3c2e5f23a6ba0ab90f4fe")).is_err());
        assert!(huffman_decode(&[0xff, 0xff, 0xff, 0xff]).is_err());
    }

    /// RFC 7541 C.3: requests without Huffman, one table across them.
    #[test]
    fn rfc_c3_requests() {
        let mut d = Decoder::new(4096);
        let h = d
            .decode(&hex("828684410f7777772e6578616d706c652e636f6d"))
            .unwrap();
        assert_eq!(
            h,
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com")
            ])
        );
        assert_eq!(d.size, 57);
        let h = d.decode(&hex("828684be58086e6f2d6361636865")).unwrap();
        assert_eq!(h[3], (":authority".into(), "www.example.com".into()));
        assert_eq!(h[4], ("cache-control".into(), "no-cache".into()));
        assert_eq!(d.size, 110);
        let h = d
            .decode(&hex(
                "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565",
            ))
            .unwrap();
        assert_eq!(h[2], (":path".into(), "/index.html".into()));
        assert_eq!(h[4], ("custom-key".into(), "custom-value".into()));
        assert_eq!(d.size, 164);
    }

    /// RFC 7541 C.4: the same requests with Huffman.
    #[test]
    fn rfc_c4_requests_with_huffman() {
        let mut d = Decoder::new(4096);
        let h = d
            .decode(&hex("828684418cf1e3c2e5f23a6ba0ab90f4ff"))
            .unwrap();
        assert_eq!(h[3], (":authority".into(), "www.example.com".into()));
        let h = d.decode(&hex("828684be5886a8eb10649cbf")).unwrap();
        assert_eq!(h[4], ("cache-control".into(), "no-cache".into()));
        let h = d
            .decode(&hex("828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf"))
            .unwrap();
        assert_eq!(h[4], ("custom-key".into(), "custom-value".into()));
        assert_eq!(d.size, 164);
    }

    /// RFC 7541 C.6: responses with Huffman and a 256-byte table that evicts.
    #[test]
    fn rfc_c6_responses_evict() {
        let mut d = Decoder::new(256);
        let h = d
            .decode(&hex(
                "488264025885aec3771a4b6196d07abe941054d444a8200595040b8166e082a62d1bff6e919d29ad171863c78f0b97c8e9ae82ae43d3",
            ))
            .unwrap();
        assert_eq!(
            h,
            pairs(&[
                (":status", "302"),
                ("cache-control", "private"),
                ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
                ("location", "https://www.example.com")
            ])
        );
        assert_eq!(d.size, 222);
        let h = d.decode(&hex("4883640effc1c0bf")).unwrap();
        assert_eq!(h[0], (":status".into(), "307".into()));
        assert_eq!(h[3], ("location".into(), "https://www.example.com".into()));
        assert_eq!(d.size, 222);
        let h = d
            .decode(&hex(
                "88c16196d07abe941054d444a8200595040b8166e084a62d1bffc05a839bd9ab77ad94e7821dd7f2e6c7b335dfdfcd5b3960d5af27087f3672c1ab270fb5291f9587316065c003ed4ee5b1063d5007",
            ))
            .unwrap();
        assert_eq!(h[0], (":status".into(), "200".into()));
        assert_eq!(h[3], ("location".into(), "https://www.example.com".into()));
        assert_eq!(h[4], ("content-encoding".into(), "gzip".into()));
        assert_eq!(
            h[5],
            (
                "set-cookie".into(),
                "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1".into()
            )
        );
        assert_eq!(d.size, 215);
    }

    #[test]
    fn hostile_blocks_are_refused() {
        let mut d = Decoder::new(4096);
        for bad in [
            &[0x80][..],                                 // index 0
            &[0xbe],                                     // index 62, empty dynamic table
            &[0x40, 0x05, b'a'],                         // a name cut short
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], // an endless integer
            &[0x3f, 0xe2, 0x1f],                         // a table of 4097 bytes, over 4096
        ] {
            assert!(d.decode(bad).is_err(), "{bad:x?}");
        }
    }

    #[test]
    fn literals_round_trip() {
        let mut block = Vec::new();
        encode_literal(&mut block, ":path", "/a.B/C");
        let long = "x".repeat(300);
        encode_literal(&mut block, "te", &long);
        let h = Decoder::new(4096).decode(&block).unwrap();
        assert_eq!(h, pairs(&[(":path", "/a.B/C"), ("te", &long)]));
    }
}
