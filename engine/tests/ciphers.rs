//! The measurement behind the choice of cipher for the native wire's sealed records
//! (`transport::tcp::seal`): `ring`'s AES-256-GCM and ChaCha20-Poly1305 beside RustCrypto's
//! `aes-gcm` (AES-256-GCM) and `chacha20poly1305`, each sealing and opening one record in
//! place at the record sizes the wire considers (16 KiB and 64 KiB). Ignored in `cargo
//! test` (it measures, it checks nothing that can fail on a slow machine); run it optimised:
//!
//! ```text
//! cargo test --release -p nuvec-distributed-engine --test ciphers -- --ignored --nocapture
//! ```
//!
//! `seal` encrypts the same buffer in place again and again (the same work as fresh data);
//! `open` copies the sealed record into the buffer and then verifies and decrypts it in
//! place, so its rate includes one copy of the record, as a receive that lands the record in
//! a staging buffer would. GB/s is plaintext bytes over the median of timed batches (10^9
//! bytes per second). All four detect the CPU at run time on x86-64: `ring` uses AES-NI
//! with CLMUL, or VAES with VPCLMULQDQ and AVX2, for AES-GCM and SSSE3 or AVX2 for
//! ChaCha20-Poly1305; RustCrypto's crates use AES-NI and CLMUL for AES-GCM and AVX2 for
//! ChaCha20 and Poly1305. On Apple's aarch64 `ring` takes ARMv8's AES and PMULL
//! instructions as given (every such CPU has them) and uses NEON for ChaCha20-Poly1305;
//! RustCrypto's crates run their portable code there unless `--cfg aes_armv8 --cfg
//! polyval_armv8` (AES-GCM) or `--cfg chacha20_force_neon` is in RUSTFLAGS. The results and
//! the choice are in `transport::tcp::seal`'s docs.

use std::hint::black_box;
use std::time::{Duration, Instant};

use aes_gcm::Aes256Gcm;
use aes_gcm::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::ChaCha20Poly1305;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey};

/// Median plaintext GB/s of `f` over batches of about 20 ms each, for about 400 ms.
fn rate(bytes: usize, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut per_batch = 1usize;
    while start.elapsed() < Duration::from_millis(20) {
        f();
        per_batch += 1;
    }
    let mut samples = Vec::new();
    let run = Instant::now();
    while run.elapsed() < Duration::from_millis(400) {
        let t = Instant::now();
        for _ in 0..per_batch {
            f();
        }
        samples.push(t.elapsed().as_secs_f64() / per_batch as f64);
    }
    samples.sort_by(f64::total_cmp);
    bytes as f64 / samples[samples.len() / 2] / 1e9
}

/// Prints `name`'s seal and open rates at each size.
fn measure<C: AeadInPlace + KeyInit>(name: &str) {
    let cipher = C::new_from_slice(&[7u8; 32]).expect("a 32-byte key");
    let nonce = aes_gcm::Nonce::<C::NonceSize>::default();
    let aad = 16384u32.to_le_bytes();
    for size in [16 << 10, 64 << 10] {
        let mut buf = vec![0x5au8; size];
        let seal = rate(size, || {
            let tag = cipher
                .encrypt_in_place_detached(&nonce, &aad, black_box(&mut buf))
                .expect("sealing");
            black_box(tag);
        });
        let plain = vec![0x5au8; size];
        let mut sealed = plain.clone();
        let tag = cipher
            .encrypt_in_place_detached(&nonce, &aad, &mut sealed)
            .expect("sealing");
        let open = rate(size, || {
            buf.copy_from_slice(&sealed);
            cipher
                .decrypt_in_place_detached(&nonce, &aad, black_box(&mut buf), &tag)
                .expect("opening");
        });
        assert_eq!(buf, plain, "{name} did not open what it sealed");
        println!(
            "{name:<20} {:>3} KiB  seal {seal:5.2} GB/s  open {open:5.2} GB/s",
            size >> 10
        );
    }
}

/// Prints the seal and open rates of `ring`'s `algorithm` at each size, used as
/// `transport::tcp::seal` uses it: the tag apart from the ciphertext, the length as
/// associated data.
fn measure_ring(name: &str, algorithm: &'static ring::aead::Algorithm) {
    let key = LessSafeKey::new(UnboundKey::new(algorithm, &[7u8; 32]).expect("a 32-byte key"));
    let nonce = || Nonce::assume_unique_for_key([0; 12]);
    let aad = 16384u32.to_le_bytes();
    for size in [16 << 10, 64 << 10] {
        let mut buf = vec![0x5au8; size];
        let seal = rate(size, || {
            let tag = key
                .seal_in_place_separate_tag(nonce(), Aad::from(aad), black_box(&mut buf))
                .expect("sealing");
            _ = black_box(tag);
        });
        let plain = vec![0x5au8; size];
        let mut sealed = plain.clone();
        let tag = key
            .seal_in_place_separate_tag(nonce(), Aad::from(aad), &mut sealed)
            .expect("sealing");
        let open = rate(size, || {
            buf.copy_from_slice(&sealed);
            key.open_in_place_separate_tag(nonce(), Aad::from(aad), tag, black_box(&mut buf), 0..)
                .expect("opening");
        });
        assert_eq!(buf, plain, "{name} did not open what it sealed");
        println!(
            "{name:<20} {:>3} KiB  seal {seal:5.2} GB/s  open {open:5.2} GB/s",
            size >> 10
        );
    }
}

#[test]
#[ignore = "a measurement: run with --release -- --ignored --nocapture"]
fn seal_and_open_rates() {
    measure::<Aes256Gcm>("aes-256-gcm");
    measure::<ChaCha20Poly1305>("chacha20-poly1305");
    measure_ring("ring aes-256-gcm", &ring::aead::AES_256_GCM);
    measure_ring("ring chacha20-p1305", &ring::aead::CHACHA20_POLY1305);
}
