//! JSON text as the native formatter writes it with Python's `json.dumps` (DESIGN 4, "JSON text"): a serde_json
//! [`Formatter`] over the parsed value, so clients that show or store a payload's string see the native bytes.
//!
//! Python's rules, as `json.encoder` implements them:
//! - separators `", "` and `": "` by default, `","` and `":"` for the compact style;
//! - short escapes `\"` `\\` `\b` `\f` `\n` `\r` `\t`, any other control character as `\u00XX` (lowercase hex);
//! - `ensure_ascii` (the default): every character outside `0x20..=0x7E` as `\uXXXX`, above U+FFFF as a UTF-16
//!   surrogate pair; DEL included. Without it, DEL, U+2028 and U+2029 are written as themselves;
//! - integers exactly as parsed (`-0` is the integer `0`); floats in `repr` form, the shortest text that reads back
//!   the same: `1.50` → `1.5`, `1e2` → `100.0`, `1e16` → `1e+16`, `1e-5` → `1e-05`, overflow → `Infinity`;
//! - key order kept (serde_json's `preserve_order`; a repeated key keeps its first place and its last value, as a
//!   Python dict does).

use std::io::{self, Write};

use serde::Serialize;
use serde_json::ser::{CharEscape, Formatter};
use serde_json::Value;

use crate::protocol::PyStyle;

impl PyStyle {
    fn ensure_ascii(self) -> bool {
        !matches!(self, PyStyle::Unicode)
    }

    fn compact(self) -> bool {
        matches!(self, PyStyle::CompactAscii)
    }
}

/// Appends `value` to `out` as Python writes it in `style`.
pub fn write(out: &mut Vec<u8>, value: &Value, style: PyStyle) {
    let mut ser = serde_json::Serializer::with_formatter(&mut *out, PyFormatter { style });
    // Serialising a `Value` into a Vec cannot fail: keys are strings and the writer never errs.
    let _ = value.serialize(&mut ser);
}

/// `value` as Python writes it in `style`.
pub fn to_string(value: &Value, style: PyStyle) -> String {
    let mut out = Vec::new();
    write(&mut out, value, style);
    // The formatter writes only UTF-8: serde_json's fragments and ASCII escapes.
    String::from_utf8(out).unwrap_or_default()
}

/// Parses `text` and writes it again in `style`; `None` when it is not JSON.
pub fn reformat(text: &str, style: PyStyle) -> Option<String> {
    let value: Value = serde_json::from_str(text).ok()?;
    Some(to_string(&value, style))
}

struct PyFormatter {
    style: PyStyle,
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn write_u16_escape<W: ?Sized + Write>(w: &mut W, unit: u16) -> io::Result<()> {
    let u = unit as usize;
    w.write_all(&[
        b'\\',
        b'u',
        HEX[u >> 12],
        HEX[(u >> 8) & 0xF],
        HEX[(u >> 4) & 0xF],
        HEX[u & 0xF],
    ])
}

impl Formatter for PyFormatter {
    fn write_string_fragment<W: ?Sized + Write>(&mut self, w: &mut W, fragment: &str) -> io::Result<()> {
        if !self.style.ensure_ascii() {
            return w.write_all(fragment.as_bytes());
        }
        // Runs of printable ASCII go out as they are; anything else (serde_json has already taken the control
        // characters, quotes and backslashes) as `\uXXXX`, one per UTF-16 unit.
        let bytes = fragment.as_bytes();
        let mut run = 0;
        for (i, c) in fragment.char_indices() {
            if (' '..='~').contains(&c) {
                continue;
            }
            w.write_all(&bytes[run..i])?;
            let mut units = [0u16; 2];
            for &unit in c.encode_utf16(&mut units).iter() {
                write_u16_escape(w, unit)?;
            }
            run = i + c.len_utf8();
        }
        w.write_all(&bytes[run..])
    }

