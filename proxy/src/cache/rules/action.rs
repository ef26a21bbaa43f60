//! A rule's templates and field edits, compiled. A template's variables come from the parsed
//! request (the host passed the `uri-host` grammar, the path the request line's, groups are
//! pieces of the path), so none can hold a CR, LF or NUL; a rendered value is still checked
//! before it becomes a field, so a future variable cannot make one either.

use super::matcher::{Groups, Seen};
use crate::http::field_edit::{FieldEdits, Op};
use zerocache_config::{HeaderActions, TemplatePart};

/// A compiled template.
#[derive(Debug, Clone)]
pub(crate) struct Template {
    parts: Vec<TemplatePart>,
}

/// What a template's variables read.
pub(crate) struct Vars<'a> {
    pub seen: &'a Seen<'a>,
    pub groups: &'a Groups,
    pub route: &'a str,
}

impl Template {
    pub(crate) fn new(t: &str) -> Result<Template, String> {
        Ok(Template {
            parts: zerocache_config::template_parts(t)?,
        })
    }

    /// Whether it starts with a variable or a group (not with text the operator wrote): a
    /// redirect made from it must not start with `//`, which a browser reads as another host.
    pub(crate) fn starts_with_a_variable(&self) -> bool {
        !matches!(self.parts.first(), Some(TemplatePart::Literal(_)) | None)
    }

    /// Whether it uses a group of the rule's `path_regex`.
    pub(crate) fn uses_groups(&self) -> bool {
        self.parts
            .iter()
            .any(|p| matches!(p, TemplatePart::Group(_)))
    }

    /// Writes the text for this request to `out`, unchecked (a field's value is checked by
    /// [`FieldEdits::push`], a redirect's by its sender).
    pub(crate) fn render_into(&self, v: &Vars<'_>, out: &mut String) {
        let req = v.seen.req;
        let path = v.seen.path;
        for p in &self.parts {
            let text: &str = match p {
                TemplatePart::Literal(t) => t,
                TemplatePart::Group(n) => match v.groups.get(usize::from(*n)) {
                    Some(Some((a, b))) => &path[*a..*b],
                    _ => "",
                },
                TemplatePart::Var("client") => {
                    use std::fmt::Write as _;
                    let _ = write!(out, "{}", v.seen.client);
                    ""
                }
                TemplatePart::Var(name) => match *name {
                    "host" => &req.host,
                    "path" => path,
                    "query" => v.seen.query,
                    "target" => &req.target,
                    "scheme" => crate::cache::key::scheme(req.tls),
                    "method" => &req.method,
                    "route" => v.route,
                    _ => "",
                },
            };
            out.push_str(text);
        }
    }

    /// The text for this request, unchecked.
    pub(crate) fn render_string(&self, v: &Vars<'_>) -> String {
        let mut out = String::new();
        self.render_into(v, &mut out);
        out
    }
}

/// A side's field edits: `remove`, then `set`, then `append`.
#[derive(Debug, Default)]
pub(crate) struct Edits {
    remove: Vec<String>,
    set: Vec<(String, Template)>,
    append: Vec<(String, Template)>,
}

impl Edits {
    pub(crate) fn new(a: &HeaderActions) -> Result<Edits, String> {
        let compile = |m: &std::collections::BTreeMap<String, String>| {
            m.iter()
                .map(|(k, v)| Ok((k.clone(), Template::new(v)?)))
                .collect::<Result<Vec<_>, String>>()
        };
        Ok(Edits {
            remove: a.remove.clone(),
            set: compile(&a.set)?,
            append: compile(&a.append)?,
        })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.set.is_empty() && self.append.is_empty()
    }

    /// Whether a value uses a group of the rule's `path_regex`.
    pub(crate) fn uses_groups(&self) -> bool {
        self.set
            .iter()
            .chain(&self.append)
            .any(|(_, t)| t.uses_groups())
    }

    /// The edits for this request, values rendered, added to `out`; a value that cannot be a
    /// field is left out.
    pub(crate) fn render(&self, v: &Vars<'_>, out: &mut FieldEdits) {
        for n in &self.remove {
            out.push(Op::Remove, n, |_| {});
        }
        for (op, list) in [(Op::Set, &self.set), (Op::Append, &self.append)] {
            for (n, t) in list {
                out.push(op, n, |buf| t.render_into(v, buf));
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
