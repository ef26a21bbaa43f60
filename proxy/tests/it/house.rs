//! The house in numbers: what the docs say of the code's shape, held to the code. A count that a
//! change moves fails here with the new number, so the README and docs/architecture.md are
//! changed with the code instead of drifting (the README said 20 `unsafe` sites when there were
//! 38, and "every module pub(crate)" when 7 were `pub`). And no file's code (its tests aside)
//! is over 500 lines: a file a newcomer can read whole.

use std::path::{Path, PathBuf};

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_path_buf()
}

/// The user-space crates' sources: what the README's `unsafe` count covers.
const USER_SPACE: [&str; 6] = [
    "proxy/src",
    "proxy/ledger/src",
    "proxy/ops/src",
    "dashboard/src",
    "config/src",
    "ebpf/probe/src",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `unsafe` blocks, functions and impls in `text`, comments aside.
fn unsafe_sites(text: &str) -> usize {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .map(|code| {
            ["unsafe {", "unsafe fn", "unsafe impl"]
                .iter()
                .map(|p| code.matches(p).count())
                .sum::<usize>()
        })
        .sum()
}

/// The number written just before `marker` in `text` (as in "has 42 `unsafe` blocks").
fn number_before(text: &str, marker: &str) -> Option<usize> {
    let at = text.find(marker)?;
    let before = text[..at].trim_end();
    let digits: String = before
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_digit())
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    digits.parse().ok()
}

#[test]
fn the_readme_counts_the_unsafe_sites_there_are() {
    let mut files = Vec::new();
    for d in USER_SPACE {
        rust_files(&root().join(d), &mut files);
    }
    let sites: usize = files
        .iter()
        .map(|f| unsafe_sites(&std::fs::read_to_string(f).expect("source")))
        .sum();
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README");
    let said = number_before(&readme, "`unsafe` blocks, impls and functions")
        .expect("the README states the count");
    assert_eq!(
        said, sites,
        "README.md says {said} `unsafe` sites in user space; the code has {sites}: update it"
    );
}

#[test]
fn the_architecture_doc_counts_the_public_modules_there_are() {
    let lib = std::fs::read_to_string(root().join("proxy/src/lib.rs")).expect("lib.rs");
    let public: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';'))
        .collect();
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).expect("doc");
    let said = number_before(&doc, "public modules").expect("the doc states the count");
    assert_eq!(
        said,
        public.len(),
        "docs/architecture.md says {said} public modules; proxy/src/lib.rs has {}: {public:?}",
        public.len()
    );
    for m in &public {
        assert!(
            doc.contains(&format!("`{m}`")),
            "docs/architecture.md does not name the public module `{m}`"
        );
    }
}

/// Code lines of a source file: all of it, or what comes before its `#[cfg(test)] mod tests`
/// (`pub(super) mod tests` too, when a sibling's tests share its helpers).
fn code_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let is_tests = |l: &str| {
        let l = l.trim();
        let l = l
            .strip_prefix("pub(super) ")
            .or_else(|| l.strip_prefix("pub(crate) "))
            .unwrap_or(l);
        l.starts_with("mod tests")
    };
    lines
        .windows(2)
        .position(|w| w[0].trim() == "#[cfg(test)]" && is_tests(w[1]))
        .unwrap_or(lines.len())
}

#[test]
fn no_file_has_over_500_lines_of_code() {
    let mut files = Vec::new();
    for d in USER_SPACE {
        rust_files(&root().join(d), &mut files);
    }
    let mut over = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(root()).expect("in the workspace");
        let rel = rel.to_string_lossy().into_owned();
        if rel.ends_with("/tests.rs") {
            continue;
        }
        let n = code_lines(&std::fs::read_to_string(f).expect("source"));
        if n > 500 {
            over.push(format!("{rel}: {n} lines of code (at most 500)"));
        }
    }
    assert!(over.is_empty(), "{over:#?}");
}

/// Files of `server/` with a method of the client's connection (`impl Conn` or `impl X for
/// Conn`), by name.
fn connection_files(code: &[(String, String)]) -> Vec<String> {
    let mut files: Vec<String> = code
        .iter()
        .filter(|(_, text)| {
            text.lines().any(|l| {
                let l = l.trim_start();
                l.starts_with("impl Conn {")
                    || (l.starts_with("impl ") && l.contains(" for Conn {"))
            })
        })
        .map(|(name, _)| name.clone())
        .collect();
    files.sort();
    files
}

/// The connection owns the socket and its loop, and knows nothing of the cache (#45): its
/// methods are in three files (the loop, the responder, the request body's reader), and none of
/// them nor its state's file names the cache or a request's handling (`Exchange`) but the loop's
/// one hand-off, so a request's walk goes down from the loop and returns only to the socket.
#[test]
fn the_connection_is_three_files_that_know_nothing_of_the_cache() {
    let dir = root().join("proxy/src/server");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    let code: Vec<(String, String)> = files
        .iter()
        .map(|f| {
            let rel = f.strip_prefix(&dir).expect("in server/");
            let text = std::fs::read_to_string(f).expect("source");
            (rel.to_string_lossy().into_owned(), text)
        })
        .collect();
    assert_eq!(
        connection_files(&code),
        ["conn.rs", "respond.rs", "upload.rs"],
        "the connection's methods left its three files (docs/architecture.md names them)"
    );
    for (name, text) in code.iter().filter(|(n, _)| {
        ["conn.rs", "conn_state.rs", "respond.rs", "upload.rs"].contains(&n.as_str())
    }) {
        let code: String = text
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(!code.contains("cache::"), "{name} names the cache");
        let handoffs = code.matches("Exchange").count();
        let allowed = if name == "conn.rs" { 3 } else { 0 };
        assert_eq!(
            handoffs, allowed,
            "{name} names `Exchange` {handoffs} times"
        );
    }
    // The loop's methods are private, so the compiler holds what calls them: nothing below the
    // loop (the exchange, the responder, the body's reader) can call back up into it.
    let (_, conn) = code.iter().find(|(n, _)| n == "conn.rs").expect("conn.rs");
    let public: Vec<&str> = conn
        .lines()
        .filter(|l| l.starts_with("    pub") && l.contains("fn "))
        .collect();
    assert!(
        public.is_empty(),
        "conn.rs's loop has public methods: {public:?}"
    );
    let planted = [
        ("conn.rs".to_string(), "impl Conn {\n}".to_string()),
        (
            "hit.rs".to_string(),
            "impl BodySource for Conn {".to_string(),
        ),
        ("dispatch.rs".to_string(), "impl Exchange<'_> {".to_string()),
    ];
    assert_eq!(connection_files(&planted), ["conn.rs", "hit.rs"]);
}

#[test]
fn the_counts_read_what_they_say() {
    assert_eq!(
        unsafe_sites("unsafe { a }\n// unsafe { b }\nunsafe fn c() {} // unsafe impl\n"),
        2
    );
    assert_eq!(
        number_before("has 42 `unsafe` blocks", "`unsafe`"),
        Some(42)
    );
    assert_eq!(number_before("has `unsafe`", "`unsafe`"), None);
    assert_eq!(
        code_lines("a\nb\n#[cfg(test)]\nmod tests {\n}\n"),
        2,
        "the tests are not code lines"
    );
}
