//! Protocol buffers, written by hand: the message sets superprof writes (pprof, OTLP
//! profiles, Parca's WriteRaw) are small and fixed. A writer, a string table, and a reader
//! for the few answers superprof reads (hostile input: every length checked).

use std::collections::HashMap;

/// Minimal protobuf writer: varints and length-delimited fields.
#[derive(Default)]
pub struct Pb(pub Vec<u8>);

impl Pb {
    /// Appends `v` as a base-128 varint.
    pub fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    /// Appends a field's key: its number and wire type (0 varint, 2 length-delimited).
    pub fn key(&mut self, field: u32, wire: u32) {
        self.varint(((field << 3) | wire) as u64);
    }
    /// Appends varint field `field`; nothing when `v` is 0 (proto3's default).
    pub fn uint(&mut self, field: u32, v: u64) {
        if v != 0 {
            self.key(field, 0);
            self.varint(v);
        }
    }
    /// Appends int64 field `field` (a negative value as ten bytes, not zigzag); nothing when
    /// `v` is 0.
    pub fn int(&mut self, field: u32, v: i64) {
        self.uint(field, v as u64);
    }
    /// Appends bool field `field`; nothing when `v` is false.
    pub fn bool(&mut self, field: u32, v: bool) {
        self.uint(field, v as u64);
    }
    /// Appends length-delimited field `field` (bytes or a string), even when empty.
    pub fn bytes(&mut self, field: u32, b: &[u8]) {
        self.key(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    /// Appends message `m` as field `field`.
    pub fn msg(&mut self, field: u32, m: Pb) {
        self.bytes(field, &m.0);
    }
    /// Appends repeated varint field `field`, packed; nothing when `vs` is empty.
    pub fn packed(&mut self, field: u32, vs: impl Iterator<Item = u64>) {
        let mut inner = Pb::default();
        for v in vs {
            inner.varint(v);
        }
        if !inner.0.is_empty() {
            self.bytes(field, &inner.0);
        }
    }
}

/// A string table (pprof's, OTLP's dictionary's): index 0 is the empty string.
pub struct Strings {
    /// The strings by index, as the message's string table holds them.
    pub table: Vec<String>,
    ids: HashMap<String, i64>,
}

impl Default for Strings {
    fn default() -> Strings {
        Strings::new()
    }
}

impl Strings {
    /// A table that holds only the empty string, at index 0.
    pub fn new() -> Strings {
        Strings {
            table: vec![String::new()],
            ids: HashMap::from([(String::new(), 0)]),
        }
    }
    /// The index of `s`, added at the end the first time.
    pub fn id(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.ids.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.ids.insert(s.to_owned(), i);
        i
    }
}

/// A field read by [`fields`]: its number and its value (a varint, or the bytes of a
/// length-delimited or fixed-size one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field<'a> {
    /// A varint field (wire type 0): its number and value.
    Varint(u32, u64),
    /// A length-delimited field (wire type 2), or a fixed 64-bit (1) or 32-bit (5) one: its
    /// number and its bytes.
    Bytes(u32, &'a [u8]),
}

fn read_varint(b: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*pos)?;
        *pos += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The fields of one message, in order; `None` if it is malformed (a length past its end, a
/// group, an unknown wire type).
pub fn fields(b: &[u8]) -> Option<Vec<Field<'_>>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < b.len() {
        let key = read_varint(b, &mut pos)?;
        let field = u32::try_from(key >> 3).ok()?;
        let len = match key & 7 {
            0 => {
                out.push(Field::Varint(field, read_varint(b, &mut pos)?));
                continue;
            }
            1 => 8,
            2 => usize::try_from(read_varint(b, &mut pos)?).ok()?,
            5 => 4,
            _ => return None,
        };
        let end = pos.checked_add(len).filter(|&e| e <= b.len())?;
        out.push(Field::Bytes(field, &b[pos..end]));
        pos = end;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_fields_read_back() {
        let mut inner = Pb::default();
        inner.uint(1, 300);
        inner.bytes(2, b"hi");
        let mut m = Pb::default();
        m.msg(1, inner);
        m.int(2, -1);
        let f = fields(&m.0).unwrap();
        let Field::Bytes(1, inner) = f[0] else {
            panic!("{f:?}")
        };
        assert_eq!(
            fields(inner).unwrap(),
            vec![Field::Varint(1, 300), Field::Bytes(2, b"hi")]
        );
        assert_eq!(f[1], Field::Varint(2, u64::MAX));
        // Cut short, a length past the end, a group: refused.
        assert!(fields(&m.0[..m.0.len() - 1]).is_none());
        assert!(fields(&[0x0a, 0x05, 1]).is_none());
        assert!(fields(&[0x0b]).is_none());
    }
}
