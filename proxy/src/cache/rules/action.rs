//! A rule's templates and field edits, compiled. A template's variables come from the parsed
//! request (the host passed the `uri-host` grammar, the path the request line's, groups are
//! pieces of the path), so none can hold a CR, LF or NUL; a rendered value is still checked
//! before it becomes a field, so a future variable cannot make one either.

use super::matcher::{Groups, Seen};
use crate::http::field_edit::{FieldEdits, Op, name_bits};
use zerocache_config::{HeaderActions, TemplatePart};

/// A piece of a compiled template: text, or what a variable reads, found when the config is
/// loaded rather than by its name on every request.
#[derive(Debug, Clone)]
enum Part {
    Text(String),
    Host,
    Path,
    Query,
    Target,
    Scheme,
    Method,
    Client,
    /// `$1`..`$9`.
    Group(u8),
}

/// A compiled template.
#[derive(Debug, Clone)]
pub(crate) struct Template {
    parts: Vec<Part>,
    /// Text alone, no variable: what it renders was checked whole when the config was read.
    fixed: bool,
}

/// What a template's variables read.
pub(crate) struct Vars<'a> {
    pub seen: &'a Seen<'a>,
    pub groups: &'a Groups,
}

impl Template {
    /// `t` compiled for the route named `route`: `$route` is text from here on.
    pub(crate) fn new(t: &str, route: &str) -> Result<Template, String> {
        let mut parts = zerocache_config::template_parts(t)?
            .into_iter()
            .map(|p| match p {
                TemplatePart::Literal(t) => Ok(Part::Text(t)),
                TemplatePart::Group(n) => Ok(Part::Group(n)),
                TemplatePart::Var(name) => Ok(match name {
                    "host" => Part::Host,
                    "path" => Part::Path,
                    "query" => Part::Query,
                    "target" => Part::Target,
                    "scheme" => Part::Scheme,
                    "method" => Part::Method,
                    "route" => Part::Text(route.to_string()),
                    "client" => Part::Client,
                    other => return Err(format!("`${other}` is not a rule's variable")),
                }),
            })
            .collect::<Result<Vec<_>, String>>()?;
        // Neighbouring texts (a `$route` between two) are one.
        parts.dedup_by(|b, a| match (a, b) {
            (Part::Text(a), Part::Text(b)) => {
                a.push_str(b);
                true
            }
            _ => false,
        });
        Ok(Template {
            fixed: parts.iter().all(|p| matches!(p, Part::Text(_))),
            parts,
        })
    }

    /// Whether it starts with a variable or a group (not with text the operator wrote): a
    /// redirect made from it must not start with `//`, which a browser reads as another host.
    pub(crate) fn starts_with_a_variable(&self) -> bool {
        !matches!(self.parts.first(), Some(Part::Text(_)) | None)
    }

    /// Whether it uses a group of the rule's `path_regex`.
    pub(crate) fn uses_groups(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Group(_)))
    }

    /// Whether it is text alone (see [`Template::fixed`]).
    pub(crate) fn is_fixed(&self) -> bool {
        self.fixed
    }

    /// Writes the text for this request to `out`, unchecked (a field's value is checked by
    /// `FieldEdits::push_named` when it holds a variable, and text alone when the config
    /// was read; a redirect's by its sender).
    pub(crate) fn render_into(&self, v: &Vars<'_>, out: &mut String) {
        let req = v.seen.req;
        let path = v.seen.path;
        for p in &self.parts {
            let text: &str = match p {
                Part::Text(t) => t,
                Part::Group(n) => match v.groups.get(usize::from(*n)) {
                    Some(Some((a, b))) => &path[*a..*b],
                    _ => "",
                },
                Part::Client => {
                    use std::fmt::Write as _;
                    let _ = write!(out, "{}", v.seen.client);
                    ""
                }
                Part::Host => &req.host,
                Part::Path => path,
                Part::Query => v.seen.query,
                Part::Target => &req.target,
                Part::Scheme => crate::cache::key::scheme(req.tls),
                Part::Method => &req.method,
            };
            out.push_str(text);
        }
    }

    /// The text of a template of text alone.
    fn render_fixed(&self, out: &mut String) {
        for p in &self.parts {
            if let Part::Text(t) = p {
                out.push_str(t);
            }
        }
    }

    /// The text for this request, unchecked.
    pub(crate) fn render_string(&self, v: &Vars<'_>) -> String {
        let mut out = String::new();
        self.render_into(v, &mut out);
        out
    }
}

