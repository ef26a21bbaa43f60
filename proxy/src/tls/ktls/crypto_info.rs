//! The kernel's view of a TLS session's keys: `struct tls12_crypto_info_*` (uapi `linux/tls.h`)
//! built from what rustls hands over (key, IV, record sequence number), one per direction.
//!
//! The layouts differ by cipher, not by version: AES-GCM splits rustls's 12-byte IV into a
//! 4-byte salt and an 8-byte `iv`; ChaCha20-Poly1305 takes all 12 bytes as `iv` and has no salt.
//! For TLS 1.3 and ChaCha20 the kernel forms each nonce as IV XOR sequence number, as rustls
//! does, so giving it the next sequence number is enough. TLS 1.2 AES-GCM is different: the
//! 8-byte explicit nonce travels in each record, and the kernel's sender makes it a counter
//! that starts at the `iv` given and adds one per record, where rustls used IV XOR sequence.
//! Starting the counter at rustls's own IV would repeat the nonce of the server's Finished
//! (sequence 0) under the same key, which breaks AES-GCM. So the counter starts past every
//! nonce rustls may have used: records 0..seq used `base XOR j`, all inside the aligned block of
//! `seq.next_power_of_two()` values around `base`; the counter starts at the next block.

use nix::sys::socket::sockopt::TlsCryptoInfo;

/// A protocol version the kernel offloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    Tls12,
    Tls13,
}

impl Version {
    /// The uapi `TLS_1_x_VERSION`.
    fn code(self) -> u16 {
        match self {
            Version::Tls12 => libc::TLS_1_2_VERSION,
            Version::Tls13 => libc::TLS_1_3_VERSION,
        }
    }

    /// As people write it.
    pub fn name(self) -> &'static str {
        match self {
            Version::Tls12 => "TLS1.2",
            Version::Tls13 => "TLS1.3",
        }
    }
}

/// An AEAD the kernel offloads (every one rustls's `ring` provider negotiates).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cipher {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20Poly1305,
}

impl Cipher {
    /// Every cipher, in the order start-up reports them.
    pub const ALL: [Cipher; 3] = [
        Cipher::Aes128Gcm,
        Cipher::Aes256Gcm,
        Cipher::Chacha20Poly1305,
    ];

    /// As people write it.
    pub fn name(self) -> &'static str {
        match self {
            Cipher::Aes128Gcm => "AES-128-GCM",
            Cipher::Aes256Gcm => "AES-256-GCM",
            Cipher::Chacha20Poly1305 => "CHACHA20-POLY1305",
        }
    }

    /// The key length the kernel's struct holds.
    fn key_len(self) -> usize {
        match self {
            Cipher::Aes128Gcm => 16,
            Cipher::Aes256Gcm | Cipher::Chacha20Poly1305 => 32,
        }
    }
}

/// Which way the keys are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Tx,
    Rx,
}

/// What a key of the wrong length is called (never expected from rustls).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{cipher} needs a {want}-byte key, got {got}")]
pub struct BadKey {
    cipher: &'static str,
    want: usize,
    got: usize,
}

/// The crypto info for one direction: `key` and the 12-byte `iv` as rustls extracted them,
/// `seq` the sequence number of the next record in that direction.
pub fn crypto_info(
    version: Version,
    cipher: Cipher,
    key: &[u8],
    iv: &[u8; 12],
    seq: u64,
    dir: Direction,
) -> Result<TlsCryptoInfo, BadKey> {
    if key.len() != cipher.key_len() {
        return Err(BadKey {
            cipher: cipher.name(),
            want: cipher.key_len(),
            got: key.len(),
        });
    }
    let info = libc::tls_crypto_info {
        version: version.code(),
        cipher_type: match cipher {
            Cipher::Aes128Gcm => libc::TLS_CIPHER_AES_GCM_128,
            Cipher::Aes256Gcm => libc::TLS_CIPHER_AES_GCM_256,
            Cipher::Chacha20Poly1305 => libc::TLS_CIPHER_CHACHA20_POLY1305,
        },
    };
    let rec_seq = seq.to_be_bytes();
    let mut salt = [0u8; 4];
    salt.copy_from_slice(&iv[..4]);
    let mut explicit = [0u8; 8];
    explicit.copy_from_slice(&iv[4..]);
    if version == Version::Tls12 && dir == Direction::Tx && cipher != Cipher::Chacha20Poly1305 {
        explicit = tls12_first_explicit_nonce(u64::from_be_bytes(explicit), seq).to_be_bytes();
    }
    Ok(match cipher {
        Cipher::Aes128Gcm => {
            let mut k = [0u8; 16];
            k.copy_from_slice(key);
            TlsCryptoInfo::Aes128Gcm(libc::tls12_crypto_info_aes_gcm_128 {
                info,
                iv: explicit,
                key: k,
                salt,
                rec_seq,
            })
        }
        Cipher::Aes256Gcm => {
            let mut k = [0u8; 32];
            k.copy_from_slice(key);
            TlsCryptoInfo::Aes256Gcm(libc::tls12_crypto_info_aes_gcm_256 {
                info,
                iv: explicit,
                key: k,
                salt,
                rec_seq,
            })
        }
        Cipher::Chacha20Poly1305 => {
            let mut k = [0u8; 32];
            k.copy_from_slice(key);
            TlsCryptoInfo::Chacha20Poly1305(libc::tls12_crypto_info_chacha20_poly1305 {
                info,
                iv: *iv,
                key: k,
                salt: [],
                rec_seq,
            })
        }
    })
}

