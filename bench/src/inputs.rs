//! The input streams pptm-bench, its peers (bench/peers.py) and the examples that share a system
//! with it draw from.

/// `n` values of input stream `seed`, uniform in (0, 1]: value i is a splitmix64 hash of
/// (seed, i), so a prefix does not depend on n and numpy computes the same bits (peers.py).
pub fn uniform(seed: u64, n: usize) -> Vec<f32> {
    const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n as u64)
        .map(|i| {
            let mut z = seed
                .wrapping_mul(GOLDEN)
                .wrapping_add(i)
                .wrapping_add(GOLDEN);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 40) as f32 + 1.0) / 16_777_216.0
        })
        .collect()
}
