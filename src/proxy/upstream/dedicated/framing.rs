//! The response body's framing (RFC 9112 §6): how its end is known, and the chunked decoder.
//!
//! Sans-I/O: a read's bytes are decoded in place, the data moved over the framing, so one read makes one piece
//! of data however many chunks it held; state survives any cut between reads, so no partial line is buffered.

use crate::proxy::upstream::dedicated::error::Error;

/// Bytes of chunk extensions one body may carry (they are skipped; hyper's limit).
const MAX_EXTENSIONS: u64 = 16 << 10;
/// Bytes of trailer fields one body may carry (they are skipped).
const MAX_TRAILERS: u64 = 16 << 10;

/// How the body ends.
#[derive(Debug)]
pub enum Framing {
    /// `Content-Length`: this many bytes still to come.
    Length(u64),
    Chunked(Chunked),
    /// Until the connection closes.
    Close,
    /// Done (or there was no body).
    End,
    /// Bad framing met after data of the same read: that data goes on first, this error after it.
    Failed(&'static str),
}

impl Framing {
    /// Decodes `buf` in place: the body's data in it is moved to its start, and its length returned. Bytes past
    /// the end of the body are not data.
    pub fn decode(&mut self, buf: &mut [u8]) -> Result<usize, Error> {
        let n = match self {
            Framing::End => return Ok(0),
            Framing::Failed(why) => return Err(Error::Chunk(why)),
            Framing::Close => buf.len(),
            Framing::Length(left) => {
                let n = buf.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                *left -= n as u64;
                if *left == 0 {
                    *self = Framing::End;
                }
                n
            }
            Framing::Chunked(c) => match c.decode(buf) {
                Ok(n) => {
                    if c.state == State::End {
                        *self = Framing::End;
                    }
                    n
                }
                Err((0, why)) => return Err(Error::Chunk(why)),
                Err((n, why)) => {
                    *self = Framing::Failed(why);
                    n
                }
            },
        };
        Ok(n)
    }

    /// The connection closed: whether that ends the body or cuts it short.
    pub fn eof(&mut self) -> Result<(), Error> {
        match self {
            Framing::Close | Framing::End => {
                *self = Framing::End;
                Ok(())
            }
            Framing::Length(_) | Framing::Chunked(_) => Err(Error::Incomplete),
            Framing::Failed(why) => Err(Error::Chunk(why)),
        }
    }

    /// The error met after data already handed on, if any.
    pub fn failure(&self) -> Option<Error> {
        match self {
            Framing::Failed(why) => Some(Error::Chunk(why)),
            _ => None,
        }
    }

    pub fn is_end(&self) -> bool {
        matches!(self, Framing::End)
    }

    /// Bytes still to come, when the framing says.
    pub fn remaining(&self) -> Option<u64> {
        match self {
            Framing::Length(n) => Some(*n),
            Framing::End => Some(0),
            _ => None,
        }
    }
}

/// Where the chunked decoder is, in the grammar of RFC 9112 §7.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Hex digits of the size (`digits` so far).
    Size,
    /// Whitespace after the size, before `;` or CRLF.
    SizeSpace,
    Extension,
    SizeLf,
    /// `left` bytes of data.
    Data,
    DataCr,
    DataLf,
    /// At the start of a trailer line (or the final CRLF).
    TrailerStart,
    Trailer,
    TrailerLf,
    EndLf,
    End,
}

#[derive(Debug)]
pub struct Chunked {
    state: State,
    size: u64,
    digits: u8,
    left: u64,
    extensions: u64,
    trailers: u64,
}

impl Default for Chunked {
    fn default() -> Self {
        Self {
            state: State::Size,
            size: 0,
            digits: 0,
            left: 0,
            extensions: 0,
            trailers: 0,
        }
    }
}

