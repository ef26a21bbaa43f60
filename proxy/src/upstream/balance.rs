//! Which server of a group a request goes to, by nginx's three methods:
//!
//! - `round_robin`: smooth weighted round robin, exactly nginx's: every pick adds each eligible
//!   server's weight to its running score, takes the highest (earliest on a tie) and subtracts the
//!   total from it. Weights 3:1 give `A A B A`, spread out rather than bunched, and any window of
//!   `sum(weights)` picks follows the weights exactly.
//! - `least_conn`: the fewest requests in flight relative to weight; ties go round robin among the
//!   tied, as nginx does.
//! - `hash`: rendezvous (highest random weight) hashing of the request's cache key: each server
//!   scores `weight / -ln(u)` with `u` a uniform hash of (key, server), and the highest wins. One
//!   object always reaches the same server (its cache, its connection), and removing a server
//!   only moves the keys it won, since nobody else's score changes. A down server's keys go to
//!   their second-highest, and come back when it is up.
//!
//! Down servers are skipped; when no untried server is up, the down ones are tried anyway (with
//! every server down, nginx tries them too rather than fail outright).

use super::peer::Peer;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Instant;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};
use zerocache_config::Balance;

/// A group's balancing method and its round-robin state.
pub(crate) struct Balancer {
    method: Balance,
    /// Smooth weighted round robin's running score per server.
    current: Mutex<Vec<i64>>,
}

impl Balancer {
    /// A balancer for `n` servers.
    pub(crate) fn new(method: Balance, n: usize) -> Balancer {
        Balancer {
            method,
            current: Mutex::new(vec![0; n]),
        }
    }

    /// The next server to try for the request with cache key `key` that has already tried
    /// `tried` (in this request), or `None` when every server has been tried.
    pub(crate) fn pick(
        &self,
        peers: &[Arc<Peer>],
        key: &str,
        tried: &[usize],
        now: Instant,
    ) -> Option<usize> {
        let untried = || (0..peers.len()).filter(|i| !tried.contains(i));
        let mut candidates: Vec<usize> = untried().filter(|&i| peers[i].is_up(now)).collect();
        if candidates.is_empty() {
            candidates = untried().collect();
        }
        if candidates.is_empty() {
            return None;
        }
        Some(match self.method {
            Balance::RoundRobin => self.round_robin(peers, &candidates),
            Balance::LeastConn => {
                // a/w < b/v as a*v < b*w: exact, whatever the weights.
                let load = |i: usize| (peers[i].active() as u128, peers[i].weight as u128);
                let (mut a, mut w) = load(candidates[0]);
                for &i in &candidates[1..] {
                    let (b, v) = load(i);
                    if b * w < a * v {
                        (a, w) = (b, v);
                    }
                }
                let least: Vec<usize> = candidates
                    .iter()
                    .copied()
                    .filter(|&i| {
                        let (b, v) = load(i);
                        b * w == a * v
                    })
                    .collect();
                self.round_robin(peers, &least)
            }
            Balance::Hash => rendezvous(peers, key, &candidates),
        })
    }

    fn round_robin(&self, peers: &[Arc<Peer>], candidates: &[usize]) -> usize {
        let mut current = self.current.lock();
        let mut total = 0i64;
        let mut best = candidates[0];
        for &i in candidates {
            let w = i64::from(peers[i].weight);
            total += w;
            current[i] += w;
            if current[i] > current[best] {
                best = i;
            }
        }
        current[best] -= total;
        best
    }
}

