//! What an approval is bound to: the SHA-256 of the RFC 8785 (JSON Canonicalization Scheme)
//! form of a tool call's arguments, or of a gate's context. Two values equal as JSON have one
//! digest, whatever their key order or number spelling; any other change gives another, so a
//! vote cast against a digest holds for exactly those arguments.

use serde_json::Value as Json;
use sha2::{Digest, Sha256};

/// The prefix of every digest, naming its algorithm (as Subresource Integrity does).
pub const PREFIX: &str = "sha256:";

/// `sha256:` + the lowercase hex SHA-256 of `value`'s canonical JSON.
pub fn of(value: &Json) -> String {
    // A `serde_json::Value` always canonicalises: its numbers are finite and its keys strings.
    let canonical = serde_json_canonicalizer::to_vec(value).unwrap_or_default();
    format!("{PREFIX}{}", hex::encode(Sha256::digest(&canonical)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn key_order_and_number_spelling_do_not_change_the_digest() {
        let a: Json = serde_json::from_str(r#"{"b": 1.0, "a": [1e2, "x"]}"#).unwrap();
        let b: Json = serde_json::from_str(r#"{"a": [100, "x"], "b": 1}"#).unwrap();
        assert_eq!(of(&a), of(&b));
        assert_ne!(of(&a), of(&json!({"a": [100, "x"], "b": 2})));
    }

    #[test]
    fn the_digest_is_sha256_of_the_canonical_form() {
        // RFC 8785 §3.2.3's ordering and the empty object, checked against `sha256sum`.
        let canonical =
            serde_json_canonicalizer::to_string(&json!({"€": 1, "\r": 2, "1": 3})).unwrap();
        assert_eq!(canonical, "{\"\\r\":2,\"1\":3,\"€\":1}");
        assert_eq!(
            of(&json!({})),
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }
}
