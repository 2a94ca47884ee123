//! A column of values without timestamps: for data whose times are implied (one value per
//! aggregation window, the windows' ends held once beside them), so a column pays for its
//! values only. A column is written in the value coding of the streaming chunk, or, when
//! its values are decimals at one scale and that is no larger, in the block encoding's
//! partitioned Rice coding (its timestamps a regular grid, which costs a few header bytes):
//! that decodes in tight loops, several times faster, and aggregate queries spend most of
//! their time decoding columns. The first three bits say which (as in a chunk).

use crate::appender::{write_first_value, write_value};
use crate::bits::{BitReader, BitWriter};
use crate::iter::{read_first_value, read_value};
use crate::scale::{decimal_scale, MAX_SCALE};
use crate::value::ValueState;
use crate::ChunkError;
use strata_model::Sample;

/// The values, in order, as bytes [`decode_values`] reads back bit for bit.
pub fn encode_values(values: &[f64]) -> Vec<u8> {
    let streaming = encode_streaming(values);
    let grid = || values.iter().enumerate().map(|(i, &v)| Sample { t: i as i64, v }).collect::<Vec<_>>();
    match crate::block::encode(&grid()) {
        // Kept only when it reads back bit for bit (the block coding never changes a value,
        // but a column is cheap to check once, and a wrong aggregate would be silent).
        Some(b) if b.len() <= streaming.len() && reads_back(&b, values) => b,
        _ => streaming,
    }
}

/// Whether a column [`encode_values`] wrote is in the block coding (older readers know
/// only the streaming one).
pub fn is_block_coded(bytes: &[u8]) -> bool {
    crate::block::is_block(bytes)
}

fn reads_back(bytes: &[u8], values: &[f64]) -> bool {
    let mut back = Vec::with_capacity(values.len());
    decode_values(bytes, values.len(), &mut back).is_ok()
        && back.iter().zip(values).all(|(a, b)| a.to_bits() == b.to_bits())
}

fn encode_streaming(values: &[f64]) -> Vec<u8> {
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
    if crate::block::is_block(bytes) {
        return crate::block::decode_values(bytes, n, out);
    }
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
    fn decimal_columns_take_the_block_coding_and_read_back_bit_for_bit() {
        let counts: Vec<f64> = (0..288).map(|i| f64::from(20 + (i % 3 == 0) as i32)).collect();
        let mut sums: Vec<f64> = (0..288).map(|i| (i * 37 % 1000) as f64 / 100.0).collect();
        sums[9] = -12.5;
        for vals in [counts, sums] {
            let bytes = encode_values(&vals);
            assert!(crate::block::is_block(&bytes), "a decimal column in the block coding");
            assert!(bytes.len() < encode_streaming(&vals).len() + 1);
            let mut back = Vec::new();
            decode_values(&bytes, vals.len(), &mut back).unwrap();
            assert_eq!(
                back.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                vals.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
            assert!(decode_values(&bytes[..bytes.len() / 2], vals.len(), &mut Vec::new()).is_err());
        }
        // Too few values, or one that is not a short decimal: the streaming coding.
        assert!(!crate::block::is_block(&encode_values(&[1.0; 8])));
        let mut signed = vec![2.5; 40];
        signed[7] = -0.0;
        assert!(reads_back(&encode_values(&signed), &signed), "-0.0 keeps its sign");
        let floats: Vec<f64> = (0..64).map(|i| f64::from(i) * 0.1 + 0.2).collect();
        assert!(!crate::block::is_block(&encode_values(&floats)) || reads_back(&encode_values(&floats), &floats));
    }

    #[test]
    fn a_steady_column_costs_about_a_bit_a_value() {
        let counts = vec![20.0; 288];
        assert!(encode_values(&counts).len() <= 288 / 8 + 8, "{} bytes", encode_values(&counts).len());
    }
}
