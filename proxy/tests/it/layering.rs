//! The top-level modules of `proxy/src` form no import cycle: each can be read, tested and
//! changed knowing only the modules below it. A new `use crate::x` that closes a cycle fails
//! here with the cycle and the lines that make it.
//!
//! The graph is read from the source: every `crate::name` (including `use crate::{a, b}`) and
//! every `super::` path that climbs to the crate root, outside comments, is an edge from the
//! top-level module the file belongs to. Tests inside a module count too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `edges[from][to]` = the places (file:line) where module `from` names module `to`.
type Edges = BTreeMap<String, BTreeMap<String, Vec<String>>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read src").flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a file under `src` (`server/fetch/run.rs` → server, fetch, run;
/// `server/mod.rs` → server).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs");
        if stem != "mod" {
            parts.push(stem.to_string());
        }
    }
    parts
}

fn ident_at(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The modules (of the tree whose paths start with `root`, `crate::` for the crate) named on
/// one line of code by a file at `path` in that tree.
fn named(code: &str, path: &[String], root: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(root) {
        let after = &rest[i + root.len()..];
        if let Some(group) = after.strip_prefix('{') {
            // use crate::{a, b::c, d}: the first segment of each item.
            let inner = group.split('}').next().unwrap_or("");
            for item in inner.split(',') {
                let id = ident_at(item.trim());
                if !id.is_empty() {
                    out.push(id);
                }
            }
        } else {
            out.push(ident_at(after));
        }
        rest = after;
    }
    // super::super::x from depth 2 names crate::x.
    let mut rest = code;
    while let Some(i) = rest.find("super::") {
        let before_ok = i == 0 || !rest.as_bytes()[i - 1].is_ascii_alphanumeric();
        let mut after = &rest[i..];
        let mut ups = 0;
        while let Some(a) = after.strip_prefix("super::") {
            ups += 1;
            after = a;
        }
        if before_ok && ups >= path.len() {
            let id = ident_at(after);
            if !id.is_empty() {
                out.push(id);
            }
        }
        rest = &rest[i + "super::".len() * ups.max(1)..];
    }
    out
}

fn graph(src: &Path, root: &str) -> (BTreeSet<String>, Edges) {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut tops = BTreeSet::new();
    for f in &files {
        let rel = f.strip_prefix(src).expect("under src");
        let path = module_path(rel);
        if let Some(top) = path.first()
            && top != "main"
            && top != "lib"
            && top != "mod"
        {
            tops.insert(top.clone());
        }
    }
    let mut edges: Edges = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(src).expect("under src");
        let path = module_path(rel);
        let Some(top) = path.first() else { continue };
        if !tops.contains(top) {
            continue;
        }
        let text = std::fs::read_to_string(f).expect("read source");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for to in named(code, &path, root) {
                if &to != top && tops.contains(&to) {
                    edges
                        .entry(top.clone())
                        .or_default()
                        .entry(to)
                        .or_default()
                        .push(format!("{}:{}", rel.display(), n + 1));
                }
            }
        }
    }
    (tops, edges)
}

