//! Conversions between `serde_json::Value` (what the domain uses) and `google.protobuf.Value` /
//! `Struct` (what travels on the wire, so every language gets native objects).

use prost_types::{ListValue, Struct, Value, value::Kind};
use serde_json::{Map, Number, Value as Json};

/// Converts JSON into a protobuf `Value`. Numbers become doubles (protobuf has no integers in
/// `Value`); `from_proto_value` turns integral doubles back into integers.
pub fn to_proto_value(json: &Json) -> Value {
    let kind = match json {
        Json::Null => Kind::NullValue(0),
        Json::Bool(b) => Kind::BoolValue(*b),
        Json::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Json::String(s) => Kind::StringValue(s.clone()),
        Json::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(to_proto_value).collect(),
        }),
        Json::Object(map) => Kind::StructValue(to_proto_struct(map)),
    };
    Value { kind: Some(kind) }
}

/// Converts a JSON object into a protobuf `Struct`.
pub fn to_proto_struct(map: &Map<String, Json>) -> Struct {
    Struct {
        fields: map
            .iter()
            .map(|(k, v)| (k.clone(), to_proto_value(v)))
            .collect(),
    }
}

/// Converts any JSON into a `Struct`; a non-object is wrapped as `{"value": …}`.
pub fn to_proto_struct_any(json: &Json) -> Struct {
    match json {
        Json::Object(map) => to_proto_struct(map),
        Json::Null => Struct::default(),
        other => {
            let mut map = Map::new();
            map.insert("value".into(), other.clone());
            to_proto_struct(&map)
        }
    }
}

/// Converts a protobuf `Value` into JSON. An unset kind is `null`; a non-finite double (which JSON
/// cannot hold) is `null` too.
pub fn from_proto_value(value: &Value) -> Json {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Json::Null,
        Some(Kind::BoolValue(b)) => Json::Bool(*b),
        Some(Kind::NumberValue(n)) => number(*n),
        Some(Kind::StringValue(s)) => Json::String(s.clone()),
        Some(Kind::ListValue(list)) => {
            Json::Array(list.values.iter().map(from_proto_value).collect())
        }
        Some(Kind::StructValue(s)) => Json::Object(from_proto_struct(s)),
    }
}

/// Converts a protobuf `Struct` into a JSON object.
pub fn from_proto_struct(s: &Struct) -> Map<String, Json> {
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), from_proto_value(v)))
        .collect()
}

/// An optional `Value` field: absent is `null`.
pub fn from_optional_value(value: Option<&Value>) -> Json {
    value.map(from_proto_value).unwrap_or(Json::Null)
}

fn number(n: f64) -> Json {
    // 2^53: beyond it doubles no longer hold every integer, so keep them as floats.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    if n.fract() == 0.0 && n.abs() <= EXACT {
        Json::Number(Number::from(n as i64))
    } else {
        Number::from_f64(n).map(Json::Number).unwrap_or(Json::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trips_nested_json_with_integers() {
        let doc = json!({"a": 1, "b": [true, null, "x", 2.5], "c": {"d": -3}});
        assert_eq!(from_proto_value(&to_proto_value(&doc)), doc);
    }

    #[test]
    fn non_finite_numbers_become_null() {
        let v = Value {
            kind: Some(Kind::NumberValue(f64::NAN)),
        };
        assert_eq!(from_proto_value(&v), Json::Null);
    }
}

/// Serde adapter that stores any serialisable value as JSON text, so that non-self-describing
/// formats (postcard, used for checkpoints and records) can hold `serde_json::Value`s.
pub mod as_text {
    use serde::{Deserialize, Deserializer, Serialize, Serializer, de::DeserializeOwned};

    pub fn serialize<T: Serialize, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
        let text = serde_json::to_string(value).map_err(serde::ser::Error::custom)?;
        s.serialize_str(&text)
    }

    pub fn deserialize<'de, T: DeserializeOwned, D: Deserializer<'de>>(
        d: D,
    ) -> Result<T, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        serde_json::from_str(&text).map_err(serde::de::Error::custom)
    }
}
