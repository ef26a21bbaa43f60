//! Tracepoint record formats, read from tracefs when the probe loads.
//!
//! A tracepoint program reads its record at offsets compiled into its load instructions (the
//! verifier refuses a context read at an offset held in a register), and a kernel refuses to
//! attach a program whose reads go past the record it has (`EACCES` from `BPF_LINK_CREATE`, a
//! message that names neither the field nor the kernel). So before attaching, the loader reads
//! `events/<category>/<name>/format` and checks that every field the program reads is where the
//! program reads it (`zerocache_probe_common::layout`); a mismatch refuses that program with the
//! field, both offsets and the running kernel named. It is also how `sched_exit` learns whether
//! the record has `group_dead`.

use std::path::Path;

/// Where tracefs is mounted (the probe attaches through it).
pub(crate) const TRACEFS: &str = "/sys/kernel/tracing";

/// One field of a record, from a line such as `field:long ret; offset:16; size:8; signed:1;`
/// (tab-separated in tracefs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// The C name, without an array suffix (`comm` for `char comm[16]`).
    pub name: String,
    /// Byte offset in the record.
    pub offset: usize,
    /// Byte size.
    pub size: usize,
}

/// The fields of a format file's text, in order. Lines that are not field lines are skipped; a
/// field line without a name, offset or size is an error.
pub fn parse(text: &str) -> Result<Vec<Field>, String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("field:") else {
            continue;
        };
        let mut decl = None;
        let mut offset = None;
        let mut size = None;
        for part in rest.split(';').map(str::trim) {
            if let Some(v) = part.strip_prefix("offset:") {
                offset = v.parse::<usize>().ok();
            } else if let Some(v) = part.strip_prefix("size:") {
                size = v.parse::<usize>().ok();
            } else if decl.is_none() && !part.is_empty() && !part.contains(':') {
                decl = Some(part);
            }
        }
        let name = decl
            .and_then(|d| d.split_whitespace().last())
            .map(|n| n.split('[').next().unwrap_or(n).trim_start_matches('*'))
            .filter(|n| !n.is_empty());
        match (name, offset, size) {
            (Some(name), Some(offset), Some(size)) => out.push(Field {
                name: name.to_string(),
                offset,
                size,
            }),
            _ => return Err(format!("unreadable field line `{line}`")),
        }
    }
    Ok(out)
}

/// The fields of tracepoint `category/name` on the running kernel.
pub fn format(category: &str, name: &str) -> Result<Vec<Field>, String> {
    let path = Path::new(TRACEFS)
        .join("events")
        .join(category)
        .join(name)
        .join("format");
    let text = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound if Path::new(TRACEFS).join("events").is_dir() => {
            format!("this kernel has no tracepoint {category}/{name}")
        }
        _ => format!(
            "cannot read {}: {e} (tracefs must be mounted at {TRACEFS}: `mount -t tracefs nodev {TRACEFS}`; it is mode 0700, so a non-root service needs CAP_DAC_READ_SEARCH)",
            path.display()
        ),
    })?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Checks that `fields` has each `(name, offset, size)` of `reads` exactly there.
pub(crate) fn check(
    fields: &[Field],
    tracepoint: &str,
    reads: &[(&str, usize, usize)],
) -> Result<(), String> {
    for (name, offset, size) in reads {
        match fields.iter().find(|f| f.name == *name) {
            Some(f) if f.offset == *offset && f.size == *size => {}
            Some(f) => {
                return Err(format!(
                    "{tracepoint}: field {name} is {} bytes at offset {} on this kernel; the program reads {size} bytes at {offset}",
                    f.size, f.offset
                ));
            }
            None => {
                return Err(format!(
                    "{tracepoint}: this kernel's record has no field {name}"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux 6.1's sched_process_exit, as tracefs prints it (no `group_dead`).
    const SCHED_EXIT_6_1: &str = "name: sched_process_exit
ID: 307
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;

print fmt: \"comm=%s pid=%d prio=%d\", REC->comm, REC->pid, REC->prio
";

    #[test]
    fn parses_fields_with_arrays_and_common_fields() {
        let f = parse(SCHED_EXIT_6_1).expect("parses");
        let names: Vec<&str> = f.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "common_type",
                "common_flags",
                "common_preempt_count",
                "common_pid",
                "comm",
                "pid",
                "prio"
            ]
        );
        assert_eq!(
            f[4],
            Field {
                name: "comm".into(),
                offset: 8,
                size: 16
            }
        );
        assert_eq!((f[6].offset, f[6].size), (28, 4));
    }

    #[test]
    fn check_names_the_field_and_both_offsets() {
        let f = parse(SCHED_EXIT_6_1).expect("parses");
        assert_eq!(
            check(&f, "sched/sched_process_exit", &[("pid", 24, 4)]),
            Ok(())
        );
        assert_eq!(
            check(&f, "sched/sched_process_exit", &[("group_dead", 32, 1)]),
            Err("sched/sched_process_exit: this kernel's record has no field group_dead".into())
        );
        assert_eq!(
            check(&f, "sched/sched_process_exit", &[("prio", 32, 4)]),
            Err("sched/sched_process_exit: field prio is 4 bytes at offset 28 on this kernel; the program reads 4 bytes at 32".into())
        );
    }

    #[test]
    fn hostile_format_text_is_an_error_not_a_guess() {
        assert!(parse("field:int x;\toffset:eight;\tsize:4;").is_err());
        assert!(parse("field:;\toffset:8;\tsize:4;").is_err());
        assert!(parse("field:int x;\tsize:4;").is_err());
        assert_eq!(parse("name: x\nID: 1\nprint fmt: \"\"\n"), Ok(Vec::new()));
        let huge = format!("field:int x;\toffset:{};\tsize:4;", u128::MAX);
        assert!(parse(&huge).is_err());
    }
}
