//! Reads struct member offsets and enum values from the kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! Rust BPF programs get no CO-RE relocations, so a program that loads a kernel struct field needs
//! the field's offset from user space: the loader looks it up here and hands it to the program as a
//! `.rodata` constant, which the verifier then checks against the same BTF. The probe needs a few
//! such fields and one enum (which BPF helpers the kernel has), so this walks the type section
//! itself rather than pulling in a BTF library: the format is a header, a string table and a flat
//! list of types whose sizes follow from their kind (`Documentation/bpf/btf.rst`).

use std::borrow::Cow;

/// Where the running kernel publishes its BTF.
pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xeb9f;
/// `struct btf_header`: magic, version, flags, hdr_len, then type and string sections.
const HEADER_LEN: usize = 24;
/// `struct btf_type`: name_off, info, size/type.
const TYPE_LEN: usize = 12;
const KIND_STRUCT: u32 = 4;
const KIND_ENUM: u32 = 6;
const KIND_ENUM64: u32 = 19;

/// Why an offset could not be found.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    /// Not a BTF blob this reader understands.
    #[error("not kernel BTF: {0}")]
    Format(Cow<'static, str>),
    /// The struct (or `enum NAME`) is not in the BTF.
    #[error("BTF has no {0}")]
    NoStruct(String),
    /// The struct has no such direct member, or it is a bitfield.
    #[error("BTF struct {0} has no member {1} at a byte offset")]
    NoMember(String, String),
}

/// One type of a BTF blob: its kind, name, `info` word and the bytes that follow its header.
struct Type<'a> {
    kind: u32,
    name: Option<&'a [u8]>,
    info: u32,
    extra: &'a [u8],
}

/// Calls `f` with every type of the BTF blob `data` until it returns `Some`.
fn find_type<'a, T>(
    data: &'a [u8],
    mut f: impl FnMut(&Type<'a>, &dyn Fn(u32) -> Option<&'a [u8]>) -> Option<Result<T, BtfError>>,
) -> Result<Option<T>, BtfError> {
    let bad = |what: &'static str| BtfError::Format(Cow::Borrowed(what));
    if data.len() < HEADER_LEN || u16_at(data, 0) != Some(MAGIC) {
        return Err(bad("bad magic"));
    }
    let [hdr_len, type_off, type_len, str_off, str_len] =
        [4, 8, 12, 16, 20].map(|at| u32_at(data, at).unwrap_or(0) as usize);
    let types =
        section(data, hdr_len, type_off, type_len).ok_or(bad("type section out of range"))?;
    let strings =
        section(data, hdr_len, str_off, str_len).ok_or(bad("string section out of range"))?;
    let name = move |off: u32| -> Option<&'a [u8]> {
        let rest = strings.get(off as usize..)?;
        rest.split(|b| *b == 0).next()
    };
    let mut at = 0;
    while at + TYPE_LEN <= types.len() {
        let name_off = u32_at(types, at).ok_or(bad("truncated type"))?;
        let info = u32_at(types, at + 4).ok_or(bad("truncated type"))?;
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        let len = extra_len(kind, vlen).ok_or(bad("unknown type kind"))?;
        let extra = types
            .get(at + TYPE_LEN..at + TYPE_LEN + len)
            .ok_or(bad("truncated type"))?;
        let t = Type {
            kind,
            name: name(name_off),
            info,
            extra,
        };
        if let Some(found) = f(&t, &name) {
            return found.map(Some);
        }
        at += TYPE_LEN + len;
    }
    Ok(None)
}

/// Byte offset of member `member` of struct `strukt` in the BTF blob `data`.
pub fn member_offset(data: &[u8], strukt: &str, member: &str) -> Result<u32, BtfError> {
    let found = find_type(data, |t, name| {
        if t.kind != KIND_STRUCT || t.name != Some(strukt.as_bytes()) {
            return None;
        }
        let kind_flag = t.info >> 31 == 1;
        for m in t.extra.chunks_exact(12) {
            let m_name = u32_at(m, 0).unwrap_or(0);
            let m_off = u32_at(m, 8).unwrap_or(0);
            if name(m_name) != Some(member.as_bytes()) {
                continue;
            }
            // With kind_flag set the top 8 bits hold a bitfield size.
            let (bits, bitfield) = if kind_flag {
                (m_off & 0xff_ffff, m_off >> 24 != 0)
            } else {
                (m_off, false)
            };
            if bitfield || bits % 8 != 0 {
                break;
            }
            return Some(Ok(bits / 8));
        }
        Some(Err(BtfError::NoMember(strukt.into(), member.into())))
    })?;
    found.ok_or_else(|| BtfError::NoStruct(strukt.into()))
}

