//! How records and index keys are laid out in sled. Values are postcard with a leading format
//! byte, because postcard is not self-describing and a later layout must be told apart.

use serde::{Serialize, de::DeserializeOwned};

use crate::error::{Error, Result};

const FORMAT_V1: u8 = 1;
/// The records of this release: the approval and the audit entry gained a last field (`ext`).
const FORMAT_V2: u8 = 2;

/// Zero bytes that stand for the fields a record gained after it was written: every field
/// added since V1 is last in its record, and its default (empty strings, lists and options)
/// is written by postcard as zero bytes, which `from_bytes` reads and then stops, whatever
/// follows.
const V1_GAINED: [u8; 16] = [0; 16];

pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    let mut out = vec![FORMAT_V2];
    let body = postcard::to_allocvec(value)
        .map_err(|e| Error::Storage(format!("cannot encode record: {e}")))?;
    out.extend_from_slice(&body);
    Ok(out)
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    let corrupt = |e: postcard::Error| Error::Storage(format!("corrupt record: {e}"));
    match bytes.split_first() {
        Some((&FORMAT_V2, body)) => postcard::from_bytes(body).map_err(corrupt),
        Some((&FORMAT_V1, body)) => {
            let mut body = body.to_vec();
            body.extend_from_slice(&V1_GAINED);
            postcard::from_bytes(&body).map_err(corrupt)
        }
        Some((format, _)) => Err(Error::Storage(format!(
            "record has unknown format {format}"
        ))),
        None => Err(Error::Storage("empty record".into())),
    }
}

/// `created_ms ++ arrival ++ request_id`: listing in the order requests arrived (the arrival
/// counter breaks ties within a millisecond).
pub fn created_key(created_ms: u64, arrival: u64, request_id: &str) -> Vec<u8> {
    let mut k = created_ms.to_be_bytes().to_vec();
    k.extend_from_slice(&arrival.to_be_bytes());
    k.extend_from_slice(request_id.as_bytes());
    k
}

/// The first key at or after `created_ms`.
pub fn created_bound(created_ms: u64) -> Vec<u8> {
    created_ms.to_be_bytes().to_vec()
}

/// The request id behind a `created_key`.
pub fn created_key_id(key: &[u8]) -> Option<String> {
    String::from_utf8(key.get(16..)?.to_vec()).ok()
}

/// `deadline_ms ++ request_id`: the timer reads the first entry.
pub fn deadline_key(deadline_ms: u64, request_id: &str) -> Vec<u8> {
    let mut k = deadline_ms.to_be_bytes().to_vec();
    k.extend_from_slice(request_id.as_bytes());
    k
}

/// The deadline and request id behind a `deadline_key`.
pub fn split_deadline_key(key: &[u8]) -> Option<(u64, String)> {
    if key.len() < 8 {
        return None;
    }
    let (time, id) = key.split_at(8);
    let time = u64::from_be_bytes(time.try_into().ok()?);
    Some((time, String::from_utf8(id.to_vec()).ok()?))
}

/// `owner ++ 0x00 ++ suffix`: secondary indexes by run or by request. Ids never hold NUL (the
/// subscriber refuses them), so a prefix scan of `owner ++ 0x00` finds exactly one owner.
pub fn owned_key(owner: &str, suffix: &[u8]) -> Vec<u8> {
    let mut k = owner_prefix(owner);
    k.extend_from_slice(suffix);
    k
}

pub fn owner_prefix(owner: &str) -> Vec<u8> {
    let mut k = owner.as_bytes().to_vec();
    k.push(0);
    k
}

pub fn id_key(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

/// The id behind an `id_key` (0 for anything else).
pub fn read_id(bytes: &[u8]) -> u64 {
    <[u8; 8]>::try_from(bytes).map_or(0, u64::from_be_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_unknown_formats_are_errors() {
        let bytes = encode(&("a".to_string(), 7u64)).unwrap();
        assert_eq!(decode::<(String, u64)>(&bytes).unwrap(), ("a".into(), 7));
        assert!(decode::<(String, u64)>(&[9, 1, 2]).is_err());
        assert!(decode::<(String, u64)>(&[]).is_err());
    }

    #[test]
    fn a_record_of_the_previous_format_reads_with_its_new_fields_empty() {
        #[derive(Serialize)]
        struct Before {
            id: String,
            n: u64,
        }
        #[derive(Debug, PartialEq, serde::Deserialize)]
        struct After {
            id: String,
            n: u64,
            ext: (String, Option<u8>, Vec<String>),
        }
        let mut v1 = vec![FORMAT_V1];
        v1.extend(
            postcard::to_allocvec(&Before {
                id: "r".into(),
                n: 300,
            })
            .unwrap(),
        );
        let read: After = decode(&v1).unwrap();
        assert_eq!(
            read,
            After {
                id: "r".into(),
                n: 300,
                ext: Default::default()
            }
        );
    }

    #[test]
    fn time_keys_sort_by_time_then_arrival_and_split_back() {
        let a = created_key(5, 9, "zzz");
        let b = created_key(6, 1, "aaa");
        let c = created_key(6, 2, "000");
        assert!(a < b && b < c);
        assert!(created_bound(6) <= b && created_bound(6) > a);
        assert_eq!(created_key_id(&c).as_deref(), Some("000"));
        let d = deadline_key(7, "r1");
        assert_eq!(split_deadline_key(&d), Some((7, "r1".into())));
    }
}
