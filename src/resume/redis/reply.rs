//! Reading Redis's replies of Stream entries: an `XRANGE`'s entries, and which streams an `XREAD` names (RESP2 or
//! RESP3).

use redis::Value;

use super::error::StoreError;
use super::keys::{parse_entry_id, EVENTS_FIELD, EVENT_FIELD};

/// The events of an `XRANGE` reply (or of one stream of an `XREAD` reply), in order: `(seq, event bytes)`. An
/// entry `0-<last>` of `n` events holds events `last - n + 1 ..= last`.
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
        let last = match pair.pop() {
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
        let first = out.len();
        let mut it = fields.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            let event =
                matches!(&k, Value::BulkString(k) if k == EVENT_FIELD.as_bytes() || k == EVENTS_FIELD.as_bytes());
            if let (true, Value::BulkString(v)) = (event, v) {
                out.push((0, v));
            }
        }
        let n = (out.len() - first) as u64;
        if n == 0 {
            return Err(bad("entry without its event"));
        }
        if n > last {
            return Err(bad("entry id below its events' count"));
        }
        for (i, e) in out[first..].iter_mut().enumerate() {
            e.0 = last - n + 1 + i as u64;
        }
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
    fn an_entry_of_several_events_gives_each_its_seq() {
        let field = |k: &str, v: &[u8]| [Value::BulkString(k.as_bytes().to_vec()), Value::BulkString(v.to_vec())];
        let several = |last: u64, events: &[&[u8]]| {
            Value::Array(vec![
                Value::BulkString(entry_id(last).as_bytes().to_vec()),
                Value::Array(events.iter().flat_map(|e| field("es", e)).collect()),
            ])
        };
        let v = Value::Array(vec![entry(3, b"c"), several(6, &[b"d", b"e", b"f"]), entry(7, b"g")]);
        let want: Vec<(u64, Vec<u8>)> = (3..=7)
            .zip([b"c", b"d", b"e", b"f", b"g"])
            .map(|(s, e)| (s, e.to_vec()))
            .collect();
        assert_eq!(parse_entries("read", v).unwrap(), want);
        // RESP3 gives an entry's fields as a map: its events keep their order.
        let map = Value::Array(vec![Value::Array(vec![
            Value::BulkString(b"0-9".to_vec()),
            Value::Map(vec![
                (Value::BulkString(b"es".to_vec()), Value::BulkString(b"h".to_vec())),
                (Value::BulkString(b"es".to_vec()), Value::BulkString(b"i".to_vec())),
            ]),
        ])]);
        assert_eq!(
            parse_entries("read", map).unwrap(),
            vec![(8, b"h".to_vec()), (9, b"i".to_vec())]
        );
        // More events than the id leaves room for: not an entry of ours.
        assert!(parse_entries("read", Value::Array(vec![several(1, &[b"a", b"b"])])).is_err());
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