    fn write_char_escape<W: ?Sized + Write>(&mut self, w: &mut W, escape: CharEscape) -> io::Result<()> {
        let short: &[u8] = match escape {
            CharEscape::Quote => b"\\\"",
            CharEscape::ReverseSolidus => b"\\\\",
            // Python never escapes `/`; serde_json's serializer never asks to either.
            CharEscape::Solidus => b"/",
            CharEscape::Backspace => b"\\b",
            CharEscape::FormFeed => b"\\f",
            CharEscape::LineFeed => b"\\n",
            CharEscape::CarriageReturn => b"\\r",
            CharEscape::Tab => b"\\t",
            CharEscape::AsciiControl(b) => return write_u16_escape(w, u16::from(b)),
        };
        w.write_all(short)
    }

    fn write_f64<W: ?Sized + Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        w.write_all(float_repr(value).as_bytes())
    }

    fn write_f32<W: ?Sized + Write>(&mut self, w: &mut W, value: f32) -> io::Result<()> {
        self.write_f64(w, f64::from(value))
    }

    fn write_number_str<W: ?Sized + Write>(&mut self, w: &mut W, number: &str) -> io::Result<()> {
        w.write_all(number_repr(number).as_bytes())
    }

    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.separator(w, first)
    }

    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.separator(w, first)
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(if self.style.compact() { b":" } else { b": " })
    }
}

impl PyFormatter {
    fn separator<W: ?Sized + Write>(&self, w: &mut W, first: bool) -> io::Result<()> {
        match (first, self.style.compact()) {
            (true, _) => Ok(()),
            (false, true) => w.write_all(b","),
            (false, false) => w.write_all(b", "),
        }
    }
}

/// A JSON number's text as Python writes the value `json.loads` makes of it: an integer literal stays exact, a
/// literal with a fraction or exponent is a float.
fn number_repr(number: &str) -> String {
    let is_float = number.bytes().any(|b| matches!(b, b'.' | b'e' | b'E'));
    if !is_float {
        // Python's int: `-0` is `0`; every other integer literal is already in Python's form.
        return if number.trim_start_matches('-').bytes().all(|b| b == b'0') {
            "0".to_owned()
        } else {
            number.to_owned()
        };
    }
    // A JSON number literal always parses; overflow gives an infinity, as in Python.
    float_repr(number.parse::<f64>().unwrap_or(f64::NAN))
}

