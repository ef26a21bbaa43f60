//! Builds the kernel-side crate for bpfel-unknown-none with the nightly toolchain; the loader embeds
//! the object with `include_bytes_aligned!`.
use std::path::Path;

fn main() -> anyhow::Result<()> {
    let manifest = std::env::var("CARGO_MANIFEST_DIR")?;
    let kernel = Path::new(&manifest).join("../kernel");
    let kernel = kernel
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("non-UTF-8 path"))?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "zerocache-probe-ebpf",
            root_dir: kernel,
            ..Default::default()
        }],
        aya_build::Toolchain::Nightly,
    )
}
