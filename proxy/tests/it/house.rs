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

/// `text` without its comments: whole-line ones and a ` // ` after code (a `"http://…"` stays).
fn without_comments(text: &str) -> String {
    let trailing = regex::Regex::new(r"\s//\s.*$").expect("regex");
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| trailing.replace(l, "").into_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Files with a method of the client's connection: an `impl` whose header (up to its `{`, a
/// `where` clause, a path or a reference included) names `Conn`, not `UpstreamConn`.
fn connection_files(code: &[(String, String)]) -> Vec<String> {
    let header = regex::Regex::new(r"\bimpl\b[^{;]*\bConn\b[^{;]*\{").expect("regex");
    let mut files: Vec<String> = code
        .iter()
        .filter(|(_, text)| header.is_match(&without_comments(text)))
        .map(|(name, _)| name.clone())
        .collect();
    files.sort();
    files
}

/// The connection owns the socket and its loop, and knows nothing of the cache (#45): its
/// methods are in three files (the loop, the responder, the request body's reader); those and
/// its state's file reach only the modules and the context fields a connection needs, and only
/// the loop names a request's handling (`Exchange`), to hand each request down. Its methods are
/// private, so the compiler holds the rest: nothing below can call back up into the loop.
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
    let path = regex::Regex::new(r"\b(crate|super)::(\{|[a-z_]+)").expect("regex");
    let field = regex::Regex::new(r"\bctx\.([a-z_]+)").expect("regex");
    let modules = [
        "crate::accesslog",
        "crate::http",
        "crate::net",
        "super::{",
        "super::conn_error",
        "super::conn_state",
        "super::copy_account",
        "super::request_body",
    ];
    let fields = [
        "access_log",
        "accounting",
        "client",
        "forwarding",
        "sending",
        "clone",
        "load_full",
    ];
    for name in ["conn.rs", "conn_state.rs", "respond.rs", "upload.rs"] {
        let (_, text) = code.iter().find(|(n, _)| n == name).expect(name);
        let text = without_comments(text);
        for m in path.find_iter(&text).map(|m| m.as_str()) {
            let handoff = name == "conn.rs" && m == "super::exchange";
            assert!(modules.contains(&m) || handoff, "{name} reaches {m}");
        }
        for f in field.captures_iter(&text).map(|c| c[1].to_string()) {
            assert!(fields.contains(&f.as_str()), "{name} reaches ctx.{f}");
        }
        let names_exchange = text.contains("Exchange");
        assert_eq!(names_exchange, name == "conn.rs", "{name} and `Exchange`");
        let public: Vec<&str> = text
            .lines()
            .filter(|l| name == "conn.rs" && l.starts_with("    pub") && l.contains("fn "))
            .collect();
        assert!(
            public.is_empty(),
            "the loop's methods are public: {public:?}"
        );
    }
    let planted = [
        ("a.rs", "impl Conn {\n}"),
        ("b.rs", "impl BodySource for Conn {"),
        ("c.rs", "impl super::conn_state::Conn {"),
        ("d.rs", "impl<'a> Tr for &'a mut Conn\nwhere\n    X: Y,\n{"),
        ("e.rs", "impl Exchange<'_> {\n    fn f(c: &mut Conn) {}\n}"),
        ("f.rs", "impl UpstreamConn {"),
        ("g.rs", "// impl Conn {"),
    ];
    let planted: Vec<(String, String)> = planted
        .iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect();
    assert_eq!(connection_files(&planted), ["a.rs", "b.rs", "c.rs", "d.rs"]);
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
