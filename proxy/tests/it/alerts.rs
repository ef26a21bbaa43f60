//! The shipped alerting rules (dashboard/grafana/zerocache-alerts.yml): valid for Prometheus,
//! written against metrics a real node exports (every name in them is in a real scrape, TLS
//! listener included), and each alert fires on its cause, on the node that has it, with its exact
//! labels and annotations, while a healthy node beside it raises none.

use crate::support::*;
use crate::tls_support::*;
use std::process::Command;

fn rules() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../dashboard/grafana/zerocache-alerts.yml")
}

fn promtool(args: &[&str]) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .output()
        .expect("promtool (Debian prometheus, installed by cargo xtask setup)");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_alert_rules_are_valid_name_real_metrics_and_fire_on_their_causes() {
    if !require::command("promtool") {
        return;
    }
    let rules = rules();
    let (ok, out) = promtool(&["check", "rules", rules.to_str().expect("utf8")]);
    assert!(ok && out.contains("SUCCESS: 6 rules found"), "{out}");

    // Every metric the rules read is one a node exports, from start-up.
    let text = std::fs::read_to_string(&rules).expect("rules");
    let mut names: Vec<&str> = text
        .match_indices("zerocache_")
        .map(|(i, _)| {
            let rest = &text[i..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .filter(|n| !n.ends_with('_'))
        .collect();
    names.sort();
    names.dedup();
    let dir = tempfile::tempdir().expect("tmp");
    let files = write(dir.path(), "site", &cert(&["test.example"]));
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: listener_yaml(free_port(), &[files]),
            ..Opts::default()
        },
    );
    // One miss: the upstream families appear as servers answer.
    assert_eq!(proxy.get("/obj/10").status, 200);
    let scrape = proxy.metrics();
    for name in &names {
        assert!(
            scrape.contains(&format!("# TYPE {name} ")),
            "the rules read {name}, which /metrics does not have:\n{scrape}"
        );
    }
    assert_eq!(names.len(), 11, "{names:?}");

    // Two nodes for 100 minutes: `a` healthy, `b` with every cause at once.
    let series = |name: &str, node: &str, labels: &str, values: &str| {
        let labels = if labels.is_empty() {
            String::new()
        } else {
            format!(",{labels}")
        };
        format!(
            "      - series: '{name}{{job=\"zc\",instance=\"{node}\"{labels}}}'\n        values: '{values}'\n"
        )
    };
    let mut input = String::new();
    for (node, probe, zc, copy, code200, code502, up, writable, expires) in [
        ("a", "1", "1000", "100", "100", "0", "1", "1", 100 * 86_400),
        ("b", "0", "900", "200", "90", "10", "0", "0", 10 * 86_400),
    ] {
        input += &series("zerocache_probe_up", node, "", &format!("{probe}x100"));
        input += &series(
            "zerocache_kernel_body_bytes_total",
            node,
            "path=\"zerocopy\"",
            &format!("0+{zc}x100"),
        );
        input += &series(
            "zerocache_kernel_body_bytes_total",
            node,
            "path=\"copy\"",
            &format!("0+{copy}x100"),
        );
        // 100 bytes a minute are copies by design on both: left out of the ratio.
        input += &series(
            "zerocache_kernel_body_intended_copy_bytes_total",
            node,
            "",
            "0+100x100",
        );
        for (code, n) in [("200", code200), ("502", code502)] {
            input += &series(
                "zerocache_responses_total",
                node,
                &format!("code=\"{code}\",cache_status=\"MISS\",protocol=\"http/1.1\",route=\"0\""),
                &format!("0+{n}x100"),
            );
        }
        // Both servers of `origin` down on b; `api` keeps one up, so it is not down.
        for (upstream, server, v) in [
            ("origin", "s1", up),
            ("origin", "s2", up),
            ("api", "s3", "1"),
        ] {
            input += &series(
                "zerocache_upstream_server_up",
                node,
                &format!("upstream=\"{upstream}\",server=\"{server}\""),
                &format!("{v}x100"),
            );
        }
        input += &series(
            "zerocache_cache_writable",
            node,
            "",
            &format!("{writable}x100"),
        );
        input += &series(
            "zerocache_tls_certificate_expiry_timestamp_seconds",
            node,
            "name=\"test.example\",file=\"/etc/zerocache/site.crt\"",
            &format!("{expires}x100"),
        );
    }
    let alert = |name: &str, labels: &str, summary: &str, description: &str| {
        format!(
            "      - eval_time: 90m\n        alertname: {name}\n        exp_alerts:\n          - exp_labels: {{job: zc, instance: b{labels}}}\n            exp_annotations:\n              summary: '{summary}'\n              description: '{description}'\n"
        )
    };
    let tests = [
        alert(
            "ZerocacheProbeDown",
            ", severity: warning",
            "zerocache on b: the eBPF probe is not attached",
            "Zero-copy is not being witnessed by the kernel. See /api/probe on the dashboard for the reason.",
        ),
        // 900 of the 1,000 bytes meant for sendfile (1,100 less 100 copied by design).
        alert(
            "ZerocacheZeroCopyRatioDrop",
            ", severity: warning",
            "zerocache on b: body zero-copy ratio 90%",
            "Hits meant for sendfile were copied. zerocache_zero_copy_violations_total and the dashboard''s violations table name the connections.",
        ),
        alert(
            "Zerocache5xxRate",
            ", severity: critical",
            "zerocache on b: 10% of responses are 5xx",
            "By route: sum by (route, code) (rate(zerocache_responses_total{code=~\"5..\"}[5m])); by origin server: zerocache_upstream_requests_total.",
        ),
        alert(
            "ZerocacheUpstreamDown",
            ", upstream: origin, severity: critical",
            "zerocache on b: every server of upstream origin is down",
            "zerocache_upstream_errors_total{upstream=\"origin\"} says how they fail.",
        ),
        alert(
            "ZerocacheCacheUnwritable",
            ", severity: critical",
            "zerocache on b: the cache cannot be written",
            "Responses are passed through, not stored. zerocache_cache_write_errors_total and the log say why (disk full?).",
        ),
        // 10 days less the 90 minutes since the series began at time 0.
        alert(
            "ZerocacheCertificateExpiry",
            ", name: test.example, file: /etc/zerocache/site.crt, severity: warning",
            "zerocache on b: certificate test.example expires in 9d 22h 30m 0s",
            "Renew /etc/zerocache/site.crt and reload (systemctl reload zerocache).",
        ),
    ]
    .concat();
    let file = format!(
        "rule_files:\n  - {}\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n{input}    alert_rule_test:\n{tests}",
        rules.display()
    );
    let test_file = dir.path().join("alerts-test.yml");
    std::fs::write(&test_file, &file).expect("write");
    let (ok, out) = promtool(&["test", "rules", test_file.to_str().expect("utf8")]);
    assert!(ok, "{out}\n{file}");
}
