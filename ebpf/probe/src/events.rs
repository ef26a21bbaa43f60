//! The ring-buffer reader: close, close_range and process-exit events from the kernel become
//! closed-fd records, kept in the bounded history and broadcast to subscribers; and the periodic
//! re-resolution of the watch targets.

use crate::maps::take_records;
use crate::model::{ClosedFd, FdCounts};
use crate::probe::{Probe, RESOLVE_EVERY};
use crate::watching::{drop_closed, retire};
use aya::maps::{MapData, RingBuf};
use std::sync::Arc;
use tokio::io::unix::AsyncFd;
use zerocache_probe_common::{Event, event};

impl Probe {
    pub(crate) fn spawn_reader(&self, ring: RingBuf<MapData>) {
        let probe = self.clone();
        tokio::spawn(async move {
            // SAFETY: the ring buffer owns its fd and the AsyncFd owns the ring buffer, so the fd
            // stays open for as long as it is registered.
            let mut fd = match unsafe { AsyncFd::register(ring) } {
                Ok(fd) => fd,
                Err(e) => {
                    tracing::error!(error = %e, "probe ring buffer cannot be polled");
                    return;
                }
            };
            loop {
                let mut guard = match fd.readable_mut().await {
                    Ok(g) => g,
                    Err(e) => {
                        tracing::error!(error = %e, "probe ring buffer poll failed");
                        return;
                    }
                };
                let ring = guard.get_inner_mut();
                let mut batch = Vec::new();
                while let Some(item) = ring.next() {
                    if item.len() >= size_of::<Event>() {
                        // SAFETY: the kernel wrote exactly one Event; read_unaligned copes with
                        // the ring's 8-byte alignment.
                        batch.push(unsafe {
                            std::ptr::read_unaligned(item.as_ptr() as *const Event)
                        });
                    }
                }
                guard.clear_ready();
                // Peers first: a connection's close may be in the same batch as its accept.
                probe.resolve_accepted(&batch);
                for ev in batch {
                    probe.handle_event(ev);
                }
            }
        });
    }

    pub(crate) fn spawn_resolver(&self) {
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RESOLVE_EVERY);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                Probe { inner }.resolve_targets();
            }
        });
    }

    fn handle_event(&self, ev: Event) {
        match ev.event {
            event::FD_CLOSED => {
                let r = ClosedFd::new(
                    ev.tgid,
                    ev.fd,
                    ev.record.info.generation,
                    ev.record.info.flags,
                    FdCounts::from_record(&ev.record),
                );
                self.inner.state.lock().closed.push(r.clone());
                let _ = self.inner.closed_tx.send(r);
            }
            event::CLOSE_RANGE => {
                let Some(maps) = &self.inner.maps else { return };
                let closed = {
                    let mut maps = maps.lock();
                    let index = maps.watched.get(&ev.tgid, 0).ok();
                    take_records(&mut maps, ev.tgid, index, ev.fd..=ev.fd_last)
                };
                self.push_closed(closed);
            }
            event::PROCESS_EXIT => {
                let Some(maps) = &self.inner.maps else { return };
                let mut st = self.inner.state.lock();
                if let Some(comm) = st.watching.remove(&ev.tgid) {
                    let closed = retire(&mut maps.lock(), ev.tgid, comm, &mut st);
                    drop(st);
                    drop_closed(&self.inner.closed_tx, closed);
                }
            }
            _ => {}
        }
    }

    fn push_closed(&self, closed: Vec<ClosedFd>) {
        let mut st = self.inner.state.lock();
        for r in &closed {
            st.closed.push(r.clone());
        }
        drop(st);
        drop_closed(&self.inner.closed_tx, closed);
    }
}
