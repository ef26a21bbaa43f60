//! The `$variable` templates of the config (the access log's format, the edge rules' values
//! and locations), scanned by one function so both read `$name`, `${name}`, `$$` and `$1` the
//! same way and a misspelt name is an error where it is written, with the list of names.

/// A piece of a template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TemplatePart {
    /// Text as written (`$$` already a `$`).
    Literal(String),
    /// A variable of the template's list.
    Var(&'static str),
    /// `$1`..`$9`: a group of a rule's `path_regex`.
    Group(u8),
}

/// The pieces of `template`: `$name` (lower-case letters and `_`, or `${name}` beside one),
/// one of `known`; `$1`..`$9` when `groups`; `$$` for a `$`. An unknown name is an error that
/// lists `known` (and `also`, what else may be written).
pub(crate) fn scan(
    template: &str,
    known: &[(&'static str, &str)],
    groups: bool,
    also: &str,
) -> Result<Vec<TemplatePart>, String> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut rest = template;
    while let Some(i) = rest.find('$') {
        text.push_str(&rest[..i]);
        rest = &rest[i + 1..];
        if let Some(r) = rest.strip_prefix('$') {
            text.push('$');
            rest = r;
            continue;
        }
        let (name, after) = match rest.strip_prefix('{') {
            Some(r) => {
                let end = r
                    .find('}')
                    .ok_or_else(|| format!("`${{{r}` has no closing `}}`"))?;
                (&r[..end], &r[end + 1..])
            }
            None if groups && rest.starts_with(|c: char| c.is_ascii_digit()) => {
                (&rest[..1], &rest[1..])
            }
            None => {
                let end = rest
                    .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                    .unwrap_or(rest.len());
                (&rest[..end], &rest[end..])
            }
        };
        let part = match (groups, name.parse::<u8>()) {
            (true, Ok(n @ 1..=9)) => TemplatePart::Group(n),
            _ => match known.iter().find(|(v, _)| *v == name) {
                Some((v, _)) => TemplatePart::Var(v),
                None => {
                    let names: Vec<String> = known.iter().map(|(v, _)| format!("${v}")).collect();
                    return Err(format!(
                        "`${name}` is not a variable; write `$$` for a `$`; the variables: {}{also}",
                        names.join(", ")
                    ));
                }
            },
        };
        if !text.is_empty() {
            out.push(TemplatePart::Literal(std::mem::take(&mut text)));
        }
        out.push(part);
        rest = after;
    }
    text.push_str(rest);
    if !text.is_empty() {
        out.push(TemplatePart::Literal(text));
    }
    Ok(out)
}