/// The candidate with the highest rendezvous score for `key`.
fn rendezvous(peers: &[Arc<Peer>], key: &str, candidates: &[usize]) -> usize {
    let score = |i: usize| {
        let p = &peers[i];
        let h = xxh3_64_with_seed(key.as_bytes(), xxh3_64(p.addr.as_bytes()));
        // The top 53 bits as a uniform u in (0, 1): never 0 or 1, so -ln(u) is finite and > 0.
        let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        f64::from(p.weight) / -u.ln()
    };
    let mut best = candidates[0];
    let mut best_score = score(best);
    for &i in &candidates[1..] {
        let s = score(i);
        if s > best_score {
            (best, best_score) = (i, s);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use zerocache_config::ServerSpec;

    fn peers(weights: &[u32]) -> Vec<Arc<Peer>> {
        weights
            .iter()
            .enumerate()
            .map(|(i, &weight)| {
                Arc::new(Peer::new(&ServerSpec {
                    addr: format!("10.0.0.{i}:80"),
                    weight,
                    max_fails: 1,
                    fail_timeout: Duration::from_secs(10),
                }))
            })
            .collect()
    }

    #[test]
    fn smooth_weighted_round_robin_is_nginx_s_sequence() {
        let p = peers(&[5, 1, 1]);
        let b = Balancer::new(Balance::RoundRobin, p.len());
        let now = Instant::now();
        let seq: Vec<usize> = (0..14)
            .map(|_| b.pick(&p, "", &[], now).unwrap_or(9))
            .collect();
        // nginx's documented sequence for 5:1:1 is a a b a c a a, and it repeats.
        assert_eq!(seq, [0, 0, 1, 0, 2, 0, 0, 0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn down_servers_are_skipped_and_tried_when_all_are_down() {
        let p = peers(&[1, 1, 1]);
        let b = Balancer::new(Balance::RoundRobin, p.len());
        let now = Instant::now();
        assert!(p[1].record(super::super::peer::Outcome::Failed("connect"), now));
        let seq: Vec<usize> = (0..4)
            .map(|_| b.pick(&p, "", &[], now).unwrap_or(9))
            .collect();
        assert_eq!(seq, [0, 2, 0, 2]);
        // Retries within one request skip what was tried; the down one comes last.
        assert_eq!(b.pick(&p, "", &[0, 2], now), Some(1));
        assert_eq!(b.pick(&p, "", &[0, 1, 2], now), None);
        p[0].set_checked(false);
        p[2].set_checked(false);
        // All down: tried anyway.
        assert!(b.pick(&p, "", &[], now).is_some());
    }

    #[test]
    fn least_conn_prefers_the_idle_relative_to_weight() {
        let p = peers(&[1, 2]);
        let b = Balancer::new(Balance::LeastConn, p.len());
        let now = Instant::now();
        let _a = p[0].in_flight();
        assert_eq!(b.pick(&p, "", &[], now), Some(1));
        let _b1 = p[1].in_flight();
        // 1/1 against 1/2: still the heavier one.
        assert_eq!(b.pick(&p, "", &[], now), Some(1));
        let _b2 = p[1].in_flight();
        // 1/1 against 2/2: a tie, broken by weighted round robin.
        let ties: Vec<usize> = (0..3)
            .map(|_| b.pick(&p, "", &[], now).unwrap_or(9))
            .collect();
        assert_eq!(ties, [1, 0, 1]);
    }

    #[test]
    fn rendezvous_moves_only_the_removed_server_s_keys() {
        let all = peers(&[1, 1, 1, 1]);
        let b = Balancer::new(Balance::Hash, all.len());
        let now = Instant::now();
        let keys: Vec<String> = (0..2000).map(|i| format!("GET http://h/obj/{i}")).collect();
        let before: Vec<usize> = keys
            .iter()
            .map(|k| b.pick(&all, k, &[], now).unwrap_or(9))
            .collect();
        // Every server wins some keys, and the same key always wins the same server.
        for s in 0..4 {
            let n = before.iter().filter(|&&w| w == s).count();
            assert!((350..650).contains(&n), "server {s} won {n} of 2000");
        }
        assert_eq!(b.pick(&all, &keys[7], &[], now), Some(before[7]));
        // Without server 2 (same addresses, so same scores): only its keys move.
        let rest: Vec<Arc<Peer>> = [0, 1, 3].iter().map(|&i| all[i].clone()).collect();
        let b3 = Balancer::new(Balance::Hash, rest.len());
        for (k, &was) in keys.iter().zip(&before) {
            let now_at = [0, 1, 3][b3.pick(&rest, k, &[], now).unwrap_or(0)];
            if was != 2 {
                assert_eq!(now_at, was, "{k} moved");
            }
        }
        // Weights count: 3:1 gives about three quarters.
        let w = peers(&[3, 1]);
        let bw = Balancer::new(Balance::Hash, 2);
        let first = keys
            .iter()
            .filter(|k| bw.pick(&w, k, &[], now) == Some(0))
            .count();
        assert!(
            (1350..1650).contains(&first),
            "weight 3 won {first} of 2000"
        );
    }
}
