//! Stream tokens and event ids: `sg1-<token>-<seq>`, the token 128 random bits in lowercase hex, the seq the
//! event's position in its stream (1 for the first).

use std::fmt;

use bytes::BytesMut;

/// What starts every id of ours; a `Last-Event-ID` without it is not ours and is forwarded.
pub const PREFIX: &str = "sg1-";
/// Longest id of ours: prefix, 32 hex digits, `-`, a u64.
pub const MAX_ID_LEN: usize = PREFIX.len() + 32 + 1 + 20;

/// The unguessable name of one stream.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token([u8; 16]);

impl Token {
    /// 128 bits from the OS's generator; `None` only if the OS has none to give.
    pub fn random() -> Option<Self> {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b).ok()?;
        Some(Token(b))
    }

    /// Exactly 32 lowercase hex digits.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.as_bytes();
        if s.len() != 32 {
            return None;
        }
        let mut b = [0u8; 16];
        for (i, pair) in s.chunks_exact(2).enumerate() {
            b[i] = (hex_digit(pair[0])? << 4) | hex_digit(pair[1])?;
        }
        Some(Token(b))
    }

    pub fn hex(&self) -> String {
        let mut s = String::with_capacity(32);
        for b in self.0 {
            s.push(char::from(HEX[usize::from(b >> 4)]));
            s.push(char::from(HEX[usize::from(b & 15)]));
        }
        s
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// Never the value: a token read from a log would open the stream.
impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

/// An event id of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventId {
    pub token: Token,
    pub seq: u64,
}

impl EventId {
    /// `None` for anything not of our format (it is then not ours). A seq of 0 means "before the first event".
    pub fn parse(s: &str) -> Option<Self> {
        let rest = s.strip_prefix(PREFIX)?;
        let (token, seq) = rest.split_once('-')?;
        if seq.is_empty() || seq.len() > 20 || !seq.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(EventId {
            token: Token::parse(token)?,
            seq: seq.parse().ok()?,
        })
    }
}

/// Length of the `id:` line of event `seq`, newline included.
pub fn id_line_len(stem: &[u8], seq: u64) -> usize {
    "id: \n".len() + stem.len() + seq.checked_ilog10().map_or(1, |l| l as usize + 1)
}

/// Appends the `id:` line of event `seq` (`id_line_len` bytes) to `dst`.
pub fn put_id_line(dst: &mut BytesMut, stem: &[u8], seq: u64) {
    dst.extend_from_slice(b"id: ");
    dst.extend_from_slice(stem);
    dst.extend_from_slice(Decimal::new(seq).as_bytes());
    dst.extend_from_slice(b"\n");
}

/// A number's decimal digits, written on the stack (once per event held or stored: no allocation).
pub struct Decimal {
    digits: [u8; 20],
    at: usize,
}

impl Decimal {
    pub fn new(mut n: u64) -> Self {
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        Self { digits, at }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.digits[self.at..]
    }
}

/// `sg1-<token>-`: what every id of a stream starts with.
pub fn stem(token: &Token) -> Vec<u8> {
    format!("{PREFIX}{}-", token.hex()).into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_round_trips_and_anything_else_is_not_ours() {
        let t = Token::random().unwrap();
        let stem = stem(&t);
        for seq in [0, 1, 9, 10, 99, 100, u64::MAX] {
            let mut line = BytesMut::from(&b"data: x\n"[..]);
            put_id_line(&mut line, &stem, seq);
            assert_eq!(line.len(), "data: x\n".len() + id_line_len(&stem, seq), "{seq}");
            assert_eq!(&line[..], format!("data: x\nid: sg1-{}-{seq}\n", t.hex()).as_bytes());
        }
        let mut line = BytesMut::new();
        put_id_line(&mut line, &stem, u64::MAX);
        let text = std::str::from_utf8(&line).unwrap();
        let id = text.strip_prefix("id: ").unwrap().trim_end();
        assert_eq!(id.len(), MAX_ID_LEN);
        assert_eq!(
            EventId::parse(id),
            Some(EventId {
                token: t,
                seq: u64::MAX
            })
        );
        let good = format!("sg1-{}-0", t.hex());
        assert_eq!(EventId::parse(&good).map(|e| e.seq), Some(0));
        for bad in [
            "",
            "42",
            "sg1-",
            &format!("sg2-{}-1", t.hex()),
            &format!("sg1-{}-", t.hex()),
            &format!("sg1-{}-1x", t.hex()),
            &format!("sg1-{}-+1", t.hex()),
            &format!("sg1-{}-1", t.hex().to_uppercase()),
            &format!("sg1-{}-1", &t.hex()[1..]),
            &format!("sg1-{}-99999999999999999999", t.hex()),
            &format!("sg1-{}-123456789012345678901", t.hex()),
        ] {
            assert_eq!(EventId::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn tokens_differ_and_never_print() {
        let (a, b) = (Token::random().unwrap(), Token::random().unwrap());
        assert_ne!(a, b);
        assert_eq!(format!("{a:?}"), "Token(..)");
        assert_eq!(Token::parse(&a.hex()), Some(a));
    }
}
