//! Library face of the kernel crate: empty. It exists so the loader can name this crate as a
//! build-dependency, which makes cargo rerun the loader's build.rs when the probe changes.
#![no_std]
