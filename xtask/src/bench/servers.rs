//! The servers a bench runs: the origin, nginx (proxy_cache with `tcp_nopush` on and off, and
//! static files) and zerocache, each started on loopback, warmed and its warm bodies checked.

use super::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Server {
    Zerocache,
    NginxNopush,
    NginxNoNopush,
    NginxStatic,
    ZerocacheNoProbe,
}

impl Server {
    pub(crate) const ALL: [Server; 5] = [
        Server::Zerocache,
        Server::NginxNopush,
        Server::NginxNoNopush,
        Server::NginxStatic,
        Server::ZerocacheNoProbe,
    ];
    pub(crate) fn name(self) -> &'static str {
        match self {
            Server::Zerocache => "zerocache",
            Server::ZerocacheNoProbe => "zerocache (probe off)",
            Server::NginxNopush => "nginx proxy_cache (tcp_nopush on)",
            Server::NginxNoNopush => "nginx proxy_cache (tcp_nopush off)",
            Server::NginxStatic => "nginx static",
        }
    }
    pub(crate) fn short(self) -> &'static str {
        match self {
            Server::Zerocache => "zc",
            Server::ZerocacheNoProbe => "zc",
            Server::NginxNopush => "ngx-np",
            Server::NginxNoNopush => "ngx",
            Server::NginxStatic => "static",
        }
    }
}

pub(crate) struct Running {
    pub(crate) child: Child,
    pub(crate) addr: SocketAddr,
    /// zerocache's dashboard (for its /metrics); None for nginx.
    pub(crate) dashboard: Option<SocketAddr>,
}

impl Drop for Running {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn wait_listening(
    addr: SocketAddr,
    child: &mut Child,
    what: &str,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_err() {
        if let Some(status) = child.try_wait()? {
            bail!("{what} exited before listening ({status})");
        }
        anyhow::ensure!(Instant::now() < deadline, "{what} did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The demo origin as its own process, on a free port.
pub(crate) fn start_origin() -> anyhow::Result<Running> {
    let port = free_port()?;
    let mut child = Command::new(root().join("target/release/zerocache-origin"))
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .spawn()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    wait_listening(addr, &mut child, "origin")?;
    Ok(Running {
        child,
        addr,
        dashboard: None,
    })
}

pub(crate) fn nginx_conf(
    dir: &Path,
    port: u16,
    origin: SocketAddr,
    server: Server,
    workers: usize,
    affinity: bool,
) -> String {
    let d = dir.display();
    let common = nginx_prelude(dir, workers, affinity);
    let body = match server {
        Server::NginxStatic => {
            format!("  server {{ listen 127.0.0.1:{port}; root {d}/www; tcp_nopush off; }}\n}}\n")
        }
        _ => {
            let nopush = if server == Server::NginxNopush {
                "on"
            } else {
                "off"
            };
            format!(
                "  tcp_nopush {nopush};
  proxy_cache_path {d}/cache levels=1:2 keys_zone=zc:10m max_size=4g inactive=60m use_temp_path=off;
  upstream origin {{ server {origin}; keepalive 32; }}
  server {{ listen 127.0.0.1:{port};
    location / {{ proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection \"\";
      proxy_cache zc; proxy_cache_valid 200 60m; add_header X-Cache $upstream_cache_status; }} }}
}}
"
            )
        }
    };
    common + &body
}

pub(crate) fn start_nginx(
    base: &Path,
    origin: SocketAddr,
    server: Server,
    workers: usize,
    affinity: bool,
) -> anyhow::Result<Running> {
    let dir = base.join(server.short());
    std::fs::create_dir_all(dir.join("www/obj"))?;
    if server == Server::NginxStatic {
        for s in SIZES {
            let f = dir.join(format!("www/obj/{s}"));
            if !f.exists() {
                std::fs::write(&f, zerocache_origin::body(s))?;
            }
        }
    }
    let port = free_port()?;
    let conf = nginx_conf(&dir, port, origin, server, workers, affinity);
    spawn_nginx(&dir, &conf, port, server.name())
}

/// The first lines of every bench nginx's config, up to the `http` block's shared settings:
/// `workers` processes (pinned one per CPU with `affinity`), files under `dir`.
pub(crate) fn nginx_prelude(dir: &Path, workers: usize, affinity: bool) -> String {
    let d = dir.display();
    let affinity = if affinity {
        "worker_cpu_affinity auto; "
    } else {
        ""
    };
    format!(
        "user root root; worker_processes {workers}; {affinity}daemon off; pid {d}/nginx.pid; error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off; sendfile on; tcp_nodelay on; keepalive_requests 10000000; keepalive_timeout 60;
  client_body_temp_path {d}/cb; proxy_temp_path {d}/pt; fastcgi_temp_path {d}/ft; uwsgi_temp_path {d}/ut; scgi_temp_path {d}/st;
"
    )
}

/// Writes `conf` to `dir/nginx.conf`, starts nginx on it and waits until it listens on `port`.
pub(crate) fn spawn_nginx(
    dir: &Path,
    conf: &str,
    port: u16,
    what: &str,
) -> anyhow::Result<Running> {
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf)?;
    let mut child = Command::new("nginx")
        .args(["-e", &format!("{}/error.log", dir.display()), "-p"])
        .arg(dir)
        .arg("-c")
        .arg(&path)
        .stdout(Stdio::null())
        .spawn()
        .context("starting nginx (installed by cargo xtask setup)")?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    wait_listening(addr, &mut child, what)?;
    Ok(Running {
        child,
        addr,
        dashboard: None,
    })
}

/// zerocache's `workers.cpu_affinity` for the mode: its default, or like nginx's workers. With
/// `--pin`, taskset puts every server thread on CPU 0, so zerocache must not pin (or steer by)
/// CPUs of its own.
pub(crate) fn zc_affinity(opts: &Options) -> &'static str {
    match (opts.affinity, opts.unpinned || opts.pin) {
        (true, _) => "true",
        (false, true) => "false",
        (false, false) => "auto",
    }
}

