//! Who owns a key: rendezvous (highest random weight) hashing of the primary cache key over the
//! members. Every member scores `weight / -ln(u)` with `u` a uniform hash of (key, member id) and
//! the key's order is the members by falling score; its owner is the first. Every node computes
//! the same order from the same membership, with no coordination, and a member joining or
//! leaving moves only the keys it wins or won (about 1/N of them), since no other score changes.
//! The scoring is the upstream `hash` balancer's, so both agree on what "consistent" means.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// A member as the hash sees it: its id (the data-port address every member names it by) and
/// its weight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Member {
    /// `ip:port`, the same text on every node.
    pub(crate) id: String,
    /// Relative share of keys.
    pub(crate) weight: u32,
    /// The id's hash, the seed of every key's score for this member.
    seed: u64,
}

impl Member {
    /// A member named `id` with `weight`.
    pub(crate) fn new(id: String, weight: u32) -> Member {
        let seed = xxh3_64(id.as_bytes());
        Member {
            id,
            weight: weight.max(1),
            seed,
        }
    }

    /// This member's score for `key`.
    fn score(&self, key: &[u8]) -> f64 {
        let h = xxh3_64_with_seed(key, self.seed);
        // The top 53 bits as a uniform u in (0, 1): never 0 or 1, so -ln(u) is finite and > 0.
        let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        f64::from(self.weight) / -u.ln()
    }
}

/// The members' indices in `key`'s hash order: the owner first, then who takes the key when
/// the ones before are down. Ties (practically impossible) break by id, so every node agrees.
pub(crate) fn order(members: &[Member], key: &str) -> Vec<usize> {
    let mut scored: Vec<(f64, usize)> = members
        .iter()
        .enumerate()
        .map(|(i, m)| (m.score(key.as_bytes()), i))
        .collect();
    scored.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then_with(|| members[a.1].id.cmp(&members[b.1].id))
    });
    scored.into_iter().map(|(_, i)| i).collect()
}

/// The owner of `key` (its index in `members`), `None` for no members.
pub(crate) fn owner(members: &[Member], key: &str) -> Option<usize> {
    let key = key.as_bytes();
    let mut best: Option<(f64, usize)> = None;
    for (i, m) in members.iter().enumerate() {
        let s = m.score(key);
        let better = match best {
            None => true,
            Some((b, j)) => s > b || (s == b && m.id < members[j].id),
        };
        if better {
            best = Some((s, i));
        }
    }
    best.map(|(_, i)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Vec<Member> {
        (0..n)
            .map(|i| Member::new(format!("127.0.0.{}:8080", i + 2), 1))
            .collect()
    }

    fn keys(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("GET http://example.com/obj/{i}"))
            .collect()
    }

    fn owner_id(m: &[Member], k: &str) -> String {
        m[owner(m, k).expect("members")].id.clone()
    }

    #[test]
    fn adding_or_removing_one_of_n_moves_about_one_nth_of_the_keys() {
        let keys = keys(20_000);
        for n in [3usize, 5, 8] {
            let before = members(n);
            let after = members(n + 1);
            let moved = keys
                .iter()
                .filter(|k| owner_id(&before, k) != owner_id(&after, k))
                .count();
            // Every moved key went to the new member; none moved between the old ones.
            for k in &keys {
                let (b, a) = (owner_id(&before, k), owner_id(&after, k));
                assert!(a == b || a == after[n].id, "{k} moved from {b} to {a}");
            }
            let share = moved as f64 / keys.len() as f64;
            let ideal = 1.0 / (n + 1) as f64;
            assert!(
                (share - ideal).abs() < 0.02,
                "adding the {}th member moved {share:.4} of the keys, ideally {ideal:.4}",
                n + 1
            );
            // Removing it again moves exactly those keys back.
            let back = keys
                .iter()
                .filter(|k| owner_id(&after, k) != owner_id(&before, k))
                .count();
            assert_eq!(back, moved);
        }
    }

    #[test]
    fn removing_a_member_moves_only_its_keys() {
        let keys = keys(20_000);
        let all = members(4);
        let without: Vec<Member> = all.iter().filter(|m| m.id != all[1].id).cloned().collect();
        let mut moved = 0;
        for k in &keys {
            let (b, a) = (owner_id(&all, k), owner_id(&without, k));
            if b == all[1].id {
                moved += 1;
                // It goes to its second in the full order.
                let o = order(&all, k);
                assert_eq!(a, all[o[1]].id);
            } else {
                assert_eq!(a, b, "{k} moved though its owner stayed");
            }
        }
        let share = moved as f64 / keys.len() as f64;
        assert!((share - 0.25).abs() < 0.02, "{share}");
    }

    #[test]
    fn weights_set_the_shares_and_order_agrees_with_owner() {
        let m = vec![
            Member::new("10.0.0.1:80".into(), 1),
            Member::new("10.0.0.2:80".into(), 3),
        ];
        let keys = keys(20_000);
        let heavy = keys.iter().filter(|k| owner(&m, k) == Some(1)).count();
        let share = heavy as f64 / keys.len() as f64;
        assert!((share - 0.75).abs() < 0.02, "weight 3 of 4 won {share}");
        for k in keys.iter().take(500) {
            assert_eq!(order(&m, k)[0], owner(&m, k).expect("owner"));
        }
    }

    #[test]
    fn every_node_agrees_whatever_order_it_lists_the_members_in() {
        let a = members(5);
        let mut b = a.clone();
        b.reverse();
        for k in keys(2_000) {
            assert_eq!(owner_id(&a, &k), owner_id(&b, &k));
        }
        assert_eq!(owner(&[], "k"), None);
    }
}