/// One field edit, compiled: its name and `field_edit::name_bits`, and its value's template, or
/// for a value of text alone its whole line (`name: value\r\n`), made once.
#[derive(Debug)]
struct Edit {
    name: String,
    bits: u128,
    value: Template,
    line: Option<String>,
}

impl Edit {
    fn new(name: &str, value: &str, route: &str) -> Result<Edit, String> {
        let value = Template::new(value, route)?;
        let line = value.is_fixed().then(|| {
            let mut line = format!("{name}: ");
            value.render_fixed(&mut line);
            line.push_str("\r\n");
            line
        });
        Ok(Edit {
            bits: name_bits(name.as_bytes()),
            name: name.to_string(),
            value,
            line,
        })
    }
}

/// A side's field edits: `remove`, then `set`, then `append`.
#[derive(Debug, Default)]
pub(crate) struct Edits {
    remove: Vec<(String, u128)>,
    set: Vec<Edit>,
    append: Vec<Edit>,
    /// All of them, made once, when no value has a variable (the usual case).
    fixed: Option<FieldEdits>,
}

impl Edits {
    /// The edits of `a`, on the route named `route`.
    pub(crate) fn new(a: &HeaderActions, route: &str) -> Result<Edits, String> {
        let compile = |m: &std::collections::BTreeMap<String, String>| {
            m.iter()
                .map(|(k, v)| Edit::new(k, v, route))
                .collect::<Result<Vec<_>, String>>()
        };
        let mut e = Edits {
            remove: a
                .remove
                .iter()
                .map(|k| (k.clone(), name_bits(k.as_bytes())))
                .collect(),
            set: compile(&a.set)?,
            append: compile(&a.append)?,
            fixed: None,
        };
        if e.set.iter().chain(&e.append).all(|e| e.line.is_some()) {
            let mut fixed = FieldEdits::default();
            e.render_each(&mut fixed, |_, _| {});
            e.fixed = Some(fixed);
        }
        Ok(e)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.set.is_empty() && self.append.is_empty()
    }

    /// All of them, made once, when no value has a variable.
    pub(crate) fn fixed(&self) -> Option<&FieldEdits> {
        self.fixed.as_ref()
    }

    /// Whether a value uses a group of the rule's `path_regex`.
    pub(crate) fn uses_groups(&self) -> bool {
        self.set
            .iter()
            .chain(&self.append)
            .any(|e| e.value.uses_groups())
    }

    /// The edits for this request, values rendered, added to `out`; a value that cannot be a
    /// field is left out.
    pub(crate) fn render(&self, v: &Vars<'_>, out: &mut FieldEdits) {
        match &self.fixed {
            Some(fixed) => out.extend(fixed),
            None => self.render_each(out, |e, buf| e.value.render_into(v, buf)),
        }
    }

    /// Adds each edit to `out`, a value with a variable written by `value`.
    fn render_each(&self, out: &mut FieldEdits, value: impl Fn(&Edit, &mut String)) {
        for (n, bits) in &self.remove {
            out.push_named(Op::Remove, (n, *bits), false, |_| {});
        }
        for (op, list) in [(Op::Set, &self.set), (Op::Append, &self.append)] {
            for e in list {
                match &e.line {
                    // Text alone: refused at load if it held a CR, LF or NUL.
                    Some(line) => out.push_line(op, line, e.name.len(), e.bits),
                    None => {
                        out.push_named(op, (&e.name, e.bits), true, |buf| value(e, buf));
                    }
                }
            }
        }
    }
}

/// Applies `edits` to a request's fields.
pub(crate) fn apply_to_fields(edits: &FieldEdits, fields: &mut Vec<crate::http::headers::Field>) {
    for (op, n, v) in edits.iter() {
        if op != Op::Append {
            fields.retain(|(k, _)| !k.eq_ignore_ascii_case(n));
        }
        if op != Op::Remove {
            fields.push((n.to_string(), v.to_vec()));
        }
    }
}
