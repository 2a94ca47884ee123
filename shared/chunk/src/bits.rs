//! Bit I/O, most significant bit first, through a 64-bit window.

/// Bits are written most significant first into a 64-bit accumulator and moved to the
/// byte vector whole bytes at a time. (Flushing four bytes at a time was faster to write
/// but raised the edge's peak memory by a quarter in `bench vs-prometheus`.)
#[derive(Debug, Clone, Default)]
pub(crate) struct BitWriter {
    pub(crate) bytes: Vec<u8>,
    pub(crate) acc: u64,
    /// Bits pending in `acc` (always < 8 between calls).
    pub(crate) nacc: u32,
}

pub(crate) fn low_mask(n: u32) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

impl BitWriter {
    pub(crate) fn write_bit(&mut self, bit: bool) {
        self.write_bits(bit as u64, 1);
    }

    pub(crate) fn write_bits(&mut self, value: u64, n: u32) {
        if n > 32 {
            self.write_bits(value >> 32, n - 32);
            self.write_bits(value, 32);
            return;
        }
        if n == 0 {
            return;
        }
        self.acc = (self.acc << n) | (value & low_mask(n));
        self.nacc += n;
        if self.bytes.capacity() - self.bytes.len() < 5 {
            self.grow();
        }
        while self.nacc >= 8 {
            self.nacc -= 8;
            self.bytes.push((self.acc >> self.nacc) as u8);
        }
        self.acc &= low_mask(self.nacc);
    }

    /// Grows the buffer by an eighth instead of doubling it. A head holds one open chunk
    /// per series, and series fill in step: with doubling, millions of buffers would be
    /// half empty at once (a third of the head's memory at 500 k series). The copies cost
    /// a few bytes per sample.
    #[cold]
    fn grow(&mut self) {
        self.bytes.reserve_exact((self.bytes.len() / 8).max(32));
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes.len() + (self.nacc > 0) as usize
    }

    /// The bytes written so far, the last one padded with zero bits.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        v.extend_from_slice(&self.bytes);
        if self.nacc > 0 {
            v.push((self.acc << (8 - self.nacc)) as u8);
        }
        v
    }
}

/// Reads bits most significant first through a 64-bit window. Reads past the end see
/// zeros instead of failing, so the hot path carries no checks: the decoder asks
/// [`overrun`](Self::overrun) once per sample and refuses the sample if it read past the data.
#[derive(Debug, Clone)]
pub(crate) struct BitReader<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) pos: usize, // in bits
}

impl<'a> BitReader<'a> {
    /// The next (at least 57) bits, left-aligned, zero-padded past the end.
    #[inline(always)]
    pub(crate) fn peek64(&self) -> u64 {
        let byte = self.pos / 8;
        let word = match self.bytes.get(byte..byte + 8) {
            Some(b) => u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            None => {
                let mut buf = [0u8; 8];
                let tail = self.bytes.get(byte..).unwrap_or_default();
                buf[..tail.len()].copy_from_slice(tail);
                u64::from_be_bytes(buf)
            }
        };
        word << (self.pos % 8)
    }

    /// True once more bits were consumed than the data holds.
    #[inline(always)]
    pub(crate) fn overrun(&self) -> bool {
        self.pos > self.bytes.len() * 8
    }

    #[inline(always)]
    pub(crate) fn read_bit(&mut self) -> bool {
        self.read_bits(1) == 1
    }

    /// The next `n` bits (`n` ≤ 64).
    #[inline(always)]
    pub(crate) fn read_bits(&mut self, n: u32) -> u64 {
        if n > 56 {
            let hi = self.take(n - 32);
            return (hi << 32) | self.take(32);
        }
        self.take(n)
    }

    /// `n` ≤ 56 bits; the double shift makes `n = 0` read nothing without a branch.
    #[inline(always)]
    pub(crate) fn take(&mut self, n: u32) -> u64 {
        let v = (self.peek64() >> (63 - n)) >> 1;
        self.pos += n as usize;
        v
    }
}
