//! Connecting to `https://` upstream servers (not yet).