impl Chunked {
    /// Decodes `buf` in place (the data moved over the framing); the data's length. On bad framing, the length
    /// of the data before it and why.
    fn decode(&mut self, buf: &mut [u8]) -> Result<usize, (usize, &'static str)> {
        let (mut read, mut written) = (0, 0);
        while read < buf.len() {
            match self.state {
                State::Data => {
                    let n = (buf.len() - read).min(usize::try_from(self.left).unwrap_or(usize::MAX));
                    buf.copy_within(read..read + n, written);
                    (read, written) = (read + n, written + n);
                    self.left -= n as u64;
                    if self.left == 0 {
                        self.state = State::DataCr;
                    }
                }
                State::End => break,
                _ => match self.whole_line(&buf[read..]) {
                    Some(n) => read += n,
                    None => {
                        self.step(buf[read]).map_err(|why| (written, why))?;
                        read += 1;
                    }
                },
            }
        }
        Ok(written)
    }

    /// The common case in one go: the CRLF after the last chunk's data (when due), hex digits, CRLF. The bytes
    /// taken, or none when the line is not all there or not that simple: the byte-wise path takes it then,
    /// errors included.
    fn whole_line(&mut self, bytes: &[u8]) -> Option<usize> {
        let at = match self.state {
            State::DataCr if bytes.starts_with(b"\r\n") => 2,
            State::Size if self.digits == 0 => 0,
            _ => return None,
        };
        let line = &bytes[at..];
        // 16 hex digits fill a u64; a 17th is left to the byte-wise path, which refuses it.
        let digits = line.iter().take(16).take_while(|b| b.is_ascii_hexdigit()).count();
        if digits == 0 || line.get(digits..digits + 2)? != b"\r\n" {
            return None;
        }
        let size = line[..digits]
            .iter()
            .fold(0u64, |n, &b| n << 4 | u64::from((b as char).to_digit(16).unwrap_or(0)));
        (self.size, self.digits, self.left) = (0, 0, size);
        self.state = if size == 0 { State::TrailerStart } else { State::Data };
        Some(at + digits + 2)
    }

