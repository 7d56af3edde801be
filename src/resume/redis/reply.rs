//! Reading Redis's replies of Stream entries: an `XRANGE`'s entries, and which streams an `XREAD` names (RESP2 or
//! RESP3).

use redis::Value;

use super::error::StoreError;
use super::keys::{parse_entry_id, EVENT_FIELD};

/// The entries of an `XRANGE` reply (or of one stream of an `XREAD` reply): `(seq, event bytes)`.
pub(super) fn parse_entries(op: &'static str, v: Value) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
    let bad = |what: &str| StoreError::Reply {
        op,
        what: what.to_owned(),
    };
    let Value::Array(items) = v else {
        return match v {
            Value::Nil => Ok(Vec::new()),
            _ => Err(bad("entries not an array")),
        };
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Value::Array(mut pair) = item else {
            return Err(bad("entry not an array"));
        };
        if pair.len() != 2 {
            return Err(bad("entry not [id, fields]"));
        }
        let fields = pair.pop();
        let id = match pair.pop() {
            Some(Value::BulkString(id)) => parse_entry_id(&id).ok_or_else(|| bad("entry id not 0-<seq>"))?,
            Some(Value::SimpleString(id)) => {
                parse_entry_id(id.as_bytes()).ok_or_else(|| bad("entry id not 0-<seq>"))?
            }
            _ => return Err(bad("entry id not a string")),
        };
        let fields = match fields {
            Some(Value::Array(f)) => f,
            Some(Value::Map(m)) => m.into_iter().flat_map(|(k, v)| [k, v]).collect(),
            _ => return Err(bad("entry fields not an array")),
        };
        let mut data = None;
        let mut it = fields.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            if matches!(&k, Value::BulkString(k) if k == EVENT_FIELD.as_bytes()) {
                if let Value::BulkString(v) = v {
                    data = Some(v);
                }
            }
        }
        out.push((id, data.ok_or_else(|| bad("entry without its event"))?));
    }
    Ok(out)
}

/// The keys of the streams in an `XREAD` reply: `Nil` on a timeout, else `[[key, entries]]` (RESP2) or
/// `{key: entries}` (RESP3).
pub(super) fn xread_keys(v: Value) -> Vec<Vec<u8>> {
    let key = |k: Value| match k {
        Value::BulkString(k) => Some(k),
        Value::SimpleString(k) => Some(k.into_bytes()),
        _ => None,
    };
    match v {
        Value::Array(streams) => streams
            .into_iter()
            .filter_map(|s| match s {
                Value::Array(mut kv) if kv.len() == 2 => {
                    kv.truncate(1);
                    kv.pop().and_then(key)
                }
                _ => None,
            })
            .collect(),
        Value::Map(m) => m.into_iter().filter_map(|(k, _)| key(k)).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::keys::entry_id;
    use super::*;

    fn entry(seq: u64, data: &[u8]) -> Value {
        Value::Array(vec![
            Value::BulkString(entry_id(seq).as_bytes().to_vec()),
            Value::Array(vec![Value::BulkString(b"e".to_vec()), Value::BulkString(data.to_vec())]),
        ])
    }

    #[test]
    fn xrange_replies_parse() {
        let v = Value::Array(vec![entry(1, b"a"), entry(2, b"bc")]);
        assert_eq!(
            parse_entries("read", v).unwrap(),
            vec![(1, b"a".to_vec()), (2, b"bc".to_vec())]
        );
        assert!(parse_entries("read", Value::Nil).unwrap().is_empty());
        assert!(parse_entries("read", Value::Int(3)).is_err());
        let no_event = Value::Array(vec![Value::Array(vec![
            Value::BulkString(b"0-1".to_vec()),
            Value::Array(vec![Value::BulkString(b"x".to_vec()), Value::BulkString(b"y".to_vec())]),
        ])]);
        assert!(parse_entries("read", no_event).is_err());
    }

    #[test]
    fn xread_replies_name_their_streams_in_resp2_and_resp3() {
        assert!(xread_keys(Value::Nil).is_empty());
        let entries = Value::Array(vec![entry(7, b"x")]);
        let resp2 = Value::Array(vec![Value::Array(vec![
            Value::BulkString(b"k".to_vec()),
            entries.clone(),
        ])]);
        assert_eq!(xread_keys(resp2), vec![b"k".to_vec()]);
        let resp3 = Value::Map(vec![(Value::BulkString(b"k".to_vec()), entries)]);
        assert_eq!(xread_keys(resp3), vec![b"k".to_vec()]);
    }
}