/// Whether enum `enumeration` in the BTF blob `data` has a value named `value`: how the probe
/// asks the running kernel which BPF helpers it has (`enum bpf_func_id` lists every one).
pub fn enum_has(data: &[u8], enumeration: &str, value: &str) -> Result<bool, BtfError> {
    let found = find_type(data, |t, name| {
        let width = match t.kind {
            KIND_ENUM => 8,
            KIND_ENUM64 => 12,
            _ => return None,
        };
        if t.name != Some(enumeration.as_bytes()) {
            return None;
        }
        let has = t
            .extra
            .chunks_exact(width)
            .any(|v| name(u32_at(v, 0).unwrap_or(0)) == Some(value.as_bytes()));
        Some(Ok(has))
    })?;
    found.ok_or_else(|| BtfError::NoStruct(format!("enum {enumeration}")))
}

/// Bytes that follow a `btf_type` of this kind with `vlen` entries.
fn extra_len(kind: u32, vlen: usize) -> Option<usize> {
    Some(match kind {
        // INT: encoding word. VAR: linkage. DECL_TAG: component index.
        1 | 14 | 17 => 4,
        // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG.
        2 | 7..=12 | 16 | 18 => 0,
        // ARRAY: element type, index type, count.
        3 => 12,
        // STRUCT, UNION: name, type, offset per member. DATASEC: type, offset, size per var.
        // ENUM64: name, low, high per value.
        4 | 5 | 15 | 19 => 12 * vlen,
        // ENUM: name, value. FUNC_PROTO: name, type per parameter.
        6 | 13 => 8 * vlen,
        _ => return None,
    })
}

fn section(data: &[u8], hdr_len: usize, off: usize, len: usize) -> Option<&[u8]> {
    let start = hdr_len.checked_add(off)?;
    data.get(start..start.checked_add(len)?)
}

fn u16_at(data: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(data.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob with `int` and `struct task { int a; int b:3; int pid; }`, built by hand.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0task\0a\0b\0pid\0";
        let mut types = Vec::new();
        let mut push = |words: &[u32]| words.iter().for_each(|w| types.extend(w.to_ne_bytes()));
        // [1] INT "int" size 4, encoding: signed, 32 bits.
        push(&[1, 1 << 24, 4, (1 << 24) | 32]);
        // [2] STRUCT "task", kind_flag, 3 members, size 12.
        push(&[5, (1 << 31) | (4 << 24) | 3, 12]);
        push(&[10, 1, 0]); // a at bit 0
        push(&[12, 1, (3 << 24) | 32]); // b:3 at bit 32
        push(&[14, 1, 64]); // pid at bit 64
        let mut out = Vec::new();
        out.extend(MAGIC.to_ne_bytes());
        out.extend([1u8, 0]);
        for w in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            out.extend(w.to_ne_bytes());
        }
        out.extend(types);
        out.extend(strings);
        out
    }

    #[test]
    fn finds_a_member_offset_in_bytes() {
        assert_eq!(member_offset(&blob(), "task", "pid"), Ok(8));
        assert_eq!(member_offset(&blob(), "task", "a"), Ok(0));
    }

    #[test]
    fn refuses_bitfields_missing_members_and_garbage() {
        let b = blob();
        assert_eq!(
            member_offset(&b, "task", "b"),
            Err(BtfError::NoMember("task".into(), "b".into()))
        );
        assert_eq!(
            member_offset(&b, "task", "tgid"),
            Err(BtfError::NoMember("task".into(), "tgid".into()))
        );
        assert_eq!(
            member_offset(&b, "inode", "pid"),
            Err(BtfError::NoStruct("inode".into()))
        );
        assert_eq!(
            member_offset(&b[..30], "task", "pid"),
            Err(BtfError::Format(Cow::Borrowed("type section out of range")))
        );
        assert_eq!(
            member_offset(b"not btf at all, no", "task", "pid"),
            Err(BtfError::Format(Cow::Borrowed("bad magic")))
        );
    }

    #[test]
    fn finds_enum_values_in_the_running_kernel() {
        let data = std::fs::read(VMLINUX).expect("this kernel publishes BTF");
        assert_eq!(
            enum_has(&data, "bpf_func_id", "BPF_FUNC_map_lookup_elem"),
            Ok(true)
        );
        assert_eq!(
            enum_has(&data, "bpf_func_id", "BPF_FUNC_task_pt_regs"),
            Ok(true)
        );
        assert_eq!(
            enum_has(&data, "bpf_func_id", "BPF_FUNC_no_such_helper"),
            Ok(false)
        );
        assert_eq!(
            enum_has(&data, "no_such_enum", "X"),
            Err(BtfError::NoStruct("enum no_such_enum".into()))
        );
        assert!(enum_has(&blob(), "bpf_func_id", "X").is_err());
    }

    /// The running kernel's task_struct: `tgid` follows `pid` (both pid_t) in every kernel since
    /// 2.6, which checks the walk over a real vmlinux BTF of ~100,000 types of every kind.
    #[test]
    fn reads_task_struct_from_the_running_kernel() {
        let data = std::fs::read(VMLINUX).expect("this kernel publishes BTF");
        let pid = member_offset(&data, "task_struct", "pid").expect("pid");
        let tgid = member_offset(&data, "task_struct", "tgid").expect("tgid");
        assert_eq!(tgid, pid + 4);
        assert!(pid > 0);
    }
}