/// A cycle through `start`, if there is one (depth-first search for a path back to it).
fn cycle_through(start: &str, edges: &Edges) -> Option<Vec<String>> {
    fn dfs(
        at: &str,
        start: &str,
        edges: &Edges,
        seen: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> bool {
        for to in edges.get(at).into_iter().flat_map(|m| m.keys()) {
            if to == start {
                return true;
            }
            if seen.insert(to.clone()) {
                path.push(to.clone());
                if dfs(to, start, edges, seen, path) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    let mut seen = BTreeSet::new();
    dfs(start, start, edges, &mut seen, &mut path).then_some(path)
}

#[test]
fn the_top_level_modules_form_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (tops, edges) = graph(&src, "crate::");
    assert!(tops.len() > 20, "read the modules of {}", src.display());
    let mut report = String::new();
    let mut reported = BTreeSet::new();
    for top in &tops {
        if reported.contains(top) {
            continue;
        }
        if let Some(cycle) = cycle_through(top, &edges) {
            report.push_str(&format!("cycle: {} -> {}\n", cycle.join(" -> "), cycle[0]));
            for (i, from) in cycle.iter().enumerate() {
                let to = &cycle[(i + 1) % cycle.len()];
                let at = &edges[from][to];
                report.push_str(&format!("  {from} -> {to}: {}\n", at.join(", ")));
                reported.insert(from.clone());
            }
        }
    }
    assert!(report.is_empty(), "import cycles in proxy/src:\n{report}");
}

/// The reader itself: a cycle planted in a scratch tree is found, through `use crate::{..}` and
/// through `super::` from a nested file, and comments are not edges.
#[test]
fn a_planted_cycle_is_found() {
    let dir = std::env::temp_dir().join(format!("zc-layering-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("b")).expect("mkdir");
    std::fs::write(dir.join("a.rs"), "use crate::{b::x, c};\n").expect("write");
    std::fs::write(dir.join("b/mod.rs"), "mod x;\n// crate::a in a comment\n").expect("write");
    std::fs::write(dir.join("b/x.rs"), "use super::super::a::Thing;\n").expect("write");
    std::fs::write(dir.join("c.rs"), "/// [`crate::a`]\n").expect("write");
    let (tops, edges) = graph(&dir, "crate::");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(tops.into_iter().collect::<Vec<_>>(), ["a", "b", "c"]);
    assert_eq!(
        cycle_through("a", &edges),
        Some(vec!["a".to_string(), "b".to_string()])
    );
    assert_eq!(edges["b"]["a"], ["b/x.rs:1"]);
    assert_eq!(cycle_through("c", &edges), None);
}

/// Inside `server/`, no module imports back along the request's way either: the fetch decides
/// and returns what it got (`fetch::Fetched`), the connection sends it (`relay`), and the
/// request body's types (`request_body`) and the connection's error (`conn_error`) stand apart
/// from the connection that reads them.
#[test]
fn inside_server_no_module_is_in_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/server");
    let (tops, edges) = graph(&src, "crate::server::");
    assert!(tops.len() > 8, "read the modules of {}", src.display());
    let in_cycles: Vec<(&str, Vec<String>)> = tops
        .iter()
        .filter_map(|m| cycle_through(m, &edges).map(|c| (m.as_str(), c)))
        .collect();
    assert_eq!(
        in_cycles,
        [],
        "modules of server/ in an import cycle; edges: {edges:#?}"
    );
    // The fetch names neither the connection nor what sends its answer.
    for never in ["conn", "relay", "upload"] {
        assert!(
            !edges.get("fetch").is_some_and(|e| e.contains_key(never)),
            "fetch imports {never}: {:#?}",
            edges.get("fetch")
        );
    }
}

/// The longest functions of `src`, from a `fn` line to the closing brace at its indent: (lines,
/// file:line, name).
fn function_lengths(src: &Path) -> Vec<(usize, String)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read source");
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let t = l.trim_start();
            let indent = &l[..l.len() - t.len()];
            let t = t
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub(super) ")
                .trim_start_matches("pub ")
                .trim_start_matches("const ")
                .trim_start_matches("async ")
                .trim_start_matches("unsafe ");
            if !t.starts_with("fn ") || l.trim_end().ends_with(';') {
                continue;
            }
            let close = format!("{indent}}}");
            if let Some(end) = lines[i + 1..].iter().position(|c| *c == close) {
                let rel = f.strip_prefix(src).unwrap_or(&f).display().to_string();
                out.push((end + 2, format!("{rel}:{} {}", i + 1, t)));
            }
        }
    }
    out.sort_by_key(|e| std::cmp::Reverse(e.0));
    out
}

/// No function in `src` runs over 150 lines (issue #30): a request path a newcomer can read a
/// function of at a time.
#[test]
fn no_function_is_over_150_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lengths = function_lengths(&src);
    assert!(
        lengths.len() > 500,
        "read the functions of {}",
        src.display()
    );
    let long: Vec<&(usize, String)> = lengths.iter().filter(|(n, _)| *n > 150).collect();
    assert!(long.is_empty(), "functions over 150 lines: {long:#?}");
}
