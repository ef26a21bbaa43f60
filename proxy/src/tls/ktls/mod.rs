//! Kernel TLS: after rustls completes a handshake on the `tls:` listener, the session's keys go
//! to the kernel (`TCP_ULP "tls"`, then `SOL_TLS`/`TLS_TX` and `TLS_RX`), and the connection
//! goes on as a plain socket that the kernel encrypts: hits leave with sendfile again, the head
//! in one send with `MSG_MORE`, exactly as on plain connections, and the probe can see it.
//!
//! - [`detect`]: whether the kernel has the ULP, and which versions and ciphers it takes.
//! - [`crypto_info`]: the kernel's key structs from rustls's secrets.
//! - [`handshake_io`]: the socket under the handshake, read one TLS record at a time so that
//!   nothing past the handshake is read into rustls (it would be lost to the kernel).
//! - [`handover`]: the hand-over itself, or why a connection stays in user space.
//! - [`stream`]: the socket afterwards: reads that tell data from alerts and handshake
//!   messages (`TLS_GET_RECORD_TYPE`), and the closing alert sent through the kernel.
//!
//! The buffered rustls connection that tokio-rustls holds is what is handed over
//! (`dangerous_extract_secrets`): it gives keys, IVs and sequence numbers but no traffic
//! secret, so no key can be updated afterwards. That matches the kernels users run: Linux takes
//! new receive keys only from 6.14. A client's KeyUpdate therefore ends the connection cleanly
//! (close_notify, then close) instead of a decryption error; nothing it sent before is lost.

pub mod crypto_info;
pub mod detect;
pub mod handover;
pub mod handshake_io;
pub mod stream;

pub use detect::{Ktls, Offload, offered};
