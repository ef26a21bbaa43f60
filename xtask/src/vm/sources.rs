//! Which Debian archive to fetch kernels from: the one the system's own apt sources already use
//! (deb822 `.sources` and one-line `.list` files), so the project names no mirror of its own and
//! a machine pointed at another mirror or a snapshot keeps using it.

use anyhow::Context;
use std::path::PathBuf;

/// Debian's codenames, to tell the Debian archive among the system's sources.
const CODENAMES: &[&str] = &["buster", "bullseye", "bookworm", "trixie", "forky", "sid"];

/// The Debian archive and security archive URIs the system's own apt sources use.
pub fn system_debian_uris() -> anyhow::Result<(String, String)> {
    let mut entries: Vec<(String, Vec<String>)> = Vec::new();
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = dir.filter_map(|e| e.ok().map(|e| e.path())).collect();
        more.sort();
        files.extend(more);
    }
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        match file.extension().and_then(|e| e.to_str()) {
            Some("sources") => entries.extend(deb822_entries(&text)),
            Some("list") => entries.extend(one_line_entries(&text)),
            _ => {}
        }
    }
    let pick = |security: bool| {
        entries.iter().find_map(|(uri, suites)| {
            suites
                .iter()
                .any(|s| {
                    let (base, pocket) = s.split_once('-').unwrap_or((s, ""));
                    CODENAMES.contains(&base) && (pocket == "security") == security
                })
                .then(|| uri.trim_end_matches('/').to_string())
        })
    };
    let archive = pick(false).context("the system's apt sources name no Debian archive")?;
    let security = pick(true).unwrap_or_else(|| format!("{archive}-security"));
    Ok((archive, security))
}

/// (URI, suites) of each `Types: deb` stanza of a deb822 `.sources` file.
fn deb822_entries(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for stanza in text.split("\n\n") {
        let field = |name: &str| {
            stanza
                .lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(|v| v.split_whitespace().map(String::from).collect::<Vec<_>>())
                .unwrap_or_default()
        };
        if !field("Types").iter().any(|t| t == "deb") || field("Enabled").iter().any(|e| e == "no")
        {
            continue;
        }
        let suites = field("Suites");
        for uri in field("URIs") {
            out.push((uri, suites.clone()));
        }
    }
    out
}

/// (URI, [suite]) of each `deb URI SUITE ...` line of a one-line `.list` file.
fn one_line_entries(text: &str) -> Vec<(String, Vec<String>)> {
    text.lines()
        .filter_map(|line| {
            let line = line.split('#').next()?.trim();
            let rest = line.strip_prefix("deb ")?.trim_start();
            // Skip "[options]".
            let rest = match rest.strip_prefix('[') {
                Some(r) => r.split_once(']')?.1.trim_start(),
                None => rest,
            };
            let mut words = rest.split_whitespace();
            Some((words.next()?.to_string(), vec![words.next()?.to_string()]))
        })
        .collect()
}