pub(crate) fn start_zerocache(
    base: &Path,
    port: u16,
    origin: SocketAddr,
    probe: bool,
    affinity: &str,
) -> anyhow::Result<Running> {
    start_zerocache_with(base, port, origin, probe, true, affinity)
}

pub(crate) fn start_zerocache_with(
    base: &Path,
    port: u16,
    origin: SocketAddr,
    probe: bool,
    offload: bool,
    affinity: &str,
) -> anyhow::Result<Running> {
    let dir = base.join("zc");
    std::fs::create_dir_all(&dir)?;
    let dport = free_port()?;
    let conf = dir.join("zerocache.yaml");
    std::fs::write(
        &conf,
        format!(
            "listen: 127.0.0.1:{port}\ncache:\n  path: {}\n  max_size: 4GiB\n  offload_cold_hits: {offload}\nupstreams:\n  origin:\n    servers: [\"{origin}\"]\nroutes:\n  - match: {{ host: \"*\", path_prefix: / }}\n    upstream: origin\ndashboard:\n  listen: 127.0.0.1:{dport}\nprobe:\n  enabled: {probe}\nworkers:\n  cpu_affinity: {affinity}\nlogging:\n  level: warn\n",
            dir.join("cache").display()
        ),
    )?;
    let mut child = Command::new(root().join("target/release/zerocache"))
        .args(["run", "--config"])
        .arg(&conf)
        .spawn()
        .context("starting zerocache")?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    wait_listening(addr, &mut child, "zerocache")?;
    Ok(Running {
        child,
        addr,
        dashboard: Some(format!("127.0.0.1:{dport}").parse()?),
    })
}

/// Warms `addr` for every size and checks the warm bodies byte for byte.
pub(crate) fn warm(addr: SocketAddr, server: Server, sizes: &[usize]) -> anyhow::Result<()> {
    let mut c = SimpleClient::connect(addr)?;
    for &s in sizes {
        let path = format!("/obj/{s}");
        let expected = zerocache_origin::body(s);
        for attempt in 0..3 {
            let r = c.get("bench", &path, false)?;
            anyhow::ensure!(
                r.status == 200,
                "{}: {path} answered {}",
                server.name(),
                r.status
            );
            anyhow::ensure!(
                r.body == expected,
                "{}: {path} body differs from the origin's",
                server.name()
            );
            let hit = server == Server::NginxStatic || r.header("x-cache") == Some("HIT");
            if hit {
                break;
            }
            anyhow::ensure!(
                attempt < 2,
                "{}: {path} is not a cache hit when warm",
                server.name()
            );
        }
    }
    Ok(())
}

/// nginx with its slice module in front of `origin` (`bench --slices`): `slice 4m;`, the slice
/// range in the key, `proxy_cache_lock`, as its documentation configures it.
pub(crate) fn start_nginx_slice(dir: &Path, origin: SocketAddr) -> anyhow::Result<Running> {
    std::fs::create_dir_all(dir)?;
    let d = dir.display();
    let port = free_port()?;
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let conf = format!(
        "{}  proxy_cache_path {d}/cache levels=1:2 keys_zone=zc:10m max_size=4g inactive=60m use_temp_path=off;
  upstream origin {{ server {origin}; keepalive 32; }}
  server {{ listen 127.0.0.1:{port};
    location / {{ slice 4m; proxy_cache zc; proxy_cache_key $uri$is_args$args$slice_range;
      proxy_set_header Range $slice_range; proxy_cache_valid 200 206 60m; proxy_cache_lock on;
      proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection \"\";
      add_header X-Cache $upstream_cache_status; }} }}
}}
",
        nginx_prelude(dir, workers, false)
    );
    spawn_nginx(dir, &conf, port, "nginx slice")
}
