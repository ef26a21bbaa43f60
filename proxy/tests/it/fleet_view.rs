//! The fleet's view from outside, checked against the metrics of three real nodes: every fleet
//! family is documented and valid for promtool; the recording rules (dashboard/grafana/
//! fleet-rules.yml), evaluated by `promtool test rules` on the counters the nodes really
//! reported, give the fleet's true hit ratio and origin requests; the Grafana fleet dashboard
//! uses only real families and rules, with fleet totals and a per-node row.

use crate::support::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn grafana_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboard/grafana")
}

/// Every sample of a `/metrics` text: series (name and labels as printed) → value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            Some((series.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// `series` with `job` and `instance` labels added.
fn labelled(series: &str, instance: &str) -> String {
    let extra = format!("job=\"zerocache\",instance=\"{instance}\"");
    match series.split_once('{') {
        Some((name, rest)) => format!("{name}{{{extra},{rest}"),
        None => format!("{series}{{{extra}}}"),
    }
}

fn promtool(args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut p = Command::new("promtool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian prometheus, installed by cargo xtask setup)");
    if let Some(s) = stdin {
        use std::io::Write;
        p.stdin
            .take()
            .expect("stdin")
            .write_all(s.as_bytes())
            .expect("write");
    }
    drop(p.stdin.take());
    let out = p.wait_with_output().expect("promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn recording_rules_and_the_fleet_dashboard_hold_on_real_metrics() {
    if !require::command("promtool") {
        return;
    }
    let probe = require::is_root();
    let (origin, _rt) = origin();
    let f = TestFleet::start(origin.addr(), 3, "", probe);
    let before: Vec<_> = (0..3).map(|n| samples(&f.metrics(n))).collect();
    // 60 objects: asked on node 0 (60 misses reach the origin), then on nodes 1 and 2 (hits,
    // on the node or relayed from the owner's). 180 client requests, 120 fleet hits.
    let paths: Vec<String> = (0..60).map(|i| format!("/obj/{}", 2000 + i)).collect();
    for n in 0..3 {
        let mut c = f.client(n);
        for p in &paths {
            assert_eq!(c.get(p, &[]).status, 200);
        }
    }
    let texts: Vec<String> = (0..3).map(|n| f.metrics(n)).collect();
    // The fleet families: documented, and the text valid for Prometheus.
    let docs = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/dashboard-and-metrics.md"),
    )
    .expect("docs");
    let families: Vec<&str> = texts[0]
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .filter(|n| n.starts_with("zerocache_"))
        .collect();
    assert!(families.contains(&"zerocache_fleet_peer_up"));
    for name in &families {
        assert!(docs.contains(&format!("`{name}`")), "{name} not documented");
    }
    let (ok, out) = promtool(&["check", "metrics"], Some(&texts[0]));
    assert!(ok, "{out}");

    // Input series: each real counter rising by what it really rose by, per minute, for ten
    // minutes (a straight line: rate() is exactly the slope, no extrapolation).
    let families_used = [
        "zerocache_requests_total",
        "zerocache_fleet_peer_requests_total",
        "zerocache_kernel_body_bytes_total",
        "zerocache_kernel_body_intended_copy_bytes_total",
        "zerocache_upstream_requests_total",
        "zerocache_fleet_peer_up",
    ];
    let mut input = String::new();
    let mut sums: BTreeMap<&str, f64> = BTreeMap::new();
    for (n, text) in texts.iter().enumerate() {
        let instance = f.nodes[n].dashboard.to_string();
        for (series, v1) in samples(text) {
            let name = series.split('{').next().unwrap_or("");
            if !families_used.contains(&name) {
                continue;
            }
            let v0 = before[n].get(&series).copied().unwrap_or(0.0);
            let d = v1 - v0;
            let gauge = name == "zerocache_fleet_peer_up";
            let values = if gauge {
                format!("{v1}x10")
            } else {
                format!("{v0}+{d}x10")
            };
            input.push_str(&format!(
                "      - series: '{}'\n        values: '{values}'\n",
                labelled(&series, &instance)
            ));
            if series.starts_with("zerocache_requests_total{") {
                *sums.entry("requests").or_default() += d;
                if series.contains("cache_status=\"HIT\"") {
                    *sums.entry("hits").or_default() += d;
                }
            } else if name == "zerocache_fleet_peer_requests_total" {
                *sums.entry("peer").or_default() += d;
            } else if name == "zerocache_upstream_requests_total" && !series.contains("peer:") {
                *sums.entry("origin").or_default() += d;
            } else if name == "zerocache_kernel_body_bytes_total" {
                *sums.entry("kernel").or_default() += d;
                if series.contains("zerocopy") {
                    *sums.entry("kernel_zc").or_default() += d;
                }
            } else if name == "zerocache_kernel_body_intended_copy_bytes_total" {
                *sums.entry("kernel_intended").or_default() += d;
            }
        }
    }
    // What the counters say is what happened.
    assert_eq!(sums["requests"] - sums["peer"], 180.0, "{sums:?}");
    assert_eq!(sums["hits"], 120.0, "{sums:?}");
    assert_eq!(sums["origin"], 60.0, "{sums:?}");
    let mut expect = vec![
        ("job:zerocache_fleet_hit_ratio:rate5m", 120.0 / 180.0),
        ("job:zerocache_fleet_client_requests:rate5m", 180.0 / 60.0),
        ("job:zerocache_fleet_origin_requests:rate5m", 1.0),
    ];
    if probe {
        assert!(sums.get("kernel").copied().unwrap_or(0.0) > 0.0, "{sums:?}");
        // The body zero-copy ratio: copies by design (the relays from owners) left out.
        let intended = sums.get("kernel_intended").copied().unwrap_or(0.0);
        expect.push((
            "job:zerocache_fleet_zero_copy_ratio:rate5m",
            sums["kernel_zc"] / (sums["kernel"] - intended),
        ));
    }
    // promtool 2.42 compares floats exactly: compare in millionths.
    let mut tests = String::new();
    for (rule, v) in &expect {
        tests.push_str(&format!(
            "      - expr: round({rule} * 1e6)\n        eval_time: 10m\n        exp_samples:\n          - labels: '{{job=\"zerocache\"}}'\n            value: {}\n",
            (v * 1e6).round()
        ));
    }
    let rules = grafana_dir().join("fleet-rules.yml");
    let file = format!(
        "rule_files:\n  - {}\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n{input}    promql_expr_test:\n{tests}",
        rules.display()
    );
    let tmp = tempfile::tempdir().expect("tmp");
    let test_file = tmp.path().join("fleet-rules-test.yml");
    std::fs::write(&test_file, &file).expect("write");
    let (ok, out) = promtool(&["test", "rules", test_file.to_str().expect("utf8")], None);
    assert!(ok, "{out}\n{file}");
    let (ok, out) = promtool(
        &[
            "check",
            "config",
            grafana_dir()
                .join("fleet-prometheus.yml")
                .to_str()
                .expect("p"),
        ],
        None,
    );
    assert!(ok, "{out}");

    // The Grafana fleet dashboard: fleet totals from the rules, a row per node.
    let rule_names: Vec<String> = std::fs::read_to_string(&rules)
        .expect("rules")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- record: "))
        .map(str::to_string)
        .collect();
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(grafana_dir().join("zerocache-fleet.json")).expect("read"),
    )
    .expect("json");
    let panels = dash["panels"].as_array().expect("panels");
    let repeated = panels
        .iter()
        .filter(|p| p["type"] == "row" && p["repeat"] == "instance")
        .count();
    assert_eq!(repeated, 1, "one row repeated per node");
    let mut totals = 0;
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        assert!(panel["fieldConfig"]["defaults"]["unit"].is_string());
        for t in panel["targets"].as_array().expect("targets") {
            let expr = t["expr"].as_str().expect("expr");
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')) {
                if word.starts_with("job:") || word.starts_with("instance:") {
                    assert!(rule_names.iter().any(|r| r == word), "unknown rule {word}");
                    totals += 1;
                } else if word.starts_with("zerocache_") {
                    assert!(
                        texts[0].contains(&format!("# TYPE {word} ")),
                        "panel {} uses unknown metric {word}",
                        panel["title"]
                    );
                    assert!(expr.contains("instance=~\"$instance\""), "{expr}");
                }
            }
        }
    }
    assert!(totals >= 4, "fleet totals come from the recording rules");
}
