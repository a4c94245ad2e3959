//! Murmur3Partitioner tokens as Cassandra computes them: MurmurHash3_x64_128 (seed 0), first half, with the
//! tail bytes sign-extended (Cassandra's quirk, format reference §18.2); an empty key is the minimum token.

#[inline]
fn fmix(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51afd7ed558ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ceb9fe1a85ec53);
    k ^= k >> 33;
    k
}

pub fn token(key: &[u8]) -> i64 {
    let n = key.len();
    if n == 0 {
        return i64::MIN;
    }
    const C1: u64 = 0x87c37b91114253d5;
    const C2: u64 = 0x4cf5ad432745937f;
    let (mut h1, mut h2) = (0u64, 0u64);
    let nb = n / 16;
    for i in 0..nb {
        let k1 = u64::from_le_bytes(key[16 * i..16 * i + 8].try_into().unwrap());
        let k2 = u64::from_le_bytes(key[16 * i + 8..16 * i + 16].try_into().unwrap());
        h1 ^= k1.wrapping_mul(C1).rotate_left(31).wrapping_mul(C2);
        h1 = h1.rotate_left(27).wrapping_add(h2).wrapping_mul(5).wrapping_add(0x52dce729);
        h2 ^= k2.wrapping_mul(C2).rotate_left(33).wrapping_mul(C1);
        h2 = h2.rotate_left(31).wrapping_add(h1).wrapping_mul(5).wrapping_add(0x38495ab5);
    }
    let t = &key[nb * 16..];
    let r = t.len();
    if r > 8 {
        let mut k2 = 0u64;
        for j in (8..r).rev() {
            k2 ^= ((t[j] as i8 as i64) as u64) << (8 * (j - 8));
        }
        h2 ^= k2.wrapping_mul(C2).rotate_left(33).wrapping_mul(C1);
    }
    if r > 0 {
        let mut k1 = 0u64;
        for j in (0..r.min(8)).rev() {
            k1 ^= ((t[j] as i8 as i64) as u64) << (8 * j);
        }
        h1 ^= k1.wrapping_mul(C1).rotate_left(31).wrapping_mul(C2);
    }
    h1 ^= n as u64;
    h2 ^= n as u64;
    h1 = h1.wrapping_add(h2);
    h2 = h2.wrapping_add(h1);
    h1 = fmix(h1);
    h2 = fmix(h2);
    h1 = h1.wrapping_add(h2);
    let tk = h1 as i64;
    if tk == i64::MIN {
        i64::MAX
    } else {
        tk
    }
}