/// Python's `repr(float)`: the shortest digits that read back the same (Rust's `{:e}` finds them), in fixed
/// notation when the decimal point falls within 16 digits of them, else as `d.ddde±XX`.
fn float_repr(value: f64) -> String {
    if value.is_nan() {
        return "NaN".to_owned();
    }
    if value.is_infinite() {
        return if value > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    let sci = format!("{:e}", value.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let exp: i32 = exp.parse().unwrap_or(0);
    // Python's `decpt`: the value is 0.DIGITS × 10^decpt.
    let decpt = exp + 1;
    let n = digits.len() as i32;
    let mut out = String::with_capacity(digits.len() + 8);
    if value.is_sign_negative() {
        out.push('-');
    }
    if decpt <= -4 || decpt > 16 {
        out.push_str(&digits[..1]);
        if n > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = decpt - 1;
        out.push_str(&format!("e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs()));
    } else if decpt <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-decpt) as usize));
        out.push_str(&digits);
    } else if decpt >= n {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (decpt - n) as usize));
        out.push_str(".0");
    } else {
        out.push_str(&digits[..decpt as usize]);
        out.push('.');
        out.push_str(&digits[decpt as usize..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(json: &str, style: PyStyle) -> String {
        reformat(json, style).expect("valid JSON")
    }

    // Expected strings are what CPython 3's `json.dumps` writes for the same value (json/encoder.py).

    #[test]
    fn separators_follow_the_style() {
        let v = r#"{"a":[1,{"b":null}],"c":true}"#;
        assert_eq!(dumps(v, PyStyle::Unicode), r#"{"a": [1, {"b": null}], "c": true}"#);
        assert_eq!(dumps(v, PyStyle::Ascii), r#"{"a": [1, {"b": null}], "c": true}"#);
        assert_eq!(dumps(v, PyStyle::CompactAscii), r#"{"a":[1,{"b":null}],"c":true}"#);
        assert_eq!(dumps("[]", PyStyle::Ascii), "[]");
        assert_eq!(dumps("{}", PyStyle::Ascii), "{}");
        assert_eq!(dumps(" [ 1 ,2 ] ", PyStyle::Ascii), "[1, 2]");
    }

    #[test]
    fn short_escapes_and_control_characters() {
        let s = r#""q\" bs\\ sl\/ b\b f\f n\n r\r t\t nul\u0000 us\u001F esc\u001b""#;
        let want = r#""q\" bs\\ sl/ b\b f\f n\n r\r t\t nul\u0000 us\u001f esc\u001b""#;
        assert_eq!(dumps(s, PyStyle::Ascii), want);
        assert_eq!(dumps(s, PyStyle::Unicode), want);
    }

    #[test]
    fn ensure_ascii_escapes_everything_outside_printable_ascii() {
        let s = "\"é \u{7f} \u{2028}\u{2029} \u{ffff} 😀 中\"";
        assert_eq!(
            dumps(s, PyStyle::Ascii),
            r#""\u00e9 \u007f \u2028\u2029 \uffff \ud83d\ude00 \u4e2d""#
        );
        assert_eq!(dumps(s, PyStyle::CompactAscii), dumps(s, PyStyle::Ascii));
    }

    #[test]
    fn without_ensure_ascii_characters_stay_themselves() {
        let s = r#""\u00e9 \u007f \u2028\u2029 \ud83d\ude00 \u4e2d \u0001""#;
        assert_eq!(
            dumps(s, PyStyle::Unicode),
            "\"é \u{7f} \u{2028}\u{2029} 😀 中 \\u0001\""
        );
    }

    #[test]
    fn keys_are_escaped_and_keep_their_order() {
        let v = r#"{"z":1,"é":2,"a\"b":3,"m":4}"#;
        assert_eq!(dumps(v, PyStyle::Ascii), r#"{"z": 1, "\u00e9": 2, "a\"b": 3, "m": 4}"#);
        assert_eq!(dumps(v, PyStyle::Unicode), r#"{"z": 1, "é": 2, "a\"b": 3, "m": 4}"#);
        // A repeated key keeps its first place and its last value, as a dict does.
        assert_eq!(dumps(r#"{"a":1,"b":2,"a":3}"#, PyStyle::Ascii), r#"{"a": 3, "b": 2}"#);
    }

    #[test]
    fn integers_are_exact() {
        assert_eq!(
            dumps(
                "[0,-0,7,-12,18446744073709551616,-123456789012345678901234567890]",
                PyStyle::Ascii
            ),
            "[0, 0, 7, -12, 18446744073709551616, -123456789012345678901234567890]"
        );
    }

    #[test]
    fn floats_are_written_as_python_repr() {
        let cases = [
            ("1.50", "1.5"),
            ("1e2", "100.0"),
            ("1E2", "100.0"),
            ("1.0", "1.0"),
            ("-0.0", "-0.0"),
            ("0.0", "0.0"),
            ("1e16", "1e+16"),
            ("1e15", "1000000000000000.0"),
            ("123456789012345678.0", "1.2345678901234568e+17"),
            ("0.0001", "0.0001"),
            ("0.00001", "1e-05"),
            ("1.0e-7", "1e-07"),
            ("123.456e5", "12345600.0"),
            ("3.141592653589793", "3.141592653589793"),
            ("0.1", "0.1"),
            ("2.5e-300", "2.5e-300"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
            ("1e400", "Infinity"),
            ("-1e400", "-Infinity"),
            ("5e-324", "5e-324"),
        ];
        for (json, want) in cases {
            assert_eq!(dumps(json, PyStyle::Ascii), want, "{json}");
        }
    }

    #[test]
    fn text_that_is_not_json_is_not_reformatted() {
        assert_eq!(reformat("{not json", PyStyle::Ascii), None);
        assert_eq!(reformat("", PyStyle::Ascii), None);
    }
}
