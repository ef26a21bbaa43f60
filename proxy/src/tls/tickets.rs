//! Session-ticket keys from files (`tls.ticket_keys`), so a fleet behind one name and the two
//! processes of an upgrade resume each other's TLS sessions: without them each process makes
//! its own random key, and every upgrade or other node means a full handshake. A file is
//! nginx's `ssl_session_ticket_key`: 80 bytes (`openssl rand 80`), a 16-byte name, a 32-byte
//! HMAC secret and a 32-byte AES key, or 48 bytes with 16-byte secrets. The first file's key
//! makes tickets; every file's key opens them, so a rotation lists the new key first and keeps
//! the old one until the tickets it made have expired. Read at start-up and by each reload.
//!
//! A ticket is the key's name, a random 96-bit nonce, and the session sealed with AES-GCM
//! (AES-256 for an 80-byte key, AES-128 for a 48-byte one) under a key derived from the whole
//! file by HKDF-SHA256, the name as associated data. Only zerocache reads its tickets, so nginx's
//! own ticket layout is not needed; its key files are.

use ring::aead::{AES_128_GCM, AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use std::path::PathBuf;

/// How long a client may offer a ticket (a hint; key rotation is what ends a ticket's use).
const LIFETIME_SECS: u32 = 12 * 60 * 60;
/// A key's name, in front of every ticket it made.
const NAME: usize = 16;
/// The AES-GCM nonce, after the name.
const NONCE: usize = 12;

/// One key file, ready to seal and open.
struct TicketKey {
    name: [u8; NAME],
    key: LessSafeKey,
}

impl std::fmt::Debug for TicketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret: the name only identifies which key sealed a ticket.
        write!(f, "TicketKey({:02x?})", &self.name[..4])
    }
}

/// A key file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{}: {what}", path.display())]
pub struct KeyFileError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub what: String,
}

impl TicketKey {
    /// The key in `bytes` (48 or 80 of them, as nginx's files).
    fn of(bytes: &[u8]) -> Result<TicketKey, String> {
        let algorithm = match bytes.len() {
            80 => &AES_256_GCM,
            48 => &AES_128_GCM,
            n => {
                return Err(format!(
                    "{n} bytes: a ticket key file has 80 (or 48) random bytes, as nginx's ssl_session_ticket_key (openssl rand 80 > FILE)"
                ));
            }
        };
        let mut name = [0u8; NAME];
        name.copy_from_slice(&bytes[..NAME]);
        let salt = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, &name);
        let prk = salt.extract(&bytes[NAME..]);
        let okm = prk
            .expand(&[b"zerocache session ticket"], algorithm)
            .map_err(|_| "cannot derive the ticket key".to_string())?;
        let key = UnboundKey::from(okm);
        Ok(TicketKey {
            name,
            key: LessSafeKey::new(key),
        })
    }
}

/// Tickets sealed with the first key and opened with any.
#[derive(Debug)]
pub struct FileTicketer {
    keys: Vec<TicketKey>,
    rng: SystemRandom,
}

impl FileTicketer {
    /// Reads every file in `paths` (at least one).
    pub fn load(paths: &[PathBuf]) -> Result<FileTicketer, KeyFileError> {
        let keys = paths
            .iter()
            .map(|p| {
                let err = |what: String| KeyFileError {
                    path: p.clone(),
                    what,
                };
                let bytes = std::fs::read(p).map_err(|e| err(e.to_string()))?;
                TicketKey::of(&bytes).map_err(err)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(FileTicketer {
            keys,
            rng: SystemRandom::new(),
        })
    }
}

impl rustls::server::ProducesTickets for FileTicketer {
    fn enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    fn lifetime(&self) -> u32 {
        LIFETIME_SECS
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let key = self.keys.first()?;
        let mut nonce = [0u8; NONCE];
        self.rng.fill(&mut nonce).ok()?;
        let mut out = Vec::with_capacity(NAME + NONCE + plain.len() + 16);
        out.extend_from_slice(&key.name);
        out.extend_from_slice(&nonce);
        let mut sealed = plain.to_vec();
        key.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&key.name),
                &mut sealed,
            )
            .ok()?;
        out.extend_from_slice(&sealed);
        Some(out)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        // Attacker-controlled: every length is checked before it is used, and a wrong name or
        // tag is a plain None (a full handshake).
        if cipher.len() < NAME + NONCE {
            return None;
        }
        let (name, rest) = cipher.split_at(NAME);
        let (nonce, sealed) = rest.split_at(NONCE);
        let key = self.keys.iter().find(|k| k.name[..] == *name)?;
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = sealed.to_vec();
        let plain = key
            .key
            .open_in_place(nonce, Aad::from(&key.name), &mut buf)
            .ok()?;
        Some(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::server::ProducesTickets;

    fn ticketer(files: &[&[u8]]) -> FileTicketer {
        FileTicketer {
            keys: files
                .iter()
                .map(|b| TicketKey::of(b).expect("key"))
                .collect(),
            rng: SystemRandom::new(),
        }
    }

    #[test]
    fn the_first_key_seals_any_key_opens_and_a_forged_ticket_is_refused() {
        let (new, old) = ([7u8; 80], [9u8; 48]);
        let rotated = ticketer(&[&new, &old]);
        let before = ticketer(&[&old]);
        let t = before.encrypt(b"session").expect("sealed");
        assert_eq!(&t[..NAME], &old[..NAME], "named by its key");
        assert_eq!(t.len(), NAME + NONCE + 7 + 16);
        assert_eq!(rotated.decrypt(&t).as_deref(), Some(&b"session"[..]));
        let t2 = rotated.encrypt(b"session").expect("sealed");
        assert_eq!(&t2[..NAME], &new[..NAME], "the first key seals");
        assert_eq!(
            before.decrypt(&t2),
            None,
            "the old process lacks the new key"
        );
        // Every byte flipped, every truncation: refused, never a panic.
        for i in 0..t2.len() {
            let mut bad = t2.clone();
            bad[i] ^= 1;
            assert_eq!(rotated.decrypt(&bad), None, "{i}");
            assert_eq!(rotated.decrypt(&t2[..i]), None, "{i}");
        }
        assert!(TicketKey::of(&[0u8; 64]).is_err());
        assert_eq!(rotated.lifetime(), 43_200);
    }
}
