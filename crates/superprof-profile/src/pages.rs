//! The page headers of a Parquet column chunk, read before the parquet crate decompresses
//! anything. The crate allocates each page's declared uncompressed size at once and inflates
//! the page into it, checking the size only afterwards: a 100 KB file of zstd pages that each
//! declare and inflate to 1 GB cost gigabytes (issue 31). Walking the headers first bounds every
//! page, and the pages of a chunk together, before one byte is decompressed.
//!
//! A page is a `PageHeader` (Thrift compact protocol: field 2 its uncompressed size, field 3
//! its compressed size, both i32) followed by its compressed bytes.

/// What the pages of one column chunk declare.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChunkPages {
    /// How many pages.
    pub pages: u64,
    /// The sum of their uncompressed sizes.
    pub uncompressed: u64,
    /// The largest uncompressed size of one page.
    pub largest: u64,
}

/// Nesting deeper than this in a page header is refused (a real one nests three levels).
const MAX_DEPTH: u32 = 16;

/// The most bytes a page header may take (a real one takes tens; statistics can make it a few
/// hundred).
const MAX_HEADER: usize = 64 << 10;

/// Walks the pages of `chunk` (a column chunk's bytes, from its first page's header to the end
/// of its last page).
#[cfg(test)]
pub fn walk(chunk: &[u8]) -> Result<ChunkPages, String> {
    walk_at(chunk.len() as u64, |at, buf| {
        let from = usize::try_from(at).unwrap_or(usize::MAX).min(chunk.len());
        let n = buf.len().min(chunk.len() - from);
        buf[..n].copy_from_slice(&chunk[from..from + n]);
        Ok(n)
    })
}

/// Walks the pages of a column chunk of `len` bytes, reading each header through `read_at`
/// (offset in the chunk, buffer; the bytes read): only the headers are read, never the pages.
pub fn walk_at(
    len: u64,
    mut read_at: impl FnMut(u64, &mut [u8]) -> std::io::Result<usize>,
) -> Result<ChunkPages, String> {
    let mut out = ChunkPages::default();
    let mut pos = 0u64;
    let mut buf = vec![0u8; MAX_HEADER];
    while pos < len {
        let want = usize::try_from(len - pos)
            .unwrap_or(usize::MAX)
            .min(MAX_HEADER);
        let got = read_at(pos, &mut buf[..want]).map_err(|e| e.to_string())?;
        let mut r = Reader {
            bytes: &buf[..got.min(want)],
            pos: 0,
            sizes: [None, None],
        };
        r.skip_struct(0, true)?;
        let (Some(uncompressed), Some(compressed)) = (r.sizes[0], r.sizes[1]) else {
            return Err(format!(
                "a page header at byte {pos} of a column has no sizes"
            ));
        };
        let (Ok(uncompressed), Ok(compressed)) =
            (u64::try_from(uncompressed), u64::try_from(compressed))
        else {
            return Err(format!(
                "a page header at byte {pos} of a column has a negative size"
            ));
        };
        pos = pos
            .checked_add(r.pos as u64)
            .and_then(|p| p.checked_add(compressed))
            .filter(|&end| end <= len)
            .ok_or_else(|| format!("a page at byte {pos} of a column runs past its end"))?;
        out.pages += 1;
        out.uncompressed = out.uncompressed.saturating_add(uncompressed);
        out.largest = out.largest.max(uncompressed);
    }
    Ok(out)
}

