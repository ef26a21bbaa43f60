//! `zerocache-origin ADDR`: the demo/benchmark origin as a stand-alone process.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9000".into());
    let origin = zerocache_origin::Origin::bind(&addr).await?;
    println!("zerocache-origin listening on {}", origin.addr());
    tokio::signal::ctrl_c().await?;
    Ok(())
}
