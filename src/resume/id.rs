//! Stream tokens and event ids: `sg1-<token>-<seq>`, the token 128 random bits in lowercase hex, the seq the
//! event's position in its stream (1 for the first).

use std::fmt;

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

/// What starts an `id:` line of ours.
pub const ID_FIELD: &[u8] = b"id: ";

/// The longest `id:` line of ours, newline included.
const MAX_ID_LINE: usize = ID_FIELD.len() + MAX_ID_LEN + 1;

/// A stream's next `id:` line (`id: sg1-<token>-<seq>\n`), kept whole and counted up in place: an event's id is
/// one copy, with no number formatted or length computed per event. Inline (no allocation of its own).
#[derive(Debug, Clone)]
pub struct IdLine {
    line: [u8; MAX_ID_LINE],
    len: u8,
    /// Where the digits start (after `ID_FIELD` and the stem).
    head: u8,
}

impl IdLine {
    /// The line of event `seq` of the stream `token`.
    pub fn new(token: &Token, seq: u64) -> Self {
        let mut line = [0; MAX_ID_LINE];
        let mut len = 0;
        for part in [ID_FIELD, PREFIX.as_bytes(), token.hex().as_bytes(), b"-"] {
            line[len..len + part.len()].copy_from_slice(part);
            len += part.len();
        }
        let head = len;
        for part in [Decimal::new(seq).as_bytes(), b"\n"] {
            line[len..len + part.len()].copy_from_slice(part);
            len += part.len();
        }
        Self {
            line,
            len: len as u8,
            head: head as u8,
        }
    }

    /// The line, newline included.
    pub fn as_bytes(&self) -> &[u8] {
        &self.line[..usize::from(self.len)]
    }

    /// `sg1-<token>-`: what the stream's ids start with.
    #[cfg(test)]
    fn stem(&self) -> &[u8] {
        &self.line[ID_FIELD.len()..usize::from(self.head)]
    }

    /// The length of event `seq`'s line.
    pub fn len_of(&self, seq: u64) -> usize {
        usize::from(self.head) + seq.checked_ilog10().map_or(1, |l| l as usize + 1) + 1
    }

    /// Becomes the next event's line: most steps change one digit. It counts on past `u64::MAX` (no stream gets
    /// near it) and stays at twenty nines, the most an id holds.
    pub fn increment(&mut self) {
        let (head, end) = (usize::from(self.head), usize::from(self.len) - 1);
        for d in self.line[head..end].iter_mut().rev() {
            if *d != b'9' {
                *d += 1;
                return;
            }
            *d = b'0';
        }
        if end - head == 20 {
            self.line[head..end].fill(b'9');
            return;
        }
        // One digit more: `1` and the zeros, then the newline.
        self.line.copy_within(head..=end, head + 1);
        self.line[head] = b'1';
        self.len += 1;
    }
}

/// A number's decimal digits, written on the stack (once per event stored or id line made: no allocation). A
/// stream's next id is counted up in place instead (`IdLine`).
#[derive(Debug, Clone)]
pub struct Decimal {
    digits: [u8; 20],
    at: u8,
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
        Self { digits, at: at as u8 }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.digits[usize::from(self.at)..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_round_trips_and_anything_else_is_not_ours() {
        let t = Token::random().unwrap();
        let stem = format!("sg1-{}-", t.hex());
        for seq in [0, 1, 9, 10, 99, 100, u64::MAX] {
            let line = IdLine::new(&t, seq);
            assert_eq!(line.as_bytes(), format!("id: sg1-{}-{seq}\n", t.hex()).as_bytes());
            assert_eq!(line.stem(), stem.as_bytes(), "{seq}");
            assert_eq!(line.len_of(seq), line.as_bytes().len(), "{seq}");
        }
        let line = IdLine::new(&t, u64::MAX);
        let text = std::str::from_utf8(line.as_bytes()).unwrap();
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
    fn an_id_line_counted_up_is_the_next_events_line() {
        let t = Token::random().unwrap();
        let line_of = |seq: &dyn std::fmt::Display| format!("id: sg1-{}-{seq}\n", t.hex()).into_bytes();
        let mut line = IdLine::new(&t, 0);
        for n in 1..=100_500u64 {
            line.increment();
            assert_eq!(line.as_bytes(), line_of(&n));
            assert_eq!(line.stem(), format!("sg1-{}-", t.hex()).as_bytes());
        }
        for start in [9_999_999u64, 10u64.pow(19) - 1, u64::MAX - 1, u64::MAX] {
            let mut line = IdLine::new(&t, start);
            line.increment();
            assert_eq!(line.as_bytes(), line_of(&(u128::from(start) + 1)), "{start}");
        }
        // Twenty nines, the most an id holds: it stays there.
        let nines = line_of(&"99999999999999999999");
        let mut line = IdLine::new(&t, 0);
        line.line[..nines.len()].copy_from_slice(&nines);
        (line.len, line.head) = (nines.len() as u8, (nines.len() - 21) as u8);
        line.increment();
        assert_eq!(line.as_bytes(), nines);
        assert_eq!(line.as_bytes().len(), MAX_ID_LINE);
    }

    #[test]
    fn tokens_differ_and_never_print() {
        let (a, b) = (Token::random().unwrap(), Token::random().unwrap());
        assert_ne!(a, b);
        assert_eq!(format!("{a:?}"), "Token(..)");
        assert_eq!(Token::parse(&a.hex()), Some(a));
    }
}
