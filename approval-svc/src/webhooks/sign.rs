//! The Standard Webhooks 1.0 signature: `v1,` and the base64 of HMAC-SHA256, keyed with the
//! base64-decoded secret, over `{webhook-id}.{webhook-timestamp}.{body}`.

use base64::{Engine, engine::general_purpose::STANDARD};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The prefix Standard Webhooks gives secrets.
pub const SECRET_PREFIX: &str = "whsec_";

/// Shortest secret accepted (bytes, decoded), as Standard Webhooks recommends.
pub const MIN_SECRET_BYTES: usize = 24;
/// Longest secret accepted (bytes, decoded).
pub const MAX_SECRET_BYTES: usize = 64;

/// A signing key. Its `Debug` shows nothing of it, so it never reaches a log.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

impl Secret {
    /// `whsec_` and base64, as Standard Webhooks writes secrets (the prefix may be left out).
    pub fn parse(text: &str) -> Result<Self, String> {
        let b64 = text
            .trim()
            .strip_prefix(SECRET_PREFIX)
            .unwrap_or(text.trim());
        let bytes = STANDARD
            .decode(b64)
            .map_err(|_| format!("is not \"{SECRET_PREFIX}\" followed by base64"))?;
        if !(MIN_SECRET_BYTES..=MAX_SECRET_BYTES).contains(&bytes.len()) {
            return Err(format!(
                "decodes to {} bytes; it must be {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES}",
                bytes.len()
            ));
        }
        Ok(Self(bytes))
    }

    /// The `webhook-signature` header value of the message `id` sent at `timestamp` (epoch
    /// seconds) with `body`.
    pub fn sign(&self, id: &str, timestamp: u64, body: &str) -> String {
        // HMAC takes keys of any length; this cannot fail.
        let mut mac = match Hmac::<Sha256>::new_from_slice(&self.0) {
            Ok(mac) => mac,
            Err(_) => return String::new(),
        };
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body.as_bytes());
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification.
    #[test]
    fn the_specification_example_signs_as_published() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = r#"{"test": 2432232314}"#;
        assert_eq!(
            secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn a_bad_secret_is_refused_and_never_shown() {
        assert!(Secret::parse("whsec_not base64!").is_err());
        assert!(
            Secret::parse("whsec_c2hvcnQ=")
                .unwrap_err()
                .contains("24 to 64")
        );
        let s = Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(format!("{s:?}"), "Secret(…)");
    }
}
