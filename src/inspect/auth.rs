//! Who may use the inspector: with `debug.token` set, a request must carry it as `Authorization: Bearer`
//! (scheme case-insensitive) or in the cookie a browser got from the one-time form. Compared as hashes, so the
//! time taken says nothing of how much matched.

use http::{header, HeaderMap};

/// The cookie that keeps the token in a browser (`HttpOnly`, `SameSite=Strict`, `Path=/debug/`).
pub const COOKIE: &str = "sse_gateway_debug";

/// The token a request must carry, if any.
pub struct Auth {
    token: Option<blake3::Hash>,
}

impl Auth {
    /// `token` empty: no token (allowed only on a loopback admin listener; the config checks it).
    pub fn new(token: &str) -> Self {
        Self {
            token: (!token.is_empty()).then(|| blake3::hash(token.as_bytes())),
        }
    }

    /// Whether no token is needed.
    pub fn is_open(&self) -> bool {
        self.token.is_none()
    }

    /// Whether `given` is the token (constant time: `blake3::Hash` compares so).
    pub fn matches(&self, given: &[u8]) -> bool {
        self.token.is_some_and(|t| t == blake3::hash(given))
    }

    /// Whether the request may see the inspector.
    pub fn allows(&self, headers: &HeaderMap) -> bool {
        if self.is_open() {
            return true;
        }
        if let Some(t) = headers.get(header::AUTHORIZATION).and_then(|v| bearer(v.as_bytes())) {
            return self.matches(t);
        }
        headers
            .get_all(header::COOKIE)
            .iter()
            .flat_map(|v| v.as_bytes().split(|b| *b == b';'))
            .filter_map(|pair| {
                let pair = pair.trim_ascii();
                let eq = memchr::memchr(b'=', pair)?;
                (&pair[..eq] == COOKIE.as_bytes()).then(|| &pair[eq + 1..])
            })
            .any(|v| self.matches(v))
    }

    /// The `Set-Cookie` value that keeps `token` for `/debug/`.
    pub fn cookie(token: &str) -> String {
        format!("{COOKIE}={token}; Path=/debug/; HttpOnly; SameSite=Strict")
    }
}

/// The credentials of an `Authorization: Bearer <token>` value (scheme case-insensitive, RFC 9110 11.1).
fn bearer(v: &[u8]) -> Option<&[u8]> {
    let sp = memchr::memchr(b' ', v)?;
    let (scheme, rest) = (&v[..sp], &v[sp..]);
    scheme.eq_ignore_ascii_case(b"bearer").then(|| rest.trim_ascii())
}

/// The `token` field of an `application/x-www-form-urlencoded` body (percent-decoded, `+` as space).
pub fn form_token(body: &[u8]) -> Option<Vec<u8>> {
    let value = body
        .split(|b| *b == b'&')
        .find_map(|pair| pair.strip_prefix(b"token="))?;
    let mut out = Vec::with_capacity(value.len());
    let mut i = 0;
    while i < value.len() {
        match value[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = value.get(i + 1..i + 3)?;
                let s = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(s, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    fn headers(name: header::HeaderName, v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        let a = Auth::new(TOKEN);
        for scheme in ["Bearer", "bearer", "BEARER"] {
            assert!(a.allows(&headers(header::AUTHORIZATION, &format!("{scheme} {TOKEN}"))));
        }
        assert!(!a.allows(&headers(header::AUTHORIZATION, &format!("Basic {TOKEN}"))));
        assert!(!a.allows(&headers(header::AUTHORIZATION, "Bearer nope")));
        assert!(!a.allows(&HeaderMap::new()));
    }

    #[test]
    fn the_cookie_is_read_among_others() {
        let a = Auth::new(TOKEN);
        assert!(a.allows(&headers(header::COOKIE, &format!("x=1; {COOKIE}={TOKEN}"))));
        assert!(!a.allows(&headers(header::COOKIE, &format!("{COOKIE}x={TOKEN}"))));
        let c = Auth::cookie(TOKEN);
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.contains("Path=/debug/"));
    }

    #[test]
    fn no_token_allows_all() {
        assert!(Auth::new("").allows(&HeaderMap::new()));
    }

    #[test]
    fn the_form_token_is_decoded() {
        assert_eq!(form_token(b"a=1&token=ab%2Fc+d").as_deref(), Some(b"ab/c d".as_ref()));
        assert_eq!(form_token(b"token=%zz"), None);
        assert_eq!(form_token(b"other=1"), None);
    }
}
