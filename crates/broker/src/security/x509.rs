//! The subject of a client certificate as Kafka sees it: the distinguished name in RFC 2253
//! form, as Java's `X500Principal.getName()` writes it (`CN=alice,OU=eng,O=Acme`), since
//! that is the text `ssl.principal.mapping.rules` are written against.
//!
//! Only the subject is read, from a certificate rustls has already verified: a small DER
//! walk, with every length checked against what is left, rather than a full X.509 parser.

use std::fmt::Write as _;

/// A certificate that does not parse as far as its subject.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("certificate subject: {0}")]
pub struct SubjectError(&'static str);

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const INTEGER: u8 = 0x02;
const VERSION: u8 = 0xa0;

struct Der<'a> {
    rest: &'a [u8],
}

struct Tlv<'a> {
    tag: u8,
    content: &'a [u8],
    /// Tag, length and content: what Java hex-encodes for a value it has no string for.
    whole: &'a [u8],
}

impl<'a> Der<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    fn peek_tag(&self) -> Option<u8> {
        self.rest.first().copied()
    }

    fn next(&mut self) -> Result<Tlv<'a>, SubjectError> {
        let bytes = self.rest;
        let (&tag, after_tag) = bytes.split_first().ok_or(SubjectError("truncated"))?;
        if tag & 0x1f == 0x1f {
            return Err(SubjectError("multi-byte tag"));
        }
        let (&first, mut after_len) = after_tag.split_first().ok_or(SubjectError("truncated"))?;
        let len = if first < 0x80 {
            usize::from(first)
        } else {
            let count = usize::from(first & 0x7f);
            // 0x80 is BER's indefinite length, which DER forbids.
            if count == 0 || count > 4 || after_len.len() < count {
                return Err(SubjectError("bad length"));
            }
            let mut len = 0usize;
            for &b in &after_len[..count] {
                len = (len << 8) | usize::from(b);
            }
            after_len = &after_len[count..];
            len
        };
        if after_len.len() < len {
            return Err(SubjectError("truncated"));
        }
        let header = bytes.len() - after_len.len();
        let (content, rest) = after_len.split_at(len);
        self.rest = rest;
        Ok(Tlv {
            tag,
            content,
            whole: &bytes[..header + len],
        })
    }

    fn expect(&mut self, tag: u8) -> Result<Tlv<'a>, SubjectError> {
        let tlv = self.next()?;
        if tlv.tag != tag {
            return Err(SubjectError("unexpected field"));
        }
        Ok(tlv)
    }
}

/// The subject of the DER certificate `cert`, in RFC 2253 form.
pub fn subject_dn(cert: &[u8]) -> Result<String, SubjectError> {
    let certificate = Der::new(cert).expect(SEQUENCE)?;
    let tbs = Der::new(certificate.content).expect(SEQUENCE)?;
    let mut fields = Der::new(tbs.content);
    if fields.peek_tag() == Some(VERSION) {
        fields.next()?;
    }
    fields.expect(INTEGER)?; // serial number
    fields.expect(SEQUENCE)?; // signature algorithm
    fields.expect(SEQUENCE)?; // issuer
    fields.expect(SEQUENCE)?; // validity
    let subject = fields.expect(SEQUENCE)?;
    name_rfc2253(subject.content)
}

/// A Name's RDNs (the content of its SEQUENCE) as RFC 2253 text: the last RDN first, the
/// attributes of a multi-valued RDN joined by `+`.
fn name_rfc2253(name: &[u8]) -> Result<String, SubjectError> {
    let mut rdns = Vec::new();
    let mut seq = Der::new(name);
    while !seq.is_empty() {
        let rdn = seq.expect(SET)?;
        let mut attributes = Vec::new();
        let mut set = Der::new(rdn.content);
        while !set.is_empty() {
            let pair = set.expect(SEQUENCE)?;
            let mut pair = Der::new(pair.content);
            let oid = pair.expect(OID)?;
            let value = pair.next()?;
            attributes.push(attribute(oid.content, &value)?);
        }
        rdns.push(attributes.join("+"));
    }
    rdns.reverse();
    Ok(rdns.join(","))
}

fn attribute(oid: &[u8], value: &Tlv<'_>) -> Result<String, SubjectError> {
    let dotted = oid_text(oid)?;
    let keyword = match dotted.as_str() {
        "2.5.4.3" => Some("CN"),
        "2.5.4.6" => Some("C"),
        "2.5.4.7" => Some("L"),
        "2.5.4.8" => Some("ST"),
        "2.5.4.9" => Some("STREET"),
        "2.5.4.10" => Some("O"),
        "2.5.4.11" => Some("OU"),
        "0.9.2342.19200300.100.1.1" => Some("UID"),
        "0.9.2342.19200300.100.1.25" => Some("DC"),
        _ => None,
    };
    let text = match (keyword, string_value(value)) {
        (Some(keyword), Some(text)) => format!("{keyword}={}", escape(&text)),
        // Java writes attributes it has no keyword for, and values that are not strings,
        // as the dotted OID and `#` with the value's DER in hex.
        (keyword, _) => {
            let mut text = format!("{}=#", keyword.map_or(dotted.clone(), str::to_string));
            for b in value.whole {
                let _ = write!(text, "{b:02x}");
            }
            text
        }
    };
    Ok(text)
}

