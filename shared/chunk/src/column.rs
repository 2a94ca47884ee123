//! A column of values without timestamps, in the value coding of the streaming chunk: for
//! data whose times are implied (one value per aggregation window, the windows' ends held
//! once beside them), so a column pays for its values only.

use crate::appender::{write_first_value, write_value};
use crate::bits::{BitReader, BitWriter};
use crate::iter::{read_first_value, read_value};
use crate::scale::{decimal_scale, MAX_SCALE};
use crate::value::ValueState;
use crate::ChunkError;

/// The values, in order, as bytes [`decode_values`] reads back bit for bit.
pub fn encode_values(values: &[f64]) -> Vec<u8> {
    let mut w = BitWriter::default();
    let mut vs = ValueState::default();
    let mut it = values.iter();
    if let Some(&first) = it.next() {
        let scale = decimal_scale(first).unwrap_or(0);
        w.write_bits(scale as u64, 3);
        write_first_value(&mut w, &mut vs, first, scale);
    }
    for &v in it {
        write_value(&mut w, &mut vs, v);
    }
    w.to_bytes()
}

/// `n` values from bytes [`encode_values`] wrote; damaged or short data is an error.
pub fn decode_values(bytes: &[u8], n: usize, out: &mut Vec<f64>) -> Result<(), ChunkError> {
    let mut r = BitReader { bytes, pos: 0 };
    let mut vs = ValueState::default();
    let truncated = |i: usize| ChunkError::Truncated(i.min(u16::MAX as usize) as u16);
    for i in 0..n {
        let v = if i == 0 {
            let scale = (r.read_bits(3) as u32).min(MAX_SCALE);
            read_first_value(&mut r, &mut vs, scale)
        } else {
            read_value(&mut r, &mut vs)
        };
        match v {
            Some(v) if !r.overrun() => out.push(v),
            _ => return Err(truncated(i)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_round_trip_every_kind_of_value_bit_for_bit() {
        let mut vals: Vec<f64> = (0..500).map(|i| ((i * 7919) % 1000) as f64 / 8.0).collect();
        vals.extend([f64::NAN, f64::INFINITY, -0.0, 0.1 + 0.2, 1e300, f64::from_bits(0x7ff0_0000_0000_0002)]);
        vals.extend((0..100).map(|i| i as f64 * 1.5));
        let bytes = encode_values(&vals);
        let mut back = Vec::new();
        decode_values(&bytes, vals.len(), &mut back).unwrap();
        assert_eq!(
            back.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            vals.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert!(decode_values(&bytes[..bytes.len() / 2], vals.len(), &mut Vec::new()).is_err());
        assert!(decode_values(&[], 1, &mut Vec::new()).is_err());
        let mut none = Vec::new();
        decode_values(&encode_values(&[]), 0, &mut none).unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn a_steady_column_costs_about_a_bit_a_value() {
        let counts = vec![20.0; 288];
        assert!(encode_values(&counts).len() <= 288 / 8 + 8, "{} bytes", encode_values(&counts).len());
    }
}