    /// One byte of the framing (never of data).
    fn step(&mut self, b: u8) -> Result<(), &'static str> {
        use State::*;
        self.state = match (self.state, b) {
            (Size, _) if (b as char).is_ascii_hexdigit() => {
                // 16 hex digits fill a u64.
                if self.digits == 16 {
                    return Err("chunk size overflows");
                }
                self.digits += 1;
                self.size = self.size << 4 | u64::from((b as char).to_digit(16).unwrap_or(0));
                Size
            }
            (Size, _) if self.digits == 0 => return Err("chunk size line without a size"),
            (Size | SizeSpace, b' ' | b'\t') => SizeSpace,
            (Size | SizeSpace, b';') => Extension,
            (Size | SizeSpace | Extension, b'\r') => SizeLf,
            (Size | SizeSpace, _) => return Err("invalid chunk size line"),
            (Extension, b'\n') => return Err("newline in a chunk extension"),
            (Extension, _) => {
                self.extensions += 1;
                if self.extensions > MAX_EXTENSIONS {
                    return Err("chunk extensions over 16 KiB");
                }
                Extension
            }
            (SizeLf, b'\n') if self.size == 0 => TrailerStart,
            (SizeLf, b'\n') => {
                self.left = self.size;
                Data
            }
            (SizeLf, _) => return Err("chunk size line without LF"),
            (DataCr, b'\r') => DataLf,
            (DataCr, _) => return Err("chunk data without CRLF"),
            (DataLf, b'\n') => {
                (self.size, self.digits) = (0, 0);
                Size
            }
            (DataLf, _) => return Err("chunk data without CRLF"),
            (TrailerStart, b'\r') => EndLf,
            (TrailerStart | Trailer, _) => {
                self.trailers += 1;
                if self.trailers > MAX_TRAILERS {
                    return Err("trailers over 16 KiB");
                }
                if b == b'\r' {
                    TrailerLf
                } else {
                    Trailer
                }
            }
            (TrailerLf, b'\n') => TrailerStart,
            (TrailerLf, _) => return Err("trailer line without LF"),
            (EndLf, b'\n') => End,
            (EndLf, _) => return Err("last chunk without CRLF"),
            (Data | End, _) => unreachable!("data and the end are not stepped"),
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `parts` fed one after another; the data, and whether the body ended.
    fn run(f: &mut Framing, parts: &[&[u8]]) -> Result<(Vec<u8>, bool), Error> {
        let mut out = Vec::new();
        for p in parts {
            let mut buf = p.to_vec();
            let n = f.decode(&mut buf)?;
            out.extend_from_slice(&buf[..n]);
        }
        match f.failure() {
            Some(e) => Err(e),
            None => Ok((out, f.is_end())),
        }
    }

    fn chunked() -> Framing {
        Framing::Chunked(Chunked::default())
    }

    const BODY: &[u8] = b"5\r\nhello\r\n6;ext=1;q=\"a\"\r\n world\r\nA  \r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n";

    #[test]
    fn a_chunked_body_decodes_whatever_the_cuts() {
        let want = b"hello world0123456789".to_vec();
        assert_eq!(run(&mut chunked(), &[BODY]).unwrap(), (want.clone(), true));
        for cut in 0..BODY.len() {
            let got = run(&mut chunked(), &[&BODY[..cut], &BODY[cut..]]).unwrap();
            assert_eq!(got, (want.clone(), true), "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = BODY.chunks(1).collect();
        assert_eq!(run(&mut chunked(), &bytes).unwrap(), (want, true), "byte by byte");
    }

    #[test]
    fn malformed_chunks_are_errors() {
        for bad in [
            &b"zz-not-a-size\r\n"[..],
            b"\r\n",
            b";ext\r\n",
            b"5\nhello\r\n",
            b"5\r\nhelloXX",
            b"5\r\nhello\n",
            b"5 x\r\n",
            b"5;a\nb\r\n",
            b"11111111111111111\r\n",
            b"1\r\na\r\n11111111111111111\r\n",
            b"0\r\n\rX",
            b"0\r\nX-T: 1\rX",
        ] {
            let got = run(&mut chunked(), &[bad]);
            assert!(
                matches!(got, Err(Error::Chunk(_))),
                "{:?}: {got:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn data_before_bad_framing_in_the_same_read_comes_first() {
        let mut f = chunked();
        let mut buf = b"3\r\none\r\nzz\r\n".to_vec();
        assert_eq!(f.decode(&mut buf).unwrap(), 3);
        assert_eq!(&buf[..3], b"one");
        assert!(matches!(f.failure(), Some(Error::Chunk(_))));
        assert!(f.decode(&mut []).is_err() && f.eof().is_err(), "and the error stays");
    }

    #[test]
    fn extensions_and_trailers_are_bounded() {
        let mut long = b"1;".to_vec();
        long.extend(std::iter::repeat_n(b'a', MAX_EXTENSIONS as usize + 1));
        assert!(matches!(run(&mut chunked(), &[&long]), Err(Error::Chunk(_))));
        let mut trailers = b"0\r\nX-Long: ".to_vec();
        trailers.extend(std::iter::repeat_n(b'a', MAX_TRAILERS as usize));
        assert!(matches!(run(&mut chunked(), &[&trailers]), Err(Error::Chunk(_))));
    }

    #[test]
    fn a_body_cut_short_is_incomplete_and_close_delimited_ends_at_eof() {
        let mut f = chunked();
        run(&mut f, &[b"5\r\nhel"]).unwrap();
        assert!(matches!(f.eof(), Err(Error::Incomplete)));
        let mut f = Framing::Length(10);
        assert_eq!(run(&mut f, &[b"12345"]).unwrap(), (b"12345".to_vec(), false));
        assert_eq!(f.remaining(), Some(5));
        assert!(matches!(f.eof(), Err(Error::Incomplete)));
        let mut f = Framing::Close;
        assert_eq!(run(&mut f, &[b"ab", b"c"]).unwrap(), (b"abc".to_vec(), false));
        assert!(f.eof().is_ok() && f.is_end());
    }

    #[test]
    fn bytes_past_the_end_are_not_data() {
        let mut f = Framing::Length(3);
        assert_eq!(run(&mut f, &[b"abcdef"]).unwrap(), (b"abc".to_vec(), true));
        let mut f = chunked();
        assert_eq!(
            run(&mut f, &[b"1\r\na\r\n0\r\n\r\nHTTP/1.1"]).unwrap(),
            (b"a".to_vec(), true)
        );
    }
}
