//! The manual pages: `zerocache(8)` and one page per subcommand, generated from the CLI's own
//! definition (clap_mangen), so they cannot describe options the binary does not have, and
//! `zerocache.yaml(5)`, the configuration file's page, around the annotated example config that
//! lists every key with its default. `zerocache man --out DIR` writes them; the copies under
//! `docs/man/` are what the package installs, and a test regenerates them and fails on any
//! difference.

use std::io::Write;
use std::path::{Path, PathBuf};

/// The annotated example: every key with its default and what it does.
const EXAMPLE: &str = include_str!("../../config/zerocache.example.yaml");

/// Writes every page for `cmd` (the binary's CLI) into `dir`; returns their paths.
pub fn write(cmd: clap::Command, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let name = cmd.get_name().to_string();
    let mut page = |file: String, render: &dyn Fn(&mut Vec<u8>) -> std::io::Result<()>| {
        let mut out = Vec::new();
        render(&mut out)?;
        let path = dir.join(file);
        std::fs::write(&path, out)?;
        written.push(path);
        Ok::<(), std::io::Error>(())
    };
    let top = cmd.clone().disable_help_subcommand(true);
    page(format!("{name}.8"), &|out| {
        clap_mangen::Man::new(top.clone())
            .section("8")
            .manual("System Administration")
            .render(out)?;
        out.extend_from_slice(SIGNALS_AND_FILES.as_bytes());
        Ok(())
    })?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let sub_name = format!("{name}-{}", sub.get_name());
        let sub = sub
            .clone()
            .display_name(sub_name.clone())
            .version(env!("CARGO_PKG_VERSION"))
            .bin_name(format!("{name} {}", sub.get_name()));
        page(format!("{sub_name}.8"), &|out| {
            clap_mangen::Man::new(sub.clone())
                .section("8")
                .manual("System Administration")
                .render(out)
        })?;
    }
    let version = cmd.get_version().unwrap_or_default().to_string();
    page("zerocache.yaml.5".into(), &|out| config_page(out, &version))?;
    Ok(written)
}

/// What `zerocache run` does on each signal, and where the packaged files are.
const SIGNALS_AND_FILES: &str = r#".SH SIGNALS
.TP
.B SIGHUP
reload the configuration file in place (a bad one is rejected and the running configuration
stays); responses in flight finish under the old one
.TP
.B SIGUSR1
reopen the access log (after logrotate moved it)
.TP
.B SIGUSR2
binary upgrade: start the binary installed at the same path on the same listening sockets, and
once it serves, drain and exit; if it fails, keep serving
.RB ( "zerocache upgrade"
does this and reports)
.TP
.BR SIGTERM ", " SIGINT ", " SIGQUIT
answer
.B /healthz
with 503 while still serving for
.B limits.lame_duck
(a second signal ends it), then stop accepting, close idle connections, finish responses in
flight within
.BR limits.drain_timeout ,
exit 0
.SH FILES
.TP
.I /etc/zerocache/zerocache.yaml
the configuration, see
.BR zerocache.yaml (5)
.TP
.I /var/cache/zerocache
the cache directory of the packaged configuration
.TP
.I /run/zerocache/zerocache.pid
the packaged
.BR pid_file
.TP
.I /usr/share/doc/zerocache/README.md
the operator's guide
.SH SEE ALSO
.BR zerocache.yaml (5),
.BR systemd.socket (5),
.BR bpf (2),
.BR sendfile (2)
"#;

/// `zerocache.yaml(5)`: what the file is and how it is checked and reloaded, then the annotated
/// example verbatim.
fn config_page(out: &mut Vec<u8>, version: &str) -> std::io::Result<()> {
    writeln!(
        out,
        ".TH ZEROCACHE.YAML 5 \"\" \"zerocache {version}\" \"File Formats\""
    )?;
    out.extend_from_slice(
        br#".SH NAME
zerocache.yaml \- configuration file of the zerocache edge cache
.SH SYNOPSIS
.I /etc/zerocache/zerocache.yaml
.SH DESCRIPTION
The configuration of
.BR zerocache (8),
in YAML: where it listens, the cache directory and its limits, the upstreams and the routes to
them, the dashboard and metrics, the eBPF probe, TLS on both sides, HTTP/2, the fleet.
Unknown keys are errors, and every error names the file, the line and the field.
.PP
.B zerocache check \-c
.I FILE
validates a file without connecting to anything; the packaged unit runs it before every start
and reload. SIGHUP reloads the file in place; a file that does not validate is rejected and
the running configuration stays. Changes to
.BR listen ,
.BR cache ,
.BR dashboard ,
.BR logging ,
.B probe.enabled
and
.B workers
need a restart, or a binary upgrade
.RB ( "zerocache upgrade" ),
which refuses no connection.
.PP
Sizes are bytes, or a number with a unit: k, m, g, t and KiB, MiB, GiB, TiB are binary, KB, MB,
GB, TB decimal. Durations are seconds, or a number with a unit (500ms, 30s, 5m, 1h, 1day).
.SH REFERENCE
Every key, with its default where it has one, as the annotated example shipped in
.I /usr/share/doc/zerocache/zerocache.example.yaml
has it:
.PP
.nf
"#,
    );
    for line in EXAMPLE.lines() {
        // Verbatim: a backslash is roff's escape, and a line starting with a dot or a quote
        // would be a request.
        let line = line.replace('\\', "\\e");
        if line.starts_with(['.', '\'']) {
            out.extend_from_slice(b"\\&");
        }
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(
        br#".fi
.SH FILES
.TP
.I /etc/zerocache/zerocache.yaml
the configuration the packaged service runs with
.TP
.I /usr/share/doc/zerocache/zerocache.example.yaml
the annotated example above
.SH SEE ALSO
.BR zerocache (8),
.BR zerocache-check (8),
.BR zerocache-upgrade (8)
"#,
    );
    Ok(())
}