/// The kernel's first TLS 1.2 explicit nonce after rustls wrote records `0..seq` with nonces
/// `base XOR j`: the start of the aligned block after the one holding all of those, so the
/// kernel's counter (+1 per record) meets none of them before 2^64 records.
fn tls12_first_explicit_nonce(base: u64, seq: u64) -> u64 {
    if seq == 0 {
        return base;
    }
    let block = seq.next_power_of_two();
    (base | (block - 1)).wrapping_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const IV: [u8; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];

    #[test]
    fn aes_gcm_splits_the_iv_into_salt_and_iv_tls13() {
        let key = [0xAA; 16];
        let TlsCryptoInfo::Aes128Gcm(i) = crypto_info(
            Version::Tls13,
            Cipher::Aes128Gcm,
            &key,
            &IV,
            3,
            Direction::Tx,
        )
        .expect("info") else {
            panic!("wrong cipher");
        };
        assert_eq!(i.info.version, 0x0304);
        assert_eq!(i.info.cipher_type, 51);
        assert_eq!(i.salt, [1, 2, 3, 4]);
        assert_eq!(i.iv, [5, 6, 7, 8, 9, 10, 11, 12]);
        assert_eq!(i.key, key);
        assert_eq!(i.rec_seq, [0, 0, 0, 0, 0, 0, 0, 3]);
    }

    #[test]
    fn chacha_takes_the_whole_iv_and_no_salt() {
        let key = [0x55; 32];
        let TlsCryptoInfo::Chacha20Poly1305(i) = crypto_info(
            Version::Tls12,
            Cipher::Chacha20Poly1305,
            &key,
            &IV,
            1,
            Direction::Tx,
        )
        .expect("info") else {
            panic!("wrong cipher");
        };
        assert_eq!(i.info.version, 0x0303);
        assert_eq!(i.info.cipher_type, 54);
        assert_eq!(i.iv, IV);
        assert_eq!(i.rec_seq, [0, 0, 0, 0, 0, 0, 0, 1]);
    }

    /// TLS 1.2 AES-GCM sending: the explicit nonce the kernel starts from is past the one
    /// rustls used for the Finished (sequence 0), so no nonce repeats under the key; receiving
    /// keeps rustls's IV (the peer's nonces come in the records).
    #[test]
    fn tls12_gcm_send_nonce_never_repeats_rustls_nonces() {
        let key = [7u8; 32];
        let TlsCryptoInfo::Aes256Gcm(tx) = crypto_info(
            Version::Tls12,
            Cipher::Aes256Gcm,
            &key,
            &IV,
            1,
            Direction::Tx,
        )
        .expect("info") else {
            panic!("wrong cipher");
        };
        let base = u64::from_be_bytes([5, 6, 7, 8, 9, 10, 11, 12]);
        assert_eq!(u64::from_be_bytes(tx.iv), base + 1);
        let TlsCryptoInfo::Aes256Gcm(rx) = crypto_info(
            Version::Tls12,
            Cipher::Aes256Gcm,
            &key,
            &IV,
            1,
            Direction::Rx,
        )
        .expect("info") else {
            panic!("wrong cipher");
        };
        assert_eq!(rx.iv, [5, 6, 7, 8, 9, 10, 11, 12]);
        // Exhaustively for small sequences and awkward bases: the kernel's next 10,000 nonces
        // miss every nonce rustls used.
        for base in [0u64, 1, 0xff, 0x1234_5678_9abc_def1, u64::MAX - 3, u64::MAX] {
            for seq in 0..40u64 {
                let used: Vec<u64> = (0..seq).map(|j| base ^ j).collect();
                let start = tls12_first_explicit_nonce(base, seq);
                for k in 0..10_000u64 {
                    assert!(
                        !used.contains(&start.wrapping_add(k)),
                        "base {base:#x} seq {seq}: nonce {k} repeats"
                    );
                }
            }
        }
    }

    #[test]
    fn a_key_of_the_wrong_length_is_refused() {
        assert_eq!(
            crypto_info(
                Version::Tls13,
                Cipher::Aes256Gcm,
                &[0; 16],
                &IV,
                0,
                Direction::Rx
            )
            .err()
            .map(|e| e.to_string()),
            Some("AES-256-GCM needs a 32-byte key, got 16".to_string())
        );
    }
}
