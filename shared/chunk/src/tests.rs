use super::*;
use std::sync::Arc;
use strata_model::{stale_nan, Sample, STALE_NAN_BITS};

fn roundtrip(samples: &[Sample]) -> usize {
    let mut a = ChunkAppender::new();
    for s in samples {
        a.append(s.t, s.v);
    }
    let c = a.seal();
    let back = c.decode().expect("decodes");
    assert_eq!(back.len(), samples.len());
    for (x, y) in samples.iter().zip(&back) {
        assert!(x.bit_eq(y), "{x:?} != {y:?}");
    }
    c.data.len()
}

/// xorshift64*: deterministic test data without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn random_floats_and_times_roundtrip() {
    let mut r = Rng(42);
    for _ in 0..50 {
        let mut t = (r.next() % 1_000_000_000) as i64;
        let mut v = Vec::new();
        for _ in 0..CHUNK_MAX_SAMPLES {
            t += 1 + (r.next() % 100_000) as i64;
            v.push(Sample::new(t, f64::from_bits(r.next())));
        }
        roundtrip(&v);
    }
}

#[test]
fn adversarial_values_roundtrip() {
    let vals = [
        0.0,
        -0.0,
        f64::NAN,
        stale_nan(),
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e308,
        -1e308,
        f64::MIN_POSITIVE,
        5e-324,
        9_223_372_036_854_775_794.0,
        1.0,
        612.318,
        612.319,
        1e15,
        -1e15,
        0.1,
        0.2,
        0.30000000000000004,
        f64::from_bits(0x7ff8_0000_0000_0001),
        123456.789012,
        1.0,
        1.0,
    ];
    let samples: Vec<_> = vals.iter().enumerate().map(|(i, &v)| Sample::new(i as i64 * 15_000, v)).collect();
    roundtrip(&samples);
    let back = {
        let mut a = ChunkAppender::new();
        samples.iter().for_each(|s| a.append(s.t, s.v));
        a.seal().decode().unwrap()
    };
    assert_eq!(back[3].v.to_bits(), STALE_NAN_BITS);
}

#[test]
fn random_decimals_at_mixed_scales_roundtrip() {
    let mut r = Rng(99);
    for _ in 0..200 {
        let mut t = 0i64;
        let v: Vec<_> = (0..CHUNK_MAX_SAMPLES)
            .map(|_| {
                t += 1 + (r.next() % 30_000) as i64;
                let scale = (r.next() % 8) as i32;
                let x = match r.next() % 20 {
                    0 => f64::NAN,
                    1 => stale_nan(),
                    2 => (r.next() % 1_000_000_000_000) as f64,
                    _ => ((r.next() % 2_000_000) as i64 - 1_000_000) as f64 / 10f64.powi(scale),
                };
                Sample::new(t, x)
            })
            .collect();
        roundtrip(&v);
    }
}

#[test]
fn a_first_value_with_trailing_zeros_does_not_fix_the_scale() {
    // 612.310 prints as 612.31: the chunk starts at scale 2, then meets 3 decimals.
    let vals = [612.31, 612.318, 613.2, 611.999, 700.0, 0.001, 1e-6, 612.3185, 5e15, 1.5];
    let samples: Vec<_> = vals.iter().enumerate().map(|(i, &v)| Sample::new(i as i64 * 5000, v)).collect();
    roundtrip(&samples);
    let noisy: Vec<_> = (0..240)
        .map(|i| Sample::new(i * 5000, if i == 0 { 612.31 } else { 600.0 + ((i * 7919) % 10000) as f64 / 1000.0 }))
        .collect();
    let bytes = roundtrip(&noisy);
    assert!(bytes < 240 * 3, "rescaled chunk took {bytes} bytes");
}

#[test]
fn huge_time_jumps_and_negative_times_roundtrip() {
    let ts = [i64::MIN / 4, -1, 0, 1, 2, 1 << 40, (1 << 40) + 1, i64::MAX / 4, i64::MAX / 4 + 5000];
    let samples: Vec<_> = ts.iter().map(|&t| Sample::new(t, t as f64)).collect();
    roundtrip(&samples);
}