fn oid_text(oid: &[u8]) -> Result<String, SubjectError> {
    let mut arcs: Vec<u64> = Vec::new();
    let mut current: u64 = 0;
    for (i, &b) in oid.iter().enumerate() {
        if current > (u64::MAX >> 7) {
            return Err(SubjectError("OID arc too large"));
        }
        current = (current << 7) | u64::from(b & 0x7f);
        if b & 0x80 == 0 {
            if arcs.is_empty() {
                let (first, second) = match current {
                    0..=39 => (0, current),
                    40..=79 => (1, current - 40),
                    _ => (2, current - 80),
                };
                arcs.extend([first, second]);
            } else {
                arcs.push(current);
            }
            current = 0;
        } else if i + 1 == oid.len() {
            return Err(SubjectError("truncated OID"));
        }
    }
    if arcs.is_empty() {
        return Err(SubjectError("empty OID"));
    }
    Ok(arcs
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join("."))
}

/// The text of a directory string, or None for a value of another type.
fn string_value(value: &Tlv<'_>) -> Option<String> {
    match value.tag {
        // UTF8String, PrintableString, IA5String, VisibleString
        0x0c | 0x13 | 0x16 | 0x1a => std::str::from_utf8(value.content).ok().map(String::from),
        // TeletexString: Latin-1 as Java reads it.
        0x14 => Some(value.content.iter().map(|&b| char::from(b)).collect()),
        // BMPString: UTF-16BE.
        0x1e => {
            if !value.content.len().is_multiple_of(2) {
                return None;
            }
            let units: Vec<u16> = value
                .content
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect();
            String::from_utf16(&units).ok()
        }
        // UniversalString: UTF-32BE.
        0x1c => {
            if !value.content.len().is_multiple_of(4) {
                return None;
            }
            value
                .content
                .chunks_exact(4)
                .map(|c| char::from_u32(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
                .collect()
        }
        _ => None,
    }
}

/// RFC 2253 escaping as Java's `X500Principal` applies it: a backslash before each of
/// `,=+<>#;"\`, and before a leading or trailing space.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let last = value.chars().count().saturating_sub(1);
    for (i, c) in value.chars().enumerate() {
        if ",=+<>#;\"\\".contains(c) || (c == ' ' && (i == 0 || i == last)) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        if content.len() < 0x80 {
            out.push(content.len() as u8);
        } else {
            out.push(0x82);
            out.extend_from_slice(&(content.len() as u16).to_be_bytes());
        }
        out.extend_from_slice(content);
        out
    }

    fn attr(oid: &[u8], tag: u8, value: &[u8]) -> Vec<u8> {
        tlv(
            SET,
            &tlv(SEQUENCE, &[tlv(OID, oid), tlv(tag, value)].concat()),
        )
    }

    const CN: &[u8] = &[0x55, 0x04, 0x03];
    const O: &[u8] = &[0x55, 0x04, 0x0a];
    const OU: &[u8] = &[0x55, 0x04, 0x0b];
    const EMAIL: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x01];

    fn certificate(subject: &[u8]) -> Vec<u8> {
        let tbs = [
            tlv(VERSION, &tlv(INTEGER, &[2])),
            tlv(INTEGER, &[1]),
            tlv(SEQUENCE, &[]),
            tlv(SEQUENCE, &attr(CN, 0x0c, b"issuer")),
            tlv(SEQUENCE, &[]),
            tlv(SEQUENCE, subject),
            tlv(SEQUENCE, &[]),
        ]
        .concat();
        tlv(
            SEQUENCE,
            &[tlv(SEQUENCE, &tbs), tlv(SEQUENCE, &[]), tlv(0x03, &[0])].concat(),
        )
    }

    #[test]
    fn the_subject_reads_most_specific_first_as_java_writes_it() {
        let subject = [
            attr(O, 0x13, b"Acme, Inc"),
            attr(OU, 0x0c, b"eng"),
            attr(CN, 0x0c, b"alice"),
        ]
        .concat();
        assert_eq!(
            subject_dn(&certificate(&subject)).unwrap(),
            r"CN=alice,OU=eng,O=Acme\, Inc"
        );
    }

    #[test]
    fn unknown_attributes_are_the_oid_and_the_value_in_hex() {
        let subject = [attr(EMAIL, 0x16, b"a@b"), attr(CN, 0x0c, b" x+y ")].concat();
        assert_eq!(
            subject_dn(&certificate(&subject)).unwrap(),
            r"CN=\ x\+y\ ,1.2.840.113549.1.9.1=#1603614062"
        );
    }

    #[test]
    fn multi_valued_rdns_join_with_plus_and_bmp_strings_decode() {
        let pair =
            |oid: &[u8], tag: u8, v: &[u8]| tlv(SEQUENCE, &[tlv(OID, oid), tlv(tag, v)].concat());
        let rdn = tlv(
            SET,
            &[pair(CN, 0x1e, &[0, b'b', 0, b'o']), pair(OU, 0x0c, b"x")].concat(),
        );
        assert_eq!(subject_dn(&certificate(&rdn)).unwrap(), "CN=bo+OU=x");
    }

    #[test]
    fn truncated_or_garbage_certificates_are_errors_not_panics() {
        let good = certificate(&attr(CN, 0x0c, b"alice"));
        for end in 0..good.len() {
            let _ = subject_dn(&good[..end]);
        }
        assert!(subject_dn(&good[..good.len() - 1]).is_err());
        assert!(subject_dn(&[0x30, 0x80, 0, 0]).is_err());
        assert!(subject_dn(&[0x30, 0x85, 1, 1, 1, 1, 1]).is_err());
        assert!(subject_dn(b"").is_err());
    }
}
