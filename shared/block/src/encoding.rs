//! Variable-length integers and a bounds-checked decoder, shared by the block files and
//! the WAL. Decoding never panics: every read past the end or overflowing is `None`, which
//! the caller turns into an error naming the file.

pub fn put_uvarint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Zig-zag, so that small negative numbers stay short.
pub fn put_varint(buf: &mut Vec<u8>, v: i64) {
    put_uvarint(buf, ((v << 1) ^ (v >> 63)) as u64);
}

pub fn put_str(buf: &mut Vec<u8>, s: &str) {
    put_uvarint(buf, s.len() as u64);
    buf.extend_from_slice(s.as_bytes());
}

/// A cursor over bytes that may be damaged.
pub struct Decoder<'a> {
    pub b: &'a [u8],
    pub i: usize,
}

impl<'a> Decoder<'a> {
    pub fn new(b: &'a [u8]) -> Self {
        Decoder { b, i: 0 }
    }

    pub fn at(b: &'a [u8], i: usize) -> Self {
        Decoder { b, i }
    }

    pub fn is_empty(&self) -> bool {
        self.i >= self.b.len()
    }

    pub fn uvarint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.b.get(self.i)?;
            self.i += 1;
            v |= ((byte & 0x7f) as u64) << shift;
            if byte < 0x80 {
                return Some(v);
            }
        }
        None
    }

    pub fn varint(&mut self) -> Option<i64> {
        let u = self.uvarint()?;
        Some(((u >> 1) as i64) ^ -((u & 1) as i64))
    }

    /// A `uvarint` that must fit a `usize` no larger than `max`.
    pub fn len(&mut self, max: usize) -> Option<usize> {
        usize::try_from(self.uvarint()?).ok().filter(|&n| n <= max)
    }

    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.i.checked_add(n)?;
        let s = self.b.get(self.i..end)?;
        self.i = end;
        Some(s)
    }

    pub fn str(&mut self) -> Option<&'a str> {
        let n = self.len(self.b.len())?;
        std::str::from_utf8(self.bytes(n)?).ok()
    }

    pub fn u8(&mut self) -> Option<u8> {
        let v = *self.b.get(self.i)?;
        self.i += 1;
        Some(v)
    }

    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes(4)?.try_into().ok()?))
    }

    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }

    pub fn f64(&mut self) -> Option<f64> {
        Some(f64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let mut b = Vec::new();
        for v in [0u64, 1, 127, 128, u64::MAX] {
            put_uvarint(&mut b, v);
        }
        for v in [0i64, -1, 1, i64::MIN, i64::MAX] {
            put_varint(&mut b, v);
        }
        put_str(&mut b, "gpu");
        let mut d = Decoder::new(&b);
        for v in [0u64, 1, 127, 128, u64::MAX] {
            assert_eq!(d.uvarint(), Some(v));
        }
        for v in [0i64, -1, 1, i64::MIN, i64::MAX] {
            assert_eq!(d.varint(), Some(v));
        }
        assert_eq!(d.str(), Some("gpu"));
        assert!(d.is_empty());
        assert_eq!(d.u8(), None);
        // Eleven continuation bytes are not a number; a length past the end is not a string.
        assert_eq!(Decoder::new(&[0xff; 11]).uvarint(), None);
        assert_eq!(Decoder::new(&[5, b'a']).str(), None);
    }
}