#[test]
fn decimal_gauges_compress_well() {
    // a power reading with three decimals, scraped every 5 s with ms jitter
    let mut r = Rng(7);
    let mut samples = Vec::new();
    let mut t = 1_700_000_000_000i64;
    for i in 0..CHUNK_MAX_SAMPLES as i64 {
        t += 5000 + (r.next() % 20) as i64 - 10;
        let milli = 600_000 + (r.next() % 2000) as i64 + i;
        samples.push(Sample::new(t, milli as f64 / 1000.0));
    }
    let bytes = roundtrip(&samples);
    let per = bytes as f64 / samples.len() as f64;
    assert!(per < 3.5, "power gauge took {per} bytes/sample");
    // an integer counter with a steady rate: almost nothing per sample
    let samples: Vec<_> =
        (0..CHUNK_MAX_SAMPLES as i64).map(|i| Sample::new(i * 5000, (31_035_686_671 + i * 3_000_000) as f64)).collect();
    let bytes = roundtrip(&samples);
    let bits = bytes as f64 * 8.0 / CHUNK_MAX_SAMPLES as f64;
    assert!(bits < 2.8, "steady counter took {bits} bits per sample");
}

#[test]
fn jittered_timestamps_on_a_grid_use_the_grid_code() {
    // 15 s scrapes with 0-39 ms of independent jitter, a constant value: the cost is
    // almost all timestamp. Delta of delta needs ~7.3 bits here, the grid code ~6.
    let mut r = Rng(5);
    let samples: Vec<_> = (0..CHUNK_MAX_SAMPLES as i64)
        .map(|i| Sample::new(1_700_000_000_000 + i * 15_000 + (r.next() % 40) as i64, 0.0))
        .collect();
    let bytes = roundtrip(&samples);
    let bits = bytes as f64 * 8.0 / samples.len() as f64;
    assert!(bits < 7.4, "jittered grid took {bits} bits per sample");
    // and irregular timestamps still round-trip
    let mut t = 0i64;
    let irregular: Vec<_> = (0..CHUNK_MAX_SAMPLES as i64)
        .map(|i| {
            t += 1 + (r.next() % 100_000) as i64 * (i % 3);
            Sample::new(t, 1.0)
        })
        .collect();
    roundtrip(&irregular);
}

#[test]
fn random_bytes_decode_to_an_error_or_samples_never_a_panic() {
    let mut r = Rng(77);
    for _ in 0..2000 {
        let len = (r.next() % 200) as usize;
        let data: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
        let c = Chunk { data: Arc::from(data), n: (r.next() % 1000) as u16, min_t: 0, max_t: 0 };
        let _ = c.decode();
    }
}

#[test]
fn samples_within_a_range_are_estimated_without_decoding() {
    let mut a = ChunkAppender::new();
    for i in 0..100 {
        a.append(i * 1000, 1.0);
    }
    let c = a.seal();
    assert_eq!(c.samples_within(0, 99_000), 100);
    assert_eq!(c.samples_within(-5, 200_000), 100);
    assert_eq!(c.samples_within(100_000, 200_000), 0);
    let half = c.samples_within(50_000, 200_000);
    assert!((49..=52).contains(&half), "{half}");
    assert_eq!(c.samples_within(99_000, 99_000), 1, "rounded up, never zero when overlapping");
}

#[test]
fn truncated_data_is_an_error_not_garbage() {
    let mut a = ChunkAppender::new();
    for i in 0..100 {
        a.append(i * 1000, (i as f64).sin());
    }
    let c = a.seal();
    let cut = Chunk { data: Arc::from(&c.data[..c.data.len() / 2]), ..c.clone() };
    assert!(matches!(cut.decode(), Err(ChunkError::Truncated(_))));
}

