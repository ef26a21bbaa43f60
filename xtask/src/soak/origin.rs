//! The origin, in this process on its own runtime: killable and restartable on the same port,
//! and switchable into the fault modes (truncating, hanging up, stalling).

use super::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum OriginMode {
    Normal,
    Truncating,
    Stalling,
}

pub(crate) struct OriginCtl {
    pub(crate) addr: String,
    pub(crate) objects: Arc<Vec<Object>>,
    pub(crate) bodies: Arc<Bodies>,
    pub(crate) running: Option<(tokio::runtime::Runtime, Origin)>,
}

impl OriginCtl {
    /// Binds (retrying while the old socket goes away) and scripts every object. The scripts are
    /// built first, so the origin answers with them (not its 404s) almost from its first accept.
    pub(crate) fn start(&mut self) -> anyhow::Result<()> {
        let scripts = self.scripts(OriginMode::Normal, true);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("soak-origin")
                .enable_all()
                .build()?;
            match rt.block_on(Origin::bind(&self.addr)) {
                Ok(o) => {
                    self.running = Some((rt, o));
                    break;
                }
                Err(e) => {
                    rt.shutdown_background();
                    if Instant::now() > deadline {
                        return Err(e)
                            .with_context(|| format!("binding the origin on {}", self.addr));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        self.install(scripts);
        Ok(())
    }

    /// Stops accepting and drops every connection (the runtime and all its tasks go).
    pub(crate) fn kill(&mut self) {
        if let Some((rt, origin)) = self.running.take() {
            drop(origin);
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }

    /// Scripts the flaky objects for `mode`.
    pub(crate) fn script(&self, mode: OriginMode) {
        self.install(self.scripts(mode, false));
    }

    pub(crate) fn install(&self, scripts: Vec<Script>) {
        let Some((_, o)) = &self.running else { return };
        for (path, reply, by_inm) in scripts {
            o.script(&path, reply);
            if let Some(replies) = by_inm {
                let replies = replies
                    .iter()
                    .map(|(k, r)| (k.as_deref(), r.clone()))
                    .collect();
                o.script_by_header(&path, "if-none-match", replies);
            }
        }
    }

    /// The scripts of the flaky objects for `mode` (and, with `all`, of every other object too).
    pub(crate) fn scripts(&self, mode: OriginMode, all: bool) -> Vec<Script> {
        let mut out = Vec::new();
        let mut k = 0;
        for obj in self.objects.iter() {
            if !all && !obj.family.flaky() {
                continue;
            }
            let mut headers = vec![
                ("Cache-Control", obj.family.cache_control()),
                ("Content-Type", "application/octet-stream"),
            ];
            if let Some(e) = &obj.etag {
                headers.push(("ETag", e.as_str()));
            }
            let mut reply = Reply::ok(self.bodies[&obj.size].clone()).headers(&headers);
            if obj.family == Family::Chunked {
                reply = reply.framing(Framing::Chunked(8192));
            }
            if obj.family.flaky() {
                reply = match mode {
                    OriginMode::Normal => reply,
                    OriginMode::Truncating if k == 4 => Reply::hang_up(),
                    OriginMode::Truncating => reply.framing(Framing::Truncate(obj.size / 2)),
                    // Before the head, longer than the proxy's read timeout.
                    OriginMode::Stalling if k % 3 == 0 => reply.delay(Duration::from_secs(4)),
                    // Mid-body: half, a pause, the rest; shorter or longer than the timeout.
                    OriginMode::Stalling => {
                        let pause = if k % 3 == 1 { 1 } else { 4 };
                        reply.trickle(obj.size / 2 + 1, Duration::from_secs(pause))
                    }
                };
                k += 1;
            }
            let mut by_inm = None;
            if obj.family == Family::Flaky
                && let Some(etag) = &obj.etag
            {
                // Revalidation answers 304 normally; during a fault the plain (faulty) script.
                by_inm = Some(if mode == OriginMode::Normal {
                    vec![(
                        Some(etag.clone()),
                        Reply::ok(Vec::new()).status(304).headers(&[
                            ("Cache-Control", obj.family.cache_control()),
                            ("ETag", etag.as_str()),
                        ]),
                    )]
                } else {
                    Vec::new()
                });
            }
            out.push((obj.path.clone(), reply, by_inm));
        }
        out
    }
}

/// A path's script: its reply, and the replies by `If-None-Match` value if it has them.
pub(crate) type Script = (String, Reply, Option<Vec<(Option<String>, Reply)>>);
