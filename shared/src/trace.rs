//! W3C trace context (`traceparent`, version 00) by hand: parse what a caller sends, start a
//! trace when nothing arrives, and mint a child span id per step. Both services only pass the
//! trace id along (in events, log lines and outgoing metadata); exporting spans is left to
//! whatever collects the logs, so no tracing SDK is needed.

use std::fmt;

/// The gRPC metadata key (and event field) that carries the trace context.
pub const TRACEPARENT: &str = "traceparent";

/// One `traceparent`: a 16-byte trace id, an 8-byte parent (span) id and the flags byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    flags: u8,
}

impl TraceContext {
    /// A fresh trace (random ids, sampled), for work that arrived without a trace.
    pub fn new_root() -> Self {
        Self {
            trace_id: random_nonzero(),
            span_id: random_nonzero(),
            flags: 0x01,
        }
    }

    /// The same trace with a new span id: the context of a step this context caused.
    pub fn child(&self) -> Self {
        Self {
            span_id: random_nonzero(),
            ..*self
        }
    }

    /// Parses `00-<32 hex>-<16 hex>-<2 hex>`. Anything else (another version's layout, upper-case
    /// hex, all-zero ids) is `None`: the W3C rules say to ignore an invalid header and start over.
    /// Future versions may append fields after the flags; their first four fields are read.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let mut parts = text.split('-');
        let version = parts.next()?;
        let trace = parts.next()?;
        let span = parts.next()?;
        let flags = parts.next()?;
        if version.len() != 2 || version == "ff" || !is_lower_hex(version) {
            return None;
        }
        if version == "00" && parts.next().is_some() {
            return None;
        }
        let trace_id: [u8; 16] = decode_hex(trace)?;
        let span_id: [u8; 8] = decode_hex(span)?;
        let [flags]: [u8; 1] = decode_hex(flags)?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            flags,
        })
    }

    /// The trace id as 32 lower-case hex digits (what log lines carry as `trace_id`).
    pub fn trace_id(&self) -> String {
        hex(&self.trace_id)
    }

    pub fn span_id(&self) -> String {
        hex(&self.span_id)
    }

    /// Reads the `traceparent` metadata of a gRPC request, if present and valid.
    pub fn from_metadata(metadata: &tonic::metadata::MetadataMap) -> Option<Self> {
        metadata
            .get(TRACEPARENT)
            .and_then(|v| v.to_str().ok())
            .and_then(Self::parse)
    }

    /// Sets this context as the `traceparent` metadata of an outgoing request.
    pub fn inject<T>(&self, request: &mut tonic::Request<T>) {
        if let Ok(value) = self.to_string().parse() {
            request.metadata_mut().insert(TRACEPARENT, value);
        }
    }
}

impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            hex(&self.trace_id),
            hex(&self.span_id),
            self.flags
        )
    }
}

/// The trace id of a `traceparent` string, or `""` when it is empty or invalid.
pub fn trace_id_of(traceparent: &str) -> String {
    TraceContext::parse(traceparent)
        .map(|c| c.trace_id())
        .unwrap_or_default()
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn decode_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !is_lower_hex(s) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn random_nonzero<const N: usize>() -> [u8; N] {
    loop {
        let mut out = [0u8; N];
        out.iter_mut().for_each(|b| *b = fastrand::u8(..));
        // All-zero ids are invalid by the spec; astronomically rare, but cheap to rule out.
        if out != [0u8; N] {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn round_trips_the_spec_example() {
        let ctx = TraceContext::parse(EXAMPLE).unwrap();
        assert_eq!(ctx.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(ctx.span_id(), "00f067aa0ba902b7");
        assert_eq!(ctx.to_string(), EXAMPLE);
    }

    #[test]
    fn a_child_keeps_the_trace_and_changes_the_span() {
        let ctx = TraceContext::parse(EXAMPLE).unwrap();
        let child = ctx.child();
        assert_eq!(child.trace_id(), ctx.trace_id());
        assert_ne!(child.span_id(), ctx.span_id());
        assert_eq!(TraceContext::parse(&child.to_string()), Some(child));
    }

    #[test]
    fn invalid_headers_are_ignored() {
        for bad in [
            "",
            "00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1g",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad:?}");
        }
        assert_eq!(trace_id_of("garbage"), "");
    }

    #[test]
    fn later_versions_are_read_by_their_first_fields() {
        let ctx =
            TraceContext::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later")
                .unwrap();
        assert_eq!(ctx.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    #[test]
    fn roots_are_valid_and_distinct() {
        let a = TraceContext::new_root();
        let b = TraceContext::new_root();
        assert_ne!(a.trace_id(), b.trace_id());
        assert_eq!(TraceContext::parse(&a.to_string()), Some(a));
    }
}