/// A Thrift compact-protocol reader that skips everything but a page header's two sizes.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Fields 2 (uncompressed_page_size) and 3 (compressed_page_size) of the outer struct.
    sizes: [Option<i64>; 2],
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let b = *self
            .bytes
            .get(self.pos)
            .ok_or("a page header runs past the end of its column")?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f).checked_shl(shift).unwrap_or(0);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("a page header has a varint of more than ten bytes".into())
    }

    fn zigzag(&mut self) -> Result<i64, String> {
        let v = self.varint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    fn skip_bytes(&mut self, n: u64) -> Result<(), String> {
        self.pos = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n))
            .filter(|&end| end <= self.bytes.len())
            .ok_or("a page header runs past the end of its column")?;
        Ok(())
    }

    /// Skips a struct's fields up to its stop; `outer`: the page header itself, whose sizes
    /// are kept.
    fn skip_struct(&mut self, depth: u32, outer: bool) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err("a page header nests too deep".into());
        }
        let mut field: i64 = 0;
        loop {
            let head = self.byte()?;
            let kind = head & 0x0f;
            if kind == 0 {
                return Ok(());
            }
            field = match head >> 4 {
                0 => self.zigzag()?,
                delta => field + i64::from(delta),
            };
            if outer && (field == 2 || field == 3) && kind == 5 {
                self.sizes[(field - 2) as usize] = Some(self.zigzag()?);
                continue;
            }
            self.skip_value(kind, depth)?;
        }
    }

    /// Skips one value of compact type `kind` (a field's; booleans in a field carry their value
    /// in the type).
    fn skip_value(&mut self, kind: u8, depth: u32) -> Result<(), String> {
        match kind {
            1 | 2 => Ok(()),
            3 => self.skip_bytes(1),
            4..=6 => self.varint().map(|_| ()),
            7 => self.skip_bytes(8),
            8 => {
                let n = self.varint()?;
                self.skip_bytes(n)
            }
            9 | 10 => {
                let head = self.byte()?;
                let n = match head >> 4 {
                    15 => self.varint()?,
                    n => u64::from(n),
                };
                self.skip_elements(head & 0x0f, n, depth)
            }
            11 => {
                let n = self.varint()?;
                if n == 0 {
                    return Ok(());
                }
                let types = self.byte()?;
                for _ in 0..n {
                    self.skip_element(types >> 4, depth)?;
                    self.skip_element(types & 0x0f, depth)?;
                }
                Ok(())
            }
            12 => self.skip_struct(depth + 1, false),
            13 => self.skip_bytes(16),
            other => Err(format!("a page header has a field of unknown type {other}")),
        }
    }

    fn skip_elements(&mut self, kind: u8, n: u64, depth: u32) -> Result<(), String> {
        for _ in 0..n {
            self.skip_element(kind, depth)?;
        }
        Ok(())
    }

    /// An element of a list, set or map: a boolean takes a byte there.
    fn skip_element(&mut self, kind: u8, depth: u32) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err("a page header nests too deep".into());
        }
        match kind {
            1 | 2 => self.skip_bytes(1),
            k => self.skip_value(k, depth + 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page header as the compact protocol writes it: type, sizes, a nested data page
    /// header (num_values, encodings), then `compressed` bytes of page.
    fn page(uncompressed: i32, compressed: i32) -> Vec<u8> {
        let zz = |v: i64| {
            let mut z = ((v << 1) ^ (v >> 63)) as u64;
            let mut out = Vec::new();
            loop {
                let b = (z & 0x7f) as u8;
                z >>= 7;
                if z == 0 {
                    out.push(b);
                    return out;
                }
                out.push(b | 0x80);
            }
        };
        let mut h = vec![0x15];
        h.extend(zz(0)); // 1: type DATA_PAGE
        h.push(0x15);
        h.extend(zz(uncompressed.into())); // 2
        h.push(0x15);
        h.extend(zz(compressed.into())); // 3
        h.push(0x2c); // 5: data_page_header (struct), delta 2
        h.push(0x15);
        h.extend(zz(10)); // num_values
        h.push(0x15);
        h.extend(zz(0)); // encoding
        h.push(0x19); // field 3, a list
        h.push(0x15); // of one i32
        h.extend(zz(3));
        h.push(0x00); // end of data_page_header
        h.push(0x00); // end of page header
        h.extend(std::iter::repeat_n(0xab, compressed.max(0) as usize));
        h
    }

    #[test]
    fn pages_are_walked_and_summed() {
        let mut chunk = page(1000, 20);
        chunk.extend(page(3000, 5));
        let p = walk(&chunk).unwrap();
        assert_eq!(
            p,
            ChunkPages {
                pages: 2,
                uncompressed: 4000,
                largest: 3000
            }
        );
    }

    #[test]
    fn bad_headers_are_refused_without_panic() {
        let good = page(1 << 30, 30);
        assert_eq!(walk(&good).unwrap().largest, 1 << 30);
        assert!(walk(&page(-1, 3)).is_err());
        assert!(walk(&page(10, 1000)[..40]).is_err());
        for cut in 0..good.len() {
            let _ = walk(&good[..cut]);
        }
        let mut deep = vec![0x1c; 100];
        deep.push(0);
        assert!(walk(&deep).is_err());
        for b in 0..=255u8 {
            let _ = walk(&[b, b, b, 0x0f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
        }
    }
}