/// Noise around a level (a gauge's readings): the block form predicts with the mean of
/// the last eight values, whose residual spreads as one reading, not as the difference of
/// two; every value comes back bit for bit, negative and near the exact limit included.
#[test]
fn noisy_levels_take_the_mean_predictor_and_roundtrip() {
    let mut r = Rng(11);
    let noise = |r: &mut Rng| (r.next() % 13) as i64 - 6;
    let level: Vec<Sample> =
        (0..CHUNK_MAX_SAMPLES as i64).map(|i| Sample::new(i * 5000, (60 + noise(&mut r)) as f64)).collect();
    let c = Chunk::encode_samples(level.clone()).pop().unwrap().compact();
    assert!(c.is_block());
    assert_eq!(c.decode().unwrap(), level);
    // Rice codes of the residuals: about 4.45 bits a sample around the mean of eight, and
    // 4.9 for the difference of two readings (last-value prediction).
    let bits = c.data.len() as f64 * 8.0 / level.len() as f64;
    assert!(bits < 4.7, "{bits} bits a sample for noise of 13 values around a level");
    for (base, scale) in [(-5_000_000.0, 1.0), (1e9, 1000.0), (-8_000_000_000.0, 1000.0)] {
        let s: Vec<Sample> =
            (0..500i64).map(|i| Sample::new(i * 1000, base + (noise(&mut r) * 1000 + i % 7) as f64 / scale)).collect();
        let c = Chunk::encode_samples(s.clone()).pop().unwrap().compact();
        let back = c.decode().unwrap();
        assert!(back.iter().zip(&s).all(|(a, b)| a.bit_eq(b)), "base {base}");
    }
}

/// Values near 2^53 at a scale that grows within the chunk (one decimal, then two): every
/// integer the encoder uses is the one a decoder scales back from the decoded float, so
/// the mean predictor reads back exactly what it predicted from.
#[test]
fn values_near_the_exact_limit_with_a_growing_scale_roundtrip() {
    let mut r = Rng(3);
    for base in [75_515_081_170_981.4f64, 4.5e15 / 1000.0, 2.3e9, -6.7e12] {
        let mut s: Vec<Sample> = (0..119i64)
            .map(|i| {
                let tenths = (base * 10.0).round() as i64 + (r.next() % 13) as i64 - 6;
                Sample::new(i * 1000, tenths as f64 / 10.0)
            })
            .collect();
        s.push(Sample::new(119_000, 0.01));
        // The block encoding itself (compaction would keep the streaming one here).
        let bytes = block::encode(&s).expect("exact decimals on a grid");
        let mut back = Vec::new();
        block::decode(&bytes, s.len(), &mut back).unwrap();
        assert!(
            back.iter().zip(&s).all(|(a, b)| a.bit_eq(b)),
            "base {base}: {} values differ",
            back.iter().zip(&s).filter(|(a, b)| !a.bit_eq(b)).count()
        );
    }
}

#[test]
fn samples_encoded_as_sealed_chunks_decode_bit_for_bit_in_either_encoding() {
    // A jittered decimal gauge long enough for three chunks, then a stretch with a
    // staleness marker and a long mantissa (the streaming encoding).
    let mut samples: Vec<Sample> =
        (0..2000).map(|i| Sample::new(1_000_000 + i * 5000 + (i * 7) % 40, ((i * 13) % 100) as f64 + 0.25)).collect();
    samples.push(Sample::new(20_000_000, stale_nan()));
    samples.push(Sample::new(20_005_000, std::f64::consts::PI));
    let chunks = Chunk::encode_sealed(&samples);
    assert_eq!(chunks.len(), 3);
    assert!(chunks[0].is_block() && chunks[1].is_block(), "scraped decimals take the block encoding");
    assert!(!chunks[2].is_block(), "a staleness marker keeps the streaming encoding");
    let mut back = Vec::new();
    for c in &chunks {
        assert!(c.n as usize <= crate::CHUNK_MAX_SAMPLES as usize);
        let d = c.decode().unwrap();
        assert_eq!((c.min_t, c.max_t, c.n as usize), (d[0].t, d[d.len() - 1].t, d.len()));
        back.extend(d);
    }
    let bits = |s: &[Sample]| s.iter().map(|x| (x.t, x.v.to_bits())).collect::<Vec<_>>();
    assert_eq!(bits(&back), bits(&samples));
    assert!(Chunk::encode_sealed(&[]).is_empty());
}

#[test]
fn an_empty_or_inverted_range_decodes_nothing_in_either_encoding() {
    let samples: Vec<Sample> = (0..100).map(|i| Sample::new(i * 1000, (i % 7) as f64)).collect();
    for c in Chunk::encode_sealed(&samples).into_iter().chain(Chunk::encode_samples(samples.iter().copied())) {
        let mut out = vec![Sample::new(-1, 0.0)];
        c.decode_into(50_000, 20_000, &mut out).unwrap();
        assert_eq!(out.len(), 1, "block form: {}", c.is_block());
    }
}
