//! `multipart/byteranges` (RFC 9110 §14.6): the body of a 206 for several ranges, each part its
//! own small head (`Content-Type`, `Content-Range`) before its bytes, a boundary line between
//! them and a closing one after. The framing is built here, whole, before anything is sent, so
//! the response's `Content-Length` is exact and the parts' bytes can still go by sendfile.

/// One part: the object's bytes `start..start+len`, and the framing sent before them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// First byte of the object.
    pub start: u64,
    /// Bytes.
    pub len: u64,
    /// What goes before the bytes: nothing for a single range, else the boundary line and the
    /// part's head.
    pub head: Vec<u8>,
}

/// A ranged body: its parts in order and what follows the last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranged {
    /// The parts.
    pub parts: Vec<Part>,
    /// The closing boundary line (empty for a single range).
    pub tail: Vec<u8>,
    /// `multipart/byteranges; boundary=...` for several ranges.
    pub content_type: Option<String>,
}

impl Ranged {
    /// One range: its bytes alone.
    pub fn single(start: u64, len: u64) -> Ranged {
        Ranged {
            parts: vec![Part {
                start,
                len,
                head: Vec::new(),
            }],
            tail: Vec::new(),
            content_type: None,
        }
    }

    /// Several ranges (inclusive, ascending, none overlapping) of a representation of `total`
    /// bytes whose own `Content-Type` is `content_type`, separated by `boundary` (which the
    /// caller makes unlikely in the bytes: RFC 2046 §5.1.1).
    pub fn multipart(
        ranges: &[(u64, u64)],
        total: u64,
        content_type: Option<&[u8]>,
        boundary: &str,
    ) -> Ranged {
        let parts = ranges
            .iter()
            .map(|&(a, b)| {
                let mut head = format!("\r\n--{boundary}\r\n").into_bytes();
                if let Some(t) = content_type {
                    head.extend_from_slice(b"Content-Type: ");
                    head.extend_from_slice(t);
                    head.extend_from_slice(b"\r\n");
                }
                head.extend_from_slice(
                    format!("Content-Range: bytes {a}-{b}/{total}\r\n\r\n").as_bytes(),
                );
                Part {
                    start: a,
                    len: b - a + 1,
                    head,
                }
            })
            .collect();
        Ranged {
            parts,
            tail: format!("\r\n--{boundary}--\r\n").into_bytes(),
            content_type: Some(format!("multipart/byteranges; boundary={boundary}")),
        }
    }

    /// The body's length: every part's framing and bytes, and the tail.
    pub fn content_length(&self) -> u64 {
        self.parts
            .iter()
            .map(|p| p.head.len() as u64 + p.len)
            .sum::<u64>()
            + self.tail.len() as u64
    }

    /// The framing bytes alone (what is written, not sent from a file).
    pub fn framing_len(&self) -> u64 {
        self.parts.iter().map(|p| p.head.len() as u64).sum::<u64>() + self.tail.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_framing_is_the_rfcs_byte_for_byte() {
        let r = Ranged::multipart(&[(0, 1), (8, 9)], 10, Some(b"video/mp4"), "zc1");
        let mut body = Vec::new();
        let object = b"0123456789";
        for p in &r.parts {
            body.extend_from_slice(&p.head);
            body.extend_from_slice(&object[p.start as usize..(p.start + p.len) as usize]);
        }
        body.extend_from_slice(&r.tail);
        assert_eq!(
            String::from_utf8(body.clone()).unwrap_or_default(),
            "\r\n--zc1\r\nContent-Type: video/mp4\r\nContent-Range: bytes 0-1/10\r\n\r\n01\
             \r\n--zc1\r\nContent-Type: video/mp4\r\nContent-Range: bytes 8-9/10\r\n\r\n89\
             \r\n--zc1--\r\n"
        );
        assert_eq!(r.content_length(), body.len() as u64);
        assert_eq!(r.framing_len(), body.len() as u64 - 4);
        assert_eq!(
            r.content_type.as_deref(),
            Some("multipart/byteranges; boundary=zc1")
        );
        // Without a Content-Type of its own, a part has only its range.
        let r = Ranged::multipart(&[(0, 0), (2, 2)], 3, None, "b");
        assert_eq!(
            r.parts[1].head,
            b"\r\n--b\r\nContent-Range: bytes 2-2/3\r\n\r\n"
        );
        let one = Ranged::single(5, 3);
        assert_eq!((one.content_length(), one.framing_len()), (3, 0));
    }
}
