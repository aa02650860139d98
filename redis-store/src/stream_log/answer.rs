//! What Redis answers to the log's reads (`XRANGE`, `XREAD`, in RESP2 or
//! RESP3), as entries and end markers, and what a read returns for them.

use bytes::Bytes;
use redis::Value;

use super::{MARKER_ID, StreamEntry, StreamLogError, StreamRead, unexpected};

/// One entry of a Redis stream of this log.
pub(super) enum Item {
    Event(StreamEntry),
    /// The marker: finished (`true`) or full (`false`).
    End {
        finished: bool,
    },
}

/// What a read returns for these items: the events, and whether the stream
/// finished after them. A full stream read to its end is an error, never a
/// silent end.
pub(super) fn settle(items: Vec<Item>) -> Result<StreamRead, StreamLogError> {
    let mut entries = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Item::Event(entry) => entries.push(entry),
            Item::End { finished: true } => {
                return Ok(StreamRead {
                    entries,
                    finished: true,
                });
            }
            Item::End { finished: false } => {
                if entries.is_empty() {
                    return Err(StreamLogError::StreamFull);
                }
                // The events before the bound are still delivered; the
                // next read says the stream is full.
                return Ok(StreamRead {
                    entries,
                    finished: false,
                });
            }
        }
    }
    Ok(StreamRead {
        entries,
        finished: false,
    })
}

/// The entries of an `XRANGE` answer.
pub(super) fn parse_entries(value: &Value) -> Result<Vec<Item>, StreamLogError> {
    let Value::Array(list) = value else {
        return Err(unexpected());
    };
    list.iter().map(parse_entry).collect()
}

/// One `[id, [field, value, ...]]` entry.
fn parse_entry(value: &Value) -> Result<Item, StreamLogError> {
    let Value::Array(pair) = value else {
        return Err(unexpected());
    };
    let [id, fields] = pair.as_slice() else {
        return Err(unexpected());
    };
    let id = text(id).ok_or_else(unexpected)?;
    let fields: Vec<(&[u8], &Value)> = match fields {
        Value::Array(flat) => flat
            .chunks_exact(2)
            .filter_map(|kv| bytes(&kv[0]).map(|k| (k, &kv[1])))
            .collect(),
        Value::Map(map) => map
            .iter()
            .filter_map(|(k, v)| bytes(k).map(|k| (k, v)))
            .collect(),
        _ => return Err(unexpected()),
    };
    let field = |name: &[u8]| fields.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    if id == MARKER_ID {
        return Ok(Item::End {
            finished: field(b"end").is_some(),
        });
    }
    let seq = id
        .strip_prefix("0-")
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(unexpected)?;
    let event = field(b"ev").and_then(bytes).ok_or_else(unexpected)?;
    Ok(Item::Event(StreamEntry {
        seq,
        event: Bytes::copy_from_slice(event),
    }))
}

/// The entries of an `XREAD` answer on one key (`None`: the block timed
/// out).
pub(super) fn parse_xread(value: &Value) -> Result<Option<Vec<Item>>, StreamLogError> {
    let entries = match value {
        Value::Nil => return Ok(None),
        // RESP2: [[key, entries]].
        Value::Array(keys) => match keys.first() {
            Some(Value::Array(pair)) if pair.len() == 2 => &pair[1],
            None => return Ok(None),
            _ => return Err(unexpected()),
        },
        // RESP3: {key: entries}.
        Value::Map(map) => match map.first() {
            Some((_, entries)) => entries,
            None => return Ok(None),
        },
        _ => return Err(unexpected()),
    };
    parse_entries(entries).map(Some)
}

fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn text(value: &Value) -> Option<&str> {
    bytes(value).and_then(|b| std::str::from_utf8(b).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str, field: &str, value: &[u8]) -> Value {
        Value::Array(vec![
            Value::BulkString(id.as_bytes().to_vec()),
            Value::Array(vec![
                Value::BulkString(field.as_bytes().to_vec()),
                Value::BulkString(value.to_vec()),
            ]),
        ])
    }

    #[test]
    fn entries_and_markers_parse() {
        let value = Value::Array(vec![
            event("0-1", "ev", b"id: s:1\ndata: a\n\n"),
            event("0-2", "ev", b"id: s:2\ndata: b\n\n"),
            event("1-0", "end", b"1"),
        ]);
        let read = settle(parse_entries(&value).unwrap()).unwrap();
        assert!(read.finished);
        assert_eq!(read.entries.len(), 2);
        assert_eq!(read.entries[1].seq, 2);
        assert_eq!(&read.entries[0].event[..], b"id: s:1\ndata: a\n\n");
    }

    #[test]
    fn a_full_stream_is_an_error_once_read_to_its_bound() {
        let full = Value::Array(vec![event("1-0", "full", b"1")]);
        assert_eq!(
            settle(parse_entries(&full).unwrap()),
            Err(StreamLogError::StreamFull)
        );
        let some = Value::Array(vec![event("0-7", "ev", b"x"), event("1-0", "full", b"1")]);
        let read = settle(parse_entries(&some).unwrap()).unwrap();
        assert!(!read.finished, "never a silent end");
        assert_eq!(read.entries.len(), 1);
    }

    #[test]
    fn xread_answers_parse_in_both_protocols() {
        assert!(parse_xread(&Value::Nil).unwrap().is_none());
        let entries = Value::Array(vec![event("0-3", "ev", b"x")]);
        let resp2 = Value::Array(vec![Value::Array(vec![
            Value::BulkString(b"k".to_vec()),
            entries.clone(),
        ])]);
        let resp3 = Value::Map(vec![(Value::BulkString(b"k".to_vec()), entries)]);
        for value in [resp2, resp3] {
            let items = parse_xread(&value).unwrap().unwrap();
            assert!(matches!(&items[0], Item::Event(e) if e.seq == 3));
        }
    }
}
